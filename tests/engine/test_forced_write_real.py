"""Issue 41 on the real starter pair: the forced Write request, in every dialect.

``tests/repro/forced_write_messages.json`` is the Messages body that showed the defect
(tool_choice forcing Write after a Read, greedy, max_tokens 200): the reply's first
text block held ``\\n<tool_call>\\n{"name": "`` and five identical Write calls followed,
until max_tokens. It is sent as it is to ``/v1/messages`` and, converted, to
``/v1/chat/completions`` and ``/v1/responses`` (tests/engine/tool_call_dialects.py), whole
and streamed, drafting with the draft model and not. The fast shape checks are in
tests/engine/test_call_markup_dialects.py, on scripted models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.tool_call_dialects import DIALECTS, ask, assert_no_call_markup
from tests.support.serve_process import RunningServer, start_starter_server

# A byte-for-byte copy of shared/repro/forced_write_messages.json.
REPRO = Path(__file__).parents[1] / "repro" / "forced_write_messages.json"
# How each dialect says the reply called tools (and was not cut off by max_tokens).
CALLED = {"messages": "tool_use", "chat": "tool_calls", "responses": "completed"}
# The (drafter, streamed) pairs each dialect is asked with.
STREAMED_BY_DRAFTER = {
    "messages": (("model", False), ("none", True)),
    "chat": (("model", True), ("none", False)),
    "responses": (("model", False), ("none", True)),
}


@pytest.fixture(scope="module")
def starter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """``draftpen serve --pair starter`` on a socket, shared by the module's requests.

    One sequence: the repro's expectations (the grammar ends the one call before
    max_tokens) hold for the reply as the prompt is read alone in whole batches; a
    parallel engine reads it in smaller chunks, and on fast kernels that may round a
    near-tie the other way and write a longer file."""
    yield from start_starter_server(tmp_path_factory, "forced-write", "--parallel", "1")


def repro_request() -> dict[str, Any]:
    return json.loads(REPRO.read_text())


@pytest.mark.real_model
@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_forced_write_request_gets_one_write_and_no_markup(
    starter: RunningServer, dialect: str
):
    request = repro_request()
    assert request["tool_choice"] == {"type": "tool", "name": "Write"}
    with starter.client(timeout=600) as client:
        # Each drafter once a dialect, streamed in one and whole in the other (and the
        # other way round in the next dialect): every pairing is asked somewhere, for
        # half the suite's time (a 200-token reply of the 1.5B target takes ~15 s here).
        for drafter, stream in STREAMED_BY_DRAFTER[dialect]:
            asked = {**request, "speculative": {"drafter": drafter}}
            reply = ask(client, dialect, asked, stream=stream)
            where = (drafter, stream, reply)
            assert_no_call_markup(reply)
            assert not "".join(reply.texts), where
            # The model writes its Write call twice, the same both times: the
            # reply ends at the repeat, one call, and says so.
            assert [name for name, _ in reply.calls] == ["Write"], where
            [(_, write)] = reply.calls
            assert write["file_path"] == "/work/shop/inventory.py"
            assert reply.stop == CALLED[dialect], where
            assert reply.stats["stopped_at_repeated_call"] is True, where
            assert reply.stats["generated_tokens"] < request["max_tokens"]
            if drafter == "model":
                assert reply.stats["drafted"] > 0, where


@pytest.mark.real_model
def test_without_parallel_calls_the_forced_write_is_one_call_ended_by_the_grammar(
    starter: RunningServer,
):
    request = repro_request()
    request["tool_choice"] = {**request["tool_choice"], "disable_parallel_tool_use": True}
    with starter.client(timeout=600) as client:
        reply = ask(client, "messages", request, stream=True)
    assert_no_call_markup(reply)
    assert not "".join(reply.texts)
    assert [name for name, _ in reply.calls] == ["Write"]
    assert reply.stop == "tool_use"
    assert "stopped_at_repeated_call" not in reply.stats
