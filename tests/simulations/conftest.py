"""Fixtures of the simulation tests: real runs that several tests read, made once."""

from __future__ import annotations

import asyncio

import pytest

from linkguard.simulations import live
from linkguard.simulations.scenario import SCENARIOS_DIR, load_scenario
from tests.simulations.realdecisions import RecordedRun, recording_decisions
from tests.support import require_binary


@pytest.fixture(scope="session")
def single_link_down_over_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> RecordedRun:
    """single-link-down over Mosquitto (:func:`live.run`, what ``sim run --bus mosquitto``
    runs), with the agent cores' decisions recorded: run once for test_live.py and
    test_engine_vs_processes.py (about 14 s each time)."""
    require_binary("mosquitto")
    loaded = load_scenario(SCENARIOS_DIR / "single-link-down.yaml")
    with recording_decisions() as (applied, fast):
        workdir = tmp_path_factory.mktemp("live")
        report = asyncio.run(live.run(loaded, bus="mosquitto", workdir=workdir))
    return RecordedRun(report, dict(applied), list(fast))
