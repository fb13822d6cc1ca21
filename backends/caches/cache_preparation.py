"""Bringing a model's cache to a prompt before the loop reads it, and saving after.

Before a generation reads its prompt, each model's KV cache is prepared: the state the
last generation left is kept if this prompt would overwrite it, and the kept
conversation (:class:`ConversationCache`) or the prefix saved on disk
(:class:`DiskPrefixes`) this prompt continues is brought back. After a reply that ran
to its end, the draft's state may be saved to disk. The engine (backends/engine.py)
decides which models take part; this is what is done with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from backends.base import Model, SavePoint
from backends.caches.conversation_cache import ConversationCache
from backends.caches.disk_prefixes import DiskPrefixes
from backends.generation_events import GenerationEvent


def cache_preparer(
    conversations: ConversationCache | None,
    prefixes: DiskPrefixes | None,
    roles: Sequence[tuple[str, Model]],
) -> Callable[[Sequence[int]], SavePoint | None]:
    """What brings kept or saved states back for each of ``roles`` (the target first,
    then the draft if it drafts) before the loop reads a prompt, and says where reading
    it should pause to save the target's state."""
    target = roles[0][1]

    def prepare(prompt: Sequence[int]) -> SavePoint | None:
        for role, model in roles:
            if conversations is not None:
                conversations.prepare(role, model, prompt)
            if prefixes is not None:
                prefixes.load(role, model, prompt)
        return prefixes.save_point("target", target, prompt) if prefixes else None

    return prepare


def then_save_draft(
    events: Iterator[GenerationEvent], prefixes: DiskPrefixes, draft: Model
) -> Iterator[GenerationEvent]:
    """``events``, then (once the reply is whole and delivered) the draft's state saved.

    Only a reply that ran to its end: a consumer that stops early closes the generator
    and nothing is saved for it.
    """
    yield from events
    prefixes.save_after_reply("draft", draft)
