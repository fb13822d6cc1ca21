"""A local stand-in for the Hugging Face hub, on a real socket, for download tests.

It speaks the part of the hub's protocol huggingface_hub 2.4.0 uses to download:

- ``HEAD /{repo}/resolve/{revision}/{filename}``: ``X-Repo-Commit``, ``ETag`` (git blob
  sha1 of small files), and for LFS files ``X-Linked-Etag`` (sha256) and
  ``X-Linked-Size``; ``Content-Length``.
- ``GET`` of the same path, honouring ``Range: bytes=N-`` with ``206`` and
  ``Content-Range``.
- ``GET /api/models/{repo}/revision/{revision}`` (``?blobs=true``): the commit and the
  siblings with size, blobId and lfs {sha256, size}, as ``HfApi.model_info`` reads them.

Knobs make it misbehave the ways a real network does: drop the connection part-way
through a file, answer with a status (500, 503) for a while, serve corrupted bytes,
require a token (a gated repository). Every request is logged with its Range header and
the body bytes actually sent, so tests can prove what was (not) fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_MIN_BYTES = 1024  # the hub stores bigger files in LFS; smaller ones are plain git blobs
CHUNK_BYTES = 256 * 1024
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass
class HubRepo:
    """One repository: its files (bytes, or a path to stream from) at one commit."""

    commit: str
    files: dict[str, bytes | Path]
    token: str | None = None
    """When set, requests without ``Authorization: Bearer <token>`` get a gated-repo 401."""


@dataclass(frozen=True)
class Served:
    """One request as the server saw it."""

    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


@dataclass
class Knobs:
    """Misbehaviour, set by tests between requests."""

    drop_after_bytes: int | None = None
    """Close the socket after sending this many body bytes of the next file GET."""
    status_after_drop: int | None = None
    """After a drop, answer every request with this status until reset."""
    status: int | None = None
    """Answer every request with this status."""
    corrupt: set[str] = field(default_factory=set)
    """File names whose served bytes have one byte flipped (headers stay right)."""


class FakeHub:
    """A threaded HTTP server; use as a context manager, point HF_ENDPOINT at ``url``."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.knobs = Knobs()
        self.log: list[Served] = []
        self._lock = threading.Lock()
        self._sha256: dict[tuple[str, str], str] = {}
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The endpoint, e.g. ``http://127.0.0.1:40123``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(
        self,
        repo: str,
        files: dict[str, bytes | Path],
        *,
        commit: str | None = None,
        token: str | None = None,
    ) -> HubRepo:
        """Serve ``files`` as ``repo`` at ``commit`` (a made-up hash by default)."""
        commit = commit or hashlib.sha1(repo.encode()).hexdigest()
        self.repos[repo] = HubRepo(commit, dict(files), token)
        return self.repos[repo]

    def sha256(self, repo: str, filename: str) -> str:
        """The sha256 of a served file (computed once)."""
        key = (repo, filename)
        if key not in self._sha256:
            hasher = hashlib.sha256()
            for chunk in _chunks(self.repos[repo].files[filename], 0):
                hasher.update(chunk)
            self._sha256[key] = hasher.hexdigest()
        return self._sha256[key]

    def file_gets(self, filename: str) -> list[Served]:
        """The GET requests for a file, in order."""
        return [s for s in self.log if s.method == "GET" and s.path.endswith("/" + filename)]

    def record(self, served: Served) -> None:
        with self._lock:
            self.log.append(served)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _size(data: bytes | Path) -> int:
    return len(data) if isinstance(data, bytes) else data.stat().st_size


def _chunks(data: bytes | Path, start: int):
    if isinstance(data, bytes):
        for offset in range(start, len(data), CHUNK_BYTES):
            yield data[offset : offset + CHUNK_BYTES]
        return
    with data.open("rb") as reader:
        reader.seek(start)
        while chunk := reader.read(CHUNK_BYTES):
            yield chunk


def _git_blob_sha1(data: bytes | Path) -> str:
    payload = data if isinstance(data, bytes) else data.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(payload) + payload).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the hub's own log is what tests read

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        hub = self.server_hub
        path = urlsplit(self.path).path
        knobs = hub.knobs
        if knobs.status is not None:
            return self._status(knobs.status, "Server error")
        if knobs.status_after_drop is not None and knobs.drop_after_bytes is None:
            return self._status(knobs.status_after_drop, "Service unavailable")
        api = re.fullmatch(r"/api/models/(.+?)(?:/revision/([^/]+))?", path)
        if api:
            return self._model_info(unquote(api.group(1)), api.group(2))
        resolve = re.fullmatch(r"/(.+?/.+?)/resolve/([^/]+)/(.+)", path)
        if not resolve:
            return self._status(404, "Not found", error_code="RepoNotFound")
        repo_name, revision, filename = (unquote(part) for part in resolve.groups())
        repo = hub.repos.get(repo_name)
        if repo is None:
            return self._status(404, "Repository not found", error_code="RepoNotFound")
        if not self._authorised(repo):
            return self._status(401, "Access to this model is restricted", error_code="GatedRepo")
        if revision != repo.commit and _COMMIT.fullmatch(revision) is None and revision != "main":
            return self._status(404, "Revision not found", error_code="RevisionNotFound")
        data = repo.files.get(filename)
        if data is None:
            return self._status(404, "Entry not found", error_code="EntryNotFound")
        commit = revision if _COMMIT.fullmatch(revision) else repo.commit
        self._file(hub, repo_name, commit, filename, data, head=head)

    def _authorised(self, repo: HubRepo) -> bool:
        return repo.token is None or self.headers.get("Authorization") == f"Bearer {repo.token}"

    def _file(
        self,
        hub: FakeHub,
        repo: str,
        commit: str,
        filename: str,
        data: bytes | Path,
        *,
        head: bool,
    ) -> None:
        size = _size(data)
        start = 0
        range_header = self.headers.get("Range")
        if range_header and not head:
            match = re.fullmatch(r"bytes=(\d+)-", range_header.strip())
            if match:
                start = int(match.group(1))
        status = 206 if start else 200
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        if size >= LFS_MIN_BYTES:
            # An LFS file: its sha256 is its etag, and its size is published too.
            self.send_header("ETag", f'"{hub.sha256(repo, filename)}"')
            self.send_header("X-Linked-Etag", f'"{hub.sha256(repo, filename)}"')
            self.send_header("X-Linked-Size", str(size))
        else:
            self.send_header("ETag", f'"{_git_blob_sha1(data)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        if head:
            hub.record(Served("HEAD", self.path, None, status, 0))
            return
        sent = 0
        limit = hub.knobs.drop_after_bytes
        corrupt = filename in hub.knobs.corrupt
        position = start
        for chunk in _chunks(data, start):
            if corrupt and position <= size // 2 < position + len(chunk):
                flipped = bytearray(chunk)
                flipped[size // 2 - position] ^= 0xFF
                chunk = bytes(flipped)
            position += len(chunk)
            if limit is not None and sent + len(chunk) >= limit:
                chunk = chunk[: limit - sent]
                self.wfile.write(chunk)
                self.wfile.flush()
                sent += len(chunk)
                hub.knobs.drop_after_bytes = None  # once
                hub.record(Served("GET", self.path, range_header, status, sent))
                self._drop()
                return
            try:
                self.wfile.write(chunk)
            except OSError:
                break  # the client went away (a cancelled download)
            sent += len(chunk)
        hub.record(Served("GET", self.path, range_header, status, sent))

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _model_info(self, repo_name: str, revision: str | None) -> None:
        hub = self.server_hub
        repo = hub.repos.get(repo_name)
        if repo is None:
            return self._status(404, "Repository not found", error_code="RepoNotFound")
        if not self._authorised(repo):
            return self._status(401, "Access to this model is restricted", error_code="GatedRepo")
        siblings = []
        for name, data in repo.files.items():
            size = _size(data)
            sibling: dict[str, object] = {"rfilename": name, "size": size}
            if size >= LFS_MIN_BYTES:
                sha = hub.sha256(repo_name, name)
                sibling["blobId"] = hashlib.sha1(sha.encode()).hexdigest()
                sibling["lfs"] = {"size": size, "sha256": sha, "pointerSize": 134}
            else:
                sibling["blobId"] = _git_blob_sha1(data)
            siblings.append(sibling)
        body = json.dumps({"id": repo_name, "sha": repo.commit, "siblings": siblings}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        hub.record(Served("GET", self.path, None, 200, len(body)))

    def _status(self, status: int, message: str, *, error_code: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.server_hub.record(
            Served(self.command, self.path, self.headers.get("Range"), status, 0)
        )
