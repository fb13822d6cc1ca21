"""From a pair name to a loaded :class:`~backends.engine.Engine`.

Resolves the pair in the catalog to verified files in the store, picks the runtime,
loads target and draft, and runs the pair check (inside ``Engine``).
"""

from __future__ import annotations

from collections.abc import Callable

from app.calibration_store import ensure_calibrated
from app.models.pair_files import pair_files
from backends.conversation_cache import ConversationCache
from backends.engine import Engine
from backends.select import choose_runtime, load_model


def load_engine(
    pair_name: str,
    *,
    n_ctx: int = 4096,
    runtime: str | None = None,
    with_draft: bool = True,
    calibrate: bool = True,
    exact_output: bool = False,
    conversation_cache_bytes: int = 0,
    on_progress: Callable[[str], None] | None = None,
) -> Engine:
    """Load a downloaded pair; raises a DraftpenError/BackendError that says what to do.

    With ``calibrate`` the engine gets this machine's cost model (from disk, or
    measured in seconds), which the "auto" drafter needs. ``exact_output`` loads the
    target with kernels whose verify batches round like plain decoding.
    ``conversation_cache_bytes`` > 0 lets the engine keep that much of conversations'
    KV state in RAM (the engine process does; one-shot commands need none).
    """
    chosen_runtime = choose_runtime(runtime)
    resolved = pair_files(pair_name, chosen_runtime)
    report = on_progress or (lambda message: None)
    target_path, draft_path = resolved.target_path, resolved.draft_path
    report(f"loading target {target_path.name}")
    target = load_model(
        target_path, runtime=chosen_runtime, n_ctx=n_ctx, exact_kernels=exact_output
    )
    draft = None
    if with_draft and draft_path is not None:
        report(f"loading draft {draft_path.name}")
        try:
            draft = load_model(draft_path, runtime=chosen_runtime, n_ctx=n_ctx)
        except BaseException:
            target.close()
            raise
    try:
        conversations = (
            ConversationCache(conversation_cache_bytes) if conversation_cache_bytes > 0 else None
        )
        engine = Engine(target, draft, conversations=conversations)
        if calibrate:
            ensure_calibrated(engine, chosen_runtime, report)
        return engine
    except BaseException:
        target.close()
        if draft is not None:
            draft.close()
        raise
