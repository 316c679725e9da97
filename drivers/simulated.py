"""Simulated driver: the same interfaces as the kernel drivers, driven by tests and simulations.

:class:`SimulatedPortSource` is a :class:`~linkguard.drivers.base.PortSource` whose ports are
changed with :meth:`SimulatedPortSource.set`. :class:`MemoryRouteTable` has the
:class:`~linkguard.drivers.routes.RouteTable` API and keeps routes in a dict.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from linkguard.drivers.base import PortObservation
from linkguard.drivers.routes import KernelRoute, ReconcileResult
from linkguard.models import LinkLayer, PhysState, PortStateName

__all__ = ["MemoryRouteTable", "SimulatedPortSource", "active_port"]


def active_port(
    hca: str,
    port: int = 1,
    *,
    rate_gbps: float = 400.0,
    link_layer: LinkLayer = LinkLayer.INFINIBAND,
) -> PortObservation:
    """An ACTIVE/LinkUp port reading."""
    return PortObservation(
        hca=hca,
        port=port,
        monotonic=time.monotonic(),
        link_layer=link_layer,
        state=PortStateName.ACTIVE,
        phys_state=PhysState.LINK_UP,
        rate_gbps=rate_gbps,
    )


class SimulatedPortSource:
    """Yields a snapshot of ``ports``, then every change made with :meth:`set`."""

    def __init__(self, ports: Sequence[PortObservation]) -> None:
        self._ports = {p.key: p for p in ports}
        self._queue: asyncio.Queue[list[PortObservation]] = asyncio.Queue()

    def set(self, hca: str, port: int = 1, **fields: object) -> PortObservation:
        """Change fields of one port (``state=PortStateName.DOWN``, ``phys_state=...``)."""
        key = f"{hca}/{port}"
        obs = replace(self._ports[key], monotonic=time.monotonic(), **fields)  # type: ignore[arg-type]
        self._ports[key] = obs
        self._queue.put_nowait([obs])
        return obs

    def link_down(self, hca: str, port: int = 1) -> PortObservation:
        return self.set(
            hca,
            port,
            state=PortStateName.DOWN,
            phys_state=PhysState.POLLING,
            carrier=False if self._ports[f"{hca}/{port}"].carrier is not None else None,
        )

    def link_up(self, hca: str, port: int = 1) -> PortObservation:
        return self.set(
            hca,
            port,
            state=PortStateName.ACTIVE,
            phys_state=PhysState.LINK_UP,
            carrier=True if self._ports[f"{hca}/{port}"].carrier is not None else None,
        )

    async def watch(self) -> AsyncIterator[list[PortObservation]]:
        yield list(self._ports.values())
        while True:
            yield await self._queue.get()


class MemoryRouteTable:
    """In-memory stand-in for a kernel routing table (quick start, fleet simulation)."""

    def __init__(self) -> None:
        self.routes: dict[object, KernelRoute] = {}
        self.rules_installed = False
        self.changes = 0
        self.reconciles = 0
        self.updates = 0

    async def __aenter__(self) -> MemoryRouteTable:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def ensure_rules(self) -> None:
        self.rules_installed = True

    async def dump(self) -> dict[object, KernelRoute]:
        return dict(self.routes)

    async def reconcile(self, desired: Sequence[KernelRoute]) -> ReconcileResult:
        self.reconciles += 1
        want = {r.destination: r for r in desired}
        added = replaced = deleted = unchanged = 0
        for d in list(self.routes):
            if d not in want:
                del self.routes[d]
                deleted += 1
        for d, r in want.items():
            cur = self.routes.get(d)
            if cur == r:
                unchanged += 1
                continue
            if cur is None:
                added += 1
            else:
                replaced += 1
            self.routes[d] = r
        self.changes += added + replaced + deleted
        return ReconcileResult(
            added=added, replaced=replaced, deleted=deleted, unchanged=unchanged, errors=[]
        )

    async def update(self, upsert: Sequence[KernelRoute], remove=()) -> ReconcileResult:
        self.updates += 1
        for r in upsert:
            self.routes[r.destination] = r
        deleted = sum(self.routes.pop(d, None) is not None for d in remove)
        self.changes += len(upsert) + deleted
        return ReconcileResult(replaced=len(upsert), deleted=deleted, errors=[])

    async def flush(self) -> None:
        self.routes.clear()
        self.rules_installed = False
