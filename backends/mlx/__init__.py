"""The MLX runtime (mlx and mlx-lm: Metal on Apple Silicon, the CPU on Linux for tests):
loading a converted model, its forward pass and cache, and rollback by snapshot and replay
for hybrid targets.

The only package that imports ``mlx`` or ``mlx_lm``. May import the floor's doors
(``base``, ``errors``, ``generation_events``), ``sampling`` and ``output``; never
``speculation``.
"""
