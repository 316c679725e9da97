"""CarrierMergedSource: sysfs readings with the netdev carrier of RoCE ports merged in."""

from __future__ import annotations

import asyncio
import contextlib

from linkguard.agent.monitor import raw_usability
from linkguard.drivers.base import PortObservation
from linkguard.drivers.merged import CarrierMergedSource
from linkguard.drivers.simulated import SimulatedPortSource, active_port
from linkguard.models import LinkLayer


async def test_carrier_merged_into_ethernet_ports_only() -> None:
    sysfs = SimulatedPortSource(
        [
            active_port("mlx5_0"),
            active_port("mlx5_bond_0", link_layer=LinkLayer.ETHERNET, rate_gbps=200.0),
        ]
    )
    netlink = SimulatedPortSource(
        [
            PortObservation(
                hca="mlx5_bond_0",
                port=1,
                monotonic=0.0,
                netdev="bond0",
                carrier=True,
                link_layer=LinkLayer.ETHERNET,
            ),
        ]
    )
    merged = CarrierMergedSource(primary=sysfs, carrier=netlink)
    async with contextlib.aclosing(merged.watch()) as it:
        seen: dict[str, PortObservation] = {}
        while getattr(seen.get("mlx5_bond_0/1"), "carrier", None) is not True:
            for o in await asyncio.wait_for(anext(it), 5):
                seen[o.key] = o
        bond = seen["mlx5_bond_0/1"]
        assert (bond.netdev, bond.rate_gbps, bond.state.value) == ("bond0", 200.0, "ACTIVE")
        assert seen["mlx5_0/1"].carrier is None  # InfiniBand: nothing merged

        netlink.set("mlx5_bond_0", carrier=False)  # sysfs still says ACTIVE
        down = (await asyncio.wait_for(anext(it), 5))[0]
        assert (down.state.value, down.carrier) == ("ACTIVE", False)
        assert raw_usability(down) == (False, "no_carrier")

        netlink.set("mlx5_bond_0", present=False, errors=("netdev bond0 not found",))
        gone = (await asyncio.wait_for(anext(it), 5))[0]
        assert gone.present is False and "netdev bond0 not found" in gone.errors
        assert raw_usability(gone).usable is False


async def test_ipoib_netdev_is_evidence_only_for_an_infiniband_port() -> None:
    """An InfiniBand port's IPoIB netdev: its carrier and carrier_changes are merged in, but
    a netdev that is not found leaves the port as sysfs reads it (present, carrier None,
    the error kept), unlike a RoCE port's."""
    sysfs = SimulatedPortSource([active_port("mlx5_0")])
    netlink = SimulatedPortSource(
        [
            PortObservation(
                hca="mlx5_0",
                port=1,
                monotonic=0.0,
                netdev="ibp12s0",
                carrier=True,
                carrier_changes=7,
                link_layer=LinkLayer.INFINIBAND,
            ),
        ]
    )
    merged = CarrierMergedSource(primary=sysfs, carrier=netlink)
    async with contextlib.aclosing(merged.watch()) as it:
        seen: dict[str, PortObservation] = {}
        while getattr(seen.get("mlx5_0/1"), "carrier", None) is not True:
            for o in await asyncio.wait_for(anext(it), 5):
                seen[o.key] = o
        ib = seen["mlx5_0/1"]
        assert (ib.netdev, ib.carrier, ib.carrier_changes) == ("ibp12s0", True, 7)

        netlink.set("mlx5_0", present=False, carrier=None, errors=("netdev ibp12s0 not found",))
        gone = (await asyncio.wait_for(anext(it), 5))[0]
        assert (gone.present, gone.carrier, gone.state.value) == (True, None, "ACTIVE")
        assert "netdev ibp12s0 not found" in gone.errors
        assert raw_usability(gone) == (True, None)
