"""Drafters: the n-gram index, prompt lookup, predicted outputs, and the draft model."""

from __future__ import annotations

import numpy as np
import pytest

from backends.sampling.filters import SamplingParams, distribution, greedy_token
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter, NgramIndex
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.token_prefix import common_prefix_length
from tests.support.fake_runs import chat_prompt
from tests.support.fakes import EOS, HashModel, draft_model_for

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def brute_force_continuation(
    tokens: list[int], sizes: tuple[int, ...], max_tokens: int
) -> tuple[list[int], int]:
    """Longest suffix n-gram's latest earlier occurrence (with a token after it)."""
    for size in sorted(set(sizes), reverse=True):
        if len(tokens) < size + 1:
            continue
        suffix = tokens[-size:]
        for end in range(len(tokens) - 2, size - 2, -1):
            if tokens[end + 1 - size : end + 1] == suffix:
                return tokens[end + 1 : end + 1 + max_tokens], size
    return [], 0


# -- n-grams ----------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(4, 3, 2), (2, 1), (8, 5, 3, 1), (3,)])
def test_ngram_index_grown_incrementally_equals_one_rebuilt_from_scratch(
    sizes: tuple[int, ...],
) -> None:
    rng = np.random.default_rng(sum(sizes))
    for _ in range(20):
        alphabet = int(rng.integers(2, 6))
        tokens = [int(t) for t in rng.integers(0, alphabet, size=int(rng.integers(0, 5)))]
        incremental = NgramIndex(sizes)
        incremental.reset(tokens)
        for _ in range(60):
            action = rng.random()
            if action < 0.8:  # the loop's case: the context grows
                tokens.extend(int(t) for t in rng.integers(0, alphabet, size=rng.integers(1, 7)))
            elif action < 0.9:  # shorter: a new, shorter context
                del tokens[int(rng.integers(0, len(tokens) + 1)) :]
            elif tokens:  # the last few tokens replaced
                start = max(0, len(tokens) - int(rng.integers(1, 8)))
                tokens[start:] = [int(t) for t in rng.integers(0, alphabet, len(tokens) - start)]
            incremental.sync(tokens)
            rebuilt = NgramIndex(sizes)
            rebuilt.reset(tokens)
            for max_tokens in (1, 3, 10):
                expected = brute_force_continuation(tokens, sizes, max_tokens)
                assert incremental.continuation(max_tokens) == expected
                assert rebuilt.continuation(max_tokens) == expected


def test_ngram_drafter_proposes_the_continuation_of_the_latest_earlier_match() -> None:
    drafter = NgramDrafter(sizes=(4, 3, 2))
    context = [1, 2, 3, 9, 1, 2, 3, 7, 5, 5, 1, 2, 3]
    drafter.begin(context[:4])
    proposal = drafter.propose(context, 3, GREEDY, RNG)
    assert proposal.tokens == [7, 5, 5]  # after the second "1 2 3", not the first
    assert proposal.distributions is None and drafter.last_match_size == 3


def test_ngram_drafter_prefers_the_longest_matching_suffix() -> None:
    drafter = NgramDrafter(sizes=(4, 3, 2))
    context = [5, 1, 2, 3, 9, 6, 2, 3, 8, 5, 1, 2, 3]
    drafter.begin(context)
    proposal = drafter.propose(context, 2, GREEDY, RNG)
    assert proposal.tokens == [9, 6]  # the 4-gram "5 1 2 3", though "2 3" is more recent
    assert drafter.last_match_size == 4


def test_ngram_drafter_proposes_nothing_below_its_minimum_match() -> None:
    drafter = NgramDrafter(sizes=(3, 2, 1), min_match=2)
    context = [1, 2, 3, 4, 5, 3]
    drafter.begin(context)
    assert drafter.propose(context, 4, GREEDY, RNG).tokens == []
    assert drafter.last_match_size == 1
    assert drafter.propose([1, 2, 3, 4], 4, GREEDY, RNG).tokens == []
    assert drafter.propose([1, 2, 1, 2], 0, GREEDY, RNG).tokens == []


def test_ngram_drafter_follows_a_context_that_grows_between_rounds() -> None:
    drafter = NgramDrafter(sizes=(2,))
    context = [1, 2, 3]
    drafter.begin(context)
    assert drafter.propose(context, 2, GREEDY, RNG).tokens == []
    context += [4, 1, 2]
    assert drafter.propose(context, 2, GREEDY, RNG).tokens == [3, 4]
    context += [5, 4, 1]
    assert drafter.propose(context, 5, GREEDY, RNG).tokens == [2, 5, 4, 1]


# -- predictions ----------------------------------------------------------------------------

PROMPT = [90, 91, 92]
PREDICTION = list(range(10, 30))


def started(prediction: list[int] = PREDICTION) -> PredictionDrafter:
    drafter = PredictionDrafter(prediction)
    drafter.begin(PROMPT)
    return drafter


def test_prediction_drafter_follows_the_prediction_while_the_output_agrees() -> None:
    drafter = started()
    assert drafter.propose(PROMPT, 4, GREEDY, RNG).tokens == [10, 11, 12, 13]
    output = [10, 11, 12]  # two drafts accepted, the third rejected but the same token
    assert drafter.propose(PROMPT + output, 4, GREEDY, RNG).tokens == [13, 14, 15, 16]
    output += [13, 14, 15, 16, 17]
    assert drafter.propose(PROMPT + output, 3, GREEDY, RNG).tokens == [18, 19, 20]


def test_prediction_drafter_recovers_after_a_substitution() -> None:
    drafter = started()
    drafter.propose(PROMPT, 4, GREEDY, RNG)
    output = [10, 11, 12, 13, 99]  # 14 was predicted; 99 is nowhere in the prediction
    assert drafter.propose(PROMPT + output, 4, GREEDY, RNG).tokens == []
    output += [15]  # back on track
    assert drafter.propose(PROMPT + output, 4, GREEDY, RNG).tokens == [16, 17, 18, 19]


def test_prediction_drafter_recovers_after_an_insertion_and_a_deletion() -> None:
    drafter = started()
    drafter.propose(PROMPT, 4, GREEDY, RNG)
    output = [10, 11, 12, 13, 98, 99, 14, 15]  # two extra tokens, then the prediction
    assert drafter.propose(PROMPT + output, 3, GREEDY, RNG).tokens == [16, 17, 18]
    output += [16, 18, 19]  # 17 skipped
    assert drafter.propose(PROMPT + output, 3, GREEDY, RNG).tokens == [20, 21, 22]


def test_prediction_drafter_resumes_at_the_next_copy_of_a_repeated_stretch() -> None:
    prediction = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 6]
    drafter = started(prediction)
    assert drafter.propose(PROMPT, 4, GREEDY, RNG).tokens == [1, 2, 3, 4]
    output = [1, 2, 3, 4, 9, 2, 3]  # diverged at the second "1", then "2 3"
    assert drafter.propose(PROMPT + output, 2, GREEDY, RNG).tokens == [5, 1]


def test_prediction_drafter_proposes_nothing_past_the_end_of_the_prediction() -> None:
    drafter = started([10, 11, 12])
    assert drafter.propose(PROMPT, 8, GREEDY, RNG).tokens == [10, 11, 12]
    assert drafter.propose([*PROMPT, 10, 11, 12], 8, GREEDY, RNG).tokens == []
    assert started([]).propose(PROMPT, 8, GREEDY, RNG).tokens == []


def test_prediction_drafter_starts_over_for_each_generation() -> None:
    drafter = started()
    drafter.propose([*PROMPT, 10, 11, 12, 13], 4, GREEDY, RNG)
    drafter.begin([7, 7])
    assert drafter.propose([7, 7], 2, GREEDY, RNG).tokens == [10, 11]


# -- the draft model ---------------------------------------------------------------------


def greedy_continuation(model: HashModel, context: list[int], count: int) -> list[int]:
    tokens: list[int] = []
    for _ in range(count):
        token = greedy_token(model.logits_for([*context, *tokens]))
        tokens.append(token)
        if token == EOS:
            break
    return tokens


def test_model_drafter_proposes_the_draft_models_greedy_continuation() -> None:
    draft = draft_model_for(HashModel(eos_bias=-np.inf))
    drafter = ModelDrafter(draft)
    context = chat_prompt(draft, "the cat")
    proposal = drafter.propose(context, 5, GREEDY, RNG)
    assert proposal.tokens == greedy_continuation(draft, context, 5)
    assert proposal.distributions is None
    assert proposal.passes == draft.forward_calls == 5
    # The last draft token is not evaluated yet: the cache holds context + drafts[:-1].
    assert list(draft.cached_tokens) == [*context, *proposal.tokens[:-1]]


def test_model_drafter_trims_its_cache_to_the_committed_context() -> None:
    draft = draft_model_for(HashModel(eos_bias=-np.inf))
    drafter = ModelDrafter(draft)
    context = chat_prompt(draft, "the cat")
    first = drafter.propose(context, 4, GREEDY, RNG)
    # The target accepted one draft, then chose a different token.
    committed = [*context, first.tokens[0], 20 if first.tokens[1] != 20 else 21]
    calls_before = draft.forward_calls
    second = drafter.propose(committed, 3, GREEDY, RNG)
    assert second.tokens == greedy_continuation(draft, committed, 3)
    assert list(draft.cached_tokens) == [*committed, *second.tokens[:-1]]
    # Only the one new committed token was evaluated before drafting.
    assert draft.forward_batch_sizes[calls_before] == 1


def test_model_drafter_stops_at_end_of_generation() -> None:
    target = HashModel(eos_bias=50.0)  # EOS always wins
    drafter = ModelDrafter(draft_model_for(target, noise_scale=0.1))
    assert drafter.propose([1, 20, 21], 6, GREEDY, RNG).tokens == [EOS]


def greedy_confidence(model: HashModel, context: list[int]) -> float:
    row = model.logits_for(context).astype(np.float64)
    return float(1.0 / np.exp(row - row.max()).sum())


def test_model_drafter_stops_where_it_is_less_confident_than_its_floor() -> None:
    draft = draft_model_for(HashModel(eos_bias=-np.inf))
    context = chat_prompt(draft, "is this")
    unbounded = ModelDrafter(draft).propose(context, 8, GREEDY, RNG).tokens
    floor = 0.2
    confident = ModelDrafter(draft, min_confidence=floor).propose(context, 8, GREEDY, RNG)
    expected = unbounded[:1]  # the first token is always proposed
    for index in range(1, len(unbounded)):
        if greedy_confidence(draft, [*context, *unbounded[:index]]) < floor:
            break
        expected.append(unbounded[index])
    assert confident.tokens == expected
    assert 1 < len(expected) < 8, "the floor cut the draft short, but not at once"


def test_model_drafter_samples_each_token_from_the_distribution_it_reports() -> None:
    draft = draft_model_for(HashModel(eos_bias=-np.inf))
    drafter = ModelDrafter(draft)
    context = chat_prompt(draft, "the cat")
    params = SamplingParams(temperature=0.8, top_p=0.9)
    proposal = drafter.propose(context, 6, params, np.random.default_rng(3))
    assert proposal.distributions is not None
    assert len(proposal.distributions) == len(proposal.tokens) == 6
    for index, (token, q) in enumerate(zip(proposal.tokens, proposal.distributions, strict=True)):
        expected = distribution(draft.logits_for([*context, *proposal.tokens[:index]]), params)
        np.testing.assert_array_equal(q.ids, expected.ids)
        np.testing.assert_allclose(q.probs, expected.probs)
        assert q.prob_of(token) > 0
        assert proposal.top_probs[index] == q.top_prob


def test_model_drafter_proposes_nothing_when_asked_for_nothing() -> None:
    drafter = ModelDrafter(draft_model_for(HashModel()))
    assert drafter.propose([1, 20], 0, GREEDY, RNG).tokens == []
    assert drafter.propose([], 4, GREEDY, RNG).tokens == []
    assert drafter.model.forward_calls == 0


def test_common_prefix_length_counts_equal_leading_tokens() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_length([1, 2, 3], [1, 2]) == 2
    assert common_prefix_length((1, 2, 3), [1, 5, 3]) == 1
    assert common_prefix_length([], [1]) == 0


class ClockedModel(HashModel):
    """A model on a fake clock: evaluating n tokens takes n seconds."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def forward(self, tokens, *, last_only: bool = False):  # type: ignore[no-untyped-def]
        self.clock[0] += len(tokens)
        return super().forward(tokens, last_only=last_only)


def test_a_draft_step_is_timed_without_the_catch_up_on_unseen_context(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("backends.speculation.model_drafter.time.perf_counter", lambda: clock[0])
    drafter = ModelDrafter(ClockedModel(clock))
    context = list(range(1, 21))
    rng = np.random.default_rng(0)
    # The first proposal feeds the draft 20 unseen tokens (20 s here), then steps (1 s each).
    first = drafter.propose(context, 4, SamplingParams(temperature=0.0), rng)
    assert first.passes == len(first.tokens) > 1
    assert first.step_seconds == pytest.approx(1.0)
    # Caught up, a proposal's first forward is a one-token step too.
    context += first.tokens[:1]
    second = drafter.propose(context, 1, SamplingParams(temperature=0.0), rng)
    assert second.passes == 1 and second.step_seconds == pytest.approx(1.0)
