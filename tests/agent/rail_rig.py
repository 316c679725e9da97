"""A real agent on an in-memory bus with a sender in the topology service's place, and helpers
for the hook and rails-socket tests: executable scripts, process liveness, short socket dirs."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import BusMessage
from linkguard.config import BusSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.membus import MemoryBroker, MemoryBus
from linkguard.models import Ack, Plan, decode, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.solver import Solver

FABRIC = generate_rail_optimized(hosts=2, rails=4)
HOST = "gpu000"


def script(directory: Path, name: str, body: str) -> Path:
    """An executable Python script ``directory/name`` running ``body`` with this interpreter."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@contextmanager
def short_dir() -> Iterator[Path]:
    """A fresh directory with a short path (a Unix socket path holds 107 bytes at most)."""
    d = Path(tempfile.mkdtemp(prefix="lg-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def rail_map(plan: Plan) -> dict[str, str]:
    """GPU -> "hca:port" of ``plan`` (no fast path)."""
    return {str(a.gpu): f"{a.hca}:{a.port}" for a in plan.rail_assignments}


@dataclass
class Rig:
    agent: Agent
    sender: MemoryBus
    solver: Solver
    acks: list[Ack] = field(default_factory=list)
    #: the agent's simulated ports (``link_down`` / ``link_up`` them)
    source: SimulatedPortSource | None = None

    async def plan(self, epoch: int, lost: set[int] | frozenset[int] = frozenset()) -> Plan:
        """Publish HOST's plan of ``epoch`` with ``lost`` rails unusable at HOST."""
        self.solver.update({HOST: set(lost)})
        plan = self.solver.plan(HOST, epoch=epoch, now=1.0)
        await self.sender.publish(topics.plan(HOST), encode(plan), retain=True)
        return plan

    def acked(self, epoch: int) -> bool:
        return any(a.epoch == epoch for a in self.acks)


@asynccontextmanager
async def running_agent(
    tmp: Path, *, fabric: Fabric = FABRIC, **update: object
) -> AsyncIterator[Rig]:
    """HOST's agent of ``fabric`` (simulated ports all active, in-memory route table) with
    ``update`` applied to its settings, running until the block ends."""
    broker = MemoryBroker()
    settings = agent_settings_for(
        fabric, HOST, bus=BusSettings(), workdir=tmp, damping=DampingPolicy()
    ).model_copy(update=update)
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in fabric.host(HOST).hcas])
    agent = Agent(
        settings,
        source=source,
        table=MemoryRouteTable(),
        discovered=[],
        bus_factory=broker.bus_factory,
    )
    acks: list[Ack] = []

    async def on_ack(msg: BusMessage) -> None:
        acks.append(decode(Ack, msg.payload))

    sender = broker.bus_factory(
        client_id="test-service", subscriptions=[topics.ack(HOST)], handler=on_ack
    )
    task = asyncio.create_task(agent.run())
    try:
        async with sender:
            await sender.wait_connected(10)
            await agent.bus.wait_connected(10)
            yield Rig(agent, sender, Solver(fabric), acks, source)
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
