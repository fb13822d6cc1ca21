"""``generate`` and the plain chat with a thinking model: the answer on stdout, reasoning apart."""

from __future__ import annotations

import io

import pytest

from app.cli.repl import _stream_reply
from app.cli.reply_stream import ReplyStream
from app.client import ChatTurn
from app.main import build_parser
from app.options import chat_settings
from backends.base import ChatMessage
from backends.engine import GenerationRequest
from backends.sampling.filters import SamplingParams
from tests.support.thinking_model import thinking_engine, thinking_reply
from tests.support.tui_helpers import EngineForApp

REASONING = "Reversing: slicing with a step of -1."
ANSWER = "Use `items[::-1]`."


def _request(thinking: bool | None) -> tuple[GenerationRequest, object, object]:
    engine = thinking_engine([thinking_reply(REASONING, ANSWER)])
    text = engine.chat_prompt_text([ChatMessage("user", "reverse a list")], thinking=thinking)
    request = GenerationRequest(
        prompt_tokens=tuple(engine.text_prompt(text)),
        params=SamplingParams(temperature=0.0),
        drafter="model",
        max_tokens=200,
    )
    return request, engine, engine.reasoning_format(text)


def test_the_answer_goes_to_stdout_and_the_reasoning_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The plain chat is a client of the engine: a real one, serving the thinking model.
    served = EngineForApp(
        {"thinker": thinking_engine([thinking_reply(REASONING, ANSWER)])}, ["thinker"]
    )
    try:
        turn = ChatTurn(
            "thinker",
            (ChatMessage("user", "reverse a list"),),
            SamplingParams(temperature=0.0),
            max_tokens=200,
            drafter="model",
        )
        pieces: list[str] = []
        stats = _stream_reply(served.client(), turn, pieces)
    finally:
        served.stop()
    out, err = capsys.readouterr()
    assert "".join(pieces) == ANSWER == out
    # The engine loaded the pair on demand and said so; then the reasoning, apart.
    *notices, reasoning = err.splitlines()
    assert notices and all(line.startswith("(the engine is loading thinker") for line in notices)
    assert reasoning == f"(thinking) {REASONING}"
    assert stats is not None
    assert stats.generated_tokens > len(f"<think>\n{REASONING}\n</think>")


def test_collecting_only_prints_nothing_and_no_think_means_no_reasoning() -> None:
    request, engine, reasoning = _request(thinking=False)
    out, err = io.StringIO(), io.StringIO()
    reply = ReplyStream(reasoning, out=out, err=err, echo=False)  # type: ignore[arg-type]
    for event in engine.generate(request):  # type: ignore[attr-defined]
        reply.add(event)
    assert (out.getvalue(), err.getvalue()) == ("", "")
    assert (reply.answer, reply.reasoning_text, reply.reasoning_tokens) == (ANSWER, "", 0)


def test_no_think_flag_overrides_the_setting_for_one_run() -> None:
    args = build_parser().parse_args(["chat", "--no-think"])
    assert chat_settings(args).thinking is False
    args = build_parser().parse_args(["chat"])
    assert chat_settings(args).thinking is True
    args = build_parser().parse_args(["generate", "--no-think", "-p", "x"])
    assert args.thinking is False
