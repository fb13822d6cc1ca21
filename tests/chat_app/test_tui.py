"""The chat app writing a reply, driven through Textual's pilot against scripted (fake)
engines: streaming, stats, Esc, Markdown as it comes, provenance colours, copying, and
what is refused while it writes.
"""

from __future__ import annotations

import pytest
from textual.color import Color
from textual.widgets import Markdown, Static

from app.chats.history import STOPPED, History, history_path
from app.client.engine_client import EngineClient
from app.client.wire import HealthReport
from app.settings import Settings
from app.tui.widgets.message_view import DRAFT_STYLE, MessageView
from tests.chat_app.tui_replies import (
    ARTIFACTS,
    CODE_REPLY,
    stats_text,
)
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
