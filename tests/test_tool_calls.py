"""The tool-call parser on scripted replies: every family's syntax, cut into any pieces."""

from __future__ import annotations

import itertools
import json

import pytest

from backends.base import ToolCall
from backends.call_syntax import HERMES, LLAMA3_JSON, ToolCallSyntax, tool_call_syntax
from backends.tool_calls import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ParsedReply,
    ToolCallParser,
    ToolCallStart,
)

TOOLS = ("get_weather", "get_time")


def numbered_ids() -> itertools.count[int]:
    return itertools.count()


def parse(
    syntax: ToolCallSyntax, text: str, *, piece_size: int | None = None, **options: object
) -> tuple[ParsedReply, list[ParsedPiece]]:
    """The reply parsed from ``text`` fed in pieces of ``piece_size`` characters."""
    counter = itertools.count()
    parser = ToolCallParser(
        syntax,
        TOOLS,
        new_id=lambda: f"call_{next(counter)}",
        **options,  # type: ignore[arg-type]
    )
    size = piece_size or max(len(text), 1)
    pieces: list[ParsedPiece] = []
    for start in range(0, len(text), size):
        pieces += parser.feed(text[start : start + size])
    pieces += parser.finish()
    reply = ParsedReply()
    reply.add(pieces)
    return reply, pieces


def assert_same_in_every_cut(syntax: ToolCallSyntax, text: str, **options: object) -> ParsedReply:
    """The reply is the same whether the text comes whole, char by char, or in threes."""
    whole, _ = parse(syntax, text, **options)
    for size in (1, 3, 7):
        assert parse(syntax, text, piece_size=size, **options)[0] == whole, size
    return whole


WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_hermes_call_becomes_a_tool_call_and_no_content():
    reply = assert_same_in_every_cut(HERMES, f"<tool_call>\n{WEATHER}\n</tool_call>")
    assert reply.content == ""
    assert reply.tool_calls == [ToolCall("call_0", "get_weather", '{"city": "Paris"}')]


def test_streamed_call_starts_with_its_name_then_sends_argument_fragments():
    _, pieces = parse(HERMES, f"<tool_call>\n{WEATHER}\n</tool_call>", piece_size=4)
    assert pieces[0] == ToolCallStart(0, "call_0", "get_weather")
    fragments = pieces[1:]
    assert len(fragments) > 2 and all(isinstance(piece, ArgumentsPiece) for piece in fragments)
    assert "".join(piece.text for piece in fragments) == '{"city": "Paris"}'  # type: ignore[union-attr]


def test_parallel_calls_get_increasing_indexes():
    text = (
        "I'll look both up.\n"
        f"<tool_call>\n{WEATHER}\n</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Rome"}}\n</tool_call>'
    )
    reply = assert_same_in_every_cut(HERMES, text)
    assert reply.content == "I'll look both up."
    assert reply.tool_calls == [
        ToolCall("call_0", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_1", "get_time", '{"zone": "Europe/Rome"}'),
    ]


def test_parallel_calls_off_keeps_the_first_and_leaks_nothing():
    text = f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>"
    reply = assert_same_in_every_cut(HERMES, text, max_calls=1)
    assert reply.content == "" and reply.tool_calls is not None and len(reply.tool_calls) == 1


@pytest.mark.parametrize(
    "text",
    [
        "Use a <toolbox> and a <tool_> tag, or write ```python\nprint(1)\n```.",
        'Here is JSON:\n```json\n{"name": "Ada", "age": 36}\n```\n',
        '```json\n{"name": "unknown_tool", "arguments": {}}\n```',
        '{"name": "Ada", "arguments": 3}',
        '\n {"city": "Paris"}',
        "  indented text that ends in spaces  ",
        "",
    ],
)
def test_text_that_is_not_a_call_passes_through_unchanged(text: str):
    reply = assert_same_in_every_cut(HERMES, text)
    assert reply.content == text and reply.tool_calls is None


def test_qwen_coder_fenced_and_doubled_brace_calls_are_read():
    fenced = (
        '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
    )
    reply = assert_same_in_every_cut(HERMES, fenced)
    assert reply.content == "" and reply.tool_calls is not None
    assert json.loads(reply.tool_calls[0].arguments) == {"city": "Paris"}
    doubled = '{{"name": "get_weather", "arguments": {"city": "Paris"}}}'
    reply = assert_same_in_every_cut(HERMES, doubled)
    assert reply.content == "" and reply.tool_calls is not None
    assert reply.tool_calls[0].arguments == '{"city": "Paris"}'


def test_arguments_first_and_string_arguments_are_read_whole():
    reply = assert_same_in_every_cut(
        HERMES, '<tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>'
    )
    assert reply.tool_calls == [ToolCall("call_0", "get_weather", '{"city": "Rome"}')]
    reply = assert_same_in_every_cut(
        HERMES, '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}'
    )
    assert reply.tool_calls == [ToolCall("call_0", "get_weather", '{"city": "Rome"}')]


def test_a_call_cut_off_before_its_name_stays_content():
    reply = assert_same_in_every_cut(HERMES, '<tool_call>\n{"na')
    assert reply.content == '<tool_call>\n{"na' and reply.tool_calls is None


def test_llama3_json_calls_begin_the_reply_and_are_separated_by_semicolons():
    text = (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    )
    reply = assert_same_in_every_cut(LLAMA3_JSON, text)
    assert reply.content == ""
    assert reply.tool_calls == [
        ToolCall("call_0", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_1", "get_time", '{"zone": "UTC"}'),
    ]
    tagged = assert_same_in_every_cut(LLAMA3_JSON, "<|python_tag|>" + text.split(";")[0])
    assert tagged.tool_calls == [ToolCall("call_0", "get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize(
    "text", ['{"answer": 42}', 'The weather is fine. {"name": "x", "parameters": {}}']
)
def test_llama3_text_and_json_that_are_not_calls_stay_content(text: str):
    reply = assert_same_in_every_cut(LLAMA3_JSON, text)
    assert reply.content == text and reply.tool_calls is None


QWEN_TEMPLATE_PART = (
    '{%- if tools %}...<tools></tools>...<tool_call>\\n{{\\"name\\": <function-name>}}'
    "</tool_call>{%- endif %}"
)
LLAMA31_TEMPLATE_PART = (
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"
    "{%- if builtin_tools is defined %}<|python_tag|>{% endif %}"
)


def test_the_syntax_comes_from_the_template_text():
    assert tool_call_syntax(QWEN_TEMPLATE_PART) is HERMES
    assert tool_call_syntax(LLAMA31_TEMPLATE_PART) is LLAMA3_JSON
    assert (
        tool_call_syntax("{% for message in messages %}{{ message.content }}{% endfor %}") is None
    )
    assert tool_call_syntax(None) is None


def test_content_pieces_never_hold_call_syntax():
    text = f"Checking.\n<tool_call>\n{WEATHER}\n</tool_call>\nDone."
    _, pieces = parse(HERMES, text, piece_size=2)
    content = "".join(piece.text for piece in pieces if isinstance(piece, ContentPiece))
    assert "<" not in content and "{" not in content
    assert content == "Checking.\nDone."
