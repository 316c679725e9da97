"""hypothesis settings of the fuzz property tests, by ``$HYPOTHESIS_PROFILE``.

``ci`` (the default): 200 examples per test, so the normal suite stays fast; ``long``:
5,000; ``nightly``: 50,000. Any other name is a profile registered with hypothesis. No
deadline (a first example pays for imports and the live fleet), no example database (the
tests run in fresh clones), and the slow-data health checks off (real dumps are large).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["FUZZ", "PROFILES"]

_BASE = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
}
PROFILES = {
    "ci": settings(max_examples=200, **_BASE),
    "long": settings(max_examples=5_000, **_BASE),
    "nightly": settings(max_examples=50_000, **_BASE),
}
_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
#: decorator for every fuzz property test
FUZZ = PROFILES[_NAME] if _NAME in PROFILES else settings(settings.get_profile(_NAME), **_BASE)
