"""Passes over one row of logits: upper sets, masses, and the row's statistics.

What the filters build on (the ids of a row's most likely tokens without sorting the
vocabulary, the mass of a row in one float32 pass into a reused buffer), and what the
loop reads off a row besides a distribution: its log-normaliser and top ids (logprobs)
and a drafter's confidence in its greedy token.
"""

from __future__ import annotations

import math
import threading

import numpy as np

# Rows up to this size are selected exactly (np.partition of the whole row is cheap);
# larger ones estimate a cut-off from a strided sample of about this many logits.
SAMPLE_SIZE = 2048
# top_token_probability leaves out tokens this far below the top (temperature 1): on
# a 151,936-token vocabulary they hold at most 0.1% of the top's weight. Above
# _CONFIDENCE_NEAR_LIMIT tokens that close, one pass over the row is cheaper.
_CONFIDENCE_NATS = np.float32(math.log(151_936 / 1e-3))
_CONFIDENCE_NEAR_LIMIT = 16_384

_scratch = threading.local()
_aranges: dict[int, np.ndarray] = {}


def _float32_buffer(size: int) -> np.ndarray:
    """A per-thread float32 scratch row, reused so a round allocates nothing large."""
    buffer = getattr(_scratch, "row", None)
    if buffer is None or buffer.shape[0] != size:
        buffer = np.empty(size, dtype=np.float32)
        _scratch.row = buffer
    return buffer


def all_ids(size: int) -> np.ndarray:
    """Read-only ``arange(size)`` shared by every full-vocabulary distribution."""
    ids = _aranges.get(size)
    if ids is None:
        ids = np.arange(size, dtype=np.int64)
        ids.setflags(write=False)
        _aranges[size] = ids
    return ids


def upper_set(row: np.ndarray, at_least: int) -> np.ndarray:
    """Ids (ascending) of every token whose logit reaches some cut-off, at least ``at_least``.

    The set is closed upwards (no token outside beats a token inside; tied tokens are
    all in or all out), so it holds the top ``at_least`` tokens whichever way ties
    are broken. A large row's cut-off is estimated from a strided sample, aiming at
    about twice ``at_least`` tokens; when the sample misleads (the row is not alike
    along its length) and too few pass, the exact cut-off is selected instead.
    """
    n_vocab = row.shape[0]
    if at_least >= n_vocab:
        return all_ids(n_vocab)
    if n_vocab > SAMPLE_SIZE:
        stride = n_vocab // SAMPLE_SIZE
        sample = row[::stride]
        rank = min(sample.size, 2 * -(-at_least // stride) + 4)
        cutoff = np.partition(sample, sample.size - rank)[sample.size - rank]
        ids = np.flatnonzero(row >= cutoff)
        if ids.size >= at_least:
            return ids
    cutoff = np.partition(row, n_vocab - at_least)[n_vocab - at_least]
    return np.flatnonzero(row >= cutoff)


def top_k_ids(row: np.ndarray, top_k: int) -> np.ndarray:
    """Exactly ``top_k`` ids of the most likely tokens (ties at the boundary: any)."""
    ids = upper_set(row, top_k)
    if ids.size > top_k:
        ids = ids[np.argpartition(row[ids], ids.size - top_k)[ids.size - top_k :]]
    return ids


def unnormalised(row: np.ndarray, ids: np.ndarray, temperature: float) -> np.ndarray:
    """``exp((x - max) / T)`` in float64 for the tokens ``ids`` (which hold the max)."""
    scaled = row[ids].astype(np.float64) / temperature
    return np.exp(scaled - scaled.max())


def row_mass(row: np.ndarray, top: float, temperature: float) -> float:
    """Sum of ``exp((x - top) / T)`` over a large row, in float32 (float64 sum).

    Leaves every token's weight in the thread's float32 buffer, so the share of any
    candidate set can be taken off again without another pass (:func:`without`).
    """
    buffer = _float32_buffer(row.shape[0])
    np.subtract(row, top, out=buffer, casting="unsafe")
    if temperature != 1.0:
        np.multiply(buffer, np.float32(1.0 / temperature), out=buffer)
    np.exp(buffer, out=buffer)
    return float(buffer.sum(dtype=np.float64))


def without(row_mass: float, ids: np.ndarray) -> float:
    """``row_mass`` less the float32 weights of ``ids`` still in the buffer."""
    share = float(_float32_buffer(_scratch.row.shape[0])[ids].sum(dtype=np.float64))
    return max(row_mass - share, 0.0)


def tokens_for_mass(mass: float, below: float) -> int:
    """About how many tokens lighter than ``below`` it takes, heaviest first, to add up
    to ``mass``; the row's size where they never do.

    Estimated from a strided sample of the weights the last :func:`row_mass` left in the
    buffer (each sampled weight standing for ``stride`` tokens): a guess that sizes a
    candidate set, never a decision, so it may be wrong either way.
    """
    buffer = _scratch.row
    size = buffer.shape[0]
    stride = max(size // SAMPLE_SIZE, 1)
    if mass <= 0.0:
        return stride
    sample = buffer[::stride]
    sample = sample[sample < below]
    cumulative = np.cumsum(np.sort(sample)[::-1], dtype=np.float64)
    taken = int(np.searchsorted(cumulative, mass / stride)) + 1
    return size if taken > sample.size else taken * stride


def log_normaliser(logits_row: np.ndarray) -> float:
    """``log(sum(exp(x)))`` of one row at temperature 1: its log-softmax is ``x`` minus this.

    A large row takes one float32 pass summed in float64 (:func:`row_mass`): 10x
    cheaper than float64 on a 150k vocabulary, within ~1e-8 of it. Tokens at -inf
    (masked by a grammar) weigh nothing.
    """
    row = np.asarray(logits_row)
    top = float(row.max())
    if row.shape[0] <= SAMPLE_SIZE:
        return top + math.log(float(np.exp(row.astype(np.float64) - top).sum()))
    return top + math.log(row_mass(row, top, 1.0))


def top_token_probability(logits_row: np.ndarray, token: int) -> float:
    """Softmax probability (temperature 1) of ``token``, the row's argmax, to within 0.1%.

    A drafter's confidence in its greedy token, not a sampling decision: only the
    tokens within ``_CONFIDENCE_NATS`` of the top are summed (one comparison over the
    row, then a few hundred exponentials). Every token below weighs less than
    1e-3 / 151,936 of the top one, so together they could lower the probability by at
    most 0.1% on such a vocabulary; the confidence floor works in tenths. A flat row,
    with more than ``_CONFIDENCE_NEAR_LIMIT`` tokens that close, is summed whole in one
    float32 pass into the reused buffer instead (:func:`row_mass`). No strided sample
    decides that first: after a forward the row is out of the CPU's caches, and a
    sample touching a cache line per logit cost more than the comparison it saved.
    """
    row = np.asarray(logits_row)
    top = row[token]
    near = np.flatnonzero(row >= top - _CONFIDENCE_NATS)
    if near.size > _CONFIDENCE_NEAR_LIMIT:
        return 1.0 / row_mass(row, float(top), 1.0)
    return float(1.0 / np.exp(row[near] - top).sum(dtype=np.float64))


def top_ids(values: np.ndarray, count: int) -> np.ndarray:
    """The indices of the ``count`` largest ``values``, largest first (ties: any order).

    Found among an upper set (:func:`upper_set`) rather than by partitioning the whole
    row, which costs ~1 ms on a 150k vocabulary.
    """
    if count <= 0:
        return np.empty(0, dtype=np.int64)
    ids = top_k_ids(values, min(count, values.shape[0]))
    return ids[np.argsort(-values[ids], kind="stable")]
