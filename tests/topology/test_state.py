"""The service's pure core: which states trigger a solve, epochs, diffs and pending acks."""

from __future__ import annotations

from linkguard.models import Ack, AckResult, PortState, PortStatus
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import Solver, solve
from linkguard.topology.state import FabricState

FABRIC = generate_rail_optimized(hosts=4, rails=4)


def _st(host: str, hca: str, status: PortStatus, seq: int = 1, at: float = 1.0) -> PortState:
    return PortState(
        host=host,
        hca=hca,
        port=1,
        status=status,
        usable=status == PortStatus.UP,
        observed_at=at,
        seq=seq,
    )


def test_only_usability_changes_trigger_a_solve() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=100)
    s.solve(0.0)
    assert s.on_port_state(_st("gpu000", "mlx5_1", PortStatus.UP)) is True  # first sight
    assert s.on_port_state(_st("gpu000", "mlx5_1", PortStatus.UP, seq=2)) is False
    assert s.on_port_state(_st("gpu000", "mlx5_1", PortStatus.DOWN, seq=3)) is True
    # down -> held_down: still unusable, nothing to re-plan
    assert s.on_port_state(_st("gpu000", "mlx5_1", PortStatus.HELD_DOWN, seq=4)) is False
    assert s.unusable() == {"gpu000": frozenset({1})}
    # unknown (unreadable) counts as usable: no information never reroutes
    s.on_port_state(_st("gpu001", "mlx5_2", PortStatus.UNKNOWN))
    assert "gpu001" not in s.unusable()


def test_unknown_port_and_late_old_state_are_ignored() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=1)
    assert s.on_port_state(_st("gpu000", "mlx5_9", PortStatus.DOWN)) is False
    assert ("gpu000", "mlx5_9/1") in s.ignored_ports
    s.on_port_state(_st("gpu000", "mlx5_0", PortStatus.DOWN, seq=5, at=10.0))
    assert s.on_port_state(_st("gpu000", "mlx5_0", PortStatus.UP, seq=4, at=9.0)) is False
    assert s.unusable() == {"gpu000": frozenset({0})}


def test_epochs_grow_and_unchanged_hosts_get_nothing() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=100)
    first = s.solve(0.0)
    assert first.epoch == 100 and len(first.plans) == 4
    assert s.solve(1.0).plans == []  # nothing changed: nothing to publish
    s.on_port_state(_st("gpu002", "mlx5_3", PortStatus.DOWN))
    second = s.solve(2.0)
    # gpu002's peer routes take 101, its own (now full) plan 102; the whole hosts ack 101
    assert second.epoch == 102 and second.peers[0].epoch == 101
    assert {p.host: p.epoch for p in second.plans} == {
        "gpu000": 101,
        "gpu001": 101,
        "gpu002": 102,
        "gpu003": 101,
    }


def _retained(unusable: dict[str, frozenset[int]], epoch: int):
    """What a previous service left retained: compact plans (full for impaired hosts) and the
    impaired hosts' peer routes."""
    s = Solver(FABRIC, unusable)
    plans = [s.compact_plan(h, epoch=epoch, now=0.0) for h in FABRIC.host_names]
    return plans, [s.peer_routes(h, epoch=epoch, now=0.0) for h in sorted(unusable)]


def test_restart_continues_above_retained_epochs_without_churn() -> None:
    plans, peers = _retained({"gpu000": frozenset({0})}, 5000)
    assert [p.shared is None for p in plans] == [True, False, False, False]
    s = FabricState(fabric=FABRIC, epoch_start=10)  # a clock that went backwards
    for p in plans:
        s.on_retained_plan(p)
    for pr in peers:
        s.on_retained_peers(pr)
    s.on_port_state(_st("gpu000", "mlx5_0", PortStatus.DOWN))
    first = s.solve(1.0)
    assert first.publish == [] and first.peers == []  # as retained: nothing to publish
    # the full plans carry the epochs the hosts acked; whole hosts route to gpu000's GPU 0
    assert {p.epoch for p in s.plans.values()} == {5000}
    assert [(r.peer, r.peer_gpu) for r in s.plans["gpu001"].routes] == [("gpu000", 0)]

    s.on_port_state(_st("gpu000", "mlx5_0", PortStatus.UP, seq=2, at=2.0))
    second = s.solve(2.0)
    assert [(pr.host, pr.epoch, pr.classes) for pr in second.peers] == [("gpu000", 5001, [])]
    # the plans of the same solve come one epoch above its peer routes
    assert [p.host for p in second.publish] == ["gpu000"]  # now compact
    assert second.publish[0].shared is not None and second.publish[0].epoch == 5002
    # every host is compact now: each acks the higher of its plan's and the peers' epochs
    assert len(second.plans) == 4
    assert {h: p.epoch for h, p in s.plans.items()} == {
        "gpu000": 5002,
        "gpu001": 5001,
        "gpu002": 5001,
        "gpu003": 5001,
    }
    assert all(p.routes == [] for p in s.plans.values())


def test_commit_renumbers_when_a_higher_epoch_arrived_during_the_solve() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=10)
    fresh = s.compute(s.prepare(), now=0.0)
    s.on_retained_plan(solve(FABRIC, {"gpu000": frozenset({0})}, epoch=50, now=0.0)["gpu000"])
    solved = s.commit(fresh)
    assert solved.epoch == 51 and {p.epoch for p in solved.publish} == {51}
    assert {p.epoch for p in s.plans.values()} == {51}


def test_a_peer_change_is_one_message_and_every_whole_host_owes_its_ack() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=7)
    s.solve(0.0)
    for h in FABRIC.host_names:
        s.on_ack(Ack(host=h, epoch=7, result=AckResult.APPLIED, applied_at=1.0))
    assert s.pending_acks() == []
    s.on_port_state(_st("gpu002", "mlx5_3", PortStatus.DOWN))
    solved = s.solve(1.0)
    # gpu002's own plan (now full) and its peer routes; the whole hosts' plans stay as they are
    assert [p.host for p in solved.publish] == ["gpu002"] and solved.publish[0].shared is None
    assert [pr.host for pr in solved.peers] == ["gpu002"]
    assert [p.host for p in solved.plans] == FABRIC.host_names  # every full plan changed
    assert s.pending_acks() == FABRIC.host_names
    assert solved.peers[0].epoch == 8 and solved.publish[0].epoch == 9
    # an ack of the compact plan's epoch alone is not enough: the peers' epoch (8) is due;
    # gpu002 owes its plan's (9), not the peers' that reached it first
    s.on_ack(Ack(host="gpu000", epoch=7, result=AckResult.APPLIED, applied_at=2.0))
    s.on_ack(Ack(host="gpu001", epoch=8, result=AckResult.APPLIED, applied_at=2.0))
    s.on_ack(Ack(host="gpu002", epoch=8, result=AckResult.APPLIED, applied_at=2.0))
    assert s.pending_acks() == ["gpu000", "gpu002", "gpu003"]


def test_pending_acks() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=7)
    s.solve(0.0)
    assert s.pending_acks() == ["gpu000", "gpu001", "gpu002", "gpu003"]
    for h in ("gpu000", "gpu001", "gpu002"):
        s.on_ack(Ack(host=h, epoch=7, result=AckResult.APPLIED, applied_at=1.0))
    s.on_ack(Ack(host="gpu003", epoch=7, result=AckResult.FAILED, applied_at=1.0, error="x"))
    assert s.pending_acks() == ["gpu003"]


def test_incremental_solves_track_the_full_solve() -> None:
    """The state hands the solver only the hosts whose rails changed; after every solve its
    plans equal a full solve of what it knows."""
    s = FabricState(fabric=FABRIC, epoch_start=1)
    s.solve(0.0)
    steps = [
        ("gpu001", "mlx5_2", PortStatus.DOWN),
        ("gpu003", "mlx5_0", PortStatus.DOWN),
        ("gpu001", "mlx5_2", PortStatus.HELD_DOWN),  # still unusable: no change
        ("gpu001", "mlx5_2", PortStatus.UP),
        ("gpu003", "mlx5_0", PortStatus.UP),
    ]
    for seq, (host, hca, status) in enumerate(steps, start=1):
        s.on_port_state(_st(host, hca, status, seq=seq, at=float(seq)))
        s.solve(float(seq))
        full = solve(FABRIC, s.unusable(), epoch=0, now=0.0)
        assert all(s.plans[h].same_assignments(full[h]) for h in FABRIC.host_names), steps[seq - 1]
    assert s.unusable() == {}


def test_full_plans_follow_retained_messages_read_after_them() -> None:
    """A full plan looked at while retained messages still arrive is rebuilt when they do."""
    plans, peers = _retained({"gpu000": frozenset({0})}, 300)
    s = FabricState(fabric=FABRIC, epoch_start=10)
    s.on_retained_plan(plans[1])
    assert s.plans["gpu001"].routes == [] and s.plans["gpu001"].epoch == 300  # no peers yet
    s.on_retained_peers(peers[0])
    assert [(r.peer, r.peer_gpu) for r in s.plans["gpu001"].routes] == [("gpu000", 0)]
    newer = plans[1].model_copy(update={"epoch": 301})
    s.on_retained_plan(newer)
    assert s.plans["gpu001"].epoch == 301


def test_retained_messages_read_after_the_first_solve_are_compared_at_the_next() -> None:
    s = FabricState(fabric=FABRIC, epoch_start=400)
    s.solve(0.0)
    assert not s.dirty
    plans, peers = _retained({"gpu002": frozenset({1})}, 300)  # a previous service's
    s.on_retained_plan(plans[2])  # older than the one this service published: ignored
    assert not s.dirty
    s.on_retained_peers(peers[0])
    assert s.dirty  # a solve is due
    solved = s.solve(1.0)
    # nothing is impaired now: gpu002's peer routes are emptied, nothing else moves
    assert [(pr.host, pr.classes, pr.epoch) for pr in solved.peers] == [("gpu002", [], 401)]
    assert solved.publish == []
    again = s.solve(2.0)
    assert again.publish == [] and again.peers == [] and not s.dirty
