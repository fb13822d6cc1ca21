"""The drafters over draft heads a target feeds, by name, and what a request that names
one is told where the target has none.

The MTP head lives in the target's own file (or a separate one beside it); an EAGLE-3
head and a DFlash or DSpark head are separate files that a runtime's model attaches
(``attach_eagle3_file``, ``attach_dflash_file``: llama.cpp's). A model feeds one head
at a time, so attaching one replaces the last.
"""

from __future__ import annotations

from pathlib import Path

from backends.base import Model
from backends.errors import BackendError
from backends.speculation.block_drafter import NO_BLOCK_HEAD, BlockDrafter
from backends.speculation.eagle3_drafter import NO_EAGLE3_HEAD, Eagle3Drafter
from backends.speculation.mtp_drafter import NO_MTP_HEAD
from backends.speculation.proposal import Drafter

# By drafter name: what the head is called, what a target without one is told, and
# the method of a runtime's model that attaches (or, for MTP, finds) one.
HEADS = {
    "mtp": ("a model's MTP head", NO_MTP_HEAD, "mtp_head"),
    "eagle3": ("an EAGLE-3 head", NO_EAGLE3_HEAD, "attach_eagle3_file"),
    "dflash": ("a DFlash head", NO_BLOCK_HEAD, "attach_dflash_file"),
    "dspark": ("a DSpark head", NO_BLOCK_HEAD, "attach_dflash_file"),
}
# The heads attached from separate files.
FILE_HEADS = ("eagle3", "dflash", "dspark")


class HeadDrafters:
    """The drafter over the head a target feeds from a separate file (one at a time)."""

    def __init__(self, target: Model) -> None:
        self.target = target
        self._drafters: dict[str, Drafter] = {}

    def __bool__(self) -> bool:
        return bool(self._drafters)

    def attach(self, name: str, path: str | Path) -> str:
        """Attach the head in ``path`` (``name``: "eagle3", or "dflash" for a DFlash or
        DSpark file); the name its drafter goes by (a DSpark file's is "dspark")."""
        attach = getattr(self.target, HEADS[name][2], None)
        if attach is None:
            raise BackendError(no_head_reason(self.target, name))
        head = attach(path)
        drafter = (
            Eagle3Drafter(self.target, head)
            if name == "eagle3"
            else BlockDrafter(self.target, head)
        )
        self._drafters = {drafter.name: drafter}
        return drafter.name

    def for_sequence(self, target: Model) -> HeadDrafters:
        """The same heads, drafting for ``target``: one sequence of this target's parallel
        context. Each sequence follows its own cache, so it drafts with a head state of
        its own (the runtime's ``sequence_head``); where the runtime has none, with none."""
        other = HeadDrafters(target)
        sequence_head = getattr(target, "sequence_head", None)
        head = sequence_head() if sequence_head is not None and self._drafters else None
        if head is not None:
            other._drafters = {
                name: type(drafter)(target, head)  # type: ignore[call-arg]
                for name, drafter in self._drafters.items()
            }
        return other

    def drafters(self) -> list[Drafter]:
        """The drafter over the attached head (none: an empty list)."""
        return list(self._drafters.values())

    def named(self, name: str) -> Drafter:
        """The drafter called ``name``; where none is, an error that says why."""
        drafter = self._drafters.get(name)
        if drafter is not None:
            return drafter
        other = {"dflash": "dspark", "dspark": "dflash"}.get(name)
        if other in self._drafters:
            raise BackendError(
                f"{self.target.name}'s head is {HEADS[other][0]}, not {HEADS[name][0]}: "
                f"use --drafter {other}"
            )
        raise BackendError(no_head_reason(self.target, name))


def no_head_reason(target: Model, name: str) -> str:
    """Why ``target`` cannot draft with the head called ``name``."""
    head, missing, attach = HEADS[name]
    if not hasattr(target, attach):
        return (
            f"{target.name}: this runtime cannot draft with {head} here (llama.cpp runs "
            "every head; MLX runs EAGLE-3 and DFlash heads). "
            "Use --drafter ngram, model or none."
        )
    return f"{target.name} {missing}"
