"""Prompt prefixes saved to disk by one engine and loaded by the next, on MLX.

Real models (marked ``real_model``): SmolLM2 converted for MLX, and the tiny hybrid
Qwen3.5 models tests/runtimes/tiny_mlx_hybrid.py writes (Gated DeltaNet layers in mlx-lm's
``ArraysCache``: the recurrent state is saved and loaded whole). Each round trip starts
two engines one after the other on fresh model objects, as two sessions of
``draftpen serve`` would, sharing one directory. MLX reads prompts slowly on a CPU
(SmolLM2: ~10-30 tokens/s), so the prompts are just long enough for two blocks.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from backends.caches.disk_prefixes import DiskPrefixes
from backends.caches.prefix_keys import BLOCK_TOKENS
from backends.caches.prefix_store import PrefixStore
from backends.engine import Engine, GenerationRequest
from tests.runtimes.tiny_mlx_hybrid import CONFIG as HYBRID_CONFIG
from tests.runtimes.tiny_mlx_hybrid import (
    TOKENIZER_FILES,
    tiny_dirs,  # noqa: F401  (a fixture)
)
from tests.support.model_files import SMOLLM2_KEY, require_mlx_model

pytestmark = pytest.mark.real_model

CONTEXT = 2048
# Two whole blocks and a short tail: the loop evaluates the last token itself, and the
# first engine saves the state after 1,024 tokens.
PROMPT = [(i * 37) % 4000 + 200 for i in range(2 * BLOCK_TOKENS + 8)]
BUDGET = 1 << 30


def load(path: Path, **options):  # -> MlxModel
    from backends.mlx.model import MlxModel

    return MlxModel(path, n_ctx=CONTEXT, **options)


def session(directory: Path, path: Path, *, blocks: int = 2) -> Engine:
    """An engine on a freshly loaded model, with the prefix cache in ``directory``,
    saving once ``blocks`` blocks are new."""
    prefixes = DiskPrefixes(PrefixStore(directory, BUDGET), min_new_tokens=blocks * BLOCK_TOKENS)
    return Engine(load(path), prefixes=prefixes)


def run(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[list[int], int]:
    """Greedy reply tokens, and how many prompt tokens the reply did not read."""
    request = GenerationRequest(
        prompt_tokens=tuple(prompt), max_tokens=max_tokens, drafter="none", exact=True
    )
    events = list(engine.generate(request))
    return [t for event in events for t in event.tokens], events[-1].stats.cached_prompt_tokens


def round_trip(
    directory: Path, path: Path, max_tokens: int, *, blocks: int = 2, cuts_anywhere: bool
) -> None:
    """The first engine reads the prompt (``blocks`` blocks and a tail) and saves; the
    second loads it and writes the same reply. A KV cache is saved where the prompt
    ends (all but the token the loop evaluates itself); a recurrent state at the last
    block boundary."""
    prompt = PROMPT[: blocks * BLOCK_TOKENS + 8]
    saved = len(prompt) - 1 if cuts_anywhere else blocks * BLOCK_TOKENS
    first = session(directory, path, blocks=blocks)
    read, cached = run(first, prompt, max_tokens)
    first.close()  # waits for the write
    assert cached == 0 and first.prefixes.stats().saved == 1
    (entry,) = PrefixStore(directory, BUDGET).entries()
    assert entry.tokens == saved

    second = session(directory, path, blocks=blocks)
    loaded, cached = run(second, prompt, max_tokens)
    stats = second.prefixes.stats()
    second.close()
    assert stats.loaded == 1 and stats.loaded_tokens == saved
    assert cached == saved
    assert loaded == read


def test_a_reply_from_a_loaded_prefix_is_the_reply_from_reading_it(tmp_path: Path) -> None:
    # One block: MLX reads ~10 tokens/s on a 2-core CPU, so two would take minutes.
    round_trip(
        tmp_path / "prefixes",
        require_mlx_model(SMOLLM2_KEY),
        max_tokens=8,
        blocks=1,
        cuts_anywhere=True,
    )


def test_a_hybrid_models_recurrent_state_loads_whole_and_writes_the_same_reply(
    tmp_path: Path,
    tiny_dirs: tuple[Path, Path],  # noqa: F811
) -> None:
    round_trip(tmp_path / "prefixes", tiny_dirs[0], max_tokens=40, cuts_anywhere=False)


def test_another_models_state_is_never_loaded(
    tmp_path: Path,
    tiny_dirs: tuple[Path, Path],  # noqa: F811
) -> None:
    # The draft is the target's architecture with other weights: the same shapes,
    # another key.
    target, other = tiny_dirs
    directory = tmp_path / "prefixes"
    first = session(directory, target)
    run(first, PROMPT, max_tokens=2)
    first.close()
    assert first.prefixes.stats().saved == 1
    second = session(directory, other)
    _, cached = run(second, PROMPT, max_tokens=2)
    second.close()
    assert cached == 0 and second.prefixes.stats().loaded == 0


def tiny_llama(directory: Path, *, kv_heads: int, dtype: str = "float32") -> Path:
    """A 4-layer llama with random weights: a KV cache of 4 layers, like the hybrid's
    count, of ``kv_heads`` heads."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": HYBRID_CONFIG["vocab_size"],
        "tie_word_embeddings": True,
    }
    directory.mkdir()
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (directory / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(require_mlx_model(SMOLLM2_KEY) / name, directory / name)
    return directory


def written(model, tokens: list[int]) -> tuple[bytes, object]:
    """``model``'s state after reading ``tokens``, as written to a file."""
    model.prefill(tokens)
    state = model.save_state()
    file = io.BytesIO()
    model.write_state(state, file)
    return file.getvalue(), state


def test_a_state_that_does_not_fit_the_model_is_refused(
    tmp_path: Path,
    tiny_dirs: tuple[Path, Path],  # noqa: F811
) -> None:
    tokens = PROMPT[:40]
    # bfloat16 (as on a Mac's GPU), which numpy cannot hold: written as bytes.
    two_heads = load(tiny_llama(tmp_path / "two", kv_heads=2, dtype="bfloat16"), cpu_float32=False)
    assert two_heads.state_identity()["dtypes"] == ["bfloat16"]
    data, state = written(two_heads, tokens)
    assert len(data) < state.nbytes / 4  # the KV buffers are written up to their offset only

    # Read back by the model that wrote it (a fresh load): the same logits follow.
    again = load(two_heads.path, cpu_float32=False)
    again.restore_state(again.read_state(tokens, io.BytesIO(data), len(data)))
    assert (again.forward([7]) == two_heads.forward([7])).all()

    one_head = load(tiny_llama(tmp_path / "one", kv_heads=1, dtype="bfloat16"), cpu_float32=False)
    hybrid = load(tiny_dirs[0])
    refusals = [
        # The same layer count and classes, other shapes.
        ("do not have this model's shapes", one_head, data, len(data)),
        # Another kind of cache (recurrent and attention layers).
        ("layer 0 is a 'KVCache', not this model's ArraysCache", hybrid, data, len(data)),
        ("header describes", again, data[:-100], len(data) - 100),
        ("ends after", again, data[:-100], len(data)),
        ("header is damaged", again, b"\xff\xff\xff\x7f" + data[4:], len(data)),
    ]
    for message, model, payload, nbytes in refusals:
        with pytest.raises(ValueError, match=message):
            model.read_state(tokens, io.BytesIO(payload), nbytes)
    with pytest.raises(ValueError, match="does not hold 39 positions"):
        again.read_state(tokens[:-1], io.BytesIO(data), len(data))


def test_a_cache_state_built_anew_is_not_written_off_the_runtimes_thread(
    tmp_path: Path, monkeypatch
) -> None:
    """Older mlx-lm sliced the KV buffers in ``KVCache.state``: the writer thread would
    compute those slices, racing the runtime. The write is refused instead."""
    from mlx_lm.models.cache import KVCache

    model = load(tiny_llama(tmp_path / "llama", kv_heads=2))
    model.prefill(PROMPT[:40])
    state = model.save_state()

    def sliced(layer):
        return layer.keys[..., : layer.offset, :], layer.values[..., : layer.offset, :]

    monkeypatch.setattr(KVCache, "state", property(sliced, KVCache.state.fset))
    with pytest.raises(ValueError, match="builds cache states anew"):
        model.write_state(state, io.BytesIO())
