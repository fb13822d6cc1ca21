"""Conversations asked turn by turn through the openai SDK, with what each turn reported
(its text and cached tokens), for the conversation-cache tests on a real engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import openai

from tests.support.real_runtimes import NEAR_TIE_LOGIT_GAP
from tests.support.serve_process import PAIR

SYSTEM = {"role": "system", "content": "You are a concise assistant. Answer in one sentence."}


@dataclass(frozen=True)
class Turn:
    """One answered request: the messages sent, the reply and the token counts."""

    messages: list[dict[str, str]]
    reply: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stats_cached_tokens: int


def ask(client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int = 24) -> Turn:
    """A greedy streamed request; usage comes in the last chunk, stats in every one."""
    chunks = list(
        client.chat.completions.create(
            model=PAIR,
            messages=messages,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"speculative": {"drafter": "ngram", "k": 4}},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    stats: dict[str, Any] = chunks[-1].model_extra["draftpen"]  # type: ignore[index]
    return Turn(
        messages,
        reply,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.prompt_tokens_details.cached_tokens or 0,
        int(stats["cached_prompt_tokens"]),
    )


def fixed_conversation(topic: str, turns: int) -> list[dict[str, str]]:
    """A conversation with fixed replies, as an agent resends its own transcript."""
    messages = [SYSTEM]
    for index in range(turns):
        if index:
            messages.append({"role": "assistant", "content": f"Part {index} about {topic}."})
        messages.append({"role": "user", "content": f"One more fact about {topic} ({index})."})
    return messages


def assert_as_alone(
    client: openai.OpenAI, messages: list[dict[str, str]], max_tokens: int, reply: str
) -> None:
    """``reply`` is what the same request, made alone on ``client``, writes; or it parts
    from it only where the alone run was near a tie between its token and the reply's.

    A conversation whose earlier reply is restored from a kept state holds that reply's
    keys and values as decoding computed them, one round at a time; alone, the same text
    is read in one prompt batch, which rounds a little otherwise. Greedy choices agree
    except at a near tie, as in the runtime conformance tests.
    """
    answer = client.chat.completions.create(
        model=PAIR,
        messages=messages,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=max_tokens,
        logprobs=True,
        top_logprobs=5,
        extra_body={"speculative": {"drafter": "ngram", "k": 4}},
    )
    choice = answer.choices[0]
    if (choice.message.content or "") == reply:
        return
    assert choice.logprobs is not None and choice.logprobs.content, "no logprobs came back"
    written = ""
    for index, entry in enumerate(choice.logprobs.content):
        if reply.startswith(written + entry.token):
            written += entry.token
            continue
        rest = reply[len(written) :]
        rivals = [
            alternative.logprob
            for alternative in entry.top_logprobs
            if alternative.token not in ("", entry.token) and rest.startswith(alternative.token)
        ]
        assert rivals, (
            f"parted from the request made alone at token {index} ({entry.token!r}), "
            f"writing {rest[:20]!r}, not among alone's top candidates: {messages}"
        )
        gap = entry.logprob - max(rivals)
        assert gap < NEAR_TIE_LOGIT_GAP, (
            f"parted from the request made alone at token {index} where it was not near "
            f"a tie (gap {gap:.3f}): {messages}"
        )
        return
    raise AssertionError(
        f"the request made alone wrote {written!r}, a part of {reply!r}: {messages}"
    )
