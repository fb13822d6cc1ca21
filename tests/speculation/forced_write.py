"""The forced Write request (tests/repro/forced_write_messages.json) as the engine's
generation request: the Messages adapter's own preparation under ``exact_output``, for
the real-pair tests of exact output under a forced tool call (issue 39).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from app.client.wire import DraftpenRequestOptions
from app.engine.dialects.anthropic_schema import MessagesRequest, parse_messages_request
from app.engine.dialects.anthropic_translation import chat_request
from app.engine.job_requests import chat_prompt, generation_request, reply_plan
from app.settings import Settings
from backends.engine import Engine, GenerationRequest

REPRO = Path(__file__).parents[1] / "repro" / "forced_write_messages.json"


def forced_write_request(
    engine: Engine, body: dict | None = None, max_tokens: int = 48
) -> GenerationRequest:
    """The repro's Messages request, or ``body`` (one call: parallel calls off), as the
    adapter prepares it with ``exact_output = true``."""
    body = json.loads(REPRO.read_text()) if body is None else body
    body["tool_choice"] = {**body["tool_choice"], "disable_parallel_tool_use": True}
    body["max_tokens"] = max_tokens
    parsed = chat_request(parse_messages_request(MessagesRequest, body))
    settings = dataclasses.replace(Settings(), exact_output=True)
    plan = reply_plan(parsed, engine)
    prompt, _, _ = chat_prompt(parsed, engine, plan, DraftpenRequestOptions(), settings)
    request = generation_request(parsed, prompt, "messages", plan.constraint, engine, settings)
    assert request.exact and request.params.greedy
    return dataclasses.replace(request, logprobs=0)
