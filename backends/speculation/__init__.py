"""Speculative decoding: THE loop (``loop.py``), verification and rejection sampling,
the drafters (draft model, n-gram lookup, MTP head), the controller that picks a drafter
and K each round, its cost model, calibration and acceptance statistics.

May import the floor's doors (``base``, ``errors``, ``generation_events``), ``sampling``
and ``output``; never a runtime (``llamacpp``, ``mlx``): it sees models only through
``backends.base.Model``.
"""
