"""A reply's figures: what the chat shows and stores, old records included."""

from __future__ import annotations

from app.tui.reply import ReplyFigures

OLD_RECORD = {
    "generated_tokens": 40,
    "decode_tokens_per_second": 12.5,
    "acceptance_rate": 0.5,
    "mean_accepted_length": 1.5,
    "drafted": 20,
    "accepted": 10,
    "drafter": "model",
    "draft_length": 4,
    "estimated_speedup": 1.2,
    "finish_reason": "stop",
}


def test_figures_saved_before_host_time_was_measured_still_load():
    figures = ReplyFigures.from_dict(OLD_RECORD)
    assert figures is not None
    assert figures.host_ms_per_token == 0.0
    assert "host" not in figures.summary()


def test_the_summary_shows_the_loops_host_time_per_token():
    figures = ReplyFigures.from_dict({**OLD_RECORD, "host_ms_per_token": 0.4321})
    assert figures is not None
    assert "host 0.43 ms/token" in figures.summary()
    assert ReplyFigures.from_dict(figures.as_dict()) == figures


def test_a_record_missing_a_required_figure_is_unusable():
    broken = {name: value for name, value in OLD_RECORD.items() if name != "drafted"}
    assert ReplyFigures.from_dict(broken) is None
