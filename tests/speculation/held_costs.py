"""A cost model whose figures stay as given (nothing learned from timings), and a GPU's
figures, for tests that decide by costs without timing anything.
"""

from __future__ import annotations

from backends.speculation.cost_model import CostModel

# A GPU's figures, where `auto` drafts with the draft model: a verify of a few tokens
# costs about one step and a draft step a fifth of one.
GPU_COSTS = {1: 0.020, 2: 0.0205, 4: 0.021, 8: 0.023, 16: 0.028}
GPU_DRAFT_STEP = 0.004


class HeldCosts(CostModel):
    """Figures the loop's measurements leave as they are: the fakes run in microseconds,
    and the choices these tests need are the ones the figures give."""

    def observe_verify(self, batch: int, seconds: float) -> None:
        """Not learned."""

    def observe_draft_step(self, seconds: float) -> None:
        """Not learned."""
