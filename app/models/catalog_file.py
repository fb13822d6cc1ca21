"""Reading the catalog: ``models.toml`` (or ``$DRAFTPEN_CATALOG``), validated strictly.

An unknown key, a missing field or a pair naming an unknown model is a
:class:`~app.errors.CatalogError` that names the table and the problem, so a typo cannot
silently change what gets downloaded.

:func:`load_catalog` also merges the user's own pairs (``my-models.toml`` in the config
directory, written by ``draftpen models add``; same format, and its models may name
``local`` files) and the pair given on this command line (``--target``/``--draft``,
:func:`add_command_line_pair`), so every front end sees them like curated pairs.

This module finds, reads and merges catalog files; one entry is read by
:mod:`app.models.model_entries` or :mod:`app.models.pair_entries`.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from app.errors import CatalogError
from app.models.catalog import Catalog, ModelEntry, PairEntry
from app.models.model_entries import check_gguf_conversions, read_model_entry
from app.models.pair_entries import check_pair_models, read_pair_entry
from app.models.toml_tables import TableReader
from app.settings import catalog_override_path, user_catalog_path


def default_catalog_text() -> tuple[str, str]:
    """The catalog shipped inside the package: ``(text, origin)``."""
    resource = resources.files("app.models").joinpath("models.toml")
    return resource.read_text(encoding="utf-8"), str(resource)


def load_catalog(path: Path | None = None) -> Catalog:
    """Load and validate a catalog file.

    With ``path``: that file alone. Without: ``$DRAFTPEN_CATALOG`` if set, else the
    packaged ``models.toml``, then the user's own pairs and this command line's pair.
    """
    if path is not None:
        return parse_catalog(_read_catalog_file(path), str(path))
    catalog = curated_catalog()
    user = load_user_catalog()
    if user is not None:
        catalog = merge_catalogs(catalog, user)
    for extra in _command_line_pairs:
        catalog = merge_catalogs(catalog, extra)
    return catalog


def curated_catalog() -> Catalog:
    """draftpen's own catalog: ``$DRAFTPEN_CATALOG`` if set, else the packaged one."""
    override = catalog_override_path()
    if override is None:
        text, origin = default_catalog_text()
        return parse_catalog(text, origin)
    return parse_catalog(_read_catalog_file(override), str(override))


def load_user_catalog(path: Path | None = None) -> Catalog | None:
    """The user's own pairs (``draftpen models add``), or ``None`` when there are none."""
    path = path if path is not None else user_catalog_path()
    if not path.exists():
        return None
    return parse_catalog(_read_catalog_file(path), str(path), allow_local=True)


def merge_catalogs(base: Catalog, extra: Catalog) -> Catalog:
    """``base`` with ``extra``'s models and pairs after it; a name used twice is refused."""
    for kind, ours, theirs in (
        ("model", {m.key for m in base.models}, [m.key for m in extra.models]),
        ("pair", set(base.pair_names()), list(extra.pair_names())),
    ):
        taken = sorted(ours.intersection(theirs))
        if taken:
            raise CatalogError(
                f"{extra.origin} names the {kind}(s) {', '.join(taken)}, which "
                f"{base.origin} already has. Rename them in {extra.origin}."
            )
    return Catalog(
        models=base.models + extra.models,
        pairs=base.pairs + extra.pairs,
        origin=f"{base.origin} + {extra.origin}",
    )


# The pair given with --target/--draft, for this process only (never written anywhere).
_command_line_pairs: list[Catalog] = []


def add_command_line_pair(models: tuple[ModelEntry, ...], pair: PairEntry) -> Catalog:
    """Make ``pair`` (built from ``--target``/``--draft``) a catalog pair for this run;
    returns the catalog of that one pair (picklable: what another process adds with
    :func:`remember_command_line_pair`)."""
    catalog = Catalog(models=models, pairs=(pair,), origin="the command line (--target/--draft)")
    _command_line_pairs.append(catalog)
    return catalog


def command_line_pair(name: str) -> Catalog | None:
    """The catalog of command-line pair ``name`` in this process, or ``None``."""
    for catalog in _command_line_pairs:
        if name in catalog.pair_names():
            return catalog
    return None


def remember_command_line_pair(catalog: Catalog) -> None:
    """Add another process's command-line pair (one :func:`add_command_line_pair`
    returned) unless this process has a pair of that name already: the engine's runtime
    is told of a pair with every load of it."""
    if all(command_line_pair(name) is None for name in catalog.pair_names()):
        _command_line_pairs.append(catalog)


def command_line_pairs() -> tuple[Catalog, ...]:
    """The pairs :func:`add_command_line_pair` added in this process (picklable: a
    runtime process started for them adds them with :func:`restore_command_line_pairs`)."""
    return tuple(_command_line_pairs)


def restore_command_line_pairs(pairs: tuple[Catalog, ...]) -> None:
    """Make ``pairs`` (another process's :func:`command_line_pairs`) this process's too."""
    _command_line_pairs[:] = list(pairs)


def forget_command_line_pairs() -> None:
    """Drop the pairs :func:`add_command_line_pair` added (tests, and a long-lived process)."""
    _command_line_pairs.clear()


def _read_catalog_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CatalogError(f"Cannot read model catalog {path}: {error}") from error


def parse_catalog(text: str, origin: str, *, allow_local: bool = False) -> Catalog:
    """Validate catalog TOML text; ``origin`` names it in error messages.

    ``allow_local`` admits ``local`` sources (files on this machine): the user's own
    catalog has them, the curated one never does.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"Model catalog {origin} is not valid TOML: {error}") from error
    reader = TableReader(origin, allow_local=allow_local)
    top = reader.take(document, "the top level", required={"models": dict, "pairs": dict})
    models = tuple(
        read_model_entry(reader, key, table)
        for key, table in reader.subtables(top["models"], "models").items()
    )
    pairs = tuple(
        read_pair_entry(reader, key, table)
        for key, table in reader.subtables(top["pairs"], "pairs").items()
    )
    catalog = Catalog(models=models, pairs=pairs, origin=origin)
    check_gguf_conversions(reader, models)
    check_pair_models(reader, catalog)
    return catalog
