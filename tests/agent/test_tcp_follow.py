"""The applier's part in making TCP follow a reroute, as pure functions: the source address of
each route (:func:`endpoint_sources`, :func:`kernel_routes`) and which neighbour entries a
table change leaves stale (:func:`stale_neighbours`)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard.agent.applier import (
    Applier,
    endpoint_sources,
    kernel_routes,
    lost_netdevs,
    stale_neighbours,
)
from linkguard.agent.plans import Effective
from linkguard.drivers.neighbours import Neighbour
from linkguard.drivers.routes import KernelRoute
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.models import RailAssignment
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import solve
from tests.agent.plan_parts import prefix_route, route

REACHABLE, INCOMPLETE, PERMANENT, NOARP = 0x02, 0x01, 0x80, 0x40


def gpu(g: int, rail: int, home: int) -> RailAssignment:
    return RailAssignment(
        gpu=g, endpoint=f"10.200.{128 + home}.{g + 1}", hca=f"mlx5_{rail}", port=1, rail=rail,
        home_rail=home,
    )  # fmt: skip


def eff(**kw) -> Effective:
    return Effective(
        rail_assignments=kw.pop("gpus", (gpu(0, 0, 0), gpu(1, 1, 1))),
        routes=kw.pop("routes", ()),
        fast_path_ports=(),
        **kw,
    )


def table(*routes: KernelRoute) -> dict:
    return {r.destination: r for r in routes}


def N(addr: str, dev: str, state: int = REACHABLE) -> Neighbour:
    return Neighbour(IPv4Address(addr), dev, state)


def onlink(prefix: str, *devs: str) -> KernelRoute:
    return KernelRoute(IPv4Network(prefix), nexthops=devs)


def via(dst: str, gw: str, dev: str) -> KernelRoute:
    return KernelRoute(IPv4Address(dst), IPv4Address(gw), dev)


# -- sources ------------------------------------------------------------------------------------


def test_sources_by_home_rail_with_the_lowest_gpu_as_fallback() -> None:
    # GPU 1 has moved to rail 0 (a fast path): its home rail, and so its source, are unchanged
    e = eff(gpus=(gpu(2, 1, 1), gpu(1, 0, 1), gpu(0, 0, 0)))
    assert endpoint_sources(e) == {
        0: IPv4Address("10.200.128.1"),
        1: IPv4Address("10.200.129.2"),  # GPU 1 before GPU 2
        -1: IPv4Address("10.200.128.1"),
    }
    assert endpoint_sources(eff(gpus=())) == {}


def test_kernel_routes_carry_src_and_rto_min_on_unicast_only() -> None:
    e = eff(
        prefix_routes=(
            prefix_route("10.200.128.0/24", 0, 0),
            prefix_route("10.200.129.0/24", 1, 0, 1),
            prefix_route("10.200.130.0/24", 2, 1),  # home rail 2: no local GPU -> fallback
            prefix_route("10.200.131.0/24", 3),  # no rail: unreachable
        ),
        routes=(route("10.200.129.7", 0, 1),),
        unreachable=(IPv4Address("10.200.128.9"),),
    )
    got = kernel_routes(e, rto_min_ms=20)
    g0, g1 = IPv4Address("10.200.128.1"), IPv4Address("10.200.129.2")
    assert got == table(
        KernelRoute(IPv4Network("10.200.128.0/24"), netdev="rail0", src=g0, rto_min_ms=20),
        KernelRoute(
            IPv4Network("10.200.129.0/24"), nexthops=("rail0", "rail1"), src=g1, rto_min_ms=20
        ),
        KernelRoute(IPv4Network("10.200.130.0/24"), netdev="rail1", src=g0, rto_min_ms=20),
        KernelRoute(IPv4Network("10.200.131.0/24"), kind="unreachable"),
        KernelRoute(
            IPv4Address("10.200.129.7"), IPv4Address("10.100.0.2"), "rail0", src=g1, rto_min_ms=20
        ),
        KernelRoute(IPv4Address("10.200.128.9"), kind="unreachable"),
    )
    # routes.source: kernel, no rto_min: exactly the routes of before
    bare = kernel_routes(e, source=False)
    assert all(r.src is None and r.rto_min_ms is None for r in bare.values())
    assert bare[IPv4Network("10.200.128.0/24")] == KernelRoute(
        IPv4Network("10.200.128.0/24"), netdev="rail0"
    )


# -- stale neighbours ---------------------------------------------------------------------------

BEFORE = table(onlink("10.200.128.0/24", "rail0"), onlink("10.200.129.0/24", "rail1"))
NONE, FAILED, STALE, PROBE = 0x00, 0x20, 0x04, 0x10


def test_a_prefix_moved_off_a_rail_leaves_its_unresolved_entries_stale() -> None:
    # the fast path: rail 0 lost, its subnet now multipath over rails 1 and 2
    after = table(onlink("10.200.128.0/24", "rail1", "rail2"), onlink("10.200.129.0/24", "rail1"))
    assert lost_netdevs(BEFORE, after) == {"rail0"}
    entries = [
        N("10.200.128.2", "rail0", INCOMPLETE),  # the parked segment's entry
        N("10.200.128.6", "rail0", NONE),  # just created: its first packet waits there too
        N("10.200.128.3", "rail0", REACHABLE),  # resolved: packets leave the host; left alone
        N("10.200.128.7", "rail0", STALE),
        N("10.200.128.8", "rail0", PROBE),
        N("10.200.128.9", "rail0", FAILED),  # holds nothing
        N("10.200.128.2", "rail1", INCOMPLETE),  # the new path: kept
        N("10.200.129.2", "rail1", INCOMPLETE),  # untouched subnet
        N("10.100.0.2", "rail0", INCOMPLETE),  # not an address linkguard's routes send to
        N("10.200.128.4", "rail0", PERMANENT),
        N("10.200.128.5", "rail0", NOARP),
    ]
    assert stale_neighbours(BEFORE, after, entries) == entries[:2]


def test_a_32_exception_makes_one_address_stale_on_the_prefix_rail() -> None:
    # a peer lost its rail 1: its endpoint moves to a /32 via its rail-0 address
    after = {**BEFORE, **table(via("10.200.129.2", "10.100.0.2", "rail0"))}
    assert lost_netdevs(BEFORE, after) == {"rail1"}
    entries = [N("10.200.129.2", "rail1", INCOMPLETE), N("10.200.129.3", "rail1", INCOMPLETE)]
    assert stale_neighbours(BEFORE, after, entries) == entries[:1]
    # and back: the /32 goes, its gateway's entry on rail 0 is stale, the endpoint's on rail 1
    # is used again
    assert lost_netdevs(after, BEFORE) == {"rail0"}
    gw = N("10.100.0.2", "rail0", INCOMPLETE)
    assert stale_neighbours(after, BEFORE, [gw, *entries]) == [gw]


def test_a_gateway_still_used_by_another_route_is_kept() -> None:
    before = table(
        via("10.200.129.2", "10.100.0.2", "rail0"), via("10.200.129.3", "10.100.0.2", "rail0")
    )
    after = table(via("10.200.129.3", "10.100.0.2", "rail0"))
    gw = N("10.100.0.2", "rail0", INCOMPLETE)
    assert lost_netdevs(before, after) == {"rail0"}
    assert stale_neighbours(before, after, [gw]) == []
    # the same gateway out of another netdev does not keep the rail-0 entry
    moved = table(via("10.200.129.3", "10.100.0.2", "rail1"))
    assert stale_neighbours(before, moved, [gw]) == [gw]


@pytest.mark.parametrize("gone", ["unreachable", "deleted"])
def test_a_destination_without_a_path_leaves_its_entries_stale(gone: str) -> None:
    after = dict(BEFORE)
    if gone == "unreachable":
        after[IPv4Network("10.200.128.0/24")] = KernelRoute(
            IPv4Network("10.200.128.0/24"), kind="unreachable"
        )
    else:
        del after[IPv4Network("10.200.128.0/24")]
    assert lost_netdevs(BEFORE, after) == {"rail0"}
    parked = N("10.200.128.2", "rail0", INCOMPLETE)
    assert stale_neighbours(BEFORE, after, [parked]) == [parked]


def test_an_unchanged_or_growing_table_leaves_nothing_stale() -> None:
    entries = [N("10.200.128.2", "rail0", INCOMPLETE), N("10.200.129.2", "rail1", INCOMPLETE)]
    assert stale_neighbours(BEFORE, dict(BEFORE), entries) == []
    assert stale_neighbours({}, BEFORE, entries) == []
    assert lost_netdevs(BEFORE, dict(BEFORE)) == lost_netdevs({}, BEFORE) == set()
    # a rail added to a multipath route loses nothing
    wider = table(onlink("10.200.128.0/24", "rail0", "rail2"), onlink("10.200.129.0/24", "rail1"))
    assert lost_netdevs(BEFORE, wider) == set()


# -- in the applier -----------------------------------------------------------------------------


class _Kernelish(MemoryRouteTable):
    """An in-memory table with neighbour entries (the kernel's list and deletes), or a kernel
    that refuses to list them (``fail``)."""

    def __init__(self, entries: list[Neighbour], *, fail: bool = False) -> None:
        super().__init__()
        self.entries, self.fail = entries, fail
        self.deleted: list[Neighbour] = []

    async def neighbours(self, netdevs=None) -> list[Neighbour]:  # type: ignore[no-untyped-def]
        if self.fail:
            raise OSError("netlink: no buffer space")
        return [n for n in self.entries if netdevs is None or n.netdev in netdevs]

    async def delete_neighbours(self, entries) -> int:  # type: ignore[no-untyped-def]
        self.deleted += list(entries)
        return len(self.deleted)


FABRIC = generate_rail_optimized(hosts=3, rails=2)


def _applier(tmp: Path, table: MemoryRouteTable, **kw) -> Applier:  # type: ignore[no-untyped-def]
    return Applier(
        host="gpu000",
        table=table,
        netdevs={"rail0", "rail1"},
        prefixes=[IPv4Network("10.200.0.0/16")],
        rail_map_path=tmp / "rail-map.json",
        state_dir=tmp,
        **kw,
    )


async def test_the_fast_path_flushes_the_lost_rails_entries(tmp_path: Path) -> None:
    plan = solve(FABRIC, {}, epoch=3, now=0.0)["gpu000"]
    peer = FABRIC.host("gpu001").endpoints[0]  # GPU 0, home rail 0
    parked = N(str(peer), "rail0", INCOMPLETE)
    table = _Kernelish([parked, N(str(peer), "rail1")])
    a = _applier(tmp_path, table, rto_min_ms=20)
    await a.start()
    assert (await a.apply(plan)).result == "applied"
    assert await a.flush_stale() == 0
    assert table.deleted == []  # nothing was in use before the first plan
    own = FABRIC.host("gpu000").endpoints
    srcs = {r.src for r in table.routes.values() if r.kind == "unicast"}
    assert srcs and srcs <= set(own)
    assert {r.rto_min_ms for r in table.routes.values() if r.kind == "unicast"} == {20}
    fast = await a.port_down("mlx5_0/1")
    assert fast is not None and fast.result == "applied" and fast.fast_path
    assert table.deleted == []  # the flush is the caller's next step, after the ack
    assert await a.flush_stale() == 1
    assert table.deleted == [parked] and a.neighbours_flushed == 1
    assert await a.flush_stale() == 0  # once


async def test_no_flush_when_switched_off_and_a_failed_flush_never_fails_the_apply(
    tmp_path: Path,
) -> None:
    plan = solve(FABRIC, {}, epoch=3, now=0.0)["gpu000"]
    peer = FABRIC.host("gpu001").endpoints[0]
    off = _Kernelish([N(str(peer), "rail0", INCOMPLETE)])
    a = _applier(tmp_path / "off", off, neighbour_flush=False, route_source=False)
    await a.start()
    await a.apply(plan)
    assert (await a.port_down("mlx5_0/1")).result == "applied"  # type: ignore[union-attr]
    assert await a.flush_stale() == 0
    assert off.deleted == [] and a.neighbours_flushed == 0
    assert {r.src for r in off.routes.values()} == {None}
    broken = _Kernelish([], fail=True)
    b = _applier(tmp_path / "broken", broken)
    await b.start()
    await b.apply(plan)
    ack = await b.port_down("mlx5_0/1")
    assert ack is not None and ack.result == "applied"
    with capture_logs() as logs:
        assert await b.flush_stale() == 0
    assert [e["error"] for e in logs if e["event"] == "neighbour_flush_failed"] == [
        "OSError('netlink: no buffer space')"
    ]
