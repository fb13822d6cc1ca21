"""What going through the engine costs a front end (a benchmark, not a test).

Measures, on this machine:

1. how long :func:`app.client.ensure_engine` takes to start an engine that loads nothing
   (a front end's first start), and to find a running one;
2. the first request naming a pair: the on-demand load as the client sees it;
3. decode speed of the same greedy generation in this process (``Engine.generate``,
   as ``draftpen generate`` runs it) and through the engine (``EngineClient.chat``,
   the socket and the stream), alternating, ``--repeats`` times each, with the models
   loaded once on each side. The ratio is what the socket and the stream cost;
4. that cost per event without a model: a scripted engine that writes 2,000 one-token
   events, in this process and through an in-process engine (its HTTP face, socket and
   client), so nothing but the path is timed (``--pair none`` runs only this part).

    PYTHONPATH=. python benchmarks/engine_client.py --pair smollm2 --tokens 128 --repeats 3

It starts its own engine on a private socket (DRAFTPEN_HOME stays yours, so a pair's
measured costs are reused) and stops it at the end. Figures vary from run to run on a
shared machine: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from app.client import ChatTurn, EngineClient, ensure_engine
from app.loading import load_engine
from app.settings import load_settings
from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.generation_events import GenerationEvent
from backends.sampling.filters import SamplingParams

PROMPT = "Write a long story about a lighthouse keeper and the sea, in plain prose."
GREEDY = SamplingParams(temperature=0.0)


def decode_rate(events: list[GenerationEvent]) -> tuple[int, float]:
    """Tokens and decode tokens/sec of a generation, from its last event's statistics."""
    stats = events[-1].stats
    return stats.generated_tokens, stats.decode_tokens_per_second


def wall_rate(started: float, first_text: float | None, ended: float, tokens: int) -> float:
    """Tokens/sec from the first text to the end, as the front end saw them arrive."""
    if first_text is None or tokens < 2:
        return 0.0
    return (tokens - 1) / (ended - first_text)


def in_process(engine: Engine, tokens: int) -> tuple[float, float]:
    prompt = engine.chat_prompt([ChatMessage("user", PROMPT)])
    request = GenerationRequest(
        tuple(prompt), GREEDY, max_tokens=tokens, drafter="none", draft_tokens=0
    )
    started = time.perf_counter()
    first: float | None = None
    events = []
    for event in engine.generate(request):
        if event.text and first is None:
            first = time.perf_counter()
        events.append(event)
    count, rate = decode_rate(events)
    return rate, wall_rate(started, first, time.perf_counter(), count)


def through_engine(client: EngineClient, pair: str, tokens: int) -> tuple[float, float]:
    turn = ChatTurn(
        pair,
        (ChatMessage("user", PROMPT),),
        GREEDY,
        max_tokens=tokens,
        drafter="none",
        draft_tokens=0,
        fit_context=False,
    )
    started = time.perf_counter()
    first: float | None = None
    events = []
    for item in client.chat(turn):
        if isinstance(item, GenerationEvent):
            if item.text and first is None:
                first = time.perf_counter()
            events.append(item)
    count, rate = decode_rate(events)
    return rate, wall_rate(started, first, time.perf_counter(), count)


def per_event_cost(repeats: int) -> tuple[float, float]:
    """Milliseconds per event in this process and through the engine (scripted model)."""
    import tests.support.engine_fixtures as fixtures

    text = "word " * 400  # 2,000 one-byte tokens
    fixtures.reply_of = lambda name: text  # every scripted pair writes it
    turn = ChatTurn(
        "alpha",
        (ChatMessage("user", "hi"),),
        GREEDY,
        max_tokens=3000,
        drafter="none",
        draft_tokens=0,
        fit_context=False,
    )
    local: list[float] = []
    remote: list[float] = []
    with fixtures.scripted_engine_server(Path(tempfile.mkdtemp(prefix="dp-bench-"))) as server:
        client = server.client()
        list(client.chat(turn))  # loads the scripted pair
        engine = server.engines[0]
        prompt = tuple(engine.chat_prompt([ChatMessage("user", "hi")]))
        request = GenerationRequest(prompt, GREEDY, max_tokens=3000, drafter="none")
        for _ in range(repeats):
            started = time.perf_counter()
            count = sum(1 for _ in engine.generate(request))
            local.append((time.perf_counter() - started) * 1e3 / count)
            started = time.perf_counter()
            count = len(list(client.chat(turn)))
            remote.append((time.perf_counter() - started) * 1e3 / count)
    return statistics.median(local), statistics.median(remote)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default="smollm2", help="a downloaded pair, or none")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    local_ms, remote_ms = per_event_cost(args.repeats)
    print(
        f"per event, scripted model (2,000 events, median of {args.repeats}): in this process "
        f"{local_ms:.3f} ms, through the engine {remote_ms:.3f} ms (+{remote_ms - local_ms:.3f} "
        "ms for the HTTP face, the socket and the client)"
    )
    if args.pair == "none":
        return
    settings = load_settings()
    socket_path = Path(tempfile.mkdtemp(prefix="dp-bench-")) / "engine.sock"
    os.environ["DRAFTPEN_SOCKET"] = str(socket_path)

    started = time.perf_counter()
    client = ensure_engine(settings)
    start_seconds = time.perf_counter() - started
    started = time.perf_counter()
    ensure_engine(settings)
    find_seconds = time.perf_counter() - started
    pid = client.health().pid
    try:
        started = time.perf_counter()
        client.load(args.pair)
        load_seconds = time.perf_counter() - started
        through_engine(client, args.pair, 8)  # warm the path once

        engine = load_engine(args.pair, n_ctx=settings.context_length)
        try:
            in_process(engine, 8)
            local: list[tuple[float, float]] = []
            remote: list[tuple[float, float]] = []
            for _ in range(args.repeats):
                local.append(in_process(engine, args.tokens))
                remote.append(through_engine(client, args.pair, args.tokens))
        finally:
            engine.close()
    finally:
        os.kill(pid, signal.SIGTERM)

    print(f"pair {args.pair}, {args.tokens} tokens greedy, drafter none, {args.repeats} runs each")
    print(
        f"ensure_engine: start an engine {start_seconds:.2f}s, find a running one "
        f"{find_seconds * 1000:.1f} ms; load {args.pair} on request {load_seconds:.2f}s"
    )
    for name, runs in (("in this process", local), ("through the engine", remote)):
        decode = [rate for rate, _ in runs]
        wall = [rate for _, rate in runs]
        print(
            f"{name:>20}: decode {statistics.median(decode):7.2f} tok/s "
            f"(runs {', '.join(f'{r:.1f}' for r in decode)}); as received "
            f"{statistics.median(wall):7.2f} tok/s"
        )
    ratio = statistics.median(r for _, r in remote) / statistics.median(r for _, r in local)
    print(f"through the engine / in process, as received: {ratio:.3f}x (medians)")
    # Each engine run over the in-process run just before it: drift between the two
    # sides' turns matters less than between their medians.
    pairs = [mine / base for (_, base), (_, mine) in zip(local, remote, strict=True) if base]
    print(
        f"run by run: {', '.join(f'{p:.2f}' for p in pairs)}; median "
        f"{statistics.median(pairs):.3f}x"
    )


if __name__ == "__main__":
    main()
