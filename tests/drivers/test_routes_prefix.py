"""RouteTable with the compact plan's route shapes on a real namespace lab: on-link prefix
routes over one netdev, multipath on-link routes, ``unreachable`` routes, next to /32
exceptions; reconcile without churn (nexthop *sets* compared), replace on a changed nexthop
set, errors per route, the fast path, flush."""

from __future__ import annotations

import subprocess
from ipaddress import IPv4Address, IPv4Network

import pytest

from linkguard.drivers.routes import KernelRoute, RouteTable
from linkguard.simulations.lab import Lab
from tests.drivers.test_routes import (
    PREFIXES,
    TABLE,
    R,
    assert_foreign_intact,
    foreign,  # noqa: F401 - fixture
    ip,
    ip_json,
    table_routes,
)
from tests.support import require_root


def P(dst: str, *netdevs: str) -> KernelRoute:
    """An on-link prefix route (one netdev: plain; several: multipath)."""
    return KernelRoute(IPv4Network(dst), nexthops=netdevs)


def U(dst: str) -> KernelRoute:
    return KernelRoute(IPv4Network(dst), kind="unreachable")


def shapes(ns: str) -> dict[str, tuple]:
    """What ``ip route show table`` says, per destination: (type, scope, dev or sorted
    nexthop devs, gateway)."""
    out = {}
    for r in table_routes(ns, TABLE):
        devs = sorted(h["dev"] for h in r["nexthops"]) if "nexthops" in r else r.get("dev")
        out[r["dst"]] = (r.get("type", "unicast"), r.get("scope", "global"), devs, r.get("gateway"))
    return out


@pytest.fixture
def lab():
    require_root()
    lab = Lab.create(hosts=3, rails=3)
    try:
        yield lab
    finally:
        lab.destroy()


def test_kernel_route_normalises_its_spelling() -> None:
    assert KernelRoute(IPv4Network("10.200.1.1/32"), None, "rail0") == R(
        "10.200.1.1", None, "rail0"
    )
    assert P("10.200.1.0/24", "rail1", "rail0", "rail1").nexthops == ("rail0", "rail1")
    one = P("10.200.1.0/24", "rail2")
    assert (one.netdev, one.nexthops) == ("rail2", ())
    assert one == KernelRoute(IPv4Network("10.200.1.0/24"), netdev="rail2")
    assert U("10.200.3.4/32").destination == IPv4Address("10.200.3.4")


async def test_prefix_routes_reconcile_no_churn_replace_and_flush(lab: Lab, foreign: dict):  # noqa: F811
    ns = lab.hosts[0].netns
    first = [
        P("10.200.1.0/24", "rail0"),
        P("10.200.2.0/24", "rail1", "rail0"),
        U("10.200.3.0/24"),
        R("10.200.1.7", "10.100.1.2", "rail1"),  # an exception under the rail-0 prefix route
        U("10.200.2.9/32"),  # no path, though the multipath prefix route covers it
    ]
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.ensure_rules()
        res = await rt.reconcile(first)
        assert (res.added, res.replaced, res.deleted, res.unchanged, res.errors) == (5, 0, 0, 0, [])
        assert await rt.dump() == {r.destination: r for r in first}
        assert shapes(ns) == {
            "10.200.1.0/24": ("unicast", "link", "rail0", None),
            "10.200.2.0/24": ("unicast", "global", ["rail0", "rail1"], None),
            "10.200.3.0/24": ("unreachable", "global", None, None),
            "10.200.1.7": ("unicast", "global", "rail1", "10.100.1.2"),
            "10.200.2.9": ("unreachable", "global", None, None),
        }
        # longest prefix: the /32 exception and the unreachable /32 win over their prefixes
        (hop,) = ip_json(ns, "route", "get", "10.200.1.7")
        assert (hop["dev"], hop.get("gateway")) == ("rail1", "10.100.1.2")
        (hop,) = ip_json(ns, "route", "get", "10.200.1.5")
        assert (hop["dev"], hop.get("gateway")) == ("rail0", None)
        for dst in ("10.200.2.9", "10.200.3.1"):
            got = subprocess.run(
                ["ip", "-n", ns, "route", "get", dst], capture_output=True, text=True
            )
            assert got.returncode != 0 and "No route to host" in got.stderr

        # a second reconcile writes nothing, also with the nexthops listed in another order
        again = [*first[:1], P("10.200.2.0/24", "rail0", "rail1"), *first[2:]]
        res = await rt.reconcile(again)
        assert (res.added, res.replaced, res.deleted, res.unchanged, res.changed) == (0, 0, 0, 5, 0)

        # a changed nexthop set is a replace; so are single -> multipath and unicast -> unreachable
        second = [
            P("10.200.1.0/24", "rail0", "rail2"),
            P("10.200.2.0/24", "rail1", "rail2"),
            U("10.200.3.0/24"),
            U("10.200.1.7/32"),
        ]
        res = await rt.reconcile(second)
        assert (res.added, res.replaced, res.deleted, res.unchanged, res.errors) == (0, 3, 1, 1, [])
        assert await rt.dump() == {r.destination: r for r in second}
        assert shapes(ns) == {
            "10.200.1.0/24": ("unicast", "global", ["rail0", "rail2"], None),
            "10.200.2.0/24": ("unicast", "global", ["rail1", "rail2"], None),
            "10.200.3.0/24": ("unreachable", "global", None, None),
            "10.200.1.7": ("unreachable", "global", None, None),
        }

        # back to a single netdev; a prefix route no longer desired is deleted
        res = await rt.reconcile([P("10.200.1.0/24", "rail1")])
        assert (res.replaced, res.deleted, res.unchanged) == (1, 3, 0)
        assert shapes(ns) == {"10.200.1.0/24": ("unicast", "link", "rail1", None)}

        await rt.reconcile(first)
        assert await rt.flush() == 5
        assert table_routes(ns, TABLE) == []
    assert_foreign_intact(ns, foreign)


async def test_a_hand_made_route_of_another_shape_is_replaced(lab: Lab):
    ns = lab.hosts[0].netns
    # same netdevs, but weighted, listed twice, with the wrong scope or another type: not
    # what linkguard writes, so not "unchanged"
    ip(ns, "route", "add", "10.200.2.0/24", "table", str(TABLE),
       "nexthop", "dev", "rail0", "weight", "2", "nexthop", "dev", "rail1")  # fmt: skip
    ip(ns, "route", "add", "10.200.4.0/24", "table", str(TABLE),
       "nexthop", "dev", "rail0", "nexthop", "dev", "rail0", "nexthop", "dev", "rail1")  # fmt: skip
    ip(ns, "route", "add", "10.200.1.0/24", "dev", "rail0", "scope", "global", "table", str(TABLE))
    ip(ns, "route", "add", "blackhole", "10.200.3.0/24", "table", str(TABLE))
    want = [
        P("10.200.1.0/24", "rail0"),
        P("10.200.2.0/24", "rail0", "rail1"),
        U("10.200.3.0/24"),
        P("10.200.4.0/24", "rail0", "rail1"),
    ]
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        assert (await rt.dump())[IPv4Network("10.200.3.0/24")].kind == "blackhole"
        res = await rt.reconcile(want)
        assert (res.replaced, res.unchanged, res.errors) == (4, 0, [])
        assert (await rt.reconcile(want)).unchanged == 4
        assert shapes(ns) == {
            "10.200.1.0/24": ("unicast", "link", "rail0", None),
            "10.200.2.0/24": ("unicast", "global", ["rail0", "rail1"], None),
            "10.200.3.0/24": ("unreachable", "global", None, None),
            "10.200.4.0/24": ("unicast", "global", ["rail0", "rail1"], None),
        }
        weights = {
            h.get("weight", 1) for r in table_routes(ns, TABLE) for h in r.get("nexthops", [])
        }
        assert weights == {1}


async def test_refused_prefix_routes_go_to_errors_others_apply(lab: Lab):
    ns = lab.hosts[0].netns
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.reconcile([P("10.200.2.0/24", "rail0", "rail1")])
        ip(ns, "link", "set", "rail2", "down")  # admin down: the kernel refuses nexthops on it
        lab.link_down(0, 1)  # carrier down only: accepted
        res = await rt.reconcile(
            [
                P("10.200.1.0/24", "rail0", "nosuch0"),
                P("10.200.2.0/24", "rail0", "rail2"),
                P("10.200.3.0/24", "rail2"),
                P("10.200.4.0/24", "rail0", "rail1"),
                U("10.200.5.0/24"),
            ]
        )
        errors = dict(res.errors)
        assert errors == {
            IPv4Network("10.200.1.0/24"): "netdev nosuch0 not found",
            IPv4Network("10.200.2.0/24"): "Network is down (errno 100)",
            IPv4Network("10.200.3.0/24"): "Network is down (errno 100)",
        }
        assert (res.added, res.replaced, res.deleted, res.ok) == (2, 0, 0, False)
        # the refused replace left the old multipath route of 10.200.2.0/24 in place
        assert await rt.dump() == {
            r.destination: r
            for r in (
                P("10.200.2.0/24", "rail0", "rail1"),
                P("10.200.4.0/24", "rail0", "rail1"),
                U("10.200.5.0/24"),
            )
        }
        with pytest.raises(ValueError, match="outside the managed prefixes"):
            await rt.reconcile([P("10.0.0.0/8", "rail0")])  # wider than 10.200.0.0/16
        with pytest.raises(ValueError, match="names a next hop"):
            await rt.reconcile(
                [KernelRoute(IPv4Network("10.200.9.0/24"), None, "rail0", (), "unreachable")]
            )
        with pytest.raises(ValueError, match="kind"):
            await rt.reconcile([KernelRoute(IPv4Network("10.200.9.0/24"), kind="blackhole")])


async def test_update_writes_and_removes_prefix_routes(lab: Lab, foreign: dict):  # noqa: F811
    ns = lab.hosts[0].netns
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.reconcile(
            [P("10.200.1.0/24", "rail0"), P("10.200.2.0/24", "rail1"), U("10.200.3.0/24")]
        )
        # rail 0 went down here: its prefix spreads over rails 1 and 2, one endpoint has no path
        res = await rt.update(
            [P("10.200.1.0/24", "rail1", "rail2"), U("10.200.2.5/32")],
            remove=[IPv4Network("10.200.3.0/24"), IPv4Address("10.200.9.9")],
        )
        assert (res.replaced, res.deleted, res.errors) == (2, 1, [])
        assert await rt.dump() == {
            r.destination: r
            for r in (
                P("10.200.1.0/24", "rail1", "rail2"),
                P("10.200.2.0/24", "rail1"),
                U("10.200.2.5/32"),
            )
        }
        res = await rt.update([], remove=[IPv4Address("10.200.2.5")])
        assert (res.deleted, res.errors) == (1, [])
        bad = await rt.update([P("10.200.2.0/24", "rail1", "rail9")])
        assert bad.errors == [(IPv4Network("10.200.2.0/24"), "netdev rail9 not found")]
        assert (await rt.dump())[IPv4Network("10.200.2.0/24")] == P("10.200.2.0/24", "rail1")
    assert_foreign_intact(ns, foreign)
