"""A fake multi-token-prediction head: a seeded-noise copy of the HashModel target
(tests/support/fakes.py), so its drafts are partly accepted and exactly reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.sampling.rows import HostRows
from tests.support.fakes import HashModel, draft_model_for


class FakeHead:
    """A draft head that reads the committed context and chains on its own guesses."""

    def __init__(self, target: HashModel) -> None:
        self.guesser = draft_model_for(target, noise_scale=1.0)
        self.chain: list[int] = []
        self.starts: list[int] = []

    def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
        self.starts.append(evaluated)
        self.chain = list(context)
        return self._row()

    def step(self, token: int) -> HostRows:
        self.chain.append(token)
        return self._row()

    def finish(self) -> None:
        self.chain = []

    def _row(self) -> HostRows:
        return HostRows(self.guesser.logits_for(self.chain)[np.newaxis])
