"""Fixtures the models' split test modules share, registered here for the folder.

A fixture imported into a test module shadows its parameter (ruff's F811); registered
in this conftest, the tests that name it get it and import nothing, and the wheel
mirror's session fixtures build their wheels once for the folder.
"""

from tests.models.hub_pairs import hub  # noqa: F401  (a fixture)
from tests.models.wheel_mirror import (  # noqa: F401  (fixtures)
    mirror,
    mirror_wheels,
    pulled,
    pulled_store_template,
)
