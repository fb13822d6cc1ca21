"""The drafters an :class:`~backends.engine.Engine` holds, by name: the draft model,
n-gram lookup, and the heads its target feeds (its own MTP head; an EAGLE-3, DFlash or
DSpark head from a file of its own: ``backends/speculation/head_drafters.py``). Mixed
into the engine, which sets the attributes declared here.
"""

from __future__ import annotations

from pathlib import Path

from backends.base import Model
from backends.errors import BackendError
from backends.speculation.head_drafters import FILE_HEADS, HeadDrafters, no_head_reason
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.mtp_drafter import MtpDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.proposal import Drafter


class EngineDrafters:
    """The engine's drafters by name (see the module's docstring)."""

    target: Model
    _model_drafter: ModelDrafter | None
    _mtp_drafter: MtpDrafter | None
    _file_heads: HeadDrafters
    _ngram_drafter: NgramDrafter

    def drafter_named(self, name: str) -> Drafter | None:
        """The drafter for a name (None for "none"); errors say what is missing."""
        if name == "none":
            return None
        if name == "ngram":
            return self._ngram_drafter
        if name in FILE_HEADS:
            return self._file_heads.named(name)
        if name == "mtp":
            if self._mtp_drafter is None:
                raise BackendError(no_head_reason(self.target, name))
            return self._mtp_drafter
        if name == "model":
            if self._model_drafter is None:
                raise BackendError(
                    "This model has no draft model loaded; use --drafter ngram or none, "
                    "or pick a pair with a draft model."
                )
            return self._model_drafter
        raise ValueError(f"unknown drafter {name!r}")

    def head_names(self) -> list[str]:
        """The drafters over the heads this engine's target drafts with ("mtp",
        "eagle3", "dflash", "dspark"; none: an empty list), for what a front end shows."""
        return [head.name for head in self._draft_heads()]

    def _draft_heads(self) -> list[Drafter]:
        """The heads this engine's target drafts with (its MTP head, the head attached
        from a file), for ``auto``."""
        own = [self._mtp_drafter] if self._mtp_drafter is not None else []
        return [*own, *self._file_heads.drafters()]

    def attach_mtp_head(self, path: str | Path) -> None:
        """Draft with an MTP head from a separate file (some publishers ship it apart)."""
        attach = getattr(self.target, "attach_mtp_file", None)
        if attach is None:
            raise BackendError(no_head_reason(self.target, "mtp"))
        self._mtp_drafter = MtpDrafter(self.target, attach(path))

    def attach_eagle3_head(self, path: str | Path) -> None:
        """Draft with an EAGLE-3 head trained for the target (one for another is refused)."""
        self._file_heads.attach("eagle3", path)

    def attach_dflash_head(self, path: str | Path) -> str:
        """Draft with a DFlash or DSpark head trained for the target (one for another is
        refused); the drafter's name, "dflash" or "dspark", as the file holds one or the other."""
        return self._file_heads.attach("dflash", path)
