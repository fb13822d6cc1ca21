"""Fixtures the chat app's split test modules share, registered here for the folder.

A fixture imported into a test module shadows its parameter (ruff's F811); registered
in this conftest, the tests that name it get it and import nothing.
"""

from tests.support.real_engine_app import (  # noqa: F401  (fixtures)
    engine_home,
    engines,
    shared_home,
)
