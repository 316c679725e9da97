"""The applier with compact plans, against an in-memory table: prefix routes, /32 exceptions
and unreachable /32s in the table; the fast path changes only what its backup changes; the
service's next plan converges without churn; a restart restores the table; refusals."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from linkguard.agent.applier import Applier, kernel_routes
from linkguard.agent.plans import effective
from linkguard.drivers.routes import KernelRoute
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.models import Backup, Plan, PrefixRoute
from tests.agent.plan_parts import prefix_route as _pr
from tests.agent.plan_parts import route as _route

HOST = "a"
NET = ipaddress.IPv4Network
ADDR = ipaddress.IPv4Address


def _plan(epoch: int, **fields) -> Plan:
    return Plan(host=HOST, epoch=epoch, issued_at=1.0, **fields)


# peer b's rail-1 endpoint 10.200.1.5 is reached over rail 0; 10.200.0.9 has no path
PLAN = _plan(
    3,
    prefix_routes=[_pr("10.200.0.0/24", 0, 0), _pr("10.200.1.0/24", 1, 1)],
    routes=[_route("10.200.1.5", 0, home=1)],
    unreachable=["10.200.0.9"],
    backups=[
        Backup(
            hca="mlx5_0",
            port=1,
            rail=0,
            prefix_routes=[_pr("10.200.0.0/24", 0, 1, 2)],
            withdraw=["10.200.1.5"],
        )
    ],
)

ONLINK0 = KernelRoute(NET("10.200.0.0/24"), netdev="rail0")
ONLINK1 = KernelRoute(NET("10.200.1.0/24"), netdev="rail1")
EXCEPTION = KernelRoute(ADDR("10.200.1.5"), ADDR("10.100.0.2"), "rail0")


def _unreachable(dest: str) -> KernelRoute:
    return KernelRoute(ADDR(dest), kind="unreachable")


def _applier(tmp: Path, table: MemoryRouteTable) -> Applier:
    return Applier(
        host=HOST,
        table=table,
        netdevs={"rail0", "rail1", "rail2"},
        prefixes=[NET("10.200.0.0/16")],
        rail_map_path=tmp / "rail-map.json",
        state_dir=tmp,
    )


async def test_apply_fast_path_then_next_plan_without_churn(tmp_path: Path) -> None:
    table = MemoryRouteTable(prefixes=[NET("10.200.0.0/16")])
    a = _applier(tmp_path, table)
    await a.start()
    ack = await a.apply(PLAN)
    assert (ack.result, ack.error) == ("applied", None)
    assert table.routes == {
        r.destination: r for r in (ONLINK0, ONLINK1, EXCEPTION, _unreachable("10.200.0.9"))
    }

    changes = table.changes
    fast = await a.port_down("mlx5_0/1")
    assert fast is not None and (fast.result, fast.fast_path) == ("applied", True)
    multipath = KernelRoute(NET("10.200.0.0/24"), nexthops=("rail1", "rail2"))
    assert table.routes == {
        r.destination: r
        for r in (multipath, ONLINK1, _unreachable("10.200.0.9"), _unreachable("10.200.1.5"))
    }
    # one prefix route replaced, the exception replaced by an unreachable /32: two writes
    assert (table.reconciles, table.updates, table.changes - changes) == (1, 1, 2)
    assert a.installed == table.routes

    # the service's next plan says what the backup said: a full reconcile changes nothing
    nxt = _plan(
        4,
        prefix_routes=[_pr("10.200.0.0/24", 0, 2, 1), _pr("10.200.1.0/24", 1, 1)],
        unreachable=["10.200.0.9", "10.200.1.5"],
    )
    a.port_up("mlx5_0/1")
    changes = table.changes
    assert (await a.apply(nxt)).result == "applied"
    assert (a.last_result.unchanged, table.changes - changes) == (4, 0)


async def test_restart_restores_the_compact_table(tmp_path: Path) -> None:
    first = MemoryRouteTable()
    a = _applier(tmp_path, first)
    await a.start()
    await a.apply(PLAN)
    again = MemoryRouteTable()
    b = _applier(tmp_path, again)
    await b.start()
    assert b.applied_epoch == 3 and again.routes == first.routes


async def test_missing_netdev_fails_that_route_only(tmp_path: Path) -> None:
    table = MemoryRouteTable(netdevs={"rail0", "rail1"})  # rail2 is configured but gone
    a = _applier(tmp_path, table)
    await a.start()
    await a.apply(PLAN)
    fast = await a.port_down("mlx5_0/1")
    assert fast is not None and fast.result == "failed"
    assert fast.error == "10.200.0.0/24: netdev rail2 not found"
    # the rest of the backup applied; the refused prefix route kept what it had
    assert table.routes[NET("10.200.0.0/24")] == ONLINK0
    assert table.routes[ADDR("10.200.1.5")] == _unreachable("10.200.1.5")
    assert NET("10.200.0.0/24") not in a.installed


async def test_refused_compact_plan_leaves_the_table(tmp_path: Path) -> None:
    table = MemoryRouteTable()
    a = _applier(tmp_path, table)
    await a.start()
    await a.apply(PLAN)
    before = dict(table.routes)
    bad = PrefixRoute(prefix="10.200.1.0/24", home_rail=1, rails=[1], netdevs=[None])
    ack = await a.apply(_plan(5, prefix_routes=[bad]))
    assert ack.result == "refused" and "out_of_scope" in (ack.error or "")
    ack = await a.apply(_plan(6, prefix_routes=[_pr("10.201.0.0/24", 0, 0)]))
    assert ack.result == "refused" and a.applied_epoch == 3 and table.routes == before


def test_kernel_routes_shapes() -> None:
    plan = _plan(
        1,
        prefix_routes=[
            _pr("10.200.0.0/24", 0, 0),
            _pr("10.200.1.0/24", 1, 0, 1),
            _pr("10.200.2.0/24", 2),  # no usable rail
        ],
        routes=[_route("10.200.0.7", 1, home=0)],
        unreachable=["10.200.1.9", "10.200.2.9", "10.200.7.7"],
    )
    assert kernel_routes(effective(plan, set())) == {
        NET("10.200.0.0/24"): ONLINK0,
        NET("10.200.1.0/24"): KernelRoute(NET("10.200.1.0/24"), nexthops=("rail0", "rail1")),
        NET("10.200.2.0/24"): KernelRoute(NET("10.200.2.0/24"), kind="unreachable"),
        ADDR("10.200.0.7"): KernelRoute(ADDR("10.200.0.7"), ADDR("10.100.1.2"), "rail1"),
        ADDR("10.200.1.9"): _unreachable("10.200.1.9"),  # under a multipath prefix route
    }
