"""Grammar constraints (llguidance): which tokens may come next, for p and q alike.

A :class:`Grammar` is compiled once per request from a JSON schema, a Lark grammar or a
regex, against a :class:`GrammarVocabulary` built once per loaded model from its own
vocabulary (through the runtime-neutral :class:`~backends.base.Model` protocol, so
llama.cpp and MLX models get the same treatment). A :class:`GrammarState` follows one
generation: it gives the allowed-token mask at the current position, advances by
consumed tokens, rolls back when the loop rejects draft tokens, and says which tokens
the grammar forces (a single continuation), which the loop can propose as free drafts.

Why masks are applied to both models: speculative sampling is exact when the target's
p and the draft's q are transformed identically before the accept/reject step. The
loop masks both rows with the mask of the same grammar state (the state after the
accepted prefix), so constrained speculative decoding is distributed exactly as
constrained plain decoding, and greedy output equals constrained greedy decoding.

llguidance compiles JSON schemas itself (``LLMatcher.grammar_from_json_schema``): no
schema-to-grammar code lives here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from backends.base import Model, ToolSpec
from backends.errors import BackendError
from backends.output.output_constraints import ConstraintSpec, ToolCallOutput

GrammarKind = Literal["json_schema", "lark", "regex"]
# llguidance marks special tokens (those a tokenizer never produces from text) with a
# leading 0xFF byte, so a grammar can name them (``<|im_end|>``) without text matching them.
_SPECIAL_MARK = b"\xff"


# JSON as json.dumps and the models' own templates write it ({"a": 1, "b": 2}), with no
# other whitespace allowed: natural text for the model, and no choice left between
# keys and values, so the grammar forces those stretches (free drafts).
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


class GrammarError(BackendError):
    """A grammar (or JSON schema) that llguidance refuses; the message says why."""


@dataclass(frozen=True)
class GrammarSpec:
    """What to constrain the output to: a JSON schema, a Lark grammar or a regex."""

    kind: GrammarKind
    source: str | dict[str, Any]

    @staticmethod
    def json_schema(schema: dict[str, Any]) -> GrammarSpec:
        """Output that validates against ``schema`` (any JSON when the schema is ``{}``)."""
        return GrammarSpec("json_schema", schema)

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own form."""
        import llguidance

        if self.kind == "json_schema":
            schema = self.source if isinstance(self.source, dict) else json.loads(self.source)
            try:
                return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
            except ValueError as error:
                raise GrammarError(f"The JSON schema is not valid: {error}") from error
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(str(self.source))
        return llguidance.LLMatcher.grammar_from_regex(str(self.source))


def grammar_for(spec: ConstraintSpec | None) -> GrammarSpec | None:
    """The grammar a request's constraint asks for; None when it asks for none.

    ``response_format`` JSON (a schema, or any object) and tool calls that must happen
    (``required`` or a named function) are grammars from the first token. A tool call
    the model *may* make (``auto``) is a lazy grammar: any text, until the model opens
    a call in its family's syntax; from there the call's arguments must match the
    tool's schema (see :func:`_auto_tool_call_lark`). With ``auto`` and a JSON
    ``response_format`` together, the reply is that JSON (calls are not offered).
    """
    if spec is None or spec.is_empty:
        return None
    if spec.tool_calls is not None and spec.tool_calls.mode == "required":
        return GrammarSpec("lark", _tool_call_lark(spec.tool_calls))
    if spec.text is not None:
        schema = dict(spec.text.schema) if spec.text.schema is not None else {"type": "object"}
        return GrammarSpec.json_schema(schema)
    if spec.tool_calls is not None:
        return GrammarSpec("lark", _auto_tool_call_lark(spec.tool_calls))
    return None


def _tool_call_lark(output: ToolCallOutput) -> str:
    """One or more calls (``parallel``) in the model's own wrapper, arguments per schema.

    The last call may be followed by a newline before the end. Models trained on
    templates that put one after a call write it, meaning to end (Qwen2.5 closes
    ``</tool_call`` with the one token ``>\\n``); if the newline could only separate calls,
    the grammar would force another call after it, and a greedy model repeats its call
    until ``max_tokens`` (issue 41).
    """
    wrapper = output.syntax.canonical_wrapper
    # Hermes writes a newline inside the tags; a bare JSON object stands alone.
    inner = f'"{_lark_text(wrapper.opener)}\\n" call_json "\\n{_lark_text(wrapper.closer)}"'
    call = inner if wrapper.opener else "call_json"
    separator = f'"{_lark_text(output.syntax.separators or "")}\\n"'
    calls = "call (sep call)*" if output.parallel else "call"
    return (
        f'start: {calls} "\\n"?\ncall: {call}\nsep: {separator}\ncall_json: {_call_json(output)}\n'
    )


def _auto_tool_call_lark(output: ToolCallOutput) -> str:
    """Free text in which every call the model opens is held to the tools' schemas.

    Two ways to open a call, as the family's parser reads them:

    - an opener (Hermes' ``<tool_call>``): llguidance's lazy lexeme does the switching.
      A call head is any text up to the first opener, matched as short as possible,
      so the moment the opener is written the grammar is inside a call and the rest
      of it (newline, ``{"name": "``, a tool's name, arguments per its schema, the
      closer) is constrained, its fixed stretches forced. Text and further calls may
      follow. Openers that are special tokens (``<|python_tag|>``) are left out: free
      text never holds a special token.
    - a bare JSON object that begins the reply (Llama 3's canonical form, and the
      ``{{...}}`` that small Qwen2.5 models write): a reply whose first character is
      ``{`` is a call (one brace may be doubled), any other reply is text.

    With ``parallel`` off the reply ends with its one call, as llama.cpp's lazy
    grammars end it: the grammar, not only the parser, keeps it to one.
    """
    call_json = _call_json(output)
    wrapped = [
        wrapper
        for wrapper in output.syntax.wrappers
        if wrapper.opener and not wrapper.known_names_only and not wrapper.opener.startswith("<|")
    ]
    bare = any(not wrapper.opener for wrapper in output.syntax.wrappers)
    # FIRST: the reply's text before any call; it cannot start a bare call.
    first = "/([^{](.|\\n)*)?/" if bare else "/(.|\\n)*/"
    parallel = output.parallel
    replies = ["FIRST"]
    if bare:
        replies.append("bare_call TEXT" if parallel else 'bare_call "\\n"?')
    if wrapped:
        # As for required calls, a newline may end the reply after its one call.
        replies.append("first_call (next_call)* TEXT" if parallel else 'first_call "\\n"?')
    lines = ["start: " + " | ".join(replies), f"FIRST: {first}", f"call_json: {call_json}"]
    if parallel:
        lines.append("TEXT: /(.|\\n)*/")
    if bare and parallel:
        separator = _lark_text(output.syntax.separators or "")
        lines.append(f'bare_call: "{{"? call_json ("{separator}\\n" call_json)*')
    elif bare:
        # One call; a doubled opening brace gets its closing one.
        lines.append('bare_call: call_json | "{" call_json "}"')
    # One head and body per wrapper: each opener has its own closer.
    for index, wrapper in enumerate(wrapped):
        opener, closer = _lark_text(wrapper.opener), _lark_text(wrapper.closer)
        lines += [
            f'first_head{index}[lazy]: FIRST "{opener}"',
            f'call_body{index}: "\\n" call_json "\\n{closer}"',
        ]
        if parallel:
            lines.append(f'call_head{index}[lazy]: TEXT "{opener}"')
    if wrapped:
        indices = range(len(wrapped))
        lines.append("first_call: " + " | ".join(f"first_head{i} call_body{i}" for i in indices))
        if parallel:
            lines.append("next_call: " + " | ".join(f"call_head{i} call_body{i}" for i in indices))
    return "\n".join(lines) + "\n"


def _call_json(output: ToolCallOutput) -> str:
    """``%json`` of one call to any of the tools: its name and arguments per schema."""
    call_schema: dict[str, Any] = (
        _call_schema(output.tools[0], output)
        if len(output.tools) == 1
        else {"anyOf": [_call_schema(tool, output) for tool in output.tools]}
    )
    # Tools that are not strict (OpenAI's default; agents' tools use JSON Schema keywords
    # llguidance does not implement, such as Claude Code's propertyNames) are compiled
    # leniently: such keywords are left unchecked rather than the request refused. A
    # strict tool's schema is followed exactly or refused.
    lenient = not any(tool.strict for tool in output.tools)
    call_schema["x-guidance"] = {**JSON_STYLE, "lenient": True} if lenient else JSON_STYLE
    return "%json " + json.dumps(call_schema)


def _call_schema(tool: ToolSpec, output: ToolCallOutput) -> dict[str, Any]:
    arguments_key = output.syntax.argument_keys[0]
    parameters = dict(tool.parameters) or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _lark_text(text: str) -> str:
    """``text`` for inside a double-quoted Lark string."""
    return json.dumps(text)[1:-1]


class GrammarVocabulary:
    """A model's vocabulary as llguidance sees it: token bytes, specials, end tokens.

    Built once per loaded model (it reads every token: ~0.5 s for 150k tokens).
    """

    def __init__(self, model: Model) -> None:
        import llguidance

        tokens: list[bytes] = []
        end_tokens: list[int] = []
        for token in range(model.n_vocab):
            piece = model.token_bytes(token)
            if not piece:
                # Special tokens render as nothing; llguidance knows them by their name.
                name = model.token_text(token)
                piece = _SPECIAL_MARK + name.encode("utf-8") if name else b""
            tokens.append(piece)
            if model.is_end_of_generation(token):
                end_tokens.append(token)
        if not end_tokens:
            raise GrammarError(f"{model.name} names no end-of-generation token to end a grammar")
        self.n_vocab = model.n_vocab
        self.end_tokens = tuple(end_tokens)
        wrapper = _VocabularyTokenizer(model, tokens, end_tokens[0])
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(wrapper), n_vocab=model.n_vocab, eos_token=end_tokens
        )

    def compile(self, spec: GrammarSpec) -> Grammar:
        """Compile ``spec`` for this vocabulary; :class:`GrammarError` when it is invalid."""
        import llguidance

        grammar = spec.llguidance_grammar()
        problem = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if problem and not problem.startswith("WARNING"):
            raise GrammarError(f"The grammar is not valid: {problem}")
        return Grammar(self, grammar)


class _VocabularyTokenizer:
    """What llguidance's TokenizerWrapper asks of a tokenizer, from the Model protocol."""

    def __init__(self, model: Model, tokens: list[bytes], eos_token_id: int) -> None:
        self._model = model
        self.tokens = tokens
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        self.special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(_SPECIAL_MARK)]

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._model.tokenize(text, add_special=False)


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar for one vocabulary; :meth:`start` begins a generation."""

    vocabulary: GrammarVocabulary
    grammar: str

    def start(self) -> GrammarState:
        """A fresh state at the beginning of the output."""
        return GrammarState(self)


class GrammarState:
    """Where one generation stands in its grammar.

    Not thread-safe; one per generation. Tokens are consumed as the loop commits or
    tentatively drafts them and rolled back when drafts are rejected.
    """

    def __init__(self, grammar: Grammar) -> None:
        import llguidance

        self.vocabulary = grammar.vocabulary
        self._matcher = llguidance.LLMatcher(grammar.vocabulary.tokenizer, grammar.grammar)
        if self._matcher.is_error():
            raise GrammarError(f"The grammar could not start: {self._matcher.get_error()}")
        words = (self.vocabulary.n_vocab + 31) // 32
        self._bits = np.zeros(words, dtype=np.int32)
        self.consumed = 0

    def allowed(self) -> np.ndarray:
        """A boolean array over the vocabulary: which tokens may come next."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[: self.vocabulary.n_vocab].astype(bool)

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (cheaper than a whole mask)."""
        return self._matcher.validate_tokens([token]) == 1

    def consume(self, tokens: Sequence[int]) -> None:
        """Advance by ``tokens``, which the grammar must allow."""
        if tokens and not self._matcher.consume_tokens(list(tokens)):
            raise GrammarError(f"The grammar refused a token: {self._matcher.get_error()}")
        self.consumed += len(tokens)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the grammar allows in a row from here (nothing consumed)."""
        return self._matcher.validate_tokens(list(tokens)) if tokens else 0

    def rollback(self, count: int) -> None:
        """Forget the last ``count`` consumed tokens."""
        if count:
            if not self._matcher.rollback(count):
                raise GrammarError(f"The grammar could not roll back: {self._matcher.get_error()}")
            self.consumed -= count

    def forced(self) -> list[int]:
        """Tokens the grammar forces from here (its only continuation), possibly none."""
        return list(self._matcher.compute_ff_tokens())

    @property
    def finished(self) -> bool:
        """The grammar is complete and allows nothing but the end."""
        return self._matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is complete under the grammar (it may still go on)."""
        return self._matcher.is_accepting()


def mask_logits(logits_row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A copy of ``logits_row`` with disallowed tokens at -inf."""
    masked = np.where(allowed, logits_row, -np.inf).astype(np.float32, copy=False)
    return masked
