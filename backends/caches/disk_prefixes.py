"""Prompt prefixes kept on disk, so a prompt is read once per machine, not once per engine.

Agents resend the same long prefix (a system prompt, tool definitions) in every
session, and every new engine would read it again: minutes on a CPU. The state after
reading it costs a second or two to write and to load. For each request:

* before the prompt is read, :meth:`DiskPrefixes.load` puts the longest saved prefix of
  the prompt into the model, when it spares more than the model's cache already does;
* while the target reads the prompt, it stops at its end (under exact kernels, or for
  a recurrent state, at its last block boundary; :meth:`DiskPrefixes.save_point`,
  when that reaches past what is saved); there its state is copied (in memory, on
  the request's path: a fraction of a second) and written by a background thread (off
  the request's path);
* after the reply, the draft model's state is saved the same way
  (:meth:`DiskPrefixes.save_after_reply`): it read the prompt on its first draft.

Under exact kernels, saving at a block boundary the prompt is read up to, and loading
the state saved there, reads the rest of the prompt in the same batches whether the
prefix was read or loaded, so a reply from a loaded prefix is the reply from reading it
bit for bit. Under the fast kernels a state is cut back to all a prompt shares with it
(batch boundaries then differ from a read from the start, which may flip a near-tie, as
the conversation cache's reuse may). A model with a recurrent state cannot be cut back:
its states are indexed only at their own end. A state is loaded only into a model whose identity
(weights, runtime build, cache types, kernels) is the one that saved it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from backends.base import (
    Model,
    PersistsSequenceState,
    SavePoint,
    SequenceState,
    reusable_prefix,
)
from backends.caches.prefix_keys import (
    BLOCK_TOKENS,
    block_end,
    block_names,
    file_identity,
    identity_key,
)
from backends.caches.prefix_store import PrefixHit, PrefixStore
from backends.errors import DecodeError
from backends.token_prefix import common_prefix_length

log = logging.getLogger(__name__)

# A save must reach this far past what is saved already: each save writes the whole
# state again, so an agent's turns that add a little each are not each worth a file.
MIN_NEW_TOKENS = 2 * BLOCK_TOKENS
# A state that can be cut anywhere is saved again once a prompt goes this far past it.
MIN_NEW_TAIL_TOKENS = BLOCK_TOKENS // 2
# A load must spare reading at least this many tokens: loading costs a second or so
# for an agent-sized state, about what reading this many costs a fast runtime.
MIN_LOAD_GAIN = BLOCK_TOKENS


@dataclass(frozen=True)
class DiskPrefixStats:
    """What the disk cache has done in this engine, for ``/health`` and the benchmark."""

    loaded: int = 0
    loaded_tokens: int = 0
    load_seconds: float = 0.0
    saved: int = 0
    save_failed: int = 0
    copy_seconds: float = 0.0  # on the request's path: the state's copy in memory
    write_seconds: float = 0.0  # on the writer thread

    def as_dict(self) -> dict[str, int | float]:
        """Plain data for JSON."""
        return {
            "loaded": self.loaded,
            "loaded_tokens": self.loaded_tokens,
            "load_seconds": round(self.load_seconds, 4),
            "saved": self.saved,
            "save_failed": self.save_failed,
            "copy_seconds": round(self.copy_seconds, 4),
            "write_seconds": round(self.write_seconds, 4),
        }


@dataclass(frozen=True)
class _Identity:
    key: str
    label: str
    # A KV cache under the fast kernels: a loaded state may be cut back anywhere. Under
    # exact kernels only at a block boundary (the rest is then read in the batches a
    # read from the start would use), and never a recurrent state.
    cuts_anywhere: bool


@dataclass(frozen=True)
class _Write:
    identity: _Identity
    model: PersistsSequenceState
    state: SequenceState
    names: list[str]
    cuttable: bool


class DiskPrefixes:
    """One engine's use of a :class:`PrefixStore`: loads, save points, a writer thread."""

    def __init__(
        self,
        store: PrefixStore,
        *,
        min_new_tokens: int = MIN_NEW_TOKENS,
        min_gain: int = MIN_LOAD_GAIN,
    ) -> None:
        self.store = store
        self.min_new_tokens = max(BLOCK_TOKENS, min_new_tokens)
        self.min_gain = max(1, min_gain)
        self._identities: dict[int, _Identity] = {}
        self._pending: queue.Queue[_Write | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stats = DiskPrefixStats()
        self._writer = threading.Thread(target=self._write_loop, name="prefix-writer", daemon=True)
        self._writer.start()

    # -- before and while a prompt is read ----------------------------------------

    def load(self, role: str, model: Model, prompt: Sequence[int]) -> int:
        """Load the longest saved prefix of ``prompt`` into ``model`` if it beats what the
        model's cache shares with the prompt; the prefix the model now shares."""
        live = reusable_prefix(model, common_prefix_length(model.cached_tokens, prompt))
        identity = self._identity(role, model)
        if identity is None or not isinstance(model, PersistsSequenceState):
            return live
        # The loop always evaluates the prompt's last token itself.
        names = block_names(identity.key, prompt, limit=len(prompt) - 1)
        hit = self.store.find(identity.key, names)
        if hit is None:
            return live
        # What it may spare: its whole blocks, or (cut anywhere) up to all it holds.
        reach = min(hit.entry_tokens, len(prompt) - 1) if identity.cuts_anywhere else hit.tokens
        if reach < live + self.min_gain:
            return live
        started = time.perf_counter()
        read = self.store.read(hit, identity.key, model.read_state)
        if read is None:
            return live
        tokens, state = read
        if list(tokens[: hit.tokens]) != list(prompt[: hit.tokens]):
            # Block names are 128-bit hashes: this is a damaged index, not chance.
            log.warning("prefix cache: an entry's tokens do not match its index; deleted")
            self.store.discard(hit.entry)
            return live
        kept = hit.tokens
        if identity.cuts_anywhere and len(tokens) > hit.tokens:
            # The saved state may share more than whole blocks (the prompt leaves it
            # inside a block): keep all it shares.
            kept = min(common_prefix_length(tokens, prompt), len(prompt) - 1)
        if kept < live + self.min_gain:
            return live  # its tail was not the prompt's: not worth replacing the cache
        try:
            model.restore_state(state)
        except (DecodeError, ValueError) as error:
            log.warning("prefix cache: %s refused a saved state (%s); deleted", model.name, error)
            self.store.discard(hit.entry)
            return 0 if isinstance(error, DecodeError) else live
        model.rollback(kept)
        self._count(loaded=1, loaded_tokens=kept, load_seconds=time.perf_counter() - started)
        return kept

    def save_point(self, role: str, model: Model, prompt: Sequence[int]) -> SavePoint | None:
        """Where reading ``prompt`` should pause to save ``model``'s state, if that
        reaches far enough past what is saved already.

        A KV cache under the fast kernels is saved where the prompt ends (the next
        session, whose question differs near the end, cuts it back to all it shares);
        one under exact kernels, or a recurrent state, at the prompt's last block
        boundary (see the module's docstring).
        """
        identity = self._identity(role, model)
        if identity is None or not isinstance(model, PersistsSequenceState):
            return None
        end = len(prompt) - 1  # the loop evaluates the last token itself
        names = block_names(identity.key, prompt, limit=end)
        if not names:
            return None
        hit = self.store.find(identity.key, names)
        if identity.cuts_anywhere:
            position, threshold = end, MIN_NEW_TAIL_TOKENS
            covered = _shared_at_most(hit, len(names), end)
        else:
            position, threshold = block_end(len(names) - 1), self.min_new_tokens
            covered = hit.tokens if hit else 0
        if position - covered < threshold:
            return None
        cuttable = not getattr(model, "recurrent", False)

        def reached() -> None:
            if len(model.cached_tokens) == position:
                self._save(identity, model, names, cuttable)

        return SavePoint(position, reached)

    def save_after_reply(self, role: str, model: Model) -> None:
        """Save a model's state after a reply (the draft's: it read the prompt while
        drafting), if it reaches far enough past what is saved. A recurrent state is
        not saved here: it ends inside a reply, where no later prompt will need it."""
        identity = self._identity(role, model)
        if identity is None or not isinstance(model, PersistsSequenceState):
            return
        if getattr(model, "recurrent", False):
            return
        names = block_names(identity.key, model.cached_tokens)
        if not names:
            return
        hit = self.store.find(identity.key, names)
        tokens = len(model.cached_tokens)
        if identity.cuts_anywhere:
            covered = _shared_at_most(hit, len(names), tokens)
            if tokens - covered >= MIN_NEW_TAIL_TOKENS:
                self._save(identity, model, names, cuttable=True)
        elif block_end(len(names) - 1) - (hit.tokens if hit else 0) >= self.min_new_tokens:
            self._save(identity, model, names, cuttable=True)

    # -- after -----------------------------------------------------------------------

    def stats(self) -> DiskPrefixStats:
        """A snapshot of the figures."""
        with self._lock:
            return self._stats

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every state handed to the writer is written; False on timeout."""
        return wait_for_jobs(self._pending, timeout, poll=0.01)

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish the pending writes (a prefix read for minutes is worth the wait), then
        stop the writer."""
        if not self._writer.is_alive():
            return
        if not self.flush(timeout):
            log.warning("prefix cache: stopped before a prompt state was written")
        self._pending.put(None)
        self._writer.join(timeout=5)

    def key_for(self, model: Model) -> str | None:
        """The key ``model``'s states are saved under (None: it cannot save them)."""
        identity = self._identity("", model)
        return identity.key if identity is not None else None

    # -- the parts ---------------------------------------------------------------

    def _identity(self, role: str, model: Model) -> _Identity | None:
        known = self._identities.get(id(model))
        if known is not None:
            return known
        if not isinstance(model, PersistsSequenceState):
            return None
        identity = dict(model.state_identity())
        weights = identity.get("weights")
        if weights is not None:
            identity["weights"] = file_identity(str(weights))
        cuts_anywhere = not getattr(model, "recurrent", False) and not identity.get(
            "exact_kernels", False
        )
        label = f"{getattr(model, 'name', '?')} ({role})"
        made = _Identity(identity_key(identity), label, cuts_anywhere)
        self._identities[id(model)] = made
        return made

    def _save(
        self, identity: _Identity, model: PersistsSequenceState, names: list[str], cuttable: bool
    ) -> None:
        started = time.perf_counter()
        try:
            state = model.save_state()
        except DecodeError as error:
            log.warning("prefix cache: could not copy %s's state (%s)", identity.label, error)
            self._count(save_failed=1)
            return
        self._count(copy_seconds=time.perf_counter() - started)
        self._pending.put(_Write(identity, model, state, names, cuttable))

    def _write_loop(self) -> None:
        while True:
            job = self._pending.get()
            try:
                if job is None:
                    return
                self._write(job)
            except Exception:  # never let the writer die: the engine goes on without it
                log.exception("prefix cache: writing a prompt state failed")
                self._count(save_failed=1)
            finally:
                self._pending.task_done()

    def _write(self, job: _Write) -> None:
        started = time.perf_counter()

        def encode(file: BinaryIO) -> None:
            job.model.write_state(job.state, file)

        written = self.store.write(
            job.identity.key,
            job.identity.label,
            job.state.tokens,
            job.names,
            cuttable=job.cuttable,
            nbytes=job.state.nbytes,
            encode=encode,
        )
        if written:
            self._count(saved=1, write_seconds=time.perf_counter() - started)
        else:
            self._count(save_failed=1)

    def _count(self, **changes: float) -> None:
        with self._lock:
            values = self._stats.__dict__ | {
                name: getattr(self._stats, name) + change for name, change in changes.items()
            }
            self._stats = DiskPrefixStats(**values)


def _shared_at_most(hit: PrefixHit | None, blocks: int, end: int) -> int:
    """How much of a prompt's first ``end`` tokens (``blocks`` whole blocks) the saved
    state ``hit`` may share, for deciding whether a save is worth it.

    Past its matched blocks a state may go on sharing the prompt, but only up to the
    first of the prompt's whole blocks it did not match: an agent's prompt that changes
    early (a date in its system prompt) shares one block with yesterday's longer state,
    and is saved again. Within the prompt's last, partial block it is taken to share
    the rest (reading its tokens to be sure would cost a file read on every request).
    """
    if hit is None:
        return 0
    if hit.tokens < block_end(blocks - 1):
        return min(hit.entry_tokens, hit.tokens + BLOCK_TOKENS - 1, end)
    return min(hit.entry_tokens, end)


def wait_for_jobs(jobs: queue.Queue, timeout: float | None, poll: float) -> bool:
    """Wait, looking every ``poll`` seconds, until a background worker has marked every
    job of ``jobs`` done; False once ``timeout`` (None: no limit) has passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while jobs.unfinished_tasks:
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True
