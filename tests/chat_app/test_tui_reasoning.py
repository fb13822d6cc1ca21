"""The chat app with a model that thinks: reasoning dimmed, collapsible, above the answer.

Driven through Textual's pilot; the model is
:class:`~tests.support.thinking_model.ThinkingByteModel` (Qwen3's chat template over
scripted replies) with an identical draft model.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from textual.widgets import Collapsible, Markdown, Select, Static

from app.chats.history import History
from app.settings import Settings, settings_path
from app.tui.screens.settings import SettingsScreen
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.reasoning_view import THINKING_TITLE, ReasoningView
from tests.support.scripted_tools import prompt_text
from tests.support.thinking_model import EMPTY_THINK, ThinkingByteModel, thinking_reply
from tests.support.tui_helpers import (
    RecordingEngine,
    make_app,
    run,
    send,
    settle,
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "test-artifacts"
REASONING = (
    "The user wants a function that doubles a number.\n"
    "Multiplying by two is the plainest way; no edge cases beyond types."
)
ANSWER = "Here it is:\n\n```python\ndef double(x):\n    return x * 2\n```\n"
REPLY = thinking_reply(REASONING, ANSWER)
SETTINGS = Settings(default_pair="fake", drafter="model", draft_tokens=4, temperature=0.0)


def thinking_app(
    hold_after: int | None = None, settings: Settings = SETTINGS
) -> tuple[object, RecordingEngine, ThinkingByteModel]:
    target = ThinkingByteModel([REPLY, "<think>\nAgain.\n</think>\n\nSame."], hold_after=hold_after)
    draft = ThinkingByteModel([REPLY, "<think>\nAgain.\n</think>\n\nSame."], name="draft")
    engine = RecordingEngine(target, draft)
    return make_app({"fake": engine}, settings=settings), engine, target


def reply_view(app) -> MessageView:  # type: ignore[no-untyped-def]
    return [view for view in app.chat_screen.query(MessageView) if view.role == "assistant"][-1]


async def wait_for(pilot, condition, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(400):
        if condition():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_reasoning_shows_open_while_thinking_then_collapses_above_the_answer() -> None:
    # The target stops mid-reasoning until released, so the open block can be seen.
    app, engine, target = thinking_app(hold_after=len("<think>\n") + 40)

    async def body() -> None:
        async with app.run_test(size=(110, 36)) as pilot:  # type: ignore[attr-defined]
            await wait_for(pilot, lambda: app.ready, "the engine")
            await send(pilot, "Write double()")
            await wait_for(
                pilot,
                lambda: target.holding.is_set() and reply_view(app).query(".reasoning-text"),
                "the reasoning to show",
            )
            view = reply_view(app)
            reasoning = view.query_one(ReasoningView)
            assert not reasoning.collapsed
            assert reasoning.title.startswith(THINKING_TITLE + " (")  # tokens so far
            shown = str(reasoning.query_one(".reasoning-text", Static).render())
            assert shown and REASONING.startswith(shown)
            assert "<think>" not in shown
            assert view.query_one(Markdown).source == ""
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(ARTIFACTS / "chat-thinking.svg"))  # type: ignore[attr-defined]
            target.release.set()
            await settle(app, pilot)  # type: ignore[arg-type]

            view = reply_view(app)
            reasoning = view.query_one(ReasoningView)
            assert reasoning.collapsed
            assert str(reasoning.query_one(".reasoning-text", Static).render()) == REASONING
            assert view.query_one(Markdown).source == ANSWER
            assert view.content == ANSWER
            # Above the answer, and the figures say how much was reasoning.
            children = list(view.children)
            assert children.index(reasoning) < children.index(view.query_one(Markdown))
            reasoning_tokens = len(f"<think>\n{REASONING}\n</think>")
            assert reasoning.title == f"Reasoning ({reasoning_tokens} tokens)"
            assert f"({reasoning_tokens} reasoning)" in view.footer_text
            # The draft model drafted across the boundary, in one generation.
            last = engine.events[-1]
            assert last.stats.accepted > 0 and len(engine.requests) == 1

            # Opened again by a click on its title; the screenshot shows it dimmed.
            await pilot.click("ReasoningView CollapsibleTitle")
            await pilot.pause()
            assert not reasoning.collapsed
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            app.save_screenshot(str(ARTIFACTS / "chat-reasoning.svg"))  # type: ignore[attr-defined]

            # History keeps them apart, and the next prompt carries only the answer.
            history: History = app.history  # type: ignore[attr-defined]
            stored = history.message(view.message_id or 0)
            assert (stored.content, stored.reasoning) == (ANSWER, REASONING)
            await send(pilot, "Again")
            await settle(app, pilot)  # type: ignore[arg-type]
            prompt = prompt_text(engine, -1)
            assert "def double" in prompt
            assert "plainest way" not in prompt

    run(body)
    # docs/chat-reasoning.svg is a copy of this screenshot.
    assert (ARTIFACTS / "chat-reasoning.svg").stat().st_size > 0


def test_a_restart_shows_stored_reasoning_collapsed() -> None:
    app, _, _ = thinking_app()

    async def first() -> None:
        async with app.run_test(size=(110, 36)) as pilot:  # type: ignore[attr-defined]
            await wait_for(pilot, lambda: app.ready, "the engine")
            await send(pilot, "Write double()")
            await settle(app, pilot)  # type: ignore[arg-type]

    run(first)
    again, _, _ = thinking_app()

    async def second() -> None:
        async with again.run_test(size=(110, 36)) as pilot:  # type: ignore[attr-defined]
            await pilot.pause()
            view = reply_view(again)
            reasoning = view.query_one(ReasoningView)
            assert isinstance(reasoning, Collapsible) and reasoning.collapsed
            assert str(reasoning.query_one(".reasoning-text", Static).render()) == REASONING
            assert view.query_one(Markdown).source == ANSWER

    run(second)


def test_thinking_off_in_settings_uses_the_template_switch() -> None:
    app, engine, _ = thinking_app()

    async def body() -> None:
        async with app.run_test(size=(120, 50)) as pilot:  # type: ignore[attr-defined]
            await wait_for(pilot, lambda: app.ready, "the engine")
            await pilot.press("ctrl+s")
            await pilot.pause()
            screen = app.screen  # type: ignore[attr-defined]
            assert isinstance(screen, SettingsScreen)
            screen.query_one("#thinking", Select).value = False
            await pilot.press("ctrl+s")
            await pilot.pause()
            saved = tomllib.loads(settings_path().read_text(encoding="utf-8"))
            assert saved["thinking"] is False
            await send(pilot, "Write double()")
            await settle(app, pilot)  # type: ignore[arg-type]
            view = reply_view(app)
            assert not view.query(ReasoningView)
            assert view.content == ANSWER
            assert prompt_text(engine, -1).endswith(EMPTY_THINK)

    run(body)


def test_stopping_mid_thought_keeps_the_reasoning_open_and_stored() -> None:
    app, engine, target = thinking_app(hold_after=len("<think>\n") + 30)

    async def body() -> None:
        async with app.run_test(size=(110, 36)) as pilot:  # type: ignore[attr-defined]
            await wait_for(pilot, lambda: app.ready, "the engine")
            await send(pilot, "Write double()")
            await wait_for(
                pilot,
                lambda: target.holding.is_set() and reply_view(app).query(".reasoning-text"),
                "the reasoning to show",
            )
            await pilot.press("escape")
            target.release.set()
            await settle(app, pilot)  # type: ignore[arg-type]
            view = reply_view(app)
            reasoning = view.query_one(ReasoningView)
            assert not reasoning.collapsed  # nothing else to show: it stays open
            assert reasoning.title.startswith("Reasoning (")
            assert view.content == ""
            history: History = app.history  # type: ignore[attr-defined]
            stored = history.message(view.message_id or 0)
            assert stored.state == "stopped" and stored.content == ""
            assert stored.reasoning and REASONING.startswith(stored.reasoning)
            # Nothing of it goes back to the model as an answer.
            await send(pilot, "Again")
            await settle(app, pilot)  # type: ignore[arg-type]
            assert stored.reasoning not in prompt_text(engine, -1)

    run(body)
