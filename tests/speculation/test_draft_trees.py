"""Several continuations verified in one batch (issue 55 part 4): the tree's layout, the
index's other continuations, and the loop verifying trees on a fake target that
computes each node's row from its own path only (tests/support/tree_model.py)."""

from __future__ import annotations

import math

from backends.sampling.filters import SamplingParams, distribution
from backends.speculation.controller import AdaptiveDraftPolicy
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.draft_tree import build_tree
from backends.speculation.history_index import HistoryIndex
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.tree_round import tree_room
from tests.speculation.held_costs import GPU_COSTS, HeldCosts
from tests.speculation.loop_helpers import GREEDY, PROMPTS, assert_invariants, plain
from tests.speculation.test_loop_exactness import (
    expected_first_two,
    tv_bound,
    tv_distance,
)
from tests.support.fake_runs import chat_prompt, run_generation
from tests.support.fakes import EOS
from tests.support.tree_model import TreeHashModel

PATTERN = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
# The calibrated costs of 2 CPU cores and the 1.5B starter target (DESIGN.md).
CPU_COSTS = {1: 0.034, 2: 0.063, 3: 0.089, 5: 0.142, 9: 0.270, 16: 0.364}


def tree_target() -> TreeHashModel:
    return TreeHashModel(window=2, eos_bias=-4.0)


def drafter_with(*streams: list[int]) -> NgramDrafter:
    """An n-gram drafter whose index holds ``streams`` (the last added is the likeliest
    of equally frequent continuations)."""
    index = HistoryIndex(10_000)
    for stream in streams:
        index.add(stream)
    return NgramDrafter(history=index)


def parted(tokens: list[int], at: int) -> list[int]:
    """``tokens`` up to ``at``, then a continuation the target would not write."""
    return [*tokens[:at], *((token + 1) % 60 + 4 for token in tokens[at:])]


def test_the_tree_merges_shared_openings_and_puts_the_best_branch_first() -> None:
    tree = build_tree([[1, 2, 3, 4], [1, 2, 7, 8], [5, 6]], max_nodes=16)
    assert tree is not None
    assert tree.tokens[:4] == (1, 2, 3, 4), "the best branch is the chain's batch"
    assert tree.parents == (-1, 0, 1, 2, 1, 4, -1, 6)
    assert tree.tokens[4:] == (7, 8, 5, 6)
    assert tree.branches[0] == frozenset({0, 1}) and tree.branches[5] == frozenset({1})
    assert tree.width == 3
    # A branch that adds nothing of its own is no tree; the node budget cuts the others.
    assert build_tree([[1, 2, 3], [1, 2]], max_nodes=16) is None
    assert build_tree([[1, 2, 3], [1, 5, 6]], max_nodes=4) == build_tree(
        [[1, 2, 3], [1, 5]], max_nodes=16
    )


def test_the_index_offers_where_earlier_continuations_part() -> None:
    older = [*PATTERN, 70, 71, 72, 73, 74]
    newer = [*PATTERN, 70, 71, 80, 81, 82]
    drafter = drafter_with(older, newer)
    drafter.begin([9, *PATTERN])
    proposal = drafter.propose([9, *PATTERN], 5, GREEDY, None)  # type: ignore[arg-type]
    assert proposal.tokens == [70, 71, 80, 81, 82], "equally frequent: the latest first"
    assert proposal.alternatives == ((70, 71, 72, 73, 74),)


def test_greedy_output_equals_plain_decoding_when_another_branch_wins() -> None:
    for prompt_text in PROMPTS:
        prompt = chat_prompt(tree_target(), prompt_text)
        baseline = run_generation(tree_target(), prompt, plain(), GREEDY, max_tokens=100)
        reply = baseline.tokens
        # The index's latest continuation parts from the reply after a shared opening.
        drafter = drafter_with([*prompt, *reply], [*prompt, *parted(reply, 3)])
        target = tree_target()
        policy = FixedDraftPolicy(drafter, 6, tree_nodes=8)
        record = run_generation(target, prompt, policy, GREEDY, max_tokens=100)
        assert record.tokens == reply and record.text == baseline.text
        assert_invariants(record, 6)
        stats = record.stats
        assert stats.tree_rounds > 0 and stats.other_branch_rounds > 0
        assert max(target.tree_batch_sizes) <= 1 + 6 + 8
        # Without the tree the best (wrong) continuation is refused where it parts.
        chain = run_generation(
            tree_target(), prompt, FixedDraftPolicy(drafter, 6), GREEDY, max_tokens=100
        )
        assert chain.tokens == reply and chain.stats.tree_rounds == 0
        assert stats.target_passes < chain.stats.target_passes


def test_a_target_without_trees_and_a_policy_without_room_verify_chains() -> None:
    prompt = chat_prompt(tree_target(), PROMPTS[0])
    reply = run_generation(tree_target(), prompt, plain(), GREEDY, max_tokens=60).tokens
    streams = ([*prompt, *reply], [*prompt, *parted(reply, 3)])
    no_room = tree_target()
    record = run_generation(
        no_room, prompt, FixedDraftPolicy(drafter_with(*streams), 6), GREEDY, max_tokens=60
    )
    assert record.tokens == reply and not no_room.tree_batch_sizes
    one_branch = TreeHashModel(window=2, eos_bias=-4.0, branches=1)
    policy = FixedDraftPolicy(drafter_with(*streams), 6, tree_nodes=8)
    record = run_generation(one_branch, prompt, policy, GREEDY, max_tokens=60)
    assert record.tokens == reply and not one_branch.tree_batch_sizes


def test_exact_batches_bound_the_whole_tree() -> None:
    prompt = chat_prompt(tree_target(), PROMPTS[1])
    reply = run_generation(tree_target(), prompt, plain(), GREEDY, max_tokens=80).tokens
    drafter = drafter_with([*prompt, *reply], [*prompt, *parted(reply, 2)])
    target = tree_target()
    policy = FixedDraftPolicy(drafter, 4, exact_batch_limit=7, tree_nodes=8)
    record = run_generation(target, prompt, policy, GREEDY, max_tokens=80)
    assert record.tokens == reply
    assert target.tree_batch_sizes and max(target.tree_batch_sizes) <= 7


def test_auto_makes_trees_only_where_a_larger_batch_is_cheap() -> None:
    assert tree_room(HeldCosts(dict(GPU_COSTS), None), 4, None) >= 4
    assert tree_room(HeldCosts(dict(GPU_COSTS), None), 4, 7) == 2
    assert tree_room(HeldCosts(dict(CPU_COSTS), None), 4, None) == 0
    prompt = chat_prompt(tree_target(), PROMPTS[1])
    reply = run_generation(tree_target(), prompt, plain(), GREEDY, max_tokens=120).tokens
    streams = ([*prompt, *reply], [*prompt, *parted(reply, 3)])
    for costs, makes_trees in ((GPU_COSTS, True), (CPU_COSTS, False)):
        policy = AdaptiveDraftPolicy([drafter_with(*streams)], HeldCosts(dict(costs), None))
        record = run_generation(tree_target(), prompt, policy, GREEDY, max_tokens=120)
        assert record.tokens == reply
        assert (record.stats.tree_rounds > 0) == makes_trees, costs


def test_sampled_tokens_follow_the_target_joint_distribution_with_a_tree() -> None:
    runs = 1000
    target = TreeHashModel(window=3)
    prompt = chat_prompt(target, "hi")
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = expected_first_two(target, prompt, params)
    assert EOS not in {token for pair in exact for token in pair}
    ranked = sorted(exact, key=exact.get)
    # The best branch starts with the second likeliest first token, the other branch
    # with the likeliest: both are verified in each round's one batch.
    second = max((pair for pair in exact if pair[0] == ranked[-2][0]), key=exact.get)
    first = max((pair for pair in exact if pair[0] == ranked[-1][0]), key=exact.get)
    assert first[0] != second[0]
    drafter = drafter_with([*prompt, *first, 40], [*prompt, *second, 41])
    drafter.begin(prompt)
    proposal = drafter.propose(prompt, 2, params, None)  # type: ignore[arg-type]
    assert proposal.tokens == list(second) and proposal.alternatives == (first,)
    bound = tv_bound(runs, len(exact))
    # Negative control: a walk that always took a branch would not be the target's.
    assert tv_distance({second: 0.5, first: 0.5}, exact) > 2 * bound
    counts: dict[tuple[int, int], int] = {}
    from_draft = 0
    policy = FixedDraftPolicy(drafter, 2, tree_nodes=4)
    for seed in range(runs):
        seeded = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        record = run_generation(target, prompt, policy, seeded, max_tokens=3)
        assert record.stats.tree_rounds >= 1
        key = (record.tokens[0], record.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        from_draft += record.from_draft[0]
    sampled = {key: count / runs for key, count in counts.items()}
    assert tv_distance(sampled, exact) <= bound
    # The first token comes from a branch whenever the target draws either one.
    p = distribution(target.logits_for(prompt), params)
    either = p.prob_of(first[0]) + p.prob_of(second[0])
    assert abs(from_draft / runs - either) <= math.sqrt(math.log(1e6) / (2 * runs))
