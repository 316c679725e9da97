"""Netdev carrier evidence on veth stand-ins in a namespace lab (issue 22, part 3): the
``carrier_changes`` count (IFLA_CARRIER_CHANGES) of a link flapped faster than any poll, a
bond's member netdevs, and an InfiniBand port (a copy of the real H100 tree, sysfs ACTIVE
throughout) whose IPoIB netdev flaps: one flap, damped, in the port monitor."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.drivers.merged import CarrierMergedSource
from linkguard.drivers.netlink import NetlinkPort, NetlinkPortSource
from linkguard.drivers.sysfs_ib import SysfsIBSource
from linkguard.models import LinkLayer, PortStatus
from linkguard.simulations.lab import Lab
from tests.drivers.test_netlink import Watcher
from tests.support import require_root

WALL = 1_700_000_000.0


@pytest.fixture
def lab():
    require_root()
    lab = Lab.create(hosts=1, rails=3, prefix=None)
    try:
        yield lab
    finally:
        lab.destroy()


def flap(lab: Lab, rail: int) -> None:
    """The fabric end of host 0's ``rail<rail>`` down and at once up again, in one ``ip``
    process (the host's end loses carrier for well under a poll)."""
    port = lab.fabric_port(0, rail)
    subprocess.run(
        ["ip", "-n", lab.fabric_netns, "-batch", "-"],
        input=f"link set {port} down\nlink set {port} up\n",
        text=True,
        check=True,
        capture_output=True,
    )


async def test_carrier_changes_counts_every_transition(lab: Lab) -> None:
    ns = lab.hosts[0].netns
    source = NetlinkPortSource(ports=[NetlinkPort("mlx5_0", 1, "rail0")], netns=ns)
    async with Watcher(source) as w:  # type: ignore[arg-type]
        (first,) = await w.next_batch()
        assert first.carrier is True and first.carrier_changes is not None
        base = first.carrier_changes
        flap(lab, 0)
        back, _ = await w.until(
            lambda o: o.carrier is True and (o.carrier_changes or 0) >= base + 2
        )
        assert back.carrier_changes == base + 2  # off and on: two transitions, one flap
        assert back.members is None


async def test_bond_members_are_read_with_the_bond(lab: Lab) -> None:
    """``rail2`` stands in for the bond netdev, ``rail0`` and ``rail1`` for its members (the
    bonding module is not on this machine): a member's carrier loss shows in ``members``
    while the bond's own carrier stays up, and the monitor degrades the bond."""
    ns = lab.hosts[0].netns
    port = NetlinkPort("mlx5_bond_0", 1, "rail2", members=("rail0", "rail1"))
    mon = PortMonitor(host="h0", policy=DampingPolicy(), rails={"mlx5_bond_0/1": 0})
    async with Watcher(NetlinkPortSource(ports=[port], netns=ns)) as w:  # type: ignore[arg-type]
        (first,) = await w.next_batch()
        assert (first.carrier, first.members) == (True, {"rail0": True, "rail1": True})
        out = mon.observe([first], now=0.0, wall=WALL)
        assert out.states[0].status is PortStatus.UP
        lab.link_down(0, 1)  # the second member, not the first
        obs, _ = await w.until(lambda o: o.members == {"rail0": True, "rail1": False})
        assert obs.carrier is True
        out = mon.observe([obs], now=1.0, wall=WALL)
        assert [(e.current, e.reason) for e in out.events] == [
            (PortStatus.DEGRADED, "bond members without carrier: rail1 (1/2 up)")
        ]
        lab.link_up(0, 1)
        obs, _ = await w.until(lambda o: o.members == {"rail0": True, "rail1": True})
        out = mon.observe([obs], now=2.0, wall=WALL)
        assert [e.current for e in out.events] == [PortStatus.UP]


async def test_ipoib_flap_between_polls_is_one_damped_flap(
    lab: Lab, tmp_path: Path, fixtures_real: Path
) -> None:
    """mlx5_0 of the real H100 capture (copied; sysfs ACTIVE/LinkUp all along) with
    ``rail0`` as its IPoIB netdev: a flap of the netdev faster than the sysfs poll is
    counted from carrier_changes as one flap and holds the port down."""
    root = tmp_path / "infiniband"
    shutil.copytree(fixtures_real / "leptonai-gpud/tree/sys-class-infiniband-h100.0", root)
    ns = lab.hosts[0].netns
    source = CarrierMergedSource(
        primary=SysfsIBSource(root=root, ports={"mlx5_0/1"}, interval_s=0.1),
        carrier=NetlinkPortSource(
            ports=[NetlinkPort("mlx5_0", 1, "rail0", LinkLayer.INFINIBAND)], netns=ns
        ),
    )
    mon = PortMonitor(
        host="h0", policy=DampingPolicy(hold_down_initial_s=10.0), rails={"mlx5_0/1": 0}
    )
    async with Watcher(source) as w:  # type: ignore[arg-type]
        first, _ = await w.until(lambda o: o.carrier is True)
        base = first.carrier_changes
        assert base is not None and first.state is not None
        assert (first.state.value, first.link_layer) == ("ACTIVE", LinkLayer.INFINIBAND)
        out = mon.observe([first], now=0.0, wall=WALL)
        assert out.states[0].status is PortStatus.UP
        flap(lab, 0)
        t = 0.0
        events = []
        while True:  # every merged reading to the monitor, until the carrier is back
            batch = await w.next_batch()
            t += 0.1
            events += mon.observe(batch, now=t, wall=WALL).events
            if any(o.carrier is True and o.carrier_changes == base + 2 for o in batch):
                break
    assert [(e.previous, e.current, e.reason) for e in events] == [
        (
            PortStatus.UP,
            PortStatus.HELD_DOWN,
            f"hold_down; carrier_changes {base} -> {base + 2} while usable",
        )
    ]
    st = mon.state("mlx5_0/1")
    assert st is not None
    assert (st.state, st.damping.flaps, st.carrier_changes, st.disagreement) == (
        first.state,
        1,
        base + 2,
        None,
    )
