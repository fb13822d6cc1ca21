"""draftpen's product: everything a person or an agent touches.

Packages, each a job (arrows point down; front ends never import each other):

- ``tui``, ``cli``: the front ends (the chat app, the commands); ``engine``: the engine
  process (``draftpen serve``) that every front end and agent is a client of.
- ``client``: how a front end finds, starts and talks to the engine over its socket.
- ``bench``: measuring speculation on this machine (a command of the CLI).
- ``models``: the catalog, the store, downloads and their sources, fit for this machine.
- ``chats``: conversations, their history in SQLite, export.
- ``runtime_check``: does the installed llama.cpp build run on this CPU (a child
  process decodes a tiny model; the installer and ``draftpen doctor`` run it).
- cross-cutting modules here: ``settings``, ``errors``, ``machine``, ``rates``,
  ``loading`` (a pair's files to a loaded engine) and ``calibration_store``.

Everything here may import ``backends``; ``backends`` never imports ``app``.
"""
