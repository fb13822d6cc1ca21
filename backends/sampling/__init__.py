"""From logits to a distribution, for the target's rows and the draft's alike:
temperature, top-k, top-p, min-p (``filters.py``), penalties, sparse distributions and
the row scans that read only the top of a row.

The ground floor of inference: imports only ``backends.base`` and ``backends.errors``
besides numpy, nothing above it.
"""
