"""The one loop under a grammar: masks on p and q alike keep speculation exact.

Constrained speculative decoding must be distributed exactly as constrained plain
decoding (the target's p masked by the grammar, renormalised), and greedy constrained
speculation must write what greedy constrained plain decoding writes. Tokens the
grammar forces are verified as free drafts and counted apart.
"""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.output.constraints import GrammarSpec, GrammarVocabulary
from backends.output.output_constraints import ConstraintSpec, JsonOutput
from backends.sampling.filters import SamplingParams, distribution
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.prediction_drafter import PredictionDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.support.fakes import HashModel, draft_model_for
from tests.support.model_files import DRAFT_KEY, TARGET_KEY

# Words of the fake vocabulary, in any tokenisation the grammar allows.
GRAMMAR = GrammarSpec("regex", "(the|an|re|at|on)(ing|ed|er|es)+")
RUNS = 4000
FAILURE_PROBABILITY = 1e-6


def generate(target, draft, constraint, params, *, k=3, max_tokens=8):
    drafter = ModelDrafter(draft) if draft is not None else None
    policy = FixedDraftPolicy(drafter, k if drafter is not None else 0)
    events = list(
        speculative_generate(
            target,
            target.tokenize("<|user|>hello<|assistant|>"),
            policy,
            ReplySpec(params, max_tokens, constraint=constraint),
        )
    )
    return [t for e in events for t in e.tokens], events[-1].stats


def exact_first_two(target: HashModel, vocabulary: GrammarVocabulary, params) -> dict:
    """The constrained target's exact joint distribution of the first two tokens."""
    prompt = target.tokenize("<|user|>hello<|assistant|>")
    state = vocabulary.compile(GRAMMAR).start()
    joint = {}
    first_ids, first_probs = _masked_distribution(
        target.logits_for(prompt), state.allowed(), params
    )
    for token, p_first in zip(first_ids, first_probs, strict=True):
        state.consume([int(token)])
        second_ids, second_probs = _masked_distribution(
            target.logits_for([*prompt, int(token)]), state.allowed(), params
        )
        for other, p_second in zip(second_ids, second_probs, strict=True):
            joint[(int(token), int(other))] = float(p_first * p_second)
        state.rollback(1)
    return joint


def _masked_distribution(row, allowed, params):
    """The distribution of a masked row, as (token, probability) pairs with p > 0."""
    dist = distribution(np.where(allowed, row, -np.inf).astype(np.float32), params)
    keep = dist.probs > 0
    return dist.ids[keep], dist.probs[keep]


def tv_bound(n: int, support: int) -> float:
    """TV(empirical, true) stays below this except with probability 1e-6."""
    return 0.5 * math.sqrt(support / n) + math.sqrt(math.log(1 / FAILURE_PROBABILITY) / (2 * n))


@pytest.fixture(scope="module")
def vocabulary() -> GrammarVocabulary:
    return GrammarVocabulary(HashModel())


def test_constrained_speculation_samples_the_constrained_targets_joint(vocabulary):
    target = HashModel(scale=1.5)
    draft = draft_model_for(target, noise_scale=1.5)
    params = SamplingParams(temperature=1.0)
    exact = exact_first_two(target, vocabulary, params)
    counts: collections.Counter = collections.Counter()
    for seed in range(RUNS):
        tokens, _ = generate(
            target,
            draft,
            vocabulary.compile(GRAMMAR).start(),
            SamplingParams(temperature=1.0, seed=seed),
            max_tokens=2,
        )
        counts[tuple(tokens[:2])] += 1
    support = set(exact) | set(counts)
    observed = {pair: counts[pair] / RUNS for pair in support}
    distance = 0.5 * sum(abs(observed[pair] - exact.get(pair, 0.0)) for pair in support)
    assert set(counts) <= set(exact), "a token outside the grammar was emitted"
    assert distance <= tv_bound(RUNS, len(exact))

    # The negative control: the same samples against the unconstrained target's joint
    # fail the same check, so the check can tell the mask's effect.
    prompt = target.tokenize("<|user|>hello<|assistant|>")
    free_first = distribution(target.logits_for(prompt), params)
    free = {}
    for token, p_first in zip(free_first.ids, free_first.probs, strict=True):
        second = distribution(target.logits_for([*prompt, int(token)]), params)
        for other, p_second in zip(second.ids, second.probs, strict=True):
            free[(int(token), int(other))] = float(p_first * p_second)
    support = set(free) | set(counts)
    distance_free = 0.5 * sum(abs(counts[pair] / RUNS - free.get(pair, 0.0)) for pair in support)
    assert distance_free > tv_bound(RUNS, len(free))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_constrained_speculation_writes_what_constrained_plain_decoding_does(vocabulary, k):
    target = HashModel()
    draft = draft_model_for(target, noise_scale=1.0)
    params = SamplingParams(temperature=0.0)
    plain, _ = generate(target, None, vocabulary.compile(GRAMMAR).start(), params, max_tokens=24)
    fresh = HashModel()
    speculative, stats = generate(
        fresh, draft, vocabulary.compile(GRAMMAR).start(), params, k=k, max_tokens=24
    )
    assert speculative == plain
    assert stats.drafted > 0
    text = b"".join(target.token_bytes(token) for token in plain).decode()
    assert text[:2] in ("th", "an", "re", "at", "on")


def test_ngram_drafts_are_cut_where_the_grammar_refuses_them(vocabulary):
    target = HashModel()
    params = SamplingParams(temperature=0.0)
    plain, _ = generate(target, None, vocabulary.compile(GRAMMAR).start(), params, max_tokens=20)
    events = list(
        speculative_generate(
            HashModel(),
            target.tokenize("<|user|>hello<|assistant|>"),
            FixedDraftPolicy(NgramDrafter(), 6),
            ReplySpec(params, 20, constraint=vocabulary.compile(GRAMMAR).start()),
        )
    )
    assert [t for e in events for t in e.tokens] == plain


def test_forced_tokens_are_free_drafts_counted_apart(vocabulary):
    grammar = GrammarSpec("regex", "theingedering(on|at)")
    target = HashModel()
    tokens, stats = generate(
        target, None, vocabulary.compile(grammar).start(), SamplingParams(), max_tokens=30
    )
    text = b"".join(target.token_bytes(token) for token in tokens).decode()
    assert text.startswith("theingedering")
    assert stats.grammar_forced >= 4  # the fixed stretch came as grammar drafts
    assert stats.drafted == 0  # no drafter guessed: forced tokens are not guesses
    assert stats.target_passes < len(tokens)


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("runtime", "presence_penalty"),
    # MLX once, with a penalty too: on a CPU its runs take minutes each.
    [("llamacpp", 0.0), ("mlx", 0.6)],
    ids=["llamacpp", "mlx-penalised"],
)
def test_a_json_schema_reply_on_the_real_pair_validates_and_speculation_changes_nothing(
    runtime: str, presence_penalty: float
):
    """Both runtimes: the grammar's mask reaches p and q alike (and penalties too)."""
    import jsonschema

    from tests.support.real_runtimes import load_model

    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "language": {"enum": ["python", "rust", "go"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "stars": {"type": "integer", "minimum": 0},
        },
        "required": ["name", "language", "tags", "stars"],
        "additionalProperties": False,
    }
    if runtime == "mlx":
        # MLX computes ~2 s a token on this CPU: a reply of about a dozen tokens, still
        # with forced stretches, free choices and an enum for the penalty to weigh.
        schema["properties"] = {key: schema["properties"][key] for key in ("language", "stars")}
        schema["properties"]["stars"] = {"type": "integer", "minimum": 0, "maximum": 999}
        schema["required"] = ["language", "stars"]
    # Exact kernels (exact_output): verify batches of K + 1 = 5 round like one-token
    # decoding, so the greedy replies must match bit for bit; llama.cpp's fastest kernels
    # may flip a near-tie (docs/speculation.md). MLX has no kernel choice to make.
    target = load_model(runtime, TARGET_KEY, exact_kernels=True)
    draft = load_model(runtime, DRAFT_KEY)
    engine = Engine(target, draft)
    try:
        if runtime == "mlx":
            # A raw prompt of a few tokens: MLX reads a prompt at its decoding rate here,
            # and the chat template's is ~40 tokens, read once a drafter.
            prompt = tuple(engine.text_prompt("The requests library as JSON:"))
        else:
            prompt = tuple(
                engine.chat_prompt(
                    [
                        _message(
                            "Describe the requests library as JSON: name, language, tags, stars."
                        )
                    ]
                )
            )
        constraint = ConstraintSpec(text=JsonOutput(schema, strict=True))
        replies = {}
        for drafter in ("none", "model"):
            request = GenerationRequest(
                prompt_tokens=prompt,
                max_tokens=120,
                drafter=drafter,
                draft_tokens=4,
                constraint=constraint,
                params=SamplingParams(presence_penalty=presence_penalty),
            )
            events = list(engine.generate(request))
            replies[drafter] = ("".join(e.text for e in events), events[-1].stats)
        text, stats = replies["model"]
        jsonschema.validate(json.loads(text), schema)
        assert stats.grammar_forced > 0
        # Greedy under exact kernels: identical output, checked whole.
        assert replies["none"][0] == text
    finally:
        engine.close()


def _message(text: str):
    from backends.base import ChatMessage

    return ChatMessage("user", text)


# -- forced stretches and drafter guesses in one verify ---------------------------------

# Fixed stretches (" qxz ") between free choices: rounds draft the forced tokens and
# let the draft model go on after them.
STRETCHES = GrammarSpec(
    "regex", "(the|an|re)(ing|ed|er) qxz (on|at|re)(ing|ed|es) qxz (the|an)(ing|ed)"
)


def run_events(target, draft, constraint, params, *, k, max_tokens):
    policy = FixedDraftPolicy(ModelDrafter(draft) if draft is not None else None, k)
    return list(
        speculative_generate(
            target,
            target.tokenize("<|user|>hello<|assistant|>"),
            policy,
            ReplySpec(params, max_tokens, constraint=constraint),
        )
    )


@pytest.mark.parametrize("k", [1, 3, 6])
def test_forced_tokens_and_model_drafts_share_a_verify_and_change_nothing(vocabulary, k):
    params = SamplingParams(temperature=0.0)
    plain, _ = generate(
        HashModel(), None, vocabulary.compile(STRETCHES).start(), params, max_tokens=40
    )
    target = HashModel()
    events = run_events(
        target,
        draft_model_for(target, noise_scale=1.0),
        vocabulary.compile(STRETCHES).start(),
        params,
        k=k,
        max_tokens=40,
    )
    tokens = [t for e in events for t in e.tokens]
    assert tokens == plain
    assert b"".join(target.token_bytes(t) for t in tokens).count(b" qxz ") == 2
    # Some rounds verified forced tokens and the model's guesses after them together.
    assert any(event.drafter == "grammar+model" for event in events)
    stats = events[-1].stats
    assert stats.grammar_forced > 0 and stats.drafted > 0
    assert stats.target_passes < len(tokens)


def exact_next_two(target, vocabulary, grammar, prefix, params) -> dict:
    """The constrained target's exact joint of the two tokens after ``prefix``."""
    prompt = target.tokenize("<|user|>hello<|assistant|>")
    state = vocabulary.compile(grammar).start()
    state.consume(prefix)
    joint = {}
    context = [*prompt, *prefix]
    first_ids, first_probs = _masked_distribution(
        target.logits_for(context), state.allowed(), params
    )
    for token, p_first in zip(first_ids, first_probs, strict=True):
        state.consume([int(token)])
        second_ids, second_probs = _masked_distribution(
            target.logits_for([*context, int(token)]), state.allowed(), params
        )
        for other, p_second in zip(second_ids, second_probs, strict=True):
            joint[(int(token), int(other))] = float(p_first * p_second)
        state.rollback(1)
    return joint


def test_a_verify_of_a_forced_token_then_model_drafts_samples_the_constrained_joint(vocabulary):
    # "q" is forced; the draft model guesses the next token in the same verify, and the
    # bonus follows: one round writes all three tokens.
    grammar = GrammarSpec("regex", "q(the|an|re|at|on)(ing|ed|er|es)")
    target = HashModel(scale=1.5)
    draft = draft_model_for(target, noise_scale=1.5)
    params = SamplingParams(temperature=1.0)
    forced = vocabulary.compile(grammar).start().forced()
    assert len(forced) == 1
    exact = exact_next_two(target, vocabulary, grammar, forced, params)
    counts: collections.Counter = collections.Counter()
    combined = 0
    for seed in range(RUNS):
        events = run_events(
            target,
            draft,
            vocabulary.compile(grammar).start(),
            SamplingParams(temperature=1.0, seed=seed),
            k=3,
            max_tokens=3,
        )
        tokens = [t for e in events for t in e.tokens]
        assert tokens[0] == forced[0]
        combined += events[0].drafter == "grammar+model"
        counts[tuple(tokens[1:3])] += 1
    assert combined == RUNS  # every first round verified "q" and a model draft together
    support = set(exact) | set(counts)
    distance = 0.5 * sum(abs(counts[pair] / RUNS - exact.get(pair, 0.0)) for pair in support)
    assert set(counts) <= set(exact), "a token outside the grammar was emitted"
    assert distance <= tv_bound(RUNS, len(exact))

    # Negative control: the unconstrained target's joint after "q" fails the same check.
    context = [*target.tokenize("<|user|>hello<|assistant|>"), *forced]
    free_first = distribution(target.logits_for(context), params)
    free = {}
    for token, p_first in zip(free_first.ids, free_first.probs, strict=True):
        second = distribution(target.logits_for([*context, int(token)]), params)
        for other, p_second in zip(second.ids, second.probs, strict=True):
            free[(int(token), int(other))] = float(p_first * p_second)
    support = set(free) | set(counts)
    distance_free = 0.5 * sum(abs(counts[pair] / RUNS - free.get(pair, 0.0)) for pair in support)
    assert distance_free > tv_bound(RUNS, len(free))


def test_a_prediction_drafts_after_forced_tokens_and_usage_counts_its_guesses(vocabulary):
    from app.engine.tally import GenerationTally

    target = HashModel()
    plain, _ = generate(
        target, None, vocabulary.compile(STRETCHES).start(), SamplingParams(), max_tokens=40
    )
    # The prediction in the model's own tokens (its text would tokenise otherwise).
    policy = FixedDraftPolicy(PredictionDrafter(plain), 6)
    tally = GenerationTally()
    events = []
    for event in speculative_generate(
        HashModel(),
        target.tokenize("<|user|>hello<|assistant|>"),
        policy,
        ReplySpec(SamplingParams(), 40, constraint=vocabulary.compile(STRETCHES).start()),
    ):
        tally.add(event)
        events.append(event)
    assert [t for e in events for t in e.tokens] == plain
    assert any(event.drafter == "grammar+prediction" for event in events)
    stats = events[-1].stats
    assert stats.grammar_forced > 0
    # Usage counts the prediction's own guesses, forced tokens apart, in every round.
    assert tally.prediction_drafted == stats.drafted > 0
    assert tally.prediction_accepted == stats.accepted > 0


@pytest.mark.parametrize(("exact_batch_limit", "k"), [(1, 0), (3, 2)])
def test_under_exact_output_forced_tokens_are_verified_in_exact_batches(
    vocabulary, exact_batch_limit, k
):
    # Exact output verifies only the batches measured to round like one-token decoding.
    # Forced tokens (a tool call's opening, a schema's keys) are drafts too: in one
    # larger batch, their cache rounded otherwise than plain decoding's, and a long
    # reply (a Write of a whole file) later parted from it at a near-tie (issue 39).
    params = SamplingParams(temperature=0.0)
    plain, _ = generate(
        HashModel(), None, vocabulary.compile(STRETCHES).start(), params, max_tokens=40
    )
    target = HashModel()
    drafter = ModelDrafter(draft_model_for(target, noise_scale=1.0)) if k else None
    events = list(
        speculative_generate(
            target,
            target.tokenize("<|user|>hello<|assistant|>"),
            FixedDraftPolicy(drafter, k, exact_batch_limit=exact_batch_limit),
            ReplySpec(params, 40, constraint=vocabulary.compile(STRETCHES).start()),
        )
    )
    assert [t for e in events for t in e.tokens] == plain
    assert max(target.forward_batch_sizes) == exact_batch_limit
    stats = events[-1].stats
    # A limit of 1 (no batch measured exact, as on CUDA) is plain decoding.
    assert (stats.grammar_forced > 0, stats.drafted > 0) == (exact_batch_limit > 1, k > 0)
