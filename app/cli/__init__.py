"""The command line's own commands: ``generate``, ``models``, ``doctor``, the plain REPL.

``app.main`` parses the command line and hands these their arguments; ``stats_line``
formats a generation's figures for them, and ``reply_stream`` prints a reply with a
thinking model's reasoning kept apart. ``generate`` runs the loop in-process; the REPL
(``repl``) is a client of the engine through ``app.client`` and loads nothing itself;
so is ``launch``, which runs an agent CLI (Claude Code, Codex, opencode) against it.
May import ``app.client``, ``app.models``, ``app.chats``, ``app.loading``,
``app.runtime_check`` (``doctor``), ``app.options``, ``app.settings``, ``app.errors`` and
``backends``; never another front end (``tui``, ``engine``, ``bench``).
"""
