"""What returning to a kept conversation costs (a benchmark, not a test).

An agent's ~4,000-token conversation (a system turn and a tool result holding source
code), then one turn of a chat, then the agent's next turn: the engine's conversation
cache brings the agent's state back, and the loop reads only the new turn. The same
next turn is then read from scratch (every cache emptied, nothing kept). The figure is
the ratio of the two prompt costs; the target is <= 10%.

Prompt cost is reported two ways, both from the loop's own statistics:
``prefill_seconds`` (the target's side: keeping the chat's state, restoring the agent's,
reading the new tokens) and ``time_to_first_token`` (also the draft model catching up
on what it has not read, and the first round). The replies are compared too. The kept
reply must equal the one the conversation gets when its turns run back to back
(``--uninterrupted`` measures that as well, reading the first turn once more): the
restored state is the very cache that run would have. The from-scratch reply can
differ at a near-tie, because there the earlier reply's tokens are read in one batch
rather than decoded one by one, and llama.cpp's batched and one-token kernels round
differently (see the README's first section).

    PYTHONPATH=. python benchmarks/conversation_cache.py --pair starter
    PYTHONPATH=. python benchmarks/conversation_cache.py --drafter none --json out.json

Needs the pair downloaded (``draftpen models pull starter``). On a shared machine take
the ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from app.loading import load_engine
from app.settings import conversation_cache_bytes
from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.generation_events import SpeculativeStats
from backends.sampling.filters import SamplingParams

REPO = Path(__file__).resolve().parent.parent
# Source code the agent "read" with a tool: real text of the kind agents send.
SOURCES = (
    "backends/speculation/loop.py",
    "backends/speculation/controller.py",
    "backends/speculation/model_drafter.py",
)
SYSTEM = (
    "You are a coding agent. You read files with tools and answer with short, precise "
    "findings about the code."
)


def source_text(model_tokens: int, engine: Engine) -> str:
    """About ``model_tokens`` tokens of this repository's source, cut at a line."""
    text = "\n\n".join((REPO / name).read_text(encoding="utf-8") for name in SOURCES)
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    # Tokenizing line by line is cheap enough and lands close to the budget.
    used = 0
    for line in lines:
        cost = len(engine.target.tokenize(line, add_special=False))
        if used + cost > model_tokens:
            break
        kept.append(line)
        used += cost
    return "".join(kept)


def agent_turns(engine: Engine, agent_tokens: int) -> list[ChatMessage]:
    """The agent's first request: a task, a tool call and its (long) result."""
    probe = [
        ChatMessage("system", SYSTEM),
        ChatMessage("user", "Review the speculative decoding loop for correctness."),
        ChatMessage("assistant", "I will read the source first."),
        ChatMessage("user", "Tool result (read_files):\n"),
    ]
    overhead = len(engine.chat_prompt(probe))
    code = source_text(agent_tokens - overhead, engine)
    probe[-1] = ChatMessage("user", f"Tool result (read_files):\n{code}")
    return probe


CHAT = [
    ChatMessage("system", "You are a friendly assistant."),
    ChatMessage("user", "Suggest a name for a grey cat, with one sentence on why."),
]


def run(
    engine: Engine, messages: list[ChatMessage], args: argparse.Namespace
) -> tuple[str, SpeculativeStats]:
    """One greedy reply: its text and final statistics."""
    request = GenerationRequest(
        prompt_tokens=tuple(engine.chat_prompt(messages)),
        params=SamplingParams(temperature=0.0),
        max_tokens=args.max_tokens,
        drafter=args.drafter,
        draft_tokens=args.draft_tokens,
    )
    events = list(engine.generate(request))
    return "".join(event.text for event in events), events[-1].stats


def prompt_cost(stats: SpeculativeStats) -> dict[str, Any]:
    """The figures of one reply that describe reading its prompt."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "cached_prompt_tokens": stats.cached_prompt_tokens,
        "prefill_seconds": round(stats.prefill_seconds, 4),
        "time_to_first_token": round(stats.time_to_first_token, 4),
    }


def main() -> None:
    """Run the three turns, then the scratch read; print (and optionally save) figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--runtime", default=None)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--agent-tokens", type=int, default=4000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--drafter", default="model", choices=("model", "ngram", "none"))
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--cache", default="auto", help="conversation cache size (auto, 2GiB)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--uninterrupted",
        action="store_true",
        help="also run the agent's two turns back to back, nothing kept, and compare replies",
    )
    args = parser.parse_args()

    budget = conversation_cache_bytes(args.cache)
    loaded = time.perf_counter()
    engine = load_engine(
        args.pair,
        n_ctx=args.context,
        runtime=args.runtime,
        with_draft=args.drafter == "model",
        calibrate=False,
        conversation_cache_bytes=budget,
    )
    print(f"loaded {args.pair} in {time.perf_counter() - loaded:.1f} s; cache budget {budget} B")
    cache = engine.conversations
    assert cache is not None, "the benchmark needs a conversation cache (--cache > 0)"

    agent = agent_turns(engine, args.agent_tokens)
    first_reply, first = run(engine, agent, args)
    print(f"agent turn 1: {prompt_cost(first)}")
    _, chat = run(engine, CHAT, args)
    print(f"chat turn:    {prompt_cost(chat)}")
    agent_next = [
        *agent,
        ChatMessage("assistant", first_reply),
        ChatMessage("user", "Which function decides how many tokens to draft? Name it only."),
    ]
    kept_reply, kept = run(engine, agent_next, args)
    print(f"agent turn 2 (kept): {prompt_cost(kept)}")
    figures = cache.stats()

    # From scratch: nothing kept, every cache empty.
    engine.conversations = None
    engine.target.rollback(0)
    if engine.draft is not None:
        engine.draft.rollback(0)
    scratch_reply, scratch = run(engine, agent_next, args)
    print(f"agent turn 2 (scratch): {prompt_cost(scratch)}")
    uninterrupted_reply = None
    if args.uninterrupted:
        engine.target.rollback(0)
        if engine.draft is not None:
            engine.draft.rollback(0)
        run(engine, agent, args)
        uninterrupted_reply, uninterrupted = run(engine, agent_next, args)
        print(f"agent turn 2 (uninterrupted): {prompt_cost(uninterrupted)}")
    engine.close()

    prefill_ratio = kept.prefill_seconds / scratch.prefill_seconds
    first_token_ratio = kept.time_to_first_token / scratch.time_to_first_token
    result = {
        "pair": args.pair,
        "drafter": args.drafter,
        "machine": f"{platform.machine()} {platform.system()}",
        "agent_turn_1": prompt_cost(first),
        "chat_turn": prompt_cost(chat),
        "agent_turn_2_kept": prompt_cost(kept),
        "agent_turn_2_scratch": prompt_cost(scratch),
        "prefill_ratio": round(prefill_ratio, 4),
        "time_to_first_token_ratio": round(first_token_ratio, 4),
        "same_reply": kept_reply == scratch_reply,
        "replies": {"kept": kept_reply, "scratch": scratch_reply},
        "conversation_cache": figures.as_dict(),
    }
    print(
        f"returning to the agent's {kept.prompt_tokens}-token conversation: "
        f"prefill {kept.prefill_seconds:.3f} s vs {scratch.prefill_seconds:.3f} s from scratch "
        f"({100 * prefill_ratio:.1f}%), first token {kept.time_to_first_token:.3f} s vs "
        f"{scratch.time_to_first_token:.3f} s ({100 * first_token_ratio:.1f}%); "
        f"same reply: {kept_reply == scratch_reply}"
    )
    if uninterrupted_reply is not None:
        result["replies"]["uninterrupted"] = uninterrupted_reply
        result["kept_equals_uninterrupted"] = kept_reply == uninterrupted_reply
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
