"""Fixtures the runtimes' split test modules share, registered here for the folder.

A fixture imported into a test module shadows its parameter (ruff's F811); registered
in this conftest, the tests that name it get it and import nothing. The crash tests'
autouse fixture (``fresh_front_end``) is not here: it is imported by the modules it
belongs to, so it does not apply to the whole folder.
"""

from tests.runtimes.crashing_engine import (  # noqa: F401  (fixtures)
    engine_home,
    engine_starts,
    shared_home,
    socket_path,
)
from tests.runtimes.hybrid_helpers import engine, tiny_files  # noqa: F401  (fixtures)
from tests.runtimes.real_workers import home, two_workers  # noqa: F401  (fixtures)
from tests.runtimes.tiny_mlx_hybrid import tiny_dirs  # noqa: F401  (fixtures)
