"""The rail map a job sees and its change documents (pure): rails lost from port states, from
the plan moving a GPU and from the fast path; degraded ports; a change only when something a
job cares about changed."""

from __future__ import annotations

from linkguard.agent.plans import effective
from linkguard.agent.railmap import SCHEMA, RailChanges, assignments, degraded_ports, rail_view
from linkguard.models import LinkLayer, PortState, PortStatus
from linkguard.topology.solver import Solver
from tests.agent.rail_rig import FABRIC, HOST, rail_map

RAILS = {f"{h.hca}/{h.port}": h.rail for h in FABRIC.host(HOST).hcas}


def state(hca: str, status: PortStatus = PortStatus.UP, rate: float | None = 400.0) -> PortState:
    return PortState(
        host=HOST,
        hca=hca,
        port=1,
        rail=int(hca.split("_")[1]),
        link_layer=LinkLayer.INFINIBAND,
        status=status,
        usable=status == PortStatus.UP,
        rate_gbps=rate,
        observed_at=1.0,
    )


def states(**status: PortStatus) -> list[PortState]:
    return [state(f"mlx5_{r}", status.get(f"mlx5_{r}", PortStatus.UP)) for r in range(4)]


def test_assignments_match_the_applier_overlay() -> None:
    plan = Solver(FABRIC).plan(HOST, epoch=3, now=1.0)
    for down in ([], ["mlx5_1/1"], ["mlx5_0/1", "mlx5_2/1"]):
        used, fast = assignments(plan, down)
        eff = effective(plan, down)
        assert used == list(eff.rail_assignments)
        assert fast == tuple(sorted(eff.fast_path_ports))


def test_rails_lost_from_states_plan_and_fast_path() -> None:
    solver = Solver(FABRIC)
    whole = solver.plan(HOST, epoch=1, now=1.0)
    view = rail_view(plan=whole, rails=RAILS, states=states())
    assert (view.rails, view.lost, view.usable) == ((0, 1, 2, 3), (), (0, 1, 2, 3))
    assert dict(view.gpus) == rail_map(whole)

    held = rail_view(
        plan=whole,
        rails=RAILS,
        states=states(mlx5_2=PortStatus.HELD_DOWN, mlx5_3=PortStatus.SUPPRESSED),
    )
    assert held.lost == (2, 3) and held.held_down == ("mlx5_2/1",)
    assert held.suppressed == ("mlx5_3/1",) and held.down == ()

    solver.update({HOST: {1}})
    moved = solver.plan(HOST, epoch=2, now=1.0)
    view = rail_view(plan=moved, rails=RAILS, states=states())  # the port reads up again
    assert view.lost == (1,) and view.gpus["1"] != "mlx5_1:1"

    fast = rail_view(
        plan=whole,
        locally_down=["mlx5_0/1"],
        rails=RAILS,
        states=states(mlx5_0=PortStatus.DOWN),
    )
    assert fast.fast_path_ports == ("mlx5_0/1",) and fast.down == ("mlx5_0/1",)
    assert fast.lost == (0,) and fast.gpus["0"] != "mlx5_0:1"


def test_degraded_is_slower_than_the_fastest_up_port_of_its_link_layer() -> None:
    ports = [state("mlx5_0"), state("mlx5_1", rate=200.0), state("mlx5_2", PortStatus.DOWN, 0)]
    ports.append(state("mlx5_3", rate=None))
    assert degraded_ports(ports) == ["mlx5_1/1"]
    roce = state("mlx5_3", rate=100.0).model_copy(update={"link_layer": LinkLayer.ETHERNET})
    assert degraded_ports([*ports[:3], roce]) == ["mlx5_1/1"]  # compared with its own kind
    view = rail_view(plan=None, rails=RAILS, states=ports)
    assert view.degraded == ("mlx5_1/1",) and view.lost == (2,) and view.gpus == {}


def test_a_change_only_when_what_jobs_see_changes() -> None:
    solver = Solver(FABRIC)
    changes = RailChanges(HOST)
    first = solver.plan(HOST, epoch=1, now=1.0)
    assert changes.current(now=5.0)["seq"] == 0
    doc = changes.observe(rail_view(plan=first, rails=RAILS, states=states()), now=5, reason="plan")
    assert doc is not None
    assert doc == {
        "schema": SCHEMA,
        "seq": 1,
        "host": HOST,
        "epoch": 1,
        "time": 5,
        "reason": "plan",
        "rails_total": 4,
        "rails_usable": [0, 1, 2, 3],
        "rails_lost": [],
        "rail_map_before": None,
        "rail_map_after": rail_map(first),
        "ports_down": [],
        "ports_held_down": [],
        "ports_suppressed": [],
        "ports_degraded": [],
        "fast_path_ports": [],
    }
    assert changes.current(now=9.0) is doc
    same = solver.plan(HOST, epoch=2, now=2.0)  # a new epoch, nothing new for a job
    assert (
        changes.observe(rail_view(plan=same, rails=RAILS, states=states()), now=6, reason="plan")
        is None
    )
    solver.update({HOST: {2}})
    moved = solver.plan(HOST, epoch=3, now=3.0)
    nxt = changes.observe(rail_view(plan=moved, rails=RAILS, states=states()), now=7, reason="plan")
    assert nxt is not None and nxt["seq"] == 2 and nxt["epoch"] == 3
    assert nxt["rail_map_before"] == rail_map(first) and nxt["rail_map_after"] == rail_map(moved)
    assert nxt["rails_lost"] == [2] and nxt["rails_usable"] == [0, 1, 3]
