"""``serve``'s options for what the engine keeps between requests: conversations' KV
state in RAM (``--conversation-cache``), prompts' prefixes on disk (``--prefix-cache``)
and the index of earlier replies it drafts from (``--history-index``), each a budget
that falls back on its setting."""

from __future__ import annotations

import argparse
import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.errors import DraftpenError

if TYPE_CHECKING:
    from app.settings import Settings
    from backends.caches.draft_history import HistorySettings
    from backends.caches.prefix_store import PrefixStore

# The budgets' modules are imported when serve runs, not when `draftpen` parses its
# command line (as the rest of serve's options do).

log = logging.getLogger(__name__)


def add_cache_options(serve: argparse.ArgumentParser) -> None:
    """Add ``--conversation-cache``, ``--prefix-cache`` and ``--history-index``."""
    serve.add_argument(
        "--conversation-cache",
        default=None,
        metavar="SIZE",
        help="RAM for keeping conversations' KV state, so interleaved conversations do "
        "not re-read their prompts: auto (an eighth of RAM), 0 (off) or a size such as "
        "2GiB (default: the conversation_cache setting, auto)",
    )
    serve.add_argument(
        "--prefix-cache",
        default=None,
        metavar="SIZE",
        help="disk for keeping prompts' prefixes (an agent's system prompt and tools) "
        "across engines, so a new session loads them instead of reading them: auto (a "
        "fifth of the free disk, at most 20 GiB), 0 (off) or a size such as 8GiB "
        "(default: the prefix_cache setting, auto); `draftpen cache` lists and clears it",
    )
    serve.add_argument(
        "--history-index",
        default=None,
        metavar="SIZE",
        help="RAM for the index of earlier replies (kept on disk too, per tokenizer) that "
        "the n-gram drafter drafts from, so repeated work in a new session is drafted for "
        "free: auto (48 MiB, about a million tokens), 0 (off: nothing is remembered) or "
        "a size such as 128MiB (default: the history_index setting, auto); `draftpen "
        "cache` lists and clears it",
    )


def prefix_cache_bytes_from(option: str | None, settings: Settings) -> int:
    """The disk budget ``--prefix-cache`` (else the setting) allows for prompt
    prefixes; 0: off. ``serve`` reads it in its front, so a bad size is said before the
    runtime process starts."""
    from app.settings import prefix_cache_bytes

    return _budget(option, settings.prefix_cache, prefix_cache_bytes, "--prefix-cache")


def prefix_store_from(option: str | None, settings: Settings) -> PrefixStore | None:
    """The disk cache of prompt prefixes ``--prefix-cache`` (else the setting) asks
    for; None when it is off or its directory cannot be made."""
    return open_prefix_store(prefix_cache_bytes_from(option, settings))


def open_prefix_store(budget: int) -> PrefixStore | None:
    """The disk cache of prompt prefixes with ``budget`` bytes; None when the budget is
    0 or its directory cannot be made (logged: the engine runs without it)."""
    from app.settings import prefix_cache_dir
    from backends.caches.prefix_store import PrefixStore

    if budget == 0:
        return None
    directory = prefix_cache_dir()
    try:
        return PrefixStore(directory, budget)
    except (OSError, sqlite3.Error) as error:
        log.warning("prefix cache off: %s cannot be used (%s)", directory, error)
        return None


def history_settings_from(option: str | None, settings: Settings) -> HistorySettings | None:
    """The history index ``--history-index`` (else the setting) asks for; None: off."""
    from app.settings import history_index_bytes, history_index_dir
    from backends.caches.draft_history import HistorySettings

    budget = _budget(option, settings.history_index, history_index_bytes, "--history-index")
    if budget == 0:
        return None
    return HistorySettings(history_index_dir(), budget)


def conversation_cache_bytes_from(option: str | None, settings: Settings) -> int:
    """The budget ``--conversation-cache`` asks for, else the setting's."""
    from app.settings import conversation_cache_bytes

    return _budget(
        option, settings.conversation_cache, conversation_cache_bytes, "--conversation-cache"
    )


def _budget(option: str | None, setting: str, parse: Callable[[str], int], flag: str) -> int:
    """``parse`` of the flag's value, else of the setting's (already checked when the
    settings were read); a value the flag was given that ``parse`` refuses is said in
    the flag's words."""
    from app.settings import BYTE_SIZE_HINT

    if option is None:
        return parse(setting)
    try:
        return parse(option)
    except DraftpenError:
        raise DraftpenError(f"{flag} wants {BYTE_SIZE_HINT}, not {option!r}.") from None
