"""The chat app, driven through Textual's pilot against scripted (fake) engines."""

from __future__ import annotations

import asyncio
import sqlite3
import tomllib
from pathlib import Path

import pytest
from textual.color import Color
from textual.widgets import Input, Markdown, Select, Static

from app.chats.history import STOPPED, History, history_path
from app.client.engine_client import EngineClient
from app.client.wire import HealthReport
from app.errors import ModelNotDownloadedError
from app.settings import Settings, settings_path
from app.tui.screens.help import HelpScreen
from app.tui.screens.models import ModelsScreen
from app.tui.screens.settings import SettingsScreen
from app.tui.widgets.chat_list import ChatList, ChatListItem
from app.tui.widgets.message_view import DRAFT_STYLE, MessageView
from app.tui.widgets.stats_bar import StatsBar
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

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
CODE_REPLY = (
    "Here is the function:\n\n```python\ndef double(x):\n    return x * 2\n```\n\n"
    "And the same again:\n\n```python\ndef double(x):\n    return x * 2\n```\n"
)


def stats_text(app) -> str:  # type: ignore[no-untyped-def]
    return str(app.chat_screen.query_one(StatsBar).render())


def test_reply_streams_in_and_stats_bar_shows_the_loops_statistics() -> None:
    engine = scripted_engine([CODE_REPLY])
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double() twice")
            await settle(app, pilot)
            [view] = reply_views(app)
            assert view.content == CODE_REPLY
            assert view.query_one(Markdown).source == CODE_REPLY
            final = engine.events[-1]
            assert final.finish_reason == "stop"
            stats = final.stats
            shown = stats_text(app)
            assert f"{stats.generated_tokens} tokens" in shown
            # The rate shown is the engine's, as the stream carries it (its seconds
            # rounded to 0.1 ms on the wire).
            received = app.history.messages(app.chat_screen.chat_id)[-1].stats
            assert received is not None
            rate = received["decode_tokens_per_second"]
            wire_seconds = round(stats.decode_seconds, 4)
            assert rate == pytest.approx(stats.generated_tokens / wire_seconds, rel=1e-6)
            assert f"{rate:.1f} tok/s" in shown
            assert (
                f"accepted {stats.accepted}/{stats.drafted} ({stats.acceptance_rate:.0%})" in shown
            )
            assert f"mean accepted length {stats.mean_accepted_length:.2f}" in shown
            # The same figures stay attached to the message, and are stored with it.
            assert view.footer_text in shown
            stored = app.history.messages(app.chat_screen.chat_id)[-1]
            assert stored.content == CODE_REPLY and stored.state == "complete"
            assert stored.stats is not None
            assert stored.stats["loop"]["generated_tokens"] == stats.generated_tokens  # type: ignore[index]

    run(body)


def test_escape_stops_the_reply_at_once_and_keeps_what_was_written() -> None:
    # Held inside the second code block, where the n-gram drafter is being accepted;
    # long enough that the engine, told by the closed stream, stops far from the end.
    long_reply = CODE_REPLY * 8
    engine = scripted_engine([long_reply], hold_after=100)
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double()")
            assert engine.target.holding.wait(10)
            await pilot.press("ctrl+t")  # draft colours on, as the screenshot should show
            await pilot.pause()
            assert "tok/s" in stats_text(app) and "K=" in stats_text(app)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(ARTIFACTS / "chat-mid-generation.svg"))
            await pilot.press("escape")
            await pilot.pause()
            # Stopped at once, though the engine is still inside its round.
            assert app.chat_screen.reply is None and engine.target.holding.is_set()
            [view] = reply_views(app)
            assert len(view.content) >= 100 and long_reply.startswith(view.content)
            # The client hung up at once: the engine hears it while still held, with no
            # chunk in between to carry the news.
            assert engine.cancels[-1].wait(10)
            engine.target.release.set()
            await settle(app, pilot)
            # The stream closed; the engine stopped soon after, far short of the end.
            for _ in range(400):  # a loaded machine can take seconds
                if engine.events and engine.events[-1].finish_reason is not None:
                    break
                await pilot.pause(0.05)
            written = engine.events[-1]
            assert written.finish_reason == "cancelled"
            assert 100 <= written.stats.generated_tokens < len(long_reply) // 2
            stored = app.history.messages(app.chat_screen.chat_id)[-1]
            assert (stored.state, stored.content) == (STOPPED, view.content)
            assert "stopped" in str(view.query_one(".heading").render())

    run(body)


def test_while_writing_only_completed_blocks_are_markdown_and_the_tail_is_plain_text() -> None:
    # Held inside the first code block: the paragraph before it is done, the code is not.
    held_at = CODE_REPLY.index("return")
    engine = scripted_engine([CODE_REPLY], hold_after=held_at)
    app = make_app({"fake": engine}, settings=Settings(drafter="none", temperature=0.0))

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double()")
            assert engine.target.holding.wait(10)
            [view] = reply_views(app)
            done = "Here is the function:\n\n"
            tail = view.query_one(".tail", Static)
            # The view takes the new text first and redraws the tail after the Markdown
            # has taken its blocks (an await): wait for that one append to end.
            for _ in range(100):
                await pilot.pause(0.05)
                if len(view.content) >= held_at and str(tail.render()) == view.tail_text:
                    break
            written = view.content
            assert len(written) >= held_at and CODE_REPLY.startswith(written)
            assert view.query_one(Markdown).source == done
            assert tail.display and str(tail.render()) == written[len(done) :]
            engine.target.release.set()
            await settle(app, pilot)
            # Finished: all of it is Markdown, and the tail is gone.
            assert view.query_one(Markdown).source == CODE_REPLY
            assert not tail.display

    run(body)


def test_a_reply_is_on_disk_while_it_is_written_so_a_crash_keeps_it() -> None:
    engine = scripted_engine([CODE_REPLY], hold_after=20)
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double()")
            assert engine.target.holding.wait(10)
            for _ in range(100):
                await pilot.pause()
                # What another process (or this one after a crash) would read now.
                reader = History(history_path())
                partial = reader.messages(app.chat_screen.chat_id)[-1]
                reader.close()
                if partial.content:
                    break
            assert partial.state == "interrupted"
            assert partial.content and CODE_REPLY.startswith(partial.content)
            engine.target.release.set()
            await settle(app, pilot)

    run(body)


def test_provenance_colours_mark_draft_tokens_and_toggle_with_a_key() -> None:
    engine = scripted_engine([CODE_REPLY])
    app = make_app({"fake": engine})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double() twice")
            await settle(app, pilot)
            [view] = reply_views(app)
            assert not view.query_one(".provenance").display
            await pilot.press("ctrl+t")
            assert view.query_one(".provenance").display
            assert not view.query_one(Markdown).display
            content = view.query_one(".provenance", Static).render()
            tint = Color.parse(DRAFT_STYLE.split(" on ")[1])
            tinted = "".join(
                content.plain[span.start : span.end]
                for span in content.spans
                if getattr(span.style, "background", None) == tint
            )
            from_draft = "".join(
                segment.text
                for event in engine.events
                for segment in event.segments
                if segment.from_draft
            )
            assert tinted == from_draft and from_draft  # the n-gram drafter did help
            await pilot.press("ctrl+t")
            assert view.query_one(Markdown).display

    run(body)


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


def test_copy_the_last_reply_and_its_last_code_block() -> None:
    app = make_app({"fake": scripted_engine([CODE_REPLY])})

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "code please")
            await settle(app, pilot)
            await pilot.press("ctrl+b")
            assert app.clipboard == "def double(x):\n    return x * 2\n"
            await pilot.press("ctrl+r")
            assert app.clipboard == CODE_REPLY

    run(body)


def test_settings_screen_validates_and_saves_to_the_config_file() -> None:
    app = make_app({"fake": scripted_engine(["ok"])})

    async def body() -> None:
        async with app.run_test(size=(120, 45)) as pilot:
            await wait_until_ready(app, pilot)
            await pilot.press("ctrl+s")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, SettingsScreen)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(ARTIFACTS / "settings.svg"))
            screen.query_one("#temperature", Input).value = "abc"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert app.screen is screen  # still open, saying what is wrong
            assert "Temperature must be a number" in str(
                screen.query_one("#settings-error").render()
            )
            screen.query_one("#temperature", Input).value = "0.3"
            screen.query_one("#max_tokens", Input).value = "64"
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert not isinstance(app.screen, SettingsScreen)
            saved = tomllib.loads(settings_path().read_text(encoding="utf-8"))
            assert saved["temperature"] == 0.3 and saved["max_tokens"] == 64
            assert app.settings.max_tokens == 64
            # The next reply uses them.
            await send(pilot, "hi")
            await settle(app, pilot)
            request = app.served.engine.requests[-1]
            assert request.max_tokens == 64 and request.params.temperature == 0.3

    run(body)


def test_a_missing_pair_opens_the_models_screen_on_that_pair() -> None:
    def engines(name: str):  # type: ignore[no-untyped-def]
        raise ModelNotDownloadedError(name)

    app = make_app(engines, pair_name="missing")

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(100):
                await pilot.pause()
                if isinstance(app.screen, ModelsScreen):
                    break
            assert isinstance(app.screen, ModelsScreen)
            await pilot.pause()
            table = app.screen.query_one("#pairs")
            assert app.screen.rows[table.cursor_row].name == "missing"
            await pilot.press("escape")
            assert "draftpen models pull missing" in stats_text(app)
            await send(pilot, "hello?")
            await pilot.pause()
            assert app.history.chats() == []  # nothing was sent to a model that is not there

    run(body)


def test_pair_picker_loads_the_chosen_pair() -> None:
    engines = {"fake": scripted_engine(["from fake"]), "other": scripted_engine(["from other"])}
    app = make_app(engines)

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await pilot.press("ctrl+o")
            await pilot.pause()
            assert isinstance(app.screen, ModelsScreen)
            await pilot.press("down", "enter")
            await wait_until_ready(app, pilot)
            for _ in range(100):
                await pilot.pause()
                if app.ready and app.served.engine is engines["other"]:
                    break
            assert app.served.engine is engines["other"] and app.loaded.pair == "other"
            assert engines["fake"].target.closed  # the old pair's memory is freed
            await send(pilot, "hi")
            await settle(app, pilot)
            assert reply_views(app)[-1].content == "from other"

    run(body)


def test_help_lists_every_key_binding_and_the_palette_lists_the_actions() -> None:
    app = make_app({"fake": scripted_engine(["ok"])})

    async def body() -> None:
        async with app.run_test(size=(120, 50)) as pilot:
            await wait_until_ready(app, pilot)
            await pilot.press("f1")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            help_text = str(app.screen.query_one("#help-text").render())
            for key in ("escape", "ctrl+n", "ctrl+g", "ctrl+r", "ctrl+b", "ctrl+t", "ctrl+s", "f2"):
                assert key in help_text
            for words in ("Stop writing", "Export to Markdown", "Copy last code block"):
                assert words in help_text
            await pilot.press("escape")
            commands = {command.title for command in app.get_system_commands(app.screen)}
            assert {"New chat", "Export chat", "Settings", "Copy last code block"} <= commands

    run(body)


@pytest.mark.parametrize("hold", [None])
def test_send_while_writing_is_refused_without_losing_the_text(hold: None) -> None:
    engine = scripted_engine([CODE_REPLY], hold_after=5)
    app = make_app({"fake": engine}, settings=Settings(drafter="none", temperature=0.0))

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "first")
            assert engine.target.holding.wait(10)
            await send(pilot, "second")
            await pilot.pause()
            engine.target.release.set()
            await settle(app, pilot)
            contents = [view.content for view in app.chat_screen.query(MessageView)]
            assert contents == ["first", CODE_REPLY]

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


def test_switching_pairs_while_writing_is_refused_and_keeps_the_engine_open() -> None:
    engines = {"fake": scripted_engine([CODE_REPLY], hold_after=5), "other": scripted_engine(["x"])}
    app = make_app(engines)

    async def body() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "first")
            assert engines["fake"].target.holding.wait(10)
            app.load_pair("other")
            await pilot.pause()
            assert app.served.loaded == [engines["fake"]] and not engines["fake"].target.closed
            engines["fake"].target.release.set()
            await settle(app, pilot)
            assert reply_views(app)[-1].content == CODE_REPLY

    run(body)


def test_changing_exact_output_in_settings_reloads_the_pair() -> None:
    loads: list[str] = []

    def engines(name: str):  # type: ignore[no-untyped-def]
        loads.append(name)
        return scripted_engine(["ok"])

    app = make_app(engines)

    async def body() -> None:
        async with app.run_test(size=(120, 45)) as pilot:
            await wait_until_ready(app, pilot)
            assert loads == ["fake"] and app.settings.exact_output is False
            await pilot.press("ctrl+s")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, SettingsScreen)
            screen.query_one("#exact_output", Select).value = True
            await pilot.press("ctrl+s")
            await pilot.pause()
            await wait_until_ready(app, pilot)
            # The kernels are chosen when the models load: saving loads the pair again.
            assert app.settings.exact_output is True
            assert loads == ["fake", "fake"]

    run(body)


def test_the_stats_line_says_when_the_engine_writes_for_others_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent working on the same engine (``serve --parallel``): the chat's rate is its
    share of the machine, and the stats line says why."""
    engine = scripted_engine([CODE_REPLY * 8], hold_after=100)
    app = make_app({"fake": engine})
    real_health = EngineClient.health

    def two_agents_beside(client: EngineClient) -> HealthReport:
        report = real_health(client)
        queue = report.queue.model_copy(update={"running_count": 3})
        return report.model_copy(update={"queue": queue})

    monkeypatch.setattr(EngineClient, "health", two_agents_beside)

    async def body() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_until_ready(app, pilot)
            await send(pilot, "Write double()")
            assert engine.target.holding.wait(10)
            for _ in range(100):
                await pilot.pause(0.05)
                if "beside 2 other requests" in stats_text(app):
                    break
            assert "tok/s" in stats_text(app)
            assert "engine busy: beside 2 other requests" in stats_text(app)
            engine.target.release.set()
            await settle(app, pilot)

    run(body)
