"""The engine and the real processes decide the same: one scenario replayed on the simulated
clock (:func:`linkguard.simulations.engine.replay`, the cores driven in-simulation) and with
the real service and agents over a private Mosquitto (:func:`linkguard.simulations.live.run`,
what ``sim run --bus mosquitto`` runs). Each host must put the same plans in place, in the
same order (their content: epochs and issue times are each run's own), and the same ports
must get the agents' fast path.

In the real run the decisions are recorded where the agent core makes them: the plans of the
``ApplyPlan`` effects :meth:`AgentCore.on_plan` and :meth:`AgentCore.on_peer_routes` return
(what the executor puts in the route table), and the fast paths
:meth:`AgentCore.fast_path_applied` is told were applied (an ack: the plan had a backup).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from linkguard.agent.core import AgentCore
from linkguard.agent.effects import ApplyPlan, Effect
from linkguard.models import Ack, Plan
from linkguard.simulations import live
from linkguard.simulations.engine import replay
from linkguard.simulations.scenario import SCENARIOS_DIR, load_scenario
from tests.support import require_binary


def distinct(plans: list[Plan]) -> list[Plan]:
    """``plans`` without a plan whose content (all but epoch, term, issue time) repeats the
    one before it: an agent that re-applies what it has (a compact plan expanded again with
    peer routes of the same content) changes no route."""
    out: list[Plan] = []
    for p in plans:
        if not out or not p.same_assignments(out[-1]):
            out.append(p)
    return out


def record_real_decisions(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, list[Plan]], list[tuple[str, str]]]:
    """Wrap the agent core's decisions: plans put in place per host, fast paths taken."""
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

    monkeypatch.setattr(AgentCore, "on_plan", recording(AgentCore.on_plan))
    monkeypatch.setattr(AgentCore, "on_peer_routes", recording(AgentCore.on_peer_routes))
    monkeypatch.setattr(AgentCore, "fast_path_applied", fast_path)
    return applied, fast


@pytest.mark.real
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["fast-path-only", "single-link-down"])
def test_engine_and_real_processes_decide_the_same(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_binary("mosquitto")
    loaded = load_scenario(SCENARIOS_DIR / f"{name}.yaml")

    model, hosts = replay(loaded, keep_plans=True)
    assert model.passed, model.failures
    model_fast = [(f["host"], f["port"]) for f in model.fast_paths]
    assert model_fast, "the scenario must exercise the fast path"

    applied, real_fast = record_real_decisions(monkeypatch)
    real = asyncio.run(live.run(loaded, bus="mosquitto", workdir=tmp_path))
    assert real.passed, real.failures
    # `expect: fast_path` held in both (the real run: every one-host port fault was acked)
    for report in (model, real):
        held = [e.held for e in report.expectations if e.name == "fast_path"]
        assert held == ([True] if loaded.scenario.expect.fast_path else [])

    # the same fast paths (the real run's in the order acked; the model's in time order)
    assert sorted(real_fast) == sorted(model_fast)
    # the same plans, host by host, in the same order
    assert sorted(applied) == sorted(hosts)
    for host, sim in sorted(hosts.items()):
        assert sim.plans is not None
        mine, theirs = distinct(sim.plans), distinct(applied[host])
        assert len(mine) == len(theirs) >= 2, (host, len(mine), len(theirs))
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            assert a.same_assignments(b), f"{host}: plan {i} differs"
        # each run's epochs never go back (an expansion with new peer routes may keep it)
        for plans in (mine, theirs):
            epochs = [p.epoch for p in plans]
            assert epochs == sorted(epochs) and epochs[0] < epochs[-1]
