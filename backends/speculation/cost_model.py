"""The cost model the adaptive policy decides with: seconds for a target forward of n
tokens (measured at load for a few n by backends/speculation/calibration.py, interpolated, refined
by every round) and for one step of the draft model or of the target's MTP head."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backends.speculation.cost_audit import CostAudit, CostCorrection

# A cost is the median of its last RECENT measurements, where the value it started
# from (calibrated, or interpolated) counts as PRIOR_WEIGHT of them: a stall is not a
# cost. With a running average, one slow step moved the estimate: with a target split
# over workers, a one-token forward now and then took 0.18-0.23 s against 0.066 s,
# each raised the plain cost ~30%, and `auto` then drafted at a loss for the rest of
# the reply (0.94x of plain), never timing a plain step again to see it. A lasting
# change comes through once most of the recent measurements show it.
RECENT = 9
PRIOR_WEIGHT = 5


class RecentMedian:
    """One cost: the median of its recent measurements."""

    __slots__ = ("_samples",)

    def __init__(self, start: float, weight: int = PRIOR_WEIGHT) -> None:
        self._samples: deque[float] = deque([start] * weight, maxlen=RECENT)

    def add(self, seconds: float) -> float:
        """Count a measurement; the cost now."""
        samples = self._samples
        samples.append(seconds)
        # statistics.median's own checks cost more than the sort of nine numbers, and
        # this runs every round.
        ordered = sorted(samples)
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass
class CostModel:
    """Seconds for a target forward of n tokens, and for one draft-model step.

    ``target_seconds`` maps batch sizes to measured times; other sizes are linearly
    interpolated (and extrapolated from the last two points). ``exact_batch_limit``
    is the largest forward whose logits were measured bit-identical to one-token
    decoding (None: not measured).
    """

    target_seconds: dict[int, float]
    draft_step_seconds: float | None = None
    exact_batch_limit: int | None = None
    # One step of each draft head by its drafter's name (the target's MTP head, an
    # EAGLE-3 head): measured while it drafts, not calibrated.
    head_step_seconds: dict[str, float] = field(default_factory=dict)
    # How the figures were taken (calibration.py): when (Unix time), the share of the
    # machine's CPUs other processes used meanwhile, and the fastest one-token forward
    # seen (None: not known, e.g. a curve stored before these were kept).
    taken_at: float | None = None
    others_cpu_share: float | None = None
    one_token_fastest: float | None = None
    # Holds the figures to what the loop measures (cost_audit.py); its corrections are
    # what the user is told.
    audit: CostAudit = field(default_factory=CostAudit, init=False, compare=False, repr=False)
    _recent: dict[object, RecentMedian] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if 1 not in self.target_seconds:
            raise ValueError("the cost model needs the time of a 1-token forward")
        self._sizes = sorted(self.target_seconds)
        self._table: list[float] = []
        # Bumped by every observation, so what was derived from the costs is redone.
        self.version = 0

    def verify(self, batch: int) -> float:
        """Estimated seconds for a target forward of ``batch`` tokens."""
        sizes, times = self._sizes, self.target_seconds
        if batch in times:
            return times[batch]
        index = bisect.bisect_left(sizes, batch)
        if index == 0:
            return times[sizes[0]]
        if index >= len(sizes):
            low, high = (sizes[-2], sizes[-1]) if len(sizes) > 1 else (sizes[-1], sizes[-1])
        else:
            low, high = sizes[index - 1], sizes[index]
        if high == low:
            return times[low] * batch / low
        slope = (times[high] - times[low]) / (high - low)
        return max(times[low] + slope * (batch - low), times[1])

    def verify_table(self, largest: int) -> list[float]:
        """``verify(batch)`` at index ``batch`` for every batch up to ``largest`` (index 0
        unused), kept until the next observation: the controller reads it every round."""
        if len(self._table) <= largest:
            self._table = [0.0] + [self.verify(batch) for batch in range(1, largest + 1)]
        return self._table

    def observe_verify(self, batch: int, seconds: float) -> None:
        """Refine the estimate for ``batch`` with a measured forward (or replace the
        curve's figures, where the audit finds them wrong: cost_audit.py)."""
        previous = self.target_seconds.get(batch)
        figure = self.verify(batch)
        replacement = self.audit.check(batch, figure, seconds)
        if replacement is None:
            self.target_seconds[batch] = self._measured(batch, figure, seconds)
        else:
            self._replace(batch, figure, replacement)
            self.audit.announce()
        self.audit.verified(batch, seconds, self.target_seconds[1])
        if previous is None:
            self._sizes = sorted(self.target_seconds)
        self._table = []
        self.version += 1

    def observe_draft_step(self, seconds: float) -> None:
        """Refine the per-step cost of the draft model."""
        corrections = len(self.corrections)
        self.draft_step_seconds = self._step_measured("draft", self.draft_step_seconds, seconds)
        if len(self.corrections) > corrections:
            self.audit.announce()
        self.version += 1

    def observe_head_step(self, name: str, seconds: float) -> None:
        """Refine the per-step cost of the draft head drafter ``name`` drafts with."""
        corrections = len(self.corrections)
        figure = self.head_step_seconds.get(name)
        self.head_step_seconds[name] = self._step_measured(name, figure, seconds)
        if len(self.corrections) > corrections:
            self.audit.announce()
        self.version += 1

    def copy(self) -> CostModel:
        """The figures as they stand, in a model of their own (what was measured since
        and the audit's record stay with this one)."""
        return CostModel(
            dict(self.target_seconds),
            self.draft_step_seconds,
            exact_batch_limit=self.exact_batch_limit,
            head_step_seconds=dict(self.head_step_seconds),
            taken_at=self.taken_at,
            others_cpu_share=self.others_cpu_share,
            one_token_fastest=self.one_token_fastest,
        )

    def take_plain_check(self) -> bool:
        """Should a round that would draft be plain, to time a one-token forward? True
        counts the check as made (cost_audit.py)."""
        return self.audit.take_plain_check()

    @property
    def corrections(self) -> list[CostCorrection]:
        """The figures the loop replaced since load, oldest first."""
        return self.audit.corrections

    def _step_measured(self, key: str, figure: float | None, seconds: float) -> float:
        replacement = self.audit.check(key, figure, seconds)
        if replacement is None:
            return self._measured(key, figure, seconds)
        self._recent[key] = RecentMedian(replacement, RECENT)
        return replacement

    def _replace(self, batch: int, figure: float, seconds: float) -> None:
        """Replace ``batch``'s figure by what the loop measured, forgetting the old one;
        a one-token figure replaced redoes the curve (cost_audit.py says how)."""
        self._recent[batch] = RecentMedian(seconds, RECENT)
        self.target_seconds[batch] = seconds
        if batch != 1:
            return
        ratios = {1: seconds / figure}
        for size in self.target_seconds:
            measured = self.audit.measured(size) if size != 1 else None
            if measured is not None:
                ratios[size] = measured / self.target_seconds[size]
                self.target_seconds[size] = measured
                self._recent[size] = RecentMedian(measured)
        known = sorted(ratios)
        guessed: set[int | str] = set()
        for size, old in self.target_seconds.items():
            if size not in ratios:
                self.target_seconds[size] = max(seconds, old * _ratio_at(size, known, ratios))
                self._recent.pop(size, None)
                guessed.add(size)
        self.audit.guessed(guessed)

    def _measured(self, key: object, start: float | None, seconds: float) -> float:
        """The cost ``key`` after a measurement of ``seconds`` (``start``: its value so
        far; None: nothing known, the first measurement starts it)."""
        recent = self._recent.get(key)
        if recent is None:
            recent = RecentMedian(seconds, 1) if start is None else RecentMedian(start)
            self._recent[key] = recent
            if start is None:
                return seconds
        return recent.add(seconds)

    def ceiling(self, draft_tokens: int) -> float:
        """Speedup of a free drafter that is always right, at this K."""
        return (draft_tokens + 1) * self.verify(1) / self.verify(draft_tokens + 1)


def _ratio_at(size: int, known: list[int], ratios: dict[int, float]) -> float:
    """``ratios`` (measured over stored, at the ``known`` sizes, sorted) at ``size``:
    linear between the two known sizes around it, the nearest one's outside them."""
    index = bisect.bisect_left(known, size)
    if index == 0:
        return ratios[known[0]]
    if index == len(known):
        return ratios[known[-1]]
    low, high = known[index - 1], known[index]
    share = (size - low) / (high - low)
    return ratios[low] + share * (ratios[high] - ratios[low])


class SharedForwardCosts:
    """The costs one of several sequences generating at once decides with.

    Their forwards are one batch (``backends/llamacpp/decode_batcher.py``), and every
    sequence's controller decides alike: n tokens of this sequence then ride with about
    n of each other's, so a forward of ``n`` costs what one of ``sharing() * n`` tokens
    does. On a GPU that is nearly what ``n`` alone costs and speculation stays; on a
    compute-bound CPU, the batch already uses what speculation would have, and plain
    decoding wins. A measured time is the whole batch's, so it is not taken as one
    sequence's while others share the forward. Everything else is the shared model's.
    """

    def __init__(self, costs: CostModel, sharing: Callable[[], int]) -> None:
        self._costs = costs
        self._sharing = sharing
        self._table: tuple[int, int, list[float]] = (-1, -1, [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._costs, name)

    @property
    def version(self) -> int:
        """Changes with the shared model's version and with how many share."""
        return self._costs.version * 1024 + min(1023, self._sharing())

    def verify(self, batch: int) -> float:
        """Seconds for this sequence's forward of ``batch`` tokens among the others."""
        return self._costs.verify(batch * max(1, self._sharing()))

    def verify_table(self, largest: int) -> list[float]:
        """``verify`` for every batch up to ``largest``, kept while nothing changes."""
        sharing, version, table = self._table
        now = max(1, self._sharing())
        if sharing != now or version != self._costs.version or len(table) <= largest:
            table = [0.0] + [self._costs.verify(batch * now) for batch in range(1, largest + 1)]
            self._table = (now, self._costs.version, table)
        return table

    def observe_verify(self, batch: int, seconds: float) -> None:
        """A forward's time, learned only when no other sequence shared it."""
        if self._sharing() <= 1:
            self._costs.observe_verify(batch, seconds)

    def observe_draft_step(self, seconds: float) -> None:
        """A draft step's time, learned only when no other sequence shared it."""
        if self._sharing() <= 1:
            self._costs.observe_draft_step(seconds)

    def take_plain_check(self) -> bool:
        """Only a forward no other sequence shares times one token: no check meanwhile."""
        return self._sharing() <= 1 and self._costs.take_plain_check()

    def ceiling(self, draft_tokens: int) -> float:
        """Speedup of a free drafter that is always right, at this K, among the others."""
        return (draft_tokens + 1) * self.verify(1) / self.verify(draft_tokens + 1)
