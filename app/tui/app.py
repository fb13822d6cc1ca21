"""The Textual app: owns settings, the chat history and its link to the engine.

Screens live in ``screens/``, widgets in ``widgets/``, styles in ``app.tcss``. The UI
shows at once; behind it a thread worker finds the engine (``draftpen serve``) on its
socket, starting one if none runs, attaches to it and asks it to load the pair. Nothing
here decodes: the chat screen streams replies from the engine through ``app.client``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.worker import WorkerError

from app.chats.history import History
from app.client import EngineClient, EngineLost, EngineRequestError, ensure_engine
from app.client.wire import LoadedPairReport
from app.errors import DraftpenError
from app.models.command_line_pairs import command_line_pair_files
from app.settings import Settings, load_settings, save_settings
from app.tui.models_service import ModelsService
from app.tui.screens.chat import ChatScreen
from app.tui.screens.help import HelpScreen
from app.tui.screens.models import ModelsScreen
from app.tui.screens.settings import SettingsScreen
from app.tui.widgets.chat_list import ChatList
from app.tui.widgets.message_view import MessageView
from app.tui.widgets.prompt_input import PromptInput
from app.tui.widgets.stats_bar import StatsBar

# (settings, status callback) -> a client of a running engine, started if need be;
# raises a DraftpenError whose message names the fix (the socket is someone else's...).
EngineConnector = Callable[[Settings, Callable[[str], None]], EngineClient]
ModelsServiceFactory = Callable[[], ModelsService]
# What the engine answers when the pair is not downloaded.
MODEL_NOT_FOUND = "model_not_found"


def connect_to_engine(settings: Settings, on_status: Callable[[str], None]) -> EngineClient:
    """The engine on the usual socket; one is started in the background if none runs."""
    return ensure_engine(settings, on_status=on_status)


class DraftpenApp(App[None]):
    """draftpen's chat app."""

    TITLE = "draftpen"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("f1", "help", "Help"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+o", "models", "Models"),
        Binding("ctrl+t", "toggle_provenance", "Draft colours"),
    ]

    def __init__(
        self,
        *,
        connect: EngineConnector = connect_to_engine,
        models_service: ModelsServiceFactory = ModelsService,
        history: History | None = None,
        settings: Settings | None = None,
        pair_name: str | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else load_settings()
        self.history = history if history is not None else History()
        self.pair_name = pair_name or self.settings.default_pair
        # The engine we talk to, and what it loaded for us (None until it has).
        self.client: EngineClient | None = None
        self.loaded: LoadedPairReport | None = None
        self.engine_status = "Looking for the draftpen engine…"
        self._connect = connect
        # Holds the attach connection: an engine we started stays while we are here.
        self._attachment = contextlib.ExitStack()
        self._models_service = models_service
        # The main screen; it starts the first load once it is on screen.
        self.chat_screen = ChatScreen()

    def get_default_screen(self) -> Screen[None]:
        return self.chat_screen

    # -- the engine ------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether the engine holds this app's pair, so a message can be sent."""
        return self.client is not None and self.loaded is not None

    def load_pair(self, pair_name: str) -> None:
        """Have the engine load a pair (connecting first if need be), behind the UI.

        Refused while a reply is being written: the engine would queue the load behind
        it, and the reply would be written by the old pair while the app names the new.
        """
        if self.chat_screen.reply is not None:
            self.notify("Stop the reply (Esc) before switching pairs.", severity="warning")
            return
        self.pair_name = pair_name
        self.loaded = None
        self._set_engine_status(f"Loading {pair_name}…")
        self._load_pair(pair_name, self.settings)

    def restart_engine(self, reason: str) -> None:
        """The engine went away: say so, start a new one and load the pair again."""
        self.forget_engine()
        self.loaded = None
        self._set_engine_status(f"{reason} Restarting the engine…")
        self._load_pair(self.pair_name, self.settings)

    def give_up_on_engine(self, reason: str) -> None:
        """The engine crashed again: let it go and say why; nothing starts it again."""
        self.forget_engine()
        self.loaded = None
        self._set_engine_status(reason)

    def forget_engine(self) -> None:
        """Drop the client and the attach connection (the engine is gone)."""
        self._attachment.close()
        self._attachment = contextlib.ExitStack()
        self.client = None

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _load_pair(self, pair_name: str, settings: Settings) -> None:
        def status(text: str) -> None:
            self.call_from_thread(self._set_engine_status, text)

        def progress(text: str) -> None:
            status(f"{pair_name}: {text}…")

        for attempt in range(2):  # a second time only when the engine we knew is gone
            try:
                client = self.client or self._attach(self._connect(settings, status))
                loaded = client.load(
                    pair_name,
                    on_progress=progress,
                    context_length=settings.context_length,
                    exact=settings.exact_output,
                    # A --target/--draft pair is this process's: the engine (a new one
                    # after a restart too) learns it from its files.
                    files=command_line_pair_files(pair_name),
                )
            except EngineLost as error:
                self.call_from_thread(self.forget_engine)
                if attempt == 0:
                    continue
                self.call_from_thread(self._engine_failed, str(error))
                return
            except EngineRequestError as error:
                if error.code == MODEL_NOT_FOUND:  # the engine's words suit agents, not us
                    problem = (
                        f"{pair_name} is not downloaded. Download it here (Ctrl+O), or run: "
                        f"draftpen models pull {pair_name}"
                    )
                    self.call_from_thread(self._engine_failed, problem, missing=True)
                else:
                    self.call_from_thread(self._engine_failed, str(error))
                return
            except DraftpenError as error:
                self.call_from_thread(self._engine_failed, str(error))
                return
            except Exception as error:  # a bug: show it rather than die with a worker traceback
                problem = f"unexpected {type(error).__name__}: {error}"
                self.call_from_thread(self._engine_failed, problem)
                return
            self.call_from_thread(self._pair_ready, pair_name, loaded)
            return

    def _attach(self, client: EngineClient) -> EngineClient:
        """Hold the attach connection for as long as the app runs (worker thread)."""
        self._attachment.enter_context(client.attach())
        self.client = client
        return client

    def _set_engine_status(self, text: str) -> None:
        self.engine_status = text
        self.chat_screen.query_one(StatsBar).show_status(text)

    def _pair_ready(self, pair_name: str, loaded: LoadedPairReport) -> None:
        if pair_name != self.pair_name:  # a newer load was asked for meanwhile
            return
        self.loaded = loaded
        heads = " + ".join(f"{head} head" for head in loaded.heads)
        draft = loaded.draft or heads or "n-gram drafts only"
        self._set_engine_status(f"Ready: {pair_name} ({loaded.target} + {draft})")

    def _engine_failed(self, message: str, *, missing: bool = False) -> None:
        self._set_engine_status(f"Cannot load {self.pair_name}: {message}")
        if missing:  # send the person where they can download it
            self.action_models()
            return
        self.notify(message, title=f"Cannot load {self.pair_name}", severity="error", timeout=15)

    # -- actions -----------------------------------------------------------------------

    def action_help(self) -> None:
        """Show every key binding."""
        sections = [
            ("Anywhere", list(self.BINDINGS)),
            ("Chat", list(ChatScreen.BINDINGS)),
            ("Prompt", list(PromptInput.BINDINGS)),
            ("Chat list (Ctrl+L)", list(ChatList.BINDINGS)),
            ("A message (Tab to it)", list(MessageView.BINDINGS)),
            ("Settings", list(SettingsScreen.BINDINGS)),
            ("Models (Ctrl+O)", list(ModelsScreen.BINDINGS)),
        ]
        self.push_screen(HelpScreen(sections))

    def action_settings(self) -> None:
        """Open the settings screen; saving writes settings.toml."""

        def saved(settings: Settings | None) -> None:
            if settings is None:
                return
            try:
                path = save_settings(settings)
            except DraftpenError as error:
                self.notify(str(error), severity="error")
                return
            reload = self.loaded is not None and (
                settings.exact_output != self.settings.exact_output
                or settings.context_length != self.settings.context_length
            )
            self.settings = settings
            self.notify(f"Settings saved to {path}")
            if reload:  # both are fixed when the models load: the engine reloads
                self.load_pair(self.pair_name)

        self.push_screen(SettingsScreen(self.settings), saved)

    def action_models(self) -> None:
        """The models screen: choose, download or delete pairs."""

        def picked(pair_name: str | None) -> None:
            # Even the app's own pair: another client may have had the engine switch
            # (the screen showed what the engine holds); a load of the held pair is free.
            if pair_name:
                self.load_pair(pair_name)

        try:
            service = self._models_service()
        except DraftpenError as error:
            self.notify(str(error), title="Cannot read the catalog", severity="error")
            return
        screen = ModelsScreen(service, self.pair_name, self.client)
        self.push_screen(screen, picked)
        screen.call_after_refresh(screen.select_pair, self.pair_name)

    async def action_toggle_provenance(self) -> None:
        """Switch between draft-tinted text and rendered Markdown."""
        enabled = not self.has_class("-provenance")
        for view in self.query(MessageView):
            await view.show_provenance(enabled)
        self.set_class(enabled, "-provenance")

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        chat = self.chat_screen
        yield SystemCommand("New chat", "Start a new conversation", chat.action_new_chat)
        yield SystemCommand("Rename chat", "Rename the open chat", chat.action_rename_chat)
        yield SystemCommand("Delete chat", "Delete the open chat", chat.delete_current_chat)
        yield SystemCommand("Export chat", "Write the chat to a Markdown file", chat.action_export)
        yield SystemCommand("Copy last reply", "Copy it to the clipboard", chat.action_copy_reply)
        yield SystemCommand(
            "Copy last code block", "Copy the last reply's last code block", chat.action_copy_code
        )
        yield SystemCommand("Settings", "Sampling, drafting, system prompt", self.action_settings)
        yield SystemCommand("Models", "Choose, download or delete pairs", self.action_models)
        yield SystemCommand(
            "Toggle draft colours",
            "Tint tokens accepted from the draft",
            self.action_toggle_provenance,
        )
        yield SystemCommand("Keys", "Every key binding", self.action_help)

    async def on_unmount(self) -> None:
        # Closing a reply's stream cancels it in the engine; the engine itself stays
        # (one started for us stops once idle with no client attached).
        self.chat_screen.action_stop()
        try:
            # Every worker ends before the attachment and the history close. One that
            # was cancelled (a closing screen's, or one a newer load replaced) has
            # ended too, and one that failed has said so already: neither may stop
            # the rest of the shutdown, which would leave the history open.
            for worker in list(self.workers):
                with contextlib.suppress(WorkerError):
                    await worker.wait()
        finally:
            self._attachment.close()
            self.history.close()
