"""Issue 6, part 3 ("Faults survived"): the faults not already proven elsewhere, each on real
processes (a private Mosquitto, the real agent and service, real MQTT clients).

* broker down: agents keep their last plan and their fast path, and publish the *current* port
  state on reconnect, never a replay of the states they could not send;
* topology service killed (SIGKILL, a ``linkguard topology serve`` process) and restarted: it
  rebuilds from the retained states, publishes nothing while its plans equal the retained ones
  (the hosts' tables see no route written or deleted), and plans above the old epochs;
* a clock jump on a host (wall clock +-1 h, monotonic clock running normally): the hold-down ends
  on the monotonic schedule and no flap is invented; every damping decision takes a monotonic
  ``now`` (checked in the code below).

The machine's clock is never changed: the agent's module-level ``time`` is swapped for one whose
``time()`` jumps while ``monotonic()`` is the real one. The "Faults survived" section of
docs/operations.md maps every fault of the issue to its test, here or elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time as real_time
from itertools import accumulate
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import linkguard.agent.daemon as daemon_module
from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.broker import free_port
from linkguard.bus import Bus, BusMessage
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import PortState, PortStatus, decode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.conftest import start_mosquitto
from tests.support import topology_serve, until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOSTS = FABRIC.host_names
ME = HOSTS[0]
#: a broker outage long enough for the agents' reconnect backoff (0.05 s doubling to 0.3 s) to
#: sit at its cap for many attempts: a 60 s outage is the same loop, only more attempts
OUTAGE_S = 3.0


def _agent(tmp: Path, host: str, port: int, damping: DampingPolicy) -> Agent:
    s = agent_settings_for(
        FABRIC,
        host,
        workdir=tmp,
        bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
        damping=damping,
    )
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(host).hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[])


def _stop_broker(broker) -> None:
    broker.process.terminate()
    broker.process.wait(5)


async def _stop_all(agents: list[Agent], tasks: list[asyncio.Task], service=None) -> None:
    for a in agents:
        a.stop()
    if service is not None:
        service.stop()
    _, pending = await asyncio.wait(tasks, timeout=15)
    for t in pending:
        t.cancel()
    assert not pending, f"{len(pending)} task(s) ignored stop"


# -- (1) broker down -------------------------------------------------------------------------


@pytest.mark.real
async def test_broker_outage_keeps_plan_and_fast_path_then_publishes_current_state(
    mosquitto, tmp_path: Path
) -> None:
    """Why a few seconds stand for 60: nothing on either side counts the outage's length. The
    agent's MQTT session is clean (the broker keeps no session or queue for it: nothing is
    replayed, nothing expires); a publish while disconnected is dropped, not queued
    (``Bus.publish`` returns False); the monitor keeps one current state per port and the agent
    re-announces a snapshot of it on every connect; the applier's plan has no age limit; and
    the reconnect backoff is capped (``reconnect_max_s``), reached here after ~0.5 s. A broker
    that is stopped closes the TCP connection, so the keepalive (15 s) plays no part."""
    port = mosquitto.port
    damping = DampingPolicy(hold_down_initial_s=60, hold_down_max_s=300)
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
            startup_settle_s=0,
        ),
        fabric=FABRIC,
    )
    agents = {h: _agent(tmp_path, h, port, damping) for h in HOSTS}
    me = agents[ME]
    tasks = [asyncio.create_task(service.run())]
    tasks += [asyncio.create_task(a.run()) for a in agents.values()]
    broker = mosquitto
    try:
        await until(
            lambda: all(
                h in service.state.plans
                and a.applier.applied_epoch == service.state.plans[h].epoch > 0
                for h, a in agents.items()
            ),
            "first plans applied",
        )
        plan, epoch = me.applier.plan, me.applier.applied_epoch
        nominal = dict(me.table.routes)
        assert nominal and me.table.routes == me.applier.installed

        _stop_broker(broker)
        t_down = real_time.monotonic()
        await until(lambda: not me.bus.connected.is_set(), "the agent sees the broker gone")

        # two flaps while the broker is away: DOWN, HELD_DOWN, DOWN, HELD_DOWN (none sent)
        me.source.link_down("mlx5_1")
        await until(lambda: me.stats.fast_paths == 1, "the fast path, without a bus")
        assert me.applier.plan is plan and me.applier.applied_epoch == epoch  # plan kept
        fast = dict(me.table.routes)
        assert fast != nominal and fast == me.applier.installed
        me.source.link_up("mlx5_1")
        await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.HELD_DOWN, "held")
        me.source.link_down("mlx5_1")
        await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.DOWN, "down")
        # never re-admitted, so nothing to move again: still the one fast path
        assert me.stats.fast_paths == 1 and me.table.routes == fast
        me.source.link_up("mlx5_1")
        await until(
            lambda: (
                (me.monitor.state("mlx5_1/1").status, me.monitor.state("mlx5_1/1").damping.flaps)
                == (PortStatus.HELD_DOWN, 2)
            ),
            "held again after the second flap",
        )
        assert me.table.routes == fast  # the fast path holds through the hold-down
        await asyncio.sleep(max(0.0, OUTAGE_S - (real_time.monotonic() - t_down)))
        assert me.bus.connects == 1 and not me.bus.connected.is_set()

        got: list[PortState] = []

        async def handler(m: BusMessage) -> None:
            got.append(decode(PortState, m.payload, topic=m.topic, expect_host=ME))

        (tmp_path / "again").mkdir()
        broker = start_mosquitto(tmp_path / "again", port=port)  # persistence off: empty
        async with Bus(
            host="127.0.0.1",
            port=port,
            client_id="watcher",
            subscriptions=[topics.port_state(ME, "mlx5_1", 1)],
            handler=handler,
        ) as watcher:
            await watcher.wait_connected(10)
            await until(lambda: me.bus.connects == 2, "the agent reconnects", timeout=10)
            key = (ME, "mlx5_1/1")
            await until(
                lambda: (
                    key in service.state.ports
                    and service.state.ports[key].status == PortStatus.HELD_DOWN
                ),
                "the service has the current state",
            )
            await until(lambda: got, "the state at a fresh subscriber")
            # the current state only: never the DOWN the agent could not send
            assert {(s.status, s.damping.flaps) for s in got} == {(PortStatus.HELD_DOWN, 2)}
            assert service.state.ports[key].damping.flaps == 2
            # the service plans around the held port; the agent applies it without churn
            await until(
                lambda: me.applier.applied_epoch == service.state.plans[ME].epoch > epoch,
                "the new plan applied",
            )
            assert me.table.routes == me.applier.installed
            assert {(s.status, s.damping.flaps) for s in got} == {(PortStatus.HELD_DOWN, 2)}
    finally:
        try:
            await _stop_all(list(agents.values()), tasks, service)
        finally:
            _stop_broker(broker)


# -- (2) topology service killed and restarted -------------------------------------------------


def _serve(fabric: Path, port: int, log: Path) -> subprocess.Popen:
    """``linkguard topology serve`` on the private broker, as a process of its own."""
    return topology_serve(fabric, port, log, settle_s=0.5)


async def _until_logged(
    log: Path, event: str, *, after: int, timeout: float = 20, where=lambda doc: True
) -> dict:
    """The first JSON log line ``event`` (for which ``where`` holds) of the service log after
    the ``after``-th restart (``topology_starting`` lines) of the processes writing ``log``."""
    found: list[dict] = []

    def seen() -> bool:
        starts = -1
        for line in log.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            starts += doc.get("event") == "topology_starting"
            if starts == after and doc.get("event") == event and where(doc):
                found.append(doc)
                return True
        return False

    await until(seen, f"{event} in {log.name}", timeout)
    return found[0]


@pytest.mark.real
async def test_service_sigkill_and_restart_rebuilds_from_retained_without_route_churn(
    mosquitto, tmp_path: Path
) -> None:
    """The service runs as ``linkguard topology serve`` and is SIGKILLed while gpu000's rail 1
    is down. The new process learns that only from the retained port states (the agents stay
    connected and send nothing new). Its first solve equals the retained plans, so it publishes
    no message at all (the service diffs against retained plans: "re-issue" of an unchanged
    plan is a no-op by design) and no table changes; its epochs start above the retained ones,
    so its next plans (after another port fails) are applied, none refused as a replay."""
    port = mosquitto.port
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(dump_fabric(FABRIC, "yaml"))
    log = tmp_path / "service.log"
    agents = {h: _agent(tmp_path, h, port, DampingPolicy(hold_down_initial_s=60)) for h in HOSTS}
    tasks = [asyncio.create_task(a.run()) for a in agents.values()]
    service = _serve(fabric, port, log)
    try:
        await until(
            lambda: all((a.applier.applied_epoch or 0) > 0 for a in agents.values()),
            "first plans applied",
            timeout=20,
        )
        me = agents[ME]
        me.source.link_down("mlx5_1")
        first = me.applier.applied_epoch
        await until(
            lambda: (
                me.applier.applied_epoch > first
                and me.monitor.state("mlx5_1/1").status == PortStatus.DOWN
            ),
            "the plan around gpu000's rail 1",
            timeout=20,
        )
        # every host through that solve (gpu001 acks the peer routes of it), not only gpu000
        await _until_logged(
            log, "plans_acked", after=0, where=lambda d: d["epoch"] >= me.applier.applied_epoch
        )
        before = {h: (a.applier.applied_epoch, dict(a.table.routes)) for h, a in agents.items()}
        changes = {h: a.table.changes for h, a in agents.items()}
        assert before[ME][1] == me.applier.installed

        service.send_signal(signal.SIGKILL)
        assert service.wait(5) == -signal.SIGKILL
        service = _serve(fabric, port, log)
        # its first solve, from the retained port states, knows rail 1 of gpu000 is down and
        # matches the retained plans: it publishes nothing (no message, so no churn at all)
        restarted = await _until_logged(log, "plans_published", after=1)
        assert restarted["unusable"] == [f"{ME}:[1]"] and restarted["messages"] == 0
        assert restarted["epoch"] > max(e for e, _ in before.values())
        for h, a in agents.items():
            assert (a.applier.applied_epoch, a.table.routes) == before[h], h
            assert a.table.changes == changes[h], h
        assert me.bus.connects == 1  # nothing was re-announced: retained states only
        # its next plans are above the old service's epochs, so agents take them (an epoch
        # not newer is refused as a replay)
        other = agents[HOSTS[1]]
        other.source.link_down("mlx5_0")
        await until(
            lambda: all(a.applier.applied_epoch > before[h][0] for h, a in agents.items()),
            "the restarted service's plans applied",
            timeout=20,
        )
        assert other.table.routes != before[HOSTS[1]][1]
        assert sum(a.stats.plans_refused.total() for a in agents.values()) == 0
    finally:
        service.kill()
        service.wait(5)
        await _stop_all(list(agents.values()), tasks)


# -- (4) clock jumps on a host -------------------------------------------------------------


class _JumpingWallClock:
    """Stands in for the ``time`` module of :mod:`linkguard.agent.daemon`: ``time()`` is the
    real wall clock plus ``offset`` (s), ``monotonic()`` the real monotonic clock."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return real_time.time() + self.offset

    def monotonic(self) -> float:
        return real_time.monotonic()

    def __getattr__(self, name: str) -> object:
        return getattr(real_time, name)


HOLD_S = 1.0


@pytest.mark.parametrize("jump_s", [3600.0, -3600.0], ids=["wall+1h", "wall-1h"])
async def test_wall_clock_jump_changes_no_hold_down_and_invents_no_flap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jump_s: float
) -> None:
    """A real agent (its monitor, timer and fast path; no broker needed) whose wall clock
    jumps by ``jump_s`` during a hold-down: were the hold-down on the wall clock, +1 h would
    end it at once and -1 h would keep the port out for an hour. It ends ``HOLD_S`` after the
    return on the monotonic clock, and the port's events are exactly down, held, up."""
    clock = _JumpingWallClock()
    monkeypatch.setattr(daemon_module, "time", clock)
    damping = DampingPolicy(hold_down_initial_s=HOLD_S, hold_down_max_s=10)
    agent = _agent(tmp_path, ME, free_port(), damping)
    with capture_logs() as logs:
        task = asyncio.create_task(agent.run())
        try:
            await until(lambda: agent.monitor.state("mlx5_1/1") is not None, "first reading")
            agent.source.link_down("mlx5_1")
            await until(lambda: agent.monitor.state("mlx5_1/1").status == PortStatus.DOWN, "down")
            t0 = real_time.monotonic()
            agent.source.link_up("mlx5_1")
            await until(
                lambda: agent.monitor.state("mlx5_1/1").status == PortStatus.HELD_DOWN, "held"
            )
            t1 = real_time.monotonic()
            clock.offset = jump_s
            await until(
                lambda: agent.monitor.state("mlx5_1/1").status == PortStatus.UP,
                "the end of the hold-down",
                timeout=HOLD_S + 5,
            )
            t_up = real_time.monotonic()
            # the return was read between t0 and t1; it ends HOLD_S later, polled every 10 ms
            assert t0 + HOLD_S <= t_up <= t1 + HOLD_S + 0.5, (t0, t1, t_up)
            st = agent.monitor.state("mlx5_1/1")
            assert st.damping.flaps == 1
            # the wall clock is only copied into what is published
            assert abs(st.observed_at - (real_time.time() + jump_s)) < 5
            # the next hold-down, should a flap follow, is the backoff's second step, not more
            assert st.damping.hold_down_s == HOLD_S
        finally:
            agent.stop()
            await asyncio.wait_for(task, 10)
    events = [
        (e["previous"], e["current"])
        for e in logs
        if e["event"] == "port_event" and e["port"] == "mlx5_1/1"
    ]
    assert events == [
        ("unknown", "up"),  # the first reading
        ("up", "down"),
        ("down", "held_down"),
        ("held_down", "up"),
    ]


def test_monitor_decisions_ignore_the_wall_clock() -> None:
    """The pure monitor, in both damping modes, fed one timeline twice: once with a steady wall
    clock and once with a wall clock that jumps +1 h, -2 h, +1 h between the readings. The
    statuses, events, damping figures and deadlines are identical; only ``observed_at`` and the
    events' ``at`` differ."""
    src = SimulatedPortSource([active_port("mlx5_0"), active_port("mlx5_1")])
    down, up = src.link_down("mlx5_1"), src.link_up("mlx5_1")
    first = [active_port("mlx5_0"), active_port("mlx5_1")]
    # (monotonic s, batch): three flaps, then quiet ticks past every hold-down and reuse
    timeline = [(0.0, first)]
    for i in range(3):
        timeline += [(10.0 + 5 * i, [down]), (11.0 + 5 * i, [up])]
    timeline += [(t, None) for t in (30.0, 60.0, 120.0, 300.0, 700.0, 1500.0)]
    # the wall clock's offset (s) from steady at each step: +1 h, back, -1 h, ...
    offsets = list(accumulate([0, 3600, -3600, -3600, 3600, 3600, -7200, 0, 3600, 0, -3600, 0, 0]))

    def run(mode: str, jumping: bool) -> list[tuple]:
        mon = PortMonitor(
            host=ME,
            policy=DampingPolicy(mode=mode, hold_down_initial_s=2, half_life_s=30),
            rails={"mlx5_0/1": 0, "mlx5_1/1": 1},
        )
        wall, out = 1.7e9, []
        for (now, batch), offset in zip(timeline, offsets, strict=True):
            w = wall + now + (offset if jumping else 0)
            res = mon.observe(batch, now=now, wall=w) if batch else mon.tick(now=now, wall=w)
            out.append(
                (
                    res.next_deadline,
                    [(s.key, s.status, s.damping.model_dump()) for s in res.states],
                    [(e.hca, e.previous, e.current) for e in res.events],
                )
            )
        return out

    for mode in ("backoff", "penalty"):
        steady, jumped = run(mode, False), run(mode, True)
        assert jumped == steady, mode
        # and the timeline did exercise damping: a hold-down, a flap count
        assert any(s[1] == PortStatus.HELD_DOWN for step in steady for s in step[1])


def test_every_damping_decision_takes_a_monotonic_now() -> None:
    """The code check behind the two tests above: the monitor reads no clock at all, and every
    call into it from the agent passes ``now=time.monotonic()`` (``wall`` only for stamps); the
    agent's timer sleeps until a monotonic deadline."""
    root = Path(daemon_module.__file__).parent
    monitor_src = (root / "monitor.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+(time|datetime)\b", monitor_src, re.M)
    assert "time.time(" not in monitor_src and "datetime" not in monitor_src
    daemon_src = (root / "daemon.py").read_text()
    # the wiring and the executors call the monitor and the state files (which call it with
    # the ``now`` they are given) with a monotonic now
    wiring_src = daemon_src + (root / "executor.py").read_text()
    files_src = (root / "statefiles.py").read_text()
    pattern = r"self\.monitor\.(observe|tick|history|restore)\(([^)]*\)?[^)]*)\)"
    calls = re.findall(pattern, wiring_src)
    file_calls = re.findall(pattern, files_src)
    assert {name for name, _ in calls + file_calls} == {"observe", "tick", "history", "restore"}
    for name, args in calls:
        assert "now=time.monotonic()" in args, (name, args)
    for name, args in file_calls:
        assert "now=now" in args, (name, args)
    saves = re.findall(
        r"self\.files\.(save_history|restore_history)\(([^)]*\)?[^)]*)\)", wiring_src
    )
    assert {name for name, _ in saves} == {"save_history", "restore_history"}
    for name, args in saves:
        assert "now=time.monotonic()" in args, (name, args)
    assert "self._deadline - time.monotonic()" in daemon_src
