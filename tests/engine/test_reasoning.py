"""Reasoning shown apart: the streaming splitter, template detection and the thinking switch."""

from __future__ import annotations

import random

import pytest

from backends.base import ChatMessage
from backends.engine import GenerationRequest
from backends.generation_events import TextSegment
from backends.output.chat_template import CHATML_TEMPLATE
from backends.output.reasoning import (
    ReasoningFormat,
    ReasoningSplit,
    ReasoningSplitter,
    reasoning_format,
    template_has_thinking_switch,
    template_reasoning_tags,
    thinking_variables,
)
from backends.sampling.filters import SamplingParams
from tests.support.thinking_model import (
    EMPTY_THINK,
    QWEN3_TEMPLATE,
    thinking_engine,
    thinking_reply,
)

REPLY = (
    "<think>\nThe user asks for 2 + 2.\n\nThat is 4.\n</think>\n\nIt is **4**. (<think> is a tag.)"
)
REASONING = "The user asks for 2 + 2.\n\nThat is 4."
ANSWER = "It is **4**. (<think> is a tag.)"
# A template that opens the think block itself (DeepSeek-R1's newer templates do).
OPENING_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content.split('</think>')[-1] }}{% endfor %}"
    "<|assistant|><think>\n"
)


def split_in_pieces(
    text: str, size: int, reasoning: ReasoningFormat | None = None
) -> tuple[ReasoningSplit, list[ReasoningSplit]]:
    """Feed ``text`` in pieces of ``size`` characters (one token each); the total and each step."""
    splitter = ReasoningSplitter(reasoning or ReasoningFormat())
    steps = [
        splitter.feed([TextSegment(text[at : at + size], at % 2 == 0)], 1)
        for at in range(0, len(text), size)
    ]
    steps.append(splitter.finish())
    total = ReasoningSplit()
    for step in steps:
        total = total + step
    return total, steps


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, len(REPLY)])
def test_reasoning_and_answer_split_the_same_however_the_text_arrives(size: int) -> None:
    total, _ = split_in_pieces(REPLY, size)
    assert total.reasoning_text == REASONING
    assert total.answer_text == ANSWER
    # Every piece's token is counted once, on one side or the other.
    assert total.reasoning_tokens + total.answer_tokens == len(range(0, len(REPLY), size))


def test_a_partial_end_tag_is_held_back_until_it_is_known() -> None:
    splitter = ReasoningSplitter(ReasoningFormat())
    first = splitter.feed([TextSegment("<think>\nthinking </thi", False)], 4)
    assert first.reasoning_text == "thinking"
    assert first.answer_text == ""
    second = splitter.feed([TextSegment("nk>\n\nDone", False)], 3)
    assert second.reasoning_text == ""
    assert second.answer_text == "Done"
    # Something that only looked like a tag is released as reasoning.
    splitter = ReasoningSplitter(ReasoningFormat())
    splitter.feed([TextSegment("<think>a </th", False)], 1)
    assert splitter.feed([TextSegment("eory", False)], 1).reasoning_text == " </theory"


def test_token_counts_follow_the_side_each_piece_fell_on() -> None:
    _, steps = split_in_pieces(REPLY, 1)
    reasoning_chars = len(REPLY.split("</think>")[0]) + len("</think>")
    total = sum(step.reasoning_tokens for step in steps)
    assert total == reasoning_chars
    assert sum(step.answer_tokens for step in steps) == len(REPLY) - reasoning_chars


def test_provenance_survives_the_split() -> None:
    splitter = ReasoningSplitter(ReasoningFormat())
    split = splitter.feed(
        [
            TextSegment("<think>\nfrom the dr", True),
            TextSegment("aft and not\n</think>\n\nans", False),
            TextSegment("wer", True),
        ],
        9,
    )
    split = split + splitter.finish()
    assert [(s.text, s.from_draft) for s in split.reasoning] == [
        ("from the dr", True),
        ("aft and not", False),
    ]
    assert [(s.text, s.from_draft) for s in split.answer] == [("ans", False), ("wer", True)]


def test_a_reply_without_tags_is_all_answer_and_a_later_tag_is_answer_text() -> None:
    total, _ = split_in_pieces("Hello <think>x</think> there", 3)
    assert total.reasoning_text == ""
    assert total.answer_text == "Hello <think>x</think> there"


def test_a_start_that_never_completes_is_answer_at_the_end() -> None:
    splitter = ReasoningSplitter(ReasoningFormat())
    assert splitter.feed([TextSegment("<thi", False)], 1) == ReasoningSplit()
    assert splitter.finish().answer_text == "<thi"


def test_reasoning_cut_off_by_max_tokens_stays_reasoning() -> None:
    total, _ = split_in_pieces("<think>\nstill thinking when the limit came\n", 4)
    assert total.reasoning_text == "still thinking when the limit came"
    assert total.answer_text == ""


def test_a_prompt_that_opened_the_block_starts_the_reply_inside_it() -> None:
    reasoning = reasoning_format(OPENING_TEMPLATE, "<|user|>hi<|assistant|><think>\n")
    assert reasoning is not None and reasoning.starts_inside
    total, _ = split_in_pieces("short thought\n</think>\n\nHello!", 2, reasoning)
    assert (total.reasoning_text, total.answer_text) == ("short thought", "Hello!")


def test_templates_say_whether_the_model_thinks_and_whether_it_can_stop() -> None:
    assert template_reasoning_tags(QWEN3_TEMPLATE) == ("<think>", "</think>")
    assert template_has_thinking_switch(QWEN3_TEMPLATE)
    assert template_reasoning_tags(CHATML_TEMPLATE) is None
    assert not template_has_thinking_switch(CHATML_TEMPLATE)
    assert template_reasoning_tags(OPENING_TEMPLATE) == ("<think>", "</think>")
    assert not template_has_thinking_switch(OPENING_TEMPLATE)
    assert reasoning_format(CHATML_TEMPLATE, "anything") is None
    assert thinking_variables(QWEN3_TEMPLATE, False) == {"enable_thinking": False}
    assert thinking_variables(QWEN3_TEMPLATE, None) == {}
    # No switch: nothing to pass (such a model thinks regardless).
    assert thinking_variables(OPENING_TEMPLATE, False) == {}


def _generate(thinking: bool | None, drafter: str = "model") -> tuple[ReasoningSplit, object]:
    engine = thinking_engine([thinking_reply("The user wants 2+2.\nThat is 4.", "**4**")])
    text = engine.chat_prompt_text([ChatMessage("user", "2+2?")], thinking=thinking)
    reasoning = engine.reasoning_format(text)
    assert reasoning is not None
    request = GenerationRequest(
        prompt_tokens=tuple(engine.text_prompt(text)),
        params=SamplingParams(temperature=0.0),
        drafter=drafter,
        draft_tokens=4,
        max_tokens=200,
    )
    splitter = ReasoningSplitter(reasoning)
    total = ReasoningSplit()
    event = None
    for event in engine.generate(request):
        total = total + splitter.feed(event.segments, len(event.tokens))
    return total + splitter.finish(), event


def test_the_draft_model_drafts_the_reasoning_and_the_answer_in_one_generation() -> None:
    total, last = _generate(thinking=None)
    assert total.reasoning_text == "The user wants 2+2.\nThat is 4."
    assert total.answer_text == "**4**"
    assert any(segment.from_draft for segment in total.reasoning)
    assert any(segment.from_draft for segment in total.answer)
    stats = last.stats  # type: ignore[attr-defined]
    assert stats.accepted > 0
    assert total.reasoning_tokens + total.answer_tokens == stats.generated_tokens
    assert total.reasoning_tokens > total.answer_tokens > 0


def test_thinking_off_goes_through_the_templates_switch() -> None:
    engine = thinking_engine([thinking_reply("unused", "4")])
    text = engine.chat_prompt_text([ChatMessage("user", "2+2?")], thinking=False)
    assert text.endswith("<|im_start|>assistant\n" + EMPTY_THINK)
    assert not engine.chat_prompt_text([ChatMessage("user", "2+2?")]).endswith(EMPTY_THINK)
    total, _ = _generate(thinking=False)
    assert total.reasoning_text == ""
    assert total.answer_text == "**4**"
    assert total.reasoning_tokens == 0


def reference_split(text: str, starts_inside: bool) -> tuple[str, str]:
    """The split of a whole reply at once, written plainly, for the streaming one to match."""
    if starts_inside:
        body = text
    else:
        opening = text.lstrip()
        if not opening.startswith("<think>"):
            return "", text
        body = opening[len("<think>") :]
    if "</think>" in body:
        reasoning, answer = body.split("</think>", 1)
        return reasoning.strip(), answer.lstrip()
    return body.strip(), ""


@pytest.mark.parametrize("starts_inside", [False, True])
def test_random_replies_in_random_pieces_split_as_the_whole_reply_does(starts_inside: bool) -> None:
    generator = random.Random(19)
    parts = ["<think>", "</think>", "<th", "</th", "ink>", "<", "/", "\n", " ", "a", "b", "é"]
    for _ in range(400):
        text = "".join(generator.choice(parts) for _ in range(generator.randint(0, 14)))
        if not starts_inside and generator.random() < 0.5:
            text = "<think>" + text  # most replies of a thinking model open the block
        cuts = sorted(generator.sample(range(1, len(text)), max(0, min(len(text) - 1, 4))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        splitter = ReasoningSplitter(ReasoningFormat(starts_inside=starts_inside))
        total = ReasoningSplit()
        for piece in pieces:
            total = total + splitter.feed([TextSegment(piece, False)], 1)
        total = total + splitter.finish()
        expected = reference_split(text, starts_inside)
        assert (total.reasoning_text, total.answer_text) == expected, (text, pieces)
        assert total.reasoning_tokens + total.answer_tokens == len(pieces)
