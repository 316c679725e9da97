"""RoCE ports seen from both sides: sysfs for the RDMA port, netlink for its netdev.

On a RoCE port (``link_layer`` Ethernet) the RDMA port state in sysfs follows the netdev, but
the netdev's carrier is the first and authoritative signal (DESIGN.md: "health comes from the
netdev via netlink"). :class:`CarrierMergedSource` runs a primary source (sysfs) for every
port and a carrier source (netlink) for the Ethernet ones, and yields the primary's readings
with ``carrier`` (and ``netdev``) taken from the carrier source.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import replace

from linkguard.drivers.base import PortObservation, PortSource
from linkguard.models import LinkLayer

__all__ = ["CarrierMergedSource"]


class CarrierMergedSource:
    """Merge ``carrier`` from ``carrier`` source into ``primary`` source readings, per port key.

    A port only the carrier source knows is not reported until the primary has read it. When
    the carrier source finds the netdev gone (``present`` False), the merged reading of an
    Ethernet (RoCE) port is absent too: the RDMA port has lost its netdev; an InfiniBand
    port's netdev (IPoIB) is evidence only, so its port stays as sysfs reads it (carrier
    None, the error kept). ``carrier_changes`` and bond ``members`` come from the carrier
    source. Errors of both sources are kept.
    """

    def __init__(self, *, primary: PortSource, carrier: PortSource) -> None:
        self._primary = primary
        self._carrier = carrier

    def _merge(self, p: PortObservation, c: PortObservation | None) -> PortObservation:
        if c is None:
            return p
        evidence_only = (p.link_layer or c.link_layer) == LinkLayer.INFINIBAND
        return replace(
            p,
            carrier=c.carrier,
            carrier_changes=c.carrier_changes,
            members=c.members,
            netdev=c.netdev or p.netdev,
            present=p.present and (c.present or evidence_only),
            errors=p.errors + tuple(e for e in c.errors if e not in p.errors),
        )

    async def watch(self) -> AsyncGenerator[list[PortObservation], None]:
        queue: asyncio.Queue[tuple[str, list[PortObservation]]] = asyncio.Queue()

        async def pump(tag: str, source: PortSource) -> None:
            async with contextlib.aclosing(source.watch()) as it:
                async for batch in it:
                    await queue.put((tag, batch))

        primary: dict[str, PortObservation] = {}
        carrier: dict[str, PortObservation] = {}
        # Plain tasks, not a TaskGroup: a TaskGroup cannot be left by GeneratorExit at a yield.
        tasks = [
            asyncio.create_task(pump("primary", self._primary), name="merged:primary"),
            asyncio.create_task(pump("carrier", self._carrier), name="merged:carrier"),
        ]
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait([getter, *tasks], return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    for t in done:
                        t.result()  # a source failed: raise its error
                    raise RuntimeError("port source ended")
                tag, batch = getter.result()
                keys = []
                for obs in batch:
                    (primary if tag == "primary" else carrier)[obs.key] = obs
                    keys.append(obs.key)
                out = [self._merge(primary[k], carrier.get(k)) for k in keys if k in primary]
                if out or tag == "primary":  # the primary's first (maybe empty) snapshot
                    yield out
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
