"""The standard Hugging Face cache on disk: its layout, and checking a file's bytes.

Files land where huggingface_hub puts them, so other tools share them:
``<HF cache>/models--ORG--NAME/blobs/<etag>`` holds the bytes,
``snapshots/<commit>/<filename>`` is a relative symlink to the blob and
``refs/<branch>`` names the commit a branch pointed to. A download in progress is
``blobs/<etag>.incomplete``. :func:`verify_blob` checks a file against the checksum the
hub published for it (the LFS sha256 as its ETag, or the git blob sha1 of a small file)
and deletes it on a mismatch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.utils import WeakFileLock

from app.errors import ChecksumMismatchError

INCOMPLETE_SUFFIX = ".incomplete"
HASH_CHUNK_BYTES = 8 * 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")

BytesCallback = Callable[[int], None]
"""Called with the number of bytes just written (or re-read while verifying)."""


@dataclass(frozen=True)
class HubFile:
    """One file of a repository at one commit, as the hub describes it."""

    repo: str
    filename: str
    commit: str
    size: int
    etag: str
    """The blob's name in the cache: the LFS sha256, or the git blob sha1 of a small file."""

    @property
    def sha256(self) -> str | None:
        """The sha256 the hub published for an LFS file; ``None`` for small git files."""
        return self.etag if _SHA256.fullmatch(self.etag) else None


def repo_folder(repo: str) -> str:
    """The cache folder of a model repository, e.g. ``models--Qwen--Qwen2.5-7B``."""
    return "models--" + repo.replace("/", "--")


class HubCache:
    """The standard Hugging Face cache directory, read and written in its own layout."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def repo_dir(self, repo: str) -> Path:
        """The repository's folder in the cache."""
        return self.root / repo_folder(repo)

    def blob_path(self, file: HubFile) -> Path:
        """Where the complete bytes of ``file`` live."""
        return self.repo_dir(file.repo) / "blobs" / file.etag

    def incomplete_path(self, file: HubFile) -> Path:
        """Where a download of ``file`` is written until it is complete and verified."""
        return self.repo_dir(file.repo) / "blobs" / (file.etag + INCOMPLETE_SUFFIX)

    def snapshot_dir(self, repo: str, commit: str) -> Path:
        """The folder of links that shows the repository at ``commit``."""
        return self.repo_dir(repo) / "snapshots" / commit

    def snapshot_path(self, file: HubFile) -> Path:
        """The link under which tools find ``file``."""
        return self.snapshot_dir(file.repo, file.commit) / file.filename

    def commit_for(self, repo: str, revision: str | None) -> str | None:
        """The commit a branch or tag pointed to when last fetched, or ``revision`` if a hash."""
        revision = revision or "main"
        if _GIT_SHA1.fullmatch(revision):
            return revision
        try:
            return (self.repo_dir(repo) / "refs" / revision).read_text().strip() or None
        except OSError:
            return None

    def cached_file(self, repo: str, filename: str, revision: str | None) -> Path | None:
        """The cached file for ``repo``/``filename`` at ``revision``, if the cache has it."""
        commit = self.commit_for(repo, revision)
        if commit is None:
            return None
        path = self.snapshot_dir(repo, commit) / filename
        return path if path.is_file() else None

    def record_ref(self, repo: str, revision: str | None, commit: str) -> None:
        """Remember that ``revision`` (a branch or tag) points at ``commit``."""
        revision = revision or "main"
        if revision == commit:
            return
        ref = self.repo_dir(repo) / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        staging = ref.with_name(ref.name + ".tmp")
        staging.write_text(commit)
        os.replace(staging, ref)

    def link(self, file: HubFile) -> Path:
        """Point the snapshot path at the blob, with a relative link as huggingface_hub does."""
        link = self.snapshot_path(file)
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.blob_path(file), link.parent)
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        try:
            os.symlink(target, link)
        except OSError:
            # No symlinks here (some Windows setups): huggingface_hub then copies too.
            os.replace(_copy_next_to(self.blob_path(file), link), link)
        return link

    def remove(self, path: Path) -> int:
        """Delete a snapshot link and the blob it points to; returns the bytes freed.

        ``path`` may also be a plain copy (where the cache could not use symlinks).
        """
        freed = 0
        with contextlib.suppress(OSError):
            target = path.resolve(strict=True)
            freed = target.stat().st_size
            target.unlink()
        with contextlib.suppress(OSError):
            path.unlink()  # the link itself, when it pointed at the blob
        return freed

    def lock(self, file: HubFile) -> contextlib.AbstractContextManager[Any]:
        """huggingface_hub's own lock for this blob, so two downloads never share a file."""
        path = self.root / ".locks" / repo_folder(file.repo) / (file.etag + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        return WeakFileLock(path)


def _copy_next_to(source: Path, destination: Path) -> Path:
    staging = destination.with_name(destination.name + ".tmp")
    with source.open("rb") as reader, staging.open("wb") as writer:
        while chunk := reader.read(HASH_CHUNK_BYTES):
            writer.write(chunk)
    return staging


def verify_blob(path: Path, file: HubFile, on_bytes: BytesCallback | None = None) -> None:
    """Check ``path`` against the hub's checksum for ``file``; delete it on a mismatch.

    LFS files carry their sha256 as ETag; small files are checked by git blob sha1.
    """
    size = path.stat().st_size
    if size != file.size:
        path.unlink(missing_ok=True)
        raise ChecksumMismatchError(
            f"The download of {file.repo}/{file.filename} has {size} bytes, the hub said "
            f"{file.size}; it was deleted."
        )
    if file.sha256 is not None:
        hasher = hashlib.sha256()
    elif _GIT_SHA1.fullmatch(file.etag):
        hasher = hashlib.sha1(usedforsecurity=False)
        hasher.update(f"blob {size}\0".encode())
    else:
        return  # an etag that is no checksum: the size is all there is to check
    with path.open("rb") as reader:
        while chunk := reader.read(HASH_CHUNK_BYTES):
            hasher.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    actual = hasher.hexdigest()
    if actual != file.etag:
        path.unlink(missing_ok=True)
        raise ChecksumMismatchError(
            f"The download of {file.repo}/{file.filename} has checksum {actual}, the hub "
            f"published {file.etag}; it was deleted."
        )
