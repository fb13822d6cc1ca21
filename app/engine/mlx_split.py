"""``serve`` under ``mlx.launch``: an MLX target split across the ranks of a group.

``mlx.launch --backend ring --hostfile hosts.json -- draftpen serve --runtime mlx
--pair PAIR`` starts the same command on every host, with ``MLX_RANK`` and the ring's
hostfile in its environment. Only then (:func:`rank_split`) does serve join the group:
a plain serve never initialises mx.distributed. Each rank loads its share of the
target (mlx-lm's own pipeline or tensor split, ``--mlx-split``); rank 0 loads the draft,
runs the loop and serves as usual, sending every call that touches the target's cache
to the others first (backends/mlx/distributed.py); every other rank only follows
(:func:`run_follower`): no socket, no HTTP, no chat app.

What the split cannot do is turned off or refused, and said: the conversation cache and
the disk prefix cache are off (a split target keeps no conversation states), one
sequence runs at a time (``parallel_refusal``), the pair is never unloaded for idling
(its close ends the other ranks), and a load of another pair, or of this one with other
options, is refused (409): every rank would have to load it (:class:`SplitScheduler`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from app.engine.pairs import catalog_loader
from app.engine.scheduler import LoadedPair, LoadOptions, PairLoader, PairScheduler
from app.engine.schema import ApiError
from app.errors import DraftpenError
from app.settings import Settings
from backends.select import RankSplit, choose_runtime

SPLIT_CHOICES = ("auto", "pipeline", "tensor")


def add_split_option(serve: argparse.ArgumentParser) -> None:
    """Add ``--mlx-split`` to ``serve``."""
    serve.add_argument(
        "--mlx-split",
        choices=SPLIT_CHOICES,
        default=None,
        help="under mlx.launch: split the target's layers over the ranks (pipeline) or "
        "every layer (tensor); auto: pipeline where mlx-lm can, else tensor (default "
        "auto; see docs/workers.md)",
    )


def rank_split(args: argparse.Namespace) -> RankSplit | None:
    """This rank's place in a split target when serve runs under ``mlx.launch`` with
    more than one rank; None otherwise (and mx.distributed is left alone)."""
    # mlx.launch sets MLX_RANK on every rank; read here, so that a plain serve imports
    # no mlx at all.
    if "MLX_RANK" not in os.environ:
        if args.mlx_split is not None:
            raise DraftpenError(
                "--mlx-split splits the target over the ranks mlx.launch starts: run "
                "`mlx.launch --backend ring --hostfile hosts.json -- draftpen serve "
                "--runtime mlx --pair PAIR --mlx-split ...` (see docs/workers.md)."
            )
        return None
    runtime = choose_runtime(args.runtime)
    if runtime != "mlx":
        raise DraftpenError(
            f"serve under mlx.launch splits an MLX target; this one would run {runtime}. "
            "Add --runtime mlx."
        )
    if not args.pair:
        raise DraftpenError(
            "serve under mlx.launch needs --pair: every rank loads its share of that "
            "pair's target before rank 0 listens."
        )
    if args.workers:
        raise DraftpenError("--workers (llama.cpp RPC) and mlx.launch's ranks do not mix.")
    from backends.mlx.distributed import join_group

    group = join_group()
    if group.size() < 2:
        return None  # a group of one: a plain serve
    return RankSplit(group, args.mlx_split or "auto")


def run_follower(args: argparse.Namespace, settings: Settings, split: RankSplit) -> int:
    """A rank other than 0: load this rank's share and make rank 0's calls on it until
    rank 0 closes the model (exit 0) or goes (exit 1)."""
    from app.models.pair_files import pair_files
    from backends.mlx.distributed import PeerLostError, follow, load_share

    rank, size = split.group.rank(), split.group.size()

    def say(message: str) -> None:
        print(f"draftpen serve (rank {rank} of {size}): {message}", file=sys.stderr, flush=True)

    target_path = pair_files(args.pair, "mlx").target_path
    say(f"loading this rank's share of {target_path.name}; rank 0 serves and drafts")
    n_ctx = args.context or settings.context_length  # rank 0's wins (load_share)
    share = load_share(target_path, split.group, split=split.how, n_ctx=n_ctx)
    say(f"holding a {share.placement}; following rank 0's calls")
    try:
        follow(share)
    except PeerLostError as error:
        say(f"stopping: {error}")
        return 1
    say("rank 0 closed the model; stopping")
    return 0


class SplitScheduler(PairScheduler):
    """The one pair a split target serves, for as long as the ranks run.

    It is never reloaded: the other ranks hold their shares of this pair with these
    options, and closing it ends them. A request for anything else is refused before
    the pair is touched.
    """

    def __init__(self, loader: PairLoader, defaults: LoadOptions, ranks: int) -> None:
        super().__init__(loader, defaults, keep_alive=None)
        self.ranks = ranks

    def acquire(
        self, name: str, options: LoadOptions | None, report: Callable[[str], None]
    ) -> tuple[LoadedPair, bool]:
        """The split pair as it is held; 409 for another pair or other options."""
        held = self.loaded_name()
        if held is None:
            raise ApiError(
                409,
                "The target split across mlx.launch's ranks was unloaded and the other "
                "ranks have stopped; stop mlx.launch and start it again to serve.",
                code="split_target_gone",
            )
        if name != held or (options is not None and options != self.options_for(held)):
            raise ApiError(
                409,
                f"This engine serves '{held}' split across {self.ranks} ranks "
                "(mlx.launch) and cannot load another pair or reload it with other "
                "options: every rank would have to load it. Stop mlx.launch and start "
                f"it again with --pair {name} and the options you want.",
                code="split_target_fixed",
            )
        return super().acquire(name, options, report)


def split_scheduler(
    runtime: str, defaults: LoadOptions, split: RankSplit
) -> tuple[PairLoader, PairScheduler]:
    """Rank 0's loader and scheduler: the caches a split target cannot use are off."""
    # On stderr, as serve's other start-up lines: logging is set up only when it listens.
    print(
        f"draftpen serve (rank 0 of {split.group.size()}): the target is split across the "
        "ranks; conversation and prefix caches off (a split target keeps no conversation "
        "states), one sequence at a time, never unloaded, no other pair loaded",
        file=sys.stderr,
        flush=True,
    )
    loader = catalog_loader(runtime, split=split)
    return loader, SplitScheduler(loader, defaults, split.group.size())
