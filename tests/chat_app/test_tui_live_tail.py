"""A streaming reply redraws cheaply: its tail repaints in place, the chat follows it.

Laying the screen out again (and repainting all that moved) is what the chat app's CPU
went to while a reply streamed; these tests hold the app to doing it only when a
reply's shape changes, and check that nothing is lost or clipped on the way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown, Static

from app.chats.history import WRITING
from app.tui.widgets.live_tail import RESERVE_LINES, LiveTail
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.reasoning_view import ReasoningView
from tests.support.tui_helpers import (
    make_app,
    reply_views,
    run,
    scripted_engine,
    send,
    settle,
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
    wait_until_ready,
)

WIDTH = 60  # the test apps' width: a line of the tail holds this many characters


class LayoutCounter:
    """Counts the screen's layouts (each repaints everything that moved)."""

    def __init__(self, app: App[Any]) -> None:
        self.count = 0
        screen = app.screen
        original = screen._refresh_layout

        def counted(*args: Any, **kwargs: Any) -> None:
            self.count += 1
            original(*args, **kwargs)

        screen._refresh_layout = counted  # type: ignore[method-assign]


class TailApp(App[None]):
    """A live tail alone in a scrolling box."""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield LiveTail()


class ViewApp(App[None]):
    """One reply being written, as the chat screen shows it."""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield MessageView("assistant", state=WRITING)


class ThinkingApp(App[None]):
    """A thinking model's reasoning block, open while it thinks."""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield ReasoningView("", answered=False)


def lines(count: int) -> str:
    """``count`` full lines of words with no blank line: one unfinished paragraph."""
    return " ".join(f"word{index:02d}" for index in range(count * WIDTH // 7))


def visible_text(widget: Static) -> str:
    """What the widget draws, line by line, trailing blanks dropped."""
    strips = widget.render_lines(widget.size.region)
    return "\n".join(strip.text.rstrip() for strip in strips).rstrip()


def test_the_tail_redraws_in_place_while_its_text_fits_and_grows_in_steps() -> None:
    async def body() -> None:
        app = TailApp()
        async with app.run_test(size=(WIDTH, 30)) as pilot:
            tail = app.query_one(LiveTail)
            tail.display = False
            await pilot.pause()
            layouts = LayoutCounter(app)

            tail.show(Text("The first words"))
            await pilot.pause()
            assert tail.display and tail.size.height == 1 + RESERVE_LINES
            after_first = layouts.count
            assert after_first >= 1  # shown: the screen makes room once

            # More text, within the lines held: repainted in place, never laid out (a
            # size change costs Textual two layouts: the size, then the virtual size).
            for count in range(1, RESERVE_LINES + 1):
                text = lines(count)
                tail.show(Text(text))
                await pilot.pause()
                assert tail.size.height == 1 + RESERVE_LINES
                assert visible_text(tail).split() == text.split()  # all of it, unclipped
            assert layouts.count == after_first
            assert tail.redraws == RESERVE_LINES

            # Past them: more lines at once, one layout, and still nothing clipped.
            text = lines(RESERVE_LINES + 3)
            tail.show(Text(text))
            await pilot.pause()
            needed = tail.get_content_height(tail.size, app.size, tail.size.width)
            assert needed > 1 + RESERVE_LINES
            assert tail.size.height == needed + RESERVE_LINES
            assert visible_text(tail).split() == text.split()
            assert layouts.count > after_first

            # A block left the tail (a layout happens anyway): it gives lines back.
            tail.show(Text("A new paragraph"), resize=True)
            await pilot.pause()
            assert tail.size.height == 1 + RESERVE_LINES

            tail.finish()
            await pilot.pause()
            assert not tail.display and tail.reserved_lines == 0

    run(body)


def test_a_reply_growing_inside_its_paragraph_is_redrawn_without_laying_the_screen_out() -> None:
    async def body() -> None:
        app = ViewApp()
        async with app.run_test(size=(WIDTH + 4, 40)) as pilot:
            view = app.query_one(MessageView)
            text = lines(RESERVE_LINES)
            # The first redraw shows the tail (the screen makes room for it once).
            await view.append([(text[:20], False)], text[:20])
            await pilot.pause()
            layouts = LayoutCounter(app)
            for end in range(40, len(text), 40):  # the next redraws: more of the paragraph
                await view.append([(text[:end], False)], text[:end])
                await pilot.pause()
            assert layouts.count == 0
            assert view.query_one(Markdown).source == ""  # no block is complete yet

            # The paragraph ends and the next begins: it becomes Markdown (a layout).
            done = text + "\n\n"
            await view.append([(done + "Next", False)], done + "Next")
            await pilot.pause()
            assert view.query_one(Markdown).source == done
            assert str(view.query_one(LiveTail).render()) == "Next"
            assert layouts.count > 0

    run(body)


# Longer than the conversation is high (the app below is 24 rows), under max_tokens.
def test_reasoning_that_grows_while_the_model_thinks_is_redrawn_in_place() -> None:
    async def body() -> None:
        app = ThinkingApp()
        async with app.run_test(size=(WIDTH + 4, 40)) as pilot:
            block = app.query_one(ReasoningView)
            text = lines(RESERVE_LINES)
            block.show(text[:20], answered=False, tokens=5)
            await pilot.pause()
            layouts = LayoutCounter(app)
            # (The same token count: the title's own count is a label on its own line.)
            for end in range(40, len(text), 40):
                block.show(text[:end], answered=False, tokens=5)
                await pilot.pause()
            assert layouts.count == 0
            shown = block.query_one(".reasoning-text", Static)
            assert visible_text(shown).split() == text[:end].split()
            # The answer starts: the block collapses, and its text keeps only its lines.
            block.show(text, answered=True, tokens=len(text) // 4)
            await pilot.pause()
            assert block.collapsed and block.query_one(LiveTail).reserved_lines == 0
            assert str(shown.render()) == text

    run(body)


LONG_REPLY = "\n".join(f"Line {number} of a long answer that streams in." for number in range(22))


def test_the_conversation_follows_the_reply_until_the_person_scrolls_away() -> None:
    held_at = len(LONG_REPLY) // 2
    engine = scripted_engine([LONG_REPLY], hold_after=held_at)
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 24)) as pilot:
            await wait_until_ready(app, pilot)
            conversation = app.chat_screen.query_one("#conversation", VerticalScroll)
            prompt = app.chat_screen.query_one(PromptInput)
            await send(pilot, "Write a long answer")
            assert engine.target.holding.wait(10)
            view = await written_up_to(app, pilot, held_at)
            # Following: the end of what was written is in view.
            assert conversation.max_scroll_y > 0 and conversation.is_vertical_scroll_end
            assert view.query_one(LiveTail).region.y < conversation.region.bottom
            assert not prompt.cursor_blink  # no blinking repaints while it writes

            # Scrolled up while the rest is written: the view stays where it was put.
            conversation.scroll_to(y=0, animate=False)
            await pilot.pause()
            engine.target.release.set()
            await settle(app, pilot)
            assert view.content == LONG_REPLY
            assert conversation.scroll_y == 0 and not conversation.is_vertical_scroll_end
            assert prompt.cursor_blink

    run(body)


def test_draft_colours_alone_are_drawn_while_shown_and_markdown_catches_up_after() -> None:
    reply = "First paragraph.\n\n```python\nprint('hi')\n```\n\nLast words."
    engine = scripted_engine([reply])
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await pilot.press("ctrl+t")
            await send(pilot, "Say it")
            await settle(app, pilot)
            [view] = reply_views(app)
            tinted = view.query_one(".provenance", Static)
            assert str(tinted.render()) == reply
            # The hidden Markdown was not rendered while the reply was written...
            assert view.query_one(Markdown).source == ""
            await pilot.press("ctrl+t")
            await pilot.pause()
            # ...and is, whole, when it is shown.
            assert view.query_one(Markdown).source == reply
            assert view.query_one(Markdown).display and not tinted.display

    run(body)


def test_a_slow_redraw_never_takes_text_back_after_the_reply_is_drawn_whole() -> None:
    reply = "Some words.\n\nMore words that end the reply."
    engine = scripted_engine([reply], hold_after=15)
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Say it")
            assert engine.target.holding.wait(10)
            view = await written_up_to(app, pilot, 15)
            screen = app.chat_screen
            writing = screen.reply
            assert writing is not None
            draw, snapshot = view.append, writing.snapshot
            snapshots: list[str] = []

            def first_snapshot_is_older() -> Any:
                """The next redraw's snapshot: older than what the reply will end with."""
                segments, content, event = snapshot()
                if not snapshots:
                    content = content[:10]
                    segments = [(content, False)]
                snapshots.append(content)
                return segments, content, event

            async def slow_draw(segments: Any, content: str, *, complete: bool = False) -> bool:
                if not complete:  # a timer's redraw, caught mid-way by the reply's end
                    await asyncio.sleep(0.3)
                return await draw(segments, content, complete=complete)

            writing.snapshot = first_snapshot_is_older  # type: ignore[method-assign]
            view.append = slow_draw  # type: ignore[method-assign]
            tick = asyncio.create_task(screen._refresh_reply())
            await pilot.pause()
            engine.target.release.set()
            await settle(app, pilot)
            await tick
            await pilot.pause()
            assert snapshots[0] == reply[:10] and snapshots[-1] == reply
            assert view.content == reply and view.query_one(Markdown).source == reply
            assert not view.query_one(LiveTail).display

    run(body)


async def written_up_to(app: Any, pilot: Any, length: int) -> MessageView:
    """The reply being written, once its view shows ``length`` characters."""
    for _ in range(200):
        await pilot.pause(0.05)
        views = reply_views(app)
        if views and len(views[-1].content) >= length and views[-1].query_one(LiveTail).display:
            await pilot.pause()
            return views[-1]
    raise AssertionError("the reply never reached the held point")
