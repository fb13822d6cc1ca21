"""Presence and frequency penalties inside the one loop, exact under speculation.

A token emitted c > 0 times so far in the reply has its logit lowered by
``presence + frequency * c``, in the target's rows and the draft's alike. Within a
round, the row that verifies draft i must see the counts after drafts 0..i-1. The
sampled check below writes replies of three tokens with two drafts per round, so a
reply whose drafts are both accepted comes from ONE verify whose rows 1 and 2 depend on
in-round counts (a rejection ends the round; the next one starts from committed
counts). Their joint is compared with the exact joint of penalised plain decoding,
computed here independently of the loop. The negative control is the joint without
in-round counts (every count is 0 at the start of the reply, so that is the
unpenalised joint): the same samples must fail there. Counting a round's tokens only
once the round is over fails the positive check too (tried by hand)."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.penalties import TokenCounts
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.support.fakes import HashModel, draft_model_for
from tests.support.model_files import DRAFT_KEY, TARGET_KEY

PROMPT_TEXT = "<|user|>hello<|assistant|>"
RUNS = 6000
FAILURE_PROBABILITY = 1e-6


# Letters "a".."d": the favoured tokens below, so replies repeat them often.
FAVOURED = [12, 13, 14, 15]


class FavouringModel(HashModel):
    """A HashModel whose mass sits mostly on four tokens: repeats are common, so the
    penalties change the reply's distribution a lot."""

    def logits_for(self, context):
        row = super().logits_for(context).copy()
        if np.isfinite(row[FAVOURED]).all():
            row[FAVOURED] += 6.0
        return row


def tv_bound(n: int, support: int) -> float:
    """TV(empirical, true) stays below this except with probability 1e-6 (see
    tests/speculation/test_sampling_lossless.py for the derivation)."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(math.log(1 / FAILURE_PROBABILITY) / (2 * n))


def penalised_by_hand(row: np.ndarray, output: list[int], presence: float, frequency: float):
    """OpenAI's rule written out, independently of TokenCounts."""
    row = row.astype(np.float64).copy()
    for token, count in collections.Counter(output).items():
        row[token] -= presence + frequency * count
    return row


def generate(target, draft, params, *, k=3, max_tokens=3, logprobs=None):
    drafter = ModelDrafter(draft) if draft is not None else None
    policy = FixedDraftPolicy(drafter, k if drafter is not None else 0)
    events = list(
        speculative_generate(
            target,
            target.tokenize(PROMPT_TEXT),
            policy,
            ReplySpec(params, max_tokens, logprobs=logprobs),
        )
    )
    return [t for e in events for t in e.tokens], events


def exact_joint(target: HashModel, params: SamplingParams, length: int) -> dict:
    """The exact joint of the first ``length`` tokens of penalised plain decoding."""
    prompt = target.tokenize(PROMPT_TEXT)
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(length):
        grown: dict[tuple[int, ...], float] = {}
        for prefix, mass in joint.items():
            row = penalised_by_hand(
                target.logits_for([*prompt, *prefix]),
                list(prefix),
                params.presence_penalty,
                params.frequency_penalty,
            )
            dist = distribution(row.astype(np.float32), params)
            for token, p in zip(dist.ids, dist.probs, strict=True):
                if p > 0:
                    grown[(*prefix, int(token))] = mass * float(p)
        joint = grown
    return joint


def distance(counts: collections.Counter, runs: int, joint: dict) -> float:
    support = set(joint) | set(counts)
    return 0.5 * sum(abs(counts[key] / runs - joint.get(key, 0.0)) for key in support)


# -- the counter ---------------------------------------------------------------------


def test_counts_lower_only_the_tokens_seen_by_presence_plus_frequency_times_count():
    row = np.array([1.0, 2.0, 3.0, -np.inf, 0.5], dtype=np.float32)
    counts = TokenCounts(presence=0.5, frequency=0.25)
    assert counts.apply(row) is row  # nothing seen yet: the row as it is
    counts.add([2, 2, 3, 0])
    penalised = counts.apply(row)
    assert penalised.tolist() == pytest.approx([0.25, 2.0, 2.0, -np.inf, 0.5])
    assert row.tolist() == pytest.approx([1.0, 2.0, 3.0, -np.inf, 0.5])  # untouched
    counts.remove([2, 0])
    assert counts.apply(row).tolist() == pytest.approx([1.0, 2.0, 2.25, -np.inf, 0.5])
    assert (counts.count(2), counts.count(0)) == (1, 0)


def test_negative_penalties_raise_repeated_tokens_and_zero_is_no_counter():
    counts = TokenCounts(presence=-1.0, frequency=-0.5)
    counts.add([1, 1])
    assert counts.apply(np.zeros(3, dtype=np.float32)).tolist() == [0.0, 2.0, 0.0]
    assert TokenCounts.for_penalties(0.0, 0.0) is None


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, float("nan")])
def test_penalties_outside_minus_two_to_two_are_refused_by_name(field: str, value: float):
    with pytest.raises(ValueError, match=field):
        SamplingParams(temperature=1.0, **{field: value})


# -- the loop: sampled ---------------------------------------------------------------

PENALTY_CASES = [
    pytest.param(2.0, 1.0, id="discourage-repeats"),
    pytest.param(-2.0, -1.0, id="encourage-repeats"),
]


@pytest.mark.parametrize(("presence", "frequency"), PENALTY_CASES)
def test_one_speculative_round_samples_the_penalised_targets_joint(
    presence: float, frequency: float
):
    target = FavouringModel(scale=1.0)
    draft = FavouringModel(name="favouring-draft", scale=1.0, noise_scale=1.0)
    params = SamplingParams(
        temperature=1.0, top_k=4, presence_penalty=presence, frequency_penalty=frequency
    )
    exact = exact_joint(target, params, 3)
    free = exact_joint(target, SamplingParams(temperature=1.0, top_k=4), 3)
    bound = tv_bound(RUNS, len(exact))
    # The penalties matter enough here for the negative control to mean something.
    assert distance(collections.Counter({k: v for k, v in free.items()}), 1, exact) > 3 * bound

    counts: collections.Counter = collections.Counter()
    one_round = drafted = accepted = 0
    for seed in range(RUNS):
        run_params = SamplingParams(
            temperature=1.0,
            top_k=4,
            presence_penalty=presence,
            frequency_penalty=frequency,
            seed=seed,
        )
        tokens, events = generate(target, draft, run_params)
        stats = events[-1].stats
        one_round += stats.rounds == 1
        drafted += stats.drafted
        accepted += stats.accepted
        counts[tuple(tokens[:3])] += 1
    # Many replies came whole from one round (both drafts accepted), where rows 1 and
    # 2 of the verify saw counts that only the round's own drafts had made.
    assert one_round > RUNS // 5
    assert 0 < accepted < drafted
    assert set(counts) <= set(exact)
    assert distance(counts, RUNS, exact) <= bound
    # Negative control: rows that ignore the counts of the round's own drafts.
    assert distance(counts, RUNS, free) > tv_bound(RUNS, len(free))


def test_the_draft_models_q_is_penalised_with_the_counts_after_its_own_drafts():
    target = HashModel()
    draft = draft_model_for(target, noise_scale=0.5)
    params = SamplingParams(temperature=1.0, presence_penalty=1.5, frequency_penalty=0.5)
    counts = TokenCounts(1.5, 0.5)
    reply = [40, 41, 40]
    counts.add(reply)
    context = [*target.tokenize(PROMPT_TEXT), *reply]
    proposal = ModelDrafter(draft).propose(
        context, 4, params, np.random.default_rng(3), penalties=counts
    )
    assert proposal.distributions is not None and len(proposal.tokens) == 4
    output = list(reply)
    for token, q in zip(proposal.tokens, proposal.distributions, strict=True):
        row = penalised_by_hand(
            draft.logits_for([*context, *output[len(reply) :]]), output, 1.5, 0.5
        )
        want = distribution(row.astype(np.float32), params)
        assert q.ids.tolist() == want.ids.tolist()
        assert q.probs == pytest.approx(want.probs, abs=1e-6)
        output.append(token)
    # The drafter takes its tentative drafts off the counts again.
    assert [counts.count(t) for t in (40, 41)] == [2, 1]
    assert sum(counts.count(t) for t in set(proposal.tokens) - {40, 41}) == 0


# -- the loop: greedy ----------------------------------------------------------------


def greedy_by_hand(target: HashModel, presence: float, frequency: float, length: int) -> list[int]:
    context = target.tokenize(PROMPT_TEXT)
    output: list[int] = []
    while len(output) < length:
        row = penalised_by_hand(target.logits_for(context), output, presence, frequency)
        token = int(np.argmax(row))
        if token == 0:  # EOS
            break
        output.append(token)
        context.append(token)
    return output


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize(("presence", "frequency"), PENALTY_CASES)
def test_greedy_speculation_with_penalties_writes_what_penalised_plain_decoding_does(
    k: int, presence: float, frequency: float
):
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    want = greedy_by_hand(HashModel(), presence, frequency, 40)
    plain, _ = generate(HashModel(), None, params, max_tokens=40)
    target = HashModel()
    speculative, events = generate(
        target, draft_model_for(target, noise_scale=0.3), params, k=k, max_tokens=40
    )
    assert plain == want
    assert speculative == want
    assert events[-1].stats.accepted > 0
    assert want != greedy_by_hand(HashModel(), 0.0, 0.0, 40)  # the penalties did something


def test_logprobs_under_penalties_are_of_the_penalised_row():
    params = SamplingParams(presence_penalty=2.0, frequency_penalty=1.0)
    target = HashModel()
    tokens, events = generate(
        target, draft_model_for(target), params, k=3, max_tokens=12, logprobs=2
    )
    context = HashModel().tokenize(PROMPT_TEXT)
    output: list[int] = []
    reported = [item for e in events for item in e.token_logprobs]
    for token, item in zip(tokens, reported, strict=True):
        row = penalised_by_hand(target.logits_for(context), output, 2.0, 1.0)
        log_softmax = row - (row.max() + math.log(np.exp(row - row.max()).sum()))
        assert item.logprob == pytest.approx(log_softmax[token], abs=1e-6)
        output.append(token)
        context.append(token)


# -- the real starter pair -----------------------------------------------------------


@pytest.mark.real_model
def test_greedy_speculation_with_penalties_equals_plain_on_the_real_pair():
    from tests.support.real_runtimes import load_model

    target = load_model("llamacpp", TARGET_KEY, exact_kernels=True)
    draft = load_model("llamacpp", DRAFT_KEY)
    engine = Engine(target, draft)
    try:
        prompt = tuple(
            engine.chat_prompt(
                [ChatMessage("user", "Write the word 'apple' twenty times, one per line.")]
            )
        )

        def run(drafter: str, presence: float, frequency: float) -> tuple[list[int], object]:
            request = GenerationRequest(
                prompt_tokens=prompt,
                params=SamplingParams(presence_penalty=presence, frequency_penalty=frequency),
                max_tokens=48,
                drafter=drafter,
                draft_tokens=2,
            )
            events = list(engine.generate(request))
            return [t for e in events for t in e.tokens], events[-1].stats

        free, _ = run("none", 0.0, 0.0)
        plain, _ = run("none", 0.5, 1.0)
        speculative, stats = run("model", 0.5, 1.0)
        assert plain != free  # the penalties changed the reply
        assert stats.drafted > 0 and stats.accepted > 0
        assert speculative == plain
    finally:
        engine.close()
