"""The agent's port loop does not wait on the bus (found by the lab chaos run, issue 21).

A QoS 1 publish whose PUBACK never comes while the connection stays up (the chaos proxy drops
the publish; in the field, a broker that lost it or a half-open connection until the
keepalive ends it) used to hold the agent's effect loop for the bus's ``timeout_s`` (10 s,
aiomqtt's wait for the PUBACK): the next port change of that host was handled 10 s late, its
fast path and its journal's time with it (the lab run logged ``bus_publish_failed ...
Operation timed out`` and a port event stamped 10 s after the kernel's change). Real agent and
service classes over a private Mosquitto, the agent behind the chaos proxy.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from linkguard.broker import MosquittoProcess
from linkguard.config import BusSettings
from linkguard.damping import DampingPolicy
from linkguard.simulations.chaosproxy import ChaosProxy, Rule
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.topology.fabric import generate_rail_optimized
from tests.support import require_binary, until

#: the bus's wait for a PUBACK before this fix (linkguard.bus.Bus's timeout_s default, s)
PUBACK_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def _lossy_fleet(tmp_path: Path) -> AsyncIterator[tuple[SimulatedFleet, ChaosProxy]]:
    """A private Mosquitto, the service on it directly and a 2-host x 2-rail fleet's agents
    behind a chaos proxy (no rules yet; short hold-downs), once every host acked its first
    plan; all stopped on the way out."""
    require_binary("mosquitto")
    fabric = generate_rail_optimized(hosts=2, rails=2)
    quick = {"reconnect_min_s": 0.05, "reconnect_max_s": 0.5}
    with MosquittoProcess(tmp_path / "broker") as broker:
        async with ChaosProxy(broker.host, broker.port, seed=1) as proxy:
            fleet = SimulatedFleet(
                fabric,
                bus=BusSettings(port=broker.port, **quick),
                agent_bus=BusSettings(port=proxy.port, **quick),
                workdir=tmp_path,
                damping=DampingPolicy(hold_down_initial_s=0.2, hold_down_max_s=0.5),
            )
            async with fleet:
                await fleet.wait_all_acked(timeout=30)
                yield fleet, proxy


async def test_a_publish_nobody_acks_does_not_hold_the_next_port_change(tmp_path: Path) -> None:
    async with _lossy_fleet(tmp_path) as (fleet, proxy):
        fabric, host = fleet.fabric, fleet.fabric.host_names[0]
        journal = fleet.agents[host].core.journal
        assert journal is not None
        # from now on nothing this host publishes reaches the broker: no PUBACK comes
        proxy.rules = [Rule("drop", "up", f"linkguard/v1/hosts/{host}/#")]
        first = journal.next_seq
        fleet.link_down(host, 0)
        await until(lambda: journal.next_seq > first, "the first port event", 5)
        await until(lambda: proxy.stats[("up", "drop")] > 0, "a publish dropped", 5)
        fleet.link_down(host, 1)
        # before the fix: held until the first publishes' PUBACK waits ran out (10 s
        # each); a bound of half of one tells the two apart on a noisy machine
        await until(
            lambda: journal.next_seq > first + 1,
            "the second port change handled while the first publish is unacked",
            PUBACK_TIMEOUT_S / 2,
        )
        events = list(journal.held)[-2:]
        assert [(e.hca, e.current.value) for e in events] == [
            (fabric.host(host).hcas[0].hca, "down"),
            (fabric.host(host).hcas[1].hca, "down"),
        ]
        # and it still publishes once the bus works again: nothing held for good
        proxy.rules = []
        proxy.cut()  # the agent replays what the service has not confirmed
        await until(lambda: not journal.held, "the journal confirmed", 15)


async def test_a_port_back_up_leaves_its_fast_path_even_if_the_service_never_saw_it(
    tmp_path: Path,
) -> None:
    """Found by the lab chaos run: a port went down and came back while its states never
    reached the service (lost on the way; a flap the solve back-off folds away does the same).
    The service, unaware, sends no next plan; the agent kept the port's backup overlaid for
    good (there: every endpoint subnet ``unreachable``, both ports up, its epoch acked). Now
    the overlay comes off when the agent's own hold-down ends."""
    async with _lossy_fleet(tmp_path) as (fleet, proxy):
        host = fleet.fabric.host_names[0]
        table, epoch = fleet.tables[host], fleet.service.state.published[host].epoch
        nominal = dict(table.routes)
        proxy.rules = [Rule("drop", "up", f"linkguard/v1/hosts/{host}/#")]
        fleet.link_down(host, 0)
        await until(lambda: table.routes != nominal, "the fast path", 5)
        fleet.link_up(host, 0)
        await until(lambda: table.routes == nominal, "the plan's own routes back", 5)
        assert fleet.service.state.published[host].epoch == epoch  # no plan came
        assert fleet.agents[host].applier.locally_down == set()
