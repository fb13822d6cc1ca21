"""Prompt lookup through a tool call's JSON escaping: the n-gram drafter's text source.

An agent that writes back a file it just read writes the file's text as a JSON string
inside a tool call: newlines as ``\\n``, quotes as ``\\"``, and without the line
numbers its Read tool put before every line (``cat -n``'s ``     7\\t``, Claude Code's
``     7→``). Those are other tokens than the prompt's, so token lookup finds nothing
there. While the reply is inside a JSON string, this looks the reply's latest bytes up
in the prompt's text as a tool call would spell it (numbers off, JSON-escaped; and
once more with every line opened by a space, as a patch's context lines are) and
tokenizes what followed into the target's vocabulary. A tokenization other than the
one the model would write costs acceptance, never exactness: the target verifies
every token.

The prompt's text is built on the first lookup that needs it, so a reply that never
writes a JSON string pays nothing; a prompt that extends the previous one (an
agent's next turn) reuses the bytes already joined.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

# A line number a Read-style tool put before a line: `cat -n` pads to six columns and
# ends with a tab; Claude Code's Read ends with an arrow.
NUMBERED_LINE = re.compile(r"(?m)^ *\d+(?:\t|→)")
# Signs, on the reply's current line, that it is inside a JSON string value.
JSON_STRING_SIGNS = (b'": "', b"\\n", b'\\"', b"\\t")
# The longest query first: a longer match is likelier to go on matching.
QUERY_BYTES = (40, 24, 12)
# Enough bytes for the tokens asked for (code averages 3-4 bytes a token).
BYTES_PER_TOKEN = 8
# At most this many tokens make up the query (a token holds at least one byte).
TAIL_TOKENS = QUERY_BYTES[0]


class TextLookup:
    """The reply's last bytes found in the prompt's text as a JSON string spells it."""

    def __init__(
        self, token_bytes: Callable[[int], bytes], tokenize: Callable[[str], list[int]]
    ) -> None:
        """``token_bytes`` and ``tokenize`` are the target's (``tokenize`` without
        special tokens added): drafts must be the target's tokens."""
        self._token_bytes = token_bytes
        self._tokenize = tokenize
        self._prompt: Sequence[int] = ()
        self._sources: tuple[bytes, ...] | None = None
        self._joined_tokens: list[int] = []
        self._joined = b""
        self._followed = 0  # context tokens whose bytes the JSON tracking has seen
        self._line_end = b""  # the current line's last bytes (signs split across tokens)
        self._in_json_string = False

    def begin(self, prompt_tokens: Sequence[int]) -> None:
        """A new reply to ``prompt_tokens``."""
        self._prompt = prompt_tokens
        self._sources = None
        self._followed = len(prompt_tokens)
        self._line_end = b""
        self._in_json_string = False

    def continuation(self, context: Sequence[int], max_tokens: int) -> tuple[list[int], int]:
        """Tokens the prompt's escaped text continues the reply with, and the bytes the
        match spans (0 and no tokens when the reply is not in a JSON string, or its
        last bytes are nowhere in the prompt)."""
        self._follow(context)
        if not self._in_json_string or max_tokens <= 0:
            return [], 0
        tail = self._tail(context)
        for size in QUERY_BYTES:
            if len(tail) < size:
                continue
            query = tail[-size:]
            for source in self._text_sources():
                at = source.rfind(query)
                if at < 0:
                    continue
                tokens = self._tokens_after(source, at, size, max_tokens)
                if tokens:
                    return tokens, size
        return [], 0

    def _tokens_after(self, source: bytes, at: int, size: int, max_tokens: int) -> list[int]:
        """The tokens of what follows the match at ``at`` (``size`` bytes long).

        The match is tokenized with what follows, and the tokens after its end kept:
        how text splits into tokens depends on what precedes it (after ``\\")`` the
        tokenizer splits ``\\n`` into ``\\`` and ``n``; at the start of a text it keeps
        it whole), and the reply's tokens did end there. Where no token ends there,
        what follows is tokenized alone.
        """
        end = at + size + max_tokens * BYTES_PER_TOKEN
        tokens = self._tokenize(source[at:end].decode("utf-8", "ignore"))
        spanned = 0
        for index, token in enumerate(tokens):
            if spanned == size:
                return tokens[index : index + max_tokens]
            if spanned > size:
                break
            spanned += len(self._token_bytes(token))
        piece = source[at + size : end].decode("utf-8", "ignore")
        return self._tokenize(piece)[:max_tokens]

    # -- the parts ---------------------------------------------------------------

    def _tail(self, context: Sequence[int]) -> bytes:
        """The reply's last bytes: enough tokens for the longest query."""
        pieces: list[bytes] = []
        length = 0
        for token in reversed(context[-TAIL_TOKENS:]):
            pieces.append(self._token_bytes(token))
            length += len(pieces[-1])
            if length >= QUERY_BYTES[0]:
                break
        return b"".join(reversed(pieces))

    def _follow(self, context: Sequence[int]) -> None:
        """Track, over the reply's new tokens, whether its current line is inside a
        JSON string: a real newline ends that (a tool call's JSON is one line)."""
        if len(context) < self._followed:
            self._followed = len(self._prompt)
            self._line_end, self._in_json_string = b"", False
        for token in context[self._followed :]:
            piece = self._token_bytes(token)
            newline = piece.rfind(b"\n")
            if newline >= 0:
                piece = piece[newline + 1 :]
                self._line_end, self._in_json_string = b"", False
            window = self._line_end + piece
            if not self._in_json_string and any(sign in window for sign in JSON_STRING_SIGNS):
                self._in_json_string = True
            self._line_end = window[-4:]
        self._followed = len(context)

    def _text_sources(self) -> tuple[bytes, ...]:
        if self._sources is None:
            text = self._prompt_bytes().decode("utf-8", "replace")
            unnumbered = NUMBERED_LINE.sub("", text)
            as_patch = "".join(" " + line for line in unnumbered.splitlines(keepends=True))
            self._sources = (escaped(unnumbered), escaped(as_patch))
        return self._sources

    def _prompt_bytes(self) -> bytes:
        """The prompt's bytes, reusing the last prompt's where this one extends it."""
        prompt = list(self._prompt)
        known = len(self._joined_tokens)
        if known and known <= len(prompt) and prompt[:known] == self._joined_tokens:
            self._joined += b"".join(self._token_bytes(t) for t in prompt[known:])
        else:
            self._joined = b"".join(self._token_bytes(t) for t in prompt)
        self._joined_tokens = prompt
        return self._joined


def escaped(text: str) -> bytes:
    """``text`` as the inside of a JSON string, as a model writes it (UTF-8 kept)."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")
