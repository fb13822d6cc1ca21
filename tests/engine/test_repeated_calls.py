"""A reply that repeats a tool call ends where the repeat begins (issue 41).

:class:`RepeatedCallStop` on text cut into pieces, then the loop itself on a scripted
byte model under the real tool-call grammar: what is shown, what is held back, and how
the generation ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from backends.base import ToolSpec
from backends.engine import Engine, GenerationRequest, repeated_call_stop
from backends.generation_events import FINISH_LENGTH, FINISH_STOP, TextSegment
from backends.output.call_syntax import HERMES, LLAMA3_JSON, ToolCallSyntax
from backends.output.output_constraints import ConstraintSpec, ToolCallOutput
from backends.output.reasoning import ReasoningFormat
from backends.output.repeated_calls import RepeatedCallStop
from backends.output.tool_call_pieces import ParsedReply
from backends.output.tool_calls import ToolCallParser
from tests.support.byte_model import ScriptedByteModel

TOOLS = ("get_weather", "get_time")
PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ROME = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


def run_stop(
    text: str, size: int, syntax: ToolCallSyntax = HERMES
) -> tuple[list[str], bool, RepeatedCallStop]:
    """Push ``text`` in pieces of ``size``; what each push showed, and whether it stopped."""
    stop = RepeatedCallStop(syntax, TOOLS)
    shown: list[str] = []
    for start in range(0, len(text), size):
        segments, stopped = stop.push([TextSegment(text[start : start + size], False)])
        shown.append("".join(segment.text for segment in segments))
        if stopped:
            return shown, True, stop
    shown.append("".join(segment.text for segment in stop.flush()))
    return shown, False, stop


def calls_in(text: str, syntax: ToolCallSyntax = HERMES) -> ParsedReply:
    parser = ToolCallParser(syntax, TOOLS)
    reply = ParsedReply()
    reply.add(parser.feed(text))
    reply.add(parser.finish())
    return reply


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_a_repeated_call_ends_the_text_where_it_begins(size: int):
    text = f"Looking.\n{PARIS}\n{PARIS}\n{PARIS}"
    shown, stopped, stop = run_stop(text, size)
    assert stopped and stop.repeated_call == 1
    assert "".join(shown) == f"Looking.\n{PARIS}\n"


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_different_calls_all_go_through_and_nothing_stops(size: int):
    weather_then_rome = f"{PARIS}\n{ROME}\n{PARIS[:-12]}"  # the third is cut off: not judged
    shown, stopped, stop = run_stop(weather_then_rome, size)
    assert not stopped and stop.repeated_call is None
    assert "".join(shown) == weather_then_rome


def test_a_call_is_held_back_only_while_it_may_still_repeat_an_earlier_one():
    stop = RepeatedCallStop(HERMES, TOOLS)
    first, stopped = stop.push([TextSegment(PARIS, False)])
    assert "".join(s.text for s in first) == PARIS and not stopped
    # The same call so far: held back.
    same_start = PARIS[: PARIS.index("Paris")]
    held, _ = stop.push([TextSegment("\n" + same_start, True)])
    assert held == [TextSegment("\n", True)]  # only what comes before the call
    # It differs now: everything held goes out at once, provenance kept.
    released, stopped = stop.push([TextSegment("Rome", False)])
    assert not stopped
    assert released == [TextSegment(same_start, True), TextSegment("Rome", False)]
    assert stop.push([TextSegment('"}}\n</tool_call>', False)])[1] is False


def test_the_same_call_with_other_spacing_or_key_order_still_counts_as_a_repeat():
    # Without a grammar a model may space or order its JSON otherwise; that is the same
    # call. It is then seen only at its end, after part of it went out, so it is shown
    # whole (never cut in two) and the reply stops there.
    respaced = '<tool_call>\n{"arguments": {"city":"Paris"}, "name": "get_weather"}\n</tool_call>'
    text = f"{PARIS}\n{respaced}\n{PARIS}"
    shown, stopped, _ = run_stop(text, 3)
    assert stopped
    assert "".join(shown) == f"{PARIS}\n{respaced}"
    assert len(calls_in("".join(shown)).tool_calls or []) == 2


def test_llama3_bare_calls_repeat_too():
    call = '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    shown, stopped, _ = run_stop(f"{call}; {call}", 2, LLAMA3_JSON)
    assert stopped and "".join(shown).rstrip("; ") == call


@pytest.mark.parametrize("starts_inside", [False, True])
def test_a_call_in_the_reasoning_is_not_one_the_answer_can_repeat(starts_inside: bool):
    opening = "" if starts_inside else "<think>\n"
    thought = f"{opening}Maybe {PARIS} would do.\n</think>\n\n"
    marks = ReasoningFormat(starts_inside=starts_inside)
    for size in (1, 6, 1000):
        stop = RepeatedCallStop(HERMES, TOOLS, marks)
        text = f"{thought}{PARIS}\n{PARIS}"
        shown = ""
        for start in range(0, len(text), size):
            segments, stopped = stop.push([TextSegment(text[start : start + size], False)])
            shown += "".join(segment.text for segment in segments)
            if stopped:
                break
        assert stopped and stop.repeated_call == 1, size
        assert shown == f"{thought}{PARIS}\n", size


# -- in the loop -----------------------------------------------------------------------

WEATHER = ToolSpec(
    "get_weather",
    None,
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def forced_calls(
    reply: str, *, parallel: bool = True, max_tokens: int = 400, drafter: str = "ngram"
) -> list:
    """The events of a scripted model writing ``reply`` under a required-call grammar."""
    engine = Engine(ScriptedByteModel([reply]))
    calls = ToolCallOutput((WEATHER,), HERMES, "required", parallel=parallel)
    request = GenerationRequest(
        prompt_tokens=tuple(engine.target.tokenize("<|user|>Weather?<|assistant|>")),
        max_tokens=max_tokens,
        drafter=drafter,
        constraint=ConstraintSpec(tool_calls=calls),
    )
    return list(engine.generate(request))


def text_of(events: Sequence) -> str:
    return "".join(event.text for event in events)


def test_the_loop_stops_at_a_repeated_call_and_says_so():
    events = forced_calls(f"{PARIS}\n{PARIS}\n{PARIS}\n{PARIS}")
    last = events[-1]
    assert last.finish_reason == FINISH_STOP and last.repeated_call
    assert not any(event.repeated_call for event in events[:-1])
    assert text_of(events).rstrip("\n") == PARIS
    # It stopped at the repeat (and the round's drafts after it), not four calls on.
    generated = sum(len(event.tokens) for event in events)
    assert generated < 3 * len(PARIS)


def test_a_repeated_call_ends_the_reply_at_the_token_plain_decoding_ends_it():
    # The n-gram drafter runs far past the repeat's end in one round; those accepted
    # drafts are not the reply's, so the usage counts are plain decoding's.
    reply = f"{PARIS}\n{PARIS}\n{PARIS}\n{PARIS}"
    plain = forced_calls(reply, drafter="none")
    drafted = forced_calls(reply)
    assert drafted[-1].stats.drafted > 0
    assert [t for e in drafted for t in e.tokens] == [t for e in plain for t in e.tokens]
    assert drafted[-1].stats.generated_tokens == plain[-1].stats.generated_tokens
    assert text_of(drafted) == text_of(plain)


def test_without_parallel_calls_the_grammar_itself_ends_the_reply_after_one_call():
    assert repeated_call_stop(None) is None
    events = forced_calls(f"{PARIS}\n{PARIS}", parallel=False)
    assert events[-1].finish_reason == FINISH_STOP and not events[-1].repeated_call
    assert text_of(events) == PARIS + "\n"  # a newline may end it (the model's choice)


def test_a_reply_cut_inside_a_held_back_repeat_shows_it_at_the_end():
    # max_tokens ends the reply in the second call, before it is known to repeat the
    # first: what was held back goes out (the parser then drops the cut-off call).
    events = forced_calls(f"{PARIS}\n{PARIS}", max_tokens=len(PARIS) + 30)
    assert events[-1].finish_reason == FINISH_LENGTH and not events[-1].repeated_call
    text = text_of(events)
    assert text == f"{PARIS}\n{PARIS}"[: len(text)] and len(text) == len(PARIS) + 30
    reply = calls_in(text)
    assert reply.content == "" and len(reply.tool_calls or []) == 1
