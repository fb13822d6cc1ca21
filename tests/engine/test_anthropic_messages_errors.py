"""Anthropic Messages errors in Anthropic's shape: blocks the engine cannot read, bad
requests, routes it does not serve, and a full queue (529 overloaded).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.engine.messages_server import (
    QUESTION,
    WEATHER_TOOL,
    create,
    messages_server,
)
from tests.support.byte_model import ScriptedByteModel
from tests.support.scripted_tools import ANSWER

# -- errors -----------------------------------------------------------------------------


def test_images_and_documents_get_a_400_naming_the_block(tmp_path: Path):
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
    }
    with messages_server(tmp_path, [ANSWER]) as served:
        sdk = served.sdk()
        with pytest.raises(anthropic.BadRequestError) as in_message:
            create(
                sdk,
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
                ],
            )
        with pytest.raises(anthropic.BadRequestError) as in_result:
            create(
                sdk,
                tools=[WEATHER_TOOL],
                messages=[
                    *QUESTION,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
                        ],
                    },
                ],
            )
        document = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "x"},
        }
        with pytest.raises(anthropic.BadRequestError) as as_document:
            create(sdk, messages=[{"role": "user", "content": [document]}])
        assert served.engine.requests == []

    body = in_message.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert set(body["error"]) == {"type", "message"}
    assert "messages[0].content[1]" in body["error"]["message"]
    assert "image blocks are not supported" in body["error"]["message"]
    assert "messages[2].content[0].content[0]" in in_result.value.message
    assert "images" in in_result.value.message
    assert "document blocks are not supported" in as_document.value.message


BAD_REQUESTS = [
    pytest.param({"model": "missing"}, 404, "not_found_error", "missing", id="unknown-model"),
    pytest.param(
        {"max_tokens": None}, 400, "invalid_request_error", "max_tokens", id="no-max-tokens"
    ),
    pytest.param(
        {"temperature": "hot"}, 400, "invalid_request_error", "temperature", id="temperature-type"
    ),
    pytest.param(
        {"temperature": 1.5}, 400, "invalid_request_error", "temperature", id="temperature-range"
    ),
    pytest.param(
        {"messages": [{"role": "robot", "content": "hi"}]},
        400,
        "invalid_request_error",
        "messages[0].role",
        id="role",
    ),
    pytest.param(
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}
            ]
        },
        400,
        "invalid_request_error",
        "messages[0].content[0].tool_use_id",
        id="result-for-no-call",
    ),
    pytest.param(
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "get_time"}},
        400,
        "invalid_request_error",
        "get_time",
        id="tool-choice-not-offered",
    ),
    pytest.param(
        {"tools": [{"name": "f", "input_schema": {"type": "object", "required": "x"}}]},
        400,
        "invalid_request_error",
        "tools[0].input_schema",
        id="schema-not-a-schema",
    ),
    pytest.param(
        {"tools": [{"name": "f"}]}, 400, "invalid_request_error", "input_schema", id="no-schema"
    ),
]


@pytest.mark.parametrize(("fields", "status", "kind", "named"), BAD_REQUESTS)
def test_bad_requests_get_anthropics_error_shape(
    tmp_path: Path, fields: dict[str, Any], status: int, kind: str, named: str
):
    body = {"model": "scripted", "max_tokens": 10, "messages": QUESTION, **fields}
    body = {key: value for key, value in body.items() if value is not None}
    with messages_server(tmp_path, [ANSWER]) as served, served.raw() as raw:
        response = raw.post("/v1/messages", json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert named in error["error"]["message"] and len(error["error"]["message"]) > 30


def test_routes_and_bodies_the_server_cannot_take_answer_in_anthropics_shape(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER]) as served, served.raw() as raw:
        wrong_method = raw.get("/v1/messages")
        wrong_path = raw.post("/v1/messages/batches", json={})
        not_json = raw.post(
            "/v1/messages", content=b"{", headers={"content-type": "application/json"}
        )
        not_object = raw.post("/v1/messages", json=[1])
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert wrong_path.status_code == 404
    assert wrong_path.json()["error"]["type"] == "not_found_error"
    assert "POST /v1/messages" in wrong_path.json()["error"]["message"]
    for response in (not_json, not_object):
        assert response.status_code == 400
        assert response.json()["type"] == "error"


def test_a_full_queue_answers_529_overloaded_with_retry_after(tmp_path: Path):
    with messages_server(tmp_path, [ANSWER], queue_limit=0, hold_after=2) as served:
        model = served.engine.target
        assert isinstance(model, ScriptedByteModel)
        holder = threading.Thread(target=create, args=(served.sdk(),))
        holder.start()
        try:
            assert model.holding.wait(10)
            with pytest.raises(anthropic.OverloadedError) as refused:
                create(served.sdk())
            with served.raw() as raw:
                counted = raw.post(
                    "/v1/messages/count_tokens", json={"model": "scripted", "messages": QUESTION}
                )
        finally:
            model.release.set()
            holder.join(10)
    assert refused.value.status_code == 529
    assert refused.value.body["error"]["type"] == "overloaded_error"
    assert refused.value.response.headers["retry-after"] == "2"
    assert counted.status_code == 529 and counted.json()["error"]["type"] == "overloaded_error"
