"""Simulated driver: the same interfaces as the kernel drivers, driven by tests and simulations.

:class:`SimulatedPortSource` is a :class:`~linkguard.drivers.base.PortSource` whose ports are
changed with :meth:`SimulatedPortSource.set`. :class:`MemoryRouteTable` has the
:class:`~linkguard.drivers.routes.RouteTable` API and keeps routes in a dict.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Collection, Iterable, Sequence
from dataclasses import replace
from ipaddress import IPv4Network
from typing import Any

from linkguard.drivers.base import PortObservation
from linkguard.drivers.routes import (
    Destination,
    KernelRoute,
    Neighbour,
    ReconcileResult,
    check_routes,
)
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

    def set(self, hca: str, port: int = 1, **fields: Any) -> PortObservation:
        """Change fields of one port (``state=PortStateName.DOWN``, ``phys_state=...``): any
        :class:`PortObservation` field (``dataclasses.replace`` refuses other names)."""
        key = f"{hca}/{port}"
        obs = replace(self._ports[key], monotonic=time.monotonic(), **fields)
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

    async def watch(self) -> AsyncGenerator[list[PortObservation], None]:
        yield list(self._ports.values())
        while True:
            yield await self._queue.get()


class MemoryRouteTable:
    """In-memory stand-in for a kernel routing table (quick start, fleet simulation), with the
    semantics of :class:`~linkguard.drivers.routes.RouteTable`: any route shape of
    :class:`~linkguard.drivers.routes.KernelRoute` (/32 via a gateway, on-link prefix routes
    over one or several netdevs, ``unreachable``), keyed by destination; an equal route is
    left alone (``unchanged``). ``netdevs``: when given, a route naming another netdev goes to
    ``errors`` and leaves what the table had for its destination, as a missing netdev does in
    the kernel. ``prefixes``: when given, a destination outside them raises ValueError before
    anything changes (:func:`~linkguard.drivers.routes.check_routes`).

    ``changes`` counts routes written or deleted, ``reconciles``/``updates`` the calls.
    """

    def __init__(
        self,
        *,
        netdevs: Collection[str] | None = None,
        prefixes: Sequence[IPv4Network] = (),
    ) -> None:
        self.netdevs = None if netdevs is None else frozenset(netdevs)
        self.prefixes = tuple(prefixes)
        self.routes: dict[Destination, KernelRoute] = {}
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

    async def dump(self) -> dict[Destination, KernelRoute]:
        return dict(self.routes)

    def _missing(self, route: KernelRoute) -> str | None:
        if self.netdevs is None:
            return None
        return next((n for n in route.netdevs if n not in self.netdevs), None)

    def _put(self, route: KernelRoute, result: ReconcileResult) -> bool:
        """Write one route (False and an error when it names an unknown netdev)."""
        missing = self._missing(route)
        if missing is not None:
            result.errors.append((route.destination, f"netdev {missing} not found"))
            return False
        self.routes[route.destination] = route
        return True

    async def reconcile(self, desired: Sequence[KernelRoute]) -> ReconcileResult:
        """Make the table exactly ``desired`` (see :meth:`RouteTable.reconcile`)."""
        check_routes(desired, self.prefixes)
        self.reconciles += 1
        result = ReconcileResult()
        want = {r.destination: r for r in desired}
        for d in [d for d in self.routes if d not in want]:
            del self.routes[d]
            result.deleted += 1
        for d, r in want.items():
            cur = self.routes.get(d)
            if cur == r:
                result.unchanged += 1
            elif self._put(r, result):
                if cur is None:
                    result.added += 1
                else:
                    result.replaced += 1
        self.changes += result.changed
        return result

    async def update(
        self, upsert: Sequence[KernelRoute], remove: Iterable[Destination] = ()
    ) -> ReconcileResult:
        """Write ``upsert``, delete ``remove`` (see :meth:`RouteTable.update`)."""
        check_routes(upsert, self.prefixes)
        self.updates += 1
        result = ReconcileResult()
        result.replaced = sum(self._put(r, result) for r in upsert)
        result.deleted = sum(self.routes.pop(d, None) is not None for d in remove)
        self.changes += result.changed
        return result

    async def flush(self) -> None:
        self.routes.clear()
        self.rules_installed = False

    async def neighbours(self, netdevs: Iterable[str] | None = None) -> list[Neighbour]:
        """A table in memory has no neighbour entries."""
        return []

    async def delete_neighbours(self, entries: Iterable[Neighbour]) -> int:
        return 0
