"""What the adaptive policy knows of acceptance: per drafter, the chance that each draft
position is accepted (``AcceptanceEstimate``), and for a draft model or MTP head, the
confidence below which a drafted token is not worth verifying (``ConfidenceFloor``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

DECAY = 0.9  # per round, old acceptance evidence fades (recent text weighs more)
PRIOR_WEIGHT = 1.0  # the prior counts as this many rounds of evidence


# Priors, overruled by a few rounds of evidence. N-gram matches are tracked per match
# length: a 2-token match is often chance, a 4-token one often a real repeat, and an
# 8-token one usually a stretch being copied (in a code edit, it ran on for ~10
# tokens on average), so that one earns long drafts without dragging the others up.
PRIOR_ACCEPTANCE = {
    "model": 0.7,
    # Published for Qwen3.6's own head: ~70% of drafted tokens accepted.
    "mtp": 0.7,
    # EAGLE-3's papers report 3-4 tokens a round on chat (about as the MTP head).
    "eagle3": 0.7,
    "prediction": 0.8,
    "ngram:2": 0.3,
    "ngram:3": 0.5,
    "ngram:4": 0.6,
    "ngram:6": 0.65,
    "ngram:8": 0.7,
    # A match through a tool call's JSON escaping (the text lookup): a file written
    # back, though the target may split the text into other tokens than the lookup.
    "ngram:text": 0.6,
    # A match in the index of earlier sessions' streams, by its length: a long one is
    # most often the same reply being written again (the same file after a failed
    # test, the same scaffold), a short one a phrase the two share.
    "ngram:index:4": 0.4,
    "ngram:index:8": 0.55,
    "ngram:index:16": 0.7,
    "ngram:index:32": 0.8,
}


@dataclass
class AcceptanceEstimate:
    """Probability that draft position i is accepted, given positions before it were.

    Kept as decayed counts per position: every observation first multiplies the old
    counts by ``DECAY``, so recent text weighs more, and the estimate is
    ``(accepted + w * prior) / (trials + w)``: a prior that a few rounds of evidence
    overrule. Positions never reached borrow the estimate of the last one reached.
    """

    prior: float
    accepted: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def at(self, position: int) -> float:
        """Estimated acceptance at ``position`` (0-based)."""
        if not self.trials:
            return self.prior
        index = min(position, len(self.trials) - 1)
        return (self.accepted[index] + PRIOR_WEIGHT * self.prior) / (
            self.trials[index] + PRIOR_WEIGHT
        )

    def observe(self, drafted: int, accepted: int) -> None:
        """Positions 0..accepted-1 were accepted, position ``accepted`` (if drafted) not."""
        reached = min(drafted, accepted + 1)
        if reached == 0:
            return
        for index in range(len(self.trials)):
            self.accepted[index] *= DECAY
            self.trials[index] *= DECAY
        while len(self.trials) < reached:
            self.accepted.append(0.0)
            self.trials.append(0.0)
        for position in range(reached):
            self.trials[position] += 1.0
            if position < accepted:
                self.accepted[position] += 1.0

    def expected_tokens(self, draft_tokens: int) -> float:
        """Expected tokens per round with ``draft_tokens`` drafts (bonus included)."""
        expected, survive = 1.0, 1.0
        for position in range(draft_tokens):
            survive *= self.at(position)
            expected += survive
        return expected


CONFIDENCE_BINS = 10


@dataclass
class ConfidenceFloor:
    """Learns below which draft confidence a drafted token is not worth verifying.

    Like llama.cpp's ``p_min``, but learned: decayed counts of accepted and rejected
    draft-model tokens per confidence bin (the draft's probability of its own token,
    tenths of [0, 1]), with a prior that the draft is calibrated (bin midpoint), fitted
    to rise with confidence. The floor is the lower edge of the lowest bin whose
    acceptance reaches the break-even the costs imply.
    """

    accepted: list[float] = field(default_factory=lambda: [0.0] * CONFIDENCE_BINS)
    trials: list[float] = field(default_factory=lambda: [0.0] * CONFIDENCE_BINS)
    # The fitted curve, kept until the next observation (asked for every round).
    _fitted: list[float] | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def _bin(confidence: float) -> int:
        return min(CONFIDENCE_BINS - 1, max(0, int(confidence * CONFIDENCE_BINS)))

    def acceptance(self, index: int) -> float:
        """Estimated acceptance of tokens drafted with confidence in bin ``index``."""
        return self._monotone_acceptance()[index]

    def observe(self, confidences: Sequence[float], accepted: int) -> None:
        """Tokens before ``accepted`` were accepted, the one at ``accepted`` was not."""
        self._fitted = None
        for index in range(CONFIDENCE_BINS):
            self.accepted[index] *= DECAY
            self.trials[index] *= DECAY
        for position, confidence in enumerate(confidences[: accepted + 1]):
            index = self._bin(confidence)
            self.trials[index] += 1.0
            if position < accepted:
                self.accepted[index] += 1.0

    def floor(self, break_even: float) -> float:
        """Stop drafting below this confidence (0.0: never stop early)."""
        monotone = self._monotone_acceptance()
        lowest = next(
            (index for index, value in enumerate(monotone) if value >= break_even),
            CONFIDENCE_BINS,
        )
        return lowest / CONFIDENCE_BINS

    def _monotone_acceptance(self) -> list[float]:
        """Per-bin acceptance, fitted to never fall as confidence rises.

        A more confident draft token is not less likely to be accepted, so bins that
        say otherwise (usually a bin with little evidence next to one with much) are
        pooled with their neighbours, weighted by evidence (pool-adjacent-violators).
        """
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> list[float]:
        blocks: list[list[float]] = []  # [accepted, trials, bins] per pooled block
        for index in range(CONFIDENCE_BINS):
            prior = (index + 0.5) / CONFIDENCE_BINS
            blocks.append(
                [self.accepted[index] + PRIOR_WEIGHT * prior, self.trials[index] + PRIOR_WEIGHT, 1]
            )
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                accepted, trials, bins = blocks.pop()
                blocks[-1][0] += accepted
                blocks[-1][1] += trials
                blocks[-1][2] += bins
        return [accepted / trials for accepted, trials, bins in blocks for _ in range(int(bins))]
