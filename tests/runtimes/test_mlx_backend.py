"""What only the MLX runtime does: refusing caches it cannot roll back, bad token ids,
sampling on the device.

Uses a tiny random-weight model built here (with SmolLM2's converted tokenizer), so
these run in seconds; the shared behaviour is in test_runtime_conformance.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from backends.errors import DecodeError, ModelLoadError
from backends.sampling.filters import SamplingParams, distribution
from backends.sampling.top_logits import distribution_from_top
from tests.support.model_files import SMOLLM2_KEY, TINY_MLX_LLAMA, require_mlx_model

pytestmark = pytest.mark.real_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _tiny_llama(directory: Path, *, layer_types: list[str]) -> Path:
    """A 2-layer llama with random weights and SmolLM2's tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    source = require_mlx_model(SMOLLM2_KEY)
    config = {
        **TINY_MLX_LLAMA,
        "layer_types": layer_types,
        "sliding_window": 8,
    }
    directory.mkdir()
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (directory / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)
    return directory


def test_sliding_window_models_are_refused_saying_why(tmp_path: Path):
    pytest.importorskip("mlx_lm")
    from backends.mlx.model import MlxModel

    directory = _tiny_llama(
        tmp_path / "sliding", layer_types=["sliding_attention", "full_attention"]
    )
    with pytest.raises(
        ModelLoadError, match=r"1 of its 2 layers use a sliding-window cache.*--runtime llamacpp"
    ):
        MlxModel(directory, n_ctx=64)


def test_a_full_attention_model_loads_and_rejects_out_of_range_tokens(tmp_path: Path):
    pytest.importorskip("mlx_lm")
    from backends.mlx.model import MlxModel

    model = MlxModel(_tiny_llama(tmp_path / "full", layer_types=["full_attention"] * 2), n_ctx=64)
    assert model.forward([1, 2, 3]).shape == (3, 49152)
    with pytest.raises(DecodeError, match="token ids must lie in"):
        model.forward([49152])
    assert list(model.cached_tokens) == [1, 2, 3]
    model.close()


# -- sampling on the device ------------------------------------------------------------
#
# With device_sampling, MlxRows answers the loop's questions with MLX and copies back
# only ids and probabilities. On Linux that is MLX's CPU build, forced on here (by
# default it is on only where MLX computes on a GPU); the answers must be the host's.

DEVICE_PARAMS = [
    SamplingParams(temperature=0.7, top_p=0.95),
    SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.3, min_p=0.1),
    SamplingParams(temperature=1.0),  # no filter: the whole row, on the host
]


@pytest.fixture(scope="module")
def smollm2_pair_on_device():
    """SmolLM2 twice, as target and as its own draft (separate caches)."""
    pytest.importorskip("mlx_lm")
    from backends.mlx.model import MlxModel

    directory = require_mlx_model(SMOLLM2_KEY)
    pair = tuple(MlxModel(directory, n_ctx=512, device_sampling=True) for _ in range(2))
    yield pair
    for model in pair:
        model.close()


@pytest.fixture(scope="module")
def smollm2_on_device(smollm2_pair_on_device):
    return smollm2_pair_on_device[0]


def test_device_rows_answer_as_the_host_filters_the_same_rows(smollm2_on_device) -> None:
    model = smollm2_on_device
    prompt = model.tokenize("The capital of France is Paris. The capital of Italy is")
    model.rollback(0)
    rows = model.forward_rows(prompt)
    host = np.array([rows.row(index) for index in range(len(rows))])
    model.rollback(0)
    np.testing.assert_array_equal(model.forward(prompt), host)  # the same logits
    settled_on_device = 0
    for index in range(len(rows)):
        assert rows.greedy(index) == int(np.argmax(host[index]))
        token = rows.greedy(index)
        exact = 1.0 / np.exp(host[index].astype(np.float64) - host[index][token]).sum()
        assert rows.top_probability(index, token) == pytest.approx(exact, rel=1e-3)
        for params in DEVICE_PARAMS:
            got = rows.distribution(index, params)
            expected = distribution(host[index], params)
            np.testing.assert_array_equal(got.ids, expected.ids)
            np.testing.assert_allclose(got.probs, expected.probs, rtol=1e-9)
        scaled = host[index].astype(np.float64) / 0.7
        order = np.argsort(-scaled)[:64]
        log_mass = float(np.log(np.exp(scaled - scaled.max()).sum()) + scaled.max())
        if distribution_from_top(
            order, host[index][order], log_mass, host.shape[1], DEVICE_PARAMS[0]
        ):
            settled_on_device += 1
    assert settled_on_device >= len(rows) // 2, "most rows were settled by their top 64"


def test_greedy_speculation_with_device_sampling_equals_plain_decoding(
    smollm2_pair_on_device,
) -> None:
    from backends.speculation.draft_policy import FixedDraftPolicy
    from backends.speculation.loop import speculative_generate
    from backends.speculation.model_drafter import ModelDrafter
    from backends.speculation.reply_spec import ReplySpec

    model, draft = smollm2_pair_on_device
    prompt = model.tokenize("def fibonacci(n):\n")
    outputs = []
    for policy in (FixedDraftPolicy(None, 0), FixedDraftPolicy(ModelDrafter(draft), 3)):
        model.rollback(0)
        tokens = [
            token
            for event in speculative_generate(
                model, prompt, policy, ReplySpec(SamplingParams(), 24)
            )
            for token in event.tokens
        ]
        outputs.append(tokens)
    assert outputs[0] == outputs[1] and len(outputs[0]) > 0


def test_sampling_with_device_rows_is_reproducible_and_drafts_are_judged(
    smollm2_pair_on_device,
) -> None:
    from backends.speculation.draft_policy import FixedDraftPolicy
    from backends.speculation.loop import speculative_generate
    from backends.speculation.model_drafter import ModelDrafter
    from backends.speculation.reply_spec import ReplySpec

    model, draft = smollm2_pair_on_device
    prompt = model.tokenize("Once upon a time")
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    runs = []
    for _ in range(2):
        model.rollback(0)
        draft.rollback(0)
        events = list(
            speculative_generate(
                model, prompt, FixedDraftPolicy(ModelDrafter(draft), 3), ReplySpec(params, 20)
            )
        )
        runs.append([token for event in events for token in event.tokens])
        stats = events[-1].stats
        # The draft has the target's weights: p and q agree up to rounding, so all pass.
        assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert runs[0] == runs[1]
