"""Chats and their messages in SQLite, with ordered, named migrations.

The database lives at ``<data dir>/history.sqlite3``. Its schema evolves only by
appending to :data:`MIGRATIONS`; each applied migration is recorded by name in the
``migrations`` table, so an old file is brought up to date on open and a file from a
newer draftpen (a migration we do not know) is refused instead of misread.

A reply is saved while it is written: the assistant message is inserted when
generation starts (state ``writing``) and its text updated as it grows, so a crash
mid-reply keeps what was generated. A message still ``writing`` when the file is next
opened was cut off by a crash; :meth:`History.messages` reports it as ``interrupted``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.errors import HistoryError
from app.settings import data_dir

HISTORY_FILENAME = "history.sqlite3"

# (name, SQL). Append only; never edit or reorder an entry that has shipped.
MIGRATIONS: tuple[tuple[str, str], ...] = (
    (
        "0001_chats_and_messages",
        """
        CREATE TABLE chats (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'complete',
            created_at REAL NOT NULL
        );
        CREATE INDEX messages_by_chat ON messages(chat_id, id);
        """,
    ),
    (
        "0002_message_provenance_and_stats",
        """
        ALTER TABLE messages ADD COLUMN segments TEXT;
        ALTER TABLE messages ADD COLUMN stats TEXT;
        ALTER TABLE chats ADD COLUMN pair TEXT;
        """,
    ),
    (
        # A thinking model's reasoning, kept apart from the answer in ``content`` so it
        # is never sent back to the model as answer text.
        "0003_message_reasoning",
        """
        ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
        """,
    ),
)

# Message states. "interrupted" is never stored: it is how "writing" reads after a crash.
WRITING = "writing"
COMPLETE = "complete"
STOPPED = "stopped"
INTERRUPTED = "interrupted"
FAILED = "failed"


def history_path() -> Path:
    """Where the chat history lives."""
    return data_dir() / HISTORY_FILENAME


@dataclass(frozen=True)
class Chat:
    """One conversation."""

    id: int
    title: str
    created_at: float
    updated_at: float
    pair: str | None


@dataclass(frozen=True)
class StoredMessage:
    """One message; assistant messages carry provenance segments and statistics."""

    id: int
    chat_id: int
    role: str
    content: str
    state: str
    created_at: float
    # (text, from_draft) runs that concatenate to ``content``; empty when unknown.
    segments: tuple[tuple[str, bool], ...] = ()
    stats: dict[str, object] | None = None
    # A thinking model's reasoning before the answer (empty for other messages). Never
    # part of ``content``: the conversation sent back to the model is the answers only.
    reasoning: str = ""


class History:
    """The chat store. Not thread-safe: use it from one thread (the UI's)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else history_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            # WAL: a crash mid-write never damages what was committed before it.
            self._db.execute("PRAGMA journal_mode = WAL")
            self._migrate()
        except sqlite3.DatabaseError as error:
            raise HistoryError(
                f"Cannot open the chat history {self.path}: {error}. "
                "Move the file aside to start a fresh history (nothing else is touched)."
            ) from error
        except OSError as error:
            raise HistoryError(
                f"Cannot create the chat history {self.path}: {error.strerror or error}. "
                "Check that the directory is writable (or set DRAFTPEN_HOME)."
            ) from error

    # -- schema ------------------------------------------------------------------

    def applied_migrations(self) -> list[str]:
        """Names of the migrations this file has, in the order they were applied."""
        rows = self._db.execute("SELECT name FROM migrations ORDER BY rowid").fetchall()
        return [row["name"] for row in rows]

    def _migrate(self) -> None:
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL)"
        )
        applied = self.applied_migrations()
        known = [name for name, _ in MIGRATIONS]
        unknown = [name for name in applied if name not in known]
        if unknown:
            raise HistoryError(
                f"The chat history {self.path} was written by a newer draftpen "
                f"(migration {unknown[0]}); upgrade draftpen to open it."
            )
        for name, sql in MIGRATIONS:
            if name in applied:
                continue
            # executescript commits first; BEGIN inside makes the migration atomic.
            self._db.executescript(
                f"BEGIN;\n{sql}\nINSERT INTO migrations VALUES ('{name}', {time.time()});\nCOMMIT;"
            )

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        try:
            with self._db:
                yield self._db
        except sqlite3.OperationalError as error:
            raise HistoryError(
                f"Could not save to the chat history {self.path}: {error}. "
                "Free some disk space (or check the file's permissions); "
                "what was saved before is kept."
            ) from error

    # -- chats -------------------------------------------------------------------

    def create_chat(self, title: str = "New chat", pair: str | None = None) -> Chat:
        """A new, empty chat."""
        now = time.time()
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO chats (title, created_at, updated_at, pair) VALUES (?, ?, ?, ?)",
                (title, now, now, pair),
            )
        return self.chat(int(cursor.lastrowid or 0))

    def chat(self, chat_id: int) -> Chat:
        """One chat by id (KeyError if it does not exist)."""
        row = self._db.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise KeyError(chat_id)
        return _chat_from_row(row)

    def chats(self) -> list[Chat]:
        """Every chat, most recently used first."""
        rows = self._db.execute("SELECT * FROM chats ORDER BY updated_at DESC, id DESC")
        return [_chat_from_row(row) for row in rows]

    def rename_chat(self, chat_id: int, title: str) -> None:
        """Give a chat a new title."""
        with self._write() as db:
            db.execute("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat and all its messages."""
        with self._write() as db:
            db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # -- messages ----------------------------------------------------------------

    def add_message(
        self, chat_id: int, role: str, content: str, *, state: str = COMPLETE
    ) -> StoredMessage:
        """Append a message to a chat (and mark the chat as just used)."""
        now = time.time()
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO messages (chat_id, role, content, state, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (chat_id, role, content, state, now),
            )
            db.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (now, chat_id))
        return self.message(int(cursor.lastrowid or 0))

    def update_message(
        self,
        message_id: int,
        *,
        content: str,
        segments: Sequence[tuple[str, bool]] = (),
        state: str | None = None,
        stats: dict[str, object] | None = None,
        reasoning: str | None = None,
    ) -> None:
        """Save a message's text so far (and, when it ends, its state and statistics).

        ``reasoning`` (a thinking model's, kept apart from ``content``) is left as it
        is when None.
        """
        assignments = ["content = ?", "segments = ?"]
        values: list[object] = [content, json.dumps([[text, bool(d)] for text, d in segments])]
        if reasoning is not None:
            assignments.append("reasoning = ?")
            values.append(reasoning)
        if state is not None:
            assignments.append("state = ?")
            values.append(state)
        if stats is not None:
            assignments.append("stats = ?")
            values.append(json.dumps(stats))
        with self._write() as db:
            db.execute(
                f"UPDATE messages SET {', '.join(assignments)} WHERE id = ?",
                (*values, message_id),
            )

    def message(self, message_id: int) -> StoredMessage:
        """One message by id (KeyError if it does not exist)."""
        row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        return _message_from_row(row)

    def messages(self, chat_id: int) -> list[StoredMessage]:
        """A chat's messages in order."""
        rows = self._db.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [_message_from_row(row) for row in rows]

    def close(self) -> None:
        """Close the database."""
        self._db.close()


def _chat_from_row(row: sqlite3.Row) -> Chat:
    return Chat(
        id=row["id"],
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        pair=row["pair"],
    )


def _message_from_row(row: sqlite3.Row) -> StoredMessage:
    segments = tuple((text, bool(draft)) for text, draft in json.loads(row["segments"] or "[]"))
    state = INTERRUPTED if row["state"] == WRITING else row["state"]
    return StoredMessage(
        id=row["id"],
        chat_id=row["chat_id"],
        role=row["role"],
        content=row["content"],
        state=state,
        created_at=row["created_at"],
        segments=segments,
        stats=json.loads(row["stats"]) if row["stats"] else None,
        reasoning=row["reasoning"],
    )
