"""``draftpen models``: its subcommands, and the ones that change the store or the catalog.

``register`` adds ``list``, ``pull``, ``rm``, ``check``, ``add``, ``forget`` and
``scan``; this module pulls, removes and checks pairs, keeps or forgets your own pairs,
and turns ``--target``/``--draft`` into a run's pair. What ``list`` and ``scan`` print is
in ``pair_listing``; progress while pulling and checking in ``download_progress``.

Handlers return an exit code. A :class:`DraftpenError` becomes one line on stderr and
exit code 1; tracebacks are for bugs, not for a missing download.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TextIO

from app.cli.download_progress import ProgressLines, PullProgressBars
from app.cli.pair_listing import list_pairs, scan_command_handler
from app.errors import ChecksumMismatchError, DraftpenError
from app.models.catalog import HEAD_NAMES, Catalog, LocalFile, PairVariant
from app.models.catalog_file import load_catalog
from app.models.disk import format_bytes
from app.models.pair_download import download_pair
from app.models.pair_files import pair_variant
from app.models.store import ModelStore
from app.models.user_pairs import (
    add_user_pair,
    forget_user_pair,
    parse_reference,
    use_command_line_pair,
)
from app.settings import models_dir, user_catalog_path
from backends.errors import BackendError

Handler = Callable[[argparse.Namespace], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``models`` command and its subcommands; each sets ``func=handler``."""
    models = subparsers.add_parser("models", help="list, download, remove and check model pairs")
    models.set_defaults(func=_handle_models_help(models))
    commands = models.add_subparsers(dest="models_command", metavar="COMMAND")

    listing = commands.add_parser("list", help="show the catalog's pairs and what is downloaded")
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
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
        help="keep your own pair (local GGUF files, MLX directories or hub files) under a name",
        description="Keep a pair of your own GGUF files (or hub files, REPO:FILENAME) or MLX "
        "directories (config.json and *.safetensors; the draft may be an EAGLE-3 or DFlash "
        f"head's directory) in your own catalog ({user_catalog_path().name} in the config "
        "directory); it then works everywhere a catalog pair does (--pair NAME, the models "
        "screen, the API). GGUF pairs run on llama.cpp, MLX directories on MLX.",
    )
    add.add_argument("name", metavar="NAME", help="a name for the pair")
    add.add_argument("--target", required=True, metavar="PATH|DIR|REPO:FILE", help="target model")
    add.add_argument(
        "--draft",
        default=None,
        metavar="PATH|DIR|REPO:FILE",
        help="draft model or head (default: none)",
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
    variant = pair.variants[0]
    drafting = "with n-gram drafts"
    if variant.draft is not None:
        drafting = f"drafting with {HEAD_NAMES.get(variant.drafter or '', 'its draft model')}"
    print(f"Added pair {pair.key!r} ({drafting}, on {variant.runtime}) to {user_catalog_path()}.")
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


def apply_pair_options(args: argparse.Namespace) -> None:
    """``--target``/``--draft`` become this run's pair (``args.pair``), checked first.

    GGUF files run on llama.cpp and MLX directories on MLX: that runtime is this run's
    unless the user chose one, and the other is refused with the reason. Hub files not
    yet in the HF cache are pulled now, with progress on stderr, so every front end (the
    chat app, serve, bench) finds the pair ready.
    """
    target, draft = getattr(args, "target", None), getattr(args, "draft", None)
    if target is None and draft is None:
        return
    if target is None:
        raise DraftpenError("--draft needs --target: give the target model too.")
    if getattr(args, "pair", None):
        raise DraftpenError("Give either --pair NAME or --target/--draft, not both.")
    args.pair = use_command_line_pair(target, draft)
    catalog = load_catalog()
    variant = catalog.pair(args.pair).variants[0]
    chosen = getattr(args, "runtime", None)
    if chosen in (None, "auto"):
        args.runtime = variant.runtime  # GGUF files: llama.cpp; MLX directories: mlx
    elif chosen != variant.runtime:
        raise DraftpenError(_RUNTIME_REFUSED[variant.runtime].format(chosen=chosen))
    store = _store()
    if any(store.state(entry) != "downloaded" for entry in catalog.models_of(variant)):
        with PullProgressBars(sys.stderr) as bars:
            download_pair(catalog, args.pair, store, runtime=variant.runtime, on_event=bars)


# Why --runtime cannot run the files given, by the runtime they need.
_RUNTIME_REFUSED = {
    "mlx": "--runtime {chosen} cannot run MLX directories: they are MLX models, which "
    "only the mlx runtime loads. Leave out --runtime (or give --runtime mlx), or give "
    ".gguf files for llama.cpp.",
    "llamacpp": "--runtime {chosen} cannot run .gguf files: llama.cpp runs them. Leave out "
    "--runtime (or give --runtime llamacpp), or give MLX directories for mlx.",
}


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
