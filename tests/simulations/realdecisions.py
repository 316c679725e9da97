"""The agent cores' decisions in a real run (:func:`linkguard.simulations.live.run`: real agents
and a real service over a private Mosquitto), recorded where :class:`AgentCore` makes them: the
plans of the ``ApplyPlan`` effects :meth:`AgentCore.on_plan` and
:meth:`AgentCore.on_peer_routes` return (what the executor puts in the route table), and the
fast paths :meth:`AgentCore.fast_path_applied` is told were applied (an ack: the plan had a
backup). The methods are wrapped, not replaced: each still returns what it returned.

The one real single-link-down run over Mosquitto that test_live.py and
test_engine_vs_processes.py both read is made once (``tests/simulations/conftest.py``).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from linkguard.agent.core import AgentCore
from linkguard.agent.effects import ApplyPlan, Effect
from linkguard.models import Ack, Plan
from linkguard.simulations.live import LiveReport


@dataclass(frozen=True)
class RecordedRun:
    """A real run's report, the plans each host's core put in place (in order) and the fast
    paths taken (host, ``"hca/port"``, in the order acked)."""

    report: LiveReport
    applied: dict[str, list[Plan]]
    fast: list[tuple[str, str]]


@contextlib.contextmanager
def recording_decisions() -> Iterator[tuple[dict[str, list[Plan]], list[tuple[str, str]]]]:
    """While inside: every agent core's plans put in place per host, and its fast paths."""
    applied: dict[str, list[Plan]] = defaultdict(list)
    fast: list[tuple[str, str]] = []

    def recording(method: Callable[..., list[Effect]]) -> Callable[..., list[Effect]]:
        def wrapper(self: AgentCore, *args: Any, **kw: Any) -> list[Effect]:
            effects = method(self, *args, **kw)
            applied[self.host] += [e.plan for e in effects if isinstance(e, ApplyPlan)]
            return effects

        return wrapper

    fast_path_applied = AgentCore.fast_path_applied

    def fast_path(self: AgentCore, port: str, ack: Ack | None) -> list[Effect]:
        if ack is not None:
            fast.append((self.host, port))
        return fast_path_applied(self, port, ack)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AgentCore, "on_plan", recording(AgentCore.on_plan))
        mp.setattr(AgentCore, "on_peer_routes", recording(AgentCore.on_peer_routes))
        mp.setattr(AgentCore, "fast_path_applied", fast_path)
        yield applied, fast
