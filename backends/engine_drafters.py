"""The drafters an :class:`~backends.engine.Engine` holds, by name: the draft model,
n-gram lookup, and the target's draft heads (its own MTP head, an EAGLE-3 head from a
file of its own). Mixed into the engine, which sets the attributes declared here.
"""

from __future__ import annotations

from pathlib import Path

from backends.base import Model
from backends.errors import BackendError
from backends.speculation.eagle3_drafter import NO_EAGLE3_HEAD, Eagle3Drafter
from backends.speculation.model_drafter import ModelDrafter
from backends.speculation.mtp_drafter import NO_MTP_HEAD, MtpDrafter
from backends.speculation.ngram_drafter import NgramDrafter
from backends.speculation.proposal import Drafter


class EngineDrafters:
    """The engine's drafters by name (see the module's docstring)."""

    target: Model
    _model_drafter: ModelDrafter | None
    _mtp_drafter: MtpDrafter | None
    _eagle3_drafter: Eagle3Drafter | None
    _ngram_drafter: NgramDrafter

    def drafter_named(self, name: str) -> Drafter | None:
        """The drafter for a name (None for "none"); errors say what is missing."""
        if name == "none":
            return None
        if name == "ngram":
            return self._ngram_drafter
        if name in ("mtp", "eagle3"):
            head = self._mtp_drafter if name == "mtp" else self._eagle3_drafter
            if head is None:
                raise BackendError(self._no_head_reason(name))
            return head
        if name == "model":
            if self._model_drafter is None:
                raise BackendError(
                    "This model has no draft model loaded; use --drafter ngram or none, "
                    "or pick a pair with a draft model."
                )
            return self._model_drafter
        raise ValueError(f"unknown drafter {name!r}")

    def _heads(self) -> list[Drafter]:
        """The draft heads this engine's target drafts with (its MTP head, an EAGLE-3
        head), for ``auto``."""
        return [head for head in (self._mtp_drafter, self._eagle3_drafter) if head is not None]

    def attach_mtp_head(self, path: str | Path) -> None:
        """Draft with an MTP head from a separate file (some publishers ship it apart)."""
        attach = getattr(self.target, "attach_mtp_file", None)
        if attach is None:
            raise BackendError(self._no_head_reason("mtp"))
        self._mtp_drafter = MtpDrafter(self.target, attach(path))

    def attach_eagle3_head(self, path: str | Path) -> None:
        """Draft with an EAGLE-3 head trained for the target (one for another is refused)."""
        attach = getattr(self.target, "attach_eagle3_file", None)
        if attach is None:
            raise BackendError(self._no_head_reason("eagle3"))
        self._eagle3_drafter = Eagle3Drafter(self.target, attach(path))

    def _no_head_reason(self, name: str) -> str:
        head = "an EAGLE-3 head" if name == "eagle3" else "a model's MTP head"
        if not hasattr(self.target, "attach_eagle3_file" if name == "eagle3" else "mtp_head"):
            return (
                f"{self.target.name}: this runtime cannot draft with {head} "
                "(llama.cpp can; MLX cannot yet). Use --drafter ngram, model or none."
            )
        return f"{self.target.name} {NO_EAGLE3_HEAD if name == 'eagle3' else NO_MTP_HEAD}"
