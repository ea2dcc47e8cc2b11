"""fpemu's pytest plugin (the ``pytest11`` entry point ``fpemu``): the fixture
``fpemu_oracle`` and the marker ``fpemu_exhaustive``.

The marker labels exhaustive sweeps so that a run selects them
(``pytest -m fpemu_exhaustive``) or skips them (``-m "not fpemu_exhaustive"``).
Importing this module imports nothing of fpemu: pytest loads it in every
session of an environment where fpemu is installed.
"""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fpemu_exhaustive: a sweep over every input of a source type "
        "(fpemu.testing.exhaustive); select with -m fpemu_exhaustive, skip with "
        "-m 'not fpemu_exhaustive'")


@pytest.fixture(scope="session")
def fpemu_oracle():
    """fpemu's conversions and assertions (:class:`fpemu.testing.Oracle`); one for the
    session (it holds no state), so hypothesis's @given tests may take it."""
    from fpemu.testing import Oracle  # not at import: see the docstring
    return Oracle()
