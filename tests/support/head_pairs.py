"""What every head pair's loading test checks: the pair loads with its head attached
(not as a draft model, and loading said so), and a short reply drafts with it."""

from __future__ import annotations

from backends.engine import Engine, GenerationRequest


def check_loaded_head_drafts(
    engine: Engine, messages: list[str], loaded: str, drafter: str
) -> None:
    """``engine`` (closed here) has the head ``loading`` reported as ``loaded``, and a
    12-token reply from "The sea" drafts with ``drafter``."""
    try:
        assert engine.draft is None  # the head is not a draft model
        assert any(loaded in message for message in messages), messages
        prompt = engine.text_prompt("The sea")
        request = GenerationRequest(prompt_tokens=tuple(prompt), max_tokens=12, drafter=drafter)
        events = list(engine.generate(request))
    finally:
        engine.close()
    assert events[-1].stats.drafted > 0
    assert drafter in {event.drafter for event in events}
