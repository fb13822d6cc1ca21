"""Reading one ``[pairs.<key>]`` entry of a catalog file: its runtime variants and drafter rules.

A variant names a target, maybe a draft, and maybe a drafter (``"model"``, ``"mtp"``,
``"eagle3"``, ``"dflash"``, ``"dspark"``; a head only where its runtime drafts with it,
:data:`~app.models.catalog.RUNTIME_HEADS`);
:func:`check_pair_models`, run once every entry is read, holds each variant to the
models of its catalog: they exist, suit the runtime, and an MTP variant's model keeps the
MTP layers it drafts with.
"""

from __future__ import annotations

from typing import Any

from app.models.catalog import (
    DRAFTER_KINDS,
    HEAD_DRAFTERS,
    HEAD_NAMES,
    RUNTIME_HEADS,
    Catalog,
    PairEntry,
    PairVariant,
    head_name,
)
from app.models.toml_tables import TableReader, table_name

SUPPORTED_RUNTIMES = ("llamacpp", "mlx")


# The model format each runtime loads.
RUNTIME_FORMATS = {"llamacpp": "gguf", "mlx": "mlx"}


def check_pair_models(reader: TableReader, catalog: Catalog) -> None:
    """Each variant's target and draft must be models of ``catalog`` in its runtime's format."""
    formats = {model.key: model.format for model in catalog.models}
    for pair in catalog.pairs:
        for variant in pair.variants:
            where = table_name("pairs", pair.key, variant.runtime)
            wanted = RUNTIME_FORMATS[variant.runtime]
            for role, key in (("target", variant.target), ("draft", variant.draft)):
                if key is None:
                    continue
                if key not in formats:
                    reader.fail(where, f"{role} {key!r} is not a model in [models]")
                if formats[key] != wanted:
                    reader.fail(
                        where,
                        f"{role} {key!r} is a {formats[key]} model; "
                        f"{variant.runtime} needs a {wanted} model",
                    )
            if variant.uses_mtp:
                _check_mtp_variant(reader, where, variant, catalog)


def _check_mtp_variant(
    reader: TableReader, where: str, variant: PairVariant, catalog: Catalog
) -> None:
    """An MTP variant must name a GGUF that holds the MTP layers it drafts with.

    Without a draft the target itself must keep them (most published GGUFs drop the
    nextn layer, and such a target has nothing to draft with); with one, the draft is
    the separate MTP file and must say it holds them.
    """
    holder = variant.mtp_head or variant.target
    if catalog.model(holder).mtp_layers:
        return
    if variant.mtp_head is None:
        reader.fail(
            where,
            f'drafter = "mtp" without a draft needs a target that keeps its MTP layers: '
            f"give target {holder!r} mtp_layers (its GGUF's nextn_predict_layers), or "
            "name the separate MTP file in draft",
        )
    reader.fail(
        where,
        f"draft {holder!r} is the separate MTP file of this variant and needs mtp_layers "
        "(its GGUF's nextn_predict_layers)",
    )


def _head_refused(runtime: str, drafter: str) -> str:
    """Why ``runtime`` cannot draft with ``drafter``'s head, and what to name instead."""
    runs = RUNTIME_HEADS[runtime]
    # MLX runs its heads through mlx-vlm's head models; llama.cpp runs every head.
    through = " (through mlx-vlm)" if runtime == "mlx" else ""
    # "an EAGLE-3 head" -> "EAGLE-3": "EAGLE-3 and DFlash heads".
    names = [head_name(head).removesuffix(" head") for head in runs]
    listed = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
    instead = " or ".join(f'"{head}"' for head in runs)
    return (
        f'drafter = "{drafter}" runs only on llama.cpp: {runtime} drafts with {listed} heads'
        f"{through}, not {HEAD_NAMES[drafter]}. Give this variant drafter {instead} with "
        "its head in draft, or no drafter (it drafts with n-grams)"
    )


def read_pair_entry(reader: TableReader, key: str, table: dict[str, Any]) -> PairEntry:
    """One ``[pairs.<key>]`` table as a :class:`PairEntry`: its variants and their drafters."""
    where = table_name("pairs", key)
    fields = reader.take(
        table,
        where,
        required={"description": str},
        optional={"recommend": bool, **{runtime: dict for runtime in SUPPORTED_RUNTIMES}},
    )
    variants = []
    for runtime in SUPPORTED_RUNTIMES:
        if runtime not in fields:
            continue
        where_variant = table_name("pairs", key, runtime)
        variant = reader.take(
            fields[runtime],
            where_variant,
            required={"target": str},
            optional={"draft": str, "drafter": str},
        )
        draft = variant.get("draft")
        drafter = variant.get("drafter")
        if drafter is None and draft is not None:
            drafter = "model"  # as PairVariant itself reads it; named here for the checks
        if drafter is not None and drafter not in DRAFTER_KINDS:
            reader.fail(
                where_variant,
                f"drafter must be one of {', '.join(DRAFTER_KINDS)}, not {drafter!r} "
                "(leave it out for a draft model, or for n-gram drafts when there is no draft)",
            )
        if drafter == "model" and draft is None:
            reader.fail(where_variant, 'drafter = "model" needs a draft model in draft')
        if drafter in ("mtp", *HEAD_DRAFTERS) and drafter not in RUNTIME_HEADS[runtime]:
            reader.fail(where_variant, _head_refused(runtime, drafter))
        if drafter in HEAD_DRAFTERS and draft is None:
            what = "GGUF" if runtime == "llamacpp" else "Hugging Face directory (an mlx model)"
            reader.fail(where_variant, f'drafter = "{drafter}" needs the head\'s {what} in draft')
        variants.append(PairVariant(runtime, variant["target"], draft, drafter))
    if not variants:
        reader.fail(
            where,
            f"a pair needs at least one runtime variant ({', '.join(SUPPORTED_RUNTIMES)}), "
            f"e.g. {table_name('pairs', key, 'llamacpp')} with target and draft",
        )
    return PairEntry(
        key=key,
        description=fields["description"],
        variants=tuple(variants),
        recommend=fields.get("recommend", True),
    )
