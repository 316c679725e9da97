"""MemoryRouteTable keeps RouteTable's semantics in memory: every route shape, no churn for an
equal route (nexthop sets compared), replace on a change, errors per route, validation."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from linkguard.drivers.routes import KernelRoute
from linkguard.drivers.simulated import MemoryRouteTable


def P(dst: str, *netdevs: str) -> KernelRoute:
    return KernelRoute(IPv4Network(dst), nexthops=netdevs)


U = KernelRoute(IPv4Address("10.200.1.9"), kind="unreachable")
EXC = KernelRoute(IPv4Address("10.200.1.5"), IPv4Address("10.100.0.2"), "rail0")


def counts(res) -> tuple[int, int, int, int]:
    return (res.added, res.replaced, res.deleted, res.unchanged)


async def test_reconcile_update_and_counts() -> None:
    t = MemoryRouteTable(
        netdevs={"rail0", "rail1", "rail2"}, prefixes=[IPv4Network("10.200.0.0/16")]
    )
    first = [P("10.200.1.0/24", "rail0", "rail1"), P("10.200.2.0/24", "rail2"), EXC, U]
    assert counts(await t.reconcile(first)) == (4, 0, 0, 0)
    again = [P("10.200.1.0/24", "rail1", "rail0"), *first[1:]]  # same nexthop set
    assert counts(await t.reconcile(again)) == (0, 0, 0, 4)
    changed = [P("10.200.1.0/24", "rail1", "rail2"), P("10.200.2.0/24", "rail2"), U]
    assert counts(await t.reconcile(changed)) == (0, 1, 1, 2)
    assert t.changes == 6 and await t.dump() == {r.destination: r for r in changed}

    res = await t.update(
        [P("10.200.2.0/24", "rail0", "rail9")], remove=[IPv4Network("10.200.1.0/24")]
    )
    assert res.errors == [(IPv4Network("10.200.2.0/24"), "netdev rail9 not found")]
    assert (res.replaced, res.deleted) == (0, 1)
    assert await t.dump() == {r.destination: r for r in (P("10.200.2.0/24", "rail2"), U)}


async def test_validation_before_any_change() -> None:
    t = MemoryRouteTable(prefixes=[IPv4Network("10.200.0.0/16")])
    await t.reconcile([U])
    for bad, match in [
        ([U, U], "twice"),
        ([P("10.0.0.0/8", "rail0")], "outside the managed prefixes"),
        ([KernelRoute(IPv4Network("10.200.3.0/24"))], "neither gateway nor netdev"),
        (
            [KernelRoute(IPv4Network("10.200.3.0/24"), netdev="rail0", kind="unreachable")],
            "next hop",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            await t.reconcile(bad)
    assert await t.dump() == {U.destination: U}
