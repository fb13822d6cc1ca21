"""The free drafts first, a draft head after them (issue 54 part 4), on fakes.

The head is a seeded-noise copy of the HashModel target (tests/speculation/fake_head.py)
read through the DraftHead protocol, as the MTP and EAGLE-3 drafters read a runtime's
head; the chain is an n-gram drafter's match followed by that head's drafts. The real
heads are chained in tests/speculation/test_eagle3_drafter.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.engine import Engine, GenerationRequest
from backends.sampling.filters import SamplingParams
from backends.sampling.rows import HostRows
from backends.speculation.acceptance import AcceptanceEstimate
from backends.speculation.block_drafter import BlockDrafter
from backends.speculation.chained_drafter import ChainedDrafter
from backends.speculation.controller import AdaptiveDraftPolicy, CostModel
from backends.speculation.draft_policy import FixedDraftPolicy, RoundOutcome
from backends.speculation.drafter_costs import BLOCK_PRIOR, DraftCost, draft_cost
from backends.speculation.mtp_drafter import MtpDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.proposal import DraftProposal
from tests.speculation.fake_head import FakeHead
from tests.support.fake_runs import chat_prompt, run_generation
from tests.support.fakes import HashModel

GPU_LIKE = {1: 0.010, 2: 0.0102, 4: 0.0106, 8: 0.011, 16: 0.012}
REPEATED = "alpha beta gamma delta epsilon zeta eta theta " * 3


class RecordingHead(FakeHead):
    """A fake head that keeps every context it was started on."""

    def __init__(self, target: HashModel) -> None:
        super().__init__(target)
        self.contexts: list[list[int]] = []

    def start(self, evaluated: int, context: Sequence[int]) -> HostRows | None:
        self.contexts.append(list(context))
        return super().start(evaluated, context)


# Eight tokens, one other, the eight again: the suffix matches the start, and the
# match's continuation (the other token, then the eight) runs into the context's end.
STRETCH = list(range(10, 18))
MATCHED = [*STRETCH, 30, *STRETCH]


def _matched_context(target: HashModel) -> tuple[list[int], NgramDrafter]:
    """A context the target has read, whose end the n-gram drafter matches earlier on."""
    target.prefill(MATCHED[:-1])
    ngram = NgramDrafter()
    ngram.begin(MATCHED)
    return list(MATCHED), ngram


def _confident(keys: Sequence[str]) -> dict[str, AcceptanceEstimate]:
    """What "auto" would have learned of drafts that were nearly always right."""
    return {key: AcceptanceEstimate(0.97) for key in keys}


def test_a_chain_drafts_the_match_then_the_heads_guesses_after_it():
    target = HashModel()
    context, ngram = _matched_context(target)
    params = SamplingParams(temperature=0.8, top_k=20)
    free = ngram.propose(context, 16, params, np.random.default_rng(0)).tokens[:3]
    assert len(free) == 3
    head = RecordingHead(target)
    chain = ChainedDrafter(ngram, MtpDrafter(target, head))
    # The match is longer than three tokens; ask for a round where it fills three.
    ngram_limited = NgramDrafter()
    ngram_limited.begin(context)
    chain.free = _Capped(ngram_limited, 3)  # type: ignore[assignment]
    proposal = chain.propose(context, 7, params, np.random.default_rng(1))

    assert chain.name == "ngram+mtp" and chain.last_free_tokens == 3
    assert proposal.tokens[:3] == free and len(proposal.tokens) == 7
    # The head read the match after the target's cache, then drafted from there.
    assert head.contexts == [[*context, *free]]
    assert proposal.distributions is not None and len(proposal.distributions) == 7
    for token, q in zip(free, proposal.distributions[:3], strict=True):
        assert q.ids.tolist() == [token] and q.probs.tolist() == [1.0]
    # The head's part is the head's own proposal from that context, q and all.
    alone = MtpDrafter(target, FakeHead(target)).propose(
        [*context, *free], 4, params, np.random.default_rng(1)
    )
    assert proposal.tokens[3:] == alone.tokens
    for mine, theirs in zip(proposal.distributions[3:], alone.distributions or [], strict=True):
        assert np.array_equal(mine.ids, theirs.ids) and np.allclose(mine.probs, theirs.probs)


class _Capped:
    """An n-gram drafter whose match is cut to ``cap`` tokens (a match that ends)."""

    def __init__(self, ngram: NgramDrafter, cap: int) -> None:
        self.ngram, self.cap = ngram, cap

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> DraftProposal:
        return self.ngram.propose(context, min(max_tokens, self.cap), params, rng)

    def lookup(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        return self.ngram.lookup(context, min(max_tokens, self.cap))


def test_a_match_that_fills_the_round_leaves_the_head_idle():
    target = HashModel()
    context, ngram = _matched_context(target)
    head = RecordingHead(target)
    chain = ChainedDrafter(ngram, MtpDrafter(target, head))
    proposal = chain.propose(context, 4, SamplingParams(), np.random.default_rng(0))
    assert len(proposal.tokens) == 4 and chain.last_free_tokens == 4
    assert head.contexts == []


def test_greedy_chained_drafts_write_plain_decodings_tokens():
    prompt_text = "repeat after me " + REPEATED
    target = HashModel()
    prompt = chat_prompt(target, prompt_text)
    plain = run_generation(
        target, prompt, FixedDraftPolicy(None, 0), SamplingParams(), max_tokens=96
    )
    target = HashModel()
    chain = ChainedDrafter(NgramDrafter(), MtpDrafter(target, FakeHead(target)))
    record = run_generation(
        target, prompt, FixedDraftPolicy(chain, 8), SamplingParams(), max_tokens=96
    )
    assert record.tokens == plain.tokens
    assert all(event.drafter == "ngram+mtp" for event in record.events[1:])
    assert record.stats.drafted > record.stats.accepted > 0


def test_auto_prices_a_chain_past_a_short_match_and_credits_each_part():
    target = HashModel()
    context, ngram = _matched_context(target)
    free = len(ngram.lookup(context, 16)[0])
    assert free == 9
    head = MtpDrafter(target, FakeHead(target))
    costs = CostModel(dict(GPU_LIKE))
    costs.head_step_seconds["mtp"] = 0.0003
    chain = ChainedDrafter(ngram, head)
    acceptance = _confident([ngram.last_match_key, "mtp"])
    policy = AdaptiveDraftPolicy([ngram, head, chain], costs, acceptance=acceptance)
    # A trusted match of nine tokens, then a cheap head right most of the time: the
    # chain expects more tokens a second than the match alone.
    plan = policy.plan(context)
    assert plan.drafter is not None and plan.drafter.name == "ngram+mtp"
    assert plan.draft_length > free
    match_key = ngram.last_match_key
    steps: list[tuple[str, float]] = []
    costs.observe_head_step = lambda name, seconds: steps.append((name, seconds))  # type: ignore[method-assign]
    chain.last_free_tokens = 2  # as if the grammar had cut the match to two
    policy.observe(
        RoundOutcome(
            drafter="ngram+mtp",
            drafted=5,
            accepted=3,
            verify_seconds=0.011,
            emitted=4,
            draft_step_seconds=0.0009,
        )
    )
    # The match's two positions were accepted; the head's three: one, then a miss.
    matched = policy.acceptance[match_key]
    assert matched.trials[:2] == [1.0, 1.0] and matched.accepted[:2] == [1.0, 1.0]
    headed = policy.acceptance["mtp"]
    assert headed.trials[:2] == [1.0, 1.0] and headed.accepted[:2] == [1.0, 0.0]
    assert len(headed.trials) == 2
    assert steps == [("mtp", 0.0009)]  # the head's step, measured in the chain


def test_without_a_cheap_trusted_head_the_match_alone_is_chosen():
    target = HashModel()
    context, ngram = _matched_context(target)
    head = MtpDrafter(target, FakeHead(target))
    acceptance = _confident([ngram.lookup(context, 16) and ngram.last_match_key])
    acceptance["mtp"] = AcceptanceEstimate(0.2)
    policy = AdaptiveDraftPolicy(
        [ngram, head, ChainedDrafter(ngram, head)], CostModel(dict(GPU_LIKE)), acceptance=acceptance
    )
    plan = policy.plan(context)
    assert plan.drafter is ngram


def test_a_chain_whose_match_was_rejected_teaches_the_head_nothing():
    target = HashModel()
    context, ngram = _matched_context(target)
    head = MtpDrafter(target, FakeHead(target))
    chain = ChainedDrafter(ngram, head)
    costs = CostModel(dict(GPU_LIKE))
    costs.head_step_seconds["mtp"] = 0.0003
    acceptance = _confident([ngram.lookup(context, 16) and ngram.last_match_key, "mtp"])
    policy = AdaptiveDraftPolicy([ngram, head, chain], costs, acceptance=acceptance)
    plan = policy.plan(context)
    assert plan.drafter is not None and plan.drafter.name == "ngram+mtp"
    chain.last_free_tokens = 9
    policy.observe(
        RoundOutcome(drafter="ngram+mtp", drafted=12, accepted=1, verify_seconds=0.011, emitted=2)
    )
    assert policy.acceptance["mtp"].trials == []


def test_the_engine_offers_auto_each_head_alone_and_chained():
    target = HashModel()
    target.mtp_head = lambda: FakeHead(target)  # type: ignore[attr-defined]
    engine = Engine(target, costs=CostModel(dict(GPU_LIKE)))
    policy = engine.policy_for(GenerationRequest((1, 2, 3)))
    assert isinstance(policy, AdaptiveDraftPolicy)
    assert set(policy.drafters) == {"ngram", "mtp", "ngram+mtp"}
    assert isinstance(policy.drafters["ngram+mtp"], ChainedDrafter)
    # The head's confidence floor is the engine's, kept across generations.
    again = engine.policy_for(GenerationRequest((1, 2, 3)))
    assert isinstance(again, AdaptiveDraftPolicy)
    assert again.floors["mtp"] is policy.floors["mtp"]


class FakeBlockHead:
    """A block head (as DFlash's) over the fake head's guesser: one call drafts a block."""

    kind = "dflash"
    max_drafts = 7

    def __init__(self, target: HashModel) -> None:
        self.guesser = FakeHead(target).guesser
        self.blocks = 0

    def draft_block(self, evaluated: int, context: Sequence[int], drafts: int) -> HostRows:
        self.blocks += 1
        rows, chain = [], list(context)
        for _ in range(drafts):
            row = self.guesser.logits_for(chain)
            rows.append(row)
            chain.append(int(np.argmax(row)))
        return HostRows(np.stack(rows))

    def finish(self) -> None:
        pass


def test_a_block_head_costs_one_forward_a_round_and_drafts_no_more_than_its_block():
    target = HashModel()
    block = BlockDrafter(target, FakeBlockHead(target))
    costs = CostModel(dict(GPU_LIKE))
    assert draft_cost("dflash", block, costs) == DraftCost(0.0, BLOCK_PRIOR * costs.verify(1))
    costs.head_step_seconds["dflash"] = 0.002
    assert draft_cost("dflash", block, costs) == DraftCost(0.0, 0.002)
    policy = AdaptiveDraftPolicy(
        [NgramDrafter(), block], costs, acceptance={"dflash": AcceptanceEstimate(0.97)}
    )
    plan = policy.plan(chat_prompt(target, "fresh text"))
    # A forward per round, whatever it drafts: the whole block, and no more.
    assert plan.drafter is block and plan.draft_length == FakeBlockHead.max_drafts


def test_greedy_auto_with_a_block_head_writes_plain_decodings_tokens():
    target = HashModel()
    prompt = chat_prompt(target, "repeat after me " + REPEATED)
    plain = run_generation(target, prompt, FixedDraftPolicy(None, 0), SamplingParams())
    target = HashModel()
    ngram, head = NgramDrafter(), FakeBlockHead(target)
    block = BlockDrafter(target, head)
    costs = CostModel(dict(GPU_LIKE))
    costs.head_step_seconds["dflash"] = 0.0005
    policy = AdaptiveDraftPolicy(
        [ngram, block, ChainedDrafter(ngram, block)],
        costs,
        acceptance={"dflash": AcceptanceEstimate(0.97)},
    )
    record = run_generation(target, prompt, policy, SamplingParams())
    assert record.tokens == plain.tokens
    assert head.blocks > 0 and record.stats.drafted > 0
