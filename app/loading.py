"""From a pair name to a loaded :class:`~backends.engine.Engine`.

Resolves the pair in the catalog to verified files in the store, picks the runtime,
loads target and draft, and runs the pair check (inside ``Engine``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.calibration_store import ensure_calibrated
from app.models.catalog_file import load_catalog
from app.models.fit import parallel_that_fits
from app.models.pair_files import ResolvedPair, pair_files, pair_models
from backends.caches.conversation_cache import ConversationCache
from backends.caches.disk_prefixes import DiskPrefixes
from backends.caches.draft_history import HistorySettings
from backends.caches.prefix_store import PrefixStore
from backends.engine import DRAFTER_CHOICES, Engine, draft_history
from backends.select import RankSplit, choose_runtime, load_model
from backends.workers.cluster import Workers

log = logging.getLogger(__name__)


def load_engine(
    pair_name: str,
    *,
    n_ctx: int = 4096,
    runtime: str | None = None,
    with_draft: bool = True,
    calibrate: bool = True,
    exact_output: bool = False,
    conversation_cache_bytes: int = 0,
    prefix_store: PrefixStore | None = None,
    history: HistorySettings | None = None,
    on_progress: Callable[[str], None] | None = None,
    parallel: int | None = 1,
    workers: Workers | None = None,
    split: RankSplit | None = None,
) -> Engine:
    """Load a downloaded pair; raises a DraftpenError/BackendError that says what to do.

    With ``calibrate`` the engine gets this machine's cost model (from disk, or
    measured in seconds), which the "auto" drafter needs. ``exact_output`` loads the
    target with kernels whose verify batches round like plain decoding.
    ``conversation_cache_bytes`` > 0 lets the engine keep that much of conversations'
    KV state in RAM (the engine process does; one-shot commands need none). With a
    ``prefix_store`` prompts' prefixes are saved to disk and loaded from it. With
    ``history`` every reply is remembered per tokenizer and drafted from later.
    ``parallel`` N > 1 loads both models for N sequences generating at once (None: as
    many as fit in memory, up to four). ``workers`` hold part of the target's
    layers (llama.cpp RPC); each is asked first, so one that has gone is an error that
    names it; the draft stays on this machine. ``split`` (MLX, ``serve`` under
    ``mlx.launch``): this is rank 0 of a group whose ranks each hold a share of the
    target and mirror its calls; the draft stays on rank 0.
    """
    chosen_runtime = choose_runtime(runtime)
    resolved = pair_files(pair_name, chosen_runtime)
    report = on_progress or (lambda message: None)
    target_path, draft_path = resolved.target_path, resolved.draft_path
    if parallel is None:
        parallel = _parallel_that_fits(pair_name, chosen_runtime, n_ctx)
    worker_infos = workers.ask() if workers is not None else ()
    where = f" with workers {workers}" if workers else ""
    if split is not None:
        where = f" ({split.how} split over {split.group.size()} ranks)"
    report(f"loading target {target_path.name}{where}")
    target = load_model(
        target_path,
        runtime=chosen_runtime,
        n_ctx=n_ctx,
        exact_kernels=exact_output,
        parallel=parallel,
        workers=worker_infos,
        worker_split=workers.weights if workers is not None else None,
        split=split,
    )
    if worker_infos or split is not None:
        log.info("target %s: %s", target_path.name, getattr(target, "placement", "?"))
    draft = None
    if with_draft and draft_path is not None:
        report(f"loading draft {draft_path.name}")
        try:
            # As many sequences as the target got (a refused target runs one at a time).
            draft_parallel = int(getattr(target, "parallel", 1))
            draft = load_model(
                draft_path, runtime=chosen_runtime, n_ctx=n_ctx, parallel=draft_parallel
            )
        except BaseException:
            target.close()
            raise
    try:
        conversations = (
            ConversationCache(conversation_cache_bytes) if conversation_cache_bytes > 0 else None
        )
        prefixes = DiskPrefixes(prefix_store) if prefix_store is not None else None
        remembered = draft_history(history, target) if history is not None else None
        engine = Engine(
            target, draft, conversations=conversations, prefixes=prefixes, history=remembered
        )
        if with_draft and resolved.variant.uses_mtp:
            _use_mtp_head(engine, resolved, report)
        if with_draft and resolved.eagle3_head_path is not None:
            report(f"loading EAGLE-3 head {resolved.eagle3_head_path.name}")
            engine.attach_eagle3_head(resolved.eagle3_head_path)
        elif with_draft and resolved.dflash_head_path is not None:
            _use_block_head(engine, resolved, report)
        if calibrate:
            ensure_calibrated(engine, chosen_runtime, report)
        return engine
    except BaseException:
        target.close()
        if draft is not None:
            draft.close()
        raise


def _parallel_that_fits(pair_name: str, runtime: str, n_ctx: int) -> int:
    """``serve --parallel auto``: as many sequences as the pair holds in memory, up to
    four (on MLX too: each sequence's cache grows as it is filled, but may fill)."""
    return parallel_that_fits(pair_models(load_catalog(), pair_name, runtime), n_ctx=n_ctx)


def _use_mtp_head(engine: Engine, resolved: ResolvedPair, report: Callable[[str], None]) -> None:
    """Let the engine draft with the pair's MTP head, or say that it drafts with n-grams.

    A head inside the target GGUF needs nothing here: a runtime with an MTP drafter finds
    it in the target. A separate MTP file is handed to the engine's ``attach_mtp_head``.
    Where the runtime has no MTP drafter (yet), the pair still loads and runs, with
    n-gram drafts: the output is the same, only the speed-up is smaller, and the user
    is told why rather than met with an error.
    """
    pair = resolved.entry.key
    if "mtp" not in DRAFTER_CHOICES:
        _warn(
            report,
            f"{pair}: this build of draftpen cannot draft with an MTP head yet; "
            "drafting with n-grams instead (same output, less speed-up)",
        )
        return
    head = resolved.mtp_head_path
    if head is None:
        return
    attach = getattr(engine, "attach_mtp_head", None)
    if attach is None:
        _warn(
            report,
            f"{pair}: this build drafts only with MTP heads kept inside the target, not "
            f"with a separate file ({head.name}); drafting with n-grams instead",
        )
        return
    report(f"loading MTP head {head.name}")
    attach(head)


def _use_block_head(engine: Engine, resolved: ResolvedPair, report: Callable[[str], None]) -> None:
    """Attach the pair's DFlash or DSpark head; the file says which of the two it is,
    and a pair that named the other is told (the head drafts under its own name)."""
    path = resolved.dflash_head_path
    assert path is not None
    report(f"loading DFlash/DSpark head {path.name}")
    kind = engine.attach_dflash_head(path)
    declared = resolved.variant.drafter
    if declared != kind:
        _warn(
            report,
            f"{resolved.entry.key}: {path.name} is a {kind} head, not {declared}; "
            f"it drafts with --drafter {kind}",
        )


def _warn(report: Callable[[str], None], message: str) -> None:
    # Both: report reaches a front end that passed one; the log reaches everyone else
    # (`generate` and `bench` load in-process without a progress callback).
    report(message)
    log.warning(message)
