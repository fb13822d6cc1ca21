"""Start the chat app as a client of the engine (``draftpen`` / ``draftpen chat``)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from app.chats.history import History
from app.client import EngineClient, ensure_engine
from app.settings import Settings
from app.tui.app import DraftpenApp, EngineConnector


def engine_connector_for(runtime: str | None) -> EngineConnector:
    """Finds the engine, or starts one (with ``--runtime`` when the user chose one)."""
    serve_options = ("--runtime", runtime) if runtime else ()

    def connect(settings: Settings, on_status: Callable[[str], None]) -> EngineClient:
        return ensure_engine(settings, on_status=on_status, serve_options=serve_options)

    return connect


def run_tui(args: argparse.Namespace, settings: Settings) -> int:
    """Run the chat app until the user quits; errors before it starts are raised.

    ``settings`` carry this run's command-line overrides; the settings screen saves
    what the user edits there.
    """
    # Library warnings on stderr would be drawn over the full-screen UI; the models
    # screen reports download problems itself.
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    app = DraftpenApp(
        connect=engine_connector_for(args.runtime),
        history=History(),
        settings=settings,
        pair_name=args.pair,
    )
    app.run()
    return 0
