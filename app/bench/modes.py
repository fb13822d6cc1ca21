"""The ways of decoding bench compares, run in alternation, and their summed figures.

Each mode runs every prompt on one loaded pair, through a :class:`Decoder` (the pair in
this process, or the engine); the order of the modes rotates run by run so that none
is favoured by its place. ``ModeTotals`` sums a mode's runs.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.bench.suite import BenchPrompt
from app.errors import DraftpenError
from backends.engine import Engine, GenerationRequest
from backends.generation_events import SpeculativeStats, speedup_over_plain_rounds
from backends.output.output_constraints import ConstraintSpec
from backends.sampling.filters import SamplingParams
from backends.speculation.acceptance import AcceptanceEstimate, ConfidenceFloor

# llama-cpp-python's LlamaPromptLookupDecoding proposes 10 tokens; match it.
NGRAM_DRAFT_TOKENS = 10


WARM_UP_TOKENS = 16


# A mode's own draft-free rounds make a baseline only when there are this many.
MIN_OWN_PLAIN_ROUNDS = 16


@dataclass(frozen=True)
class BenchMode:
    """One way of decoding that bench compares."""

    label: str
    drafter: str
    draft_tokens: int
    exact: bool = False
    # Decode a constrained prompt without its grammar (what the mask costs); such a
    # mode runs only the constrained prompts.
    ignore_constraint: bool = False
    acceptance_memory: dict[str, AcceptanceEstimate] = field(default_factory=dict, compare=False)
    confidence_floor: ConfidenceFloor = field(default_factory=ConfidenceFloor, compare=False)


@dataclass
class ModeTotals:
    """Summed results of one mode over one category (or one run), and each run's speed."""

    generated_tokens: int = 0
    decode_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    speculative_rounds: int = 0
    target_passes: int = 0
    plain_rounds: int = 0
    plain_round_seconds: float = 0.0
    # Decode time spent outside the runtime's forward calls (the loop's own work).
    host_seconds: float = 0.0
    grammar_forced: int = 0  # tokens the grammar forced (constrained prompts)
    # Rounds drafted during a split target's verify, and those used (the guess held).
    predrafted_rounds: int = 0
    predrafts_used: int = 0
    run_rates: list[float] = field(default_factory=list)  # tok/s per run, in run order

    @classmethod
    def of_stats(cls, stats: SpeculativeStats) -> ModeTotals:
        """One generation's totals: each summed field read from its statistics by name."""
        counts = {name: getattr(stats, name) for name in _COUNTED_STATS}
        return cls.of_run(stats.generated_tokens, stats.decode_seconds, **counts)

    @classmethod
    def of_run(cls, generated_tokens: int, decode_seconds: float, **counts: Any) -> ModeTotals:
        """The results of a single run (``counts``: any of the other summed fields)."""
        rate = generated_tokens / decode_seconds if decode_seconds else 0.0
        return cls(generated_tokens, decode_seconds, run_rates=[rate], **counts)

    def add(self, other: ModeTotals) -> None:
        """Count in more runs: sums add up, run speeds are appended."""
        for name in (f.name for f in dataclasses.fields(self) if f.name != "run_rates"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.run_rates.extend(other.run_rates)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed over every run of this mode."""
        return self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def speedup_over_own_plain_rounds(self) -> float | None:
        """Speed over this mode's own draft-free rounds (None: too few to judge by).

        Those rounds are plain decoding timed within the same runs, so drift of the
        machine's speed between runs cancels out of this ratio.
        """
        if self.plain_rounds < MIN_OWN_PLAIN_ROUNDS:
            return None
        return speedup_over_plain_rounds(
            self.generated_tokens, self.decode_seconds, self.plain_rounds, self.plain_round_seconds
        )

    @property
    def host_ms_per_token(self) -> float:
        """The loop's own time per generated token, in milliseconds."""
        return self.host_seconds * 1000 / self.generated_tokens if self.generated_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted tokens per drafting round."""
        return self.accepted / self.speculative_rounds if self.speculative_rounds else 0.0


UNCONSTRAINED_PLAIN = "plain, no grammar"
# What ``--modes`` can pick; plain decoding, the baseline, always runs.
MODE_CHOICES = ("draft", "ngram", "auto", "reference")


# What bench sums from a generation's statistics, besides tokens and seconds: every
# other field of ModeTotals but the run speeds (each one a field of SpeculativeStats).
_COUNTED_STATS = tuple(
    total.name
    for total in dataclasses.fields(ModeTotals)
    if total.name not in ("generated_tokens", "decode_seconds", "run_rates")
)


def parse_mode_choice(text: str | None) -> set[str]:
    """``--modes draft,auto`` -> the chosen groups (None: all of them)."""
    if not text:
        return set(MODE_CHOICES)
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(chosen - set(MODE_CHOICES) - {"plain"})
    if unknown:
        raise DraftpenError(
            f"Unknown bench modes: {', '.join(unknown)}. Choose from {', '.join(MODE_CHOICES)} "
            "(plain decoding always runs)."
        )
    return chosen


def bench_modes(
    chosen: set[str], *, has_draft: bool, exact: bool, constrained: bool = False
) -> list[BenchMode]:
    """The modes to compare: plain first, then the chosen groups that apply to this pair."""
    modes = [BenchMode("plain", "none", 0)]
    if constrained:
        modes.append(BenchMode(UNCONSTRAINED_PLAIN, "none", 0, ignore_constraint=True))
    if "draft" in chosen and has_draft:
        modes += [BenchMode(f"draft model K={k}", "model", k) for k in (2, 4)]
    if "ngram" in chosen:
        modes.append(BenchMode(f"n-gram K={NGRAM_DRAFT_TOKENS}", "ngram", NGRAM_DRAFT_TOKENS))
    if "auto" in chosen:
        modes.append(BenchMode("auto", "auto", 0))
        if exact:
            modes.append(BenchMode("auto, exact", "auto", 0, exact=True))
    return modes


class Decoder(Protocol):
    """Where bench's generations run: the pair in this process (:class:`LocalDecoder`),
    or the engine over its socket (``app.bench.through_engine``)."""

    def decode(
        self, prompt: BenchPrompt, mode: BenchMode, params: SamplingParams, max_tokens: int
    ) -> ModeTotals:
        """One generation of ``prompt`` in ``mode``, summed as a single run."""
        ...

    def prompt_tokens(self, prompt: BenchPrompt) -> Sequence[int] | None:
        """The prompt's tokens, for the yardsticks (None: none can run here)."""
        ...


class LocalDecoder:
    """Generations on a pair loaded in this process: what the loop itself costs."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Each prompt is read and compiled once per run of the suite, not once per mode.
        self._prepared: dict[int, tuple[BenchPrompt, tuple[int, ...], ConstraintSpec | None]] = {}

    def _prepare(self, prompt: BenchPrompt) -> tuple[tuple[int, ...], ConstraintSpec | None]:
        held = self._prepared.get(id(prompt))
        if held is None or held[0] is not prompt:
            held = (prompt, prompt.prompt_tokens(self.engine), prompt.constraint(self.engine))
            self._prepared[id(prompt)] = held
        return held[1], held[2]

    def prompt_tokens(self, prompt: BenchPrompt) -> Sequence[int]:
        """The prompt in the target's chat template."""
        return self._prepare(prompt)[0]

    def decode(
        self, prompt: BenchPrompt, mode: BenchMode, params: SamplingParams, max_tokens: int
    ) -> ModeTotals:
        """One generation in ``mode`` on the loaded pair."""
        tokens, constraint = self._prepare(prompt)
        return _run_mode(self.engine, mode, tokens, params, max_tokens, constraint)


def run_modes(
    decoder: Decoder,
    prompts: list[BenchPrompt],
    modes: list[BenchMode],
    *,
    max_tokens: int,
    repeats: int,
    yardsticks: Sequence[Yardstick] = (),
    progress: bool = True,
    temperature: float = 0.0,
) -> dict[str, dict[str, ModeTotals]]:
    """Run every mode on every prompt, alternating modes prompt by prompt.

    The order of the modes rotates by one from run to run (a run: one prompt in one
    repeat), so over the runs each mode takes every place in the order as often as
    the others: a mode is not favoured by always following the same one, or by
    always coming first after a prompt is read. At ``temperature`` > 0 (with top_p
    0.95, an OpenAI client's defaults) the modes write different texts: their speeds
    and host costs compare, their outputs do not.
    """
    results: dict[str, dict[str, ModeTotals]] = {}
    params = SamplingParams(temperature=temperature, top_p=0.95 if temperature > 0 else 1.0)
    _warm_up(decoder, prompts[0], modes, yardsticks, params)
    runners: list[BenchMode | Yardstick] = [*modes, *yardsticks]
    run = 0
    for repeat in range(repeats):
        for prompt in prompts:
            by_mode = results.setdefault(prompt.category, {})
            shift = run % len(runners)
            for runner in runners[shift:] + runners[:shift]:
                if isinstance(runner, BenchMode):
                    if runner.ignore_constraint and not prompt.constrained:
                        continue  # the same as plain on an unconstrained prompt
                    label = runner.label
                    sample = decoder.decode(prompt, runner, params, max_tokens)
                else:
                    tokens = decoder.prompt_tokens(prompt)
                    assert tokens is not None, "yardsticks run only beside a local pair"
                    label, sample = runner.name, _run_yardstick(runner, tokens, max_tokens)
                totals = by_mode.setdefault(label, ModeTotals())
                totals.add(sample)
                _progress(progress, repeat, repeats, prompt, label, totals, sample)
            run += 1
    return results


def paired_ratios(by_mode: dict[str, ModeTotals], label: str) -> list[float]:
    """Per run, this mode's speed over plain decoding's on the same prompt and repeat."""
    plain = by_mode["plain"].run_rates
    return [rate / base for rate, base in zip(by_mode[label].run_rates, plain, strict=True) if base]


def _run_mode(
    engine: Engine,
    mode: BenchMode,
    tokens: tuple[int, ...],
    params: SamplingParams,
    max_tokens: int,
    constraint: ConstraintSpec | None = None,
) -> ModeTotals:
    """One generation in ``mode`` (under ``constraint`` unless the mode ignores it).

    Each "auto" mode keeps its own acceptance memory across prompts, as a chat session
    does across replies, so no mode profits from what another learned on the same text.
    """
    if mode.drafter == "auto":
        engine.use_acceptance_memory(mode.acceptance_memory, mode.confidence_floor)
    request = GenerationRequest(
        prompt_tokens=tokens,
        params=params,
        max_tokens=max_tokens,
        drafter=mode.drafter,
        draft_tokens=mode.draft_tokens,
        exact=mode.exact,
        constraint=None if mode.ignore_constraint else constraint,
    )
    last = None
    for event in engine.generate(request):
        last = event
    assert last is not None
    return ModeTotals.of_stats(last.stats)


def _run_yardstick(yardstick: Yardstick, tokens: tuple[int, ...], max_tokens: int) -> ModeTotals:
    count, seconds = yardstick.decode_speed(tokens, max_tokens)
    return ModeTotals.of_run(count, seconds)


def _warm_up(
    decoder: Decoder,
    prompt: BenchPrompt,
    modes: list[BenchMode],
    yardsticks: Sequence[Yardstick],
    params: SamplingParams,
) -> None:
    """One short, untimed run of every mode: pages the weights in, warms caches."""
    for mode in modes:
        if mode.ignore_constraint and not prompt.constrained:
            continue
        decoder.decode(prompt, mode, params, WARM_UP_TOKENS)
    if yardsticks:
        tokens = decoder.prompt_tokens(prompt)
        assert tokens is not None, "yardsticks run only beside a local pair"
        for yardstick in yardsticks:
            yardstick.decode_speed(tokens, WARM_UP_TOKENS)


def _progress(
    enabled: bool,
    repeat: int,
    repeats: int,
    prompt: BenchPrompt,
    label: str,
    totals: ModeTotals,
    sample: ModeTotals,
) -> None:
    if not enabled:
        return
    detail = f"accepted {sample.accepted}/{sample.drafted}" if sample.drafted else ""
    print(
        f"  [{repeat + 1}/{repeats}] {prompt.category:<9} {label:<32} "
        f"{totals.tokens_per_second:6.1f} tok/s so far  {detail}",
        file=sys.stderr,
    )


class Yardstick(Protocol):
    """An outside implementation bench compares against."""

    name: str

    def decode_speed(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[int, float]:
        """Greedy-decode; return (tokens, seconds) measured after the first token."""
        ...

    def close(self) -> None:
        """Free it."""
        ...
