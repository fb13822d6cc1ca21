"""Many clients at once: what one client waits while others are served (a benchmark,
not a test; issue 37).

Starts a real ``draftpen serve --pair PAIR`` (and, with ``--peer-llama-server``,
llama.cpp's own ``llama-server`` on the same pair's files) and sends it, over the
OpenAI chat completions API with the ``openai`` SDK, streamed, at temperature 0:

a. a short chat alone: its time to first token (the client's: request sent to the
   first content chunk), median of ``--repeats``;
b. a short chat sent ``--agent-lead`` seconds after an agent-sized request started
   (a ``--agent-tokens`` system prompt of this repository's source, as
   benchmarks/agent_turns.py builds it, ``--agent-max-tokens`` out): its time to first
   token as a multiple of (a), and the agent request's total time;
c. for each N of ``--clients``: N short stories ("Story K: write a short story about
   X", ``--story-max-tokens``) one after another, then N at once: the wall time of
   each and the throughput ratio (completion tokens / wall, at once over in turn);
d. one request alone: decode tokens/s of a ``--decode-max-tokens`` reply (completion
   tokens after the first / time after the first), median of ``--repeats``.

Each short chat and story is numbered anew at its start ("Question K: ..."), so no
figure is a cache hit of a whole prompt; a warm-up runs first.
``--serve-arg`` adds arguments to ``draftpen serve`` (``--serve-arg=--parallel
--serve-arg=4``). The peer gets ``-m TARGET -md DRAFT -np SLOTS -c CONTEXTxSLOTS -t
THREADS --jinja`` and its own speculation defaults (up to 3 draft tokens,
``--spec-draft-p-min 0``); ``--peer-arg`` adds more. Engines run one after the other.

    PYTHONPATH=. DRAFTPEN_MODELS_DIR=~/.cache/draftpen-test-models \\
        python benchmarks/concurrent_requests.py --serve-arg=--parallel --serve-arg=4 \\
        --peer-llama-server /tmp/llama-server-build/bin/llama-server --json OUT.json
    PYTHONPATH=. python benchmarks/concurrent_requests.py --agent-tokens 500 --clients 2 \\
        --story-max-tokens 16 --decode-max-tokens 16 --repeats 1   # a quick check

Needs the pair downloaded (``draftpen models pull starter``). The engine runs in a
DRAFTPEN_HOME of its own (``--home``, default a new temporary one) on a free port, so
a running engine is left alone. Figures scatter on a shared machine: compare ratios.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from benchmarks.agent_turns import PREAMBLE, system_prompt
from benchmarks.serve_process import start_serve, stop_serve, tree_commit

SHORT_QUESTIONS = tuple(
    f"In one sentence, what is {thing}?"
    for thing in ("a Python list", "git rebase", "a hash map", "a unit test", "a compiler")
)
STORY_SUBJECTS = (
    "a lighthouse keeper",
    "a lost robot",
    "a dragon who bakes bread",
    "a clock that runs backwards",
    "a cat on a train",
    "a city under the sea",
    "a forgotten violin",
    "the last tree on Mars",
)
AGENT_PREAMBLE = (
    "You are a coding agent working in the draftpen repository. The files you have "
    "read so far follow.\n\n"
)
AGENT_QUESTION = "Explain step by step, in detail, what backends/speculation/loop.py does."
DECODE_PROMPT = "Write a long, detailed story about a sailor who finds a map."


@dataclass
class Timed:
    """One streamed request as its client saw it (seconds from a shared start)."""

    sent: float
    first_token: float
    done: float
    completion_tokens: int
    prompt_tokens: int

    @property
    def ttft(self) -> float:
        """Time to first token: request sent to the first content chunk."""
        return self.first_token - self.sent


class Chats:
    """An OpenAI-compatible endpoint, timed per request, on one clock."""

    def __init__(
        self, url: str, key: str, model: str, extra_body: dict[str, Any] | None = None
    ) -> None:
        self.sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=3600, max_retries=0)
        self.model = model
        self.extra_body = extra_body  # fields beyond OpenAI's, for every request
        self.clock = time.perf_counter()
        self.questions = itertools.cycle(SHORT_QUESTIONS)
        self.numbers = itertools.count(1)  # each short chat and story is numbered anew

    def now(self) -> float:
        """Seconds since this endpoint's clock started."""
        return time.perf_counter() - self.clock

    def send(self, messages: list[dict[str, str]], max_tokens: int) -> Timed:
        """One streamed chat completion at temperature 0; usage counts its tokens."""
        sent = self.now()
        first: float | None = None
        chunks = 0
        usage: Any = None
        stream = self.sdk.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=self.extra_body,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                if first is None:
                    first = self.now()
            if chunk.usage is not None:
                usage = chunk.usage
        done = self.now()
        tokens = usage.completion_tokens if usage is not None else chunks
        prompt = usage.prompt_tokens if usage is not None else 0
        return Timed(sent, first if first is not None else done, done, tokens, prompt)

    def short(self, max_tokens: int) -> Timed:
        """A short chat: "Question K: In one sentence, what is X?"."""
        content = f"Question {next(self.numbers)}: {next(self.questions)}"
        return self.send([{"role": "user", "content": content}], max_tokens)

    def story(self, subject: str, max_tokens: int) -> Timed:
        """A story: "Story K: write a short story about SUBJECT"."""
        content = f"Story {next(self.numbers)}: write a short story about {subject}."
        return self.send([{"role": "user", "content": content}], max_tokens)


def median(values: list[float]) -> float:
    """The median, rounded for the report."""
    return round(statistics.median(values), 4)


def together(calls: list[Callable[[], Timed]]) -> list[Timed]:
    """Run ``calls`` in threads released at the same moment."""
    barrier = threading.Barrier(len(calls))

    def released(call: Callable[[], Timed]) -> Timed:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(released, calls))


def short_alone(chats: Chats, args: argparse.Namespace) -> dict[str, Any]:
    """(a) A short chat alone: time to first token, median of the repeats."""
    runs = [chats.short(args.short_max_tokens) for _ in range(args.repeats)]
    times = [run.ttft for run in runs]
    return {"ttft_seconds": [round(ttft, 4) for ttft in times], "ttft_median": median(times)}


def short_behind_agent(chats: Chats, args: argparse.Namespace, alone: float) -> dict[str, Any]:
    """(b) A short chat sent ``agent_lead`` s after an agent-sized request started."""
    system = AGENT_PREAMBLE + system_prompt(args.agent_tokens).removeprefix(PREAMBLE)
    agent_messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": AGENT_QUESTION},
    ]
    with ThreadPoolExecutor(1) as pool:
        agent_future = pool.submit(chats.send, agent_messages, args.agent_max_tokens)
        time.sleep(args.agent_lead)
        short = chats.short(args.short_max_tokens)
        agent = agent_future.result()
    return {
        "short_ttft": round(short.ttft, 4),
        "short_ttft_over_alone": round(short.ttft / alone, 2),
        "short_sent_after_agent": round(short.sent - agent.sent, 3),
        "agent_still_running_when_sent": agent.done > short.sent,
        "agent_ttft": round(agent.ttft, 4),
        "agent_total_seconds": round(agent.done - agent.sent, 4),
        "agent_prompt_tokens": agent.prompt_tokens,
        "agent_completion_tokens": agent.completion_tokens,
    }


def stories(chats: Chats, clients: int, max_tokens: int) -> dict[str, Any]:
    """(c) ``clients`` stories in turn, then at once: wall times and throughput ratio."""
    subjects = [STORY_SUBJECTS[i % len(STORY_SUBJECTS)] for i in range(clients)]
    figures: dict[str, Any] = {"clients": clients}
    for mode in ("in_turn", "at_once"):
        started = chats.now()
        if mode == "in_turn":
            runs = [chats.story(subject, max_tokens) for subject in subjects]
        else:
            runs = together([lambda s=s: chats.story(s, max_tokens) for s in subjects])
        wall = chats.now() - started
        tokens = sum(run.completion_tokens for run in runs)
        figures[mode] = {
            "wall_seconds": round(wall, 3),
            "completion_tokens": tokens,
            "tokens_per_second": round(tokens / wall, 2),
            "ttft_max": round(max(run.ttft for run in runs), 3),
        }
    figures["throughput_ratio"] = round(
        figures["at_once"]["tokens_per_second"] / figures["in_turn"]["tokens_per_second"], 2
    )
    return figures


def decode_alone(chats: Chats, args: argparse.Namespace) -> dict[str, Any]:
    """(d) One request alone: decode tokens/s after the first token, median of the repeats."""
    messages = [{"role": "user", "content": DECODE_PROMPT}]
    rates, tokens = [], []
    for _ in range(args.repeats):
        run = chats.send(messages, args.decode_max_tokens)
        rates.append(max(run.completion_tokens - 1, 0) / max(run.done - run.first_token, 1e-9))
        tokens.append(run.completion_tokens)
    return {
        "tokens_per_second": [round(rate, 2) for rate in rates],
        "tokens_per_second_median": median(rates),
        "completion_tokens": tokens,
    }


def workloads(chats: Chats, args: argparse.Namespace) -> dict[str, Any]:
    """A warm-up, then (a) to (d), each printed on stderr as it ends."""

    def shown(label: str, figures: dict[str, Any]) -> dict[str, Any]:
        print(f"  ({label}) {figures}", file=sys.stderr)
        return figures

    chats.short(args.short_max_tokens)
    alone = shown("a", short_alone(chats, args))
    return {
        "short_alone": alone,
        "short_behind_agent": shown("b", short_behind_agent(chats, args, alone["ttft_median"])),
        "stories": [shown("c", stories(chats, n, args.story_max_tokens)) for n in args.clients],
        "decode_alone": shown("d", decode_alone(chats, args)),
    }


def run_draftpen(args: argparse.Namespace) -> dict[str, Any]:
    """The workloads against ``draftpen serve --pair PAIR SERVE_ARGS``."""
    home = args.home or Path(tempfile.mkdtemp(prefix="concurrent-requests-home-"))
    print(f"draftpen serve {' '.join(args.serve_arg)}", file=sys.stderr)
    process, url, key = start_serve(
        args.pair, args.context, home, name="concurrent-requests", arguments=args.serve_arg
    )
    try:
        figures = workloads(Chats(url, key, args.pair), args)
    finally:
        stop_serve(process)
    return {"engine": "draftpen serve", "arguments": args.serve_arg, **figures}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def llama_server(command: list[str]) -> Iterator[str]:
    """``command`` running until /health says ok; its URL. Stopped on leaving."""
    log = Path(tempfile.mkdtemp(prefix="llama-server-")) / "server.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{command[command.index('--port') + 1]}"
    try:
        deadline = time.monotonic() + 1800
        while True:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"llama-server exited ({process.returncode}); its log:\n{tail}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"llama-server was not ready in 30 minutes; see {log}")
            time.sleep(0.5)
        yield url
    finally:
        stop_serve(process)


def run_peer(args: argparse.Namespace) -> dict[str, Any]:
    """The workloads against llama-server on the pair's target and draft GGUFs."""
    from app.models.pair_files import pair_files

    files = pair_files(args.pair, "llamacpp")
    command = [str(args.peer_llama_server), "-m", str(files.target_path)]
    if files.draft_path is not None:
        command += ["-md", str(files.draft_path)]
    command += ["-np", str(args.peer_slots), "-c", str(args.context * args.peer_slots)]
    command += ["-t", str(args.peer_threads), "--jinja"]
    command += ["--host", "127.0.0.1", "--port", str(free_port()), *args.peer_arg]
    print(" ".join(command), file=sys.stderr)
    with llama_server(command) as url:
        figures = workloads(Chats(url, "none", args.pair), args)
    return {"engine": "llama-server", "arguments": command[1:], **figures}


def cpu_name() -> str:
    """The CPU's model name, where /proc/cpuinfo says it."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown"


def report(result: dict[str, Any]) -> None:
    """The plain-text report: settings, then each engine's figures and ratios."""
    print(f"machine: {result['machine']}; CPU: {result['cpu']}; load {result['load_average']}")
    print(f"commit {result['commit']}; pair {result['pair']}; settings {result['settings']}")
    for run in result["engines"]:
        alone = run["short_alone"]
        agent = run["short_behind_agent"]
        print(f"\n{run['engine']} {' '.join(run['arguments'])}")
        print(f"  (a) short chat alone: first token {alone['ttft_median']:.3f} s (median)")
        overlap = "" if agent["agent_still_running_when_sent"] else " (agent had ended)"
        print(
            f"  (b) short chat {agent['short_sent_after_agent']:.1f} s after an agent request: "
            f"first token {agent['short_ttft']:.3f} s = {agent['short_ttft_over_alone']:.2f}x "
            f"alone{overlap}; agent request {agent['agent_total_seconds']:.2f} s in all "
            f"({agent['agent_prompt_tokens']} tokens in, first token {agent['agent_ttft']:.2f} s, "
            f"{agent['agent_completion_tokens']} out)"
        )
        for story in run["stories"]:
            turn, once = story["in_turn"], story["at_once"]
            print(
                f"  (c) {story['clients']} stories: in turn {turn['wall_seconds']:.2f} s "
                f"({turn['tokens_per_second']:.1f} tok/s), at once {once['wall_seconds']:.2f} s "
                f"({once['tokens_per_second']:.1f} tok/s, slowest first token "
                f"{once['ttft_max']:.2f} s): throughput {story['throughput_ratio']:.2f}x"
            )
        decode = run["decode_alone"]
        print(
            f"  (d) one request alone: {decode['tokens_per_second_median']:.1f} tok/s decode "
            f"(median; {decode['completion_tokens']} tokens)"
        )
    if len(result["engines"]) == 2:
        ours, peer = result["engines"]
        print("\ndraftpen over llama-server (above 1: draftpen's figure is larger)")
        for label, pick in (
            ("(a) short first token", lambda r: r["short_alone"]["ttft_median"]),
            ("(b) short first token behind agent", lambda r: r["short_behind_agent"]["short_ttft"]),
            ("(d) decode tok/s", lambda r: r["decode_alone"]["tokens_per_second_median"]),
        ):
            print(f"  {label}: {pick(ours) / pick(peer):.2f}x")
        for mine, theirs in zip(ours["stories"], peer["stories"], strict=True):
            ratio = mine["at_once"]["tokens_per_second"] / theirs["at_once"]["tokens_per_second"]
            print(f"  (c) {mine['clients']} at once, tok/s: {ratio:.2f}x")


def clients_list(text: str) -> list[int]:
    """``4,8`` as [4, 8]."""
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    """Run the workloads against draftpen and/or the peer; print and keep the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--context", type=int, default=4096, help="per client (peer: per slot)")
    parser.add_argument("--serve-arg", action="append", default=[], help="for draftpen serve")
    parser.add_argument("--no-draftpen", action="store_true", help="run only the peer")
    parser.add_argument("--peer-llama-server", type=Path, default=None, metavar="BINARY")
    parser.add_argument("--peer-slots", type=int, default=4, help="llama-server -np")
    parser.add_argument("--peer-threads", type=int, default=None, help="default: physical cores")
    parser.add_argument("--peer-arg", action="append", default=[], help="for llama-server")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--short-max-tokens", type=int, default=32)
    parser.add_argument("--agent-tokens", type=int, default=3000)
    parser.add_argument("--agent-max-tokens", type=int, default=96)
    parser.add_argument("--agent-lead", type=float, default=2.0, help="seconds")
    parser.add_argument("--clients", type=clients_list, default=[4, 8], help="e.g. 4,8")
    parser.add_argument("--story-max-tokens", type=int, default=64)
    parser.add_argument("--decode-max-tokens", type=int, default=128)
    parser.add_argument("--home", type=Path, default=None, help="DRAFTPEN_HOME for the engine")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if args.no_draftpen and args.peer_llama_server is None:
        parser.error("--no-draftpen leaves nothing to run: give --peer-llama-server too")
    if args.peer_threads is None:
        from backends.llamacpp.library import physical_cores

        args.peer_threads = physical_cores()

    left_out = ("pair", "home", "json", "serve_arg", "peer_arg", "no_draftpen")
    settings = {key: value for key, value in vars(args).items() if key not in left_out}
    settings["peer_llama_server"] = str(args.peer_llama_server or "")
    result: dict[str, Any] = {
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs",
        "cpu": cpu_name(),
        "load_average": [round(load, 2) for load in os.getloadavg()],
        "commit": tree_commit(),
        "pair": args.pair,
        "settings": settings,
        "engines": [],
    }
    if not args.no_draftpen:
        result["engines"].append(run_draftpen(args))
    if args.peer_llama_server is not None:
        result["engines"].append(run_peer(args))
    report(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
