"""From logits to a distribution: how to sample, and the filters that do it.

Filters apply in one fixed order, to the target's rows and the draft's rows alike, so
that the speculative loop compares like with like: temperature scaling, then top-k,
then top-p (nucleus), then min-p (relative to the most likely token left). Presence
and frequency penalties depend on the reply so far, so the loop applies them to a row
before it gets here (backends/sampling/penalties.py), again to p and q alike.

Distributions are *sparse* (backends/sampling/sparse_distribution.py): the ids that survived
filtering, sorted, with their probabilities. With the usual filters that is tens of
tokens, not the whole vocabulary, so sampling, lookups and the residual
``max(p - q, 0)`` (backends/speculation/rejection.py) cost little. Only with every filter off does
a distribution span the full vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from backends.sampling.nucleus import BEYOND, UNDECIDED, Verdict, finish, nucleus_in
from backends.sampling.penalties import PENALTY_RANGE
from backends.sampling.row_scans import (
    SAMPLE_SIZE,
    all_ids,
    row_mass,
    tokens_for_mass,
    top_k_ids,
    unnormalised,
    upper_set,
    without,
)
from backends.sampling.sparse_distribution import PYTHON_CANDIDATES, SparseDistribution


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature <= 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    # OpenAI's penalties on tokens already in the reply (see backends/sampling/penalties.py);
    # the loop applies them to the rows before the filters above, for p and q alike.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        # The one range check of each field: settings, options and the API's values all
        # become a SamplingParams, and their errors are these words.
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError("temperature must be 0 or more (0 = always the likeliest)")
        if self.top_k < 0:
            raise ValueError("top_k must be 0 or more (0 = no top-k limit)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be above 0 and at most 1")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError("min_p must be 0 or more and under 1 (0 = no min-p limit)")
        low, high = PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            if not low <= getattr(self, name) <= high:  # also rejects NaN
                raise ValueError(f"{name} must be in [{low:g}, {high:g}]")

    @property
    def greedy(self) -> bool:
        """Whether tokens are chosen by argmax."""
        return self.temperature <= 0.0


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
    few hundred tokens (see :func:`upper_set`); top-p without top-k also depends on
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
    # The row's maximum, from its first pass (the first of tied maxima; NaN's index
    # where there is one, as ``max`` would give NaN).
    first = int(row.argmax())
    if top_p < 1.0:
        near = _near_top(row, first, temperature, top_k, top_p, min_p)
        if near is not None:
            return near
    top = row[first]

    if top_k:
        # The k most likely tokens, then the old full-row arithmetic on those k.
        ids = top_k_ids(row, top_k)
        scaled = row[ids].astype(np.float64) / temperature
        probs = _softmax(scaled)
        if top_p < 1.0:
            kept, probs = _nucleus(probs, top_p)
            ids = ids[kept]
        return finish(ids, probs, min_p)

    if min_p > 0.0:
        # A token survives min-p iff exp((x - top) / T) >= min_p, whatever filter ran
        # before (top-p always keeps the most likely token). The float32 threshold is
        # loosened a little so rounding can only let extra tokens in; the exact test
        # in finish removes them again.
        threshold = float(top) + temperature * math.log(min_p)
        threshold -= _THRESHOLD_SLACK * (1.0 + abs(threshold))
        ids = np.flatnonzero(row >= threshold)
        weights = unnormalised(row, ids, temperature)
        if top_p < 1.0:
            # Every other token is below the threshold, so weighs less than this.
            below = math.exp((threshold - float(top)) / temperature) * (1.0 + _BOUND_MARGIN)
            found = nucleus_in(ids, weights, top_p, (0.0, (n_vocab - ids.size) * below))
            if found is UNDECIDED:
                outside = _outside_mass(row, top, temperature, ids)
                found = nucleus_in(ids, weights, top_p, (outside, outside))
            if isinstance(found, tuple):
                ids, weights = found
            # BEYOND: the nucleus holds every candidate and more, min-p decides alone.
        return finish(ids, weights, min_p)

    # Top-p alone: find the nucleus among the top candidates, widening when needed.
    wanted = _FIRST_CANDIDATES
    row_sum: float | None = None  # the whole row's float32 mass, once summed
    while True:
        ids = upper_set(row, wanted)
        weights = unnormalised(row, ids, temperature)
        if ids.size == n_vocab:
            found = nucleus_in(ids, weights, top_p, (0.0, 0.0))
            assert isinstance(found, tuple)  # the whole row reaches any top_p <= 1
            return finish(*found, 0.0)
        found = UNDECIDED
        if row_sum is None:
            # Tokens outside an upper set each weigh less than its least likely member:
            # a bound that usually decides the nucleus without a pass over the whole row.
            bound = (n_vocab - ids.size) * float(weights.min()) * (1.0 + _BOUND_MARGIN)
            found = nucleus_in(ids, weights, top_p, (0.0, bound))
            if found is UNDECIDED:
                row_sum = row_mass(row, top, temperature)
        if found is UNDECIDED:
            # The float32 buffer still holds every weight: the candidates' float32
            # share comes off the row's sum, and their float64 weights count instead.
            # (Once the sum is known, the bound is not tried: the sum decides alone.)
            assert row_sum is not None
            outside = without(row_sum, ids)
            found = nucleus_in(ids, weights, top_p, (outside, outside))
            if found is BEYOND:
                # Size the next candidate set from the mass still missing (estimated
                # from a sample of the weights), rather than widening blindly.
                inside = float(weights.sum())
                missing = top_p * (inside + outside) - inside
                wanted = max(wanted * 2, ids.size + tokens_for_mass(missing, float(weights.min())))
                continue
        if isinstance(found, tuple):
            return finish(*found, 0.0)
        wanted *= _WIDEN


def _near_top(
    row: np.ndarray, first: int, temperature: float, top_k: int, top_p: float, min_p: float
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
    near = _near_top_candidates(row, first, temperature)
    if near is None:
        return None
    ids, values, top, cut, first = near
    n_vocab = row.shape[0]
    count = ids.size
    top_scaled = top / temperature
    # Every token below the cut weighs less than this (computed the way the weights
    # below are, plus a margin for the last bit of rounding).
    each_below = math.exp(float(cut) / temperature - top_scaled) * (1.0 + _BOUND_MARGIN)
    if count <= PYTHON_CANDIDATES:
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
        # The most likely token (weight 1) alone reaches top_p: nucleus_in would keep
        # just it (the first of tied maxima), and the dozen numpy calls it and finish
        # make would cost more than the answer.
        return SparseDistribution.point(first)
    found = nucleus_in(ids, weights, top_p, (0.0, below))
    if found is UNDECIDED and not top_k:
        outside = _outside_mass(row, top, temperature, ids)
        found = nucleus_in(ids, weights, top_p, (outside, outside))
    if isinstance(found, tuple):
        ids, weights = found
    elif found is not BEYOND or not min_p > each_below:
        return None
    # BEYOND with min-p cutting below: the nucleus holds every candidate and tokens
    # below the cut, which min-p then drops (the top token weighs 1 and always
    # survives); min-p decides alone.
    return finish(ids, weights, min_p)


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

    def nucleus_size(low: float, high: float) -> int | Verdict:
        # nucleus_in's decision, on the sorted weights.
        if inside < high:
            return BEYOND if inside < low else UNDECIDED
        size = _first_reaching(order, weights, high)
        if high != low and _first_reaching(order, weights, low) != size:
            return UNDECIDED
        return size

    found = nucleus_size(top_p * inside, top_p * (inside + below))
    if found is UNDECIDED and not top_k:
        # The bound cannot settle it: sum the rest of the row (one float32 pass).
        outside = _outside_mass(row, top, temperature, ids)
        found = nucleus_size(top_p * (inside + outside), top_p * (inside + outside))
    if isinstance(found, int):
        order = order[:found]
    elif found is not BEYOND or not min_p > each_below:
        return None  # undecided, or a nucleus reaching below the cut min-p does not cut
    # (BEYOND with min-p cutting below: the nucleus holds every candidate and tokens
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
    row: np.ndarray, first: int, temperature: float
) -> tuple[np.ndarray, np.ndarray, float, np.float32, int] | None:
    """Every token within ``T * _NEAR_TOP_NATS`` of the row's maximum.

    ``first`` is the row's argmax (the first of tied maxima). Returns the candidates'
    ids (ascending), their logits, the maximum, the cut (every token left out lies
    below it) and ``first``. None for a row with
    more than ``_NEAR_TOP_LIMIT`` such tokens (or a maximum that is not finite).

    Two sequential passes (the argmax, then the comparison) and nothing strided over
    the whole row: right after a forward the row is not in the CPU's caches, and
    streaming it costs less than a strided sample of it (measured after the starter
    target's decode: ~65 us for the first pass, ~50 us for a sample of every 74th
    logit; the second pass then finds the row in the cache). The argmax rather than
    ``max``: numpy's reductions pay ~45 us of cold code after a decode, its argmax less.
    """
    top = float(row[first])  # NaN: argmax gave the first NaN's index
    if not math.isfinite(top):
        return None  # NaN, +inf, or a row the grammar masked whole: the general path
    # Rounded to float32 as the comparison with the row is; the bound uses that value.
    cut = np.float32(top - temperature * _NEAR_TOP_NATS)
    if _looks_flat(row, cut):
        return None  # the general path, without listing tens of thousands of ids
    ids = (row >= cut).nonzero()[0]
    if ids.size > _NEAR_TOP_LIMIT:
        return None  # a flat row: the general path
    return ids, row[ids], top, cut, first


def _looks_flat(row: np.ndarray, cut: np.float32) -> bool:
    """Whether a probe of every ``_FLAT_PROBE_STRIDE``-th logit finds so many at or above
    ``cut`` that the row very likely has more than ``_NEAR_TOP_LIMIT`` such tokens.

    Only a choice of path (both give the same distribution): listing the ids of a
    flat row's near-top tokens costs ~90 us, and the probe, in Python on a few dozen
    logits the argmax has just brought into the cache, a few: no numpy call, which
    would pay its cold code on every peaked row.
    """
    probe = row[::_FLAT_PROBE_STRIDE].tolist()
    limit = float(cut)
    return len([value for value in probe if value >= limit]) > _FLAT_PROBE_HITS


def _softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()


# How many top tokens the first candidate set for top-p aims to hold; it grows x8
# while the nucleus does not fit.
_FIRST_CANDIDATES = 256
_WIDEN = 8
# Relative loosening of float32 thresholds, far above float32 rounding (~6e-8).
_THRESHOLD_SLACK = 1e-5
# Bounds on the mass outside the candidates are widened by this, for rounding.
_BOUND_MARGIN = 1e-9
# The first candidate set holds the tokens within T * _NEAR_TOP_NATS of the maximum:
# each token below weighs under 1e-4 / 151,936 of the most likely one. On an LLM's
# rows at temperature 0.7 that is a few to a few hundred tokens (measured on the
# starter pair); a flat row with more than _NEAR_TOP_LIMIT of them takes the general path.
_NEAR_TOP_WEIGHT = 1e-4 / 151_936
_NEAR_TOP_NATS = -math.log(_NEAR_TOP_WEIGHT)
_NEAR_TOP_LIMIT = 8192
# A row whose probe of every 4,096th logit finds more than 4 near the top has, on
# average, more than 16,000 tokens there (a peaked row's probe finds none or one).
_FLAT_PROBE_STRIDE = 4096
_FLAT_PROBE_HITS = 4


def _outside_mass(row: np.ndarray, top: float, temperature: float, ids: np.ndarray) -> float:
    """The sum of ``exp((x - top) / T)`` over the tokens of the row not in ``ids``.

    Small rows are summed in float64. A large row takes one float32 pass into a
    reused buffer (:func:`row_mass`) and the candidates' float32 share comes off that
    sum, so what is left holds only the least likely tokens: its rounding (~1e-7 of
    that share; the subtraction is exact to ~1e-16) can move a top-p
    decision only where the cumulative mass lies within about that much of
    ``top_p``. Plain and speculative decoding call this same function, so they still
    sample the very same distribution.
    """
    if row.shape[0] <= SAMPLE_SIZE:
        scaled = row.astype(np.float64) / temperature
        weights = np.exp(scaled - float(top) / temperature)
        weights[ids] = 0.0
        return float(weights.sum())
    return without(row_mass(row, top, temperature), ids)


def _full_softmax(row: np.ndarray, temperature: float) -> SparseDistribution:
    """No filter: the softmax of the whole row, in float64, in one reused array."""
    probs = np.empty(row.shape[0], dtype=np.float64)
    np.divide(row, temperature, out=probs, dtype=np.float64)
    np.subtract(probs, probs.max(), out=probs)
    np.exp(probs, out=probs)
    probs /= probs.sum()
    return SparseDistribution(all_ids(row.shape[0]), probs)


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices and probabilities of the smallest top set of ``probs`` reaching ``top_p``.

    For the top-k set, which is small: a plain sort.
    """
    found = nucleus_in(np.arange(probs.size), probs, top_p, (0.0, 0.0))
    return found if isinstance(found, tuple) else (np.arange(probs.size), probs)
