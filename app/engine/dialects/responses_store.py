"""The responses the Responses API keeps (``store``), so ``previous_response_id`` works.

A bounded, in-memory store: the last :data:`DEFAULT_CAPACITY` stored responses, the
least recently used going first. Each entry holds the response object as it was
answered and the conversation that continues from it (every input item, the earlier
responses' included, then this response's output), so a continuation does not depend
on older entries still being there. Items are shared between entries, not copied.

Everything here runs on the server's event loop (request handlers and the response
formats that store what they answered), so no lock is needed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

# How many responses are kept. A response's conversation shares its items with the
# entry it continued, so a long chain costs about one copy of its items.
DEFAULT_CAPACITY = 512


@dataclass(frozen=True)
class StoredResponse:
    """One stored response and the conversation that continues from it."""

    response: dict[str, Any]
    # The input items that led to it (earlier responses' first), then its output items.
    conversation: tuple[dict[str, Any], ...]


class ResponsesStore:
    """Stored responses by id, least recently used evicted beyond ``capacity``."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("a responses store holds at least one response")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> None:
        """Keep ``entry``; the least recently used goes when the store is full."""
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The entry for ``response_id`` (now the most recently used), or None."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; whether it was there."""
        return self._entries.pop(response_id, None) is not None
