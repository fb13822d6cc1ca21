"""Stored responses: previous_response_id continues a conversation, a response read back
and deleted, store=false, and truncation that leaves out the oldest turns.
"""

from __future__ import annotations

import functools
from pathlib import Path

import openai
import pytest

from tests.engine.responses_helpers import (
    HELLO,
    QUESTION,
    WEATHER,
)
from tests.support.scripted_tools import (
    ANSWER,
    PARIS_CALL,
    HermesScriptedModel,
    prompt_text,
    scripted_server,
)

# -- the store: previous_response_id, GET, DELETE -------------------------------------


def test_previous_response_id_continues_the_stored_conversation(tmp_path: Path):
    with scripted_server(tmp_path, [PARIS_CALL, ANSWER, HELLO]) as (sdk, _, engine):
        first = sdk.responses.create(
            model="scripted", input=QUESTION, tools=[WEATHER], instructions="Old rules."
        )
        [call] = first.output
        second = sdk.responses.create(
            model="scripted",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],  # type: ignore[union-attr]
            tools=[WEATHER],
        )
        third = sdk.responses.create(
            model="scripted", previous_response_id=second.id, input="Thanks!", stream=True
        )
        third_id = [event for event in third][-1].response.id
        assert sdk.responses.retrieve(first.id).output[0].id == call.id
        assert sdk.responses.retrieve(third_id).output_text == HELLO
    assert second.output_text == ANSWER and second.previous_response_id == first.id
    shown = prompt_text(engine, 2)
    for earlier in ("Weather in Paris?", '"city": "Paris"', "<tool_response>18 C", ANSWER):
        assert earlier in shown
    assert shown.endswith(f"{ANSWER}Thanks!")
    # Instructions do not carry over to the next response.
    assert "Old rules." in prompt_text(engine, 0) and "Old rules." not in shown


def test_get_and_delete_a_stored_response_and_store_false_keeps_nothing(tmp_path: Path):
    with scripted_server(tmp_path, [HELLO]) as (sdk, _, _):
        kept = sdk.responses.create(model="scripted", input="Hi")
        fetched = sdk.responses.retrieve(kept.id)
        assert fetched.model_dump() == kept.model_dump()
        sdk.responses.delete(kept.id)
        with pytest.raises(openai.NotFoundError, match="No response with id"):
            sdk.responses.retrieve(kept.id)
        with pytest.raises(openai.NotFoundError):
            sdk.responses.delete(kept.id)
        passing = sdk.responses.create(model="scripted", input="Hi", store=False)
        assert passing.store is False
        with pytest.raises(openai.NotFoundError):
            sdk.responses.retrieve(passing.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            sdk.responses.create(model="scripted", input="Hi", previous_response_id=passing.id)
    error = unknown.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"
    assert error["code"] == "response_not_found" and passing.id in error["message"]


def test_truncation_auto_leaves_out_the_oldest_turns_that_do_not_fit(tmp_path: Path):
    small = functools.partial(HermesScriptedModel, n_ctx=160)
    history = [
        {"role": "user" if turn % 2 == 0 else "assistant", "content": f"Turn {turn}: " + "x" * 30}
        for turn in range(6)
    ]
    body = {"model": "scripted", "input": [*history, {"role": "user", "content": "Hi"}]}
    with scripted_server(tmp_path, [HELLO], small) as (_, raw, engine):  # type: ignore[arg-type]
        refused = raw.post("/v1/responses", json=body)
        fitted = raw.post("/v1/responses", json={**body, "truncation": "auto"})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        assert fitted.status_code == 200, fitted.text
        assert fitted.json()["truncation"] == "auto"
        assert fitted.json()["draftpen"]["left_out_messages"] > 0
        assert prompt_text(engine, -1).endswith("Hi")
