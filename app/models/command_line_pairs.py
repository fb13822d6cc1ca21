"""A ``--target``/``--draft`` pair shared with the engine: its files, and how the engine
makes it a pair of its own.

``draftpen chat --target ...`` makes the pair in the chat's process
(:func:`~app.models.user_pairs.use_command_line_pair`), but the chat is a client of an
engine process that never saw that command line. So the client sends the pair's files
with its load (:func:`command_line_pair_files`: local paths, hub files already pulled
into the HF cache), and the engine registers them under the client's name
(:func:`share_command_line_pair`), checking them as the client did. The engine's runtime
process is then given the pair's :class:`~app.models.catalog.Catalog` (picklable).
"""

from __future__ import annotations

import re
from pathlib import Path

from app.errors import DraftpenError, PairInputError
from app.models.catalog import Catalog
from app.models.catalog_file import add_command_line_pair, command_line_pair, load_catalog
from app.models.pair_files import pair_files
from app.models.user_pairs import build_pair

# As use_command_line_pair makes them: a name that is safe in a URL and a log line.
_PAIR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

PairPaths = tuple[Path, Path | None]
"""A pair's target file (or MLX directory) and its draft's (or head's), if any."""


def command_line_pair_files(name: str) -> PairPaths | None:
    """Where command-line pair ``name`` of this process lies on this machine; ``None``
    when ``name`` is not one (a catalog pair: the engine knows it by name).

    Hub files resolve to their place in the HF cache, so call this after the pair's
    files are pulled (``apply_pair_options`` pulls them).
    """
    catalog = command_line_pair(name)
    if catalog is None:
        return None
    resolved = pair_files(name, catalog.pair(name).variants[0].runtime)
    # The second file is a draft model or a head (EAGLE-3, DFlash, MTP): the engine's
    # own catalog entry tells which from the file, as the client's did.
    heads = (resolved.eagle3_head_path, resolved.dflash_head_path, resolved.mtp_head_path)
    draft = next((path for path in (resolved.draft_path, *heads) if path is not None), None)
    return resolved.target_path, draft


def share_command_line_pair(name: str, target: str, draft: str | None) -> Catalog:
    """In the engine: make the files a client sent a pair called ``name``; returns its
    catalog. Asking again for the same files returns the pair made the first time.

    Raises :class:`~app.errors.PairInputError` naming the fix when a path is not on
    this machine (an engine reached over TCP may run on another), when ``name`` is a
    catalog pair (the client's files would hide it), or when another client's pair of
    other files has that name already.
    """
    if not _PAIR_NAME.fullmatch(name):
        raise PairInputError(f"Pair name {name!r} may hold only letters, digits, '.', '_' and '-'.")
    for text in (target, draft):
        if text is not None and not (Path(text).is_absolute() and Path(text).exists()):
            raise PairInputError(
                f"The engine finds no file at {text} on its machine. --target and --draft "
                "files must be on the machine the engine runs on (an engine reached over "
                "TCP may run on another): give the path they have there, or add the pair "
                "to that machine's catalog (draftpen models add NAME --target PATH) and "
                "ask for it by name."
            )
    wanted = _same_place((Path(target), Path(draft) if draft else None))
    existing = command_line_pair(name)
    if existing is not None:
        try:
            held = command_line_pair_files(name)
        except DraftpenError:
            held = None  # its files went away: it is not the same pair any more
        if held is not None and _same_place(held) == wanted:
            return existing
        raise PairInputError(
            f"This engine already serves another --target pair called {name!r} "
            f"({_describe(held)}). Give your target file another name, or restart that "
            "engine (it forgets --target pairs when it stops)."
        )
    if name in load_catalog().pair_names():
        # The client's name avoids its own catalog's names; this engine's catalog may
        # have more (another user's config, a pair added since). Never hide a pair.
        raise PairInputError(
            f"This engine's catalog has a pair called {name!r}, which your --target pair "
            "would hide. Give your target file another name, or keep the pair under a name "
            "of your own (draftpen models add NAME --target PATH) and use --pair NAME."
        )
    description = f"Given on a client's command line: {target}" + (f" + {draft}" if draft else "")
    models, pair = build_pair(name, description, target, draft)
    return add_command_line_pair(models, pair)


def _same_place(paths: PairPaths) -> PairPaths:
    """``paths`` with links and ``..`` resolved, to compare two pairs' files."""
    target, draft = paths
    return target.resolve(), draft.resolve() if draft is not None else None


def _describe(paths: PairPaths | None) -> str:
    if paths is None:
        return "its files are gone"
    target, draft = paths
    return str(target) + (f" + {draft}" if draft is not None else "")
