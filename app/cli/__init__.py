"""The ``draftpen`` command line: subcommands, the plain REPL, ``doctor``.

``main`` parses arguments and dispatches; ``models``, ``serve`` and ``doctor`` are
subcommands; ``repl`` is ``chat --plain``; ``stats_line`` formats a generation's figures.
As the entry point it may start the other front ends (``tui``, ``server``, ``bench``),
which never import it.
"""
