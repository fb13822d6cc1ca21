"""llama.cpp and MLX run the same weights: their greedy outputs must agree.

The MLX model is the GGUF file dequantised (app/gguf_to_mlx.py), so the two runtimes
compute the same function up to arithmetic: llama.cpp quantises activations to 8 bits
for its quantised matmuls, MLX computes in float32 on the CPU. Measured on SmolLM2,
their logits differ by up to ~1.2 with the same argmax everywhere. So the greedy texts
must agree token for token until a position where both runtimes saw a near tie between
the two tokens; the test prints every such gap.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from backends.base import ChatMessage, Model
from backends.engine import Engine
from tests.support.model_files import SMOLLM2_KEY, TARGET_KEY
from tests.support.real_runtimes import generate, load_model, plain_logits_at

pytestmark = pytest.mark.real_model

# Observed differences between the runtimes' logits reach ~1.2 (SmolLM2), so a flip is
# only explained by a tie when both runtimes' gaps are below this.
CROSS_RUNTIME_TIE = 1.5

CASES = {
    # model: (prompts, tokens). SmolLM2 is cheap on MLX's CPU path and gets chat prompts;
    # the 1.5B target (~2 s a token there) gets one short raw code prompt.
    SMOLLM2_KEY: (
        (
            "Write a Python function that checks whether a number is prime.",
            "Explain what a hash map is in three sentences.",
        ),
        16,
    ),
    TARGET_KEY: (("def reverse_string(s):\n",), 8),
}


@pytest.fixture(scope="module", params=list(CASES))
def model_key(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def both(model_key: str) -> Iterator[tuple[Model, Model]]:
    mlx_model = load_model("mlx", model_key)  # skips first where mlx is not installed
    llama_model = load_model("llamacpp", model_key)
    yield llama_model, mlx_model
    llama_model.close()
    mlx_model.close()


def test_greedy_outputs_agree_until_a_near_tie_in_both_runtimes(
    model_key: str, both: tuple[Model, Model]
):
    llama_model, mlx_model = both
    prompts, max_tokens = CASES[model_key]
    report: list[str] = []
    for prompt_text in prompts:
        llama_engine, mlx_engine = Engine(llama_model), Engine(mlx_model)
        if prompt_text.startswith("def "):
            prompt = llama_engine.text_prompt(prompt_text)
            assert mlx_engine.text_prompt(prompt_text) == prompt
        else:
            prompt = llama_engine.chat_prompt([ChatMessage("user", prompt_text)])
            assert mlx_engine.chat_prompt([ChatMessage("user", prompt_text)]) == prompt
        from_llama, _ = generate(llama_engine, prompt, "none", 0, max_tokens)
        from_mlx, _ = generate(mlx_engine, prompt, "none", 0, max_tokens)
        if from_llama == from_mlx:
            report.append(f"{prompt_text[:30]!r}: {len(from_llama)} tokens identical")
            continue
        index = next(
            (i for i, (a, b) in enumerate(zip(from_llama, from_mlx, strict=False)) if a != b),
            min(len(from_llama), len(from_mlx)),
        )
        assert index < min(len(from_llama), len(from_mlx)), "one run stopped early"
        prefix = prompt + from_llama[:index]
        ours, theirs = from_llama[index], from_mlx[index]
        llama_row = plain_logits_at(llama_model, prefix)
        mlx_row = plain_logits_at(mlx_model, prefix)
        llama_gap = float(llama_row[ours] - llama_row[theirs])
        mlx_gap = float(mlx_row[theirs] - mlx_row[ours])
        report.append(
            f"{prompt_text[:30]!r}: agree on {index} tokens, then llama.cpp gap {llama_gap:.3f}, "
            f"MLX gap {mlx_gap:.3f}"
        )
        assert llama_gap < CROSS_RUNTIME_TIE and mlx_gap < CROSS_RUNTIME_TIE, report[-1]
    print(f"{model_key}:", *report, sep="\n  ")
