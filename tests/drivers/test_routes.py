"""RouteTable on a real namespace lab: rules, reconcile without churn, errors, refusal, flush,
and that no other table or rule is ever touched."""

from __future__ import annotations

import json
import subprocess
from ipaddress import IPv4Address, IPv4Network

import pytest

from linkguard.drivers.netlink import NetnsNotFoundError
from linkguard.drivers.routes import KernelRoute, RouteTable
from linkguard.simulations.lab import Lab
from tests.support import require_root

TABLE = 1042
PREFIXES = [IPv4Network("10.200.0.0/16")]


def ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)


def ip_json(ns: str, *args: str) -> list[dict]:
    out = subprocess.run(["ip", "-j", "-n", ns, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def rules(ns: str) -> list[tuple[int, str | None, str]]:
    return sorted(
        (
            r["priority"],
            f"{r['dst']}/{r.get('dstlen', 32)}" if "dst" in r else None,
            str(r["table"]),
        )
        for r in ip_json(ns, "rule", "show")
    )


def table_routes(ns: str, table: int | str) -> list[dict]:
    """Routes of one table, without ``flags`` (``linkdown`` follows the carrier)."""
    routes = ip_json(ns, "route", "show", "table", str(table))
    return [{k: v for k, v in r.items() if k != "flags"} for r in routes]


def R(dst: str, gw: str | None, dev: str | None) -> KernelRoute:
    return KernelRoute(IPv4Address(dst), IPv4Address(gw) if gw else None, dev)


@pytest.fixture
def lab():
    require_root()
    lab = Lab.create(hosts=3, rails=2)
    try:
        yield lab
    finally:
        lab.destroy()


@pytest.fixture
def foreign(lab: Lab):
    """Routes and a rule that linkguard must never touch, in host 0."""
    ns = lab.hosts[0].netns
    ip(ns, "route", "add", "10.200.2.1/32", "via", "10.100.0.3", "dev", "rail0")  # main
    ip(ns, "route", "add", "10.200.2.1/32", "via", "10.100.1.3", "table", "300")
    ip(ns, "route", "add", "10.77.0.0/16", "via", "10.100.1.3", "table", "300")
    ip(ns, "rule", "add", "to", "10.201.0.0/16", "lookup", "300", "priority", "1000")
    return {
        "main": table_routes(ns, "main"),
        "300": table_routes(ns, 300),
        "rule": (1000, "10.201.0.0/16", "300"),
    }


def assert_foreign_intact(ns: str, foreign: dict) -> None:
    assert table_routes(ns, "main") == foreign["main"]
    assert table_routes(ns, 300) == foreign["300"]
    assert foreign["rule"] in rules(ns)


async def test_rules_idempotent_and_scoped(lab: Lab, foreign: dict):
    ns = lab.hosts[0].netns
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.ensure_rules()
        await rt.ensure_rules()
        ours = [r for r in rules(ns) if r[2] == str(TABLE)]
        assert ours == [(1000, "10.200.0.0/16", str(TABLE))]
    # a new prefix set: the stale rule of ours goes, the foreign one at the same priority stays
    new = [IPv4Network("10.200.0.0/17"), IPv4Network("10.200.128.0/17")]
    async with RouteTable(table=TABLE, netns=ns, prefixes=new) as rt:
        await rt.ensure_rules()
        assert [r for r in rules(ns) if r[2] == str(TABLE)] == [
            (1000, "10.200.0.0/17", str(TABLE)),
            (1000, "10.200.128.0/17", str(TABLE)),
        ]
    assert_foreign_intact(ns, foreign)


async def test_reconcile_adds_replaces_deletes_without_churn(lab: Lab, foreign: dict):
    ns = lab.hosts[0].netns
    first = [
        R("10.200.1.1", "10.100.0.2", "rail0"),
        R("10.200.1.2", "10.100.1.2", "rail1"),
        R("10.200.2.1", "10.100.0.3", "rail0"),
        R("10.200.2.2", "10.100.1.3", "rail1"),
    ]
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.ensure_rules()
        res = await rt.reconcile(first)
        assert (res.added, res.replaced, res.deleted, res.unchanged, res.errors) == (4, 0, 0, 0, [])
        assert await rt.dump() == {r.destination: r for r in first}

        res = await rt.reconcile(first)
        assert (res.added, res.replaced, res.deleted, res.unchanged) == (0, 0, 0, 4)

        # rail 0 of host 1 failed: its endpoint moves to rail 1; one peer left, one arrived
        second = [
            R("10.200.1.1", "10.100.1.2", "rail1"),
            R("10.200.1.2", "10.100.1.2", "rail1"),
            R("10.200.2.1", "10.100.0.3", "rail0"),
            R("10.200.3.1", "10.100.0.3", "rail0"),
        ]
        res = await rt.reconcile(second)
        assert (res.added, res.replaced, res.deleted, res.unchanged) == (1, 1, 1, 2)
        assert await rt.dump() == {r.destination: r for r in second}
        kernel = sorted((r["dst"], r["gateway"], r["dev"]) for r in table_routes(ns, TABLE))
        assert kernel == sorted((str(r.destination), str(r.gateway), r.netdev) for r in second)

        # the data plane uses it: table + rule pick rail 1 for the moved endpoint
        (hop,) = ip_json(ns, "route", "get", "10.200.1.1", "from", "10.200.0.1")
        assert (hop["gateway"], hop["dev"], str(hop.get("table"))) == (
            "10.100.1.2",
            "rail1",
            str(TABLE),
        )
    assert_foreign_intact(ns, foreign)


async def test_bad_routes_go_to_errors_others_apply(lab: Lab, foreign: dict):
    ns = lab.hosts[0].netns
    lab.link_down(0, 1)  # carrier down on rail1: a gateway there still resolves (linkstate ignored)
    desired = [
        R("10.200.1.1", "10.100.0.2", "rail0"),
        R("10.200.1.2", "10.100.0.2", "nosuch0"),  # netdev missing
        R("10.200.2.1", "10.99.0.1", "rail0"),  # no connected route covers the gateway
        R("10.200.2.2", "10.100.1.3", "rail0"),  # gateway is on rail1's subnet, not rail0's
        R("10.200.2.3", "10.100.1.3", "rail1"),  # rail1 has no carrier: accepted
    ]
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        res = await rt.reconcile(desired)
        errors = dict(res.errors)
        assert set(errors) == {IPv4Address(a) for a in ("10.200.1.2", "10.200.2.1", "10.200.2.2")}
        assert errors[IPv4Address("10.200.1.2")] == "netdev nosuch0 not found"
        assert "unreachable" in errors[IPv4Address("10.200.2.1")].lower()
        assert res.added == 2 and not res.ok
        assert set(await rt.dump()) == {IPv4Address("10.200.1.1"), IPv4Address("10.200.2.3")}
    assert_foreign_intact(ns, foreign)


async def test_outside_prefixes_refused_before_touching_anything(lab: Lab, foreign: dict):
    ns = lab.hosts[0].netns
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.reconcile([R("10.200.1.1", "10.100.0.2", "rail0")])
        before = table_routes(ns, TABLE)
        with pytest.raises(ValueError, match="outside the managed prefixes"):
            await rt.reconcile(
                [R("10.200.1.2", "10.100.0.2", "rail0"), R("10.77.0.1", "10.100.0.2", "rail0")]
            )
        with pytest.raises(ValueError, match="twice"):
            await rt.reconcile([R("10.200.1.2", "10.100.0.2", "rail0")] * 2)
        assert table_routes(ns, TABLE) == before
    with pytest.raises(ValueError):
        RouteTable(table=254)


async def test_flush_removes_only_our_table_and_rules(lab: Lab, foreign: dict):
    ns = lab.hosts[0].netns
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.ensure_rules()
        await rt.reconcile([R("10.200.1.1", "10.100.0.2", "rail0"), R("10.200.1.2", None, "rail1")])
        ip(
            ns, "route", "add", "10.200.5.0/24", "via", "10.100.0.2", "table", str(TABLE)
        )  # not a /32
        assert await rt.flush() == 3
        assert table_routes(ns, TABLE) == []
        assert [r for r in rules(ns) if r[2] == str(TABLE)] == []
    assert_foreign_intact(ns, foreign)


async def test_reconcile_256_routes(lab: Lab):
    ns = lab.hosts[0].netns
    desired = [
        R(f"10.200.{10 + i // 200}.{i % 200 + 1}", "10.100.0.2", "rail0") for i in range(256)
    ]
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        first = await rt.reconcile(desired)
        again = await rt.reconcile(desired)
        moved = await rt.reconcile([R(str(r.destination), "10.100.1.2", "rail1") for r in desired])
        assert (first.added, again.unchanged, moved.replaced) == (256, 256, 256)
        assert len(await rt.dump()) == 256
        print(
            f"\nreconcile 256 routes: add {first.elapsed_ms:.1f} ms, unchanged "
            f"{again.elapsed_ms:.1f} ms, replace all {moved.elapsed_ms:.1f} ms"
        )
        assert await rt.flush() == 256


async def test_missing_namespace():
    require_root()
    with pytest.raises(NetnsNotFoundError):
        async with RouteTable(table=TABLE, netns="lgnosuchnetns"):
            pass


async def test_update_changes_only_what_it_is_given(lab: Lab, foreign: dict) -> None:
    ns = lab.hosts[0].netns
    async with RouteTable(table=TABLE, netns=ns, prefixes=PREFIXES) as rt:
        await rt.reconcile(
            [
                R("10.200.1.1", "10.100.0.2", "rail0"),
                R("10.200.1.2", "10.100.1.2", "rail1"),
                R("10.200.2.2", "10.100.1.3", "rail1"),
            ]
        )
        res = await rt.update(
            [R("10.200.1.1", "10.100.1.2", "rail1")],
            remove=[IPv4Address("10.200.2.2"), IPv4Address("10.200.9.9")],
        )
        assert (res.replaced, res.deleted, res.errors) == (1, 1, [])
        assert await rt.dump() == {
            IPv4Address("10.200.1.1"): R("10.200.1.1", "10.100.1.2", "rail1"),
            IPv4Address("10.200.1.2"): R("10.200.1.2", "10.100.1.2", "rail1"),
        }
        bad = await rt.update([R("10.200.1.2", "10.100.0.2", "rail9")])
        assert bad.errors == [(IPv4Address("10.200.1.2"), "netdev rail9 not found")]
        with pytest.raises(ValueError, match="outside the managed prefixes"):
            await rt.update([R("10.9.9.9", "10.100.0.2", "rail0")])
    assert_foreign_intact(ns, foreign)
