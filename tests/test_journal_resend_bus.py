"""Issue 21, the journal: a port event (or its confirmation) lost on a bus that stays up
reaches the ledger without any reconnect, exactly once (the journal's timed re-send,
``journal_resend_after_s``: :meth:`linkguard.agent.journal.EventJournal.resend_due`).

Real processes: a private Mosquitto, the topology service with its SQLite ledger, and the
agent of gpu000 behind the chaos proxy (:mod:`linkguard.simulations.chaosproxy`), which drops
the agent's ``hosts/<host>/events`` PUBLISH on its way up, or the service's
``confirmed/<host>`` on its way down. The pure schedule is in tests/agent/test_journal.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.ledger import Ledger
from linkguard.models import PortStatus
from linkguard.settings.servicesections import LedgerSettings
from linkguard.simulations.chaosproxy import ChaosProxy, Rule
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.service import TopologyService
from tests.support import until
from tests.test_journal_outages import FABRIC, ME, _stop_agents

pytestmark = pytest.mark.real

RESEND_S = 0.5  # journal_resend_after_s in these tests


def _lossy_agent(tmp: Path, port: int) -> Agent:
    s = agent_settings_for(
        FABRIC,
        ME,
        workdir=tmp,
        bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
        damping=DampingPolicy(hold_down_initial_s=60),
    ).model_copy(update={"journal_resend_after_s": RESEND_S, "journal_resend_max_s": 2.0})
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(ME).hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[])


def _downs(ledger: Path) -> list[tuple[float, int]]:
    with Ledger(ledger, create=False) as led:
        rows = led._conn.execute(
            "SELECT at, seq FROM port_events WHERE host=? AND hca=? AND current='down'",
            (ME, "mlx5_1"),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


@pytest.mark.parametrize(
    "rule",
    [
        Rule("drop", "up", topics.events(ME), count=1),
        Rule("drop", "down", topics.events_confirmed(ME), count=1),
    ],
    ids=["event-lost", "confirmation-lost"],
)
async def test_a_lost_event_or_confirmation_reaches_the_ledger_once_without_a_reconnect(
    mosquitto, tmp_path: Path, rule: Rule
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05, reconnect_max_s=0.3)
    service = TopologyService(
        ServiceSettings(bus=bus, startup_settle_s=0, ledger=LedgerSettings(path=ledger)),
        fabric=FABRIC,
    )
    svc_task = asyncio.create_task(service.run())
    async with ChaosProxy("127.0.0.1", mosquitto.port, seed=21) as proxy:
        me = _lossy_agent(tmp_path, proxy.port)
        tasks = [asyncio.create_task(me.run())]
        try:
            await until(lambda: (me.applier.applied_epoch or 0) > 0, "first plan applied", 20)
            journal = me.core.journal
            assert journal is not None
            await until(lambda: not journal.held, "the start events confirmed", timeout=10)
            proxy.rules.append(rule)
            t0 = time.monotonic()
            me.source.link_down("mlx5_1")
            await until(lambda: me.monitor.state("mlx5_1/1").status == PortStatus.DOWN, "down")
            await until(lambda: len(proxy.actions) == 1, "the chaos proxy dropped it")
            down = next(e for e in journal.held if e.current == PortStatus.DOWN)
            await until(lambda: not journal.held, "the event confirmed", timeout=10)
            took = time.monotonic() - t0
            assert service.ledger is not None and service.ledger.flush()
            print(f"\n{rule.topic} dropped: confirmed {took:.2f} s after the link went down")
            assert proxy.actions == [(rule.direction, "drop", rule.topic)]
            assert me.bus.connects == 1  # no reconnect: the timed re-send, not a replay
            assert proxy.stats[("both", "connections")] == 1
            assert me.stats.journal_resent >= 1
            assert took < RESEND_S + 5, took
        finally:
            await _stop_agents({ME: me}, tasks)
            service.stop()
            async with asyncio.timeout(15):
                await svc_task
    rows = _downs(ledger)
    assert [s for _, s in rows] == [down.seq]  # once
    assert rows[0][0] == pytest.approx(down.at, abs=1e-6)  # the agent's own time
