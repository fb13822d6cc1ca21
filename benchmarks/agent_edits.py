"""Agents' edits of a file they just read, by drafter (a benchmark, not a test).

Coding agents spend their output rewriting what they just read, inside a tool call's
JSON string (issue 39). This sends three such requests, each forcing its tool, greedy,
with ``exact_output = true``, to a real ``draftpen serve`` over TCP, streamed as the
agents stream them:

- ``write``: Claude Code's Write of a whole file through ``/v1/messages``:
  tests/repro/forced_write_messages.json (a 79-line file Read with ``cat -n`` numbers,
  "rename receive_stock to restock and write the whole file back");
- ``edit``: the same conversation asking to change one function (``sell`` refuses a
  count that is not positive), ``tool_choice`` forcing Edit (old_string, new_string);
- ``apply_patch``: Codex's way through ``/v1/responses``: the same file as the plain
  output of an earlier ``shell`` call (``sed -n '1,200p'``, no line numbers), the rename
  asked for, and a function tool ``apply_patch`` (one string, ``input``) forced.

Asked only before the file, the starter's 1.5B target writes a placeholder
(``"content": "<tool_response>...</tool_response>"``) or a patch of line numbers, so
each request asks again after the file, as a user does when a model hesitates (and as
tests/speculation/test_tool_call_drafting_real.py does); ``--as-is`` leaves that out (``write``:
the repro exactly).

Each drafter of ``--drafters`` gets an engine of its own, started fresh with the
settings' ``drafter`` set to it (as an agent, which cannot choose one, meets it) and no
conversation or prefix cache: each engine meets the same requests in the same order
from the same start. Per request and drafter it prints, from the engine's own statistics (the
``draftpen`` field of each reply): output tokens, decode tokens/s and the ratio to
``none``, draft tokens accepted per round that drafted (``acc/round``), tokens per
target pass, the share of output tokens that were accepted drafts, the loop's host
milliseconds per token, how the reply ended, and whether its text (the calls'
arguments as written) equals ``none``'s, which exact mode promises.

    PYTHONPATH=. python benchmarks/agent_edits.py --json OUT.json
    PYTHONPATH=. python benchmarks/agent_edits.py --drafters none,auto --max-tokens 200

Needs the pair downloaded (``draftpen models pull starter``): the engines run in a
DRAFTPEN_HOME of their own (``--home``, default a new temporary one; the first load in
a home measures forward costs) but read the models from your store
(``$DRAFTPEN_MODELS_DIR``, else your data directory's). A running engine is left alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from app.settings import MODELS_DIR_ENV, SETTINGS_FILENAME, Settings, models_dir, save_settings
from backends.engine import DRAFTER_CHOICES as DRAFTERS
from benchmarks.serve_process import start_serve, stop_serve, tree_commit

REPO = Path(__file__).resolve().parent.parent
REPRO = REPO / "tests" / "repro" / "forced_write_messages.json"
WRITE_RESTATED = (
    "Now call Write with file_path /work/shop/inventory.py and content: the complete "
    "file above, every line, with receive_stock renamed to restock."
)
EDIT_ASK = (
    'In /work/shop/inventory.py, make sell raise ValueError("count must be positive") '
    "when count is not positive."
)
EDIT_RESTATED = (
    "Now call Edit with file_path /work/shop/inventory.py, old_string: the whole sell "
    "method copied from the file, from its def line to its return line, and new_string: "
    "the same lines with the count check added after the def line."
)
PATCH_ASK = "In shop/inventory.py, rename the method receive_stock to restock."
PATCH_RESTATED = (
    "Now call apply_patch: one hunk for shop/inventory.py whose lines are the "
    "receive_stock method copied from the file, its def line removed and added back "
    "with the name restock, every other line kept."
)
CODEX_INSTRUCTIONS = (
    "You are a coding agent running in a terminal, in the user's repository. Read files "
    "with shell and change them with apply_patch. Keep everything you do not need to "
    "change exactly as it is."
)
# Codex's format in words (an example in the description is copied by a small model).
APPLY_PATCH_FORMAT = (
    "Edit files with a patch. input is the whole patch: the line '*** Begin Patch'; for "
    "each file, a line '*** Update File: PATH' and then its hunks; the line "
    "'*** End Patch'. A hunk is a line '@@', then the file's lines around the change, "
    "each starting with one character: ' ' for a line kept, '-' for a line removed, '+' "
    "for a line added, with three kept lines before and after each change."
)
SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
APPLY_PATCH_TOOL = {
    "type": "function",
    "name": "apply_patch",
    "description": APPLY_PATCH_FORMAT,
    "parameters": {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The whole patch, as above."}},
        "required": ["input"],
        "additionalProperties": False,
    },
}
REQUESTS = ("write", "edit", "apply_patch")
LABELS = {
    "write": "Write of the whole file (Claude Code, /v1/messages)",
    "edit": "Edit of one function (Claude Code, /v1/messages)",
    "apply_patch": "apply_patch of the rename (Codex, /v1/responses)",
}


def repro_body() -> dict[str, Any]:
    """tests/repro/forced_write_messages.json as it is."""
    return json.loads(REPRO.read_text(encoding="utf-8"))


def restated(body: dict[str, Any], request: str | None) -> dict[str, Any]:
    """``body`` with ``request`` asked again after the file (None: as it is)."""
    if request is not None:
        body["messages"] += [
            {"role": "assistant", "content": "I have read the file."},
            {"role": "user", "content": request},
        ]
    return body


def write_body(max_tokens: int, restate: bool) -> dict[str, Any]:
    """The repro's Messages body, streamed, the rename restated after the file."""
    body = {**repro_body(), "max_tokens": max_tokens, "stream": True}
    return restated(body, WRITE_RESTATED if restate else None)


def edit_body(max_tokens: int, restate: bool) -> dict[str, Any]:
    """The same conversation, asking for one function's change, Edit forced."""
    body = {**repro_body(), "max_tokens": max_tokens, "stream": True}
    body["messages"][0]["content"] = EDIT_ASK
    body["tool_choice"] = {"type": "tool", "name": "Edit"}
    return restated(body, EDIT_RESTATED if restate else None)


def read_file_text() -> str:
    """The repro's file as it is on disk: its Read result without ``cat -n``'s numbers."""
    result = repro_body()["messages"][2]["content"][0]["content"]
    text = "".join(line.split("\t", 1)[1] for line in result.splitlines(keepends=True))
    return text if text.endswith("\n") else text + "\n"


def patch_body(max_tokens: int, restate: bool) -> dict[str, Any]:
    """Codex's turn: the file read with ``sed`` through shell, then apply_patch forced."""
    command = ["bash", "-lc", "sed -n '1,200p' shop/inventory.py"]
    output = f"Exit code: 0\nWall time: 0 seconds\nOutput:\n{read_file_text()}"
    return {
        "model": repro_body()["model"],
        "instructions": CODEX_INSTRUCTIONS,
        "input": [
            {"role": "user", "content": PATCH_ASK},
            {
                "type": "function_call",
                "call_id": "call_01",
                "name": "shell",
                "arguments": json.dumps({"command": command, "workdir": "/work"}),
            },
            {"type": "function_call_output", "call_id": "call_01", "output": output},
            *([{"role": "user", "content": PATCH_RESTATED}] if restate else []),
        ],
        "tools": [SHELL_TOOL, APPLY_PATCH_TOOL],
        "tool_choice": {"type": "function", "name": "apply_patch"},
        "parallel_tool_calls": False,  # as Codex sends it for most models
        "temperature": 0,
        "max_output_tokens": max_tokens,
        "store": False,
        "stream": True,
    }


def request(name: str, max_tokens: int, restate: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of request ``name``."""
    if name == "write":
        return "/v1/messages", write_body(max_tokens, restate)
    if name == "edit":
        return "/v1/messages", edit_body(max_tokens, restate)
    return "/v1/responses", patch_body(max_tokens, restate)


def start_engine(
    args: argparse.Namespace, home: Path, drafter: str
) -> tuple[subprocess.Popen[str], str, str]:
    """``draftpen serve --pair P`` with the settings' drafter; its process, URL and key."""
    exact = not args.default_kernels
    settings = Settings(drafter=drafter, exact_output=exact, temperature=0.0)  # type: ignore[arg-type]
    save_settings(settings, home / "config" / SETTINGS_FILENAME)
    return start_serve(
        args.pair,
        args.context,
        home,
        name="agent-edits",
        arguments=("--conversation-cache", "0", "--prefix-cache", "0"),
        # The models stay where the user pulled them, whatever home the engine runs in.
        environment={MODELS_DIR_ENV: str(models_dir())},
    )


@dataclasses.dataclass
class Reply:
    """What came back: the text as written (texts and calls' arguments), the stop
    reason, the engine's ``draftpen`` figures, and the client's wall time."""

    output: str = ""
    stop: str | None = None
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


def sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) for each server-sent event."""
    name = ""
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: ") and line != "data: [DONE]":
            yield name, json.loads(line.removeprefix("data: "))


def messages_reply(events: Iterator[tuple[str, dict[str, Any]]]) -> Reply:
    """A streamed Messages reply: text blocks and each call's name and raw arguments."""
    reply = Reply()
    for name, data in events:
        if name == "content_block_start":
            block = data["content_block"]
            if block["type"] == "tool_use":
                reply.output += ("\n" if reply.output else "") + f"[{block['name']}] "
        elif name == "content_block_delta":
            delta = data["delta"]
            reply.output += delta.get("text") or delta.get("partial_json") or ""
        elif name == "message_delta":
            reply.stop = data["delta"]["stop_reason"]
            reply.stats = data.get("draftpen", {})
        elif name == "error":
            raise SystemExit(f"the engine answered with an error: {data}")
    return reply


def responses_reply(events: Iterator[tuple[str, dict[str, Any]]]) -> Reply:
    """A streamed Responses reply, read from its last event's whole response."""
    reply = Reply()
    for name, data in events:
        if name in ("response.completed", "response.incomplete", "response.failed"):
            response = data["response"]
            reply.stats = response.get("draftpen", {})
            details = response.get("incomplete_details") or {}
            reply.stop = details.get("reason") or response["status"]
            for item in response["output"]:
                if item["type"] == "function_call":
                    reply.output += ("\n" if reply.output else "") + f"[{item['name']}] "
                    reply.output += item["arguments"]
                elif item["type"] == "message":
                    reply.output += "".join(part.get("text", "") for part in item["content"])
        elif name == "error":
            raise SystemExit(f"the engine answered with an error: {data}")
    return reply


def send(client: httpx.Client, path: str, body: dict[str, Any]) -> Reply:
    """One streamed request, read as its agent reads it."""
    started = time.perf_counter()
    with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"{path} answered {response.status_code}: {response.read()!r}")
        events = sse(response.iter_lines())
        reply = messages_reply(events) if path == "/v1/messages" else responses_reply(events)
    reply.seconds = time.perf_counter() - started
    return reply


def figures(reply: Reply) -> dict[str, Any]:
    """What the table shows of one reply, and the engine's figures behind it."""
    stats = reply.stats
    generated = stats.get("generated_tokens", 0)
    accepted = stats.get("accepted", 0)
    return {
        "output_tokens": generated,
        "decode_tokens_per_second": stats.get("decode_tokens_per_second", 0.0),
        "accepted_per_round": stats.get("mean_accepted_length", 0.0),
        "tokens_per_target_pass": stats.get("tokens_per_target_pass", 0.0),
        "drafted_share": round(accepted / generated, 4) if generated else 0.0,
        "host_ms_per_token": stats.get("host_ms_per_token", 0.0),
        "stop": reply.stop,
        "prompt_tokens": stats.get("prompt_tokens", 0),
        "client_seconds": round(reply.seconds, 3),
        "draftpen": stats,
        "output": reply.output,
    }


def parting(text: str, plain: str) -> int:
    """Where ``text`` first differs from ``plain`` (characters in)."""
    return next(
        (at for at, (mine, theirs) in enumerate(zip(text, plain, strict=False)) if mine != theirs),
        min(len(text), len(plain)),
    )


def print_table(name: str, rows: dict[str, dict[str, Any]]) -> None:
    """One request's table: a line per drafter, ratios and sameness against ``none``."""
    plain = rows.get("none")
    prompt = next(iter(rows.values()))["prompt_tokens"]
    print(f"\n{name}: {LABELS[name]}; prompt {prompt} tokens")
    header = (
        f"{'drafter':<8} {'tokens':>6} {'tok/s':>6} {'vs none':>7} {'acc/round':>9} "
        f"{'tok/pass':>8} {'drafted':>7} {'host ms/tok':>11} {'end':>17}  same as none"
    )
    print(header)
    for drafter, row in rows.items():
        ratio = (
            f"{row['decode_tokens_per_second'] / plain['decode_tokens_per_second']:.2f}x"
            if plain and plain["decode_tokens_per_second"]
            else "-"
        )
        if plain is None or drafter == "none":
            same = "-"
        elif row["output"] == plain["output"]:
            same = "yes"
        else:
            same = f"NO (parts at character {parting(row['output'], plain['output'])})"
        print(
            f"{drafter:<8} {row['output_tokens']:>6} {row['decode_tokens_per_second']:>6.1f} "
            f"{ratio:>7} {row['accepted_per_round']:>9.2f} "
            f"{row['tokens_per_target_pass']:>8.2f} {100 * row['drafted_share']:>6.1f}% "
            f"{row['host_ms_per_token']:>11.3f} {row['stop'] or '-':>17}  {same}"
        )


def main() -> None:
    """Each drafter's engine in turn, the three requests to each; print and keep the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="starter")
    parser.add_argument("--drafters", default="none,auto,ngram", help="comma-separated")
    parser.add_argument("--requests", default=",".join(REQUESTS), help="comma-separated")
    parser.add_argument("--max-tokens", type=int, default=1600)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--as-is", action="store_true", help="send the repro exactly")
    parser.add_argument("--default-kernels", action="store_true", help="exact_output = false")
    parser.add_argument("--home", type=Path, default=None, help="DRAFTPEN_HOME for the engines")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    drafters = [name.strip() for name in args.drafters.split(",") if name.strip()]
    names = [name.strip() for name in args.requests.split(",") if name.strip()]
    for kind, given, known in (("request", names, REQUESTS), ("drafter", drafters, DRAFTERS)):
        if unknown := [name for name in given if name not in known]:
            parser.error(f"unknown {kind} {unknown[0]!r}: choose from {', '.join(known)}")

    home = args.home or Path(tempfile.mkdtemp(prefix="agent-edits-home-"))
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    for drafter in drafters:
        process, url, key = start_engine(args, home, drafter)
        try:
            headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
            with httpx.Client(base_url=url, headers=headers, timeout=3600) as client:
                for name in names:
                    path, body = request(name, args.max_tokens, not args.as_is)
                    body["model"] = args.pair
                    row = figures(send(client, path, body))
                    results[name][drafter] = row
                    print(
                        f"{drafter} {name}: {row['output_tokens']} tokens, "
                        f"{row['decode_tokens_per_second']:.1f} tok/s, "
                        f"{row['client_seconds']:.1f} s",
                        file=sys.stderr,
                    )
        finally:
            stop_serve(process)
        if args.json is not None:  # after each drafter: a long run that fails keeps its part
            write_json(args, results)

    for name in names:
        print_table(name, results[name])


def write_json(args: argparse.Namespace, results: dict[str, dict[str, dict[str, Any]]]) -> None:
    """The figures so far, with what was run where."""
    result = {
        "pair": args.pair,
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs",
        "commit": tree_commit(),
        "max_tokens": args.max_tokens,
        "context": args.context,
        "exact_output": not args.default_kernels,
        "restated": not args.as_is,
        "requests": results,
    }
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
