"""From logits to token choices: filtering, sampling, and the rejection-sampling step.

Filters apply in one fixed order, to the target's rows and the draft's rows alike, so
that the speculative loop compares like with like: temperature scaling, then top-k,
then top-p (nucleus), then min-p (relative to the most likely token left). Presence
and frequency penalties depend on the reply so far, so the loop applies them to a row
before it gets here (backends/penalties.py), again to p and q alike.

Distributions are *sparse*: the ids that survived filtering, sorted, with their
probabilities. With the usual filters that is tens of tokens, not the whole
vocabulary, so sampling, lookups and the residual ``max(p - q, 0)`` cost little.
Only with every filter off does a distribution span the full vocabulary.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from dataclasses import dataclass

import numpy as np

from backends.penalties import PENALTY_RANGE


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature <= 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    # OpenAI's penalties on tokens already in the reply (see backends/penalties.py);
    # the loop applies them to the rows before the filters above, for p and q alike.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 turns it off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError("min_p must be in [0, 1)")
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not low <= getattr(self, name) <= high:  # also rejects NaN
                raise ValueError(f"{name} must be in [{low:g}, {high:g}]")

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
        return SparseDistribution(np.array([token], dtype=np.int64), _ALL_MASS)

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
        return int(self.ids[_inverse_cdf(self.probs, rng.random())])

    @property
    def top_prob(self) -> float:
        """The largest probability in the distribution."""
        size = self.probs.size
        if size == 1:
            return float(self.probs[0])
        if size <= _PYTHON_CANDIDATES:
            return max(self.probs.tolist())  # no numpy reduction (cold after a forward)
        return float(self.probs.max())


# The probabilities of every point distribution: one read-only array, shared.
_ALL_MASS = np.ones(1)
_ALL_MASS.setflags(write=False)


def greedy_token(logits_row: np.ndarray) -> int:
    """The argmax token of one row of logits."""
    return int(np.argmax(logits_row))


def distribution(logits_row: np.ndarray, params: SamplingParams) -> SparseDistribution:
    """Filter one row of logits into a sparse distribution (temperature > 0).

    At temperature 0 use :func:`greedy_token`; this function treats it as a point
    mass on the argmax so callers that need a distribution still get one.

    Cost: the vocabulary is never sorted. Each filter only ever keeps an *upper set*
    (every token at least as likely as any kept one), so the filters can run in
    float64 on a small candidate set, exactly as on the full row. First try: the
    tokens within a fixed distance of the row's maximum (:func:`_near_top`), found by
    one comparison; everything below weighs so little that a bound on its mass
    settles top-p almost always. An LLM's row is peaked, so that set is tens of
    tokens. Otherwise (a flat row, a nucleus reaching below the cut, a top-k set that
    does too, or a top-p decision the bound cannot make): a candidate set of the top
    few hundred tokens (see :func:`_upper_set`); top-p without top-k also depends on
    the mass of the rest of the row, which a bound (the rest's size times its largest
    possible weight) usually settles, else one float32 pass sums it (see
    :func:`_outside_mass`). When the nucleus does not fit in the candidates, the set
    widens x8 and, at the end, becomes the whole row, so the result never depends on
    the first guess.
    """
    if params.greedy:
        return SparseDistribution.point(greedy_token(logits_row))
    row = np.asarray(logits_row)
    n_vocab = row.shape[0]
    temperature = params.temperature
    top_k = params.top_k if 0 < params.top_k < n_vocab else 0
    top_p = params.top_p
    min_p = params.min_p
    if not top_k and top_p >= 1.0 and min_p == 0.0:
        return _full_softmax(row, temperature)

    # Top-k alone wants all k tokens, usually more than lie near the top; min-p alone
    # has a tighter cut of its own (below). Everything with top-p starts near the top.
    if top_p < 1.0:
        near = _near_top(row, temperature, top_k, top_p, min_p)
        if near is not None:
            return near

    top = row.max()
    if top_k:
        # The k most likely tokens, then the old full-row arithmetic on those k.
        ids = _top_k_ids(row, top_k)
        scaled = row[ids].astype(np.float64) / temperature
        probs = _softmax(scaled)
        if top_p < 1.0:
            kept, probs = _nucleus(probs, top_p)
            ids = ids[kept]
        return _finish(ids, probs, min_p)

    if min_p > 0.0:
        # A token survives min-p iff exp((x - top) / T) >= min_p, whatever filter ran
        # before (top-p always keeps the most likely token). The float32 threshold is
        # loosened a little so rounding can only let extra tokens in; the exact test
        # in _finish removes them again.
        threshold = float(top) + temperature * math.log(min_p)
        threshold -= _THRESHOLD_SLACK * (1.0 + abs(threshold))
        ids = np.flatnonzero(row >= threshold)
        weights = _unnormalised(row, ids, temperature)
        if top_p < 1.0:
            # Every other token is below the threshold, so weighs less than this.
            below = math.exp((threshold - float(top)) / temperature) * (1.0 + _BOUND_MARGIN)
            found = _nucleus_in(ids, weights, top_p, (0.0, (n_vocab - ids.size) * below))
            if found is _UNDECIDED:
                outside = _outside_mass(row, top, temperature, ids)
                found = _nucleus_in(ids, weights, top_p, (outside, outside))
            if isinstance(found, tuple):
                ids, weights = found
            # _BEYOND: the nucleus holds every candidate and more, min-p decides alone.
        return _finish(ids, weights, min_p)

    # Top-p alone: find the nucleus among the top candidates, widening when needed.
    wanted = _FIRST_CANDIDATES
    row_mass: float | None = None  # the whole row's float32 mass, once summed
    while True:
        ids = _upper_set(row, wanted)
        weights = _unnormalised(row, ids, temperature)
        if ids.size == n_vocab:
            found = _nucleus_in(ids, weights, top_p, (0.0, 0.0))
            assert isinstance(found, tuple)  # the whole row reaches any top_p <= 1
            return _finish(*found, 0.0)
        # Tokens outside an upper set each weigh less than its least likely member: a
        # bound that usually decides the nucleus without a pass over the whole row.
        bound = (n_vocab - ids.size) * float(weights.min()) * (1.0 + _BOUND_MARGIN)
        found = _nucleus_in(ids, weights, top_p, (0.0, bound))
        if found is _UNDECIDED:
            if row_mass is None:
                row_mass = _row_mass(row, top, temperature)
            # The float32 buffer still holds every weight: the candidates' float32
            # share comes off the row's sum, and their float64 weights count instead.
            outside = _without(row_mass, ids)
            found = _nucleus_in(ids, weights, top_p, (outside, outside))
        if isinstance(found, tuple):
            return _finish(*found, 0.0)
        wanted *= _WIDEN


def _near_top(
    row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> SparseDistribution | None:
    """The filtered distribution (with top-p, ``top_p < 1``) from the tokens near the
    row's maximum, or None.

    The candidates hold every token whose logit reaches ``top - T * _NEAR_TOP_NATS``
    (:func:`_near_top_candidates`): each token below their cut weighs less than
    ``_NEAR_TOP_WEIGHT`` relative to the most likely one (on a 151,936-token
    vocabulary all of them together at most 1e-4 of it). That bounds what the filters
    could take from below the cut: top-k either lies among the candidates or reaches
    below them (the rest of its set is bounded by the same weight per token), top-p is
    decided when the bound cannot move the nucleus (else one float32 pass sums the
    rest exactly, as :func:`_outside_mass` does), and min-p drops every token below
    the cut whenever ``min_p`` exceeds that weight.
    None whenever the candidates do not settle the result (a flat row with too many
    of them, a nucleus reaching below the cut that min-p does not cut off);
    the caller then takes the general path. Equal rows give equal results either
    way, and the same function serves plain and speculative decoding alike.
    """
    near = _near_top_candidates(row, temperature)
    if near is None:
        return None
    ids, values, top, cut, first = near
    n_vocab = row.shape[0]
    count = ids.size
    top_scaled = top / temperature
    # Every token below the cut weighs less than this (computed the way the weights
    # below are, plus a margin for the last bit of rounding).
    each_below = math.exp(float(cut) / temperature - top_scaled) * (1.0 + _BOUND_MARGIN)
    if count <= _PYTHON_CANDIDATES:
        return _near_top_in_python(
            row, ids, values, (top, first, each_below), temperature, top_k, top_p, min_p
        )
    weights = values.astype(np.float64)
    weights /= temperature
    weights -= top_scaled
    np.exp(weights, out=weights)
    if top_k and count >= top_k:
        if count > top_k:
            keep = np.argpartition(values, count - top_k)[count - top_k :]
            ids, values, weights = ids[keep], values[keep], weights[keep]
        below = 0.0  # the top-k set lies among the candidates
    else:
        # The rest of the top-k set, or of the row, lies below the cut.
        below = ((top_k or n_vocab) - count) * each_below
    if top_p * (float(weights.sum()) + below) <= 1.0:
        # The most likely token (weight 1) alone reaches top_p: _nucleus_in would keep
        # just it (the first of tied maxima), and the dozen numpy calls it and _finish
        # make would cost more than the answer.
        return SparseDistribution.point(first)
    found = _nucleus_in(ids, weights, top_p, (0.0, below))
    if found is _UNDECIDED and not top_k:
        outside = _outside_mass(row, top, temperature, ids)
        found = _nucleus_in(ids, weights, top_p, (outside, outside))
    if isinstance(found, tuple):
        ids, weights = found
    elif found is not _BEYOND or not min_p > each_below:
        return None
    # _BEYOND with min-p cutting below: the nucleus holds every candidate and tokens
    # below the cut, which min-p then drops (the top token weighs 1 and always
    # survives); min-p decides alone.
    return _finish(ids, weights, min_p)


def _near_top_in_python(
    row: np.ndarray,
    ids: np.ndarray,
    values: np.ndarray,
    maximum: tuple[float, int, float],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
) -> SparseDistribution | None:
    """:func:`_near_top`'s filters for a few hundred candidates, in plain Python.

    ``maximum`` is the row's top logit, the first token that has it, and the bound on
    each token below the cut. The decisions are the numpy code's (the same weights,
    bounds and stable order, the nucleus found by the same running sum; the totals are
    summed exactly). Why: right after a forward the CPU's caches hold little of numpy,
    and each kind of numpy call (a reduction, a sort, an index) then costs tens of
    microseconds before it does any work, more than Python's arithmetic on this many
    numbers. Most rows end at the first test: the top token alone reaches top_p.
    """
    top, first, each_below = maximum
    top_scaled = top / temperature
    exp = math.exp
    weights = [exp(value / temperature - top_scaled) for value in values.tolist()]
    count = len(weights)
    order: list[int] | None = None  # most likely first, once it is needed
    if top_k and count > top_k:
        # Equal weights keep the candidates' (ascending id) order, as the numpy path's
        # stable sort does; ties at the top-k boundary: any of them, as top-k allows.
        order = sorted(range(count), key=weights.__getitem__, reverse=True)[:top_k]
        inside = math.fsum([weights[index] for index in order])
        below = 0.0  # the top-k set lies among the candidates
    else:
        inside = math.fsum(weights)
        # The rest of the top-k set, or of the row, lies below the cut.
        below = ((top_k or row.shape[0]) - count) * each_below
    if top_p * (inside + below) <= 1.0:
        return SparseDistribution.point(first)  # the top token (weight 1) alone
    if order is None:
        order = sorted(range(count), key=weights.__getitem__, reverse=True)

    def nucleus_size(low: float, high: float) -> int | _Verdict:
        # _nucleus_in's decision, on the sorted weights.
        if inside < high:
            return _BEYOND if inside < low else _UNDECIDED
        size = _first_reaching(order, weights, high)
        if high != low and _first_reaching(order, weights, low) != size:
            return _UNDECIDED
        return size

    found = nucleus_size(top_p * inside, top_p * (inside + below))
    if found is _UNDECIDED and not top_k:
        # The bound cannot settle it: sum the rest of the row (one float32 pass).
        outside = _outside_mass(row, top, temperature, ids)
        found = nucleus_size(top_p * (inside + outside), top_p * (inside + outside))
    if isinstance(found, int):
        order = order[:found]
    elif found is not _BEYOND or not min_p > each_below:
        return None  # undecided, or a nucleus reaching below the cut min-p does not cut
    # (_BEYOND with min-p cutting below: the nucleus holds every candidate and tokens
    # below the cut, which min-p drops; the top token weighs 1 and always survives.)
    if min_p > 0.0:
        floor = min_p * max(weights[index] for index in order)
        order = [index for index in order if weights[index] >= floor]
    order.sort()  # candidate positions ascend with their ids
    kept = [weights[index] for index in order]
    total = math.fsum(kept)
    return SparseDistribution(ids[order], np.array([weight / total for weight in kept]))


def _first_reaching(order: list[int], weights: list[float], goal: float) -> int:
    """How many of ``order`` the running sum of their ``weights`` needs to reach ``goal``
    (all of them if it never does): the count ``np.searchsorted`` gives the numpy path."""
    running = 0.0
    for taken, index in enumerate(order, start=1):
        running += weights[index]
        if running >= goal:
            return taken
    return len(order)


def _near_top_candidates(
    row: np.ndarray, temperature: float
) -> tuple[np.ndarray, np.ndarray, float, np.float32, int] | None:
    """Every token within ``T * _NEAR_TOP_NATS`` of the row's maximum.

    Returns their ids (ascending), their logits, the maximum, the cut (every token
    left out lies below it) and the first token with the maximum. None for a row with
    more than ``_NEAR_TOP_LIMIT`` such tokens (or a maximum that is not finite).

    Two sequential passes (the argmax, then the comparison) and nothing strided over
    the whole row: right after a forward the row is not in the CPU's caches, and
    streaming it costs less than a strided sample of it (measured after the starter
    target's decode: ~65 us for the first pass, ~50 us for a sample of every 74th
    logit; the second pass then finds the row in the cache). The argmax rather than
    ``max``: numpy's reductions pay ~45 us of cold code after a decode, its argmax less.
    """
    first = int(row.argmax())  # NaN: the first NaN's index
    top = float(row[first])
    if not math.isfinite(top):
        return None  # NaN, +inf, or a row the grammar masked whole: the general path
    # Rounded to float32 as the comparison with the row is; the bound uses that value.
    cut = np.float32(top - temperature * _NEAR_TOP_NATS)
    ids = (row >= cut).nonzero()[0]
    if ids.size > _NEAR_TOP_LIMIT:
        return None  # a flat row: the general path
    return ids, row[ids], top, cut, first


def distribution_from_top(
    ids: np.ndarray,
    values: np.ndarray,
    log_mass: float,
    n_vocab: int,
    params: SamplingParams,
) -> SparseDistribution | None:
    """The filtered distribution of a row known only by its top tokens, or None.

    For a runtime that filters on its device: ``ids`` and ``values`` are the row's M
    largest logits (any order; no token outside beats one inside), ``log_mass`` is
    ``log(sum(exp(x / T)))`` over the whole row in float32. The filters then run in
    float64 on the candidates exactly as :func:`distribution` runs them: top-k within
    them, top-p with the rest of the row's mass known to ``_DEVICE_MASS_SLACK`` of the
    whole (a float32 sum of 150k exponentials) and decided only where that error
    cannot move the nucleus, min-p where its cut falls inside them. None where the
    candidates cannot settle it (top-k beyond M, a nucleus or a min-p set reaching
    past them, no filter at all): the caller then filters the whole row on the host.
    Plain and speculative decoding on such a runtime both call this, so they still
    sample one distribution.
    """
    temperature = params.temperature
    top_k = params.top_k if 0 < params.top_k < n_vocab else 0
    top_p, min_p = params.top_p, params.min_p
    count = ids.size
    if params.greedy or count == 0 or (not top_k and top_p >= 1.0 and min_p == 0.0):
        return None
    if top_k:
        if top_k > count:
            return None
        if top_k < count:
            keep = np.argpartition(values, count - top_k)[count - top_k :]
            ids, values = ids[keep], values[keep]
    top = float(values.max())
    if not math.isfinite(top):
        return None
    top_scaled = top / temperature
    weights = np.exp(values.astype(np.float64) / temperature - top_scaled)
    if top_p < 1.0:
        if top_k:
            outside = (0.0, 0.0)  # the top-k set is all there is
        else:
            total = math.exp(log_mass - top_scaled)
            rest = max(total - float(weights.sum()), 0.0)
            slack = _DEVICE_MASS_SLACK * total
            outside = (max(rest - slack, 0.0), rest + slack)
        found = _nucleus_in(ids, weights, top_p, outside)
        if not isinstance(found, tuple):
            return None
        ids, weights = found
    elif not top_k and float(weights.min()) >= min_p and count < n_vocab:
        return None  # min-p alone keeps tokens down to the last candidate, maybe beyond
    return _finish(ids, weights, min_p)


def log_normaliser(logits_row: np.ndarray) -> float:
    """``log(sum(exp(x)))`` of one row at temperature 1: its log-softmax is ``x`` minus this.

    A large row takes one float32 pass summed in float64 (:func:`_row_mass`): 10x
    cheaper than float64 on a 150k vocabulary, within ~1e-8 of it. Tokens at -inf
    (masked by a grammar) weigh nothing.
    """
    row = np.asarray(logits_row)
    top = float(row.max())
    if row.shape[0] <= _SAMPLE_SIZE:
        return top + math.log(float(np.exp(row.astype(np.float64) - top).sum()))
    return top + math.log(_row_mass(row, top, 1.0))


def top_token_probability(logits_row: np.ndarray, token: int) -> float:
    """Softmax probability (temperature 1) of ``token``, the row's argmax, to within 0.1%.

    A drafter's confidence in its greedy token, not a sampling decision: only the
    tokens within ``_CONFIDENCE_NATS`` of the top are summed (one comparison over the
    row, then a few hundred exponentials). Every token below weighs less than
    1e-3 / 151,936 of the top one, so together they could lower the probability by at
    most 0.1% on such a vocabulary; the confidence floor works in tenths. A flat row,
    with more than ``_CONFIDENCE_NEAR_LIMIT`` tokens that close, is summed whole in one
    float32 pass into the reused buffer instead (:func:`_row_mass`). No strided sample
    decides that first: after a forward the row is out of the CPU's caches, and a
    sample touching a cache line per logit cost more than the comparison it saved.
    """
    row = np.asarray(logits_row)
    top = row[token]
    near = np.flatnonzero(row >= top - _CONFIDENCE_NATS)
    if near.size > _CONFIDENCE_NEAR_LIMIT:
        return 1.0 / _row_mass(row, float(top), 1.0)
    return float(1.0 / np.exp(row[near] - top).sum(dtype=np.float64))


def top_ids(values: np.ndarray, count: int) -> np.ndarray:
    """The indices of the ``count`` largest ``values``, largest first (ties: any order).

    Found among an upper set (:func:`_upper_set`) rather than by partitioning the whole
    row, which costs ~1 ms on a 150k vocabulary.
    """
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    ids = _top_k_ids(values, min(count, values.shape[0]))
    return ids[np.argsort(-values[ids], kind="stable")]


def residual(target: SparseDistribution, draft: SparseDistribution) -> SparseDistribution:
    """normalize(max(p - q, 0)): where to sample after a draft token is rejected."""
    if target.ids.size + draft.ids.size <= _PYTHON_CANDIDATES:
        return _small_residual(target, draft)
    ids = np.union1d(target.ids, draft.ids)
    excess = np.maximum(target.probs_at(ids) - draft.probs_at(ids), 0.0)
    total = excess.sum()
    if total <= 0.0:
        # p == q: a rejection has probability zero, so any choice is fine; use p.
        return target
    keep = excess > 0.0
    return SparseDistribution(ids[keep], excess[keep] / total)


def _small_residual(target: SparseDistribution, draft: SparseDistribution) -> SparseDistribution:
    """:func:`residual` of two small supports, in Python: the same differences, summed
    exactly, with three numpy calls rather than twenty (cold after a forward)."""
    p = dict(zip(target.ids.tolist(), target.probs.tolist(), strict=True))
    q = dict(zip(draft.ids.tolist(), draft.probs.tolist(), strict=True))
    ids = sorted(p.keys() | q.keys())
    excess = [max(p.get(token, 0.0) - q.get(token, 0.0), 0.0) for token in ids]
    total = math.fsum(excess)
    if total <= 0.0:
        return target  # p == q: a rejection has probability zero; use p
    kept = [index for index, weight in enumerate(excess) if weight > 0.0]
    return SparseDistribution(
        np.array([ids[index] for index in kept], dtype=np.int64),
        np.array([excess[index] / total for index in kept]),
    )


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


# How many top tokens the first candidate set for top-p aims to hold; it grows x8
# while the nucleus does not fit.
_FIRST_CANDIDATES = 256
_WIDEN = 8
# Rows up to this size are selected exactly (np.partition of the whole row is cheap);
# larger ones estimate a cut-off from a strided sample of about this many logits.
_SAMPLE_SIZE = 2048
# Relative loosening of float32 thresholds, far above float32 rounding (~6e-8).
_THRESHOLD_SLACK = 1e-5
# Bounds on the mass outside the candidates are widened by this, for rounding.
_BOUND_MARGIN = 1e-9
# Candidate sets larger than this are not sorted whole (see _smallest_top_set).
_SORT_LIMIT = 1024
_LEVELS_PER_NAT = 4.0
_LAST_LEVEL = 4096
_TINY = 1e-300
# The first candidate set holds the tokens within T * _NEAR_TOP_NATS of the maximum:
# each token below weighs under 1e-4 / 151,936 of the most likely one. On an LLM's
# rows at temperature 0.7 that is a few to a few hundred tokens (measured on the
# starter pair); a flat row with more than _NEAR_TOP_LIMIT of them takes the general path.
_NEAR_TOP_WEIGHT = 1e-4 / 151_936
_NEAR_TOP_NATS = -math.log(_NEAR_TOP_WEIGHT)
_NEAR_TOP_LIMIT = 8192
# Up to this many candidates near the top, the filters run in plain Python (see
# _near_top_in_python); more go through numpy.
_PYTHON_CANDIDATES = 256
# top_token_probability leaves out tokens this far below the top (temperature 1): on
# a 151,936-token vocabulary they hold at most 0.1% of the top's weight. Above
# _CONFIDENCE_NEAR_LIMIT tokens that close, one pass over the row is cheaper.
_CONFIDENCE_NATS = np.float32(math.log(151_936 / 1e-3))
_CONFIDENCE_NEAR_LIMIT = 16_384
# distribution_from_top trusts a device's float32 log-sum-exp of a row to this share
# of the row's mass: MLX's (CPU build) was off by up to 2.2e-4 on 151,936-token rows
# against float64 (its float32 exponential), so ten times that.
_DEVICE_MASS_SLACK = 2e-3
# Large distributions are sampled block by block (see _inverse_cdf).
_SAMPLE_BLOCK = 1024

_scratch = threading.local()
_aranges: dict[int, np.ndarray] = {}


def _float32_buffer(size: int) -> np.ndarray:
    """A per-thread float32 scratch row, reused so a round allocates nothing large."""
    buffer = getattr(_scratch, "row", None)
    if buffer is None or buffer.shape[0] != size:
        buffer = np.empty(size, dtype=np.float32)
        _scratch.row = buffer
    return buffer


def _all_ids(size: int) -> np.ndarray:
    """Read-only ``arange(size)`` shared by every full-vocabulary distribution."""
    ids = _aranges.get(size)
    if ids is None:
        ids = np.arange(size, dtype=np.int64)
        ids.setflags(write=False)
        _aranges[size] = ids
    return ids


def _upper_set(row: np.ndarray, at_least: int) -> np.ndarray:
    """Ids (ascending) of every token whose logit reaches some cut-off, at least ``at_least``.

    The set is closed upwards (no token outside beats a token inside; tied tokens are
    all in or all out), so it holds the top ``at_least`` tokens whichever way ties
    are broken. A large row's cut-off is estimated from a strided sample, aiming at
    about twice ``at_least`` tokens; when the sample misleads (the row is not alike
    along its length) and too few pass, the exact cut-off is selected instead.
    """
    n_vocab = row.shape[0]
    if at_least >= n_vocab:
        return _all_ids(n_vocab)
    if n_vocab > _SAMPLE_SIZE:
        stride = n_vocab // _SAMPLE_SIZE
        sample = row[::stride]
        rank = min(sample.size, 2 * -(-at_least // stride) + 4)
        cutoff = np.partition(sample, sample.size - rank)[sample.size - rank]
        ids = np.flatnonzero(row >= cutoff)
        if ids.size >= at_least:
            return ids
    cutoff = np.partition(row, n_vocab - at_least)[n_vocab - at_least]
    return np.flatnonzero(row >= cutoff)


def _top_k_ids(row: np.ndarray, top_k: int) -> np.ndarray:
    """Exactly ``top_k`` ids of the most likely tokens (ties at the boundary: any)."""
    ids = _upper_set(row, top_k)
    if ids.size > top_k:
        ids = ids[np.argpartition(row[ids], ids.size - top_k)[ids.size - top_k :]]
    return ids


def _unnormalised(row: np.ndarray, ids: np.ndarray, temperature: float) -> np.ndarray:
    """``exp((x - max) / T)`` in float64 for the tokens ``ids`` (which hold the max)."""
    scaled = row[ids].astype(np.float64) / temperature
    return np.exp(scaled - scaled.max())


def _outside_mass(row: np.ndarray, top: float, temperature: float, ids: np.ndarray) -> float:
    """The sum of ``exp((x - top) / T)`` over the tokens of the row not in ``ids``.

    Small rows are summed in float64. A large row takes one float32 pass into a
    reused buffer (:func:`_row_mass`) and the candidates' float32 share comes off that
    sum, so what is left holds only the least likely tokens: its rounding (~1e-7 of
    that share; the subtraction is exact to ~1e-16) can move a top-p
    decision only where the cumulative mass lies within about that much of
    ``top_p``. Plain and speculative decoding call this same function, so they still
    sample the very same distribution.
    """
    if row.shape[0] <= _SAMPLE_SIZE:
        scaled = row.astype(np.float64) / temperature
        weights = np.exp(scaled - float(top) / temperature)
        weights[ids] = 0.0
        return float(weights.sum())
    return _without(_row_mass(row, top, temperature), ids)


def _row_mass(row: np.ndarray, top: float, temperature: float) -> float:
    """Sum of ``exp((x - top) / T)`` over a large row, in float32 (float64 sum).

    Leaves every token's weight in the thread's float32 buffer, so the share of any
    candidate set can be taken off again without another pass (:func:`_without`).
    """
    buffer = _float32_buffer(row.shape[0])
    np.subtract(row, top, out=buffer, casting="unsafe")
    if temperature != 1.0:
        np.multiply(buffer, np.float32(1.0 / temperature), out=buffer)
    np.exp(buffer, out=buffer)
    return float(buffer.sum(dtype=np.float64))


def _without(row_mass: float, ids: np.ndarray) -> float:
    """``row_mass`` less the float32 weights of ``ids`` still in the buffer."""
    share = float(_float32_buffer(_scratch.row.shape[0])[ids].sum(dtype=np.float64))
    return max(row_mass - share, 0.0)


class _Verdict:
    """Why :func:`_nucleus_in` could not return the nucleus."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_BEYOND = _Verdict("BEYOND")  # the nucleus surely reaches past the candidates
_UNDECIDED = _Verdict("UNDECIDED")  # it depends on the mass outside, not known well enough


def _nucleus_in(
    ids: np.ndarray, weights: np.ndarray, top_p: float, outside: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray] | _Verdict:
    """The smallest top set whose mass reaches ``top_p``, if it lies within ``ids``.

    ``weights`` are the candidates' unnormalised probabilities; the rest of the row
    weighs between ``outside[0]`` and ``outside[1]`` on the same scale. The nucleus
    is returned only when every total in that range gives the same one.
    """
    inside = float(weights.sum())
    low, high = top_p * (inside + outside[0]), top_p * (inside + outside[1])
    if inside < high:
        return _BEYOND if inside < low else _UNDECIDED
    if weights.size <= _SORT_LIMIT:
        # One sort serves both goals.
        order = np.argsort(-weights, kind="stable")
        cumulative = np.cumsum(weights[order])
        count = min(int(np.searchsorted(cumulative, high)) + 1, weights.size)
        if high != low and min(int(np.searchsorted(cumulative, low)) + 1, weights.size) != count:
            return _UNDECIDED
        kept = order[:count]
        return ids[kept], weights[kept]
    kept = _smallest_top_set(weights, high)
    if high != low and _smallest_top_set(weights, low).size != kept.size:
        return _UNDECIDED
    return ids[kept], weights[kept]


def _smallest_top_set(weights: np.ndarray, goal: float) -> np.ndarray:
    """Indices of the fewest largest ``weights`` whose sum reaches ``goal``.

    A few hundred weights are simply sorted. More are first grouped by magnitude
    (buckets a quarter of a nat wide, by one ``bincount``), so only the bucket where
    the running sum crosses ``goal`` needs sorting: sorting thousands of candidates
    would cost more than everything else in a round.
    """
    size = weights.size
    if size <= _SORT_LIMIT:
        order = np.argsort(-weights, kind="stable")
        count = int(np.searchsorted(np.cumsum(weights[order]), goal)) + 1
        return order[: min(count, size)]
    # weights are exp(x - max) in (0, 1]: larger weight, lower level; ties share one.
    levels = -np.log(np.maximum(weights, _TINY)) * _LEVELS_PER_NAT
    levels = np.minimum(levels, _LAST_LEVEL).astype(np.int64)
    cumulative = np.cumsum(np.bincount(levels, weights=weights))
    crossing = min(int(np.searchsorted(cumulative, goal)), cumulative.size - 1)
    before = float(cumulative[crossing - 1]) if crossing else 0.0
    above = np.flatnonzero(levels < crossing)
    at = np.flatnonzero(levels == crossing)
    at = at[np.argsort(-weights[at], kind="stable")]
    count = int(np.searchsorted(before + np.cumsum(weights[at]), goal)) + 1
    return np.concatenate((above, at[: min(count, at.size)]))


def _finish(ids: np.ndarray, weights: np.ndarray, min_p: float) -> SparseDistribution:
    """Apply min-p to a truncated set, sort ids, normalise."""
    if min_p > 0.0:
        keep = weights >= min_p * weights.max()
        ids, weights = ids[keep], weights[keep]
    order = np.argsort(ids)
    ids = ids[order].astype(np.int64, copy=False)
    weights = weights[order]
    return SparseDistribution(ids, weights / weights.sum())


def _full_softmax(row: np.ndarray, temperature: float) -> SparseDistribution:
    """No filter: the softmax of the whole row, in float64, in one reused array."""
    probs = np.empty(row.shape[0], dtype=np.float64)
    np.divide(row, temperature, out=probs, dtype=np.float64)
    np.subtract(probs, probs.max(), out=probs)
    np.exp(probs, out=probs)
    probs /= probs.sum()
    return SparseDistribution(_all_ids(row.shape[0]), probs)


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices and probabilities of the smallest top set of ``probs`` reaching ``top_p``.

    For the top-k set, which is small: a plain sort.
    """
    found = _nucleus_in(np.arange(probs.size), probs, top_p, (0.0, 0.0))
    return found if isinstance(found, tuple) else (np.arange(probs.size), probs)


def _inverse_cdf(probs: np.ndarray, u: float) -> int:
    """Index i with cumulative(i - 1) <= u * total < cumulative(i).

    A few hundred probabilities are summed and searched in Python (the same left to
    right sums as ``np.cumsum``, the same search as ``np.searchsorted``): a nucleus of
    a few tokens is then sampled with one numpy call, not three, each of which is cold
    right after a forward. Large distributions are walked block by block (block sums,
    then one block's cumulative sum) instead of one cumulative sum over the whole
    vocabulary.
    """
    size = probs.size
    if size <= _PYTHON_CANDIDATES:
        running = list(itertools.accumulate(probs.tolist()))
        return min(bisect.bisect_right(running, u * running[-1]), size - 1)
    if size <= 4 * _SAMPLE_BLOCK:
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
        return min(index, size - 1)
    block_mass = np.cumsum(np.add.reduceat(probs, np.arange(0, size, _SAMPLE_BLOCK)))
    goal = u * block_mass[-1]
    block = min(int(np.searchsorted(block_mass, goal, side="right")), block_mass.size - 1)
    before = float(block_mass[block - 1]) if block else 0.0
    start = block * _SAMPLE_BLOCK
    inside = np.cumsum(probs[start : start + _SAMPLE_BLOCK])
    index = int(np.searchsorted(inside, goal - before, side="right"))
    return start + min(index, inside.size - 1)
