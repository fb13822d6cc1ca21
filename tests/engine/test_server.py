"""``draftpen serve`` end to end: the real server on a Unix socket, real clients, SmolLM2.

The server starts as a subprocess (tests/support/serve_process.py) and answers the openai
SDK, httpx and curl: the same text as ``draftpen generate``, stats in every chunk,
concurrent clients uncrossed, cached prefixes reported.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.draftpen_cli import run_draftpen
from tests.support.model_files import models_dir
from tests.support.real_runtimes import assert_parts_only_at_a_near_tie
from tests.support.serve_process import (
    COUNTING,
    PAIR,
    RunningServer,
    chat,
    sse_events,
)

# -- the real server, real clients ------------------------------------------------------


@pytest.mark.real_model
def test_models_and_health_answer_over_the_socket(server: RunningServer):
    with server.client() as client:
        models = client.get("/v1/models").json()
        health = client.get("/health").json()
    # Every downloaded pair is listed; the one serve --pair loaded says so.
    cards = {model["id"]: model for model in models["data"]}
    assert cards[PAIR]["loaded"] is True
    assert [name for name, card in cards.items() if card["loaded"]] == [PAIR]
    assert health["status"] == "ok" and health["service"] == "draftpen"
    assert [loaded["pair"] for loaded in health["loaded"]] == [PAIR]
    assert health["queue"]["running"] is None and health["queue"]["waiting"] == 0


@pytest.mark.real_model
def test_socket_file_is_0600(server: RunningServer):
    info = server.socket_path.stat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600


@pytest.mark.real_model
def test_greedy_answer_over_the_socket_equals_draftpen_generate(server: RunningServer):
    prompt = "Write one sentence about the sea."
    generated = run_draftpen(
        "generate",
        "--pair",
        PAIR,
        "--drafter",
        "none",
        "--temperature",
        "0",
        "--max-tokens",
        "40",
        "--json",
        "--prompt",
        prompt,
        env={"DRAFTPEN_MODELS_DIR": str(models_dir())},
    )
    assert generated.returncode == 0, generated.stderr
    expected = json.loads(generated.stdout)["text"]
    assert expected

    # The same decoding as generate's: this compares the server's path (template,
    # tokens, sampling, stop handling), not speculation (see the prediction test).
    answer = server.openai().chat.completions.create(
        model=PAIR,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=40,
        extra_body={"speculative": {"drafter": "none"}},
    )
    assert answer.choices[0].message.content == expected
    assert answer.usage is not None
    assert (
        answer.usage.completion_tokens == json.loads(generated.stdout)["stats"]["generated_tokens"]
    )


@pytest.mark.real_model
def test_openai_sdk_streams_the_same_answer_with_stats_in_every_chunk(server: RunningServer):
    client = server.openai()
    # One fixed drafter for both, so that both take exactly the same decoding path.
    request = chat("Name three fruits.", max_tokens=32)
    request["extra_body"] = {"speculative": {"drafter": "ngram", "k": 4}}
    whole = client.chat.completions.create(**request)
    chunks = list(
        client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    # Every chunk carries the running statistics; the last carries usage.
    generated = [c.model_extra["draftpen"]["generated_tokens"] for c in chunks]
    assert generated == sorted(generated)
    assert all("acceptance_rate" in c.model_extra["draftpen"] for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == generated[-1]


def assert_writes_plain_decodings_text(plain: Any, tokens: list[Any], label: str) -> None:
    """Greedy tokens (logprobs entries) equal plain decoding's ``plain`` (entries with
    their two best alternatives), or part from them only where plain decoding's two best
    tokens nearly tied: the server loads llama.cpp's fastest kernels (exact_output off),
    under which a verify batch may round a near-tie the other way (docs/speculation.md)."""
    plain_tokens = [entry.token for entry in plain]
    other_tokens = [entry.token for entry in tokens]
    if other_tokens == plain_tokens:
        return

    def gap_at(index: int, token: str) -> float:
        alternatives = {top.token: top.logprob for top in plain[index].top_logprobs}
        return plain[index].logprob - alternatives.get(token, float("-inf"))

    assert_parts_only_at_a_near_tie(plain_tokens, other_tokens, gap_at, label)


@pytest.mark.real_model
def test_prediction_drafts_the_answer_and_usage_counts_it(server: RunningServer):
    client = server.openai()
    request = chat("List the days of the week.", max_tokens=40, logprobs=True, top_logprobs=2)
    answer = client.chat.completions.create(
        **request, extra_body={"speculative": {"drafter": "none"}}
    ).choices[0]
    plain, plain_logprobs = answer.message.content, answer.logprobs.content
    assert plain and plain_logprobs
    # With a fixed drafter, a prediction is the draft source (Engine.policy_for).
    steer = {"speculative": {"drafter": "ngram", "k": 8}}
    right = client.chat.completions.create(
        **request, prediction={"type": "content", "content": plain}, extra_body=steer
    )
    assert_writes_plain_decodings_text(
        plain_logprobs, right.choices[0].logprobs.content, "right prediction"
    )
    details = right.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert (
        details.accepted_prediction_tokens + details.rejected_prediction_tokens
        == (right.model_extra["draftpen"]["drafted"])
    )
    assert right.model_extra["draftpen"]["target_passes"] < right.usage.completion_tokens

    wrong = "Zebras eat grass in the savanna every single afternoon, as they always do."
    streamed = list(
        client.chat.completions.create(
            **request,
            prediction={"type": "content", "content": wrong},
            extra_body=steer,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # A wrong prediction costs time, never correctness.
    streamed_logprobs = [
        entry
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for entry in c.choices[0].logprobs.content or ()
    ]
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert_writes_plain_decodings_text(plain_logprobs, streamed_logprobs, "wrong prediction")
    assert streamed[-1].usage.completion_tokens_details.rejected_prediction_tokens > 0


@pytest.mark.real_model
def test_httpx_completions_and_curl_work_over_the_socket(server: RunningServer):
    with server.client() as client:
        response = client.post("/v1/completions", json={**COUNTING, "max_tokens": 6})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 6

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    socket_option = ["--unix-socket", str(server.socket_path)]
    models = subprocess.run(
        [curl, "-sS", *socket_option, "http://draftpen/v1/models"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert PAIR in [card["id"] for card in json.loads(models.stdout)["data"]]
    body = json.dumps(chat("Say hello.", max_tokens=8, stream=True))
    url = "http://draftpen/v1/chat/completions"
    streamed = subprocess.run(
        [
            curl,
            "-sS",
            "-N",
            *socket_option,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    events = list(sse_events(iter(streamed.stdout.splitlines())))
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.real_model
def test_eight_concurrent_clients_get_complete_uncrossed_answers(server: RunningServer):
    """Eight at once on the default engine (``--parallel auto``: four sequences batched,
    fast kernels): each gets its own answer, token for token the one it got alone but
    where a batch rounded a near-tie the other way (tests/engine/test_parallel_serve.py holds
    exact kernels to equality)."""
    topics = ["cats", "rain", "bread", "trains", "music", "mountains", "coffee", "stars"]
    requests = [
        chat(
            # Five alternatives: a batch may round a three-way near-tie to the third.
            f"Write one short sentence about {topic}.",
            max_tokens=24,
            logprobs=True,
            top_logprobs=5,
        )
        for topic in topics
    ]
    sdk = server.openai()
    alone = [sdk.chat.completions.create(**request).choices[0] for request in requests]
    assert len({choice.message.content for choice in alone}) == len(topics)

    def ask(request: dict[str, Any]) -> list[Any]:
        chunks = sdk.chat.completions.create(**request, stream=True)
        return [
            entry
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for entry in c.choices[0].logprobs.content or []
        ]

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        concurrent = list(pool.map(ask, requests))
    for topic, choice, tokens in zip(topics, alone, concurrent, strict=True):
        assert_writes_plain_decodings_text(choice.logprobs.content, tokens, topic)


@pytest.mark.real_model
def test_client_disconnecting_mid_stream_frees_the_engine(server: RunningServer):
    before = server.health()["queue"]["cancelled"]
    with server.client() as client:
        request = {**COUNTING, "max_tokens": 3000, "stream": True}
        request["speculative"] = {"drafter": "none"}
        with client.stream("POST", "/v1/completions", json=request) as response:
            events = sse_events(response.iter_lines())
            for _ in range(3):
                assert isinstance(next(events), dict)
        # Leaving both blocks closes the connection mid-stream.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        queue = server.health()["queue"]
        if queue["cancelled"] > before and queue["running"] is None:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the abandoned generation was not cancelled: {server.health()}")

    with server.client() as client:
        after = client.post("/v1/completions", json={**COUNTING, "max_tokens": 4})
    assert after.status_code == 200
    assert after.json()["usage"]["completion_tokens"] == 4
    assert "cancelled after" in server.log() and "client disconnected" in server.log()


@pytest.mark.real_model
def test_an_agents_second_turn_reports_its_resent_prefix_as_cached(server: RunningServer):
    # Agents resend their whole prompt every turn: a long system prompt, the turns so
    # far, one short new message. The engine reads only what is new, and says so.
    system = "You are a careful coding agent. Project notes follow.\n" + "".join(
        f"Note {index}: the function step_{index} returns {index * 7} for valid input.\n"
        for index in range(120)
    )
    first_turn: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What does step_3 return?"},
    ]
    sdk = server.openai()
    first = sdk.chat.completions.create(**chat("", messages=first_turn, max_tokens=24))
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And step_4?"},
    ]
    chunks = list(
        sdk.chat.completions.create(
            **chat("", messages=second_turn, max_tokens=8),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert first.usage is not None and first.usage.prompt_tokens > 1500
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    # All that turn 1 read is reused; only its reply and the new question are read.
    assert first.usage.prompt_tokens - 4 <= cached < usage.prompt_tokens
    assert usage.prompt_tokens - cached < 60
