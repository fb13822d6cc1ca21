"""A draft tree verified by llama.cpp in one batch (issue 55 part 4), on SmolLM2 under
exact kernels: the history index holds two earlier replies that part after a shared
opening, the likelier (the later one) wrong, and greedy output stays plain decoding's
token for token while a round accepts the other branch.

Marked ``real_model``; a few seconds on a CPU.
"""

from __future__ import annotations

import pytest

from backends.base import ChatMessage
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.history_index import HistoryIndex
from backends.speculation.loop import speculative_generate
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.support.model_files import SMOLLM2_KEY, require_model

pytestmark = pytest.mark.real_model

QUESTION = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
PARTS_AT = 8


def test_greedy_output_equals_plain_decoding_when_llamacpp_verifies_trees() -> None:
    from backends.llamacpp.model import LlamaCppModel

    target = LlamaCppModel(require_model(SMOLLM2_KEY), n_ctx=1024, exact_kernels=True)
    try:
        assert target.tree_branches >= 2
        prompt = target.tokenize(target.apply_chat_template([ChatMessage("user", QUESTION)]))
        spec = ReplySpec(SamplingParams(), 64)

        def run(policy: FixedDraftPolicy) -> tuple[list[int], object]:
            events = list(speculative_generate(target, prompt, policy, spec))
            return [t for event in events for t in event.tokens], events[-1].stats

        plain, _ = run(FixedDraftPolicy(None, 0))
        assert len(plain) > 3 * PARTS_AT
        other = target.tokenize(
            " Here is something else entirely, said otherwise.", add_special=False
        )
        index = HistoryIndex(10_000)
        index.add([*prompt, *plain])
        index.add([*prompt, *plain[:PARTS_AT], *other])  # the later: drafted first
        drafter = NgramDrafter(history=index)
        # Exact batches: the whole tree stays within 7 tokens (params.py).
        policy = FixedDraftPolicy(drafter, 3, exact_batch_limit=7, tree_nodes=3)
        replays_before = target.tree_replays
        treed, stats = run(policy)
        assert treed == plain
        assert stats.tree_rounds >= 1, stats  # type: ignore[attr-defined]
        assert stats.other_branch_rounds >= 1, stats  # type: ignore[attr-defined]
        # The path that left the best branch was read again in order (exact kernels).
        assert target.tree_replays > replays_before
        # The cache holds the prompt and the reply but its last (pending) token.
        assert list(target.cached_tokens) == [*prompt, *plain][: len(target.cached_tokens)]
        assert len(target.cached_tokens) >= len(prompt) + len(plain) - 1
        again, _ = run(FixedDraftPolicy(None, 0))
        assert again == plain, "the cache a tree left decodes on as plain decoding does"
    finally:
        target.close()
