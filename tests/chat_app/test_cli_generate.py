"""``draftpen generate`` end to end, through a real subprocess, with real models.

Every error case must end in one clear line on stderr, a non-zero exit and no
traceback.
"""

from __future__ import annotations

import json

import pytest

from tests.support.draftpen_cli import (
    REPO,
    assert_clean_error,
    run_draftpen,
)
from tests.support.model_files import DRAFT_KEY, SMOLLM2_KEY, TARGET_KEY, models_dir, require_model


def test_unknown_pair_is_one_line_naming_the_known_pairs():
    result = run_draftpen("generate", "--pair", "no-such-pair", "--prompt", "hi")
    assert_clean_error(result, "no-such-pair", "starter")


def test_missing_model_says_which_command_downloads_it(tmp_path):
    result = run_draftpen(
        "generate",
        "--pair",
        "smollm2",
        "--prompt",
        "hi",
        env={"DRAFTPEN_MODELS_DIR": str(tmp_path)},
    )
    assert_clean_error(result, "draftpen models pull smollm2")


def test_bad_sampling_option_is_one_line():
    result = run_draftpen("generate", "--pair", "smollm2", "--prompt", "hi", "--top-p", "2")
    assert_clean_error(result, "top_p")


@pytest.mark.real_model
def test_corrupt_model_in_the_store_is_refused_and_never_loaded(tmp_path):
    source = require_model(SMOLLM2_KEY)
    store = tmp_path / "models"
    store.mkdir()
    damaged = store / source.name
    data = bytearray(source.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = run_draftpen(
        "generate",
        "--pair",
        "smollm2",
        "--prompt",
        "hi",
        env={"DRAFTPEN_MODELS_DIR": str(store)},
    )
    assert_clean_error(result, "draftpen models pull smollm2")
    assert not damaged.exists()


@pytest.mark.real_model
def test_pair_that_fails_the_tokenizer_check_is_refused(tmp_path):
    require_model(TARGET_KEY)
    require_model(SMOLLM2_KEY)
    catalog = (REPO / "app" / "models" / "models.toml").read_text()
    catalog += (
        '\n[pairs.mismatched]\ndescription = "a deliberately wrong pair"\n'
        f'[pairs.mismatched.llamacpp]\ntarget = "{TARGET_KEY}"\ndraft = "{SMOLLM2_KEY}"\n'
    )
    catalog_path = tmp_path / "models.toml"
    catalog_path.write_text(catalog)
    result = run_draftpen(
        "generate",
        "--pair",
        "mismatched",
        "--prompt",
        "hi",
        env={"DRAFTPEN_CATALOG": str(catalog_path), "DRAFTPEN_MODELS_DIR": str(models_dir())},
    )
    assert_clean_error(result, "cannot draft for")


@pytest.mark.real_model
def test_prompt_longer_than_the_context_is_refused():
    require_model(SMOLLM2_KEY)
    result = run_draftpen(
        "generate", "--pair", "smollm2", "--context", "64", "--prompt", "word " * 400
    )
    assert_clean_error(result, "context")


@pytest.mark.real_model
def test_prompt_from_stdin_streams_text_and_prints_stats_to_stderr():
    require_model(SMOLLM2_KEY)
    result = run_draftpen(
        "generate",
        "--pair",
        "smollm2",
        "--max-tokens",
        "24",
        "--drafter",
        "ngram",
        stdin="Name three colours.",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "tok/s" in result.stderr and "accepted" in result.stderr


@pytest.mark.real_model
def test_generate_prints_the_same_text_with_the_draft_model_as_without():
    """With --exact, greedy speculation writes plain decoding's text bit for bit.

    Without it (the default), llama.cpp's fastest kernels may flip a near-tie between a
    verify batch and a one-token decode (an AVX-512 Xeon did, at token ~40 here): that
    promise is checked, near-ties and all, in tests/runtimes/test_runtime_conformance.py.
    """
    require_model(TARGET_KEY)
    require_model(DRAFT_KEY)
    common = (
        "generate",
        "--pair",
        "starter",
        "--exact",
        "--max-tokens",
        "40",
        "--json",
        "--prompt",
        "Write a Python function that returns the n-th Fibonacci number.",
    )
    plain = json.loads(run_draftpen(*common, "--drafter", "none").stdout)
    drafted = json.loads(run_draftpen(*common, "--drafter", "model").stdout)
    assert plain["text"] and plain["text"] == drafted["text"]
    assert drafted["stats"]["drafted"] > 0
    assert drafted["stats"]["accepted"] > 0
    assert plain["stats"]["target_passes"] == plain["stats"]["generated_tokens"]
    assert drafted["stats"]["target_passes"] < drafted["stats"]["generated_tokens"]
