"""Inference, with no UI: knows models and tokens, never ``app``.

The floor's doors stand at the top: ``base`` (the Model protocol every runtime
implements), ``engine`` (the facade every front end calls), ``select`` (which runtime
loads a file), ``errors``, ``generation_events`` and ``pair_check``. Behind them, rooms by
purpose: ``speculation`` (the one loop, drafters, controller), ``sampling``, ``output``
(templates, grammars, tool calls, reasoning, stop strings), ``caches``, and the runtimes
``llamacpp`` and ``mlx``, the only places that import ``llama_cpp`` or ``mlx``.
"""
