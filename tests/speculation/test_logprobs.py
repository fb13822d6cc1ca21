"""Log-probabilities: the target's own, whatever speculation did, and how the API sends them.

Every reported value is read from the target's row at the token's position, so a
speculative generation reports exactly what plain decoding reports, and both equal a
direct computation on the target's logits for that prefix (HashModel can give the
logits of any context). At temperature 0 that is the log-softmax of the raw row; at
temperature > 0 the log of the filtered distribution the loop samples from. The
server's tests use the official openai SDK over the socket on a scripted model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent, TokenLogprob
from backends.output.constraints import GrammarSpec, GrammarState, GrammarVocabulary
from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.row_scans import log_normaliser, top_ids
from backends.speculation.draft_policy import FixedDraftPolicy
from backends.speculation.loop import speculative_generate
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.reply_spec import ReplySpec
from tests.support.fake_runs import chat_prompt
from tests.support.fakes import HashModel, draft_model_for
from tests.support.model_files import DRAFT_KEY, TARGET_KEY, require_model
from tests.support.scripted_tools import PARIS_CALL, WEATHER_TOOL, scripted_server

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = [
    pytest.param(SamplingParams(temperature=0.8, seed=3), id="temperature"),
    pytest.param(SamplingParams(temperature=1.0, top_k=8, seed=4), id="top-k"),
    pytest.param(SamplingParams(temperature=0.7, top_p=0.9, min_p=0.02, seed=5), id="top-p-min-p"),
]


def log_softmax(row: np.ndarray) -> np.ndarray:
    """The reference: float64 log-softmax of one row of logits."""
    values = np.asarray(row, dtype=np.float64)
    top = values.max()
    return values - (top + np.log(np.exp(values - top).sum()))


def generate(
    target: HashModel,
    *,
    draft: HashModel | None,
    params: SamplingParams,
    logprobs: int | None,
    k: int = 4,
    max_tokens: int = 48,
    constraint: GrammarState | None = None,
) -> tuple[list[int], list[TokenLogprob], list[GenerationEvent]]:
    """Tokens, logprobs and events of one generation (with a draft model: K = ``k``)."""
    policy = FixedDraftPolicy(ModelDrafter(draft) if draft is not None else None, k)
    events = list(
        speculative_generate(
            target,
            chat_prompt(target, "tell me"),
            policy,
            ReplySpec(params, max_tokens, constraint=constraint, logprobs=logprobs),
        )
    )
    tokens = [token for event in events for token in event.tokens]
    reported = [item for event in events for item in event.token_logprobs]
    return tokens, reported, events


def assert_alternatives(
    top: Sequence[tuple[int, float]], listed: Sequence[int], row: np.ndarray, count: int
) -> None:
    """``top`` is exactly ``count`` entries: the possible tokens ``listed`` first, then
    the likeliest others by ``row`` (the logits before the filters), at -inf."""
    assert len(top) == count
    assert [t for t, _ in top[: len(listed)]] == list(listed)
    filler = [t for t, _ in top[len(listed) :]]
    assert all(lp == -np.inf for _, lp in top[len(listed) :])
    assert len(set(filler)) == len(filler) and not set(filler) & set(listed)
    if filler:
        others = np.setdiff1d(np.arange(row.shape[0]), [*listed, *filler])
        assert row[filler].min() >= (row[others].max() if others.size else -np.inf)


def assert_close(got: Sequence[TokenLogprob], want: Sequence[TokenLogprob]) -> None:
    assert [item.token for item in got] == [item.token for item in want]
    for mine, theirs in zip(got, want, strict=True):
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-9)
        assert [t for t, _ in mine.top] == [t for t, _ in theirs.top]
        assert [v for _, v in mine.top] == pytest.approx([v for _, v in theirs.top], abs=1e-9)


def test_logprobs_are_off_unless_asked_for():
    target = HashModel()
    _, reported, events = generate(target, draft=None, params=GREEDY, logprobs=None)
    assert reported == [] and all(event.token_logprobs == () for event in events)


def test_greedy_speculation_reports_the_tokens_and_logprobs_of_plain_decoding():
    target = HashModel()
    plain_tokens, plain, _ = generate(target, draft=None, params=GREEDY, logprobs=5)
    target = HashModel()
    spec_tokens, speculative, events = generate(
        target, draft=draft_model_for(target), params=GREEDY, logprobs=5
    )
    assert events[-1].stats.accepted > 0  # speculation did happen
    assert spec_tokens == plain_tokens
    assert_close(speculative, plain)


def test_greedy_logprobs_are_the_log_softmax_of_the_targets_row_for_each_prefix():
    target = HashModel()
    tokens, reported, events = generate(
        target, draft=draft_model_for(target), params=GREEDY, logprobs=3
    )
    assert len(reported) == len(tokens) == events[-1].stats.generated_tokens
    context = chat_prompt(target, "tell me")
    for token, item in zip(tokens, reported, strict=True):
        reference = log_softmax(target.logits_for(context))
        assert item.token == token
        assert item.logprob == pytest.approx(reference[token], abs=1e-9)
        # Greedy: the emitted token is the likeliest, so it heads the alternatives.
        # A row with fewer possible tokens (after the first half of "é") still lists
        # three: the impossible ones at -inf.
        ranked = [t for t in np.argsort(-reference, kind="stable")[:3] if reference[t] > -np.inf]
        assert_alternatives(item.top, [int(t) for t in ranked], target.logits_for(context), 3)
        assert item.top[0] == (token, pytest.approx(item.logprob))
        finite = [v for _, v in item.top[: len(ranked)]]
        assert finite == pytest.approx(reference[ranked].tolist())
        context.append(token)


@pytest.mark.parametrize("params", SAMPLED)
def test_sampled_logprobs_are_the_log_of_the_filtered_distribution_sampled_from(
    params: SamplingParams,
):
    target = HashModel()
    tokens, reported, events = generate(
        target, draft=draft_model_for(target), params=params, logprobs=4
    )
    assert events[-1].stats.accepted > 0 and events[-1].stats.drafted > events[-1].stats.accepted
    context = chat_prompt(target, "tell me")
    for token, item in zip(tokens, reported, strict=True):
        p = distribution(target.logits_for(context), params)
        assert item.token == token
        assert item.logprob == pytest.approx(math.log(p.prob_of(token)), abs=1e-9)
        order = [i for i in np.argsort(-p.probs, kind="stable")[:4] if p.probs[i] > 0]
        # Exactly four: where the filters left fewer, the rest follow at -inf.
        assert_alternatives(item.top, [int(p.ids[i]) for i in order], target.logits_for(context), 4)
        finite = [v for _, v in item.top[: len(order)]]
        assert finite == pytest.approx(np.log(p.probs[order]).tolist())
        context.append(token)


def test_top_zero_reports_the_token_alone():
    target = HashModel()
    _, reported, _ = generate(target, draft=None, params=GREEDY, logprobs=0, max_tokens=8)
    assert reported and all(item.top == () for item in reported)


def test_under_a_grammar_logprobs_are_of_the_masked_row():
    target = HashModel()
    vocabulary = GrammarVocabulary(target)
    grammar = GrammarSpec("regex", "(the|an|re|at|on)(ing|ed|er|es)+")
    state = vocabulary.compile(grammar).start()
    tokens, reported, _ = generate(
        target,
        draft=draft_model_for(target),
        params=GREEDY,
        logprobs=20,
        constraint=state,
        max_tokens=8,
    )
    assert tokens
    check = vocabulary.compile(grammar).start()
    context = chat_prompt(target, "tell me")
    for token, item in zip(tokens, reported, strict=True):
        allowed = check.allowed()
        reference = log_softmax(np.where(allowed, target.logits_for(context), -np.inf))
        assert item.logprob == pytest.approx(reference[token], abs=1e-9)
        # The tokens the grammar allows come first; the refused ones fill up to 20 at -inf.
        possible = [t for t, lp in item.top if lp > -np.inf]
        assert possible and all(allowed[t] for t in possible)
        assert len(possible) == min(20, int(allowed.sum()))
        assert all(not allowed[t] for t, lp in item.top if lp == -np.inf)
        assert len(item.top) == 20
        check.consume([token])
        context.append(token)


def test_a_large_vocabularys_normaliser_and_top_tokens_match_a_full_float64_pass():
    # Real vocabularies take the float32 pass and the upper-set search, not the fakes'.
    row = (np.random.default_rng(11).standard_normal(151_936) * 3).astype(np.float32)
    row[::7] = -np.inf  # a grammar's mask
    assert log_normaliser(row) == pytest.approx(
        float(np.log(np.exp(row.astype(np.float64) - row.max()).sum()) + row.max()), abs=1e-6
    )
    assert top_ids(row, 20).tolist() == np.argsort(-row, kind="stable")[:20].tolist()
    assert top_ids(row, 0).size == 0


def test_the_engine_passes_logprobs_through_and_checks_the_range():
    target = HashModel()
    engine = Engine(target, draft_model_for(target))
    request = GenerationRequest(
        tuple(chat_prompt(target, "tell me")), drafter="model", max_tokens=6, logprobs=2
    )
    events = list(engine.generate(request))
    tokens = [t for e in events for t in e.tokens]
    assert [item.token for e in events for item in e.token_logprobs] == tokens
    with pytest.raises(ValueError, match="logprobs"):
        GenerationRequest((1, 2), logprobs=21)


@pytest.mark.real_model
def test_starter_greedy_logprobs_equal_the_targets_plain_forward_with_the_draft_on():
    """On the real starter pair (draft model drafting), every greedy token's reported
    logprob is the log-softmax of the target's own plain forward row for its prefix."""
    from backends.select import load_model

    target_path = require_model(TARGET_KEY)
    draft_path = require_model(DRAFT_KEY)
    # Exact kernels: verify batches round like one-token decoding (see backends/llamacpp/model.py);
    # without them a batch's row differs from the one-token row by ~1e-2 in a logprob,
    # which is the runtime's arithmetic, not the loop's bookkeeping.
    target = load_model(target_path, runtime="llamacpp", n_ctx=1024, exact_kernels=True)
    draft = load_model(draft_path, runtime="llamacpp", n_ctx=1024)
    engine = Engine(target, draft)
    try:
        prompt = engine.chat_prompt([_message("Write a Python function that adds two numbers.")])
        request = GenerationRequest(
            tuple(prompt), drafter="model", draft_tokens=4, max_tokens=24, logprobs=5
        )
        events = list(engine.generate(request))
        assert events[-1].stats.accepted > 0
        tokens = [t for e in events for t in e.tokens]
        reported = [item for e in events for item in e.token_logprobs]
        assert len(reported) == len(tokens) > 0
        # The reference: plain decoding, one token per forward, from a fresh cache.
        target.rollback(0)
        target.prefill(prompt[:-1])
        pending = prompt[-1]
        for token, item in zip(tokens, reported, strict=True):
            reference = log_softmax(target.forward([pending])[-1])
            assert item.token == token
            assert item.logprob == pytest.approx(reference[token], abs=1e-4)
            assert item.top[0][0] == int(np.argmax(reference))
            assert [v for _, v in item.top] == pytest.approx(
                np.sort(reference)[::-1][:5].tolist(), abs=1e-4
            )
            pending = token
    finally:
        engine.close()


def _message(text: str):
    from backends.base import ChatMessage

    return ChatMessage("user", text)


# -- over the socket, with the official openai SDK, on a scripted model --------------------

# A split UTF-8 character ("é" is two byte tokens) shows each half as U+FFFD in "token",
# with its one byte in "bytes".
REPLY = "Héllo, world"
# The scripted model puts 30 on the scripted token and 0 on the 259 others.
SCRIPTED_LOGPROB = -math.log1p(259 * math.exp(-30.0))
OTHER_LOGPROB = -30.0 + SCRIPTED_LOGPROB


def test_chat_logprobs_describe_every_token_streamed_and_not(tmp_path: Path):
    request: dict[str, Any] = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "Say hello"}],
        "logprobs": True,
        "top_logprobs": 2,
        "temperature": 0,  # greedy: logprobs of the raw row, alternatives and all
    }
    with scripted_server(tmp_path, [REPLY]) as (sdk, _, engine):
        whole = sdk.chat.completions.create(**request)
        chunks = list(sdk.chat.completions.create(**request, stream=True))
    assert engine.requests[0].logprobs == 2
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.refusal is None
    content = logprobs.content or []
    assert b"".join(bytes(entry.bytes or []) for entry in content) == REPLY.encode()
    assert len(content) == len(REPLY.encode())
    for entry in content:
        assert entry.token == bytes(entry.bytes or []).decode("utf-8", errors="replace")
        assert entry.logprob == pytest.approx(SCRIPTED_LOGPROB, abs=1e-6)
        assert entry.top_logprobs[0].token == entry.token
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[1].logprob == pytest.approx(OTHER_LOGPROB, abs=1e-5)
    assert "\ufffd" in [entry.token for entry in content]

    streamed = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs is not None
        for entry in chunk.choices[0].logprobs.content or []
    ]
    assert [entry.model_dump() for entry in streamed] == [entry.model_dump() for entry in content]


def test_chat_logprobs_cover_the_tool_call_syntax_too(tmp_path: Path):
    request: dict[str, Any] = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "logprobs": True,
    }
    with scripted_server(tmp_path, [PARIS_CALL]) as (sdk, _, _):
        whole = sdk.chat.completions.create(**request)
        chunks = list(sdk.chat.completions.create(**request, stream=True))
    assert whole.choices[0].finish_reason == "tool_calls"
    content = whole.choices[0].logprobs.content or []  # type: ignore[union-attr]
    assert b"".join(bytes(entry.bytes or []) for entry in content) == PARIS_CALL.encode()
    assert all(entry.top_logprobs == [] for entry in content)
    streamed = [
        entry.model_dump()
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs is not None
        for entry in chunk.choices[0].logprobs.content or []
    ]
    assert streamed == [entry.model_dump() for entry in content]


def test_completion_logprobs_come_in_the_legacy_shape_streamed_and_not(tmp_path: Path):
    request: dict[str, Any] = {
        "model": "scripted",
        "prompt": "<|user|>Say hello<|assistant|>",
        "logprobs": 3,
        "temperature": 0,
    }
    reply = "Hello, world"
    with scripted_server(tmp_path, [reply]) as (sdk, _, engine):
        whole = sdk.completions.create(**request)
        chunks = list(sdk.completions.create(**request, stream=True))
    assert engine.requests[0].logprobs == 3
    choice = whole.choices[0]
    assert choice.text == reply
    logprobs = choice.logprobs
    assert logprobs is not None
    assert logprobs.tokens == list(reply)
    assert logprobs.token_logprobs == pytest.approx([SCRIPTED_LOGPROB] * len(reply), abs=1e-6)
    assert logprobs.text_offset == list(range(len(reply)))
    tops = logprobs.top_logprobs or []
    assert len(tops) == len(reply)
    for token, top in zip(reply, tops, strict=True):
        assert next(iter(top)) == token and len(top) == 3
    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].logprobs is not None:
            for key, values in streamed.items():
                values.extend(getattr(chunk.choices[0].logprobs, key))
    assert streamed == {
        "tokens": logprobs.tokens,
        "token_logprobs": logprobs.token_logprobs,
        "text_offset": logprobs.text_offset,
    }


@pytest.mark.parametrize("fields", [{}, {"logprobs": False}], ids=["absent", "false"])
def test_without_logprobs_the_responses_say_null(tmp_path: Path, fields: dict[str, Any]):
    chat = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **fields}
    completion = {"model": "scripted", "prompt": "<|user|>hi<|assistant|>"}
    with scripted_server(tmp_path, ["ok"]) as (_, raw, engine):
        chat_reply = raw.post("/v1/chat/completions", json=chat).json()
        stream = raw.post("/v1/chat/completions", json={**chat, "stream": True}).text
        completion_reply = raw.post("/v1/completions", json=completion).json()
    assert chat_reply["choices"][0]["logprobs"] is None
    assert completion_reply["choices"][0]["logprobs"] is None
    chunks = [
        json.loads(line.removeprefix("data: "))
        for line in stream.splitlines()
        if line.startswith("data: {")
    ]
    assert chunks and all(chunk["choices"][0]["logprobs"] is None for chunk in chunks)
    assert [request.logprobs for request in engine.requests] == [None, None, None]


def test_top_logprobs_without_logprobs_gets_a_400_naming_the_field(tmp_path: Path):
    body = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "top_logprobs": 3,
    }
    with scripted_server(tmp_path, ["ok"]) as (_, raw, _):
        response = raw.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "top_logprobs" and "logprobs: true" in error["message"]
