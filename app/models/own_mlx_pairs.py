"""Your own pairs of MLX directories: the catalog entries and the ``mlx`` variant they make.

A target directory is a model; a draft directory is a draft model, or an EAGLE-3 or
DFlash head trained for the target, which the pair then drafts with (``drafter =
"eagle3"`` or ``"dflash"``). draftpen's MLX runtime runs no DSpark head (llama.cpp does),
so a DSpark directory is refused with that reason. Checked here, from the configs alone
(no mlx needed): a head is never a target; a draft model's vocabulary is within
llama.cpp's padding tolerance of the target's, a head's equals it (the load checks the
tokenizers and the head's shape again).
"""

from __future__ import annotations

from app.errors import PairInputError
from app.models.catalog import HEAD_NAMES, LocalFile, ModelEntry, ModelSources, PairVariant
from app.models.mlx_directory import MlxDirectory
from backends.errors import IncompatiblePairError
from backends.pair_check import MAX_VOCAB_SIZE_DIFFERENCE

RUNTIME = "mlx"
# What draftpen's MLX runtime drafts with, of the heads a directory may hold.
MLX_HEADS = ("eagle3", "dflash")


def mlx_model_entry(directory: MlxDirectory, key: str) -> ModelEntry:
    """The catalog entry of an MLX directory, used where it lies."""
    return ModelEntry(
        key=key,
        name=directory.path.name,
        format="mlx",
        architecture=directory.architecture,
        size_bytes=directory.size_bytes,
        sha256=None,
        sources=ModelSources(local=LocalFile(directory.path)),
        vocab_size=directory.vocab_size,
    )


def mlx_variant(
    target: MlxDirectory, target_key: str, draft: MlxDirectory | None, draft_key: str | None
) -> PairVariant:
    """The pair's ``mlx`` variant; refuses, naming the fix, what MLX cannot run as given."""
    if target.head is not None:
        raise PairInputError(
            f"{target.path} is {HEAD_NAMES[target.head]}, not a model that runs alone: give it "
            "as --draft, with the model it was trained for as --target."
        )
    if draft is None:
        return PairVariant(RUNTIME, target_key, None)
    if draft.head == "dspark":
        raise PairInputError(
            f"{draft.path} is a DSpark head: draftpen's MLX runtime drafts with EAGLE-3 and "
            "DFlash heads, and llama.cpp runs DSpark. Give the head's GGUF with the target's "
            "GGUF, or leave out --draft (n-gram drafts)."
        )
    _refuse_other_vocabulary(target, draft)
    return PairVariant(RUNTIME, target_key, draft_key, draft.head or "model")


def _refuse_other_vocabulary(target: MlxDirectory, draft: MlxDirectory) -> None:
    """Where both configs give a vocabulary size, the draft's must fit the target's."""
    ours, theirs = draft.vocab_size, target.vocab_size
    if ours is None or theirs is None:
        return  # the engine checks the tokenizers themselves when the pair loads
    if draft.head is not None and ours != theirs:
        raise IncompatiblePairError(
            f"{draft.path.name} was trained for another target than {target.path.name}: its "
            f"vocabulary has {ours} tokens, the target's {theirs}. Use the head published "
            "for this model, or leave out --draft (n-gram drafts)."
        )
    if draft.head is None and abs(ours - theirs) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise IncompatiblePairError(
            f"{draft.path.name} cannot draft for {target.path.name}: their vocabularies "
            f"differ ({ours} vs {theirs} tokens), so they do not share a tokenizer. Pick a "
            "draft model from the same family, or leave out --draft (n-gram drafts)."
        )


def mixed_formats(target_text: str, target_format: str, draft_text: str) -> PairInputError:
    """Why a GGUF and an MLX directory cannot make one pair, and what to give instead."""
    if target_format == "mlx":
        return PairInputError(
            f"The target {target_text} is an MLX directory but the draft {draft_text} is a "
            "GGUF: a pair runs on one runtime. Give the draft's MLX directory (or the head's "
            "Hugging Face directory), or the target's .gguf."
        )
    return PairInputError(
        f"The target {target_text} is a GGUF but the draft {draft_text} is an MLX "
        "directory: a pair runs on one runtime. Give the draft's .gguf (a head's GGUF for "
        "EAGLE-3, DFlash or DSpark), or the target's MLX directory."
    )
