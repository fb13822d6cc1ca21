"""Prompt lookup through a tool call's JSON escaping (issue 39, part 1).

A model that writes back a file it read writes it as a JSON string: ``\\n`` for a
newline, ``\\"`` for a quote, no line numbers. These tests use a byte-level vocabulary
(one token per byte) and a word-level one (so that a match's tokens depend on where
the tokenizer starts), and check what the drafter proposes inside and outside a
JSON string.
"""

from __future__ import annotations

import json
import re

from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.text_lookup import TextLookup, escaped

FILE = 'def total(items):\n    """Sum the prices."""\n    return sum(i.price for i in items)\n'
CAT_N = "".join(f"{n:>6}\t{line}\n" for n, line in enumerate(FILE.splitlines(), 1))
ARROWS = "".join(f"{n:>6}→{line}\n" for n, line in enumerate(FILE.splitlines(), 1))


class ByteVocab:
    """One token per byte (ids 0-255); counts the bytes it was asked for."""

    def __init__(self) -> None:
        self.pieces_asked = 0

    def token_bytes(self, token: int) -> bytes:
        self.pieces_asked += 1
        return bytes([token])

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def tokens(self, text: str) -> list[int]:
        return self.tokenize(text)

    def text(self, tokens: list[int]) -> str:
        return bytes(tokens).decode("utf-8")


class WordVocab:
    """Words, single punctuation and ``\\n`` as tokens, except that a backslash after
    a quote or parenthesis stands alone (as a BPE pre-tokenizer splits ``\\")\\n``)."""

    PIECES = re.compile(r'(?<=[")])\\|\\n|\w+| +|.', re.S)

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.texts: dict[int, str] = {}

    def token_bytes(self, token: int) -> bytes:
        return self.texts[token].encode("utf-8")

    def tokenize(self, text: str) -> list[int]:
        tokens = []
        for piece in self.PIECES.findall(text):
            if piece not in self.ids:
                self.ids[piece] = len(self.ids)
                self.texts[self.ids[piece]] = piece
            tokens.append(self.ids[piece])
        return tokens

    def text(self, tokens: list[int]) -> str:
        return "".join(self.texts[t] for t in tokens)


def write_call(content_so_far: str) -> str:
    """A tool call writing a file, up to ``content_so_far`` of its content."""
    return '<tool_call>\n{"name": "Write", "arguments": {"content": "' + content_so_far


def drafted_text(vocab, prompt: str, reply: str, max_tokens: int = 24) -> tuple[str, str]:
    """What the drafter proposes after ``reply`` to ``prompt``, and its match's key."""
    drafter = NgramDrafter(text=TextLookup(vocab.token_bytes, vocab.tokenize))
    prompt_tokens = vocab.tokenize(prompt)
    drafter.begin(prompt_tokens)
    context = prompt_tokens + vocab.tokenize(reply)
    tokens, size = drafter.lookup(context, max_tokens)
    return (vocab.text(tokens) if size >= drafter.min_match else ""), drafter.last_match_key


def test_a_file_read_with_cat_n_numbers_is_drafted_escaped_and_without_them():
    vocab = ByteVocab()
    reply = write_call(escaped(FILE[:30]).decode())
    text, key = drafted_text(vocab, "<tool_response>\n" + CAT_N + "</tool_response>\n", reply)
    assert key == "ngram:text"
    assert text == escaped(FILE).decode()[len(escaped(FILE[:30])) :][:24]
    assert '\\"\\"\\"' in text  # the quotes, escaped as the reply escapes them


def test_claude_codes_arrow_numbers_are_taken_off_too():
    vocab = ByteVocab()
    reply = write_call(escaped(FILE[:40]).decode())
    text, key = drafted_text(vocab, ARROWS, reply, max_tokens=40)
    expected = escaped(FILE).decode()[len(escaped(FILE[:40])) :]
    assert key == "ngram:text" and text == expected[:40]
    assert "→" not in text and "\t" not in text


def test_outside_a_json_string_the_text_is_not_looked_up():
    # The same bytes on a line of plain text: token lookup only, which finds the
    # prompt's raw text with its line numbers.
    vocab = ByteVocab()
    text, key = drafted_text(vocab, CAT_N, "Here it is:\n" + FILE[:13])
    assert key.startswith("ngram:") and key != "ngram:text"
    assert text.startswith("ms):\n     2\t")


def test_a_real_newline_ends_the_json_string():
    vocab = ByteVocab()
    reply = write_call(escaped(FILE[:30]).decode()) + '"}}\n</tool_call>\nDone. ' + FILE[:30]
    _, key = drafted_text(vocab, CAT_N, reply)
    assert key != "ngram:text"


def test_a_patchs_context_lines_are_found_with_their_leading_space():
    # Codex's apply_patch: every context line opens with a space, inside a JSON string.
    vocab = ByteVocab()
    lines = FILE.splitlines()
    patch = "*** Begin Patch\n*** Update File: a.py\n@@\n " + lines[0] + "\n " + lines[1][:12]
    text, key = drafted_text(vocab, FILE, '{"input": "' + escaped(patch).decode())
    assert key == "ngram:text"
    assert text == escaped(lines[1][12:] + "\n " + lines[2]).decode()[:24]


def test_the_drafts_tokens_are_split_as_after_the_match_not_as_a_fresh_text():
    # After `\")` this vocabulary splits `\n` from what follows into `\` and `nprint`;
    # tokenized alone, the continuation would open with the one token `\n`, which a
    # reply that wrote `\")` never writes next.
    vocab = WordVocab()
    lookup = TextLookup(vocab.token_bytes, vocab.tokenize)
    prompt = vocab.tokenize('print("a")\nprint("b")\n')
    reply = vocab.tokenize(write_call(escaped('print("a")').decode()))
    lookup.begin(prompt)
    tokens, size = lookup.continuation(prompt + reply, 3)
    assert size == len('print(\\"a\\")')
    assert [vocab.texts[t] for t in tokens] == ["\\", "nprint", "("]
    assert vocab.texts[vocab.tokenize('\\nprint(\\"b')[0]] == "\\n"


def test_a_prompt_that_extends_the_last_one_joins_only_its_new_tokens():
    first_vocab, fresh_vocab = ByteVocab(), ByteVocab()
    first = first_vocab.tokenize(CAT_N)
    reply = first_vocab.tokenize(write_call(escaped(FILE[:30]).decode()))
    second = first + reply + first_vocab.tokenize('"}}\n' + CAT_N)
    reused = TextLookup(first_vocab.token_bytes, first_vocab.tokenize)
    reused.begin(first)
    assert reused.continuation(first + reply, 8)[0]
    fresh = TextLookup(fresh_vocab.token_bytes, fresh_vocab.tokenize)
    first_vocab.pieces_asked = 0
    found = []
    for lookup in (reused, fresh):
        lookup.begin(second)
        tokens, size = lookup.continuation(second + reply, 8)
        assert size
        found.append(tokens)
    assert found[0] == found[1]
    assert first_vocab.text(found[0]) == escaped(FILE).decode()[len(escaped(FILE[:30])) :][:8]
    # The first prompt's bytes were not asked for again.
    assert first_vocab.pieces_asked <= fresh_vocab.pieces_asked - len(first)


def test_nothing_is_proposed_when_the_reply_is_nowhere_in_the_prompt():
    vocab = ByteVocab()
    reply = write_call(escaped("completely different text here").decode())
    _, key = drafted_text(vocab, CAT_N, reply)
    assert key != "ngram:text"


def test_escaped_matches_what_json_writes():
    value = 'a "quoted"\tline\n\\ and é'
    assert escaped(value) == json.dumps(value, ensure_ascii=False)[1:-1].encode("utf-8")
