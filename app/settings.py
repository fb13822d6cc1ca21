"""Where draftpen keeps its files, and the user's settings.

Paths come from here and nowhere else. They follow the platform's conventions
(XDG on Linux, ~/Library on macOS) through ``platformdirs``; two environment variables
override them, so tests and CI never touch a real home directory:

- ``DRAFTPEN_HOME``: config, data, cache and the server's socket all live under it
  (``$DRAFTPEN_HOME/config``, ``/data``, ``/cache``, ``/run``).
- ``DRAFTPEN_MODELS_DIR``: the model store, default ``<data dir>/models``. CI points it
  at a persistent directory so the large model files are fetched once per machine.
- ``DRAFTPEN_CATALOG``: a models.toml to use instead of the packaged one (tests, and
  trying a new catalog entry before it ships).

Functions return paths without creating them; code that writes creates what it needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tomllib
import typing
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import platformdirs
import tomli_w

from app.errors import SettingsError
from backends.sampling.filters import SamplingParams
from backends.workers.cluster import Workers
from backends.workers.endpoints import WorkerAddressError

APP_NAME = "draftpen"
HOME_ENV = "DRAFTPEN_HOME"
MODELS_DIR_ENV = "DRAFTPEN_MODELS_DIR"
CATALOG_ENV = "DRAFTPEN_CATALOG"
SETTINGS_FILENAME = "settings.toml"
API_KEY_FILENAME = "api-key"
USER_CATALOG_FILENAME = "my-models.toml"

DrafterChoice = Literal["auto", "model", "mtp", "eagle3", "dflash", "dspark", "ngram", "none"]
DRAFTER_CHOICES: tuple[str, ...] = typing.get_args(DrafterChoice)


def _env_path(name: str) -> Path | None:
    # An empty variable counts as unset: `DRAFTPEN_HOME= draftpen` should not mean cwd.
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """The directory holding ``settings.toml``."""
    home = _env_path(HOME_ENV)
    if home is not None:
        return home / "config"
    return platformdirs.user_config_path(APP_NAME, appauthor=False)


def data_dir() -> Path:
    """The directory for lasting data: chat history, and the model store by default."""
    home = _env_path(HOME_ENV)
    if home is not None:
        return home / "data"
    return platformdirs.user_data_path(APP_NAME, appauthor=False)


def cache_dir() -> Path:
    """The directory for files that can be rebuilt at any time."""
    home = _env_path(HOME_ENV)
    if home is not None:
        return home / "cache"
    return platformdirs.user_cache_path(APP_NAME, appauthor=False)


def runtime_dir() -> Path:
    """Where ``draftpen serve`` puts its socket; the server makes it private (0700).

    ``$DRAFTPEN_HOME/run`` when that is set, else ``$XDG_RUNTIME_DIR/draftpen`` (a
    per-user tmpfs on Linux), else ``<cache dir>/run`` (macOS, or no login session).
    """
    home = _env_path(HOME_ENV)
    if home is not None:
        return home / "run"
    runtime = _env_path("XDG_RUNTIME_DIR")
    if runtime is not None:
        return runtime / APP_NAME
    return cache_dir() / "run"


def models_dir() -> Path:
    """The model store: ``$DRAFTPEN_MODELS_DIR`` if set, else ``<data dir>/models``."""
    override = _env_path(MODELS_DIR_ENV)
    return override if override is not None else data_dir() / "models"


def catalog_override_path() -> Path | None:
    """``$DRAFTPEN_CATALOG`` if set: a catalog file that replaces the packaged one."""
    return _env_path(CATALOG_ENV)


def user_catalog_path() -> Path:
    """The user's own pairs (``draftpen models add``), beside settings; it need not exist."""
    return config_dir() / USER_CATALOG_FILENAME


def settings_path() -> Path:
    """The user's settings file (it need not exist)."""
    return config_dir() / SETTINGS_FILENAME


def api_key_path() -> Path:
    """The key TCP clients of ``draftpen serve`` send (``app.client.api_key``); 0600."""
    return config_dir() / API_KEY_FILENAME


@dataclass(frozen=True)
class Settings:
    """The user's preferences; every field has a default, so an empty file is valid."""

    default_pair: str = "starter"
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    max_tokens: int = 1024
    context_length: int = 4096
    draft_tokens: int = 4
    drafter: DrafterChoice = "auto"
    # Greedy output bit-identical to plain decoding: the target is loaded with kernels
    # whose small batches round like one-token decoding (slower prompt reading on a CPU),
    # and auto verifies only in batches measured to do so (see backends/speculation/calibration.py).
    # Off, speculation uses the fastest kernels and may flip a near-tie.
    exact_output: bool = False
    # Let models that reason aloud (Qwen3, ...) think before they answer. Off turns it off
    # through the chat template's own switch (Qwen3's enable_thinking), where it has one.
    thinking: bool = True
    system_prompt: str = ""
    # RAM the engine may use to keep conversations' KV state, so an agent and a chat
    # taking turns do not re-read each other's prompts: "auto" (an eighth of this
    # machine's RAM), "0" (keep none), or a size such as "2GiB" or "512MB".
    conversation_cache: str = "auto"
    # Disk the engine may use to keep prompts' prefixes (an agent's system prompt and
    # tools) across engines, so a new session loads them instead of reading them:
    # "auto" (a fifth of the free disk, at most 20 GiB), "0" (off), or a size.
    prefix_cache: str = "auto"
    # RAM (and disk) for the index of earlier replies the n-gram drafter drafts from, so
    # an agent's repeated work in a new session is drafted for free: "auto" (48 MiB,
    # about a million tokens), "0" (off: nothing is remembered), or a size.
    history_index: str = "auto"
    # Other machines running `draftpen worker` that hold part of the target's layers
    # (serve --workers): "HOST:PORT,HOST:PORT", "" for none; and their shares,
    # this machine's first ("2,1,1"; "" splits by free memory).
    workers: str = ""
    worker_split: str = ""
    # Seconds a forward pass of a split target waits, at the least, before a worker that
    # sends nothing is called hung and its connection broken (more where recent passes
    # were slow: see backends/workers/hang.py); 0 waits forever.
    worker_timeout: float = 30.0
    # With a target split over workers, draft the next round while the workers verify
    # this one (greedy, draft-model rounds; see backends/speculation/overlap.py); false
    # keeps the draft model idle during the verify.
    overlap_drafting: bool = True

    def __post_init__(self) -> None:
        problem = _range_problem(self)
        if problem:
            raise SettingsError(problem)

    @cached_property
    def sampling(self) -> SamplingParams:
        """The sampling these settings ask for, without a seed: built once, when the
        settings are checked, and the same value for every turn that uses them."""
        return self.sampling_params()

    def sampling_params(self, seed: int | None = None) -> SamplingParams:
        """The sampling these settings ask for, with ``seed`` (a new value each call)."""
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            seed=seed,
        )


def _range_problem(settings: Settings) -> str | None:
    checks: list[tuple[bool, str]] = [
        (bool(settings.default_pair), "default_pair must not be empty"),
        (settings.max_tokens >= 1, "max_tokens must be 1 or more"),
        (settings.context_length >= 1, "context_length must be 1 or more"),
        (settings.draft_tokens >= 0, "draft_tokens must be 0 or more (0 = no speculation)"),
        (
            settings.drafter in DRAFTER_CHOICES,
            f"drafter must be one of {', '.join(DRAFTER_CHOICES)}",
        ),
        (
            parse_byte_size(settings.conversation_cache) is not None,
            f"conversation_cache must be {BYTE_SIZE_HINT}, not {settings.conversation_cache!r}",
        ),
        (
            parse_byte_size(settings.prefix_cache) is not None,
            f"prefix_cache must be {BYTE_SIZE_HINT}, not {settings.prefix_cache!r}",
        ),
        (
            parse_byte_size(settings.history_index) is not None,
            f"history_index must be {BYTE_SIZE_HINT}, not {settings.history_index!r}",
        ),
        (settings.worker_timeout >= 0, "worker_timeout must be 0 or more (0 = wait forever)"),
    ]
    problem = next((message for ok, message in checks if not ok), None)
    return problem or _sampling_problem(settings) or _workers_problem(settings)


def _sampling_problem(settings: Settings) -> str | None:
    """What is wrong with the sampling settings, in SamplingParams' own words."""
    try:
        settings.sampling  # noqa: B018 (built and kept: the check is building it)
    except ValueError as error:
        return str(error)
    return None


def _workers_problem(settings: Settings) -> str | None:
    if not settings.workers.strip():
        return "worker_split needs workers" if settings.worker_split.strip() else None
    try:
        Workers.parse(settings.workers, settings.worker_split.strip() or None)
    except WorkerAddressError as error:
        return f"workers: {error}"
    return None


# "auto" keeps conversations in this share of the machine's RAM.
AUTO_CONVERSATION_CACHE_SHARE = 1 / 8
# "auto" keeps prompt prefixes in this share of the free disk, up to the cap.
AUTO_PREFIX_CACHE_SHARE = 1 / 5
AUTO_PREFIX_CACHE_CAP = 20 << 30
# "auto" lets the history index hold about a million tokens in RAM (4 MB on disk).
AUTO_HISTORY_INDEX_BYTES = 48 << 20
BYTE_SIZE_HINT = '"auto", "0" (off) or a size such as "2GiB", "512MB" or "1500000000"'
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}


def parse_byte_size(text: str) -> int | Literal["auto"] | None:
    """A size as people write it ("2GiB", "512 MB", "1.5G", "0") in bytes; "auto" as is.

    None when the text is not a size. Binary units (KiB, MiB, GiB; bare K, M, G) are
    powers of 1024, decimal ones (kB, MB, GB) powers of 1000.
    """
    cleaned = text.strip().lower().replace(" ", "").replace("_", "")
    if cleaned == "auto":
        return "auto"
    number = cleaned.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = cleaned[len(number) :]
    if not number or unit not in _SIZE_UNITS:
        return None
    try:
        value = float(number)
    except ValueError:
        return None
    if not value >= 0 or value == float("inf"):  # also refuses NaN
        return None
    return int(value * _SIZE_UNITS[unit])


def conversation_cache_bytes(value: str, total_ram: int | None = None) -> int:
    """The byte budget a ``conversation_cache`` value names ("auto": an eighth of RAM).

    Raises :class:`SettingsError` for text that is not a size.
    """
    size = parse_byte_size(value)
    if size is None:
        raise SettingsError(f"conversation cache size must be {BYTE_SIZE_HINT}, not {value!r}")
    if size == "auto":
        if total_ram is None:
            import psutil

            total_ram = int(psutil.virtual_memory().total)
        return int(total_ram * AUTO_CONVERSATION_CACHE_SHARE)
    return size


def prefix_cache_bytes(value: str, free_disk: int | None = None) -> int:
    """The byte budget a ``prefix_cache`` value names ("auto": a share of the free disk
    under the cache directory, with a cap). Raises :class:`SettingsError` for text
    that is not a size."""
    size = parse_byte_size(value)
    if size is None:
        raise SettingsError(f"prefix cache size must be {BYTE_SIZE_HINT}, not {value!r}")
    if size == "auto":
        if free_disk is None:
            import shutil

            place = cache_dir()
            while not place.exists() and place != place.parent:
                place = place.parent
            free_disk = shutil.disk_usage(place).free
        return min(int(free_disk * AUTO_PREFIX_CACHE_SHARE), AUTO_PREFIX_CACHE_CAP)
    return size


def history_index_bytes(value: str) -> int:
    """The byte budget a ``history_index`` value names ("auto": 48 MiB). Raises
    :class:`SettingsError` for text that is not a size."""
    size = parse_byte_size(value)
    if size is None:
        raise SettingsError(f"history index size must be {BYTE_SIZE_HINT}, not {value!r}")
    return AUTO_HISTORY_INDEX_BYTES if size == "auto" else size


def history_index_dir() -> Path:
    """Where earlier replies are kept for drafting (they hold replies' and prompts'
    content: kept private)."""
    return cache_dir() / "history"


def prefix_cache_dir() -> Path:
    """Where saved prompt prefixes live (they hold prompts' content: kept private)."""
    return cache_dir() / "prefixes"


def _field_types() -> dict[str, type]:
    hints = typing.get_type_hints(Settings)
    # The Literal field is a str in the file; its allowed values are checked later.
    return {
        field.name: str if typing.get_origin(hints[field.name]) is Literal else hints[field.name]
        for field in dataclasses.fields(Settings)
    }


def _coerce(key: str, value: Any, expected: type) -> Any:
    # TOML distinguishes 1 from 1.0; a person writing `temperature = 1` means 1.0.
    # bool is a subclass of int, so it is refused explicitly where a number is expected.
    if expected is bool:
        if isinstance(value, bool):
            return value
        raise SettingsError(f"{key} must be true or false, not {value!r}")
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, expected) and not isinstance(value, bool):
        return value
    kind = {float: "a number", int: "an integer", str: "a string"}[expected]
    raise SettingsError(f"{key} must be {kind}, not {value!r}")


def settings_from_mapping(values: dict[str, Any]) -> Settings:
    """Validate parsed TOML into :class:`Settings`; unknown keys are rejected."""
    types = _field_types()
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise SettingsError(
            f"unknown setting(s) {', '.join(unknown)}; known settings: {', '.join(types)}"
        )
    coerced = {key: _coerce(key, value, types[key]) for key, value in values.items()}
    return Settings(**coerced)


def load_settings(path: Path | None = None) -> Settings:
    """Read settings from ``path`` (default :func:`settings_path`).

    A missing file means all defaults. A malformed file raises :class:`SettingsError`
    naming the file and the problem, so the person can fix or delete it.
    """
    path = path if path is not None else settings_path()
    try:
        with path.open("rb") as file:
            values = tomllib.load(file)
    except FileNotFoundError:
        return Settings()
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise SettingsError(
            f"Cannot read settings file {path}: {error}. Fix it or delete it to use defaults."
        ) from error
    try:
        return settings_from_mapping(values)
    except SettingsError as error:
        raise SettingsError(
            f"Invalid settings file {path}: {error}. Fix it or delete it to use defaults."
        ) from error


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    """Write ``settings`` to ``path`` (default :func:`settings_path`), atomically.

    The file is written beside the old one and renamed over it, so a full disk or a
    crash leaves the previous settings intact. Raises :class:`SettingsError`.
    """
    path = path if path is not None else settings_path()
    scratch = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_text(tomli_w.dumps(dataclasses.asdict(settings)), encoding="utf-8")
        os.replace(scratch, path)
    except OSError as error:
        # Cleaning up may fail too (the scratch name may not even be a file); the
        # message below is what matters.
        with contextlib.suppress(OSError):
            scratch.unlink(missing_ok=True)
        raise SettingsError(
            f"Cannot save settings to {path}: {error.strerror or error}. "
            "Your previous settings are unchanged."
        ) from error
    return path
