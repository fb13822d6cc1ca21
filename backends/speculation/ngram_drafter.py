"""The n-gram drafter (prompt lookup): finds the latest earlier occurrence of the
context's last n tokens and proposes what followed it; inside a tool call's JSON
string, where the prompt's text comes back escaped as other tokens, it looks the
reply's bytes up in that text instead (:mod:`backends.speculation.text_lookup`); and
it looks the context up in the index of earlier sessions' token streams
(:mod:`backends.speculation.history_index`), whose deeper match wins."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.sampling.filters import SamplingParams
from backends.speculation.history_index import MAX_MATCH, HistoryIndex
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.speculation.text_lookup import TextLookup

Branches = tuple[tuple[int, ...], ...]
# Every lookup finds at least this many tokens, so the round's later, longer asks reuse it.
LOOKUP_TOKENS = 16
# The history index's matches are keyed for acceptance by these lengths (the longest
# one reached): ``ngram:index:16`` for a match of 16 to 31 tokens.
INDEX_MATCH_KEYS = (32, 16, 8, 4)


class NgramIndex:
    """Latest end position of every n-gram (n in ``sizes``) of a growing token list.

    Incremental: ``extend`` indexes only new positions. The n-gram that ends at the
    last token is never indexed, so a lookup of the context's suffix finds an
    *earlier* occurrence with at least one token after it.
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self._latest_end: dict[tuple[int, ...], int] = {}
        self._tokens: list[int] = []
        self._indexed_until = 0  # n-grams ending before this position are indexed

    def reset(self, tokens: Sequence[int]) -> None:
        """Start over with ``tokens``."""
        self._latest_end.clear()
        self._tokens = list(tokens)
        self._indexed_until = 0
        self._index_up_to(len(self._tokens) - 1)

    def sync(self, tokens: Sequence[int]) -> None:
        """Follow a context that grew by appends (rebuild if it changed otherwise)."""
        known = len(self._tokens)
        if len(tokens) < known or list(tokens[max(0, known - 8) : known]) != self._tokens[-8:]:
            self.reset(tokens)
            return
        self._tokens.extend(tokens[known:])
        self._index_up_to(len(self._tokens) - 1)

    def _index_up_to(self, stop: int) -> None:
        tokens = self._tokens
        for end in range(self._indexed_until, max(stop, 0)):
            for size in self.sizes:
                if end + 1 >= size:
                    self._latest_end[tuple(tokens[end + 1 - size : end + 1])] = end
        self._indexed_until = max(self._indexed_until, stop)

    def continuation(self, max_tokens: int) -> tuple[list[int], int]:
        """What followed the latest earlier occurrence of the longest matching suffix.

        Returns the tokens and the n of the match (0 when nothing matched).
        """
        tokens = self._tokens
        for size in self.sizes:
            if len(tokens) < size + 1:
                continue
            end = self._latest_end.get(tuple(tokens[-size:]))
            if end is not None:
                return tokens[end + 1 : end + 1 + max_tokens], size
        return [], 0

    def match_length(self, size: int, limit: int = MAX_MATCH) -> int:
        """How far back (up to ``limit`` tokens) the match :meth:`continuation` found
        for ``size`` tokens goes on agreeing with the context's suffix."""
        tokens = self._tokens
        end = self._latest_end.get(tuple(tokens[-size:])) if size else None
        if end is None:
            return 0
        length = size
        while length < limit and end - length >= 0 and tokens[end - length] == tokens[-1 - length]:
            length += 1
        return length


class NgramDrafter:
    """Prompt-lookup drafting over prompt + output; nearly free, point-mass ``q``."""

    name = "ngram"

    def __init__(
        self,
        sizes: Sequence[int] = (8, 6, 4, 3, 2),
        min_match: int = 2,
        text: TextLookup | None = None,
        history: HistoryIndex | None = None,
    ) -> None:
        """``text`` (built on the target's tokenizer) adds lookups through JSON
        escaping; ``history`` (streams of the same tokenizer) adds lookups in earlier
        sessions; without them only the context's own tokens are looked up."""
        self.index = NgramIndex(sizes)
        self.min_match = min_match
        self.text = text
        self.history = history
        # Off for one reply at a time (see Engine.policy_for): a seeded sampled reply
        # drafts from its own context only, so its draws do not depend on what the
        # engine wrote before.
        self.uses_history = True
        self.last_match_size = 0
        self.last_match_key = ""
        # Other continuations the last lookup found in the index (a tree's branches).
        self.last_alternatives: tuple[tuple[int, ...], ...] = ()
        # The last lookup, for the others of the same round (the policy asks up to
        # three times a round; a text lookup costs a few searches).
        self._memo: tuple[int, int, int, list[int], int, str, Branches] | None = None

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Index the prompt."""
        self.index.reset(prompt_tokens)
        if self.text is not None:
            self.text.begin(prompt_tokens)
        self._memo = None

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """Propose the continuation of the longest earlier match of the suffix."""
        if max_tokens <= 0:
            return EMPTY_PROPOSAL
        tokens, size = self.lookup(context, max_tokens)
        if size < self.min_match:
            return EMPTY_PROPOSAL
        alternatives = tuple(branch[:max_tokens] for branch in self.last_alternatives)
        return DraftProposal(tokens=tokens, alternatives=alternatives)

    def lookup(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """The continuation of the longest earlier match and that match's size (0:
        none); :attr:`last_match_key` names the kind of match for acceptance figures
        (``ngram:N`` for N tokens, ``ngram:text`` for a match through JSON escaping,
        ``ngram:index:N`` for a match of N or more tokens in the history index)."""
        memo = self._memo
        last = context[-1] if context else -1
        if memo is not None and memo[:2] == (len(context), last) and memo[2] >= max_tokens:
            self.last_alternatives = memo[6]
            return memo[3][:max_tokens], memo[4]
        wanted = max(max_tokens, LOOKUP_TOKENS)
        self.index.sync(context)
        tokens, size = self.index.continuation(wanted)
        key = f"ngram:{min(size, max(self.index.sizes))}"
        alternatives: Branches = ()
        if self.history is not None and self.uses_history:
            found = self.history.lookup(context, wanted)
            # The deeper match goes on longer; on equal depth the context's own text,
            # this conversation's, goes first.
            if found.tokens and found.length > self.index.match_length(size):
                tokens, size, alternatives = found.tokens, found.length, found.alternatives
                key = "ngram:index:" + str(next(k for k in INDEX_MATCH_KEYS if size >= k))
        if self.text is not None:
            # Inside a JSON string the escaped text goes first: a token match there
            # is most often the prompt's raw text (real newlines, line numbers).
            found, matched = self.text.continuation(context, wanted)
            if found:
                tokens, size, key, alternatives = found, matched, "ngram:text", ()
        self.last_match_size, self.last_match_key = size, key
        self.last_alternatives = alternatives
        self._memo = (len(context), last, wanted, tokens, size, key, alternatives)
        return tokens[:max_tokens], size
