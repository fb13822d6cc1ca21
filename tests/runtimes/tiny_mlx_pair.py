"""A tiny random-weight Qwen2 target and draft for the MLX split tests, and how to give
them to ``draftpen serve`` as a catalog pair.

mlx-lm 0.32 splits Qwen2 both ways (``model.pipeline`` and ``shard``; Llama only by
tensor), and random weights exercise its split as well as real ones, in seconds.
SmolLM2's converted tokenizer gives them a real vocabulary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from app.models.catalog_file import load_catalog
from app.models.store import ModelStore
from tests.support.model_files import SMOLLM2_KEY, require_mlx_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# What a conversion records beside a model (its end-of-generation ids): copied so that
# a model in the store looks like one ``draftpen models pull --runtime mlx`` made.
CONVERSION_FACTS = "draftpen-mlx.json"
NUDGE = 0.1
TINY_QWEN2: dict[str, object] = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 49152,
    "tie_word_embeddings": False,
}


def tiny_qwen2_pair(directory: Path, *, conversion_facts: bool = False) -> tuple[Path, Path]:
    """A 4-layer Qwen2 with random weights and SmolLM2's tokenizer, in
    ``directory/target``, and its first 2 layers as a draft (which it partly accepts),
    in ``directory/draft``. ``conversion_facts``: with SmolLM2's conversion record."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen2

    source = require_mlx_model(SMOLLM2_KEY)
    mx.random.seed(1)
    model = qwen2.Model(qwen2.ModelArgs.from_dict(TINY_QWEN2))
    for layer in model.model.layers[2:]:  # small changes: the draft is often right
        layer.self_attn.o_proj.weight *= NUDGE
        layer.mlp.down_proj.weight *= NUDGE
    paths = []
    for name, layers in (("target", 4), ("draft", 2)):
        path = directory / name
        path.mkdir(parents=True)
        model.model.layers = model.model.layers[:layers]
        weights = dict(tree_flatten(model.parameters()))
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        (path / "config.json").write_text(json.dumps({**TINY_QWEN2, "num_hidden_layers": layers}))
        files = TOKENIZER_FILES + ((CONVERSION_FACTS,) if conversion_facts else ())
        for file in files:
            shutil.copy(source / file, path / file)
        paths.append(path)
    return paths[0], paths[1]


def mlx_pair_catalog(
    pair: str, target: str, draft: str, architecture: str, *, drafter: str | None = None
) -> str:
    """A catalog (``$DRAFTPEN_CATALOG``) with one MLX pair of ``target`` and ``draft``
    (a draft model, or with ``drafter`` "eagle3" or "dflash" that head).

    Its mlx entries name a GGUF source they were converted from; it is never read (the
    converted directories are put in the store by :func:`store_converted`).
    """
    models = "".join(
        f"""
[models.{key}]
name = "{key}"
format = "mlx"
architecture = "{kind}"
size_bytes = 20

[models.{key}.sources.gguf_conversion]
from = "tiny-gguf"
"""
        for key, kind in ((target, architecture), (draft, drafter or architecture))
    )
    head = f'drafter = "{drafter}"\n' if drafter else ""
    return f"""
[models.tiny-gguf]
name = "Tiny GGUF"
format = "gguf"
architecture = "{architecture}"
size_bytes = 10
sha256 = "{"ab" * 32}"

[models.tiny-gguf.sources.pypi]
package = "tiny-model"
version = "1.0"
member = "tiny_model/tiny.gguf"
{models}
[pairs.{pair}]
description = "A tiny random MLX target and its draft."

[pairs.{pair}.mlx]
target = "{target}"
draft = "{draft}"
{head}"""


def store_converted(models: Path, built: dict[str, Path]) -> None:
    """Move each built directory into the store at ``models`` as the converted MLX model
    of its catalog key (the test's catalog in force)."""
    store = ModelStore(models)
    catalog = load_catalog()
    for key, directory in built.items():
        entry = catalog.model(key)
        destination = store.converted_dir_for(entry)
        destination.parent.mkdir(parents=True, exist_ok=True)
        directory.rename(destination)
        store.mark_converted(entry)
