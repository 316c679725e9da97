"""The solve back-off's delays, RFC 8405's names in ms (:class:`BackoffPolicy`: the service's
``solve:`` settings).

Consumes: settings. Produces: the policy the service's solve scheduler
(:class:`linkguard.topology.backoff.SolveBackoff`) and the simulation engine apply. Here, below
the topology service, so that the settings (:mod:`linkguard.config`) need not import it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BackoffPolicy"]


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Delays in ms, with RFC 8405's names: INITIAL_SPF_DELAY (``initial_ms``),
    SHORT_SPF_DELAY (``short_ms``), LONG_SPF_DELAY
    (``long_ms``), TIME_TO_LEARN_INTERVAL (``time_to_learn_ms``), HOLDDOWN_INTERVAL
    (``holddown_ms``). Raises ValueError for a negative delay or ``holddown_ms`` below
    ``time_to_learn_ms`` (the RFC requires HOLDDOWN >= TIME_TO_LEARN)."""

    initial_ms: float = 0.0
    short_ms: float = 150.0
    long_ms: float = 1000.0
    time_to_learn_ms: float = 500.0
    holddown_ms: float = 3000.0

    def __post_init__(self) -> None:
        for name in ("initial_ms", "short_ms", "long_ms", "time_to_learn_ms", "holddown_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.holddown_ms < self.time_to_learn_ms:
            raise ValueError(
                f"holddown_ms ({self.holddown_ms}) must be >= time_to_learn_ms "
                f"({self.time_to_learn_ms}) (RFC 8405 section 6)"
            )
