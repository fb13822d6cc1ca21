"""The MTP drafter and the rollback limit in the loop and the controller, on fakes.

No runtime: the "head" is a seeded-noise copy of the HashModel target (tests/support/fakes.py)
read through the :class:`~backends.speculation.mtp_drafter.DraftHead` protocol, so it drafts with
partial acceptance like a real head. The llama.cpp head itself is tested on tiny
GGUFs in tests/speculation/test_mtp_drafter.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.errors import BackendError
from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.rows import HostRows
from backends.speculation.controller import AdaptiveDraftPolicy, CostModel
from backends.speculation.draft_policy import FixedDraftPolicy, RoundOutcome
from backends.speculation.loop import speculative_generate
from backends.speculation.mtp_drafter import MtpDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.speculation.fake_head import (
    FakeHead,
)
from tests.support.fake_runs import chat_prompt, run_generation
from tests.support.fakes import HashModel

GPU_LIKE = {1: 0.010, 2: 0.0102, 4: 0.0106, 8: 0.011, 16: 0.012}


class LimitedHashModel(HashModel):
    """A target that rolls back for free only this deep (as a hybrid model's snapshots)."""

    rollback_limit = 2


def test_greedy_mtp_speculation_writes_what_plain_decoding_writes():
    target = HashModel()
    prompt = chat_prompt(target, "the head drafts from the state")
    plain = run_generation(target, prompt, FixedDraftPolicy(None, 0), SamplingParams())
    head = FakeHead(target)
    drafted = run_generation(
        target, prompt, FixedDraftPolicy(MtpDrafter(target, head), 4), SamplingParams()
    )
    tokens = [t for event in drafted.events for t in event.tokens]
    assert tokens == [t for event in plain.events for t in event.tokens]
    stats = drafted.events[-1].stats
    assert stats.drafted > stats.accepted > 0
    # Every proposal started where the target's cache ended: the pending token.
    assert all(evaluated > 0 for evaluated in head.starts)


def test_the_mtp_drafter_reports_the_heads_filtered_row_as_q():
    target = HashModel()
    prompt = chat_prompt(target, "q is the distribution of the head")
    target.prefill(prompt[:-1])
    head = FakeHead(target)
    params = SamplingParams(temperature=0.9, top_k=12)
    proposal = MtpDrafter(target, head).propose(prompt, 1, params, np.random.default_rng(3))
    expected = distribution(head.guesser.logits_for(prompt), params)
    q = proposal.distributions[0]
    assert np.array_equal(q.ids, expected.ids) and np.allclose(q.probs, expected.probs)
    assert proposal.tokens[0] in set(q.ids.tolist())


def test_a_head_that_cannot_draft_here_proposes_nothing():
    target = HashModel()
    prompt = chat_prompt(target, "no state to read")

    class Blind(FakeHead):
        def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
            return None

    drafter = MtpDrafter(target, Blind(target))
    proposal = drafter.propose(prompt, 4, SamplingParams(), np.random.default_rng(0))
    assert proposal.tokens == []


def test_auto_drafts_with_the_head_and_learns_its_cost_and_confidence():
    target = HashModel()
    mtp = MtpDrafter(target, FakeHead(target))
    costs = CostModel(dict(GPU_LIKE))
    policy = AdaptiveDraftPolicy([NgramDrafter(), mtp], costs)
    plan = policy.plan(chat_prompt(target, "fresh text"))
    assert plan.drafter is not None and plan.drafter.name == "mtp"
    assert plan.drafter is not mtp  # the view whose confidence floor the policy sets
    policy.observe(
        RoundOutcome(
            drafter="mtp",
            drafted=3,
            accepted=1,
            verify_seconds=0.0104,
            emitted=2,
            draft_confidences=(0.9, 0.3, 0.2),
            draft_step_seconds=0.0007,
        )
    )
    assert costs.head_step_seconds["mtp"] == 0.0007
    assert sum(policy.floors["mtp"].trials) > 0


def test_no_round_drafts_deeper_than_the_targets_rollback_limit():
    target = LimitedHashModel()
    prompt = chat_prompt(target, "a hybrid target undoes two drafts for free")
    drafter = MtpDrafter(target, FakeHead(target))
    record = run_generation(target, prompt, FixedDraftPolicy(drafter, 6), SamplingParams())
    assert max(event.draft_length for event in record.events) == 2
    engine = Engine(target, costs=CostModel(dict(GPU_LIKE)))
    assert (
        engine.policy_for(GenerationRequest((1, 2), drafter="ngram", draft_tokens=9)).draft_length
        == 2
    )
    assert engine.policy_for(GenerationRequest((1, 2))).max_draft_tokens == 2


def test_a_runtime_without_mtp_heads_says_so():
    engine = Engine(HashModel())
    with pytest.raises(BackendError, match="MLX runs EAGLE-3 and DFlash heads"):
        engine.drafter_named("mtp")
    with pytest.raises(BackendError, match="cannot draft with a model's MTP head"):
        engine.attach_mtp_head("head.gguf")


def test_the_head_reads_forced_tokens_then_drafts_and_changes_nothing():
    """Under a grammar, the forced stretch and the head's guesses after it share one
    verify: the head reads the forced tokens (past the target's cache) before it drafts."""
    from backends.output.constraints import GrammarSpec, GrammarVocabulary

    stretches = GrammarSpec(
        "regex", "(the|an|re)(ing|ed|er) qxz (on|at|re)(ing|ed|es) qxz (the|an)(ing|ed)"
    )
    vocabulary = GrammarVocabulary(HashModel())

    def run(drafter_for) -> list:
        target = HashModel()
        drafter = drafter_for(target)
        return list(
            speculative_generate(
                target,
                target.tokenize("<|user|>hello<|assistant|>"),
                FixedDraftPolicy(drafter, 3 if drafter is not None else 0),
                ReplySpec(SamplingParams(), 40, constraint=vocabulary.compile(stretches).start()),
            )
        )

    heads: list[FakeHead] = []

    def with_head(target: HashModel) -> MtpDrafter:
        heads.append(FakeHead(target))
        return MtpDrafter(target, heads[-1])

    plain = run(lambda target: None)
    events = run(with_head)
    assert [t for e in events for t in e.tokens] == [t for e in plain for t in e.tokens]
    assert any(event.drafter == "grammar+mtp" for event in events)
