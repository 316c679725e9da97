"""A port degraded on its error counters stays degraded across an agent restart.

The agent runs with the sysfs driver on a copy of the real gpud H100 tree
(../shared/fixtures/real), mutated; its state dir is a real directory kept between the runs;
the bus is the in-memory broker (nothing here is about MQTT). Stopping the agent object is what
its SIGTERM handler does (:func:`linkguard.agent.daemon.run_agent`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from structlog.testing import capture_logs

from linkguard.agent.daemon import Agent
from linkguard.agent.health import CounterHealthPolicy
from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.config import AgentSettings, PortConfig, ProbeRunSettings
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.drivers.sysfs_ib import read_port
from linkguard.membus import MemoryBroker
from linkguard.models import PortStatus
from tests.drivers.test_sysfs_ib import GPUD, copy_tree, put
from tests.support import until

UP, DEGRADED = PortStatus.UP, PortStatus.DEGRADED
REASON = "symbol_error 150/60s"


def _settings(tmp: Path, root: Path, clear_after_s: float) -> AgentSettings:
    return AgentSettings(
        host="gpu000",
        driver="sysfs",
        sysfs_root=root,
        verbs={"events": "off"},
        ports=[PortConfig(hca="mlx5_0", rail=0), PortConfig(hca="mlx5_1", rail=1)],
        endpoints=[ipaddress.IPv4Address("10.200.0.1"), ipaddress.IPv4Address("10.200.1.1")],
        routes={"apply": False},
        state_dir=tmp / "state",
        rail_map_path=tmp / "run" / "rail-map.json",
        metrics_listen=None,
        counter_health=CounterHealthPolicy(clear_after_s=clear_after_s),
    )


@asynccontextmanager
async def running(tmp: Path, root: Path, clear_after_s: float = 300.0) -> AsyncIterator[Agent]:
    agent = Agent(
        _settings(tmp, root, clear_after_s),
        table=MemoryRouteTable(),
        bus_factory=MemoryBroker().bus_factory,
    )
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: _status(agent, "mlx5_0/1") is not None, "mlx5_0/1 read")
        await until(lambda: _status(agent, "mlx5_1/1") is not None, "mlx5_1/1 read")
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def _status(agent: Agent, key: str) -> PortStatus | None:
    st = agent.monitor.state(key)
    return st.status if st is not None else None


def _saved(tmp: Path) -> dict:
    return json.loads((tmp / "state" / "counter_health.json").read_text())


async def test_counter_degradation_survives_a_restart_until_clear_after_s(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    errors = root / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error"
    assert errors.read_text().strip() == "0"
    async with running(tmp_path, root) as first:
        assert _status(first, "mlx5_0/1") == UP
        put(errors, "150\n")  # a dying optic: 150 symbol errors within the minute
        await until(lambda: _status(first, "mlx5_0/1") == DEGRADED, "degraded on counters")
        assert first.monitor.state("mlx5_0/1").reason == REASON  # type: ignore[union-attr]
        # the daemon writes the file after the monitor's verdict: absent until then
        path = tmp_path / "state" / "counter_health.json"
        await until(
            lambda: path.exists() and "mlx5_0/1" in _saved(tmp_path)["ports"], "the verdict saved"
        )
    saved = _saved(tmp_path)
    assert saved["version"] == 1 and list(saved["ports"]) == ["mlx5_0/1"]
    since = saved["ports"]["mlx5_0/1"]["since"]
    assert saved["ports"]["mlx5_0/1"]["reason"] == REASON and abs(since - time.time()) < 30

    # restarted (clear_after_s 300 s): degraded from its first reading, with its reason
    with capture_logs() as logs:
        async with running(tmp_path, root) as second:
            st = second.monitor.state("mlx5_0/1")
            assert st is not None and (st.status, st.reason) == (DEGRADED, REASON)
            assert _status(second, "mlx5_1/1") == UP  # the other port is untouched
    assert {"event": "counter_health_restored", "ports": ["mlx5_0/1"], "log_level": "info"} in logs
    assert _saved(tmp_path)["ports"]["mlx5_0/1"] == {"reason": REASON, "since": since}

    # restarted with clear_after_s 1.5 s and clean counters: degraded, then up only after
    # 1.5 s of clean readings taken by the new agent (the clear timer restarted at load)
    started = time.monotonic()
    async with running(tmp_path, root, clear_after_s=1.5) as third:
        st = third.monitor.state("mlx5_0/1")
        assert st is not None and (st.status, st.reason) == (DEGRADED, REASON)
        await until(lambda: _status(third, "mlx5_0/1") == UP, "cleared after clear_after_s")
        assert time.monotonic() - started >= 1.5
        await until(lambda: _saved(tmp_path)["ports"] == {}, "the cleared verdict saved")

    # and the next start has nothing to restore
    async with running(tmp_path, root) as fourth:
        assert _status(fourth, "mlx5_0/1") == UP


async def test_corrupt_or_unknown_counter_health_file_starts_clean(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    state = tmp_path / "state"
    state.mkdir()
    for text, error in [
        ('{"version": 1, "ports": {"mlx5_0/1": {"rea', "Unterminated string"),
        ('{"version": 2, "ports": {}}', "unknown version 2 (this agent reads 1)"),
        ('["mlx5_0/1"]', "not a JSON object with a ports object"),
        ('{"version": true, "ports": {}}', "unknown version True"),  # YAML/JSON true == 1
        ('{"version": 1, "ports": {}, "rates": [400]}', "and a rates object"),
    ]:
        (state / "counter_health.json").write_text(text)
        with capture_logs() as logs:
            async with running(tmp_path, root) as agent:
                assert _status(agent, "mlx5_0/1") == UP
                await until(
                    lambda: _saved(tmp_path)["version"] == 1 and _saved(tmp_path)["ports"] == {},
                    "rewritten",
                )
        bad = [e for e in logs if e["event"] == "counter_health_state_unreadable"]
        assert len(bad) == 1 and error in bad[0]["error"], logs
        # what this agent could not read is kept aside, not overwritten
        assert (state / "counter_health.json.bad").read_text() == text
        moved = [e for e in logs if e["event"] == "counter_health_state_moved_aside"]
        assert [e["to"] for e in moved] == [str(state / "counter_health.json.bad")]


async def test_verdicts_are_kept_while_counter_health_is_disabled(tmp_path: Path) -> None:
    """``counter_health: {enabled: false}`` applies no verdict but keeps the file's, and the
    next agent with it enabled again restores them."""
    root = copy_tree(tmp_path, GPUD)
    state = tmp_path / "state"
    state.mkdir()
    since = time.time() - 10
    doc = {
        "version": 1,
        "ports": {"mlx5_0/1": {"reason": REASON, "since": since}},
        "rates": {"mlx5_0/1": 400.0},
    }
    (state / "counter_health.json").write_text(json.dumps(doc))
    off = _settings(tmp_path, root, 300.0).model_copy(
        update={"counter_health": CounterHealthPolicy(enabled=False)}
    )
    with capture_logs() as logs:
        agent = Agent(off, table=MemoryRouteTable(), bus_factory=MemoryBroker().bus_factory)
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: _status(agent, "mlx5_1/1") == UP, "mlx5_1/1 read")
            await until(lambda: _status(agent, "mlx5_0/1") == UP, "not degraded: disabled")
            # a reference rate learnt on the other port rewrites the file: the verdict stays
            await until(lambda: "mlx5_1/1" in _saved(tmp_path)["rates"], "mlx5_1/1 rate saved")
        finally:
            agent.stop()
            await asyncio.wait_for(task, 10)
    kept = [e for e in logs if e["event"] == "counter_health_verdicts_kept"]
    assert [e["ports"] for e in kept] == [["mlx5_0/1"]]
    assert _saved(tmp_path)["ports"] == {"mlx5_0/1": {"reason": REASON, "since": since}}
    async with running(tmp_path, root) as again:  # enabled again: degraded from its start
        st = again.monitor.state("mlx5_0/1")
        assert st is not None and (st.status, st.reason) == (DEGRADED, REASON)


def test_restore_health_keeps_good_entries_and_ignores_malformed_ones(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    mon = PortMonitor(host="gpu000", policy=DampingPolicy())
    wall = 1_700_000_000.0
    with capture_logs() as logs:
        restored = mon.restore_health(
            {
                "mlx5_0/1": {"reason": REASON, "since": wall - 600},
                "mlx5_1/1": {"reason": "", "since": wall},  # empty reason
                "mlx5_4/1": {"since": wall},  # no reason
                "mlx5_5/1": {"reason": REASON, "since": "yesterday"},
                "mlx5_6/1": ["not", "a", "mapping"],  # type: ignore[dict-item]
                "bad name/1": {"reason": REASON, "since": wall},
            },
            now=10.0,
            wall=wall,
        )
    assert restored == ["mlx5_0/1"]
    ignored = [e["port"] for e in logs if e["event"] == "counter_health_history_ignored"]
    assert ignored == ["mlx5_1/1", "mlx5_4/1", "mlx5_5/1", "mlx5_6/1", "bad name/1"]
    assert mon.health_history(now=10.0, wall=wall) == {
        "mlx5_0/1": {"reason": REASON, "since": wall - 600}
    }
    for hca in ("mlx5_0", "mlx5_1"):
        mon.observe([read_port(root, hca, 1, now=11.0)], now=11.0, wall=wall + 1)
    assert mon.state("mlx5_0/1").status == DEGRADED  # type: ignore[union-attr]
    assert mon.state("mlx5_0/1").reason == REASON  # type: ignore[union-attr]
    assert mon.state("mlx5_1/1").status == UP  # type: ignore[union-attr]
    # counter health switched off: nothing is restored
    off = PortMonitor(
        host="gpu000", policy=DampingPolicy(), health=CounterHealthPolicy(enabled=False)
    )
    assert (
        off.restore_health({"mlx5_0/1": {"reason": REASON, "since": wall}}, now=0, wall=wall) == []
    )


async def test_a_port_back_slower_stays_degraded_across_a_restart(tmp_path: Path) -> None:
    """The learnt reference rate is saved: a new agent holds mlx5_0/1, which retrained from
    4X NDR to 2X NDR while no agent ran, to 400 Gb/s, not to what it reads first."""
    root = copy_tree(tmp_path, GPUD)
    rate = root / "mlx5_0" / "ports" / "1" / "rate"
    async with running(tmp_path, root):
        await until(
            lambda: (
                _saved(tmp_path).get("rates") == {"mlx5_0/1": 400.0, "mlx5_1/1": 400.0}
                if (tmp_path / "state" / "counter_health.json").exists()
                else False
            ),
            "both reference rates saved",
        )
    put(rate, "200 Gb/sec (2X NDR)\n")
    with capture_logs() as logs:
        async with running(tmp_path, root) as second:
            st = second.monitor.state("mlx5_0/1")
            assert st is not None and (st.status, st.reason) == (DEGRADED, "rate 200 < 400 Gb/s")
            assert _status(second, "mlx5_1/1") == UP
            put(rate, "400 Gb/sec (4X NDR)\n")  # retrained back to 4 lanes: up again
            await until(lambda: _status(second, "mlx5_0/1") == UP, "up at 400 Gb/s")
    restored = [e for e in logs if e["event"] == "reference_rates_restored"]
    assert restored[0]["rates"] == {"mlx5_0/1": 400.0, "mlx5_1/1": 400.0}
    # a configured expected_rate_gbps is the bar instead: the operator's way to accept a
    # port that now runs slower for good (a 200 Gb/s cable)
    put(rate, "200 Gb/sec (2X NDR)\n")
    settings = _settings(tmp_path, root, 300.0).model_copy(
        update={
            "ports": [
                PortConfig(hca="mlx5_0", rail=0, expected_rate_gbps=200.0),
                PortConfig(hca="mlx5_1", rail=1),
            ]
        }
    )
    agent = Agent(settings, table=MemoryRouteTable(), bus_factory=MemoryBroker().bus_factory)
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: _status(agent, "mlx5_0/1") is not None, "mlx5_0/1 read")
        assert _status(agent, "mlx5_0/1") == UP
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def test_restore_reference_rates_ignores_malformed_entries(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    put(root / "mlx5_0" / "ports" / "1" / "rate", "200 Gb/sec (2X NDR)\n")
    mon = PortMonitor(host="gpu000", policy=DampingPolicy())
    with capture_logs() as logs:
        restored = mon.restore_reference_rates(
            {
                "mlx5_0/1": 400.0,
                "mlx5_1/1": True,  # JSON true is not 1 Gb/s
                "mlx5_4/1": 4000,  # above any port (12X XDR: 2400 Gb/s), as hand-edited
                "mlx5_5/1": 0,
                "mlx5_7/1": 401,  # no width x lane rate: a typo, or an edit
                "mlx5_6/1": "400",
                "bad name/1": 400.0,
            }
        )
    assert restored == ["mlx5_0/1"]
    ignored = [e["port"] for e in logs if e["event"] == "reference_rate_ignored"]
    assert ignored == ["mlx5_1/1", "mlx5_4/1", "mlx5_5/1", "mlx5_7/1", "mlx5_6/1", "bad name/1"]
    assert mon.reference_rates() == {"mlx5_0/1": 400.0}  # kept until its port is read
    wall = 1_700_000_000.0
    mon.observe([read_port(root, "mlx5_0", 1, now=1.0)], now=1.0, wall=wall)
    st = mon.state("mlx5_0/1")
    assert st is not None and (st.status, st.reason) == (DEGRADED, "rate 200 < 400 Gb/s")


def test_a_verdict_saved_by_a_clock_ahead_counts_from_now() -> None:
    mon = PortMonitor(host="gpu000", policy=DampingPolicy())
    wall = 1_700_000_000.0
    with capture_logs() as logs:
        restored = mon.restore_health(
            {
                "mlx5_0/1": {"reason": REASON, "since": wall + 86_400},  # a day ahead
                "mlx5_1/1": {"reason": REASON, "since": wall + 30},  # within the slack
            },
            now=10.0,
            wall=wall,
        )
    assert restored == ["mlx5_0/1", "mlx5_1/1"]
    ahead = [e for e in logs if e["event"] == "counter_health_since_in_future"]
    assert [e["port"] for e in ahead] == ["mlx5_0/1"]
    assert mon.health_history(now=10.0, wall=wall) == {
        "mlx5_0/1": {"reason": REASON, "since": wall},
        "mlx5_1/1": {"reason": REASON, "since": wall + 30},
    }


def test_service_only_probe_keys_in_an_agent_config_are_said(tmp_path: Path) -> None:
    """An agent uses only probes.enabled; fan_out, rate_pps... given to it are ignored: said
    once at start so an operator does not think they took effect."""
    root = copy_tree(tmp_path, GPUD)
    given = _settings(tmp_path, root, 300.0).model_copy(
        update={"probes": ProbeRunSettings(enabled=False, fan_out=8, rate_pps=2)}
    )
    with capture_logs() as logs:
        Agent(given, table=MemoryRouteTable(), bus_factory=MemoryBroker().bus_factory)
    (said,) = [e for e in logs if e["event"] == "probe_settings_ignored"]
    assert said["keys"] == ["fan_out", "rate_pps"]
    with capture_logs() as logs:  # roce mode's own port is no key given
        roce = given.model_copy(update={"probes": ProbeRunSettings(enabled=False, mode="roce")})
        Agent(roce, table=MemoryRouteTable(), bus_factory=MemoryBroker().bus_factory)
    assert [e["keys"] for e in logs if e["event"] == "probe_settings_ignored"] == [["mode"]]


def test_saved_entries_of_ports_no_longer_watched_are_dropped() -> None:
    """mlx5_1 removed from ``ports:``: its saved verdict and learnt rate are not restored
    (the agent then rewrites counter_health.json without them)."""
    mon = PortMonitor(host="gpu000", policy=DampingPolicy(), rails={"mlx5_0/1": 0})
    verdict = {"reason": REASON, "since": 1_700_000_000.0}
    with capture_logs() as logs:
        assert mon.restore_reference_rates({"mlx5_0/1": 400.0, "mlx5_1/1": 400.0}) == ["mlx5_0/1"]
        restored = mon.restore_health(
            {"mlx5_0/1": verdict, "mlx5_1/1": verdict}, now=0.0, wall=1_700_000_010.0
        )
    assert restored == ["mlx5_0/1"]
    dropped = {e["event"]: e["ports"] for e in logs if e["event"].endswith("_dropped")}
    assert dropped == {
        "reference_rates_dropped": ["mlx5_1/1"],
        "counter_health_history_dropped": ["mlx5_1/1"],
    }
