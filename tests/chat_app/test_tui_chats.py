"""The chat app's chats, through Textual's pilot: switching, surviving a restart, rename,
delete, export, a history that cannot be written, and a chat longer than the context.
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from textual.widgets import Input

from app.settings import Settings
from app.tui.widgets.chat_list import ChatList, ChatListItem
from app.tui.widgets.message_view import MessageView
from backends.sampling.filters import SamplingParams
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


def test_quitting_while_a_cancelled_worker_winds_down_still_closes_the_history() -> None:
    # A worker that was cancelled but has not ended yet when the app quits (a closing
    # screen's, or one that a newer load replaced) raised out of the shutdown and left
    # the history open.
    app = make_app({"fake": scripted_engine(["unused"])})

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # still winding down when the app unmounts
            raise

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            worker = app.run_worker(slow_to_stop(), group="winding-down")
            await pilot.pause()
            worker.cancel()

    run(body)  # the shutdown itself raises nothing
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        app.history.chats()


def test_chats_switch_and_survive_a_restart() -> None:
    engine = scripted_engine(["First answer.", "Second answer."])

    async def first_session() -> None:
        app = make_app({"fake": engine})
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "alpha question")
            await settle(app, pilot)
            await pilot.press("ctrl+n")
            await send(pilot, "beta question")
            await settle(app, pilot)
            chat_list = app.chat_screen.query_one(ChatList)
            titles = [item.chat.title for item in chat_list.query(ChatListItem)]
            assert titles == ["beta question", "alpha question"]
            chat_list.focus()
            chat_list.index = 1
            await pilot.press("enter")
            await pilot.pause()
            shown = [view.content for view in app.chat_screen.query(MessageView)]
            assert shown == ["alpha question", "First answer."]

    async def second_session() -> None:
        app = make_app({"fake": scripted_engine(["unused"])})
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            chats = app.history.chats()
            assert [chat.title for chat in chats] == ["beta question", "alpha question"]
            # The most recent chat opens; its messages are back.
            shown = [view.content for view in app.chat_screen.query(MessageView)]
            assert shown == ["beta question", "First answer."]

    run(first_session)
    run(second_session)


def test_rename_and_delete_a_chat_from_the_list() -> None:
    app = make_app({"fake": scripted_engine(["Fine."])})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "hello")
            await settle(app, pilot)
            app.chat_screen.query_one(ChatList).focus()
            await pilot.press("r")
            await pilot.pause()
            title_input = app.screen.query_one("#title", Input)
            title_input.value = "Greetings"
            await pilot.press("enter")
            await pilot.pause()
            assert [chat.title for chat in app.history.chats()] == ["Greetings"]
            app.chat_screen.query_one(ChatList).focus()
            await pilot.press("delete")
            await pilot.pause()
            await pilot.press("y")
            await pilot.pause()
            assert app.history.chats() == []
            assert not list(app.chat_screen.query(MessageView))

    run(body)


def test_export_writes_the_chat_as_markdown() -> None:
    app = make_app({"fake": scripted_engine(["Use `ls -la`."])})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "How do I list files?")
            await settle(app, pilot)
            await pilot.press("ctrl+g")
            await pilot.pause()
            path = app.chat_screen.last_export
            assert path is not None
            text = path.read_text(encoding="utf-8")
            lines = text.splitlines()
            assert lines[0] == "# How do I list files?"
            assert lines[4:] == [
                "## You",
                "",
                "How do I list files?",
                "",
                "## Assistant",
                "",
                "Use `ls -la`.",
            ]

    run(body)


def test_a_chat_longer_than_the_context_leaves_out_its_oldest_turns() -> None:
    engine = scripted_engine(["A fairly long answer to fill the context up quickly."], n_ctx=200)
    app = make_app(
        {"fake": engine}, settings=Settings(drafter="none", temperature=0.0, max_tokens=40)
    )

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            for turn in range(4):
                await send(pilot, f"question number {turn}, padded out with some words")
                await settle(app, pilot)
            assert [view.state for view in reply_views(app)] == ["complete"] * 4
            last_prompt = engine.target.token_text  # the fake decodes bytes
            prompt = "".join(last_prompt(t) for t in engine.requests[-1].prompt_tokens)
            assert "question number 3" in prompt and "question number 0" not in prompt
            assert len(engine.requests[-1].prompt_tokens) <= 200 - 40
            # The history keeps every message.
            assert len(app.history.messages(app.chat_screen.chat_id)) == 8

    run(body)


def test_a_history_that_cannot_be_written_keeps_the_typed_message_and_says_so() -> None:
    app = make_app({"fake": scripted_engine(["Saved."])})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            database = app.history._db
            # Every write now fails inside SQLite, as on a full disk or a read-only file.
            database.execute("PRAGMA query_only = ON")
            await send(pilot, "a message worth keeping")
            await pilot.pause()
            assert app.chat_screen.query_one("#prompt").text == "a message worth keeping"
            assert app.chat_screen.reply is None and not list(app.chat_screen.query(MessageView))
            assert app.history.chats() == []
            database.execute("PRAGMA query_only = OFF")  # space freed
            await pilot.press("enter")
            await settle(app, pilot)
            assert [view.content for view in app.chat_screen.query(MessageView)] == [
                "a message worth keeping",
                "Saved.",
            ]

    run(body)


def test_a_chat_turn_builds_its_sampling_once_in_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The range check of each sampling field is SamplingParams'. The app's settings
    # were checked when they were read, so a turn sends their sampling as it is and only
    # the engine builds (checks) it again from the request: once a turn, not twice.
    app = make_app({"fake": scripted_engine(["Twice two is four.", "Thrice two is six."])})
    built: list[SamplingParams] = []
    check = SamplingParams.__post_init__

    def counted(params: SamplingParams) -> None:
        check(params)
        built.append(params)

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            monkeypatch.setattr(SamplingParams, "__post_init__", counted)
            for turn in (1, 2):
                await send(pilot, f"Multiply two ({turn})")
                await settle(app, pilot)
                assert len(built) == turn
            assert built[-1].temperature == app.settings.temperature

    run(body)
