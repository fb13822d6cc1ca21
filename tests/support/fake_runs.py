"""Driving the loop over the fakes (tests/support/fakes.py) and recording what it did.

:class:`ConstantDrafter` proposes one token every round; :class:`RecordingPolicy` wraps
a draft policy and records what it was asked and told; :func:`run_generation` drains the
loop and records the target's cache after every event; :func:`chat_prompt` is a prompt
in the fakes' chat template.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.base import ChatMessage
from backends.generation_events import GenerationEvent, SpeculativeStats
from backends.sampling.filters import SamplingParams
from backends.speculation.draft_policy import DraftPolicy, RoundOutcome, RoundPlan
from backends.speculation.loop import speculative_generate
from backends.speculation.proposal import EMPTY_PROPOSAL, DraftProposal
from backends.speculation.reply_spec import LoopHooks, ReplySpec
from tests.support.fakes import HashModel


class ConstantDrafter:
    """Proposes ``token`` K times every round (BOS: a draft the target always rejects)."""

    name = "constant"

    def __init__(self, token: int) -> None:
        self.token = token
        self.proposals = 0

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Nothing to reset."""

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        """``max_tokens`` copies of the token."""
        if max_tokens <= 0:
            return EMPTY_PROPOSAL
        self.proposals += 1
        return DraftProposal(tokens=[self.token] * max_tokens)


@dataclass
class RecordingPolicy:
    """Wraps a policy; records each plan (context length, K) and each outcome."""

    inner: DraftPolicy
    begun_with: list[list[int]] = field(default_factory=list)
    # It is told every round, to record it, whatever the inner policy learns.
    LEARNS = True
    plans: list[tuple[int, int]] = field(default_factory=list)
    outcomes: list[RoundOutcome] = field(default_factory=list)

    @property
    def FIRST_TOKEN_NEVER_WAITS(self) -> bool:
        return self.inner.FIRST_TOKEN_NEVER_WAITS

    @property
    def exact_batch_limit(self) -> int | None:
        return self.inner.exact_batch_limit

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """Record and pass on."""
        self.begun_with.append(list(prompt_tokens))
        self.inner.begin(prompt_tokens)

    def plan(self, context: Sequence[int]) -> RoundPlan:
        """Record and pass on."""
        plan = self.inner.plan(context)
        self.plans.append((len(context), plan.draft_length))
        return plan

    def observe(self, outcome: RoundOutcome) -> None:
        """Record and pass on."""
        self.outcomes.append(outcome)
        self.inner.observe(outcome)


@dataclass
class GenerationRecord:
    """Everything one generation yielded, plus the target's cache after each event."""

    prompt: list[int]
    events: list[GenerationEvent]
    caches: list[tuple[int, ...]]

    @property
    def tokens(self) -> list[int]:
        """Every emitted token, in order."""
        return [token for event in self.events for token in event.tokens]

    @property
    def from_draft(self) -> list[bool]:
        """Each emitted token's provenance."""
        return [flag for event in self.events for flag in event.from_draft]

    @property
    def text(self) -> str:
        """All the text shown."""
        return "".join(event.text for event in self.events)

    @property
    def finish_reason(self) -> str | None:
        """The last event's finish reason."""
        return self.events[-1].finish_reason

    @property
    def stats(self) -> SpeculativeStats:
        """The final statistics."""
        return self.events[-1].stats


def run_generation(
    target: HashModel,
    prompt: Sequence[int],
    policy: DraftPolicy,
    params: SamplingParams,
    *,
    max_tokens: int = 64,
    stop: Sequence[str] = (),
    cancel: threading.Event | None = None,
    on_event: Callable[[GenerationEvent], None] | None = None,
) -> GenerationRecord:
    """Drain ``speculative_generate``; snapshot the target's cache at every event."""
    record = GenerationRecord(prompt=list(prompt), events=[], caches=[])
    for event in speculative_generate(
        target, prompt, policy, ReplySpec(params, max_tokens, stop=stop), LoopHooks(cancel=cancel)
    ):
        record.events.append(event)
        record.caches.append(target.cached_tokens)
        if on_event is not None:
            on_event(event)
    return record


def chat_prompt(model: HashModel, text: str) -> list[int]:
    """Token ids of a one-turn chat prompt."""
    return model.tokenize(model.apply_chat_template([ChatMessage("user", text)]))
