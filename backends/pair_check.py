"""Can this draft model draft for that target? llama.cpp's rule, with the reason.

Speculative decoding compares token ids, so both models must mean the same thing by
every id. llama.cpp accepts a pair when the vocabulary types match, BOS/EOS ids and
their add-flags match, the vocabulary sizes differ by at most 128 (padding), and the
token texts agree for every id from 5 up to the smaller size. We apply the same
rule and name the first thing that differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from backends.base import VocabInfo
from backends.errors import IncompatiblePairError

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


class Vocabulary(Protocol):
    """What the check reads: a loaded Model, or a tokenizer loaded on its own."""

    def vocab_info(self) -> VocabInfo:
        """Vocabulary type, size, BOS/EOS ids and their add-flags."""
        ...

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text for a token."""
        ...


@dataclass(frozen=True)
class PairCheck:
    """The verdict on a target+draft pair; ``problem`` names the first mismatch."""

    compatible: bool
    problem: str | None = None

    def raise_if_incompatible(self, target_name: str, draft_name: str) -> None:
        """Raise :class:`IncompatiblePairError` with a message naming the mismatch."""
        if not self.compatible:
            raise IncompatiblePairError(
                f"{draft_name} cannot draft for {target_name}: {self.problem}. "
                "Pick a draft model from the same family (same tokenizer), "
                "or use --drafter ngram."
            )


def check_pair(target: Vocabulary, draft: Vocabulary) -> PairCheck:
    """Compare the two tokenizers by llama.cpp's rule."""
    t, d = target.vocab_info(), draft.vocab_info()
    if t.vocab_type != d.vocab_type:
        return PairCheck(False, f"vocabulary types differ ({t.vocab_type} vs {d.vocab_type})")
    if (t.bos_id, t.add_bos) != (d.bos_id, d.add_bos):
        return PairCheck(
            False,
            f"BOS differs (target id {t.bos_id}, add={t.add_bos}; "
            f"draft id {d.bos_id}, add={d.add_bos})",
        )
    if (t.eos_id, t.add_eos) != (d.eos_id, d.add_eos):
        return PairCheck(
            False,
            f"EOS differs (target id {t.eos_id}, add={t.add_eos}; "
            f"draft id {d.eos_id}, add={d.add_eos})",
        )
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        return PairCheck(
            False,
            f"vocabulary sizes differ by more than {MAX_VOCAB_SIZE_DIFFERENCE} "
            f"({t.n_vocab} vs {d.n_vocab})",
        )
    for token in range(FIRST_CHECKED_TOKEN, min(t.n_vocab, d.n_vocab)):
        target_text, draft_text = target.token_text(token), draft.token_text(token)
        if target_text != draft_text:
            return PairCheck(
                False,
                f"token {token} differs ({target_text!r} in the target, {draft_text!r} "
                "in the draft)",
            )
    return PairCheck(True)
