"""Scripted costs for the draft policy's tests: a CPU's and a GPU's measured figures, and a
stub that stands in for the draft model where only its name and cost class matter
(``_treat_stub_as_model_drafter``, an autouse fixture for the modules that import it).
"""

from __future__ import annotations

import pytest

from backends.speculation.proposal import DraftProposal

# Measured on a 2-core CPU with the starter pair: verify is nearly linear in n and the
# draft step costs 2/3 of a target step.
CPU_COSTS = {1: 0.034, 2: 0.063, 4: 0.115, 8: 0.240, 16: 0.364}
# A GPU: memory-bound, a verify of a few tokens costs about one step; draft is cheap.
GPU_COSTS = {1: 0.020, 2: 0.0205, 4: 0.021, 8: 0.023, 16: 0.028}
GPU_DRAFT_STEP = 0.004


class StubModelDrafter:
    """Stands in for ModelDrafter where only its name and cost class matter."""

    name = "model"

    def begin(self, prompt_tokens):
        pass

    def propose(self, context, max_tokens, params, rng):
        return DraftProposal(tokens=[1] * max_tokens, passes=max_tokens)


@pytest.fixture(autouse=True)
def _treat_stub_as_model_drafter(monkeypatch: pytest.MonkeyPatch):
    # The policy charges draft-model steps to drafters that are ModelDrafters.
    import backends.speculation.drafter_costs as drafter_costs

    monkeypatch.setattr(drafter_costs, "ModelDrafter", StubModelDrafter)
