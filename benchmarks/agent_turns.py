"""An agent's second turn reads only what is new (a benchmark, not a test).

Agents resend their whole prompt every turn: a long system prompt (opencode's is about
7k tokens, Claude Code's with its tools about 20k), the conversation so far, and a short
new message. This runs two such turns against a real ``draftpen serve`` over TCP with
the official ``openai`` SDK, streamed, as an agent does:

- turn 1: a ~7k-token system prompt (this repository's source, as agents send files)
  and a question;
- turn 2: the same system prompt and question, turn 1's answer, and a short new question.

It prints each turn's time to first token (measured by the client: request sent to the
first content chunk) beside the engine's own figures (``draftpen.time_to_first_token``,
``prefill_seconds``), and turn 2's ``usage.prompt_tokens_details.cached_tokens``. The
target is that turn 2 costs what reading its new tokens costs at turn 1's rate:

    read rate = (turn 1's first token - one decode round) / turn 1's prompt tokens
    projected = read rate x turn 2's new tokens + one decode round

(the read rate counts the target's prefill and the draft model's, as the first token
waits for both; a decode round is turn 1's mean), and turn 2's first token within 10%
of that. The strict figure, read rate x new tokens alone, is printed too.

That projection is optimistic: a few tokens read at the end of a long context cost
more each than turn 1's average (a small batch, and attention over the whole cache).
``--yardstick TARGET_GGUF`` measures the honest yardstick: llama-cpp-python alone
reading turn 2's new tokens at turn 2's position, with flash attention on (the kernels
draftpen's contexts use) and off (llama-cpp-python's default).

    PYTHONPATH=. python benchmarks/agent_turns.py --pair starter --yardstick TARGET.gguf
    PYTHONPATH=. python benchmarks/agent_turns.py --system-tokens 20000 --context 32768

Needs the pair downloaded (``draftpen models pull starter``). It starts its own engine
on a private socket and a free port, so a running engine is left alone; ``--home``
gives it another DRAFTPEN_HOME (the first load in a home measures forward costs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from benchmarks.serve_process import start_serve, stop_serve

REPO = Path(__file__).resolve().parent.parent
# Real text of the kind agents send: source files, then their docs.
SOURCES = (
    "backends/speculation/loop.py",
    "backends/speculation/controller.py",
    "backends/speculation/model_drafter.py",
    "backends/engine.py",
    "app/engine/api.py",
    "app/engine/queue.py",
)
PREAMBLE = (
    "You are a coding agent working in the draftpen repository. You answer in one or two "
    "short sentences. The files you have read so far follow.\n\n"
)
FIRST_QUESTION = "In one sentence: what does backends/speculation/loop.py do?"
SECOND_QUESTION = "And which file decides how many tokens to draft? Name it only."
# Code is about 4.2 characters a token for Qwen's tokenizer; the report says the real count.
CHARACTERS_PER_TOKEN = 4.2


def system_prompt(tokens: int) -> str:
    """About ``tokens`` tokens: the preamble, then source files, cut at a line."""
    budget = int(tokens * CHARACTERS_PER_TOKEN)
    text = PREAMBLE
    for name in SOURCES:
        text += f"=== {name} ===\n{(REPO / name).read_text(encoding='utf-8')}\n"
        if len(text) >= budget:
            break
    return text[: text.rfind("\n", 0, budget) + 1]


def turn(
    sdk: openai.OpenAI, args: argparse.Namespace, messages: list[dict[str, str]]
) -> dict[str, Any]:
    """One streamed turn: its answer, client-side TTFT, usage and the engine's figures."""
    started = time.perf_counter()
    first_token: float | None = None
    text = ""
    usage: Any = None
    figures: dict[str, Any] = {}
    stream = sdk.chat.completions.create(
        model=args.pair,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first_token is None:
            first_token = time.perf_counter() - started
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
        extra = getattr(chunk, "draftpen", None) or (chunk.model_extra or {}).get("draftpen")
        if extra:
            figures = extra
    assert usage is not None and first_token is not None
    details = usage.prompt_tokens_details
    return {
        "answer": text,
        "time_to_first_token": round(first_token, 4),
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": details.cached_tokens if details else 0,
        "engine_time_to_first_token": figures.get("time_to_first_token"),
        "engine_prefill_seconds": figures.get("prefill_seconds"),
        "decode_round_seconds": (
            figures["decode_seconds"] / figures["rounds"] if figures.get("rounds") else 0.0
        ),
    }


def main() -> None:
    """Two agent turns; print both TTFTs, the cached tokens and the projection."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--system-tokens", type=int, default=7000)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--home", type=Path, default=None, help="DRAFTPEN_HOME for the engine")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--yardstick",
        type=Path,
        default=None,
        metavar="TARGET_GGUF",
        help="also time llama-cpp-python alone reading turn 2's new tokens at turn 2's "
        "position, with the pair's target file (the runtime's own cost of that read)",
    )
    args = parser.parse_args()

    home = args.home or Path(tempfile.mkdtemp(prefix="agent-turns-home-"))
    process, url, key = start_serve(args.pair, args.context, home, name="agent-turns")
    try:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=3600, max_retries=0)
        system = system_prompt(args.system_tokens)
        first_messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": FIRST_QUESTION},
        ]
        first = turn(sdk, args, first_messages)
        print(f"turn 1: {json.dumps({k: v for k, v in first.items() if k != 'answer'})}")
        second_messages = [
            *first_messages,
            {"role": "assistant", "content": first["answer"]},
            {"role": "user", "content": SECOND_QUESTION},
        ]
        second = turn(sdk, args, second_messages)
        print(f"turn 2: {json.dumps({k: v for k, v in second.items() if k != 'answer'})}")
    finally:
        stop_serve(process)

    decode_round = first["decode_round_seconds"]
    per_token = max(0.0, first["time_to_first_token"] - decode_round) / first["prompt_tokens"]
    new_tokens = second["prompt_tokens"] - second["cached_tokens"]
    strict = per_token * new_tokens
    projected = strict + decode_round
    ratio = second["time_to_first_token"] / projected
    result = {
        "pair": args.pair,
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs",
        "turn_1": first,
        "turn_2": second,
        "read_ms_per_token": round(1000 * per_token, 3),
        "decode_round_seconds": round(decode_round, 4),
        "new_tokens": new_tokens,
        "strict_projection": round(strict, 4),
        "projected_turn_2_ttft": round(projected, 4),
        "turn_2_over_projection": round(ratio, 3),
        "turn_2_over_turn_1": round(
            second["time_to_first_token"] / first["time_to_first_token"], 4
        ),
    }
    print(
        f"turn 1: {first['prompt_tokens']} prompt tokens, first token after "
        f"{first['time_to_first_token']:.2f} s ({1000 * per_token:.2f} ms a token read, "
        f"{decode_round:.3f} s a round); "
        f"turn 2: {second['prompt_tokens']} prompt tokens, {second['cached_tokens']} cached, "
        f"{new_tokens} new, first token after {second['time_to_first_token']:.3f} s "
        f"({ratio:.2f}x the projected {projected:.3f} s, strict {strict:.3f} s; "
        f"{100 * result['turn_2_over_turn_1']:.1f}% of turn 1)"
    )
    if args.yardstick is not None:
        # Flash attention on, as draftpen's contexts have it (llama.cpp's default), and
        # off, as llama-cpp-python's Llama has it by default.
        for flash_attn, label in ((True, "flash_attn_on"), (False, "flash_attn_off")):
            read = runtime_read_seconds(
                args.yardstick, args, second["cached_tokens"], new_tokens, flash_attn
            )
            result[f"runtime_reads_new_tokens_seconds_{label}"] = round(read, 4)
            result[f"turn_2_over_runtime_read_{label}"] = round(
                second["time_to_first_token"] / read, 3
            )
            print(
                f"llama-cpp-python alone ({label.replace('_', ' ')}) reads {new_tokens} tokens "
                f"at position {second['cached_tokens']} in {read:.3f} s (to its first "
                f"logits); turn 2's first token took "
                f"{second['time_to_first_token'] / read:.2f}x that"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def runtime_read_seconds(
    path: Path, args: argparse.Namespace, cached: int, new: int, flash_attn: bool
) -> float:
    """llama-cpp-python's own time to read ``new`` tokens after ``cached`` ones (median of 3).

    The yardstick for turn 2: what the runtime alone needs to read its new tokens at
    that position of the context, with the engine's thread count and batch size, the
    cache already holding the shared prefix. (Only the counts and positions matter for
    the time, so the tokens are this prompt's text, not the chat template's.)
    """
    from backends.llamacpp.library import llama_cpp, physical_cores

    threads = physical_cores()
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=args.context,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
    )
    text = system_prompt(args.system_tokens)
    tokens = llm.tokenize(text.encode())
    while len(tokens) < cached + new:
        tokens += tokens
    llm.eval(tokens[:cached])
    times = []
    for _ in range(3):
        llm.n_tokens = cached  # back to the shared prefix (the KV past it is overwritten)
        started = time.perf_counter()
        llm.eval(tokens[cached : cached + new])
        times.append(time.perf_counter() - started)
    llm.close()
    return sorted(times)[1]


if __name__ == "__main__":
    main()
