"""OpenAI's text completions: ``POST /v1/completions``' request and its answer.

Raw prompt text in, no chat template: :class:`CompletionRequest` is the shared
generation fields plus ``prompt`` and ``logprobs`` (N alternatives per token), and
:class:`CompletionFormat` writes ``text_completion`` objects, logprobs in the legacy
shape of parallel lists (``tokens``, ``token_logprobs``, ``top_logprobs``,
``text_offset``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field, field_validator

from app.engine.chunks import ResponseFormat, wire_logprob
from app.engine.schema import GenerationFields
from backends.generation_events import TokenLogprob


class CompletionRequest(GenerationFields):
    """``POST /v1/completions``: raw prompt text, no chat template."""

    prompt: str
    # How many alternatives to report per token, besides the token's own logprob.
    logprobs: int | None = Field(None, ge=0, le=5)

    @property
    def requested_logprobs(self) -> int | None:
        """``logprobs`` as sent: N alternatives per token, or None for no logprobs."""
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: object) -> object:
        if isinstance(value, list):
            if len(value) == 1 and isinstance(value[0], str):
                return value[0]
            raise ValueError("must be a string (or a list holding exactly one string)")
        return value


class CompletionFormat(ResponseFormat):
    """Text completions; logprobs in the legacy shape of parallel lists."""

    id_prefix = "cmpl"
    response_object = "text_completion"
    chunk_object = "text_completion"

    def __init__(
        self,
        model_id: str,
        *,
        include_usage: bool,
        token_bytes: Callable[[int], bytes] | None = None,
        provenance: bool = False,
        response_id: str | None = None,
    ) -> None:
        super().__init__(
            model_id,
            include_usage=include_usage,
            token_bytes=token_bytes,
            provenance=provenance,
            response_id=response_id,
        )
        # Where the next token's text starts in the completion (a stream's chunks go on
        # counting from where the previous one stopped).
        self._text_offset = 0

    def _logprobs(self, items: Sequence[TokenLogprob]) -> dict[str, Any]:
        """``tokens``, ``token_logprobs``, ``top_logprobs`` ({text: logprob}), ``text_offset``."""
        tokens: list[str] = []
        offsets: list[int] = []
        for item in items:
            text = self._token_text(item.token)[0]
            tokens.append(text)
            offsets.append(self._text_offset)
            self._text_offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [wire_logprob(item.logprob) for item in items],
            "top_logprobs": [
                {self._token_text(t)[0]: wire_logprob(lp) for t, lp in item.top} for item in items
            ],
            "text_offset": offsets,
        }

    def _text_choice(self, text: str, first: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": None}

    def _finish_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def _whole_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
