"""Outages that start and end while the topology service or the broker is away reach the
ledger once, with the agent's own times (the agents' event journal, :mod:`linkguard.agent.
journal`, and the service's :mod:`linkguard.topology.journaldesk`).

Real processes: a private Mosquitto, the service as ``linkguard topology serve`` (SIGTERMed or
SIGKILLed, then started again) or the real :class:`TopologyService` over a broker that is
stopped and started again, and the real :class:`~linkguard.agent.daemon.Agent` daemons with a
simulated port source. The report is the ledger's own (:meth:`Ledger.report`, what
``linkguard report`` prints).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import pytest

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.ledger import Ledger
from linkguard.models import PortEvent, PortStatus
from linkguard.settings.servicesections import LedgerSettings
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.conftest import start_mosquitto
from tests.support import topology_serve, until

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOSTS = FABRIC.host_names
ME = HOSTS[0]
#: the agent's time (``at``) of an event and the ledger's agree to this (s): the same number,
#: through JSON and SQLite
TOLERANCE_S = 0.01


def _agent(tmp: Path, host: str, port: int, journal_max_events: int = 1024) -> Agent:
    s = agent_settings_for(
        FABRIC,
        host,
        workdir=tmp,
        bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
        damping=DampingPolicy(hold_down_initial_s=0.3, hold_down_max_s=1),
    ).model_copy(update={"journal_max_events": journal_max_events})
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(host).hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[])


def _serve(fabric: Path, port: int, ledger: Path, log: Path) -> subprocess.Popen:
    return topology_serve(
        fabric, port, log, settle_s=0.2, env={"LINKGUARD_LEDGER__PATH": str(ledger)}
    )


async def _stop_agents(agents: dict[str, Agent], tasks: list[asyncio.Task]) -> None:
    for a in agents.values():
        a.stop()
    _, pending = await asyncio.wait(tasks, timeout=15)
    for t in pending:
        t.cancel()
    assert not pending, f"{len(pending)} agent task(s) ignored stop"


async def _flap_while_away(me: Agent) -> tuple[PortEvent, PortEvent]:
    """gpu000's rail 1 goes down and comes back (into its hold-down): the journal's down
    event and the first one out of down (the agent's own times)."""
    assert me.core.journal is not None
    start = me.core.journal.next_seq
    me.source.link_down("mlx5_1")
    await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.DOWN, "down")
    await asyncio.sleep(0.4)  # the outage lasts a while
    me.source.link_up("mlx5_1")
    await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.HELD_DOWN, "held")
    mine = [e for e in me.core.journal.held if e.hca == "mlx5_1" and (e.seq or 0) >= start]
    down = next(e for e in mine if e.current == PortStatus.DOWN)
    back = next(e for e in mine if (e.seq or 0) > (down.seq or 0))
    assert back.current == PortStatus.HELD_DOWN and back.at - down.at >= 0.4
    return down, back


def _assert_once(ledger: Path, down: PortEvent, back: PortEvent) -> None:
    """The report shows the outage once, from the agent's down to its leaving down, and the
    per-rail table the same down time; the port events once each."""
    with Ledger(ledger, create=False) as led:
        rep = led.report()
        rows = led._conn.execute(
            "SELECT at, previous, current, seq FROM port_events WHERE host=? AND hca=?"
            " ORDER BY seq",
            (ME, "mlx5_1"),
        ).fetchall()
    mine = [o for o in rep.outages if abs(o["at"] - down.at) < 5]
    assert len(mine) == 1, rep.outages
    assert len(rep.outages) == 1, rep.outages
    o = mine[0]
    assert o["at"] == pytest.approx(down.at, abs=TOLERANCE_S)
    assert o["down_s"] == pytest.approx(back.at - down.at, abs=TOLERANCE_S)
    assert not o["open"]
    rail1 = next(r for r in rep.per_rail if r["rail"] == 1)
    assert rail1["down_s"] == pytest.approx(back.at - down.at, abs=TOLERANCE_S)
    assert rail1["flaps"] == 1
    seqs = [r[3] for r in rows]
    assert len(seqs) == len(set(seqs))  # each event once
    downs = [r for r in rows if r[2] == "down"]
    assert [(r[0], r[1]) for r in downs] == [(pytest.approx(down.at, abs=1e-6), "up")]


@pytest.mark.real
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_outage_while_the_service_is_down_reaches_the_ledger_once(
    mosquitto, tmp_path: Path, sig: signal.Signals
) -> None:
    """The service process is stopped (``sig``); gpu000's rail 1 goes down and back (into
    its hold-down) while no service listens; the service starts again. The agents stay
    connected: what the new service learns of the outage comes from the journal's replay
    (its retained port states only say the port is held down now)."""
    port = mosquitto.port
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(dump_fabric(FABRIC, "yaml"))
    ledger, log = tmp_path / "ledger.sqlite3", tmp_path / "service.log"
    agents = {h: _agent(tmp_path, h, port) for h in HOSTS}
    tasks = [asyncio.create_task(a.run()) for a in agents.values()]
    service = _serve(fabric, port, ledger, log)
    me = agents[ME]
    try:
        await until(
            lambda: all((a.applier.applied_epoch or 0) > 0 for a in agents.values()),
            "first plans applied",
            timeout=20,
        )
        assert me.core.journal is not None
        await until(lambda: not me.core.journal.held, "the start events confirmed", timeout=10)
        service.send_signal(sig)
        assert service.wait(10) == (0 if sig == signal.SIGTERM else -sig)  # TERM: a clean stop
        down, back = await _flap_while_away(me)
        service = _serve(fabric, port, ledger, log)
        await until(lambda: not me.core.journal.held, "the replayed events confirmed", timeout=20)
        assert me.bus.connects == 1  # the agent never reconnected: a replay, not a re-announce
        service.send_signal(signal.SIGTERM)
        assert service.wait(10) == 0
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(5)
        await _stop_agents(agents, tasks)
    _assert_once(ledger, down, back)


@pytest.mark.real
async def test_outage_across_a_broker_outage_reaches_the_ledger_once(
    mosquitto, tmp_path: Path
) -> None:
    """The broker stops; gpu000's rail 1 goes down and back while it is away (the agent's
    publishes go nowhere); a new broker (nothing retained) starts on the same port. The
    outage is in the ledger with the agent's start and length, not the reconnect's time,
    and the per-rail table's down time matches it."""
    port = mosquitto.port
    ledger = tmp_path / "ledger.sqlite3"
    bus = BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3)
    service = TopologyService(
        ServiceSettings(bus=bus, startup_settle_s=0, ledger=LedgerSettings(path=ledger)),
        fabric=FABRIC,
    )
    agents = {h: _agent(tmp_path, h, port) for h in HOSTS}
    me = agents[ME]
    svc_task = asyncio.create_task(service.run())
    tasks = [asyncio.create_task(a.run()) for a in agents.values()]
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
        assert me.core.journal is not None
        await until(lambda: not me.core.journal.held, "the start events confirmed", timeout=10)
        broker.process.terminate()
        broker.process.wait(5)
        await until(lambda: not me.bus.connected.is_set(), "the agent sees the broker gone")
        down, back = await _flap_while_away(me)
        (tmp_path / "again").mkdir()
        broker = start_mosquitto(tmp_path / "again", port=port)  # persistence off: empty
        await until(lambda: me.bus.connects == 2, "the agent reconnects", timeout=10)
        await until(lambda: not me.core.journal.held, "the replayed events confirmed", timeout=10)
        assert service.ledger is not None and service.ledger.flush()
    finally:
        try:
            await _stop_agents(agents, tasks)
            service.stop()
            await asyncio.wait_for(svc_task, 15)
        finally:
            broker.process.terminate()
            broker.process.wait(5)
    _assert_once(ledger, down, back)


@pytest.mark.real
async def test_past_the_journal_bound_the_ledger_records_a_gap_and_invents_nothing(
    mosquitto, tmp_path: Path
) -> None:
    """gpu000 holds 3 unconfirmed events at most. With the service stopped its rail 1 flaps
    twice (6 events: down, held_down, up, twice); the restarted service gets the last three
    and the range the journal dropped: one ``journal_gaps`` row, the outage of the second
    flap with its true times, and no row for the dropped events."""
    port = mosquitto.port
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(dump_fabric(FABRIC, "yaml"))
    ledger, log = tmp_path / "ledger.sqlite3", tmp_path / "service.log"
    agents = {h: _agent(tmp_path, h, port, journal_max_events=3) for h in HOSTS}
    tasks = [asyncio.create_task(a.run()) for a in agents.values()]
    service = _serve(fabric, port, ledger, log)
    me = agents[ME]
    try:
        await until(
            lambda: all((a.applier.applied_epoch or 0) > 0 for a in agents.values()),
            "first plans applied",
            timeout=20,
        )
        journal = me.core.journal
        assert journal is not None
        await until(lambda: not journal.held, "the start events confirmed", timeout=10)
        first = journal.next_seq
        service.send_signal(signal.SIGTERM)
        assert service.wait(10) == 0
        await _flap_while_away(me)
        await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.UP, "up")
        down, back = await _flap_while_away(me)
        await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.UP, "up again")
        assert journal.lost == (first, first + 2)  # the first flap's three events
        assert [e.seq for e in journal.held] == [first + 3, first + 4, first + 5]
        assert (down.seq, back.seq) == (first + 3, first + 4)
        assert (me.stats.journal_held, me.stats.journal_dropped) == (3, 3)  # the metrics' source
        service = _serve(fabric, port, ledger, log)
        await until(lambda: not journal.held, "the replayed events confirmed", timeout=20)
        assert journal.lost is None and me.stats.journal_held == 0
        service.send_signal(signal.SIGTERM)
        assert service.wait(10) == 0
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(5)
        await _stop_agents(agents, tasks)
    with Ledger(ledger, create=False) as led:
        gaps = led._conn.execute("SELECT host, seq_from, seq_to FROM journal_gaps").fetchall()
        seqs = [
            r[0]
            for r in led._conn.execute(
                "SELECT seq FROM port_events WHERE host=? AND hca=? ORDER BY seq", (ME, "mlx5_1")
            )
        ]
        kinds = {r["kind"] for r in led.events(kind="journal_gap")[1]}
    assert gaps == [(ME, first, first + 2)]
    assert kinds == {"journal_gap"}
    assert [s for s in seqs if s >= first] == [first + 3, first + 4, first + 5]  # none invented
    _assert_once(ledger, down, back)
