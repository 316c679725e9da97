"""The engine and the real processes decide the same: one scenario replayed on the simulated
clock (:func:`linkguard.simulations.engine.replay`, the cores driven in-simulation) and with
the real service and agents over a private Mosquitto (:func:`linkguard.simulations.live.run`,
what ``sim run --bus mosquitto`` runs). Each host must put the same plans in place, in the
same order (their content: epochs and issue times are each run's own), and the same ports
must get the agents' fast path.

In the real run the decisions are recorded where the agent core makes them
(:mod:`tests.simulations.realdecisions`). The single-link-down run is the one test_live.py
reads (``single_link_down_over_mosquitto``, made once).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from linkguard.models import Plan
from linkguard.simulations import live
from linkguard.simulations.engine import replay
from linkguard.simulations.scenario import SCENARIOS_DIR, load_scenario
from tests.simulations.realdecisions import RecordedRun, recording_decisions
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


@pytest.mark.real
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["fast-path-only", "single-link-down"])
def test_engine_and_real_processes_decide_the_same(
    name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    require_binary("mosquitto")
    loaded = load_scenario(SCENARIOS_DIR / f"{name}.yaml")

    model, hosts = replay(loaded, keep_plans=True)
    assert model.passed, model.failures
    model_fast = [(f["host"], f["port"]) for f in model.fast_paths]
    assert model_fast, "the scenario must exercise the fast path"

    if name == "single-link-down":  # the run test_live.py reads too: made once
        run: RecordedRun = request.getfixturevalue("single_link_down_over_mosquitto")
    else:
        with recording_decisions() as (applied, fast):
            report = asyncio.run(live.run(loaded, bus="mosquitto", workdir=tmp_path))
        run = RecordedRun(report, dict(applied), list(fast))
    real, applied, real_fast = run.report, run.applied, run.fast
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
