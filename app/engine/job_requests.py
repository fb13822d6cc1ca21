"""How a validated request becomes its job's work: the prompt and the GenerationRequest.

A job's ``prepare`` runs on the queue's worker against the loaded pair: for a chat
request, its :class:`ReplyPlan` (what the prompt shows of the tools, how the reply is
read, the grammar its text or calls must follow) and its prompt, rendered by the
model's own chat template (fitted to the context when a draftpen client asks); for
chat and text completions alike, the :class:`~backends.engine.GenerationRequest` (the
request's sampling fields, else the engine's settings; the drafter; a ``max_tokens``
above what the context holds read as a ceiling; logprobs) and the answer's format.
Every dialect's request is prepared here, so none of this is written twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from app.chats.conversation import fit_conversation
from app.client.wire import DraftpenRequestOptions
from app.engine.chunks import ResponseFormat
from app.engine.dialects.openai_chat_format import ChatFormat
from app.engine.dialects.openai_chat_schema import (
    ChatCompletionRequest,
    NamedToolChoice,
    ResponseFormatField,
)
from app.engine.dialects.openai_completions import CompletionFormat, CompletionRequest
from app.engine.jobs import Prepared
from app.engine.schema import ApiError, GenerationFields
from app.settings import Settings
from backends.base import ToolSpec
from backends.engine import Engine, GenerationRequest
from backends.output.call_syntax import tool_call_syntax
from backends.output.chat_template import (
    ChatTemplateError,
    model_chat_template,
    template_takes_tools,
)
from backends.output.output_constraints import ConstraintSpec, JsonOutput, ToolCallOutput
from backends.output.reasoning import ReasoningFormat
from backends.output.tool_calls import ToolCallParser
from backends.sampling.filters import SamplingParams

# A chat answer's shape: ChatFormat, or another dialect's subclass taking its arguments.
ChatFormatFactory = type[ChatFormat]

T = TypeVar("T")


@dataclass(frozen=True)
class FormatInputs:
    """What a request's answer format needs from the loaded pair: how the reply is
    read (tool calls, reasoning), how many old messages fitting left out, and whether
    it writes logprobs (a token's bytes, from the target's vocabulary)."""

    tool_parser: ToolCallParser | None = None
    reasoning: ReasoningFormat | None = None
    left_out_messages: int = 0
    logprobs: bool = False


@dataclass(frozen=True)
class PreparedGeneration:
    """A job's generation built against the loaded pair, and its answer's inputs.

    Built where the pair is (the engine's runtime process, or the worker thread of an
    engine in one process) and plain data, so it crosses to the front process."""

    request: GenerationRequest
    inputs: FormatInputs


@dataclass(frozen=True)
class ChatGeneration:
    """A chat job's runtime half: its prompt (the model's chat template, the tools,
    the context fitted) and its :class:`GenerationRequest`. Plain data, so the engine's
    front process can send it to the runtime process."""

    parsed: ChatCompletionRequest
    settings: Settings
    options: DraftpenRequestOptions

    def __call__(self, engine: Engine) -> PreparedGeneration:
        parsed, settings = self.parsed, self.settings
        plan = reply_plan(parsed, engine)
        prompt, prompt_text, left_out = chat_prompt(parsed, engine, plan, self.options, settings)
        reasoning = engine.reasoning_format(prompt_text)
        generation = generation_request(
            parsed, prompt, "messages", plan.constraint, engine, settings, reasoning
        )
        inputs = FormatInputs(
            tool_parser=plan.tool_parser,
            reasoning=reasoning,
            left_out_messages=left_out,
            logprobs=parsed.requested_logprobs is not None,
        )
        return PreparedGeneration(generation, inputs)


@dataclass(frozen=True)
class CompletionGeneration:
    """A text completion job's runtime half: raw text, no chat template."""

    parsed: CompletionRequest
    settings: Settings

    def __call__(self, engine: Engine) -> PreparedGeneration:
        prompt = engine.text_prompt(self.parsed.prompt)
        generation = generation_request(self.parsed, prompt, "prompt", None, engine, self.settings)
        inputs = FormatInputs(logprobs=self.parsed.requested_logprobs is not None)
        return PreparedGeneration(generation, inputs)


# Writes a job's answer from its prepared inputs and, for logprobs, a token's bytes.
AnswerFormat = Callable[[FormatInputs, Callable[[int], bytes] | None], ResponseFormat]


@dataclass(frozen=True)
class JobPreparer:
    """A generation job's ``prepare``, in two halves: ``generation`` runs where the
    pair is loaded (plain data both ways, so it may run in the runtime process);
    ``answer`` makes the answer's format where the HTTP answer is written.

    Called with an engine, it runs both, as an engine in one process does."""

    generation: Callable[[Engine], PreparedGeneration]
    answer: AnswerFormat

    def __call__(self, engine: Engine) -> Prepared:
        prepared = self.generation(engine)
        token_bytes = engine.target.token_bytes if prepared.inputs.logprobs else None
        return Prepared(prepared.request, self.answer(prepared.inputs, token_bytes))


def chat_preparer(
    parsed: ChatCompletionRequest,
    make_format: ChatFormatFactory,
    settings: Settings,
    options: DraftpenRequestOptions,
    response_id: str,
) -> JobPreparer:
    """The ``prepare`` of a chat job: its prompt, its generation, its answer's format."""

    def answer(inputs: FormatInputs, token_bytes: Callable[[int], bytes] | None) -> ChatFormat:
        return make_format(
            parsed.model,
            include_usage=parsed.include_usage,
            tool_parser=inputs.tool_parser,
            token_bytes=token_bytes,
            reasoning=inputs.reasoning,
            provenance=options.provenance,
            response_id=response_id,
            left_out_messages=inputs.left_out_messages,
        )

    return JobPreparer(ChatGeneration(parsed, settings, options), answer)


def completion_preparer(
    parsed: CompletionRequest,
    settings: Settings,
    options: DraftpenRequestOptions,
    response_id: str,
) -> JobPreparer:
    """The ``prepare`` of a text completion job: raw text, no chat template."""

    def answer(
        inputs: FormatInputs, token_bytes: Callable[[int], bytes] | None
    ) -> CompletionFormat:
        return CompletionFormat(
            parsed.model,
            include_usage=parsed.include_usage,
            token_bytes=token_bytes,
            provenance=options.provenance,
            response_id=response_id,
        )

    return JobPreparer(CompletionGeneration(parsed, settings), answer)


@dataclass(frozen=True)
class ChatTokenCount:
    """An inspect job's work: how many tokens a chat request's prompt is, rendered as
    its reply would render it. Plain data, so it may run in the runtime process."""

    parsed: ChatCompletionRequest
    settings: Settings

    def __call__(self, engine: Engine) -> int:
        plan = reply_plan(self.parsed, engine)
        options = DraftpenRequestOptions()
        return len(chat_prompt(self.parsed, engine, plan, options, self.settings)[0])


@dataclass(frozen=True)
class ReplyPlan:
    """How a chat request's tools shape its prompt, its parsing and its constraint."""

    prompt_tools: tuple[ToolSpec, ...]
    tool_parser: ToolCallParser | None
    constraint: ConstraintSpec | None


def reply_plan(parsed: ChatCompletionRequest, engine: Engine) -> ReplyPlan:
    """What the prompt shows of the tools, how the reply is read, what it must be."""
    text = _json_output(parsed.response_format)
    tools = parsed.tool_specs
    choice = parsed.tool_choice
    if not tools or choice == "none":
        # "none": the model is not shown the tools, so it answers in text.
        return ReplyPlan((), None, ConstraintSpec(text=text) if text else None)
    template = model_chat_template(engine.target)
    if not template_takes_tools(template):
        raise ApiError(
            400,
            f"The chat template of '{parsed.model}' does not show tools to the model, so "
            "it cannot call them. Leave tools out (or send tool_choice 'none'), or use "
            "a pair whose template takes tools, such as starter.",
            param="tools",
            code="invalid_value",
        )
    syntax = tool_call_syntax(template)
    if syntax is None:
        raise ApiError(
            400,
            f"The chat template of '{parsed.model}' teaches a tool-call syntax draftpen "
            "does not read yet (it reads Hermes/Qwen <tool_call> blocks and Llama 3.1 JSON "
            "calls). Leave tools out or send tool_choice 'none', or use another pair.",
            param="tools",
            code="invalid_value",
        )
    if isinstance(choice, NamedToolChoice):
        allowed = tuple(tool for tool in tools if tool.name == choice.function.name)
    else:
        allowed = tools
    mode = "auto" if choice in (None, "auto") else "required"
    parallel = parsed.parallel_tool_calls is not False
    parser = ToolCallParser(
        syntax, [tool.name for tool in tools], max_calls=None if parallel else 1
    )
    calls = ToolCallOutput(allowed, syntax, mode=mode, parallel=parallel)
    return ReplyPlan(tools, parser, ConstraintSpec(text=text, tool_calls=calls))


def chat_prompt(
    parsed: ChatCompletionRequest,
    engine: Engine,
    plan: ReplyPlan,
    options: DraftpenRequestOptions,
    settings: Settings,
) -> tuple[list[int], str, int]:
    """The prompt's tokens and text, and how many old messages fitting left out."""
    thinking = given(parsed.thinking, settings.thinking)
    messages = parsed.chat_messages()
    try:
        if options.fit_context and not plan.prompt_tools:
            reply_room = parsed.completion_limit[0] or settings.max_tokens
            fitted = fit_conversation(engine, messages, reply_room, thinking=thinking)
            return list(fitted.tokens), fitted.text, fitted.dropped_messages
        prompt_text = engine.chat_prompt_text(messages, plan.prompt_tools, thinking=thinking)
        return engine.text_prompt(prompt_text), prompt_text, 0
    except ChatTemplateError as error:
        raise ApiError(
            400,
            f"{error} Over the API, POST /v1/completions sends raw text instead.",
            param="messages",
            code="invalid_value",
        ) from None


def generation_request(
    parsed: GenerationFields,
    prompt: list[int],
    prompt_param: str,
    constraint: ConstraintSpec | None,
    engine: Engine,
    settings: Settings,
    reasoning: ReasoningFormat | None = None,
) -> GenerationRequest:
    """The loop's request: the prompt, the sampling, the drafter, the limits, logprobs,
    and for a thinking model's chat reply, how it marks its reasoning."""
    n_ctx = engine.target.n_ctx
    bigger = (
        "or load the pair with a larger context (POST /draftpen/load with "
        f'{{"pair": "{parsed.model}", "context_length": N}}, or draftpen serve --context N)'
    )
    if len(prompt) >= n_ctx:
        raise ApiError(
            400,
            f"The prompt is {len(prompt)} tokens but this model's context holds {n_ctx}. "
            f"Shorten it, {bigger}.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    room = n_ctx - len(prompt)
    limit, _ = parsed.completion_limit
    if limit is not None and limit > room:
        # A ceiling, as llama.cpp's server and Ollama read it: agents send limits
        # far above what is left (opencode: max_tokens 32000 after a 7k prompt) and
        # expect the reply to stop at the context's end, finishing with "length".
        limit = room
    speculative = parsed.speculative
    drafter = (speculative.drafter if speculative else None) or settings.drafter
    draft_tokens = speculative.k if speculative and speculative.k is not None else None
    if drafter == "model" and engine.draft is None:
        raise ApiError(
            400,
            f"'{parsed.model}' has no draft model, so speculative.drafter 'model' "
            "cannot run; use 'auto', 'ngram' or 'none'.",
            param="speculative.drafter",
            code="invalid_value",
        )
    try:
        params = SamplingParams(
            temperature=given(parsed.temperature, settings.temperature),
            top_k=given(parsed.top_k, settings.top_k),
            top_p=given(parsed.top_p, settings.top_p),
            min_p=given(parsed.min_p, settings.min_p),
            seed=parsed.seed,
            presence_penalty=parsed.presence_penalty or 0.0,
            frequency_penalty=parsed.frequency_penalty or 0.0,
        )
        return GenerationRequest(
            prompt_tokens=tuple(prompt),
            params=params,
            max_tokens=limit if limit is not None else room,
            drafter=drafter,
            draft_tokens=given(draft_tokens, settings.draft_tokens),
            stop=parsed.stop,
            prediction=parsed.prediction.content if parsed.prediction else None,
            exact=(
                speculative.exact
                if speculative and speculative.exact is not None
                else settings.exact_output
            ),
            constraint=constraint,
            logprobs=parsed.requested_logprobs,
            reasoning=reasoning,
            overlap_drafting=settings.overlap_drafting,
        )
    except ValueError as error:
        raise ApiError(400, str(error), code="invalid_value") from None


def _json_output(response_format: ResponseFormatField | None) -> JsonOutput | None:
    """The JSON a ``response_format`` asks for; None for text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.json_schema is None:
        return JsonOutput()  # json_object: any JSON object
    spec = response_format.json_schema
    return JsonOutput(schema=spec.schema_, strict=bool(spec.strict), name=spec.name)


def given(value: T | None, default: T) -> T:
    """``value``, or ``default`` where the request left it out."""
    return default if value is None else value
