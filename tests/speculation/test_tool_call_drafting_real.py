"""Issue 39 on the real starter pair: a Write of a file the agent just read is drafted
through the tool call's JSON escaping, and stays exact.

The repro's conversation (a 79-line file Read with ``cat -n`` numbers), with the
request restated after the file, as a user does when the model hesitates: the 1.5B
target then writes the file back into ``Write``'s ``content``, escaped. Greedy under
``exact_output``: the n-gram drafter's reply must equal plain decoding's token for
token, and most of the file's tokens must come from accepted drafts (token lookup
alone finds the file's runs only between escapes: about half of them).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from backends.engine import Engine
from tests.speculation.forced_write import REPRO, forced_write_request
from tests.support.model_files import TARGET_KEY
from tests.support.real_runtimes import load_model

pytestmark = pytest.mark.real_model

RESTATED = (
    "Now call Write with file_path /work/shop/inventory.py and content: the complete "
    "file above, every line, with receive_stock renamed to restock."
)


def test_a_write_of_a_file_just_read_is_drafted_from_it_and_equals_plain_decoding():
    body = json.loads(REPRO.read_text())
    body["messages"] += [
        {"role": "assistant", "content": "I have read the file."},
        {"role": "user", "content": RESTATED},
    ]
    engine = Engine(load_model("llamacpp", TARGET_KEY, exact_kernels=True), None)
    try:
        engine.calibrate()  # the exact batch limit, as serve measures it at load
        request = forced_write_request(engine, body, max_tokens=160)
        replies, stats = {}, {}
        for drafter in ("none", "ngram"):
            events = list(engine.generate(dataclasses.replace(request, drafter=drafter)))
            replies[drafter] = [token for event in events for token in event.tokens]
            stats[drafter] = events[-1].stats
        text = b"".join(engine.target.token_bytes(t) for t in replies["none"]).decode()
    finally:
        engine.close()
    assert '"content": "' in text and "\\n" in text, text
    assert replies["ngram"] == replies["none"]
    written = stats["ngram"].generated_tokens - stats["ngram"].grammar_forced
    assert stats["ngram"].accepted >= 0.6 * written, stats["ngram"]
