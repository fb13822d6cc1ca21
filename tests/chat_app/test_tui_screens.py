"""The chat app's other screens, through Textual's pilot: settings, the models screen for a
missing pair, the pair picker, help and the command palette.
"""

from __future__ import annotations

import tomllib

from textual.widgets import Input, Select

from app.errors import ModelNotDownloadedError
from app.settings import settings_path
from app.tui.screens.help import HelpScreen
from app.tui.screens.models import ModelsScreen
from app.tui.screens.settings import SettingsScreen
from tests.chat_app.tui_replies import (
    ARTIFACTS,
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
