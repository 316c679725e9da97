"""An in-process fleet: the real topology service and one real agent per fabric host, with
simulated port drivers and in-memory route tables, on a real MQTT broker.

Consumes: a :class:`~linkguard.topology.fabric.Fabric`, a broker address, a damping policy.
Produces: a running fleet whose links tests, the quick start and simulations take down and
up (:meth:`SimulatedFleet.link_down`), and whose service, agents and tables they inspect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus, BusSession
from linkguard.config import (
    AgentSettings,
    ApiSettings,
    BusSettings,
    PortConfig,
    RouteOptions,
    ServiceSettings,
    SolveSettings,
)
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import AckResult
from linkguard.topology.fabric import Fabric
from linkguard.topology.service import TopologyService

__all__ = ["SimulatedFleet", "agent_settings_for", "wait_until"]


async def wait_until(cond: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``cond`` every 2 ms; return the monotonic time it became true. TimeoutError after
    ``timeout`` seconds, naming ``what``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.002)
    return time.monotonic()


def agent_settings_for(
    fabric: Fabric, host: str, *, bus: BusSettings, workdir: Path, damping: DampingPolicy
) -> AgentSettings:
    """Settings of a simulated agent for ``host`` of ``fabric`` (ports, endpoints, addresses;
    no metrics exporter)."""
    inv = fabric.host(host)
    return AgentSettings(
        host=host,
        driver="simulated",
        bus=bus,
        routes=RouteOptions(apply=False),
        damping=damping,
        ports=[
            PortConfig(
                hca=h.hca,
                port=h.port,
                rail=h.rail,
                netdev=h.netdev,
                address=h.address,
                link_layer=h.link_layer,
                numa_node=h.numa_node,
            )
            for h in inv.hcas
        ],
        endpoints=list(inv.endpoints),
        state_dir=workdir / host,
        rail_map_path=workdir / host / "rail-map.json",
        log_format="console",
        metrics_listen=None,  # many agents in one process: no exporter ports
    )


class SimulatedFleet:
    """``async with SimulatedFleet(fabric, bus=..., workdir=...) as fleet:`` runs everything."""

    def __init__(
        self,
        fabric: Fabric,
        *,
        bus: BusSettings,
        workdir: Path,
        damping: DampingPolicy | None = None,
        debounce_ms: float = 20,
        solve_initial_delay_ms: float = 0,
        settle_s: float = 0.2,
        bus_factory: Callable[..., BusSession] = Bus,
        api: ApiSettings | None = None,
        signing_key: Path | None = None,
        service_public_key: Path | None = None,
        agent_bus: BusSettings | None = None,
        service_update: dict[str, object] | None = None,
    ) -> None:
        """``bus_factory``: the bus session of the service and every agent (default the real
        MQTT :class:`~linkguard.bus.Bus`; simulations beyond a few hundred agents pass an
        in-memory one with the same semantics). ``api``: the service's HTTP API (None: not
        served; ``ApiSettings(port=0)`` serves it on a free loopback port,
        ``fleet.service.api_port``). ``signing_key``: the service signs its plans with it;
        ``service_public_key``: every agent verifies them with it (:mod:`linkguard.signing`).
        ``debounce_ms``, ``solve_initial_delay_ms``: the service's solve back-off (ms).
        ``agent_bus``: the agents' bus when it differs from the service's (a chaos run puts
        a fault-injecting proxy between the agents and the broker); ``service_update``: other
        service settings (e.g. ``convergence``, ``ledger``)."""
        self.fabric = fabric
        self.bus_factory = bus_factory
        damping = damping or DampingPolicy()
        self.service = TopologyService(
            ServiceSettings(
                bus=bus,
                solve=SolveSettings(short_ms=debounce_ms, initial_ms=solve_initial_delay_ms),
                startup_settle_s=settle_s,
                api=api or ApiSettings(enabled=False),
                signing_key=signing_key,
            ).model_copy(update=service_update or {}),
            fabric=fabric,
            bus_factory=bus_factory,
        )
        self.sources: dict[str, SimulatedPortSource] = {}
        self.tables: dict[str, MemoryRouteTable] = {}
        self.agents: dict[str, Agent] = {}
        for inv in fabric.hosts:
            self.sources[inv.host] = SimulatedPortSource(
                [active_port(h.hca, h.port, link_layer=h.link_layer) for h in inv.hcas]
            )
            self.tables[inv.host] = MemoryRouteTable()
            settings = agent_settings_for(
                fabric, inv.host, bus=agent_bus or bus, workdir=workdir, damping=damping
            ).model_copy(update={"service_public_key": service_public_key})
            self.agents[inv.host] = Agent(
                settings,
                source=self.sources[inv.host],
                table=self.tables[inv.host],
                discovered=[],
                bus_factory=bus_factory,
            )
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> SimulatedFleet:
        self._tasks = [asyncio.create_task(self.service.run(), name="service")]
        self._tasks += [
            asyncio.create_task(a.run(), name=f"agent:{h}") for h, a in self.agents.items()
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for a in self.agents.values():
            a.stop()
        self.service.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _hca(self, host: str, rail: int):
        return next(h for h in self.fabric.host(host).hcas if h.rail == rail)

    def link_down(self, host: str, rail: int) -> None:
        h = self._hca(host, rail)
        self.sources[host].link_down(h.hca, h.port)

    def link_up(self, host: str, rail: int) -> None:
        h = self._hca(host, rail)
        self.sources[host].link_up(h.hca, h.port)

    def all_acked(self, epoch_floor: int = 0) -> bool:
        """Every host applied its current plan, of epoch ``epoch_floor`` or later, with every
        peer routes message its ack names as the service counts it (``ack_covers``: after a
        leaf failure a whole host acks the peer routes' epoch from the first it applies)."""
        state = self.service.state  # epochs and names only: no full plan is built for this
        acks = state.acks
        return len(state.published) == len(self.agents) and all(
            h in acks
            and acks[h].result == AckResult.APPLIED
            and acks[h].epoch == state.acked_epoch(h)
            and acks[h].epoch >= epoch_floor
            and state.ack_covers(h, acks[h])
            for h in self.agents
        )

    async def wait_all_acked(self, epoch_floor: int = 0, timeout: float = 20) -> float:
        return await wait_until(
            lambda: self.all_acked(epoch_floor),
            timeout,
            f"every host to ack epoch >= {epoch_floor}",
        )
