"""The Textual app: owns settings, the chat history and the loaded engine.

Screens live in ``screens/``, widgets in ``widgets/``, styles in ``app.tcss``. The UI
shows at once; the model pair loads in a thread worker behind it. Nothing here decodes:
the chat screen hands requests to :class:`~backends.engine.Engine`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen

from app.chats.history import History
from app.errors import DraftpenError, ModelNotDownloadedError
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
from backends.engine import Engine
from backends.errors import BackendError

# (pair name, settings, progress callback) -> a loaded engine; raises with a user message.
EngineLoader = Callable[[str, Settings, Callable[[str], None]], Engine]
ModelsServiceFactory = Callable[[], ModelsService]


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
        engine_loader: EngineLoader,
        models_service: ModelsServiceFactory = ModelsService,
        history: History | None = None,
        settings: Settings | None = None,
        pair_name: str | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings if settings is not None else load_settings()
        self.history = history if history is not None else History()
        self.pair_name = pair_name or self.settings.default_pair
        self.engine: Engine | None = None
        self.engine_status = f"Loading {self.pair_name}…"
        self._engine_loader = engine_loader
        self._models_service = models_service
        # The main screen; it starts the first load once it is on screen.
        self.chat_screen = ChatScreen()

    def get_default_screen(self) -> Screen[None]:
        return self.chat_screen

    # -- the engine ------------------------------------------------------------------

    def load_pair(self, pair_name: str) -> None:
        """Load a pair in the background, replacing the current engine.

        Refused while a reply is being written: its thread is using the engine, which
        must not be freed under it.
        """
        if self.chat_screen.reply is not None:
            self.notify("Stop the reply (Esc) before switching pairs.", severity="warning")
            return
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self.pair_name = pair_name
        self._set_engine_status(f"Loading {pair_name}…")
        self._load_engine(pair_name, self.settings)

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def _load_engine(self, pair_name: str, settings: Settings) -> None:
        def progress(text: str) -> None:
            self.call_from_thread(self._set_engine_status, f"{pair_name}: {text}…")

        try:
            engine = self._engine_loader(pair_name, settings, progress)
        except ModelNotDownloadedError as error:
            self.call_from_thread(self._engine_failed, str(error), missing=True)
            return
        except (DraftpenError, BackendError) as error:
            self.call_from_thread(self._engine_failed, str(error))
            return
        except Exception as error:  # a bug: show it rather than die with a worker traceback
            problem = f"unexpected {type(error).__name__}: {error}"
            self.call_from_thread(self._engine_failed, problem)
            return
        self.call_from_thread(self._engine_ready, pair_name, engine)

    def _set_engine_status(self, text: str) -> None:
        self.engine_status = text
        self.chat_screen.query_one(StatsBar).show_status(text)

    def _engine_ready(self, pair_name: str, engine: Engine) -> None:
        if pair_name != self.pair_name:  # a newer load was asked for meanwhile
            engine.close()
            return
        self.engine = engine
        draft = engine.draft.name if engine.draft is not None else "n-gram drafts only"
        self._set_engine_status(f"Ready: {pair_name} ({engine.target.name} + {draft})")

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
            reload = self.engine is not None and (
                settings.exact_output != self.settings.exact_output
                or settings.context_length != self.settings.context_length
            )
            self.settings = settings
            self.notify(f"Settings saved to {path}")
            if reload:  # both are fixed when the models load
                self.load_pair(self.pair_name)

        self.push_screen(SettingsScreen(self.settings), saved)

    def action_models(self) -> None:
        """The models screen: choose, download or delete pairs."""

        def picked(pair_name: str | None) -> None:
            if pair_name and (pair_name != self.pair_name or self.engine is None):
                self.load_pair(pair_name)

        try:
            service = self._models_service()
        except DraftpenError as error:
            self.notify(str(error), title="Cannot read the catalog", severity="error")
            return
        screen = ModelsScreen(service, self.pair_name)
        self.push_screen(screen, picked)
        screen.call_after_refresh(screen.select_pair, self.pair_name)

    def action_toggle_provenance(self) -> None:
        """Switch between draft-tinted text and rendered Markdown."""
        enabled = not self.has_class("-provenance")
        for view in self.query(MessageView):
            view.show_provenance(enabled)
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
        # A reply's thread may be mid-forward: stop it and let it finish its round
        # before the models it is using are freed.
        self.chat_screen.action_stop()
        await self.workers.wait_for_complete()
        if self.engine is not None:
            self.engine.close()
        self.history.close()
