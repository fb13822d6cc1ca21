"""Checking one table of a catalog file at a time: its keys, their types, its names.

:class:`TableReader` is what :mod:`app.models.model_entries` and
:mod:`app.models.pair_entries` read their tables with, so every catalog mistake is a
:class:`~app.errors.CatalogError` worded the same way and naming the table as TOML
writes it (:func:`table_name`).
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

from app.errors import CatalogError

# Keys become file names in the model store and arguments on the command line.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


_BARE_TOML_KEY = re.compile(r"[A-Za-z0-9_-]+")


def table_name(*keys: str) -> str:
    """A table's name as TOML writes it, e.g. ``[models."qwen2.5-coder".sources]``."""
    return "[" + ".".join(k if _BARE_TOML_KEY.fullmatch(k) else f'"{k}"' for k in keys) + "]"


class TableReader:
    """Checks one table at a time: required and optional keys, their types, no others."""

    def __init__(self, origin: str, *, allow_local: bool = False) -> None:
        self.origin = origin
        self.allow_local = allow_local

    def fail(self, where: str, problem: str) -> NoReturn:
        raise CatalogError(f"Model catalog {self.origin}: {where}: {problem}.")

    def take(
        self,
        table: dict[str, Any],
        where: str,
        required: dict[str, type],
        optional: dict[str, type] | None = None,
    ) -> dict[str, Any]:
        allowed = {**required, **(optional or {})}
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            self.fail(where, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        missing = [key for key in required if key not in table]
        if missing:
            self.fail(where, f"missing key(s) {', '.join(missing)}")
        for key, value in table.items():
            expected = allowed[key]
            # bool is an int in Python but never a valid size or count here.
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                kind = {dict: "a table", int: "an integer", str: "a string"}[expected]
                self.fail(where, f"{key} must be {kind}, not {value!r}")
        return table

    def subtables(self, table: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
        for key, value in table.items():
            if not isinstance(value, dict):
                self.fail(f"[{where}]", f"{key} must be a table, not {value!r}")
            if not _KEY_PATTERN.fullmatch(key):
                self.fail(
                    f"[{where}]",
                    f"name {key!r} may hold only letters, digits, '.', '_' and '-'",
                )
        return table
