"""From logits to token choices: filtering, sampling, and the rejection-sampling step.

Filters apply in one fixed order, to the target's rows and the draft's rows alike, so
that the speculative loop compares like with like: temperature scaling, then top-k,
then top-p (nucleus), then min-p (relative to the most likely token left).

Distributions are *sparse*: the ids that survived filtering, sorted, with their
probabilities. With the usual filters that is tens of tokens, not the whole
vocabulary, so sampling, lookups and the residual ``max(p - q, 0)`` cost little.
Only with every filter off does a distribution span the full vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# First guess at how many top tokens hold the nucleus; grows x8 when it does not.
_NUCLEUS_FIRST_GUESS = 64


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature <= 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 turns it off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError("min_p must be in [0, 1)")

    @property
    def greedy(self) -> bool:
        """Whether tokens are chosen by argmax."""
        return self.temperature <= 0.0


@dataclass(frozen=True)
class SparseDistribution:
    """A probability distribution over a few token ids (sorted ascending)."""

    ids: np.ndarray
    probs: np.ndarray

    @staticmethod
    def point(token: int) -> SparseDistribution:
        """All mass on one token (what an n-gram or prediction drafter proposes)."""
        return SparseDistribution(np.array([token], dtype=np.int64), np.array([1.0]))

    def prob_of(self, token: int) -> float:
        """Probability of one token (0 outside the support)."""
        index = int(np.searchsorted(self.ids, token))
        if index < self.ids.size and self.ids[index] == token:
            return float(self.probs[index])
        return 0.0

    def probs_at(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of sorted ``tokens`` (0 outside the support)."""
        index = np.searchsorted(self.ids, tokens)
        index_clipped = np.minimum(index, self.ids.size - 1)
        hit = self.ids[index_clipped] == tokens
        return np.where(hit, self.probs[index_clipped], 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        """Draw one token."""
        if self.ids.size == 1:
            return int(self.ids[0])
        cumulative = np.cumsum(self.probs)
        index = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return int(self.ids[min(index, self.ids.size - 1)])

    @property
    def top_prob(self) -> float:
        """The largest probability in the distribution."""
        return float(self.probs.max())


def greedy_token(logits_row: np.ndarray) -> int:
    """The argmax token of one row of logits."""
    return int(np.argmax(logits_row))


def distribution(logits_row: np.ndarray, params: SamplingParams) -> SparseDistribution:
    """Filter one row of logits into a sparse distribution (temperature > 0).

    At temperature 0 use :func:`greedy_token`; this function treats it as a point
    mass on the argmax so callers that need a distribution still get one.
    """
    if params.greedy:
        return SparseDistribution.point(greedy_token(logits_row))
    n_vocab = logits_row.shape[0]
    scaled = logits_row.astype(np.float64) / params.temperature

    if 0 < params.top_k < n_vocab:
        candidates = np.argpartition(scaled, n_vocab - params.top_k)[n_vocab - params.top_k :]
        probs = _softmax(scaled[candidates])
    else:
        candidates = None
        probs = _softmax(scaled)

    if params.top_p < 1.0:
        kept, kept_probs = _nucleus(probs, params.top_p)
        candidates = kept if candidates is None else candidates[kept]
        probs = kept_probs
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs.max()
        probs = probs[keep]
        candidates = np.flatnonzero(keep) if candidates is None else candidates[keep]

    if candidates is None:
        return SparseDistribution(np.arange(n_vocab, dtype=np.int64), probs / probs.sum())
    order = np.argsort(candidates)
    ids = candidates[order].astype(np.int64)
    probs = probs[order]
    return SparseDistribution(ids, probs / probs.sum())


def residual(target: SparseDistribution, draft: SparseDistribution) -> SparseDistribution:
    """normalize(max(p - q, 0)): where to sample after a draft token is rejected."""
    ids = np.union1d(target.ids, draft.ids)
    excess = np.maximum(target.probs_at(ids) - draft.probs_at(ids), 0.0)
    total = excess.sum()
    if total <= 0.0:
        # p == q: a rejection has probability zero, so any choice is fine; use p.
        return target
    keep = excess > 0.0
    return SparseDistribution(ids[keep], excess[keep] / total)


def verify_draft_token(
    target: SparseDistribution,
    draft: SparseDistribution,
    draft_token: int,
    rng: np.random.Generator,
) -> int | None:
    """The speculative-sampling step for one drafted position.

    Accept ``draft_token`` with probability ``min(1, p(x) / q(x))`` and return None;
    otherwise return a replacement drawn from ``normalize(max(p - q, 0))``. The token
    emitted at this position is then distributed exactly as ``p``.
    """
    p_x = target.prob_of(draft_token)
    q_x = draft.prob_of(draft_token)
    if q_x > 0.0 and rng.random() * q_x < p_x:
        return None
    return residual(target, draft).sample(rng)


def _softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices and probabilities of the smallest top set whose mass reaches ``top_p``.

    Looks among the top 64 first, widening only when the nucleus is larger, so the
    usual case never sorts the whole vocabulary.
    """
    n = probs.shape[0]
    size = min(n, _NUCLEUS_FIRST_GUESS)
    while True:
        top = np.argpartition(probs, n - size)[n - size :] if size < n else np.arange(n)
        top = top[np.argsort(-probs[top], kind="stable")]
        cumulative = np.cumsum(probs[top])
        if cumulative[-1] >= top_p or size == n:
            count = int(np.searchsorted(cumulative, top_p)) + 1
            count = min(count, size)
            kept = top[:count]
            return kept, probs[kept]
        size = min(n, size * 8)
