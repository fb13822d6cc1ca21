"""``draftpen bench``: does speculation pay on this machine, and by how much.

``suite`` holds the prompts (``prompts.toml``) by category; ``modes`` runs each mode and
sums its figures; ``report`` formats the comparison and the projection; ``command``
loads the pair and ties them together.

May import: ``app.loading``, ``app.models``, ``app.settings``, ``app.errors``,
``app.machine``, ``backends``. Never a front end.
"""
