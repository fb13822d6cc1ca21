"""A flag that stops a reply, and hangs up its stream the moment it is set.

The engine learns that a reply was stopped only from its closed connection. The
reading thread may be blocked waiting for the next chunk (the engine is inside a long
round, or the request waits in its queue), so the stream must be closed by whoever
stops it, at once: :class:`CancelFlag` runs the hooks a stream registered (shutting its
socket down) inside :meth:`CancelFlag.set`. No thread watches the flag, so an open
stream costs no CPU while it waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelFlag(threading.Event):
    """A :class:`threading.Event` whose :meth:`set` also runs the registered hooks."""

    def __init__(self) -> None:
        super().__init__()
        # Re-entrant: a signal handler (Ctrl+C in the REPL) may set the flag on the thread
        # that is registering a hook.
        self._hooks_lock = threading.RLock()
        self._hooks: list[Callable[[], None]] = []

    def set(self) -> None:
        """Set the flag, then run every hook registered now (each at most once)."""
        super().set()
        with self._hooks_lock:
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run ``hook`` when the flag is set (at once if it is already set).

        Returns a function that unregisters the hook; call it when whatever the hook
        would stop has ended on its own.
        """
        with self._hooks_lock:
            if not self.is_set():
                self._hooks.append(hook)
                return lambda: self._forget(hook)
        hook()
        return lambda: None

    def _forget(self, hook: Callable[[], None]) -> None:
        with self._hooks_lock:
            if hook in self._hooks:
                self._hooks.remove(hook)
