"""Limits agents live with: max_tokens as a ceiling, ``n`` choices, nameless json_schema.

In-process servers over the scripted byte model (tests/support/byte_model.py) with the official
``openai`` SDK and httpx on the socket: the byte model writes exactly the reply a test
needs, and its one-token-per-byte prompts make the context's arithmetic exact.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.engine.messages_server import API_KEY, QUESTION, messages_server
from tests.support.byte_model import ScriptedByteModel
from tests.support.scripted_tools import ANSWER, HermesScriptedModel, scripted_server

LONG_REPLY = "word " * 200  # 1,000 byte tokens: longer than any context below
CONTEXT = 96


class TightModel(HermesScriptedModel):
    """The Hermes scripted model in a small context, so a long reply fills it."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies, n_ctx=CONTEXT)


def ask(text: str = "Hi", **fields: Any) -> dict[str, Any]:
    """A greedy one-turn chat request to the scripted pair."""
    return {
        "model": "scripted",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        **fields,
    }


# -- max_tokens is a ceiling --------------------------------------------------------


def test_max_tokens_far_above_the_room_generates_until_the_context_is_full(tmp_path: Path):
    with scripted_server(tmp_path, [LONG_REPLY], TightModel) as (sdk, _, engine):
        response = sdk.chat.completions.create(**ask(max_tokens=32_000))
    usage = response.usage
    assert usage is not None
    assert response.choices[0].finish_reason == "length"
    # Every place in the context is used: the prompt's, then the reply's.
    assert usage.prompt_tokens + usage.completion_tokens == CONTEXT
    assert engine.requests[0].max_tokens == CONTEXT - usage.prompt_tokens
    assert response.choices[0].message.content == LONG_REPLY[: usage.completion_tokens]


def test_a_streamed_reply_with_a_far_ceiling_also_stops_at_the_context_end(tmp_path: Path):
    with scripted_server(tmp_path, [LONG_REPLY], TightModel) as (sdk, _, _):
        chunks = list(
            sdk.chat.completions.create(
                **ask(max_completion_tokens=1_000_000),
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    usage = chunks[-1].usage
    assert usage is not None and usage.total_tokens == CONTEXT
    assert finishes[-1] == "length" and len(text) == usage.completion_tokens


def test_a_max_tokens_that_fits_is_kept(tmp_path: Path):
    with scripted_server(tmp_path, [LONG_REPLY], TightModel) as (sdk, _, _):
        response = sdk.chat.completions.create(**ask(max_tokens=7))
    assert response.usage is not None and response.usage.completion_tokens == 7
    assert response.choices[0].finish_reason == "length"


def test_a_prompt_that_does_not_fit_at_all_is_still_a_400_naming_the_fix(tmp_path: Path):
    with (
        scripted_server(tmp_path, [LONG_REPLY], TightModel) as (sdk, _, engine),
        pytest.raises(openai.BadRequestError) as refused,
    ):
        sdk.chat.completions.create(**ask("x" * CONTEXT, max_tokens=10))
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert error["param"] == "messages" and "--context" in error["message"]
    assert engine.requests == []


# -- n choices ----------------------------------------------------------------------


def test_n_choices_are_whole_generations_indexed_in_order_with_usage_summed(tmp_path: Path):
    with scripted_server(tmp_path, ["Paris."], ScriptedByteModel) as (sdk, _, engine):
        single = sdk.chat.completions.create(**ask())
        several = sdk.chat.completions.create(**ask(n=3))
    assert [choice.index for choice in several.choices] == [0, 1, 2]
    assert [choice.message.content for choice in several.choices] == ["Paris."] * 3
    assert {choice.finish_reason for choice in several.choices} == {"stop"}
    # One generation per choice, one after another, each the whole reply.
    assert len(engine.requests) == 4
    assert all(
        request.prompt_tokens == engine.requests[0].prompt_tokens for request in engine.requests
    )
    assert single.usage is not None and several.usage is not None
    assert several.usage.prompt_tokens == single.usage.prompt_tokens  # counted once
    assert several.usage.completion_tokens == 3 * single.usage.completion_tokens
    assert (
        several.usage.total_tokens
        == single.usage.prompt_tokens + 3 * single.usage.completion_tokens
    )


def test_n_choices_stream_one_after_another_each_with_its_index(tmp_path: Path):
    with scripted_server(tmp_path, ["Paris."], ScriptedByteModel) as (sdk, raw, _):
        single = sdk.chat.completions.create(**ask()).usage
        chunks = list(
            sdk.chat.completions.create(
                **ask(n=2), stream=True, stream_options={"include_usage": True}
            )
        )
        with raw.stream("POST", "/v1/chat/completions", json=ask(n=2, stream=True)) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, str | None] = {}
    order: list[int] = []
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
            if not order or order[-1] != choice.index:
                order.append(choice.index)
    assert dict(texts) == {0: "Paris.", 1: "Paris."}
    assert finishes == {0: "stop", 1: "stop"}
    assert order == [0, 1]  # choice 1 starts once choice 0 has finished
    assert len({chunk.id for chunk in chunks}) == 1
    usage = chunks[-1].usage
    assert usage is not None and single is not None and not chunks[-1].choices
    assert usage.prompt_tokens == single.prompt_tokens
    assert usage.completion_tokens == 2 * single.completion_tokens
    # Without include_usage: no usage chunk, and exactly one [DONE], at the end.
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(payload["choices"] for payload in payloads)


def test_seeded_choices_sample_with_consecutive_seeds(tmp_path: Path):
    with scripted_server(tmp_path, ["Paris."], ScriptedByteModel) as (sdk, _, engine):
        sdk.chat.completions.create(**ask(n=3, seed=41, temperature=0.8))
    assert [request.params.seed for request in engine.requests] == [41, 42, 43]


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/chat/completions", ask(n=17), "1 to 16"),
        ("/v1/chat/completions", ask(n=0), "1 to 16"),
        ("/v1/completions", {"model": "scripted", "prompt": "Hi", "n": 2}, "chat completions"),
    ],
    ids=["chat-too-many", "chat-zero", "completions"],
)
def test_n_beyond_what_is_served_is_a_400_naming_n(
    tmp_path: Path, path: str, body: dict[str, Any], fragment: str
):
    with scripted_server(tmp_path, ["Paris."], ScriptedByteModel) as (_, raw, engine):
        response = raw.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "n" and fragment in error["message"]
    assert engine.requests == []


# -- json_schema without a name -----------------------------------------------------


def test_json_schema_without_a_name_is_accepted_and_constrains_the_reply(tmp_path: Path):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with scripted_server(tmp_path, ['{"city": "Paris"}']) as (_, raw, engine):
        response = raw.post(
            "/v1/chat/completions",
            json=ask(response_format={"type": "json_schema", "json_schema": {"schema": schema}}),
        )
    assert response.status_code == 200, response.text
    assert json.loads(response.json()["choices"][0]["message"]["content"]) == {"city": "Paris"}
    constraint = engine.requests[0].constraint
    assert constraint is not None and constraint.text is not None
    assert constraint.text.schema == schema and constraint.text.name is None


def test_a_json_schema_name_that_is_sent_must_still_be_a_valid_name(tmp_path: Path):
    with scripted_server(tmp_path, ["{}"]) as (_, raw, _):
        response = raw.post(
            "/v1/chat/completions",
            json=ask(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "no spaces allowed", "schema": {"type": "object"}},
                }
            ),
        )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "response_format.json_schema.name"


# -- a long read is not a silent stream ---------------------------------------------

# Each dialect's streaming request, and how its events spell the reply's text.
STREAMS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": QUESTION, "stream": True}),
    "responses": ("/v1/responses", {"input": "Weather in Paris?", "stream": True}),
    "messages": ("/v1/messages", {"messages": QUESTION, "max_tokens": 400, "stream": True}),
}


def streamed_text(dialect: str, events: list[dict[str, Any]]) -> str:
    """The reply's text from a dialect's stream events."""
    if dialect == "chat":
        return "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]
        )
    if dialect == "responses":
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    return "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")


@pytest.mark.parametrize("dialect", sorted(STREAMS))
def test_every_dialect_keeps_a_waiting_stream_alive_with_comments(tmp_path: Path, dialect: str):
    # An agent's prompt takes minutes to read on a CPU, and HTTP stacks drop a stream
    # that stays silent that long (Node's fetch after 300 s): every dialect sends SSE
    # comments meanwhile. A held generation stands in for the long read.
    path, fields = STREAMS[dialect]
    with messages_server(tmp_path, [ANSWER], hold_after=2) as served, served.raw() as raw:
        model = served.engine.target
        assert isinstance(model, ScriptedByteModel)
        lines: list[str] = []
        try:
            with raw.stream("POST", path, json={"model": "scripted", **fields}) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    lines.append(line)
                    if line.startswith(":"):
                        model.release.set()
        finally:
            model.release.set()
    assert ": keep-alive" in lines
    data = [line[6:] for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
    assert streamed_text(dialect, [json.loads(item) for item in data]) == ANSWER


def test_the_openai_sdk_reads_a_stream_with_keep_alive_comments(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER], hold_after=2) as served:
        model = served.engine.target
        assert isinstance(model, ScriptedByteModel)
        # Released after the stream has sent a few comments (one a second).
        releaser = threading.Timer(2.5, model.release.set)
        releaser.start()
        try:
            sdk = openai.OpenAI(base_url=f"{served.tcp_url}/v1", api_key=API_KEY, max_retries=0)
            chunks = list(
                sdk.chat.completions.create(
                    model="scripted",
                    messages=QUESTION,
                    stream=True,  # type: ignore[arg-type]
                )
            )
        finally:
            releaser.cancel()
            model.release.set()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER


def test_the_engine_log_says_how_much_of_each_prompt_was_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    # An agent resends its whole prompt every turn; the log line of each request says
    # whether the engine read only what was new (how a slow agent turn is diagnosed).
    caplog.set_level(logging.INFO, logger="draftpen.server")
    with scripted_server(tmp_path, ["Four.", "Five."], HermesScriptedModel) as (sdk, _, _):
        first = sdk.chat.completions.create(**ask("What is 2+2?", max_tokens=20))
        turn = [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And 2+3?"},
        ]
        second = sdk.chat.completions.create(**{**ask(max_tokens=20), "messages": turn})
    lines = [r.getMessage() for r in caplog.records if "of them cached" in r.getMessage()]
    assert len(lines) == 2, lines
    for line, response in zip(lines, (first, second), strict=True):
        usage = response.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        assert f"prompt {usage.prompt_tokens} tokens, {cached} of them cached" in line
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens > 0
