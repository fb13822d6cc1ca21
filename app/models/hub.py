"""Talking to the Hugging Face hub: file metadata, repository listings, resumable downloads.

Files land in the standard HF cache (app/models/hub_cache.py), where other tools
share them.

Why not ``hf_hub_download`` itself: huggingface_hub 2.4.0 downloads into a
process-unique ``<etag>.<uuid>.incomplete`` file and deletes it on any failure (it only
resumes inside one call), so a download that died could not continue on the next
pull. Here the partial file is ``blobs/<etag>.incomplete`` (the name older
huggingface_hub versions resumed from), kept on failure, cancel and Ctrl+C, and
continued with an HTTP Range request. Everything else comes from huggingface_hub: the
URL scheme (``hf_hub_url``), the HEAD metadata (``get_hf_file_metadata``: ETag,
X-Linked-Etag, X-Linked-Size, X-Repo-Commit), repository listings (``HfApi.model_info``),
the GET with its in-call retries (``http_get``), auth headers (HF_TOKEN or
``hf auth login``) and its error classes.

A blob only gets its final name after its size and checksum matched: the LFS sha256
the hub publishes as its ETag, or the git blob sha1 for small files. A mismatch
deletes the partial file.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.errors import (
    RemoteEntryNotFoundError as EntryNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers
from huggingface_hub.utils import tqdm as hf_tqdm

from app.errors import DiskSpaceError, DownloadCancelledError, DownloadError
from app.models.hub_cache import BytesCallback, HubCache, HubFile, verify_blob

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "on", "yes", "true"}

# What mlx-lm needs from a model repository: config, weights, tokenizer, chat template.
# Python files are left out on purpose: draftpen never runs a repository's code.
MLX_FILE_PATTERNS = (
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
)


@dataclass(frozen=True)
class HubSettings:
    """Where the hub is and how to reach it, read from the environment at call time.

    huggingface_hub reads these once, at import; reading them per call lets a user (or
    a test) change them without restarting.
    """

    endpoint: str
    cache_dir: Path
    token: str | None
    offline: bool

    @classmethod
    def from_env(cls) -> HubSettings:
        """HF_ENDPOINT, HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME, HF_TOKEN, HF_HUB_OFFLINE."""
        environ = os.environ
        endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        if environ.get("HF_HUB_CACHE"):
            cache = Path(environ["HF_HUB_CACHE"]).expanduser()
        else:
            if environ.get("HF_HOME"):
                home = Path(environ["HF_HOME"]).expanduser()
            else:
                xdg = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
                home = Path(xdg).expanduser() / "huggingface"
            cache = home / "hub"
        token = environ.get("HF_TOKEN") or environ.get("HUGGING_FACE_HUB_TOKEN") or None
        offline = (environ.get("HF_HUB_OFFLINE") or "").strip().lower() in _TRUE
        return cls(endpoint=endpoint, cache_dir=cache, token=token, offline=offline)


class HubClient:
    """Asks the hub about files and repositories; errors become one-line DraftpenErrors."""

    def __init__(self, settings: HubSettings | None = None) -> None:
        self.settings = settings or HubSettings.from_env()

    def _refuse_if_offline(self, what: str) -> None:
        if self.settings.offline:
            raise DownloadError(
                f"HF_HUB_OFFLINE is set, so {what} cannot be downloaded from the Hugging Face "
                "hub. Unset HF_HUB_OFFLINE to download it."
            )

    def file(self, repo: str, filename: str, revision: str | None) -> HubFile:
        """A file's commit, size and etag, from a HEAD request on its resolve URL."""
        self._refuse_if_offline(f"{repo}/{filename}")
        url = hf_hub_url(repo, filename, revision=revision, endpoint=self.settings.endpoint)
        with hub_errors(repo, filename):
            metadata = get_hf_file_metadata(
                url, token=self.settings.token, endpoint=self.settings.endpoint
            )
        if not metadata.commit_hash or not metadata.etag or metadata.size is None:
            raise DownloadError(
                f"The hub at {self.settings.endpoint} answered for {repo}/{filename} without "
                "the commit, ETag or size headers it always sends. If HF_ENDPOINT points at a "
                "mirror or proxy, check it; otherwise try again later."
            )
        return HubFile(repo, filename, metadata.commit_hash, metadata.size, metadata.etag)

    def snapshot_files(
        self, repo: str, revision: str | None, patterns: tuple[str, ...] = MLX_FILE_PATTERNS
    ) -> tuple[HubFile, ...]:
        """The repository's files at ``revision`` that match ``patterns``, with their sizes."""
        self._refuse_if_offline(repo)
        api = HfApi(endpoint=self.settings.endpoint, token=self.settings.token)
        with hub_errors(repo, None):
            info = api.model_info(repo, revision=revision, files_metadata=True)
        if not info.sha:
            raise DownloadError(f"The hub did not say which commit {repo} is at. Try again later.")
        files = []
        for sibling in info.siblings or ():
            if not any(fnmatch.fnmatch(sibling.rfilename, pattern) for pattern in patterns):
                continue
            etag = sibling.lfs.sha256 if sibling.lfs else sibling.blob_id
            if etag is None or sibling.size is None:
                raise DownloadError(
                    f"The hub listed {repo}/{sibling.rfilename} without its size or checksum. "
                    "Try again later."
                )
            files.append(HubFile(repo, sibling.rfilename, info.sha, sibling.size, etag))
        if not any(file.filename == "config.json" for file in files):
            raise DownloadError(
                f"{repo} has no config.json at {revision or 'main'}: it is not an MLX model "
                "repository. The catalog entry is wrong; update draftpen."
            )
        return tuple(files)

    def download(
        self,
        file: HubFile,
        cache: HubCache,
        on_bytes: BytesCallback,
        cancel: threading.Event | None = None,
    ) -> Path:
        """Fetch ``file`` into ``cache`` (resuming a partial one) and return its snapshot path.

        ``on_bytes`` hears of bytes already on disk first, then of each chunk; setting
        ``cancel`` stops the download at the next chunk with
        :class:`DownloadCancelledError`, keeping the partial file for next time.
        """
        blob = cache.blob_path(file)
        blob.parent.mkdir(parents=True, exist_ok=True)
        with cache.lock(file):
            if not _complete(blob, file):
                self._download_blob(file, cache, on_bytes, cancel)
            else:
                on_bytes(file.size)
            return cache.link(file)

    def _download_blob(
        self,
        file: HubFile,
        cache: HubCache,
        on_bytes: BytesCallback,
        cancel: threading.Event | None,
    ) -> None:
        self._refuse_if_offline(f"{file.repo}/{file.filename}")
        partial = cache.incomplete_path(file)
        have = partial.stat().st_size if partial.exists() else 0
        if have > file.size:
            partial.unlink()  # not a prefix of this file; start again
            have = 0
        on_bytes(have)
        url = hf_hub_url(
            file.repo, file.filename, revision=file.commit, endpoint=self.settings.endpoint
        )
        headers = build_hf_headers(token=self.settings.token)
        try:
            with partial.open("ab") as output:
                sink = _WatchedFile(output, on_bytes, cancel)
                with hub_errors(file.repo, file.filename):
                    http_get(
                        url,
                        sink,  # type: ignore[arg-type]
                        resume_size=have,
                        headers=headers,
                        expected_size=file.size,
                        displayed_filename=file.filename,
                        tqdm_class=_SilentTqdm,
                    )
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise DiskSpaceError(
                    f"The disk holding {cache.root} filled up while downloading "
                    f"{file.repo}/{file.filename}. Free up space (or point HF_HOME at a bigger "
                    "disk) and pull again: the download continues where it stopped."
                ) from error
            # http_get's own check that the body had the size the headers promised.
            if "Consistency check failed" in str(error):
                partial.unlink(missing_ok=True)
                raise DownloadError(
                    f"The download of {file.repo}/{file.filename} ended at the wrong size. "
                    "It was deleted; pull again."
                ) from error
            raise
        verify_blob(partial, file)
        os.replace(partial, cache.blob_path(file))


def _complete(blob: Path, file: HubFile) -> bool:
    try:
        return blob.stat().st_size == file.size
    except OSError:
        return False


class _WatchedFile:
    """A file that reports each write and stops when ``cancel`` is set.

    ``http_get`` writes every chunk through ``write``; raising there is the one place a
    download can be stopped between chunks without killing a thread.
    """

    def __init__(
        self, output: Any, on_bytes: BytesCallback, cancel: threading.Event | None
    ) -> None:
        self._output = output
        self._on_bytes = on_bytes
        self._cancel = cancel

    def write(self, chunk: bytes) -> int:
        if self._cancel is not None and self._cancel.is_set():
            raise DownloadCancelledError("Download cancelled; pull again to continue it.")
        written: int = self._output.write(chunk)
        self._on_bytes(len(chunk))
        return written

    def __getattr__(self, name: str) -> Any:
        # seek/tell/truncate (used when a server ignores the Range header) go straight through.
        return getattr(self._output, name)


class _SilentTqdm(hf_tqdm):  # type: ignore[misc]
    """huggingface_hub draws its own bars; draftpen reports progress through callbacks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


@contextlib.contextmanager
def hub_errors(repo: str, filename: str | None) -> Iterator[None]:
    """Turn huggingface_hub and network errors into one-line messages that name the fix."""
    what = f"{repo}/{filename}" if filename else repo
    login = (
        "Log in with `hf auth login` (or set HF_TOKEN to an access token), and accept the "
        f"model's licence on https://huggingface.co/{repo} if it asks for that."
    )
    try:
        yield
    except GatedRepoError as error:
        raise DownloadError(f"{repo} is a gated repository: access was refused. {login}") from error
    except RepositoryNotFoundError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403):
            raise DownloadError(f"The hub refused access to {repo} ({status}). {login}") from error
        raise DownloadError(
            f"The hub has no repository {repo} (or it is private). {login} If it is still "
            "missing, the catalog entry is wrong; update draftpen."
        ) from error
    except RevisionNotFoundError as error:
        raise DownloadError(
            f"{repo} has no such revision any more; update draftpen's catalog."
        ) from error
    except EntryNotFoundError as error:
        raise DownloadError(
            f"{what} is not on the hub any more; update draftpen's catalog."
        ) from error
    except OfflineModeIsEnabled as error:
        raise DownloadError(
            f"HF_HUB_OFFLINE is set, so {what} cannot be downloaded. Unset it to download."
        ) from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403):
            raise DownloadError(f"The hub refused access to {what} ({status}). {login}") from error
        if status is not None and status >= 500:
            raise DownloadError(
                f"The Hugging Face hub had a server error ({status}) for {what}. Try again "
                "later; the part already downloaded is kept."
            ) from error
        raise DownloadError(f"The hub refused {what} ({status or error}).") from error
    except httpx2.HTTPError as error:
        raise DownloadError(
            f"Could not reach the Hugging Face hub for {what} ({type(error).__name__}: {error}). "
            "Check your network connection (or HF_ENDPOINT), then pull again: the download "
            "continues where it stopped."
        ) from error
