"""Responses API errors: bad fields name the field, unknown models and paths get OpenAI
errors, and a failure mid-stream is a response.failed event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from backends.errors import DecodeError
from tests.engine.responses_helpers import (
    HELLO,
    WEATHER,
)
from tests.support.byte_model import ASSISTANT
from tests.support.scripted_tools import HermesScriptedModel, scripted_server

# -- errors ---------------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param({"input": 5}, "input", "invalid_type", id="input-type"),
    pytest.param(
        {"input": [{"type": "web_search_call"}]}, "input[0].type", "invalid_value", id="item-type"
    ),
    pytest.param(
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content",
        "invalid_value",
        id="image",
    ),
    pytest.param(
        {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
        "input[0].call_id",
        "invalid_value",
        id="output-for-no-call",
    ),
    pytest.param(
        {"input": [{"type": "function_call_output", "output": "1"}]},
        "input[0].call_id",
        "missing_required_parameter",
        id="output-with-no-call-and-no-name",
    ),
    pytest.param(
        {"input": [{"role": "user"}]},
        "input[0].content",
        "missing_required_parameter",
        id="no-content",
    ),
    pytest.param({"temperature": "0.5"}, "temperature", "invalid_type", id="temperature-type"),
    pytest.param({"temperature": 3}, "temperature", "invalid_value", id="temperature-range"),
    pytest.param({"max_output_tokens": 0}, "max_output_tokens", "invalid_value", id="limit"),
    pytest.param({"store": "yes"}, "store", "invalid_type", id="store-type"),
    pytest.param(
        {"tools": [{**WEATHER, "name": "bad name"}]},
        "tools[0].name",
        "invalid_value",
        id="tool-name",
    ),
    pytest.param(
        {"tools": [{**WEATHER, "parameters": {"type": "strin"}}]},
        "tools[0].parameters",
        "invalid_value",
        id="tool-schema",
    ),
    pytest.param(
        {"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]},
        "tool_choice",
        "invalid_value",
        id="named-not-offered",
    ),
    pytest.param(
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}},
        "text.format.schema",
        "invalid_value",
        id="text-schema",
    ),
    pytest.param(
        {"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value", id="effort"
    ),
    pytest.param({"background": True}, "background", "invalid_value", id="background"),
]


@pytest.mark.parametrize(("fields", "param", "code"), BAD_REQUESTS)
def test_bad_fields_get_a_400_naming_the_field(
    tmp_path: Path, fields: dict[str, Any], param: str, code: str
):
    body = {"model": "scripted", "input": "Hi", **fields}
    with (
        scripted_server(tmp_path, [HELLO]) as (sdk, _, _),
        pytest.raises(openai.BadRequestError) as raised,
    ):
        sdk.responses.create(**body)
    error = raised.value.body
    assert isinstance(error, dict) and (error["param"], error["code"]) == (param, code), error
    assert len(error["message"]) > 30


def test_unknown_models_paths_and_methods_get_openai_errors(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, raw, _):
        with pytest.raises(openai.NotFoundError, match="scripted"):
            sdk.responses.create(model="gpt-5", input="Hi")
        missing = raw.get("/v1/response")
        wrong_method = raw.put("/v1/responses/resp_1")
    assert missing.status_code == 404
    assert "POST /v1/responses" in missing.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"]


class FailingModel(HermesScriptedModel):
    """Writes a few tokens of its reply, then the runtime fails."""

    def forward(self, tokens: Any, *, last_only: bool = False) -> Any:
        """As the byte model, until the reply is five tokens long."""
        if ASSISTANT in self._cache:
            marker = len(self._cache) - 1 - self._cache[::-1].index(ASSISTANT)
            if len(self._cache) - marker > 5:
                raise DecodeError("the runtime fell over")
        return super().forward(tokens, last_only=last_only)


def test_an_error_mid_stream_is_a_response_failed_event(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO], FailingModel) as (sdk, _, _):
        events = list(sdk.responses.create(model="scripted", input="Hi", stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "generation_failed" and "fell over" in failed.error.message
    assert [event.sequence_number for event in events] == list(range(len(events)))
