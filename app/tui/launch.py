"""Start the chat app with the real engine loader and catalog (``draftpen`` / ``draftpen chat``)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from app.chats.history import History
from app.loading import load_engine
from app.settings import Settings
from app.tui.app import DraftpenApp
from backends.engine import Engine


def engine_loader_for(runtime: str | None) -> Callable[..., Engine]:
    """Loads a pair with its draft model and this machine's measured costs."""

    def load(pair_name: str, settings: Settings, progress: Callable[[str], None]) -> Engine:
        return load_engine(
            pair_name,
            n_ctx=settings.context_length,
            runtime=runtime,
            exact_output=settings.exact_output,
            on_progress=progress,
        )

    return load


def run_tui(args: argparse.Namespace, settings: Settings) -> int:
    """Run the chat app until the user quits; errors before it starts are raised.

    ``settings`` carry this run's command-line overrides; the settings screen saves
    what the user edits there.
    """
    # Library warnings on stderr would be drawn over the full-screen UI; the models
    # screen reports download problems itself.
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    app = DraftpenApp(
        engine_loader=engine_loader_for(args.runtime),
        history=History(),
        settings=settings,
        pair_name=args.pair,
    )
    app.run()
    return 0
