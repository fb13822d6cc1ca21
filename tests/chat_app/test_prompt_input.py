"""The prompt box sends what was typed, however fast the keys come."""

from __future__ import annotations

import asyncio

from textual import events, on
from textual.app import App, ComposeResult

from app.tui.widgets.prompt_input import PromptInput


class PromptApp(App[None]):
    """Just the prompt box, recording what it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def compose(self) -> ComposeResult:
        yield PromptInput(id="prompt")

    @on(PromptInput.Submitted)
    def _record(self, event: PromptInput.Submitted) -> None:
        self.sent.append(event.text)


def test_enter_in_the_same_burst_as_the_text_sends_the_text() -> None:
    """A terminal hands over "Say bye" and Enter in one read where they come at once
    (a paste ending in a newline, tmux send-keys, a fast macro): the Enter, a priority
    binding, reaches the box before the letters it queued have been inserted. Seen in
    the chat app: the first Enter did nothing, the second sent."""

    async def body() -> None:
        app = PromptApp()
        async with app.run_test() as pilot:
            app.query_one(PromptInput).focus()
            await pilot.pause()
            for character in "Say bye":
                key = "space" if character == " " else character
                app.post_message(events.Key(key, character))
            app.post_message(events.Key("enter", "\r"))
            await pilot.pause()
            await pilot.pause()
            assert app.sent == ["Say bye"]
            # Blank text still sends nothing.
            app.query_one(PromptInput).clear()
            app.post_message(events.Key("enter", "\r"))
            await pilot.pause()
            assert app.sent == ["Say bye"]

    asyncio.run(body())
