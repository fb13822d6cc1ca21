"""A target split across processes with mlx's distributed backends; drafting on rank 0.

Each rank (process, one per machine) loads its share of the target with mlx-lm's own
split (:class:`SplitMlxModel`): a run of layers (``"pipeline"``, where the model class
has ``model.pipeline``) or a slice of every layer (``"tensor"``, where it has ``shard``).
A forward then passes activations between the ranks, so every rank must make the same
forward, rollback and prefill calls in the same order. Only rank 0 runs the speculative
loop: it wraps its share in :class:`BroadcastTarget`, which sends each call that touches
the cache to the other ranks before making it; they run :func:`follow`, which makes the
same call on their shares. A draft model is an ordinary ``MlxModel`` on rank 0 only.

Messages are int32 arrays broadcast with ``all_sum`` (rank 0 adds the values, the others
zeros): a verify of up to ``INLINE_TOKENS`` tokens costs one message, and a rollback of
a KV cache rides along with the next call. A split target keeps no conversation states
(``save_state`` is refused) and runs one sequence at a time.

Launch with ``mlx.launch --backend ring`` (TCP; ``--hostfile`` for several machines):
``draftpen serve`` under it joins the group (:func:`join_group`), agrees on the context
and split with rank 0 (:func:`load_share`), and rank 0 serves while the others follow.
A rank whose peer's process ends sees its socket close: the ring backend raises
"connection to a peer was lost", which ends :func:`follow` and fails rank 0's next
call (a :class:`PeerLostError`). A peer whose machine vanishes without closing its
sockets (power, cable) is waited for until TCP gives up: mlx's ring has no timeout.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm import __version__ as mlx_lm_version
from mlx_lm.utils import load_model, load_tokenizer

from backends.base import SequenceState
from backends.errors import BackendError, ModelLoadError
from backends.mlx.model import MlxModel
from backends.sampling.rows import LogitRows

# "auto": pipeline where mlx-lm has it for the model, else tensor.
SPLITS: tuple[str, ...] = ("auto", "pipeline", "tensor")
# Message kinds, and a message's fields before its tokens: kind, flag (replay or
# last_only), the length to roll back to first (-1: none), how many tokens.
PREFILL, FORWARD, ROLLBACK, KEEP_POINT, CLOSE = 1, 2, 3, 4, 5
HEADER = 4
INLINE_TOKENS = 28  # a verify of K <= 27 drafts fits in one message


class PeerLostError(BackendError):
    """Another rank of the group has gone: its process ended or its connection broke."""


class SplitMlxModel(MlxModel):
    """This rank's share of a target split across the ranks of ``group``.

    ``split`` "auto" takes mlx-lm's pipeline split where the model class has one (one
    hand-over per forward between neighbours, the least network), else its tensor split.
    Asked for ``parallel`` > 1 it loads one sequence and says why (``parallel_refusal``):
    every rank must make the same calls in the same order. It feeds no draft head: a
    head reads layers that other ranks hold.
    """

    splits_layers = True

    def __init__(
        self,
        path: str | Path,
        group: Any,
        *,
        split: str = "auto",
        parallel: int = 1,
        **options: Any,
    ) -> None:
        if split not in SPLITS:
            raise ModelLoadError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
        self.group = group
        self.split = split
        super().__init__(path, **options)
        if parallel > 1:
            self.parallel_refusal = (
                f"a target split across {group.size()} ranks runs one sequence: every "
                "rank must make rank 0's calls in the same order"
            )
        self.placement = (
            f"{self.split} split over {group.size()} ranks (mlx distributed), this is rank "
            f"{group.rank()}"
        )

    def _load(self, path: Path) -> tuple[Any, Any]:
        """Load only this rank's share of the weights (the rest stay unread, lazy)."""
        model, config = load_model(path, lazy=True)
        kind, size = config["model_type"], self.group.size()
        pipelines = hasattr(getattr(model, "model", None), "pipeline")
        if self.split == "auto":
            self.split = "pipeline" if pipelines or not hasattr(model, "shard") else "tensor"
        if self.split == "pipeline" and pipelines:
            model.model.pipeline(self.group)
        elif self.split == "tensor" and hasattr(model, "shard"):
            heads = (config.get("num_attention_heads", 0), config.get("num_key_value_heads", 0))
            if any(count % size for count in heads):
                raise ModelLoadError(f"{kind}'s {heads} attention heads do not split {size} ways")
            model.shard(self.group)
        else:
            raise ModelLoadError(f"mlx-lm {mlx_lm_version} has no {self.split} split for {kind}")
        mx.eval(model.parameters())
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
        return model, tokenizer


def _exchange(values: Sequence[int] | None, size: int, group: Any) -> list[int]:
    """Rank 0's ``values`` on every rank (the others pass None and learn them)."""
    data = mx.zeros((size,), dtype=mx.int32) if values is None else mx.array(values, mx.int32)
    try:
        summed = mx.distributed.all_sum(data, group=group, stream=mx.cpu).tolist()
    except RuntimeError as error:  # the ring's "connection to a peer was lost"
        raise PeerLostError(f"a rank of the split target has gone ({error})") from error
    return [int(v) for v in summed]


def join_group() -> Any:
    """This process's group, as ``mlx.launch`` described it in the environment.

    The backend is the one the launcher configured (the ring's hostfile, JACCL's
    coordinator) rather than "any", which could pick another (an MPI singleton)
    and give a group of one.
    """
    if os.environ.get("MLX_HOSTFILE"):
        backend = "ring"
    elif os.environ.get("MLX_JACCL_COORDINATOR"):
        backend = "jaccl"
    else:
        backend = "any"
    try:
        return mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as error:
        raise BackendError(
            f"MLX_RANK is set but mlx could not join the {backend} group ({error}); start "
            "every rank with mlx.launch (see docs/workers.md)"
        ) from error


def _fingerprint(path: Path) -> int:
    """A checksum of a model's config.json: every rank must load the same model."""
    try:
        text = (Path(path) / "config.json").read_bytes()
    except OSError:
        return 0
    return zlib.crc32(text) & 0x7FFFFFFF  # int32, for the message


def load_share(
    path: str | Path, group: Any, *, split: str, n_ctx: int, parallel: int = 1
) -> SplitMlxModel:
    """Agree on the context length and the split with rank 0 (its values win: the ranks
    may have other settings), check that this rank has rank 0's model, and load this
    rank's share. Every rank calls it once, in step."""
    mine = [n_ctx, SPLITS.index(split) if split in SPLITS else 0, _fingerprint(Path(path))]
    n_ctx, split_index, fingerprint = _exchange(mine if group.rank() == 0 else None, 3, group)
    if group.rank() != 0 and fingerprint != mine[2]:
        raise ModelLoadError(
            f"rank {group.rank()}'s {Path(path).name} is not rank 0's model (their "
            "config.json differ); download the same pair on every machine"
        )
    return SplitMlxModel(path, group, split=SPLITS[split_index], n_ctx=n_ctx, parallel=parallel)


def _receive(group: Any) -> tuple[int, int, int, list[int]]:
    """The next message from rank 0: kind, flag, length to roll back to, tokens."""
    kind, flag, keep, count, *tokens = _exchange(None, HEADER + INLINE_TOKENS, group)
    if count > INLINE_TOKENS:
        tokens += _exchange(None, count - INLINE_TOKENS, group)
    return kind, flag, keep, tokens[:count]


class BroadcastTarget:
    """Rank 0's share of a split target, which makes every rank mirror its calls.

    Everything that does not touch the cache (tokenizer, template, metadata) is read
    from the local share.
    """

    def __init__(self, share: SplitMlxModel) -> None:
        self._share = share
        self._pending_keep = -1  # a KV-cache rollback the followers have yet to make

    def __getattr__(self, name: str) -> Any:
        return getattr(self._share, name)

    def _send(self, kind: int, tokens: Sequence[int] = (), flag: bool = False) -> None:
        tokens = list(tokens)
        head = [kind, int(flag), self._pending_keep, len(tokens)]
        inline = tokens[:INLINE_TOKENS] + [0] * max(0, INLINE_TOKENS - len(tokens))
        _exchange(head + inline, HEADER + INLINE_TOKENS, self._share.group)
        if len(tokens) > INLINE_TOKENS:
            _exchange(tokens[INLINE_TOKENS:], len(tokens) - INLINE_TOKENS, self._share.group)
        self._pending_keep = -1

    def prefill(self, tokens: Sequence[int], *, replay: bool = False) -> None:
        """Evaluate tokens into every rank's cache, computing no logits."""
        self._send(PREFILL, tokens, replay)
        self._share.prefill(tokens, replay=replay)

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` on every rank; the logits, here."""
        self._send(FORWARD, tokens, last_only)
        return self._share.forward(tokens, last_only=last_only)

    def forward_rows(self, tokens: Sequence[int], *, last_only: bool = False) -> LogitRows:
        """Like :meth:`forward`, the logits as the loop's rows."""
        self._send(FORWARD, tokens, last_only)
        return self._share.forward_rows(tokens, last_only=last_only)

    def rollback(self, n_keep: int) -> None:
        """Forget positions from ``n_keep`` on, on every rank (a KV cache's followers
        trim with the next message; a recurrent state's replay runs on all now)."""
        n_keep = max(0, n_keep)
        if n_keep >= len(self._share.cached_tokens):
            return
        if self._share.recurrent:
            self._send(ROLLBACK, [n_keep])
        else:
            held = self._pending_keep
            self._pending_keep = n_keep if held < 0 else min(held, n_keep)
        self._share.rollback(n_keep)

    def keep_rollback_point(self) -> None:
        """Snapshot a recurrent state on every rank (a KV cache needs nothing)."""
        if self._share.recurrent:
            self._send(KEEP_POINT)
            self._share.keep_rollback_point()

    def save_state(self) -> SequenceState:
        """Refused: the other ranks' shares of a conversation are not kept."""
        raise BackendError("a target split across machines keeps no conversation states")

    def restore_state(self, state: SequenceState) -> None:
        """Refused, as :meth:`save_state`."""
        raise BackendError("a target split across machines keeps no conversation states")

    def close(self) -> None:
        """Release every rank: the followers close their shares and return (a rank
        that has gone already is let be: this share is freed all the same)."""
        try:
            self._send(CLOSE)
        except PeerLostError:
            pass
        finally:
            self._share.close()


def follow(share: SplitMlxModel) -> None:
    """On a rank other than 0: make rank 0's calls on this share until it closes.

    A call that fails before it computes (a full context, a bad token) fails the same
    way on rank 0, which reports it; this rank carries on. A rank 0 that has gone
    raises :class:`PeerLostError` (this share is closed first).
    """
    while True:
        try:
            kind, flag, keep, tokens = _receive(share.group)
        except PeerLostError:
            share.close()
            raise
        if keep >= 0:
            share.rollback(keep)
        try:
            if kind == PREFILL:
                share.prefill(tokens, replay=bool(flag))
            elif kind == FORWARD:
                share.forward_rows(tokens, last_only=bool(flag))
            elif kind == ROLLBACK:
                share.rollback(tokens[0])
            elif kind == KEEP_POINT:
                share.keep_rollback_point()
            elif kind == CLOSE:
                share.close()
                return
        except (BackendError, ValueError):
            continue
