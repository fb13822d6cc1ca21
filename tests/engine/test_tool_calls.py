"""The tool-call parser on scripted replies: every family's syntax, cut into any pieces."""

from __future__ import annotations

import itertools
import json

import pytest

from backends.base import ToolCall
from backends.output.call_syntax import HERMES, LLAMA3_JSON, ToolCallSyntax, tool_call_syntax
from backends.output.tool_call_pieces import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ParsedReply,
    ToolCallStart,
)
from backends.output.tool_calls import ToolCallParser

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


def test_a_call_cut_off_before_its_name_leaves_no_markup_in_the_content():
    # What a reply cut by max_tokens in its second call's head looked like (issue 41).
    first = f"<tool_call>\n{WEATHER}\n</tool_call>"
    for text in ('<tool_call>\n{"na', f'{first}\n<tool_call>\n{{"name": "', "Hi.\n<tool_c"):
        reply = assert_same_in_every_cut(HERMES, text)
        assert "<" not in reply.content and "{" not in reply.content, text
    reply = assert_same_in_every_cut(HERMES, f'{first}\n<tool_call>\n{{"name": "')
    assert reply.content == "" and reply.tool_calls is not None and len(reply.tool_calls) == 1


# Replies with calls in every form the parser reads, and the content each one has.
REPLIES_WITH_CALLS = [
    (HERMES, f"Checking.\n<tool_call>\n{WEATHER}\n</tool_call>\n", "Checking."),
    (HERMES, f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>", ""),
    (HERMES, f"Sure.\n```json\n{WEATHER}\n```", "Sure."),
    (HERMES, f"{{{WEATHER}}}", ""),
    (HERMES, f"Let me see. {WEATHER} Done.", "Let me see. Done."),
    (LLAMA3_JSON, '{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    (
        LLAMA3_JSON,
        '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_time", '
        '"parameters": {"zone": "UTC"}}',
        "",
    ),
]
# What no content may hold, whole or begun: the markup around calls and a call's head.
CALL_MARKUP = ("<tool_call>", "</tool_call>", "<|python_tag|>", '{"name"')


def without_fence_start(content: str) -> str:
    """``content`` less a trailing start of a fence (```` ```js ````), which is ordinary
    text at the end of a reply (many replies end a code block there)."""
    for size in range(len("```json"), 0, -1):
        if content.endswith("```json"[:size]):
            return content[:-size]
    return content


@pytest.mark.parametrize(("syntax", "text", "content"), REPLIES_WITH_CALLS)
def test_no_cut_of_a_reply_puts_call_syntax_in_its_content(
    syntax: ToolCallSyntax, text: str, content: str
):
    whole = assert_same_in_every_cut(syntax, text)
    assert whole.content == content and whole.tool_calls
    # The reply may end anywhere (max_tokens, a stop string, a cancel): its content is
    # then a start of the whole reply's content, and never holds call syntax.
    for end in range(len(text) + 1):
        cut = assert_same_in_every_cut(syntax, text[:end])
        assert content.startswith(without_fence_start(cut.content).rstrip()), (end, cut.content)
        for markup in CALL_MARKUP:
            assert markup not in cut.content, (end, cut.content)
            assert not any(cut.content.endswith(markup[:n]) for n in range(2, len(markup))), (
                end,
                cut.content,
            )


@pytest.mark.parametrize(
    ("syntax", "text"),
    [
        (HERMES, '{"name": "Ada", "ag'),  # JSON that names no tool, cut off
        (HERMES, '```json\n{"name": "Ada", "age": 3'),
        (HERMES, "Close the block:\n```"),  # a fence's backticks end many replies
        (HERMES, '{"answer": 4'),
        (LLAMA3_JSON, '{"answer": 4'),  # a bare object, but not a call's
    ],
)
def test_text_cut_off_that_cannot_be_a_call_stays_content(syntax: ToolCallSyntax, text: str):
    reply = assert_same_in_every_cut(syntax, text)
    assert reply.content == text and reply.tool_calls is None


def test_a_tool_call_block_that_holds_no_call_is_dropped_not_shown():
    reply = assert_same_in_every_cut(
        HERMES, "Before.\n<tool_call>\nnot a call\n</tool_call>\nAfter."
    )
    assert reply.content == "Before.\nAfter." and reply.tool_calls is None


def test_call_spans_say_where_each_call_is_in_the_text():
    text = f"Both.\n<tool_call>\n{WEATHER}\n</tool_call>\n{WEATHER}"
    parser = ToolCallParser(HERMES, TOOLS)
    for char in text:
        parser.feed(char)
    parser.finish()
    assert [text[start:end] for start, end in parser.call_spans] == [
        f"<tool_call>\n{WEATHER}\n</tool_call>",
        WEATHER,
    ]


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
