"""The engine's API key: what a client must send to ``draftpen serve`` over TCP.

The Unix socket needs no key: its 0600 mode, its 0700 directory and the peer-uid
check let only this user in. TCP has none of those, so an engine listening on TCP
asks every request for this key (``Authorization: Bearer KEY`` or ``x-api-key: KEY``).

Where the key comes from, first found wins: ``serve --api-key KEY``, then
``$DRAFTPEN_API_KEY``, then the file ``api-key`` in draftpen's config directory,
created with a random key (0600, owned by this user) the first time it is needed. The
engine and the clients that start it (``draftpen launch``) read the same places, so
they agree on the key without passing it on a command line, where ``ps`` shows it.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from app.errors import DraftpenError
from app.settings import api_key_path

API_KEY_ENV = "DRAFTPEN_API_KEY"
# 32 random bytes, URL-safe base64: 43 characters that fit any header.
_KEY_BYTES = 32


@dataclass(frozen=True)
class ApiKey:
    """A key and where it came from, so messages can say where to find it."""

    value: str
    # "--api-key", "$DRAFTPEN_API_KEY", or the file's path.
    source: str
    # Made just now (the file did not exist).
    created: bool = False


def checked_key(value: str, source: str) -> str:
    """``value`` if it can travel in an HTTP header; else an error naming ``source``."""
    if not value or any(character.isspace() or not character.isprintable() for character in value):
        raise DraftpenError(
            f"The API key from {source} is empty or holds spaces or control characters; "
            "use printable characters only (draftpen makes one itself if you set none)."
        )
    return value


def read_key_file(path: Path) -> str | None:
    """The key in ``path``; None if there is no file. A file other users may read is
    made private (0600) first; one that belongs to another user is refused."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise DraftpenError(f"{path} is not a file; remove it and draftpen makes a new key.")
    if info.st_uid != os.getuid():
        raise DraftpenError(
            f"{path} belongs to another user (uid {info.st_uid}); remove it and draftpen "
            "makes a new key."
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        path.chmod(0o600)  # someone loosened it: the key is only ever this user's
    text = path.read_text(encoding="utf-8").strip()
    return checked_key(text, os.fspath(path)) if text else None


def stored_api_key(path: Path | None = None) -> ApiKey:
    """The key kept in ``path`` (default: ``api-key`` in the config directory), made
    (random, 0600) if there is none yet."""
    path = path if path is not None else api_key_path()
    existing = read_key_file(path)
    if existing is not None:
        return ApiKey(existing, os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(_KEY_BYTES)
    # Written whole beside it, then linked into place: two processes making a key at
    # the same moment agree on the one that got there first, and nobody reads half a key.
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(key + "\n")
        try:
            if path.exists():
                path.unlink()  # an empty file: replaced
            os.link(scratch, path)
        except FileExistsError:
            winner = read_key_file(path)
            if winner is None:
                raise DraftpenError(f"{path} is empty; remove it and run again.") from None
            return ApiKey(winner, os.fspath(path))
    finally:
        scratch.unlink(missing_ok=True)
    return ApiKey(key, os.fspath(path), created=True)


def engine_api_key(explicit: str | None = None, path: Path | None = None) -> ApiKey:
    """The key the engine asks TCP clients for: ``explicit`` (``--api-key``), else
    ``$DRAFTPEN_API_KEY``, else the stored key (made once)."""
    if explicit is not None:
        return ApiKey(checked_key(explicit, "--api-key"), "--api-key")
    from_env = os.environ.get(API_KEY_ENV, "").strip()
    if from_env:
        return ApiKey(checked_key(from_env, f"${API_KEY_ENV}"), f"${API_KEY_ENV}")
    return stored_api_key(path)
