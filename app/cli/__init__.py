"""The command line's own commands: ``generate``, ``models``, ``doctor``, the plain REPL.

``app.main`` parses the command line and hands these their arguments; ``stats_line``
formats a generation's figures for them. May import ``app.models``, ``app.chats``,
``app.loading``, ``app.options``, ``app.settings``, ``app.errors`` and ``backends``; never
another front end (``tui``, ``server``, ``bench``).
"""
