"""Agent-side plan checks, the fast-path overlay and the rail map."""

from __future__ import annotations

import ipaddress

import pytest

from linkguard.agent.plans import PlanRefused, check_plan, effective, nccl_ib_hca, rail_map
from linkguard.models import Backup, Plan, RailAssignment, RouteAssignment

EP = [ipaddress.IPv4Network("10.200.0.0/16")]


def _route(dest: str, rail: int, home: int | None = None) -> RouteAssignment:
    return RouteAssignment(
        destination=dest,
        peer="b",
        peer_gpu=0,
        rail=rail,
        home_rail=rail if home is None else home,
        netdev=f"rail{rail}",
        gateway=f"10.100.{rail}.2",
    )


def _ra(gpu: int, rail: int) -> RailAssignment:
    return RailAssignment(
        gpu=gpu,
        endpoint=f"10.200.0.{gpu + 1}",
        hca=f"mlx5_{rail}",
        port=1,
        rail=rail,
        home_rail=gpu,
    )


PLAN = Plan(
    host="a",
    epoch=7,
    issued_at=1.0,
    rail_assignments=[_ra(0, 0), _ra(1, 1)],
    routes=[_route("10.200.1.1", 0), _route("10.200.1.2", 1)],
    backups=[
        Backup(
            hca="mlx5_1",
            port=1,
            rail=1,
            rail_assignments=[_ra(1, 0)],
            routes=[_route("10.200.1.2", 0, home=1)],
        ),
        Backup(
            hca="mlx5_0",
            port=1,
            rail=0,
            rail_assignments=[_ra(0, 1)],
            routes=[_route("10.200.1.1", 1, home=0)],
        ),
    ],
)


def test_check_accepts_good_plan() -> None:
    check_plan(PLAN, host="a", applied_epoch=6, netdevs={"rail0", "rail1"}, prefixes=EP)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"host": "b"}, "wrong_host"),
        ({"applied_epoch": 7}, "stale_epoch"),
        ({"applied_epoch": 9}, "stale_epoch"),
        ({"netdevs": {"rail0"}}, "out_of_scope"),
        ({"prefixes": [ipaddress.IPv4Network("10.201.0.0/16")]}, "out_of_scope"),
    ],
)
def test_check_refuses(kw: dict, reason: str) -> None:
    args = dict(host="a", applied_epoch=6, netdevs={"rail0", "rail1"}, prefixes=EP) | kw
    with pytest.raises(PlanRefused) as e:
        check_plan(PLAN, **args)
    assert e.value.reason == reason


def test_effective_without_down_ports_is_the_plan() -> None:
    eff = effective(PLAN, set())
    assert [r.rail for r in eff.routes] == [0, 1]
    assert eff.fast_path_ports == ()


def test_effective_overlays_backup_of_down_port() -> None:
    eff = effective(PLAN, {"mlx5_1/1"})
    assert [(str(r.destination), r.rail) for r in eff.routes] == [
        ("10.200.1.1", 0),
        ("10.200.1.2", 0),
    ]
    assert [(a.gpu, a.rail) for a in eff.rail_assignments] == [(0, 0), (1, 0)]
    assert eff.fast_path_ports == ("mlx5_1/1",)


def test_effective_ignores_ports_without_backup() -> None:
    assert effective(PLAN, {"mlx5_9/1"}).routes == effective(PLAN, set()).routes


def test_backup_withdraw_removes_route() -> None:
    p = PLAN.model_copy(
        update={"backups": [Backup(hca="mlx5_0", port=1, rail=0, withdraw=["10.200.1.1"])]}
    )
    assert [str(r.destination) for r in effective(p, {"mlx5_0/1"}).routes] == ["10.200.1.2"]


def test_rail_map_and_nccl_string() -> None:
    eff = effective(PLAN, {"mlx5_1/1"})
    doc = rail_map("a", 7, eff)
    assert doc["nccl_ib_hca"] == "=mlx5_0:1"
    assert doc["per_gpu_nccl_ib_hca"] == {"0": "=mlx5_0:1", "1": "=mlx5_0:1"}
    assert doc["gpus"][1]["rail"] == 0 and doc["gpus"][1]["home_rail"] == 1
    assert nccl_ib_hca(PLAN.rail_assignments) == "=mlx5_0:1,mlx5_1:1"
