"""Failure classes beyond one host link, on an in-process fleet (real service, real agents with
simulated drivers, real Mosquitto): a leaf down (every host of the SU loses one rail at once), a
leaf rebooting (a flap storm), and a host losing two rails. Batching: one plan per affected
host per event, never one per port or per flap."""

from __future__ import annotations

import time
from collections import Counter
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard.agent.monitor import DampingPolicy
from linkguard.config import BusSettings
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.models import PortStatus
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import Solver, egress, solve


def _out(table: MemoryRouteTable, dest: IPv4Address) -> tuple[str, ...]:
    """Netdevs ``table`` sends ``dest`` out of, by longest prefix as the kernel looks it up:
    several = multipath; () = an ``unreachable`` route or no route."""
    match = [r for r in table.routes.values() if dest in r.network]
    if not match:
        return ()
    best = max(match, key=lambda r: r.network.prefixlen)
    return () if best.kind == "unreachable" else tuple(sorted(best.netdevs))


def _nic_load(fleet: SimulatedFleet, host: str) -> dict[str, float]:
    """Peer endpoints per egress netdev of ``host``'s table (multipath: 1/n per netdev). Also
    checks that the table sends every peer endpoint where the host's applied plan says."""
    plan = fleet.agents[host].applier.plan
    assert plan is not None
    load: Counter[str] = Counter()
    for inv in fleet.fabric.hosts:
        if inv.host == host:
            continue
        for ep in inv.endpoints:
            out = _out(fleet.tables[host], ep)
            assert out == tuple(sorted(f"rail{r}" for r in egress(plan, ep))), (host, ep)
            for netdev in out:
                load[netdev] += 1 / len(out)
    return dict(sorted(load.items()))


@pytest.mark.real
async def test_leaf_down_moves_one_rail_of_the_whole_su_in_one_plan_per_host(
    mosquitto, tmp_path: Path
) -> None:
    fabric = generate_rail_optimized(hosts=16, rails=4)
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    # a leaf's ports go down together; the service solves at once on the first change after a
    # quiet period (solve.initial_ms 0 by default), so on a loaded machine the first
    # port's state could be solved alone: wait for the rest (a batch, one plan per host). The
    # 16 agents and the service share one event loop: with 300 ms, about 1 full-suite run in 3
    # on 2 cores (issue 21's session) solved a first state alone and the hosts' plans then held
    # /32s towards it; 1 s is twice the worst spread seen (test_leaf_reboot_flap_storm...)
    async with SimulatedFleet(
        fabric, bus=bus, workdir=tmp_path, debounce_ms=150, solve_initial_delay_ms=1000
    ) as fleet:
        await fleet.wait_all_acked()
        epoch0 = fleet.service.state.epoch
        before = Counter(fleet.service.plans_per_host)
        t0 = time.monotonic()
        with capture_logs() as logs:
            for inv in fabric.hosts:  # the rail-2 leaf dies: all its host ports go down
                fleet.link_down(inv.host, 2)
            t = await fleet.wait_all_acked(epoch0 + 1)
            await wait_until(
                lambda: any(e["event"] == "plans_acked" for e in logs), 5, "plans_acked"
            )
        # one line when every host is through, not one per ack
        acked = [e for e in logs if e["event"] == "plans_acked"]
        assert [(e["hosts"], e["log_level"]) for e in acked] == [(16, "info")]
        assert acked[0]["epoch"] == fleet.service.state.epoch and acked[0]["ms"] > 0
        assert not [e for e in logs if e["event"] == "ack" and e["log_level"] != "debug"]
        print(f"\nleaf down: 16 hosts re-planned and acked in {(t - t0) * 1000:.1f} ms")
        assert fleet.service.state.unusable() == {h.host: frozenset({2}) for h in fabric.hosts}
        delta = Counter(fleet.service.plans_per_host) - before
        assert set(delta.values()) == {1}, delta  # one plan per host, not one per port
        for inv in fabric.hosts:
            # every host lost the same rail, so every peer can use the rails the rail-2
            # prefix route now spreads over: one multipath route, no /32 exception anywhere
            plan = fleet.agents[inv.host].applier.plan
            assert plan.routes == [] and plan.unreachable == []
            assert [(p.home_rail, p.rails) for p in plan.prefix_routes] == [
                (0, [0]),
                (1, [1]),
                (2, [0, 1, 3]),
                (3, [3]),
            ]
            assert len(fleet.tables[inv.host].routes) == 4
            # 15 peers x 4 endpoints spread over the 3 surviving rails: 15 + 15/3 = 20 each,
            # not 30 on one backup NIC
            assert _nic_load(fleet, inv.host) == pytest.approx(
                {"rail0": 20, "rail1": 20, "rail3": 20}
            )


@pytest.mark.real
async def test_leaf_reboot_flap_storm_is_ridden_out(mosquitto, tmp_path: Path) -> None:
    fabric = generate_rail_optimized(hosts=8, rails=4)
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    damping = DampingPolicy(hold_down_initial_s=0.5, hold_down_max_s=4.0)
    # Re-admission is one event, and so is the first flap: the test holds the service to one
    # plan per host for each. The 8 agents and the service share one event loop (and the
    # machine with the rest of the suite), so 8 states sent at once reach the service spread
    # out: up to ~0.5 s on 2 cores with the suite and 3 busy loops beside it (the service takes
    # its inbox one message at a time, port events and acks in between). The service's
    # batching (solve.initial_ms for the first down, short_ms for the re-admission; RFC 8405:
    # what arrives after a solve started is solved again) must outlast that: with 200 ms, 5
    # runs in 12 under that load re-admitted in two batches (3 + 5 hosts: 3 plans for 3
    # hosts), with 50 ms 1 in 4 unloaded. 1 s is twice the worst spread seen; each plan comes
    # 1 s later, which the waits below absorb.
    async with SimulatedFleet(
        fabric,
        bus=bus,
        workdir=tmp_path,
        damping=damping,
        debounce_ms=1000,
        solve_initial_delay_ms=1000,
    ) as fleet:
        await fleet.wait_all_acked()
        epoch0 = fleet.service.state.epoch
        before = Counter(fleet.service.plans_per_host)
        hosts = [h.host for h in fabric.hosts]
        rail1 = {inv.host: next(c for c in inv.hcas if c.rail == 1) for inv in fabric.hosts}
        key = {h: f"{c.hca}/{c.port}" for h, c in rail1.items()}

        def seen_by_service(h: str, status: PortStatus, flaps: int) -> bool:
            st = fleet.service.state.ports.get((h, key[h]))
            return st is not None and st.status == status and st.damping.flaps == flaps

        def seen_by_agent(h: str, status: PortStatus, flaps: int) -> bool:
            st = fleet.agents[h].monitor.state(key[h])
            return st is not None and st.status == status and st.damping.flaps == flaps

        for flap in range(1, 5):  # the leaf reboots: its ports bounce four times, 100 ms apart
            for h in hosts:
                fleet.link_down(h, 1)
            # every agent saw this flap and its state reached the service before the port
            # comes back: the rail is unusable everywhere, and no agent still has the down to
            # publish when it takes the link-up (each agent takes its readings one at a time,
            # the publishes of the last first: a backlog would start its hold-down late, and
            # the 8 hold-downs would end spread over more than the service's batching window)
            await wait_until(
                lambda f=flap: all(seen_by_service(h, PortStatus.DOWN, f) for h in hosts),
                5,
                f"flap {flap}: rail 1 down everywhere",
            )
            assert fleet.service.state.unusable() == {h: frozenset({1}) for h in hosts}
            for h in hosts:
                fleet.link_up(h, 1)
            t_up = time.monotonic()
            await wait_until(
                lambda f=flap: all(seen_by_agent(h, PortStatus.HELD_DOWN, f) for h in hosts),
                5,
                f"flap {flap}: every agent holding rail 1 down",
            )
            await wait_until(lambda t=t_up: time.monotonic() - t > 0.1, 1, "100 ms")
        await wait_until(lambda: fleet.service.state.unusable() == {}, 15, "re-admission")
        waited = time.monotonic() - t_up  # from the last link-up
        nominal = Solver(fabric).plans(epoch=0, now=0.0)
        await wait_until(
            lambda: all(fleet.service.state.plans[h].same_assignments(nominal[h]) for h in hosts),
            15,
            "the nominal plans again",
        )
        await fleet.wait_all_acked(epoch0 + 1)
        delta = Counter(fleet.service.plans_per_host) - before
        print(
            f"\nflap storm: 4 flaps x 8 hosts -> plans per host {set(delta.values())}, "
            f"re-admitted {waited:.2f} s after the last flap"
        )
        # moved off once, moved back once: the flaps in between changed nothing
        assert set(delta.values()) == {2}, delta
        # hold-down grew with the flaps (0.5 s doubling): re-admission >= 0.5 * 2**3 s after
        # the last link-up (each agent starts the hold-down when it sees that link-up)
        assert waited >= 4.0
        # back exactly to normal: 7 peers' endpoints on each rail, on-link prefix routes only
        for h in hosts:
            assert _nic_load(fleet, h) == {f"rail{r}": 7 for r in range(4)}
            assert fleet.agents[h].applier.plan.routes == []


@pytest.mark.real
async def test_host_losing_two_rails(mosquitto, tmp_path: Path) -> None:
    fabric = generate_rail_optimized(hosts=8, rails=4)
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05)
    async with SimulatedFleet(fabric, bus=bus, workdir=tmp_path, debounce_ms=50) as fleet:
        await fleet.wait_all_acked()
        fleet.link_down("gpu000", 1)
        fleet.link_down("gpu000", 2)
        # the two ports may land in one batch or two: wait for every host to have applied the
        # plans of both rails down, whichever epoch brought them
        want = solve(fabric, {"gpu000": frozenset({1, 2})}, epoch=0, now=0.0)
        await wait_until(
            lambda: all(
                a.applier.plan is not None and a.applier.plan.same_assignments(want[h])
                for h, a in fleet.agents.items()
            ),
            10,
            "every host on the plans for both rails down",
        )
        # the victim's rail-1 and rail-2 prefix routes go multipath over rails 0 and 3, which
        # every peer can use: 7 + 14/2 peer endpoints on each, no /32
        assert _nic_load(fleet, "gpu000") == pytest.approx({"rail0": 14, "rail3": 14})
        assert fleet.agents["gpu000"].applier.plan.routes == []
        victim = fabric.host("gpu000")
        address = {c.netdev: c.address for c in victim.hcas}
        for gpu in (1, 2):
            # every peer reaches the victim's GPU 1 and 2 by a /32 via the victim's address on
            # rail 0 or 3, dealt round-robin over the peers: 4 on one rail, 3 on the other
            ep = victim.endpoints[gpu]
            spread = Counter()
            for inv in fabric.hosts[1:]:
                (netdev,) = _out(fleet.tables[inv.host], ep)
                assert fleet.tables[inv.host].routes[ep].gateway == address[netdev]
                spread[netdev] += 1
            assert set(spread) == {"rail0", "rail3"} and sorted(spread.values()) == [3, 4]
        for inv in fabric.hosts[1:]:
            plan = fleet.agents[inv.host].applier.plan
            assert {(r.peer, r.peer_gpu) for r in plan.routes} == {("gpu000", 1), ("gpu000", 2)}
            assert _nic_load(fleet, inv.host) == pytest.approx(
                {"rail0": 7 + 1, "rail1": 7 - 1, "rail2": 7 - 1, "rail3": 7 + 1}
            )
        rails = {a.gpu: a.rail for a in fleet.agents["gpu000"].applier.plan.rail_assignments}
        assert rails[0] == 0 and rails[3] == 3 and {rails[1], rails[2]} <= {0, 3}
