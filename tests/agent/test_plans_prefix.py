"""Compact plans on the agent side: prefix routes in the scope checks and in the fast-path
overlay, /32 exceptions over them, and which destinations without a path need an
``unreachable`` /32."""

from __future__ import annotations

import ipaddress

import pytest

from linkguard.agent.plans import PlanRefused, check_plan, effective
from linkguard.models import Backup, Plan, PrefixRoute
from tests.agent.plan_parts import prefix_route as _pr
from tests.agent.plan_parts import route as _route

EP = [ipaddress.IPv4Network("10.200.0.0/16")]
NETDEVS = {"rail0", "rail1", "rail2"}
A = ipaddress.IPv4Address


# Peer b's rail 1 is down: its rail-1 endpoint 10.200.1.5 is reached over rail 0 (a /32
# exception); 10.200.0.9 has no rail in common with us; 10.200.9.1 is under no prefix route.
PLAN = Plan(
    host="a",
    epoch=7,
    issued_at=1.0,
    prefix_routes=[_pr("10.200.1.0/24", 1, 1), _pr("10.200.0.0/24", 0, 0)],
    routes=[_route("10.200.1.5", 0, home=1)],
    unreachable=["10.200.0.9", "10.200.9.1"],
    backups=[
        Backup(  # our rail 0 goes: its prefix moves to rail 1, the exception has no path left
            hca="mlx5_0",
            port=1,
            rail=0,
            prefix_routes=[_pr("10.200.0.0/24", 0, 1)],
            withdraw=["10.200.1.5"],
        ),
        Backup(  # our rail 1 goes: its prefix spreads over rails 0 and 2
            hca="mlx5_1",
            port=1,
            rail=1,
            prefix_routes=[_pr("10.200.1.0/24", 1, 0, 2)],
        ),
        Backup(  # our rail 2 goes: (made up) 10.200.0.9 is reachable over rail 1
            hca="mlx5_2",
            port=1,
            rail=2,
            routes=[_route("10.200.0.9", 1, home=0)],
        ),
    ],
)


def _pairs(eff) -> list[tuple[str, list[int]]]:
    return [(str(p.prefix), p.rails) for p in eff.prefix_routes]


def test_no_down_port_is_the_plan() -> None:
    eff = effective(PLAN, set())
    assert _pairs(eff) == [("10.200.0.0/24", [0]), ("10.200.1.0/24", [1])]
    assert [(str(r.destination), r.rail) for r in eff.routes] == [("10.200.1.5", 0)]
    # covered by the rail-0 prefix route: needs an unreachable /32; 10.200.9.1 is not covered
    assert eff.unreachable == (A("10.200.0.9"),)


def test_backup_replaces_a_prefix_route_and_withdraws_under_another() -> None:
    eff = effective(PLAN, {"mlx5_0/1"})
    assert _pairs(eff) == [("10.200.0.0/24", [1]), ("10.200.1.0/24", [1])]
    assert eff.routes == ()
    # the withdrawn exception would otherwise go out over rail 1, where b cannot receive it
    assert eff.unreachable == (A("10.200.0.9"), A("10.200.1.5"))
    assert eff.fast_path_ports == ("mlx5_0/1",)


def test_backup_spreads_a_prefix_over_two_rails() -> None:
    eff = effective(PLAN, {"mlx5_1/1"})
    assert _pairs(eff) == [("10.200.0.0/24", [0]), ("10.200.1.0/24", [0, 2])]
    assert [(str(r.destination), r.rail) for r in eff.routes] == [("10.200.1.5", 0)]
    assert eff.unreachable == (A("10.200.0.9"),)


def test_two_backups_overlay() -> None:
    eff = effective(PLAN, {"mlx5_2/1", "mlx5_0/1"})
    assert _pairs(eff) == [("10.200.0.0/24", [1]), ("10.200.1.0/24", [1])]
    assert [(str(r.destination), r.rail) for r in eff.routes] == [("10.200.0.9", 1)]
    # 10.200.0.9 got a route from one backup, 10.200.1.5 lost its route to the other
    assert eff.unreachable == (A("10.200.1.5"),)
    assert eff.fast_path_ports == ("mlx5_0/1", "mlx5_2/1")


def test_no_unreachable_32_under_an_unreachable_prefix_or_a_longer_one() -> None:
    plan = Plan(
        host="a",
        epoch=1,
        issued_at=1.0,
        prefix_routes=[_pr("10.200.0.0/16", 0, 0), _pr("10.200.1.0/24", 1)],  # /24: no rails
        unreachable=["10.200.1.7", "10.200.2.7"],
    )
    # 10.200.1.7: its longest prefix route is already unreachable; 10.200.2.7 would go out
    assert effective(plan, set()).unreachable == (A("10.200.2.7"),)


def test_plan_without_prefix_routes_is_as_before() -> None:
    plan = Plan(
        host="a",
        epoch=1,
        issued_at=1.0,
        routes=[_route("10.200.1.1", 0, home=0)],
        unreachable=["10.200.2.1"],
        backups=[Backup(hca="mlx5_0", port=1, rail=0, withdraw=["10.200.1.1"])],
    )
    for down in (set(), {"mlx5_0/1"}):
        eff = effective(plan, down)
        assert (eff.prefix_routes, eff.unreachable) == ((), ())
    assert effective(plan, {"mlx5_0/1"}).routes == ()


def test_check_accepts_compact_plan_and_unreachable_prefix_route() -> None:
    check_plan(PLAN, host="a", applied_epoch=6, netdevs=NETDEVS, prefixes=EP)
    # a host with no usable rail: unreachable prefix routes name no netdev
    lost = Plan(host="a", epoch=7, issued_at=1.0, prefix_routes=[_pr("10.200.0.0/24", 0)])
    check_plan(lost, host="a", applied_epoch=6, netdevs=set(), prefixes=EP)


def _with(**update) -> Plan:
    return PLAN.model_copy(update=update)


def _backup(*prs: PrefixRoute) -> Backup:
    return Backup(hca="mlx5_0", port=1, rail=0, prefix_routes=list(prs))


@pytest.mark.parametrize(
    ("plan", "reason", "detail"),
    [
        (_with(prefix_routes=[_pr("10.201.0.0/24", 0, 0)]), "out_of_scope", "prefix 10.201.0.0/24"),
        (_with(prefix_routes=[_pr("10.0.0.0/8", 0, 0)]), "out_of_scope", "prefix 10.0.0.0/8"),
        (_with(prefix_routes=[_pr("10.200.0.0/24", 0, 0, 5)]), "out_of_scope", "'rail5'"),
        (
            _with(
                prefix_routes=[
                    PrefixRoute(
                        prefix="10.200.0.0/24", home_rail=0, rails=[0, 1], netdevs=["rail0", None]
                    )
                ]
            ),
            "out_of_scope",
            "rail 1 netdev None",
        ),
        (_with(backups=[_backup(_pr("10.200.0.0/24", 0, 7))]), "out_of_scope", "'rail7'"),
        (_with(backups=[_backup(_pr("10.202.0.0/24", 0, 1))]), "out_of_scope", "10.202.0.0/24"),
        (
            _with(prefix_routes=[_pr("10.200.0.0/24", 0, 0), _pr("10.200.0.0/24", 0, 1)]),
            "invalid",
            "listed twice",
        ),
    ],
)
def test_check_refuses_prefix_routes(plan: Plan, reason: str, detail: str) -> None:
    with pytest.raises(PlanRefused) as e:
        check_plan(plan, host="a", applied_epoch=6, netdevs=NETDEVS, prefixes=EP)
    assert e.value.reason == reason and detail in e.value.detail
