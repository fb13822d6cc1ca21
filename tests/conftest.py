"""Shared fixtures.

Every test gets its own ``DRAFTPEN_HOME`` (config, data, cache), so nothing touches a
real home directory. Real model files live in one persistent store outside the clone,
``$DRAFTPEN_MODELS_DIR`` or ``~/.cache/draftpen-test-models``, so CI and developers
fetch them once per machine (``draftpen models pull starter``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Read before any test changes the environment.
TEST_MODELS_DIR = Path(
    os.environ.get("DRAFTPEN_MODELS_DIR") or Path.home() / ".cache" / "draftpen-test-models"
).expanduser()


@pytest.fixture(autouse=True)
def draftpen_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A fresh, empty DRAFTPEN_HOME for each test; models come from the test store."""
    home = tmp_path_factory.mktemp("draftpen-home")
    monkeypatch.setenv("DRAFTPEN_HOME", str(home))
    monkeypatch.setenv("DRAFTPEN_MODELS_DIR", str(TEST_MODELS_DIR))
    monkeypatch.delenv("DRAFTPEN_CATALOG", raising=False)
    # The Hugging Face cache is per test too, and the hub is a closed port: no test
    # reaches the internet or reads a real token (tests/support/hub_server.py serves the hub).
    monkeypatch.setenv("HF_HOME", str(home / "huggingface"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return home
