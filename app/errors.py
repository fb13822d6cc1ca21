"""Errors the app layer reports to people.

Every message is one line written for the person at the keyboard: what went wrong and
what to do about it. The CLI and the TUI show ``str(error)`` as it is, without a
traceback, so a message that does not name its fix is a bug. The inference layer has
its own hierarchy in ``backends/errors.py``; ``backends`` never imports from here.
"""

from __future__ import annotations


class DraftpenError(Exception):
    """Base class for every error whose message is shown to users as one line."""


class SettingsError(DraftpenError):
    """The settings file cannot be read or holds an invalid value."""


class HistoryError(DraftpenError):
    """The chat history database cannot be opened or written."""


class CatalogError(DraftpenError):
    """The model catalog (models.toml) is malformed."""


class PairInputError(DraftpenError):
    """A model reference or pair name of the user's own pair that cannot be used, with the fix."""


class UnknownPairError(DraftpenError):
    """A model pair name that the catalog does not define."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        self.name = name
        self.known = known
        super().__init__(
            f"Unknown model pair {name!r}. Known pairs: {', '.join(known) or '(none)'}. "
            "See them with: draftpen models list"
        )


class PairVariantMissingError(DraftpenError):
    """A pair has no variant for the runtime asked for (e.g. no mlx models)."""

    def __init__(self, pair_name: str, runtime: str, available: tuple[str, ...]) -> None:
        self.pair_name = pair_name
        self.runtime = runtime
        self.available = available
        super().__init__(
            f"Model pair {pair_name!r} has no {runtime} variant; it has: "
            f"{', '.join(available) or '(none)'}. Pick another pair (draftpen models list) "
            f"or another runtime (--runtime {available[0] if available else 'llamacpp'})."
        )


class ModelNotDownloadedError(DraftpenError):
    """A pair's model files are not (all) in the model store yet."""

    def __init__(self, pair_name: str) -> None:
        self.pair_name = pair_name
        super().__init__(
            f"Model pair {pair_name!r} is not downloaded. Run: draftpen models pull {pair_name}"
        )


class LocalModelMissingError(DraftpenError):
    """A user pair names a file on this machine that is no longer there."""

    def __init__(self, pair_name: str, path: str) -> None:
        self.pair_name = pair_name
        self.path = path
        super().__init__(
            f"Pair {pair_name!r} uses {path}, which is not there any more. Put the file back, "
            f"or add the pair again with its new path: draftpen models add {pair_name} "
            "--target PATH [--draft PATH] --replace"
        )


class DownloadError(DraftpenError):
    """Fetching a model from a source failed (network, index, missing package)."""


class DownloadCancelledError(DraftpenError):
    """The person cancelled a download; what was fetched so far is kept for a resume."""


class DiskSpaceError(DraftpenError):
    """Not enough free disk space to download a model."""


class ChecksumMismatchError(DraftpenError):
    """A model file's size or sha256 differs from the catalog; the file was discarded.

    ``problem`` says what was wrong and what happened to the file; the message adds the
    command that downloads it again, naming the pair when the caller knows it.
    """

    def __init__(self, problem: str, pair_name: str | None = None) -> None:
        self.problem = problem
        self.pair_name = pair_name
        command = (
            f"draftpen models pull {pair_name}"
            if pair_name
            else "draftpen models pull NAME (pair names: draftpen models list)"
        )
        super().__init__(f"{problem} Download it again with: {command}")

    def for_pair(self, pair_name: str) -> ChecksumMismatchError:
        """The same error, with the exact pull command for ``pair_name``."""
        return ChecksumMismatchError(self.problem, pair_name)


class ServeError(DraftpenError):
    """``draftpen serve`` cannot listen where it was asked to."""


class ServerAlreadyRunningError(ServeError):
    """Another ``draftpen serve`` answers on the socket path."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"draftpen serve is already running on {path}. Stop it first "
            "(systemctl --user stop draftpen, or end its process), or pass another --socket."
        )
