"""`draftpen chat` flags override the settings file for one run, and bad ones say why."""

from __future__ import annotations

import subprocess
import sys

from app.main import build_parser
from app.options import chat_settings
from app.settings import Settings, save_settings


def test_chat_flags_override_settings_for_this_run_only() -> None:
    saved = save_settings(Settings(temperature=0.9, top_k=20, drafter="model", max_tokens=300))
    args = build_parser().parse_args(["chat", "--temperature", "0", "--drafter", "ngram"])
    settings = chat_settings(args)
    assert (settings.temperature, settings.drafter) == (0.0, "ngram")
    assert (settings.top_k, settings.max_tokens) == (20, 300)  # not given: from the file
    assert "temperature = 0.9" in saved.read_text()  # the file is untouched


def test_a_bad_chat_flag_is_one_line_that_names_the_problem() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.main", "--temperature", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "draftpen: temperature must be 0 or more (0 = always the likeliest)"
    )
