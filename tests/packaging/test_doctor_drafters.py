"""``draftpen doctor`` lists the drafters each runtime runs here: llama.cpp's found in the
installed libllama's exports (by the runtime check's child), MLX's in its model class.

The command runs as a user runs it (a subprocess of the CLI); what it should say is
read here from the library file itself, apart from the code under test.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import sys

import pytest

from app.cli.doctor_drafters import drafter_lines, drafters_json
from tests.support.draftpen_cli import run_draftpen

llama_cpp = pytest.importorskip("llama_cpp")

# What each head needs libllama to export (C name, or the C++ mangled one of this ABI).
HEAD_FUNCTIONS = {
    "mtp": (
        ("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb"),
        ("llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context"),
    ),
    "eagle3": (
        (
            "llama_set_embeddings_layer_inp",
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        ),
        ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
        ("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model"),
    ),
}
# A DFlash (and DSpark) head reads the layer inputs as EAGLE-3 does, and loads as the
# dflash architecture, which a libllama that knows it exports a function of.
HEAD_FUNCTIONS["dflash"] = HEAD_FUNCTIONS["dspark"] = (
    *HEAD_FUNCTIONS["eagle3"],
    (
        "llama_model_dflash_selector_top_k",
        "_Z33llama_model_dflash_selector_top_kPK11llama_model",
    ),
)


def library_exports(names: tuple[str, ...]) -> bool:
    """Whether the installed libllama exports one of ``names`` (read with a fresh handle)."""
    library = ctypes.CDLL(llama_cpp.llama_cpp._lib._name)
    return any(hasattr(library, name) for name in names)


def test_doctor_lists_the_drafters_this_build_runs() -> None:
    result = run_draftpen("doctor", "--json")
    assert result.returncode == 0, result.stderr
    drafters = json.loads(result.stdout)["drafters"]
    llamacpp = drafters["llamacpp"]
    assert list(llamacpp) == ["model", "ngram", "mtp", "eagle3", "dflash", "dspark"]
    assert llamacpp["model"]["runs"] and llamacpp["ngram"]["runs"]
    for head, functions in HEAD_FUNCTIONS.items():
        expected = all(library_exports(names) for names in functions)
        assert llamacpp[head]["runs"] is expected, llamacpp[head]
        assert (llamacpp[head]["why_not"] is None) is expected

    mlx = drafters["mlx"]
    if importlib.util.find_spec("mlx") is None:
        assert mlx is None
    else:  # EAGLE-3 and DFlash heads where mlx-vlm is installed; MTP and DSpark never
        assert mlx is not None
        heads = ["eagle3", "dflash"] if importlib.util.find_spec("mlx_vlm") else []
        assert [name for name, entry in mlx.items() if entry["runs"]] == ["model", "ngram", *heads]
        for head in ("mtp", "dspark"):
            assert "llama.cpp runs" in mlx[head]["why_not"], mlx[head]
        if not heads:
            assert "mlx-vlm" in mlx["eagle3"]["why_not"]

    text = run_draftpen("doctor").stdout.splitlines()
    runs = ", ".join(name for name, entry in llamacpp.items() if entry["runs"])
    assert f"drafters (llama.cpp): {runs}" in text


def test_a_build_without_a_heads_functions_says_which_drafters_it_lacks_and_why() -> None:
    no_eagle3 = "this llama.cpp build does not export the functions an EAGLE-3 head needs"
    llamacpp = {"model": None, "ngram": None, "mtp": None, "eagle3": no_eagle3}
    lines = drafter_lines(llamacpp, None)
    assert lines == ["drafters (llama.cpp): model, ngram, mtp", f"  not eagle3: {no_eagle3}"]
    data = drafters_json(llamacpp, None)
    assert data["mlx"] is None
    assert data["llamacpp"]["eagle3"] == {"runs": False, "why_not": no_eagle3}


def test_a_libllama_without_the_dflash_architecture_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.llamacpp import dflash_files, drafter_support

    if dflash_files.eagle3_unavailable() is not None:
        pytest.skip("this libllama lacks the layer-input functions before dflash's")
    assert (
        drafter_support.drafter_support()["dflash"] == drafter_support.drafter_support()["dspark"]
    )

    class Older:
        """A library that exports none of the dflash architecture's functions."""

    monkeypatch.setattr(dflash_files.llama_cpp.llama_cpp, "_lib", Older())
    reason = drafter_support.drafter_support()["dspark"]
    assert reason is not None and "predates llama.cpp's dflash architecture" in reason


def test_without_mlx_vlm_mlx_says_its_eagle3_and_dflash_heads_need_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("mlx")
    from backends.mlx import drafter_support

    # An import that fails, as on a machine without mlx-vlm.
    monkeypatch.setitem(sys.modules, "mlx_vlm.speculative.drafters", None)
    support = drafter_support.drafter_support()
    assert support["model"] is None and support["ngram"] is None
    for head in ("eagle3", "dflash"):
        reason = support[head]
        assert reason is not None and "mlx-vlm, which is not installed" in reason, reason
    lines = drafter_lines(None, support)
    assert lines[0] == "drafters (mlx): model, ngram"
    assert any(line.startswith("  not eagle3, dflash: ") for line in lines)
