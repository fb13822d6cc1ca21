"""The one-line summary of a generation's figures, printed by ``generate`` and the REPL."""

from __future__ import annotations

from backends.generation_events import SpeculativeStats


def format_stats(stats: SpeculativeStats) -> str:
    """The one-line summary printed after a generation."""
    return (
        f"{stats.generated_tokens} tokens, {stats.decode_tokens_per_second:.1f} tok/s "
        f"(prefill {stats.prompt_tokens - stats.cached_prompt_tokens} tokens in "
        f"{stats.prefill_seconds:.2f}s, first token after {stats.time_to_first_token:.2f}s) | "
        f"drafted {stats.drafted}, accepted {stats.accepted} "
        f"({stats.acceptance_rate:.0%}), mean accepted length "
        f"{stats.mean_accepted_length:.2f} | target passes {stats.target_passes}, "
        f"draft passes {stats.draft_passes} | host {stats.host_ms_per_token:.2f} ms/token"
    )
