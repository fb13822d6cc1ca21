"""The MLX runtime (mlx and mlx-lm: Metal on Apple Silicon, the CPU on Linux for tests):
loading a converted model, its forward pass and cache, rollback by snapshot and replay
for hybrid targets, and EAGLE-3 and DFlash heads through mlx-vlm's head models.

The only package that imports ``mlx``, ``mlx_lm`` or ``mlx_vlm``. May import the floor's doors
(``base``, ``errors``, ``generation_events``), ``sampling`` and ``output``; never
``speculation``.
"""
