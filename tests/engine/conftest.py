"""Fixtures the engine's split test modules share, registered here for the folder.

A fixture imported into a test module shadows its parameter (ruff's F811); registered
in this conftest, the tests that name it get it and import nothing.
"""

from tests.support.engine_process import (  # noqa: F401  (fixtures)
    engine,
    engine_home,
    shared_home,
)
from tests.support.serve_process import server, server_home  # noqa: F401  (fixtures)
