"""Issue 21, found by the lab chaos run: a solve publishes a host's compact plan and a peer's
routes (``peers/<peer>``) together, the plan's epoch no lower than the peer routes'. An agent
that lost the peer routes on the way still acked that epoch, so the service counted it
converged while it routed without the peer's changes (the lab saw a host's ``unreachable``
routes towards a routed-around peer missing, its epoch acked). Its ack now names the epoch
of each peer's routes it holds (``Ack.peers``); the service counts such an ack converged only
when it holds every peer routes message on the bus (:func:`linkguard.models.ack_covers`) and
re-sends the missing one.

Real processes: a private Mosquitto, the topology service, gpu000's agent behind the chaos
proxy, gpu001's directly. gpu000's port comes back up while gpu001's goes down, in one solve
(``solve.initial_ms`` 1.5 s): gpu000's compact plan carries that solve's epoch, at least the
peer routes';
the proxy drops that ``peers/gpu001`` on its way to gpu000 once. The pure rule is in
tests/topology/test_convergence.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings, ConvergenceSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import expand_plan
from linkguard.settings.servicesections import SolveSettings
from linkguard.simulations.chaosproxy import ChaosProxy, Rule
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until
from tests.test_faults_survived import _stop_all

pytestmark = pytest.mark.real

FABRIC = generate_rail_optimized(hosts=2, rails=2)
HOST, OTHER = FABRIC.host_names[0], FABRIC.host_names[1]


def _agent(tmp: Path, host: str, port: int) -> tuple[Agent, SimulatedPortSource]:
    s = agent_settings_for(
        FABRIC,
        host,
        workdir=tmp,
        bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
        damping=DampingPolicy(hold_down_initial_s=0.3, hold_down_max_s=0.3),
    )
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(host).hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[]), src


async def test_an_ack_of_the_epoch_without_a_lost_peer_routes_is_resent_it(
    mosquitto, tmp_path: Path
) -> None:
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=mosquitto.port, reconnect_min_s=0.05, reconnect_max_s=0.3),
            startup_settle_s=0,
            solve=SolveSettings(initial_ms=1500, short_ms=1500),
            convergence=ConvergenceSettings(resend_after_s=1.0, resend_max_s=4.0),
        ),
        fabric=FABRIC,
    )
    state = service.state
    async with ChaosProxy("127.0.0.1", mosquitto.port, seed=3) as proxy:
        me, my_src = _agent(tmp_path, HOST, proxy.port)
        other, other_src = _agent(tmp_path, OTHER, mosquitto.port)
        tasks = [asyncio.create_task(x.run()) for x in (service, me, other)]
        try:
            await until(lambda: state.published and not state.pending_acks(), "plans acked", 20)
            mine = FABRIC.host(HOST).hcas[0]
            my_src.link_down(mine.hca, mine.port)  # a full plan for gpu000
            await until(lambda: state.published[HOST].shared is None, "gpu000's full plan", 10)
            await until(lambda: not state.pending_acks(), "gpu000's full plan acked", 10)
            proxy.rules.append(Rule("drop", "down", topics.peer_routes(OTHER), count=1))
            theirs = FABRIC.host(OTHER).hcas[1]
            with capture_logs() as logs:
                my_src.link_up(mine.hca, mine.port)  # back after its 0.3 s hold-down ...
                other_src.link_down(theirs.hca, theirs.port)  # ... in the same solve
                await until(lambda: len(proxy.actions) == 1, "peers/gpu001 dropped", 10)
                pub, peer = state.published[HOST], state.peers[OTHER]
                # the case: one solve (one issue time) published gpu000's compact plan and the
                # peer routes, the plan's epoch no lower: its epoch alone covers both
                assert pub.shared is not None and pub.issued_at == peer.issued_at
                assert pub.epoch >= peer.epoch and state.acked_epoch(HOST) == pub.epoch
                await until(
                    lambda: state.acks[HOST].epoch >= pub.epoch, "gpu000 acked the epoch", 10
                )
                await until(
                    lambda: state.ack_covers(HOST, state.acks[HOST]),
                    "gpu000's ack names gpu001's peer routes",
                    10,
                )
            assert proxy.actions == [("down", "drop", topics.peer_routes(OTHER))]
            assert state.acks[HOST].peers is not None
            assert state.acks[HOST].peers[OTHER] == peer.epoch
            assert me.core.peers[OTHER].epoch == peer.epoch
            # and gpu000 routes with them: its plan in place is the expansion with every one
            want = expand_plan(state.published[HOST], dict(state.peers))
            assert me.applier.plan is not None and me.applier.plan.same_assignments(want)
            warned = [e for e in logs if e["event"] == "host_not_acking"]
            assert [(e["host"], e["epoch"]) for e in warned][:1] == [(HOST, pub.epoch)]
            assert not state.pending_acks()
        finally:
            await _stop_all([me, other], tasks, service)
