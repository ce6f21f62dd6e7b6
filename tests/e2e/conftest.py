"""The e2e tier runs the webhook and the reconciler as the container image runs them: an
unprivileged user, a read-only root filesystem and every other mount read-only, no home directory,
only the files they are given (docs/development.md#runtime-constraints). Every e2e test thus proves
the system works under those constraints; tests/e2e/test_runtime_constraints.py checks they hold.

``KOORD_QUEUE_CONFINED=0`` in the environment runs them unconfined (for a machine where the suite
cannot be root); that test then fails, as it should.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testenv import confined


@pytest.fixture(scope="session", autouse=True)
def confined_processes() -> Iterator[None]:
    """Set ``KOORD_QUEUE_CONFINED=1`` unless the environment says otherwise, before any of the
    session's processes start (autouse fixtures come first within their scope)."""
    with pytest.MonkeyPatch.context() as patch:
        if confined.ENV not in os.environ:
            patch.setenv(confined.ENV, "1")
        yield
