"""One device call's measurements on a pair of GGUF files (benchmarks/device_measure.sh).

Phases, each its own process, so that a crash or a timeout in one leaves the others':

- ``exact TARGET DRAFT`` (issue 33): the pair loaded twice at once, with llama.cpp's
  default kernels and with exact kernels (``exact_kernels``, what ``exact_output``
  loads); alternating between the two, reading a prompt of each ``--prompts`` size
  (an empty cache, the target alone, up to its first logits) and decoding greedily
  with the drafters ``none``, ``model`` (K=4) and ``auto`` (with ``exact`` requests on
  the exact engine). Also whether each drafter's greedy output equals plain
  decoding's token for token, per kernel choice.
- ``tax TARGET`` (issue 34): plain greedy decoding of the same prompt, in this process
  (``Engine.generate``, as benchmarks/gpu_figures.py runs it), through a real
  ``draftpen serve`` on a private Unix socket (the reply's own statistics), and with
  llama-cpp-python's high-level ``Llama`` (bench's "reference" yardstick); the three
  alternate, the order rotating run by run.

Every figure is printed as it is measured, and ``--json`` is rewritten after each
one, so a call stopped at its limit still returns what was measured.

Environment, also read by the engine process this starts:
    DP_MEASURE_THREADS      threads of every llama.cpp context (default: physical cores)
    DP_MEASURE_GPU_LAYERS   layers offloaded (default: all where the build offloads)
    DP_MEASURE_DEADLINE     Unix time after which no new repeat starts (the first always
                            runs); what was measured is summed up and written

    python -m benchmarks.device_measure exact TARGET DRAFT --json E.json --markdown E.md
    python -m benchmarks.device_measure tax TARGET --json T.json --markdown T.md
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

# First, before anything imports numpy: on the lent GPU machine's image, importing numpy
# (or torch) before llama_cpp made CUDA model loading segfault (benchmarks/gpu_run.sh).
import llama_cpp

from benchmarks.engine_tax_phase import summarize_tax, tax_phase
from benchmarks.exact_kernels_phase import exact_phase, summarize_exact
from benchmarks.phase_results import Results


def apply_knobs() -> dict[str, Any]:
    """Make DP_MEASURE_THREADS / DP_MEASURE_GPU_LAYERS the defaults of every model loaded
    here: draftpen's own (backends.llamacpp.model) and llama-cpp-python's ``Llama`` (bench's
    reference). Returns what was set."""
    import backends.llamacpp.model as ours
    import backends.llamacpp.reference as reference
    from backends.llamacpp.ggml_devices import supports_gpu_offload

    knobs: dict[str, Any] = {}
    threads = os.environ.get("DP_MEASURE_THREADS", "").strip()
    if threads:
        knobs["threads"] = int(threads)
        ours.physical_cores = reference.physical_cores = lambda: int(threads)
    layers = os.environ.get("DP_MEASURE_GPU_LAYERS", "").strip()
    if layers:
        knobs["gpu_layers"] = int(layers)
        original = ours.LlamaCppModel.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("gpu_layers", int(layers))
            original(self, *args, **kwargs)

        ours.LlamaCppModel.__init__ = init  # type: ignore[method-assign]
        if int(layers) == 0:
            reference.supports_gpu_offload = lambda: False
    # A GPU of this machine (llama.cpp's own answer is true in any build with RPC).
    knobs["gpu_offload_in_build"] = supports_gpu_offload()
    knobs["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return knobs


def stopped(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["serve-engine"]:  # the engine process of the tax phase
        apply_knobs()
        from app.main import main as draftpen

        return draftpen(arguments[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    phases = parser.add_subparsers(dest="phase", required=True)
    exact = phases.add_parser("exact", help="exact vs default kernels (issue 33)")
    exact.add_argument("target", type=Path)
    exact.add_argument("draft", type=Path)
    exact.add_argument("--prompts", type=int, nargs="+", default=[1024, 8192])
    tax = phases.add_parser("tax", help="in-process vs engine vs Llama (issue 34)")
    tax.add_argument("target", type=Path)
    tax.add_argument("--context", type=int, default=4096)
    for phase in (exact, tax):
        phase.add_argument("--tokens", type=int, default=128)
        phase.add_argument("--repeats", type=int, default=3)
        phase.add_argument("--json", type=Path, default=None)
        phase.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(arguments)
    os.environ.setdefault("DRAFTPEN_HOME", tempfile.mkdtemp(prefix="dp-measure-home-"))
    meta = {**apply_knobs(), "llama_cpp": llama_cpp.__version__, "started": time.time()}
    results = Results(args.phase, args.json, meta)
    results.save()
    print(f"== {args.phase}: {json.dumps(meta)}", flush=True)
    # Stopped by `timeout`: unwind, so the engine is stopped and the summary written.
    signal.signal(signal.SIGTERM, stopped)
    phase, summarize = {
        "exact": (exact_phase, summarize_exact),
        "tax": (tax_phase, summarize_tax),
    }[args.phase]
    status = 0
    try:
        phase(args, results)
    except (Exception, SystemExit):
        traceback.print_exc()
        results.data["meta"]["error"] = traceback.format_exc()[-2000:]
        status = 1
    finally:  # what was measured is summed up, also after a failure
        results.data["meta"]["seconds"] = round(time.time() - meta["started"], 1)
        try:
            summarize(args, results)
        except Exception:
            traceback.print_exc()
        markdown = results.data.get("markdown") or f"### {args.phase}: no summary\n"
        if status:
            markdown += f"\n(the {args.phase} phase failed: see its JSON's meta.error)\n"
        print(markdown, flush=True)
        if args.markdown is not None:
            with args.markdown.open("a") as file:
                file.write(markdown + "\n")
        results.save()
    return status


if __name__ == "__main__":
    sys.exit(main())
