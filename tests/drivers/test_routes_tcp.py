"""What the route table writes so that TCP follows a reroute, on a real namespace lab: a route's
preferred source and locked ``rto_min`` round-trip through the kernel without churn, a source
that is not local is left out (said once), and neighbour entries are listed and deleted
(never a permanent one, never another netdev's)."""

from __future__ import annotations

import json
import subprocess
from ipaddress import IPv4Address, IPv4Network

import pytest
import structlog

from linkguard.drivers.routes import KernelRoute, Neighbour, RouteTable
from linkguard.simulations.lab import Lab
from tests.support import require_root

TABLE = 1043
PREFIXES = [IPv4Network("10.200.0.0/16")]
NUD_REACHABLE, NUD_PERMANENT = 0x02, 0x80


def ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)


def ip_json(ns: str, *args: str) -> list[dict]:
    out = subprocess.run(["ip", "-j", "-n", ns, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


@pytest.fixture
def lab():
    require_root()
    lab = Lab.create(hosts=2, rails=2)
    try:
        yield lab
    finally:
        lab.destroy()


async def test_src_and_rto_min_round_trip_without_churn(lab: Lab) -> None:
    ns = lab.hosts[0].netns
    src = lab.hosts[0].endpoints[0]  # 10.200.0.1 on lo
    want = [
        KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail0", src=src, rto_min_ms=20),
        KernelRoute(
            IPv4Network("10.200.9.0/24"), nexthops=("rail0", "rail1"), src=src, rto_min_ms=20
        ),
        KernelRoute(IPv4Address("10.200.5.5"), IPv4Address("10.100.1.2"), "rail1", src=src),
        KernelRoute(IPv4Address("10.200.5.6"), kind="unreachable"),
    ]
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.ensure_rules()
        first = await rt.reconcile(want)
        assert (first.added, first.errors) == (4, [])
        assert await rt.dump() == {r.destination: r for r in want}
        again = await rt.reconcile(want)
        assert (again.unchanged, again.changed) == (4, 0)
        # the same routes without rto_min (and one without src) are a change, not "unchanged"
        plain = [
            KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail0", src=src),
            KernelRoute(IPv4Network("10.200.9.0/24"), nexthops=("rail0", "rail1"), src=src),
            KernelRoute(IPv4Address("10.200.5.5"), IPv4Address("10.100.1.2"), "rail1"),
            want[3],
        ]
        res = await rt.reconcile(plain)
        assert (res.replaced, res.unchanged, res.errors) == (3, 1, [])
        assert await rt.dump() == {r.destination: r for r in plain}
    shown = {r["dst"]: r for r in ip_json(ns, "route", "show", "table", str(TABLE))}
    assert shown["10.200.1.0/24"]["prefsrc"] == "10.200.0.1"
    assert "metrics" not in shown["10.200.1.0/24"]


async def test_rto_min_is_what_ip_route_writes(lab: Lab) -> None:
    ns = lab.hosts[0].netns
    r = KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail0", rto_min_ms=20)
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.reconcile([r])
    text = subprocess.run(
        ["ip", "-n", ns, "route", "show", "table", str(TABLE)], capture_output=True, text=True
    ).stdout
    assert "rto_min lock 20ms" in text
    # and a route written by `ip route ... rto_min 20ms` is the same route: left alone
    ip(ns, "route", "replace", "10.200.1.0/24", "dev", "rail0", "table", str(TABLE),
       "rto_min", "20ms")  # fmt: skip
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        res = await rt.reconcile([r])
        assert (res.unchanged, res.changed) == (1, 0)
        # a route with another metric besides is rewritten as linkguard writes it
        ip(ns, "route", "replace", "10.200.1.0/24", "dev", "rail0", "table", str(TABLE),
           "rto_min", "20ms", "mtu", "1400")  # fmt: skip
        res = await rt.reconcile([r])
        assert (res.replaced, res.unchanged) == (1, 0)
    text = subprocess.run(
        ["ip", "-n", ns, "route", "show", "table", str(TABLE)], capture_output=True, text=True
    ).stdout
    assert "mtu" not in text and "rto_min lock 20ms" in text


async def test_a_src_that_is_not_local_is_left_out_and_said_once(lab: Lab) -> None:
    ns = lab.hosts[0].netns
    other = lab.hosts[1].endpoints[0]  # host1's endpoint: not an address of host0
    want = [
        KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail0", src=other),
        KernelRoute(IPv4Network("10.200.2.0/24"), netdev="rail1", src=other),
    ]
    with structlog.testing.capture_logs() as logs:
        async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
            res = await rt.reconcile(want)
            assert (res.added, res.errors) == (2, [])
            assert {r.src for r in (await rt.dump()).values()} == {None}
            again = await rt.reconcile(want)  # compared without the src: no churn
            assert (again.unchanged, again.changed) == (2, 0)
            upd = await rt.update([want[0]])
            assert upd.errors == []
    said = [e for e in logs if e["event"] == "route_src_not_local"]
    assert [e["src"] for e in said] == [str(other)]


async def test_neighbours_listed_and_deleted(lab: Lab) -> None:
    ns = lab.hosts[0].netns
    ip(ns, "neigh", "replace", "10.200.7.7", "lladdr", "02:00:00:00:00:07", "dev", "rail0",
       "nud", "reachable")  # fmt: skip
    ip(ns, "neigh", "replace", "10.200.7.8", "lladdr", "02:00:00:00:00:08", "dev", "rail0",
       "nud", "permanent")  # fmt: skip
    ip(ns, "neigh", "replace", "10.200.7.7", "lladdr", "02:00:00:00:00:17", "dev", "rail1",
       "nud", "reachable")  # fmt: skip
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        on_rail0 = {(n.address, n.netdev): n for n in await rt.neighbours(["rail0"])}
        assert set(on_rail0) == {
            (IPv4Address("10.200.7.7"), "rail0"),
            (IPv4Address("10.200.7.8"), "rail0"),
        }
        assert on_rail0[(IPv4Address("10.200.7.8"), "rail0")].permanent
        assert on_rail0[(IPv4Address("10.200.7.7"), "rail0")].state == NUD_REACHABLE
        gone = [
            Neighbour(IPv4Address("10.200.7.7"), "rail0", NUD_REACHABLE),
            Neighbour(IPv4Address("10.200.7.8"), "rail0", NUD_PERMANENT),  # never deleted
            Neighbour(IPv4Address("10.200.7.9"), "rail0", NUD_REACHABLE),  # not there: no error
            Neighbour(IPv4Address("10.200.7.9"), "nosuchdev", NUD_REACHABLE),
        ]
        assert await rt.delete_neighbours(gone) == 1
        left = {(str(n.address), n.netdev) for n in await rt.neighbours()}
    assert ("10.200.7.7", "rail0") not in left
    assert {("10.200.7.8", "rail0"), ("10.200.7.7", "rail1")} <= left


async def test_a_src_removed_after_it_was_seen_is_dropped_at_the_next_write(lab: Lab) -> None:
    ns = lab.hosts[0].netns
    src = lab.hosts[0].endpoints[1]  # 10.200.0.2 on lo
    first = KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail0", src=src)
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        assert (await rt.reconcile([first])).errors == []
        ip(ns, "addr", "del", f"{src}/32", "dev", "lo")  # the kernel drops the route with it
        moved = KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail1", src=src)
        with structlog.testing.capture_logs() as logs:
            res = await rt.update([moved])  # the fast path: no address dump before it
        assert res.errors == [] and res.replaced == 1
        assert await rt.dump() == {
            moved.destination: KernelRoute(moved.destination, netdev="rail1")
        }
    assert [e["src"] for e in logs if e["event"] == "route_src_not_local"] == [str(src)]
