"""Reading tool calls out of a model's reply, as it streams.

Models write tool calls in their family's own syntax (backends/output/call_syntax.py), chosen
from the chat template. :class:`ToolCallParser` is fed the reply's text in pieces as
they come and returns what can already be told apart: content text, the start of a
call (its index, id and function name) and fragments of its ``arguments``. Text that
may be the start of a call marker is held back until it is known, so call syntax
never reaches content. The server's streaming and non-streaming answers both run this
one parser.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Collection
from enum import Enum, auto

from backends.output.call_syntax import CallWrapper, ToolCallSyntax
from backends.output.stop_strings import partial_suffix
from backends.output.streamed_json import (
    WHITESPACE,
    Head,
    JsonValueScanner,
    read_head,
)
from backends.output.tool_call_pieces import (
    ArgumentsPiece,
    ContentPiece,
    ParsedPiece,
    ToolCallStart,
    new_call_id,
)

# A bare call found in the middle of the text: like a fenced one, a call only when it
# names one of the tools.
_CALL_IN_TEXT = CallWrapper("", known_names_only=True)


class _State(Enum):
    TEXT = auto()
    HEAD = auto()  # inside a wrapper, before the arguments: which function?
    WHOLE = auto()  # the head was unusual: read the whole call, then decide
    ARGUMENTS = auto()  # the arguments' JSON value, passed on as it comes
    TAIL = auto()  # after the arguments, up to the wrapper's closer


class ToolCallParser:
    """Splits a reply into content and tool calls while it streams.

    ``feed`` each new piece of text in order, then call ``finish`` once; each returns
    the pieces it could decide. The result does not depend on how the text was cut
    into pieces. ``tool_names`` are the request's functions (fenced blocks must name
    one); with ``max_calls`` (1 when parallel calls are off) later calls are dropped.

    Call syntax never becomes content. A call cut off before it ends (``max_tokens``, a
    stop string) is dropped at :meth:`finish` when its opener is call markup only
    (``<tool_call>``, a Llama bare call), or when it is a fenced or bare JSON object whose
    head may still name one of the tools; a block behind such an opener that is not a
    call is dropped too. Only openers that are also ordinary text (a fenced block, a
    JSON object) are given back as content when they turn out not to be calls.
    """

    def __init__(
        self,
        syntax: ToolCallSyntax,
        tool_names: Collection[str],
        *,
        max_calls: int | None = None,
        new_id: Callable[[], str] = new_call_id,
    ) -> None:
        self.syntax = syntax
        self.tool_names = frozenset(tool_names)
        self.max_calls = max_calls
        self._new_id = new_id
        self._openers = [wrapper.opener for wrapper in syntax.wrappers if wrapper.opener]
        self._bare = next((w for w in syntax.wrappers if not w.opener), None)
        self._state = _State.TEXT
        self._buffer = ""  # text read but not yet decided
        self._held_space = ""  # whitespace that may precede a call (dropped if one follows)
        self._space_before_call = ""
        self._wrapper = syntax.wrappers[0]
        self._scanner = JsonValueScanner()
        # A bare call may begin the reply, or follow another call.
        self._call_may_begin = True
        self._braces = 1
        self._dropping = False
        self._quoted_arguments = ""
        self.calls_started = 0
        self._finished = False
        # Where calls are in the text fed so far (offsets into all of it), for readers
        # that must act on a call's text (backends/output/repeated_calls.py).
        self._fed = 0
        self._call_since: int | None = None
        self.call_spans: list[tuple[int, int]] = []

    @property
    def made_calls(self) -> bool:
        """Whether any tool call has been emitted."""
        return self.calls_started > 0

    @property
    def call_since(self) -> int | None:
        """Where the call being read began (its opener) in the text fed; None between calls."""
        return self._call_since

    @property
    def decided(self) -> int:
        """How much of the text fed the parser has decided (the rest is held back)."""
        return self._fed - len(self._buffer)

    def feed(self, text: str) -> list[ParsedPiece]:
        """Take the next piece of the reply; return what it decided."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buffer += text
        self._fed += len(text)
        out: list[ParsedPiece] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[ParsedPiece]:
        """The reply ended: decide whatever is still held back."""
        out: list[ParsedPiece] = []
        while self._step(out, final=True):
            pass
        if self._state is _State.ARGUMENTS and self._quoted_arguments:
            self._arguments_piece(out, self._quoted_arguments)  # a string value cut off
        if self._held_space and not self.made_calls:
            self._content(out, self._held_space, keep_space=True)
        self._buffer = self._held_space = ""
        self._finished = True
        return out

    # -- the states ----------------------------------------------------------------

    def _step(self, out: list[ParsedPiece], *, final: bool) -> bool:
        """Advance one state on the buffer; whether anything moved."""
        if not self._buffer:
            return False
        if self._state is _State.TEXT:
            return self._text(out, final)
        if self._state is _State.HEAD:
            return self._head(out, final)
        if self._state is _State.WHOLE:
            return self._whole(out, final)
        if self._state is _State.ARGUMENTS:
            return self._arguments(out)
        return self._tail()

    def _text(self, out: list[ParsedPiece], final: bool) -> bool:
        buffer = self._buffer
        if self._bare is not None and self._call_may_begin:
            start = len(buffer) - len(buffer.lstrip(WHITESPACE + self.syntax.separators))
            if start == len(buffer):
                if final:
                    if not self.call_spans:
                        self._content(out, buffer)
                    # else: the separator after a call (``;``) is call syntax too
                    self._buffer = ""
                return False  # only whitespace yet: a bare call may still follow
            if buffer[start] == "{":
                leading = buffer[:start]
                if not leading.strip(WHITESPACE):
                    self._held_space += leading  # given back if this is not a call
                self._open(self._bare, buffer[start:], out, self.decided + start)
                return True
        found = [
            (position, opener) for opener in self._openers if (position := buffer.find(opener)) >= 0
        ]
        inside = self._bare_call_at(buffer) if self._bare is not None else None
        if inside is not None and (not found or inside < min(found)[0]):
            # A call's JSON in the middle of the text (a small model's habit): a call
            # when it names one of the tools, never content either way.
            self._content(out, buffer[:inside])
            self._open(_CALL_IN_TEXT, buffer[inside:], out, self.decided + inside)
            return True
        if found:
            position, opener = min(found)
            self._content(out, buffer[:position])
            wrapper = next(w for w in self.syntax.wrappers if w.opener == opener)
            self._open(wrapper, buffer[position + len(opener) :], out, self.decided + position)
            return True
        hold = partial_suffix(buffer, self._openers)
        if final:
            # The reply ended in the first characters of an opener that is nothing but
            # call markup (``<tool_c``): that is not text either. A fence's first
            # backticks are ordinary text (a code block's end).
            hold = partial_suffix(buffer, self._markup_openers)
            self._content(out, buffer[: len(buffer) - hold])
            self._buffer = ""
            return False
        self._content(out, buffer[: len(buffer) - hold])
        self._buffer = buffer[len(buffer) - hold :]
        return False

    def _bare_call_at(self, buffer: str) -> int | None:
        """Where in ``buffer`` a bare call's JSON may begin: an object whose head names
        one of the tools, or may still; None when no ``{`` in it can."""
        position = buffer.find("{")
        while position >= 0:
            head = read_head(buffer[position:], self.syntax.argument_keys)
            if head == Head.PENDING:
                if _may_name_a_tool(buffer[position:], self.tool_names):
                    return position
            elif head != Head.MISMATCH and head[0] in self.tool_names:
                return position
            position = buffer.find("{", position + 1)
        return None

    @property
    def _markup_openers(self) -> list[str]:
        """Openers that are call syntax only, never the model's text."""
        return [w.opener for w in self.syntax.wrappers if w.opener and not w.known_names_only]

    def _open(self, wrapper: CallWrapper, rest: str, out: list[ParsedPiece], at: int) -> None:
        # Whitespace just before a call belongs to neither the content nor the call; it
        # is kept aside in case this turns out not to be a call.
        self._space_before_call, self._held_space = self._held_space, ""
        self._wrapper = wrapper
        self._buffer = rest
        self._state = _State.HEAD
        self._call_since = at

    def _head(self, out: list[ParsedPiece], final: bool) -> bool:
        head = read_head(self._buffer, self.syntax.argument_keys)
        if head == Head.PENDING:
            if final:
                if self._cut_off_call():
                    self._buffer = ""  # see _whole
                    return False
                self._state = _State.WHOLE
                return True
            return False
        wrapper = self._wrapper
        if head == Head.MISMATCH or (wrapper.known_names_only and head[0] not in self.tool_names):
            if wrapper.known_names_only:
                # A fenced block or an object that is not a call is the model's text:
                # its opener is content, and what follows is read as text again.
                self._held_space = self._space_before_call
                self._content(out, wrapper.opener)
                self._call_may_begin = False
                self._state = _State.TEXT
                self._call_since = None
            else:
                self._state = _State.WHOLE
            return True
        name, arguments_at, self._braces = head
        self._buffer = self._buffer[arguments_at:]
        self._scanner = JsonValueScanner()
        self._state = _State.ARGUMENTS
        self._start_call(name, out)
        return True

    def _start_call(self, name: str, out: list[ParsedPiece]) -> None:
        # Past max_calls a call is still read (its syntax must not become content), but
        # nothing of it is returned.
        self._dropping = self.max_calls is not None and self.calls_started >= self.max_calls
        self._quoted_arguments = ""
        if not self._dropping:
            out.append(ToolCallStart(self.calls_started, self._new_id(), name))
            self.calls_started += 1

    def _arguments(self, out: list[ParsedPiece]) -> bool:
        scanner = self._scanner
        if not scanner.started:
            self._buffer = self._buffer.lstrip(WHITESPACE)
            if not self._buffer:
                return False
        end = scanner.end_in(self._buffer)
        if scanner.first_char == '"':
            # Arguments written as a JSON string holding the object: held until the
            # string ends, then unquoted (OpenAI's arguments are that inner text).
            self._quoted_arguments += self._buffer if end is None else self._buffer[:end]
            if end is None:
                self._buffer = ""
                return False
            written = self._quoted_arguments
            with contextlib.suppress(ValueError):
                written = str(json.loads(written))
        else:
            written = self._buffer if end is None else self._buffer[:end]
        self._arguments_piece(out, written)
        if end is None:
            self._buffer = ""
            return False
        self._buffer = self._buffer[end:]
        self._state = _State.TAIL
        return True

    def _arguments_piece(self, out: list[ParsedPiece], text: str) -> None:
        if text and not self._dropping:
            out.append(ArgumentsPiece(self.calls_started - 1, text))

    def _tail(self) -> bool:
        closer = self._wrapper.closer
        if not closer:
            # The object's own closing brace (or two) ends a bare call.
            while self._braces:
                brace = self._buffer.find("}")
                if brace < 0:
                    self._buffer = ""  # stray text inside a call: not content, not arguments
                    return False
                self._buffer = self._buffer[brace + 1 :]
                self._braces -= 1
            self._call_may_begin = True
            self._end_call()
            return True
        position = self._buffer.find(closer)
        if position < 0:
            keep = partial_suffix(self._buffer, [closer])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        self._buffer = self._buffer[position + len(closer) :]
        self._end_call()
        return True

    def _end_call(self) -> None:
        """The call being read ended here; text follows."""
        assert self._call_since is not None
        self.call_spans.append((self._call_since, self.decided))
        self._call_since = None
        self._state = _State.TEXT

    def _cut_off_call(self) -> bool:
        """Whether the call being read, which the reply ends inside of, is call syntax.

        An opener that is markup only says so by itself. A fenced block or a bare
        object is the model's text unless it may still be a call: its head so far is a
        call's, naming (the start of) one of the tools, or any function where the
        family's bare calls need no known name (Llama 3).
        """
        wrapper = self._wrapper
        if wrapper.opener and not wrapper.known_names_only:
            return True
        if wrapper.closer and wrapper.closer in self._buffer:
            return False  # a whole block: read as it was written
        if read_head(self._buffer, self.syntax.argument_keys) == Head.MISMATCH:
            return False  # an object, but not a call's
        return not wrapper.known_names_only or _may_name_a_tool(self._buffer, self.tool_names)

    def _whole(self, out: list[ParsedPiece], final: bool) -> bool:
        """A call with an unusual head: wait for all of it, then read it as JSON."""
        wrapper = self._wrapper
        closer = ""
        if wrapper.closer:
            position = self._buffer.find(wrapper.closer)
            if position < 0:
                if not final:
                    return False
                if self._cut_off_call():
                    # The reply ended inside a call: its text is call syntax, not the
                    # model's words, and no call can be made of it.
                    self._buffer = ""
                    return False
                position = len(self._buffer)
            else:
                closer = wrapper.closer
            body, rest = self._buffer[:position], self._buffer[position + len(closer) :]
        else:
            end = JsonValueScanner().end_in(self._buffer)
            if end is None:
                if not final:
                    return False
                if self._cut_off_call():
                    self._buffer = ""
                    return False
                end = len(self._buffer)
            body, rest = self._buffer[:end], self._buffer[end:]
        call = self._call_from_json(body)
        self._buffer = rest
        if call is not None:
            name, arguments = call
            self._start_call(name, out)
            self._arguments_piece(out, arguments)
            self._end_call()
            return True
        if wrapper.known_names_only or not wrapper.opener:
            # Not a call after all: the model's text, as it wrote it.
            self._held_space = self._space_before_call
            self._content(out, wrapper.opener + body + closer)
        # else: a block behind call markup that holds no call is markup all the same
        # (the grammar never lets a model write one; an unconstrained model might).
        self._call_since = None
        self._state = _State.TEXT
        return True

    def _call_from_json(self, body: str) -> tuple[str, str] | None:
        text = body.strip(WHITESPACE)
        if text.startswith("{{") and text.endswith("}}"):
            text = text[1:-1]  # the doubled braces Qwen2.5's template shows
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        if self._wrapper.known_names_only and value["name"] not in self.tool_names:
            return None
        key = next((key for key in self.syntax.argument_keys if key in value), None)
        arguments = value[key] if key is not None else {}
        if isinstance(arguments, str):
            return value["name"], arguments
        return value["name"], json.dumps(arguments, ensure_ascii=False)

    def _content(self, out: list[ParsedPiece], text: str, *, keep_space: bool = False) -> None:
        if not text:
            return
        if not keep_space:
            # Trailing whitespace waits: if a call follows, it is dropped with it.
            stripped = text.rstrip(WHITESPACE)
            if not stripped:
                self._held_space += text
                return
            text, trailing = self._held_space + stripped, text[len(stripped) :]
            self._held_space = trailing
        else:
            self._held_space = ""
        self._call_may_begin = False
        out.append(ContentPiece(text))


# The name in a call head that may be cut off: its text so far, and its closing quote.
_HEAD_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)("?)')


def _may_name_a_tool(head: str, tool_names: Collection[str]) -> bool:
    """Whether a call head that is still pending (``{"name": "get_w``) may name a tool."""
    match = _HEAD_NAME.search(head)
    if match is None:
        return True  # no name written yet
    written, closed = match.group(1), bool(match.group(2))
    with contextlib.suppress(ValueError):
        written = json.loads(f'"{written}"')
    if closed:
        return written in tool_names
    return any(name.startswith(written) for name in tool_names)
