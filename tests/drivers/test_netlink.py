"""NetlinkPortSource on a real namespace lab: snapshot, carrier events, missing netdevs,
overflow re-dump, missing namespace."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import time
from collections.abc import Callable

import pytest

from linkguard.drivers.base import PortObservation, PortSource
from linkguard.drivers.netlink import NetlinkPort, NetlinkPortSource, NetnsNotFoundError
from linkguard.models import LinkLayer, PortStateName
from linkguard.simulations.lab import Lab
from tests.support import require_root

PORTS = [
    NetlinkPort("mlx5_0", 1, "rail0"),
    NetlinkPort("mlx5_1", 1, "rail1"),
    NetlinkPort("mlx5_9", 1, "rail9"),  # does not exist (yet)
]


class Watcher:
    """Runs ``source.watch()`` in a task; tests wait on conditions with a deadline."""

    def __init__(self, source: NetlinkPortSource) -> None:
        self.source = source
        self.batches: asyncio.Queue[tuple[float, list[PortObservation]]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with contextlib.aclosing(self.source.watch()) as it:
            async for batch in it:
                self.batches.put_nowait((time.monotonic(), batch))

    async def __aenter__(self) -> Watcher:
        self.task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def next_batch(self, within: float = 5.0) -> list[PortObservation]:
        return (await asyncio.wait_for(self.batches.get(), within))[1]

    async def until(
        self, pred: Callable[[PortObservation], bool], within: float = 5.0
    ) -> tuple[PortObservation, list[PortObservation]]:
        """The first observation matching ``pred`` (and its batch)."""
        async with asyncio.timeout(within):
            while True:
                batch = await self.next_batch(within)
                for obs in batch:
                    if pred(obs):
                        return obs, batch


def ip(*argv: str) -> str:
    """Run ``ip`` (blocking on purpose: the tests act on the kernel, then await the event)."""
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=True).stdout


def by_netdev(batch: list[PortObservation]) -> dict[str, PortObservation]:
    return {o.netdev: o for o in batch}


@pytest.fixture
def lab():
    require_root()
    lab = Lab.create(hosts=1, rails=2, prefix=None)
    try:
        yield lab
    finally:
        lab.destroy()


def test_is_a_port_source():
    assert isinstance(NetlinkPortSource(ports=PORTS), PortSource)
    with pytest.raises(ValueError):
        NetlinkPortSource(ports=[PORTS[0], PORTS[0]])


async def test_snapshot_then_carrier_changes_only(lab: Lab):
    ns = lab.hosts[0].netns
    async with Watcher(NetlinkPortSource(ports=PORTS, netns=ns)) as w:
        snap = by_netdev(await w.next_batch())
        assert set(snap) == {"rail0", "rail1", "rail9"}
        for dev in ("rail0", "rail1"):
            o = snap[dev]
            assert (o.carrier, o.state, o.phys_state, o.errors) == (
                True,
                PortStateName.ACTIVE,
                None,
                (),
            )
            assert o.link_layer is LinkLayer.ETHERNET and o.rate_gbps is None
        assert snap["rail0"].key == "mlx5_0/1"
        missing = snap["rail9"]
        assert (missing.state, missing.carrier, missing.errors) == (
            None,
            None,
            ("netdev rail9 not found",),
        )

        # the peer goes down in the fabric namespace: carrier loss, admin state still up
        latencies = []
        for _ in range(5):
            t0 = time.monotonic()
            lab.link_down(0, 0)
            down, batch = await w.until(lambda o: o.netdev == "rail0" and o.carrier is False)
            latencies.append((down.monotonic - t0) * 1000)
            assert down.state is PortStateName.DOWN
            assert [o.netdev for o in batch] == ["rail0"]  # changed ports only
            lab.link_up(0, 0)
            up, _ = await w.until(lambda o: o.netdev == "rail0" and o.carrier is True)
            assert up.state is PortStateName.ACTIVE
        median = statistics.median(latencies)
        print(
            f"\ncarrier-down latency `ip link set <peer> down` -> observation: median "
            f"{median:.1f} ms, all {[round(x, 1) for x in latencies]}"
        )
        # with equal ifindexes on the two veth ends this is ~1000 ms
        assert median < 500

        # admin down on the host's own netdev
        ip("-n", ns, "link", "set", "rail1", "down")
        o, _ = await w.until(lambda o: o.netdev == "rail1" and o.carrier is False)
        assert o.state is PortStateName.DOWN


async def test_missing_netdev_appears_and_disappears(lab: Lab):
    ns, fab = lab.hosts[0].netns, lab.fabric_netns
    async with Watcher(NetlinkPortSource(ports=PORTS, netns=ns)) as w:
        assert by_netdev(await w.next_batch())["rail9"].errors == ("netdev rail9 not found",)
        ip("-n", ns, "link", "add", "rail9", "index", "90", "type", "veth",
           "peer", "name", "x9", "netns", fab, "index", "91")  # fmt: skip
        o, _ = await w.until(lambda o: o.netdev == "rail9" and o.errors == ())
        assert (o.carrier, o.state) == (False, PortStateName.DOWN)  # created down
        ip("-n", ns, "link", "set", "rail9", "up")
        ip("-n", fab, "link", "set", "x9", "up")
        o, _ = await w.until(lambda o: o.netdev == "rail9" and o.carrier is True)
        assert o.state is PortStateName.ACTIVE
        # renamed away counts as gone; deleted likewise
        ip("-n", ns, "link", "set", "rail9", "name", "other9")
        o, _ = await w.until(lambda o: o.netdev == "rail9")
        assert (o.state, o.carrier, o.errors) == (None, None, ("netdev rail9 not found",))
        ip("-n", ns, "link", "set", "other9", "name", "rail9")
        await w.until(lambda o: o.netdev == "rail9" and o.carrier is True)
        ip("-n", ns, "link", "del", "rail9")
        # (the kernel sends a last RTM_NEWLINK with carrier off before the RTM_DELLINK)
        o, _ = await w.until(lambda o: o.netdev == "rail9" and o.errors != ())
        assert (o.state, o.carrier, o.errors) == (None, None, ("netdev rail9 not found",))


async def test_overflow_redumps_and_reports_the_change(lab: Lab):
    ns = lab.hosts[0].netns
    # rcvbuf=1: the kernel's minimum (~2 KiB), a couple of link messages fill it
    source = NetlinkPortSource(ports=PORTS[:2], netns=ns, rcvbuf=1)
    async with Watcher(source) as w:
        assert by_netdev(await w.next_batch())["rail0"].carrier is True
        # events pile up while the loop is blocked here; the last word is "down"
        for i in range(21):
            (lab.link_down if i % 2 == 0 else lab.link_up)(0, 0)
        o, _ = await w.until(lambda o: o.netdev == "rail0" and o.carrier is False)
        assert o.state is PortStateName.DOWN
        assert source.overflows >= 1
        # and the source keeps working on its new socket
        lab.link_up(0, 0)
        await w.until(lambda o: o.netdev == "rail0" and o.carrier is True)


async def test_missing_namespace_is_an_error_and_is_not_created():
    require_root()
    name = f"lgmissing{time.monotonic_ns() % 100000}"
    source = NetlinkPortSource(ports=PORTS, netns=name)
    with pytest.raises(NetnsNotFoundError, match=name):
        async with contextlib.aclosing(source.watch()) as it:
            await anext(it)
    assert name not in ip("netns", "list")
