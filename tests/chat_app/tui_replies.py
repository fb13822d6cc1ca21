"""What the chat app's pilot tests share: the reply the scripted engine writes, the
stats bar's text, and where screenshots go.
"""

from __future__ import annotations

from pathlib import Path

from app.tui.widgets.stats_bar import StatsBar
from tests.support.tui_helpers import (
    stop_engine_servers,  # noqa: F401 (an autouse fixture)
)

ARTIFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
CODE_REPLY = (
    "Here is the function:\n\n```python\ndef double(x):\n    return x * 2\n```\n\n"
    "And the same again:\n\n```python\ndef double(x):\n    return x * 2\n```\n"
)


def stats_text(app) -> str:  # type: ignore[no-untyped-def]
    return str(app.chat_screen.query_one(StatsBar).render())
