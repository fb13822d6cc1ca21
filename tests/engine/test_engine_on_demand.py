"""The engine's scheduler and queue through its real HTTP face, over scripted pairs.

The real server (uvicorn on a Unix socket, the scheduler, the one worker) runs in this
process; its loader builds scripted engines instead of reading model files, so these
tests check what the engine decides (what to load, when to unload, who waits for what,
when to stop) in well under a second each. ``tests/engine/test_engine_clients.py`` checks the
same through a real ``draftpen serve`` process with a real model.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from app.client import CancelFlag, ChatTurn, EngineRequestError, Loading, Waiting
from app.client.chat_stream import chat_item
from app.engine.command import parse_duration
from app.errors import DraftpenError
from backends.base import ChatMessage
from backends.generation_events import GenerationEvent
from backends.output.reasoning import ReasoningFormat
from backends.sampling.filters import SamplingParams
from tests.support.draftpen_cli import assert_clean_error, run_draftpen
from tests.support.engine_fixtures import reply_of, scripted_engine_server, wait_until
from tests.support.thinking_model import ThinkingByteModel, thinking_reply

GREEDY = SamplingParams(temperature=0.0)


def turn(pair: str, text: str = "Hi!", **fields: object) -> ChatTurn:
    """A greedy one-message chat turn."""
    return ChatTurn(pair, (ChatMessage("user", text),), GREEDY, **fields)  # type: ignore[arg-type]


def reply_text(items: list[object]) -> str:
    return "".join(item.text for item in items if isinstance(item, GenerationEvent))


def sdk_answer(sdk: openai.OpenAI, pair: str, text: str = "Hi!") -> str:
    answer = sdk.chat.completions.create(
        model=pair, messages=[{"role": "user", "content": text}], temperature=0
    )
    return answer.choices[0].message.content or ""


def test_a_request_naming_a_pair_loads_it_and_the_models_list_says_which(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        client = engine.client()
        assert {card.id: card.loaded for card in client.pairs()} == {
            "alpha": False,
            "beta": False,
        }
        assert client.health().loaded == []

        assert sdk_answer(engine.openai(), "alpha") == reply_of("alpha")
        assert {card.id: card.loaded for card in client.pairs()} == {"alpha": True, "beta": False}
        assert [pair.pair for pair in client.health().loaded] == ["alpha"]

        # One pair in memory at a time: the other one replaces it.
        assert sdk_answer(engine.openai(), "beta") == reply_of("beta")
        assert {card.id: card.loaded for card in client.pairs()} == {"alpha": False, "beta": True}
        assert [name for name, _ in engine.loads] == ["alpha", "beta"]
        assert engine.engines[0].closed and not engine.engines[1].closed
        assert client.health().loads == 2


def test_many_clients_asking_for_one_pair_at_once_load_it_once(tmp_path: Path):
    with scripted_engine_server(tmp_path, load_seconds=0.5) as engine:
        sdk = engine.openai()
        client = engine.client()

        def ask(index: int) -> str:
            if index == 0:
                return reply_text(list(client.chat(turn("alpha"))))
            return sdk_answer(sdk, "alpha")

        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(ask, range(4)))
        assert answers == [reply_of("alpha")] * 4
        assert [name for name, _ in engine.loads] == ["alpha"]
        assert client.health().loads == 1


def test_client_chat_streams_the_load_then_events_with_provenance_and_stats(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        items = list(engine.client().chat(turn("alpha")))
    loading = [item.text for item in items if isinstance(item, Loading)]
    assert "reading alpha" in loading
    events = [item for item in items if isinstance(item, GenerationEvent)]
    # Every notice comes before the first event.
    assert items.index(events[0]) > max(
        items.index(item) for item in items if isinstance(item, Loading)
    )
    assert reply_text(items) == reply_of("alpha")
    for event in events:
        assert "".join(segment.text for segment in event.segments) == event.text
    assert events[-1].finish_reason == "stop"
    assert events[-1].stats.generated_tokens == len(reply_of("alpha").encode())  # a token a byte
    counts = [event.stats.generated_tokens for event in events]
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_a_waiting_request_is_told_its_place_and_what_it_waits_behind(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        engine.openai()  # warm nothing: the first request loads
        sdk_answer(engine.openai(), "alpha")  # loaded, so the rest only queue
        engine.gate.clear()
        client = engine.client()
        agent_done: list[str] = []
        agent = threading.Thread(
            target=lambda: agent_done.append(sdk_answer(engine.openai(), "alpha"))
        )
        agent.start()
        wait_until(lambda: client.health().queue.running == "agent request (alpha)", "the agent")

        first: list[object] = []
        second: list[object] = []
        chats = [
            threading.Thread(target=lambda: first.extend(client.chat(turn("alpha")))),
            threading.Thread(target=lambda: second.extend(client.chat(turn("alpha")))),
        ]
        chats[0].start()
        wait_until(lambda: client.health().queue.waiting == 1, "the first chat to queue")
        chats[1].start()
        wait_until(lambda: client.health().queue.waiting == 2, "the second chat to queue")
        engine.gate.set()
        for thread in [agent, *chats]:
            thread.join(20)

    assert agent_done == [reply_of("alpha")]
    assert [item for item in first if isinstance(item, Waiting)] == [
        Waiting(1, ("agent request (alpha)",))
    ]
    # The second moves up when the agent's request is done, and is told so.
    assert [item for item in second if isinstance(item, Waiting)] == [
        Waiting(2, ("agent request (alpha)", "chat (alpha)")),
        Waiting(1, ("chat (alpha)",)),
    ]
    assert reply_text(first) == reply_text(second) == reply_of("alpha")


def test_keep_alive_unloads_an_idle_pair_and_the_next_request_loads_it_again(tmp_path: Path):
    with scripted_engine_server(tmp_path, keep_alive=0.3) as engine:
        client = engine.client()
        assert sdk_answer(engine.openai(), "alpha") == reply_of("alpha")
        health = client.health()
        assert health.keep_alive_seconds == 0.3
        wait_until(lambda: client.health().loaded == [], "keep-alive to unload alpha")
        assert engine.engines[0].closed
        assert sdk_answer(engine.openai(), "alpha") == reply_of("alpha")
        assert [name for name, _ in engine.loads] == ["alpha", "alpha"]


def test_without_keep_alive_the_pair_stays(tmp_path: Path):
    with scripted_engine_server(tmp_path, keep_alive=None) as engine:
        sdk_answer(engine.openai(), "alpha")
        time.sleep(0.5)
        loaded = engine.client().health().loaded
        assert [pair.pair for pair in loaded] == ["alpha"] and loaded[0].unloads_in is None


def test_load_reloads_with_a_new_context_and_streams_its_progress(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        client = engine.client()
        progress: list[str] = []
        loaded = client.load("alpha", on_progress=progress.append)
        assert loaded.pair == "alpha" and loaded.context_length == 4096
        assert "reading alpha" in progress

        progress.clear()
        assert client.load("alpha", on_progress=progress.append).pair == "alpha"
        assert progress == [] and len(engine.loads) == 1  # already held as asked

        reloaded = client.load("alpha", on_progress=progress.append, context_length=256)
        assert reloaded.context_length == 256 and "reading alpha" in progress
        assert [options.context_length for _, options in engine.loads] == [4096, 256]
        assert client.health().loaded[0].context_length == 256


def test_a_pair_that_is_not_downloaded_is_refused_naming_those_that_are(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        client = engine.client()
        with pytest.raises(EngineRequestError, match="alpha, beta") as refused:
            list(client.chat(turn("gamma")))
        assert refused.value.status == 404 and refused.value.code == "model_not_found"
        with pytest.raises(EngineRequestError, match="not a draftpen pair"):
            client.load("gamma")
        with pytest.raises(openai.NotFoundError):
            sdk_answer(engine.openai(), "gamma")
        assert engine.loads == []


def test_fit_context_leaves_out_the_oldest_turns_instead_of_refusing(tmp_path: Path):
    long_turn = "word " * 60
    messages: list[ChatMessage] = []
    for index in range(6):
        messages += [ChatMessage("user", f"{index} {long_turn}"), ChatMessage("assistant", "ok")]
    messages.append(ChatMessage("user", "And now?"))
    with scripted_engine_server(tmp_path, n_ctx=512) as engine:
        client = engine.client()
        tight = ChatTurn("alpha", tuple(messages), GREEDY, max_tokens=64, fit_context=False)
        with pytest.raises(EngineRequestError, match="context") as refused:
            list(client.chat(tight))
        assert refused.value.code == "context_length_exceeded"

        fitted = ChatTurn("alpha", tuple(messages), GREEDY, max_tokens=64, fit_context=True)
        items = list(client.chat(fitted))
        assert [item for item in items if isinstance(item, GenerationEvent)][-1].finish_reason
        request = engine.engines[0].requests[-1]
        prompt = bytes(token - 4 for token in request.prompt_tokens if token >= 4).decode()
        # The newest message stays, the oldest turns are gone, a reply fits.
        assert prompt.endswith("And now?") and "0 word" not in prompt
        assert len(request.prompt_tokens) + 64 <= 512


def test_a_plain_openai_stream_still_gets_its_400_after_waiting_for_a_load(tmp_path: Path):
    with scripted_engine_server(tmp_path, n_ctx=128, load_seconds=0.2) as engine:
        with pytest.raises(openai.BadRequestError, match="context"):
            list(
                engine.openai().chat.completions.create(
                    model="alpha",
                    # Longer than the whole context: a max_tokens past the room left
                    # would only be a ceiling, a prompt that cannot fit is refused.
                    messages=[{"role": "user", "content": "Hi " * 100}],
                    max_tokens=10,
                    stream=True,
                )
            )
        assert [name for name, _ in engine.loads] == ["alpha"]


def test_cancel_closes_the_stream_and_the_engine_counts_it_cancelled(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        client = engine.client()
        sdk_answer(engine.openai(), "alpha")
        engine.gate.clear()
        cancel = CancelFlag()
        seen: list[object] = []
        waiter = threading.Thread(
            target=lambda: seen.extend(client.chat(turn("alpha"), cancel)), daemon=True
        )
        waiter.start()
        wait_until(lambda: client.health().queue.running is not None, "the chat to run")
        cancel.set()  # the stream's keep-alive comments let the client notice at once
        waiter.join(5)
        assert not waiter.is_alive()
        # Open the gate only once the engine has seen the stream close (on its next
        # keep-alive write, up to a second later): opened before, the reply may finish.
        job = engine.server.queue._running
        assert job is not None
        wait_until(job.cancel_event.is_set, "the engine to see the stream closed")
        engine.gate.set()
        wait_until(lambda: client.health().queue.cancelled == 1, "the engine to cancel it")
        assert not [item for item in seen if isinstance(item, GenerationEvent) and item.text]


def test_idle_exit_waits_for_attached_clients_then_stops(tmp_path: Path):
    with scripted_engine_server(tmp_path, idle_exit=0.3) as engine:
        assert engine.thread is not None
        client = engine.client()
        with client.attach():
            assert client.health().attached_clients == 1 and client.health().idle_exit
            sdk_answer(engine.openai(), "alpha")
            time.sleep(1.0)
            assert engine.thread.is_alive()  # attached: it stays
        engine.thread.join(10)
        assert not engine.thread.is_alive()
        assert not engine.socket_path.exists()


def test_chat_items_are_read_from_stream_chunks():
    assert chat_item(
        {"choices": [], "draftpen": {"queue": {"position": 2, "ahead": ["a", "b"]}}}
    ) == Waiting(2, ("a", "b"))
    assert chat_item({"choices": [], "draftpen": {"loading": "reading"}}) == Loading("reading")
    assert chat_item({"choices": [], "usage": {}}) is None
    role_only = {
        "choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
    }
    assert chat_item(role_only) is None
    chunk = {
        "choices": [{"delta": {"content": "ab"}, "finish_reason": None}],
        "draftpen": {
            "segments": [["a", True], ["b", False]],
            "generated_tokens": 2,
            "accepted_length_histogram": [0, 1],
            "acceptance_rate": 0.5,
            "drafter": "ngram",
            "decision": "ngram K=3",
        },
    }
    event = chat_item(chunk)
    assert isinstance(event, GenerationEvent) and event.text == "ab"
    assert [(s.text, s.from_draft) for s in event.segments] == [("a", True), ("b", False)]
    assert event.stats.generated_tokens == 2 and event.stats.accepted_length_histogram == (0, 1)
    assert event.drafter == "ngram" and event.decision == "ngram K=3"
    # With provenance the segments are the text: a chunk's rendering alone adds none.
    rendering = {"choices": [{"delta": {"content": "b"}, "finish_reason": None}], "draftpen": {}}
    assert chat_item(rendering) is None
    plain = chat_item(rendering, provenance=False)
    assert isinstance(plain, GenerationEvent) and plain.text == "b"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300.0),
        ("30s", 30.0),
        ("1h", 3600.0),
        ("90", 90.0),
        ("0", 0.0),
        ("-1", None),
        ("250ms", 0.25),
    ],
)
def test_durations_are_read_as_ollama_writes_them(text: str, seconds: float | None):
    assert parse_duration(text, "--keep-alive") == seconds


def test_a_bad_duration_names_what_is_accepted():
    with pytest.raises(DraftpenError, match="--keep-alive wants a duration such as 5m"):
        parse_duration("soon", "--keep-alive")


def test_stopping_the_engine_ends_attached_connections_at_once(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        assert engine.thread is not None
        client = engine.client()
        with client.attach():
            wait_until(lambda: client.health().attached_clients == 1, "the attachment")
            engine.server.stop()
            # uvicorn waits up to 30s for open responses: an attach stream that did not
            # end on shutdown would keep the engine running past this join.
            engine.thread.join(10)
            assert not engine.thread.is_alive()


def test_generate_with_engine_asks_the_running_engine_instead_of_loading(tmp_path: Path):
    with scripted_engine_server(tmp_path) as engine:
        env = {"DRAFTPEN_SOCKET": str(engine.socket_path)}
        result = run_draftpen(
            "generate", "--engine", "--pair", "beta", "--prompt", "Hi!", "--json", env=env
        )
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer["text"] == reply_of("beta") and answer["finish_reason"] == "stop"
        assert answer["stats"]["generated_tokens"] == len(reply_of("beta").encode())
        assert "loading beta" in result.stderr  # the engine's progress, passed on
        assert [name for name, _ in engine.loads] == ["beta"]

        raw = run_draftpen("generate", "--engine", "--raw", "--prompt", "Hi!", env=env)
        assert_clean_error(raw, "--engine answers chat prompts only")


def test_a_thinking_models_reply_reaches_the_client_as_the_loop_wrote_it(tmp_path: Path):
    reply = thinking_reply("The user greets me.", "Hello!")

    def thinker(name: str, n_ctx: int) -> ThinkingByteModel:
        return ThinkingByteModel([reply], name=f"{name}-target", n_ctx=n_ctx)

    with scripted_engine_server(tmp_path, make_model=thinker) as engine:
        client = engine.client()
        stream = client.chat(turn("alpha"))
        items = list(stream)
        # The loop's own text, tags and all, as an in-process front end saw it, and how
        # the reply marks its reasoning, so the front end can show it apart.
        assert reply_text(items) == reply
        assert stream.reasoning == ReasoningFormat("<think>", "</think>", starts_inside=False)

        quiet = client.chat(turn("alpha", thinking=False))
        assert reply_text(list(quiet)) == "Hello!"

        # An OpenAI client of the same engine gets the reasoning apart, as before.
        answer = engine.openai().chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "Hi!"}], temperature=0
        )
        message = answer.choices[0].message
        assert message.content == "Hello!"
        assert message.model_extra["reasoning_content"] == "The user greets me."


def test_an_engine_run_as_a_service_stays_when_its_clients_leave(tmp_path: Path):
    with scripted_engine_server(tmp_path, idle_exit=None) as engine:
        assert engine.thread is not None
        client = engine.client()
        with client.attach():
            sdk_answer(engine.openai(), "alpha")
        time.sleep(1.0)  # what an --idle-exit engine would wait far less than
        assert engine.thread.is_alive() and not client.health().idle_exit
        assert sdk_answer(engine.openai(), "alpha") == reply_of("alpha")
