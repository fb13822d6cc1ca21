"""The n-gram drafter drafting from earlier sessions' streams (issue 55): which source
it takes, and that the output never changes (greedy and sampled)."""

from __future__ import annotations

import math

import numpy as np

from backends.sampling.filters import SamplingParams, distribution
from backends.speculation.controller import AdaptiveDraftPolicy
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.history_index import HistoryIndex
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.text_lookup import TextLookup, escaped
from tests.speculation.held_costs import GPU_COSTS, HeldCosts
from tests.speculation.loop_helpers import GREEDY, PROMPTS, new_target, plain
from tests.speculation.test_loop_exactness import (
    expected_first_two,
    sampled_first_two,
    tv_bound,
    tv_distance,
)
from tests.speculation.test_text_lookup import CAT_N, FILE, ByteVocab, write_call
from tests.support.fake_runs import chat_prompt, run_generation
from tests.support.fakes import EOS

PATTERN = list(range(300, 310))


def drafter_with(*streams: list[int]) -> NgramDrafter:
    index = HistoryIndex(10_000)
    for stream in streams:
        index.add(stream)
    return NgramDrafter(history=index)


def test_the_index_drafts_where_the_prompt_has_no_match() -> None:
    drafter = drafter_with([1, 2, *PATTERN, 70, 71, 72, 73, 74, 75])
    context = [9, 9, *PATTERN]
    drafter.begin(context)
    tokens, size = drafter.lookup(context, 4)
    assert tokens == [70, 71, 72, 73]
    assert size == len(PATTERN) and drafter.last_match_key == "ngram:index:8"


def test_the_deeper_match_wins_and_the_prompt_wins_a_tie() -> None:
    context = [9, *PATTERN, 50, 51, 52, 53, 9, *PATTERN]  # 11 tokens match in the prompt
    shallower = drafter_with([*PATTERN, 70, 71, 72, 73])  # 10 in the index
    shallower.begin(context)
    assert shallower.lookup(context, 4)[0] == [50, 51, 52, 53]
    assert shallower.last_match_key == "ngram:8"
    deeper = drafter_with([53, 9, *PATTERN, 70, 71, 72, 73])  # 12 in the index
    deeper.begin(context)
    assert deeper.lookup(context, 4)[0] == [70, 71, 72, 73]
    assert deeper.last_match_key == "ngram:index:8"


def test_inside_a_tool_calls_json_the_text_lookup_still_comes_first() -> None:
    vocab = ByteVocab()
    reply = vocab.tokenize(write_call(escaped(FILE[:40]).decode()))
    index = HistoryIndex(10_000)
    index.add([*reply, *vocab.tokenize("SOMETHING ELSE ENTIRELY")])
    drafter = NgramDrafter(text=TextLookup(vocab.token_bytes, vocab.tokenize), history=index)
    prompt = vocab.tokenize(CAT_N)
    drafter.begin(prompt)
    tokens, _ = drafter.lookup(prompt + reply, 8)
    assert drafter.last_match_key == "ngram:text"
    assert vocab.text(tokens) == escaped(FILE).decode()[len(escaped(FILE[:40])) :][:8]
    without_text = NgramDrafter(history=index)
    without_text.begin(prompt)
    assert vocab.text(without_text.lookup(prompt + reply, 8)[0]) == "SOMETHIN"


def test_greedy_output_equals_plain_decoding_with_the_index_drafting() -> None:
    for prompt_text in PROMPTS:
        prompt = chat_prompt(new_target(), prompt_text)
        baseline = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=120)
        alone = run_generation(
            new_target(), prompt, FixedDraftPolicy(NgramDrafter(), 4), GREEDY, max_tokens=120
        )
        drafter = drafter_with([*prompt, *baseline.tokens])
        record = run_generation(
            new_target(), prompt, FixedDraftPolicy(drafter, 4), GREEDY, max_tokens=120
        )
        assert record.tokens == baseline.tokens and record.text == baseline.text
        assert record.stats.accepted > alone.stats.accepted
        assert sum(record.from_draft) >= 0.7 * len(record.tokens)


def test_another_users_text_in_the_index_never_changes_the_output() -> None:
    prompt = chat_prompt(new_target(), PROMPTS[0])
    baseline = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=100)
    rng = np.random.default_rng(5)
    strangers = [[*prompt, *rng.integers(6, 64, size=100).tolist()] for _ in range(5)]
    drafter = drafter_with(*strangers)
    record = run_generation(
        new_target(), prompt, FixedDraftPolicy(drafter, 6), GREEDY, max_tokens=100
    )
    assert record.tokens == baseline.tokens
    assert record.stats.drafted > record.stats.accepted, "its drafts were tried and refused"


def test_auto_keeps_its_own_acceptance_for_index_drafts() -> None:
    prompt = chat_prompt(new_target(), PROMPTS[1])
    baseline = run_generation(new_target(), prompt, plain(), GREEDY, max_tokens=120)
    drafter = drafter_with([*prompt, *baseline.tokens])
    policy = AdaptiveDraftPolicy([drafter], HeldCosts(dict(GPU_COSTS), None))
    record = run_generation(new_target(), prompt, policy, GREEDY, max_tokens=120)
    assert record.tokens == baseline.tokens
    learned = {key: value for key, value in policy.acceptance.items() if "index" in key}
    assert learned and any(estimate.trials for estimate in learned.values())
    assert sum(record.from_draft) >= 0.7 * len(record.tokens)


def test_sampled_tokens_follow_the_target_joint_distribution_with_index_drafts() -> None:
    runs = 1000
    target = new_target(window=3)
    prompt = chat_prompt(target, "hi")
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = expected_first_two(target, prompt, params)
    assert EOS not in {token for pair in exact for token in pair}
    # The index holds a reply whose first token the target thinks second likeliest.
    second_likeliest, _ = sorted(exact, key=exact.get)[-2]
    best_next = max((pair for pair in exact if pair[0] == second_likeliest), key=exact.get)
    drafter = drafter_with([*prompt, *best_next, 40, 41])
    drafter.begin(prompt)
    assert drafter.lookup(prompt, 2)[0] == list(best_next), "the index drafts the pair"
    bound = tv_bound(runs, len(exact))
    assert tv_distance({best_next: 1.0}, exact) > 2 * bound, "accepting every draft would fail"
    sampled, first_accepted = sampled_first_two(target, prompt, drafter, params, runs)
    assert tv_distance(sampled, exact) <= bound
    acceptance = distribution(target.logits_for(prompt), params).prob_of(best_next[0])
    assert abs(first_accepted - acceptance) <= math.sqrt(math.log(1e6) / (2 * runs))
