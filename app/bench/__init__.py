"""``draftpen bench``: does speculation pay on this machine, and by how much.

``suite`` holds the prompts (``prompts.toml``) by category; ``modes`` runs each mode and
sums its figures, on the pair loaded here (``LocalDecoder``) or, with ``--engine``,
through the engine (``through_engine``); ``report`` formats the comparison and the
projection; ``command`` loads the pair (or finds the engine) and ties them together.

May import: ``app.loading``, ``app.models``, ``app.settings``, ``app.errors``,
``app.machine``, ``app.client`` (the engine, over its socket), ``backends``. Never a
front end.
"""
