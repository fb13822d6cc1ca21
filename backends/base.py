"""The Model protocol: what the speculative loop asks of a runtime.

A runtime (llama.cpp, MLX) implements this small surface and nothing else of the
algorithm. Logits are returned as float32 numpy arrays of shape ``(n, n_vocab)``;
a runtime may return a view into its own buffer, valid only until its next call to
``forward`` or ``prefill``, so consumers read what they need before the next call.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class VocabInfo:
    """The facts about a tokenizer that decide whether two models can pair up."""

    vocab_type: str
    n_vocab: int
    bos_id: int
    eos_id: int
    add_bos: bool
    add_eos: bool


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: its name, what it does, its JSON-schema parameters."""

    name: str
    description: str | None = None
    # A JSON Schema object; an empty one when the function takes no arguments.
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    strict: bool = False


@dataclass(frozen=True)
class ToolCall:
    """One call the assistant made: an id to answer it by, the function and its arguments.

    ``arguments`` is JSON text, as OpenAI's API carries it (and as the model wrote it).
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation.

    Roles are ``system``, ``user``, ``assistant`` and ``tool``. An assistant turn may
    carry the ``tool_calls`` it made (its ``content`` is then often empty); a ``tool``
    turn answers the call ``tool_call_id``, and ``name`` is that call's function.
    """

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@runtime_checkable
class Model(Protocol):
    """A causal language model with a KV cache that can be trimmed.

    The cache holds ``len(cached_tokens)`` positions. ``prefill`` and ``forward`` append to it;
    ``rollback`` forgets everything after the first ``n_keep`` positions.
    """

    name: str
    n_vocab: int
    n_ctx: int

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens whose positions the KV cache holds, in order."""
        ...

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Text to token ids; ``add_special`` adds BOS where the model wants it.

        Special-token text (``<|im_start|>``) in ``text`` is parsed as the special
        token, as chat templates need.
        """
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (special tokens render as empty)."""
        ...

    def is_end_of_generation(self, token: int) -> bool:
        """Whether this token ends a reply (EOS, EOT, <|im_end|>, ...)."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        template_variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for a conversation, ending where the assistant speaks.

        ``tools`` reach the template as its ``tools`` variable (transformers' convention);
        ``template_variables`` are further variables it reads (Qwen3's ``enable_thinking``).
        Callers pass either only when they have one, so a runtime without a Jinja
        template may leave them out.
        """
        ...

    def vocab_info(self) -> VocabInfo:
        """Tokenizer facts for the pair check."""
        ...

    def token_text(self, token: int) -> str:
        """The vocabulary's stored text of a token (for the pair check)."""
        ...

    def prefill(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens into the cache without computing any logits."""
        ...

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Evaluate tokens in ONE batched pass and return their logits.

        Shape ``(n, n_vocab)``, or ``(1, n_vocab)`` for the last token when
        ``last_only``. The array may be a view that the next call overwrites.
        """
        ...

    def rollback(self, n_keep: int) -> None:
        """Forget every cached position from ``n_keep`` on."""
        ...

    def close(self) -> None:
        """Free the runtime's memory; the model is unusable afterwards."""
        ...


def rollback_limit(model: Model) -> int | None:
    """The most positions ``model`` drops cheaply right after a forward (None: any number).

    A KV cache forgets any suffix. A recurrent state (hybrid models such as Qwen3.5/3.6)
    can be cut back only as far as its runtime kept snapshots of it, and further only by
    restoring a copy and evaluating tokens again: such a model says how deep its
    snapshots reach (an optional ``rollback_limit`` attribute), and no draft is longer.
    """
    limit = getattr(model, "rollback_limit", None)
    return None if limit is None else int(limit)


def keep_rollback_point(model: Model) -> None:
    """Tell ``model`` that a later rollback will come back to its current end.

    A model with a recurrent state copies it (its optional ``keep_rollback_point``);
    a KV cache needs nothing, since it can drop any suffix.
    """
    keep = getattr(model, "keep_rollback_point", None)
    if keep is not None:
        keep()


def reusable_prefix(model: Model, shared: int) -> int:
    """How many of the first ``shared`` cached tokens a rollback to ``shared`` keeps
    without evaluating them again: all of them for a KV cache; for a recurrent state,
    what its snapshots or checkpoints reach (the model's optional ``reusable_prefix``)."""
    own = getattr(model, "reusable_prefix", None)
    return shared if own is None else int(own(shared))


# A draft tree holds at most this many branches (a runtime's scratch sequences).
MAX_TREE_BRANCHES = 4


@dataclass(frozen=True)
class DraftTree:
    """A trie of one-hot draft branches verified in one forward (issue 55 part 4;
    built by ``backends/speculation/draft_tree.py``), nodes in batch order: depth
    first, the best branch first.

    ``parents[i]`` is node i's parent (-1: the pending token); ``branches[i]`` the
    numbers of the branches that pass through it (0: the best).
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    branches: tuple[frozenset[int], ...]
    width: int  # how many branches

    @property
    def size(self) -> int:
        """How many nodes (the batch holds one more: the pending token)."""
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """The nodes whose parent is ``node`` (-1: the pending token), in batch order."""
        return [index for index, parent in enumerate(self.parents) if parent == node]

    def depths(self) -> list[int]:
        """Each node's depth (1 for a child of the pending token)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return depths

    def path_tokens(self, path: Sequence[int]) -> list[int]:
        """The tokens of a path of nodes."""
        return [self.tokens[node] for node in path]


@runtime_checkable
class VerifiesTrees(Protocol):
    """A model that evaluates a draft tree in one forward (an optional capability).

    ``tree_branches`` is how many branches it takes now (0: none, e.g. a recurrent
    state, several sequences, an MTP head). ``forward_tree`` appends the pending token
    and the tree's nodes and returns ``1 + tree.size`` rows of logits (a view valid
    until the next call); ``keep_tree_path`` then keeps the pending token and the nodes
    of ``path`` (a chain from a child of the pending token down) and forgets every other
    node, so ``cached_tokens`` ends with the pending token and ``path``'s tokens.
    """

    @property
    def tree_branches(self) -> int:
        """How many branches a tree may have on this model now (0: no trees)."""
        ...

    def forward_tree(self, pending: int, tree: DraftTree) -> np.ndarray:
        """Evaluate ``pending`` and the tree's nodes in one batch; their logits."""
        ...

    def keep_tree_path(self, path: Sequence[int]) -> None:
        """Keep the pending token and ``path``'s nodes of the last tree; drop the rest."""
        ...


def tree_branches(model: Model) -> int:
    """How many branches ``model`` verifies in one forward (0: it verifies chains only:
    a model without the optional :class:`VerifiesTrees` capability)."""
    branches = getattr(model, "tree_branches", None)
    return 0 if branches is None else int(branches)


@dataclass(frozen=True, eq=False)
class SequenceState:
    """A copy of a model's KV cache, taken by :meth:`SavesSequenceState.save_state`.

    ``tokens`` are the positions it holds, in order; ``nbytes`` is the memory the copy
    takes. ``payload`` is the runtime's own data and ``owner`` the model instance that
    made it: a state can be restored only into the model that saved it.
    """

    tokens: tuple[int, ...]
    nbytes: int
    payload: Any = field(repr=False)
    owner: object = field(repr=False)


@runtime_checkable
class SavesSequenceState(Protocol):
    """A model whose KV cache can be copied out and put back (an optional capability).

    The engine keeps several conversations this way (``backends/caches/conversation_cache.py``):
    a request that continues a kept conversation reads only its new tokens.
    """

    def save_state(self) -> SequenceState:
        """A copy of the cache as it is now (its tokens and their keys and values)."""
        ...

    def restore_state(self, state: SequenceState) -> None:
        """Replace the cache with ``state``; ``cached_tokens`` becomes ``state.tokens``.

        Raises ``ValueError`` for a state another model saved; on a runtime failure
        the cache is left empty (never half-restored) and ``DecodeError`` is raised.
        """
        ...


@dataclass(frozen=True)
class SavePoint:
    """Where the loop should pause reading a prompt so the target's state can be kept
    (``backends/caches/disk_prefixes.py``): ``reached()`` is called once the target
    holds exactly the prompt's first ``position`` tokens."""

    position: int
    reached: Callable[[], None]


@runtime_checkable
class PersistsSequenceState(SavesSequenceState, Protocol):
    """A model whose saved states can be written to a file and read back by a later
    process (an optional capability; ``backends/caches/disk_prefixes.py`` uses it)."""

    def state_identity(self) -> Mapping[str, object]:
        """Everything that must match before a state saved by another process may be
        loaded here: the runtime build, cache types, kernels, and under ``weights`` the
        path of the model's file or directory (the cache fingerprints its content)."""
        ...

    def write_state(self, state: SequenceState, file: BinaryIO) -> None:
        """Write ``state``'s runtime data to ``file``. Runs on the cache's writer thread,
        so it must not touch the runtime: only the copy ``save_state`` made."""
        ...

    def read_state(self, tokens: Sequence[int], file: BinaryIO, nbytes: int) -> SequenceState:
        """Read ``nbytes`` written by ``write_state`` back as a state this model can
        restore (``tokens`` are its positions). Raises ``ValueError`` for data it cannot
        use; a runtime that refuses it at restore raises ``DecodeError`` there."""
        ...


class IncrementalDetokenizer:
    """Turns a stream of token bytes into text that never ends in half a character.

    Byte-level BPE splits multi-byte UTF-8 characters across tokens; the incremental
    UTF-8 decoder keeps the incomplete tail until the rest arrives. Invalid bytes
    become U+FFFD rather than an exception.
    """

    def __init__(self, model: Model) -> None:
        self._model = model
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        """Add one token; return the text that became complete."""
        return self._decoder.decode(self._model.token_bytes(token))

    def flush(self) -> str:
        """Return whatever is left (an incomplete tail becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
