"""Loading a pair whose drafter is the target's own MTP head.

The head is either inside the target GGUF (``drafter = "mtp"`` with no draft) or a
separate MTP file (``draft`` names it). Such a file is not a model that runs alone, so it
must never be loaded as a draft model; and where the runtime has no MTP drafter the pair
still loads and drafts with n-grams, saying so. The target here is the real SmolLM2 file
(its catalog entry claims an MTP layer: nothing reads it until a drafter does); the
separate head is a GGUF header with no weights, which llama.cpp could not load as a
model, so loading it by mistake fails the test. A Gemma 4 pair laid out as the
catalog's is loaded for real (tests/support/tiny_gemma4.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import app.loading
from app.loading import load_engine
from app.models.catalog_file import load_catalog
from app.models.pair_download import check_pair_tokenizers
from app.models.pair_files import pair_files
from app.models.user_pairs import add_user_pair, use_command_line_pair
from app.settings import user_catalog_path
from backends.base import ChatMessage
from backends.engine import Engine, GenerationRequest
from backends.engine_drafters import EngineDrafters
from backends.engine_slots import EngineSlots
from backends.sampling.filters import SamplingParams
from tests.models.gguf_files import write_gguf
from tests.support.draftpen_cli import run_draftpen
from tests.support.head_pairs import check_loaded_head_drafts
from tests.support.model_files import SMOLLM2_KEY, require_model
from tests.support.slot_runs import reply_tokens, run_on_slots, serving_exchange
from tests.support.tiny_gemma4 import write_tiny_gemma4, write_tiny_gemma4_assistant

MY_MODELS = """
[models.small-with-head]
name = "SmolLM2 (its catalog entry claims an MTP layer)"
format = "gguf"
architecture = "llama"
size_bytes = {target_size}
mtp_layers = 1

[models.small-with-head.sources.local]
path = "{target}"

[models.small]
name = "SmolLM2"
format = "gguf"
architecture = "llama"
size_bytes = {target_size}

[models.small.sources.local]
path = "{target}"

[models.head]
name = "A separate MTP head (no weights)"
format = "gguf"
architecture = "llama"
size_bytes = {head_size}
mtp_layers = 1

[models.head.sources.local]
path = "{head}"

[pairs.embedded]
description = "The head inside the target."

[pairs.embedded.llamacpp]
target = "small-with-head"
drafter = "mtp"

[pairs.separate]
description = "The head in its own file."

[pairs.separate.llamacpp]
target = "small"
draft = "head"
drafter = "mtp"
"""


@pytest.fixture
def mtp_pairs(tmp_path: Path) -> Path:
    """The user's catalog with the two MTP pairs; returns the separate head's path."""
    target = require_model(SMOLLM2_KEY)
    head = write_gguf(tmp_path / "mtp-head.gguf")
    path = user_catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        MY_MODELS.format(
            target=target,
            target_size=target.stat().st_size,
            head=head,
            head_size=head.stat().st_size,
        )
    )
    return head


def load(name: str, messages: list[str]) -> Engine:
    return load_engine(
        name, n_ctx=256, runtime="llamacpp", calibrate=False, on_progress=messages.append
    )


def test_an_mtp_pair_loads_and_drafts_with_ngrams_where_the_runtime_has_no_mtp_drafter(
    mtp_pairs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(app.loading, "DRAFTER_CHOICES", ("auto", "model", "ngram", "none"))
    messages: list[str] = []
    with caplog.at_level(logging.WARNING, logger="app.loading"):
        engine = load("embedded", messages)
    try:
        assert engine.draft is None
        assert engine.drafter_named("ngram") is not None  # it still speculates
        note = "embedded: this build of draftpen cannot draft with an MTP head yet"
        assert any(message.startswith(note) for message in messages)
        assert "drafting with n-grams instead" in caplog.text  # seen without a callback too
    finally:
        engine.target.close()


def test_a_separate_mtp_head_is_never_loaded_as_a_draft_model(
    mtp_pairs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    resolved = pair_files("separate", "llamacpp")
    assert resolved.draft_path is None and resolved.mtp_head_path == mtp_pairs
    # It reads the target's vocabulary: there is no tokenizer pair to check.
    assert check_pair_tokenizers(resolved) is None

    # A runtime with an MTP drafter but no way to take a separate head: n-grams, said so.
    monkeypatch.setattr(app.loading, "DRAFTER_CHOICES", ("auto", "model", "mtp", "ngram", "none"))
    monkeypatch.delattr(EngineDrafters, "attach_mtp_head")
    messages: list[str] = []
    with caplog.at_level(logging.WARNING, logger="app.loading"):
        engine = load("separate", messages)
    try:
        assert engine.draft is None
        assert any("not with a separate file (mtp-head.gguf)" in m for m in messages)
    finally:
        engine.target.close()

    # One that takes it is handed the file, and nothing loads it as a model.
    attached: list[Path] = []
    monkeypatch.setattr(
        Engine, "attach_mtp_head", lambda self, path: attached.append(path), raising=False
    )
    messages = []
    engine = load("separate", messages)
    try:
        assert attached == [mtp_pairs] and engine.draft is None
        assert "loading MTP head mtp-head.gguf" in messages
        assert not any("n-grams instead" in m for m in messages)
    finally:
        engine.target.close()


def test_a_head_inside_the_target_needs_nothing_more_where_the_runtime_drafts_with_mtp(
    mtp_pairs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.loading, "DRAFTER_CHOICES", ("auto", "model", "mtp", "ngram", "none"))
    messages: list[str] = []
    engine = load("embedded", messages)
    try:
        assert engine.draft is None
        assert not any("MTP" in message for message in messages)
    finally:
        engine.target.close()


GEMMA4_PAIR = """
[models.tiny-gemma4]
name = "A tiny Gemma 4"
format = "gguf"
architecture = "gemma4"
size_bytes = {target_size}

[models.tiny-gemma4.sources.local]
path = "{target}"

[models.tiny-gemma4-assistant]
name = "Its assistant (MTP) head"
format = "gguf"
architecture = "gemma4-assistant"
size_bytes = {head_size}
mtp_layers = 2

[models.tiny-gemma4-assistant.sources.local]
path = "{head}"

[pairs.tiny-gemma4]
description = "Gemma 4 with its assistant head, as the catalog's gemma4-12b pairs them."

[pairs.tiny-gemma4.llamacpp]
target = "tiny-gemma4"
draft = "tiny-gemma4-assistant"
drafter = "mtp"
"""


@pytest.mark.real_model
@pytest.mark.parametrize("parallel", [1, 2])
def test_a_gemma4_pair_loads_and_drafts_with_its_assistant_head(
    tmp_path: Path, parallel: int
) -> None:
    """A pair laid out as the catalog's ``gemma4-12b`` (a Gemma 4 target, its assistant
    head as the draft, ``drafter = "mtp"``) loads and drafts with the head, alone and
    with several sequences (a head draftpen refused once failed the whole load)."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_gemma4(tmp_path / "tiny-gemma4.gguf", tokenizer, seed=1)
    head = write_tiny_gemma4_assistant(tmp_path / "tiny-gemma4-assistant.gguf", tokenizer, seed=2)
    path = user_catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        GEMMA4_PAIR.format(
            target=target,
            target_size=target.stat().st_size,
            head=head,
            head_size=head.stat().st_size,
        )
    )
    messages: list[str] = []
    engine = load_engine(
        "tiny-gemma4",
        n_ctx=512,
        runtime="llamacpp",
        calibrate=False,
        on_progress=messages.append,
        parallel=parallel,
    )
    try:
        assert "loading MTP head tiny-gemma4-assistant.gguf" in messages
        assert engine.draft is None and engine.head_names() == ["mtp"]
        assert engine.target.parallel == parallel  # type: ignore[attr-defined]
        request = GenerationRequest(
            tuple(engine.chat_prompt([ChatMessage("user", "Write a short poem, please.")])),
            params=SamplingParams(temperature=0.0),
            max_tokens=16,
            drafter="mtp",
            draft_tokens=3,
        )
        if parallel == 1:
            events = list(engine.generate(request))
        else:
            with serving_exchange() as exchange:
                slots = EngineSlots(engine, exchange)
                try:
                    events = run_on_slots(slots, {"one": request})["one"][1]
                finally:
                    slots.close()
        assert len(reply_tokens(events)) == 16
        assert any(event.drafter == "mtp" and event.draft_length for event in events)
    finally:
        engine.close()


@pytest.mark.real_model
def test_your_own_gemma4_and_its_assistant_load_as_a_pair_that_drafts_with_it(
    tmp_path: Path,
) -> None:
    """``--target GEMMA4 --draft ASSISTANT``: the assistant's header makes it the pair's
    MTP head (never a draft model); ``models add`` keeps it so; ``draftpen generate
    --drafter mtp`` drafts with it (it once loaded no head and said the target had none)."""
    tokenizer = require_model(SMOLLM2_KEY)
    target = write_tiny_gemma4(tmp_path / "tiny-gemma4.gguf", tokenizer, seed=1)
    head = write_tiny_gemma4_assistant(tmp_path / "tiny-gemma4-assistant.gguf", tokenizer, seed=2)
    name = use_command_line_pair(str(target), str(head))
    messages: list[str] = []
    engine = load_engine(
        name, n_ctx=256, runtime="llamacpp", calibrate=False, on_progress=messages.append
    )
    check_loaded_head_drafts(engine, messages, "loading MTP head", "mtp")

    kept = add_user_pair("my-gemma4", str(target), str(head))
    assert kept.variants[0].drafter == "mtp"
    assert load_catalog().model(kept.variants[0].draft).mtp_layers == 2  # type: ignore[arg-type]

    result = run_draftpen(
        "generate", "--target", str(target), "--draft", str(head), "--drafter", "mtp",
        "--max-tokens", "16", "--json", "-p", "The sea is",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stats"]["drafted"] > 0
