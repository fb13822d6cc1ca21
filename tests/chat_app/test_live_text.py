"""Where a streaming reply's finished Markdown ends (app.tui.live_text)."""

from __future__ import annotations

from app.tui.live_text import completed_length, split_segments


def test_a_paragraph_is_complete_only_once_a_blank_line_follows_it() -> None:
    assert completed_length("Hello there") == 0
    assert completed_length("Hello there\n") == 0
    assert completed_length("Hello there\n\nNext") == len("Hello there\n\n")
    assert completed_length("One\n\nTwo\n\nThr") == len("One\n\nTwo\n\n")


def test_a_code_block_is_complete_at_its_closing_fence_and_blank_lines_inside_do_not_count() -> (
    None
):
    text = "Code:\n\n```python\ndef f():\n\n    return 1\n"
    assert completed_length(text) == len("Code:\n\n")  # still inside the fence
    closed = text + "```\n"
    assert completed_length(closed) == len(closed)
    assert completed_length(text + "```") == len("Code:\n\n")  # the closing line has not ended
    # A fence line with an info string inside a fence does not close it.
    assert completed_length("```\n```python\nx\n") == 0
    assert completed_length("~~~~\n~~~\n~~~~\n") == len("~~~~\n~~~\n~~~~\n")


def test_segments_split_at_a_character_offset_keep_their_provenance() -> None:
    segments = [("abc", False), ("def", True), ("gh", False)]
    assert split_segments(segments, 4) == (
        [("abc", False), ("d", True)],
        [("ef", True), ("gh", False)],
    )
    assert split_segments(segments, 3) == ([("abc", False)], [("def", True), ("gh", False)])
    assert split_segments(segments, 0) == ([], segments)
    assert split_segments(segments, 8) == (segments, [])


def test_resuming_from_an_earlier_boundary_gives_the_same_answer_as_a_full_scan() -> None:
    text = "Intro\n\n```python\nx = 1\n\ny = 2\n```\n\nMore text\n\nTail"
    boundaries = {0}
    for end in range(len(text) + 1):
        prefix = text[:end]
        whole = completed_length(prefix)
        # Resuming from any boundary found for a shorter prefix agrees with a full scan.
        for start in boundaries:
            if start <= end:
                assert completed_length(prefix, start) == whole, (end, start)
        boundaries.add(whole)
    assert boundaries >= {len("Intro\n\n"), len(text) - len("Tail")}
