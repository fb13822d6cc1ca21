"""``draftpen cache``: what the engine keeps of prompts and replies on disk, and
clearing it.

The engine saves the state of long prompts' prefixes (an agent's system prompt and
tools) under ``<cache dir>/prefixes`` so a later engine loads them instead of reading
them (``backends/caches/disk_prefixes.py``), and its replies' tokens per tokenizer
under ``<cache dir>/history`` so a later session's repeated work is drafted from them
(``backends/caches/draft_history.py``). They hold prompts' and replies' content; this
command lists them (model, tokens, size, last used) and deletes them.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from typing import TextIO

from app.errors import DraftpenError
from app.models.disk import format_bytes
from app.settings import (
    history_index_bytes,
    history_index_dir,
    load_settings,
    prefix_cache_bytes,
    prefix_cache_dir,
)
from backends.caches.draft_history import StoredHistory, clear_histories, stored_histories
from backends.caches.prefix_store import PrefixStore, StoredPrefix


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``cache`` (list) and ``cache clear``."""
    cache = subparsers.add_parser(
        "cache",
        help="list or clear the prompt prefixes and earlier replies the engine keeps on disk",
        description="The engine keeps the state of long prompts' prefixes on disk, so a "
        "new session loads them instead of reading them again, and the tokens of its "
        "replies, so a new session's repeated work is drafted from them. They hold your "
        "prompts' and replies' content. The prefix_cache and history_index settings (or "
        "serve --prefix-cache and --history-index) set their budgets.",
    )
    cache.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cache.set_defaults(func=list_command)
    commands = cache.add_subparsers(dest="cache_command", metavar="COMMAND")
    clear = commands.add_parser("clear", help="delete every kept prefix and earlier reply")
    clear.set_defaults(func=clear_command)


def list_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Print what is kept, newest first, and the budget."""
    store = _open_store()
    entries = store.entries()
    settings = load_settings()
    budget = prefix_cache_bytes(settings.prefix_cache)
    histories = stored_histories(history_index_dir())
    history_budget = history_index_bytes(settings.history_index)
    if getattr(args, "json", False):
        json.dump(
            {
                "directory": str(store.directory),
                "budget_bytes": budget,
                "used_bytes": store.used_bytes(),
                "entries": [_as_dict(entry) for entry in entries],
                "history": {
                    "directory": str(history_index_dir()),
                    "budget_bytes": history_budget,
                    "used_bytes": sum(item.nbytes for item in histories),
                    "entries": [_history_dict(item) for item in histories],
                },
            },
            out,
            indent=2,
        )
        out.write("\n")
        return 0
    out.write(f"Prompt prefixes kept in {store.directory}\n")
    if not entries:
        out.write("none yet: the engine saves a prompt's prefix once it has read 1,024 tokens\n")
    else:
        rows = [(entry.label, entry.tokens, entry.nbytes, entry.last_used) for entry in entries]
        _write_table(("model", "last used"), rows, out)
    off = " (off: prefix_cache is 0)" if budget == 0 else ""
    out.write(
        f"{format_bytes(store.used_bytes())} used of {format_bytes(budget)}{off}; "
        "`draftpen cache clear` deletes them\n"
    )
    _list_histories(histories, history_budget, out)
    return 0


def _list_histories(histories: list[StoredHistory], budget: int, out: TextIO) -> None:
    """The earlier replies kept for drafting, per tokenizer."""
    out.write(f"\nEarlier replies kept for drafting in {history_index_dir()}\n")
    if not histories:
        out.write("none yet: the engine keeps every reply it writes (serve's history index)\n")
    else:
        rows = [(item.label, item.tokens, item.nbytes, item.modified) for item in histories]
        _write_table(("tokenizer", "last written"), rows, out)
    used = sum(item.nbytes for item in histories)
    off = " (off: history_index is 0)" if budget == 0 else ""
    out.write(f"{format_bytes(used)} on disk, {format_bytes(budget)} of RAM while serving{off}\n")


def _write_table(
    names: tuple[str, str], rows: list[tuple[str, int, int, float]], out: TextIO
) -> None:
    """A table of (label, tokens, bytes, when) rows under a header naming the first and
    last columns."""
    out.write(f"{names[0]:<48} {'tokens':>8} {'size':>10}  {names[1]}\n")
    now = time.time()
    for label, tokens, nbytes, when in rows:
        out.write(f"{label:<48} {tokens:>8,} {format_bytes(nbytes):>10}  {_ago(now - when)}\n")


def clear_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Delete every kept prefix (a running engine simply saves new ones)."""
    store = _open_store()
    freed = store.used_bytes()
    count = store.clear()
    out.write(f"Deleted {count} kept prompt prefixes ({format_bytes(freed)}).\n")
    histories, history_bytes = clear_histories(history_index_dir())
    plural = "" if histories == 1 else "s"
    out.write(
        f"Deleted the earlier replies of {histories} tokenizer{plural} "
        f"({format_bytes(history_bytes)}).\n"
    )
    return 0


def _open_store() -> PrefixStore:
    directory = prefix_cache_dir()
    try:
        # The budget matters only when saving; listing and clearing never evict.
        return PrefixStore(directory, budget_bytes=1 << 62)
    except (OSError, sqlite3.Error) as error:
        raise DraftpenError(
            f"The prompt prefix cache in {directory} cannot be opened ({error}). "
            "Check its permissions, or delete the directory: it holds nothing that "
            "cannot be rebuilt."
        ) from error


def _as_dict(entry: StoredPrefix) -> dict[str, object]:
    return {
        "model": entry.label,
        "tokens": entry.tokens,
        "bytes": entry.nbytes,
        "created": entry.created,
        "last_used": entry.last_used,
    }


def _history_dict(item: StoredHistory) -> dict[str, object]:
    return {
        "tokenizer": item.label,
        "tokens": item.tokens,
        "bytes": item.nbytes,
        "modified": item.modified,
    }


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return "just now"
