"""What splitting reasoning from the answer costs per event (host time, no model).

Feeds a long Qwen3-style reply (``<think>`` ... ``</think>`` then the answer) to
:class:`backends.output.reasoning.ReasoningSplitter` in pieces the size of a speculative round's
text, and reports microseconds per event and per character. The loop's own host cost is
~0.1-1 ms per token on the machines in README.md, so this is the figure to compare with.

    PYTHONPATH=. python benchmarks/reasoning_split_cost.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from backends.generation_events import TextSegment
from backends.output.reasoning import ReasoningFormat, ReasoningSplit, ReasoningSplitter

REASONING_WORDS = "Let me think about whether the list is sorted before I answer. " * 120
ANSWER_WORDS = "Use `sorted(items)`; it returns a new list and leaves the old one alone. " * 30
REPLY = f"<think>\n{REASONING_WORDS}\n</think>\n\n{ANSWER_WORDS}"


def split_once(piece_chars: int) -> tuple[float, int, list[ReasoningSplit]]:
    """Seconds to split the reply fed ``piece_chars`` at a time; events; each step's split."""
    pieces = [
        (TextSegment(REPLY[at : at + piece_chars], at % 3 == 0), 1)
        for at in range(0, len(REPLY), piece_chars)
    ]
    splitter = ReasoningSplitter(ReasoningFormat())
    steps: list[ReasoningSplit] = []
    start = time.perf_counter()
    for segment, tokens in pieces:
        steps.append(splitter.feed((segment,), tokens))
    steps.append(splitter.finish())
    return time.perf_counter() - start, len(pieces), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"reply: {len(REPLY):,} characters ({len(REASONING_WORDS):,} of reasoning)")
    for piece_chars in (4, 16, 64):
        runs = [split_once(piece_chars) for _ in range(args.repeats)]
        seconds = statistics.median(run[0] for run in runs)
        events = runs[0][1]
        steps = runs[0][2]
        assert "".join(step.reasoning_text for step in steps) == REASONING_WORDS.strip()
        assert "".join(step.answer_text for step in steps) == ANSWER_WORDS
        print(
            f"pieces of {piece_chars:>2} chars: {events:>6} events, "
            f"{seconds * 1e6 / events:6.2f} us/event, "
            f"{seconds * 1e9 / len(REPLY):7.1f} ns/char (median of {args.repeats})"
        )


if __name__ == "__main__":
    main()
