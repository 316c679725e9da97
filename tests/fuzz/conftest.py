"""Fixtures of the fuzz property tests: the real captures, for module-scoped users."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FIXTURES


@pytest.fixture(scope="session")
def real_fixtures() -> Path:
    """``../shared/fixtures/real`` (or ``$LINKGUARD_FIXTURES``); the test fails without it."""
    if not FIXTURES.is_dir():
        pytest.fail(
            f"real fixtures not found at {FIXTURES} (set LINKGUARD_FIXTURES to their directory)"
        )
    return FIXTURES
