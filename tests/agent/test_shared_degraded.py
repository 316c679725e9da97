"""Issue 23: a leaf failure is one shared change (the degraded rails, riding on the peer
routes), not a new plan for every host. Property test: the service's core
(:class:`~linkguard.topology.state.FabricState`) solves a history of leaf and host-link
failures; one agent's core (:class:`~linkguard.agent.core.AgentCore`) gets that history's
messages in any order, some twice, some never. Whenever its ack covers what the service
says it owes, it has exactly the solver's full plan in place; and once the retained messages
are delivered again (a reconnect, or the service's re-send), it has it in any case."""

from __future__ import annotations

import ipaddress

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from linkguard.agent.core import AgentCore
from linkguard.agent.effects import ApplyPlan, ResendAck, SendAck
from linkguard.models import Ack, AckResult, PeerRoutes, Plan, decode, encode
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import DEGRADED_AFTER_HOSTS, Solver
from linkguard.topology.state import FabricState

SU = DEGRADED_AFTER_HOSTS  # one leaf's worth of hosts makes its rail degraded
RAILS = 4
FABRIC = generate_rail_optimized(hosts=2 * SU, rails=RAILS, hosts_per_su=SU)
NAMES = FABRIC.host_names
NETDEVS = {f"rail{r}" for r in range(RAILS)}
PREFIXES = [ipaddress.IPv4Network("10.200.0.0/16")]
NOW = 1_000.0

#: one step of the history: leaves down as (SU, rail), and single host links down
STEP = st.tuples(
    st.frozensets(st.tuples(st.integers(0, 1), st.integers(0, RAILS - 1)), max_size=2),
    st.frozensets(st.tuples(st.sampled_from(NAMES), st.integers(0, RAILS - 1)), max_size=3),
)


def _unusable(leaves: frozenset, links: frozenset) -> dict[str, frozenset[int]]:
    out: dict[str, set[int]] = {}
    for su, rail in leaves:
        for h in NAMES[su * SU : (su + 1) * SU]:
            out.setdefault(h, set()).add(rail)
    for h, rail in links:
        out.setdefault(h, set()).add(rail)
    return {h: frozenset(r) for h, r in out.items()}


def _history_messages(
    history: list[dict[str, frozenset[int]]], viewer: str
) -> tuple[FabricState, list[tuple[str, Plan | PeerRoutes]]]:
    """Every message the viewer subscribes to (its plan, every peer routes), as published by
    the service's core over the history, in publish order (peer routes first, as
    :mod:`topology.schedule` sends them), decoded off the wire."""
    state = FabricState(fabric=FABRIC, epoch_start=100)
    out: list[tuple[str, Plan | PeerRoutes]] = []
    for t, unusable in enumerate(history):
        solved = state.commit(state.compute(unusable, now=float(t)))
        out += [("peers", decode(PeerRoutes, encode(pr))) for pr in solved.peers]
        out += [("plan", decode(Plan, encode(p))) for p in solved.publish if p.host == viewer]
    return state, out


class _Agent:
    """The agent's core plus what its executor does (:mod:`linkguard.agent.executor`): apply
    (the kernel accepts), and send acks as it does, named when sent (``AgentCore.named``)."""

    def __init__(self, host: str) -> None:
        self.core = AgentCore(host=host, netdevs=NETDEVS, prefixes=PREFIXES)
        self.applied: Plan | None = None
        self.last_ack: Ack | None = None  # the host's retained ack on the bus

    def deliver(self, kind: str, msg: Plan | PeerRoutes) -> None:
        raw = encode(msg)
        if kind == "plan":
            assert isinstance(msg, Plan)
            topic = f"linkguard/v1/plans/{msg.host}"
            effects = self.core.on_plan(msg, raw=raw, topic=topic, applied=self.applied, now=NOW)
        else:
            assert isinstance(msg, PeerRoutes)
            topic = f"linkguard/v1/peers/{msg.host}"
            effects = self.core.on_peer_routes(
                msg.host, msg, raw=raw, topic=topic, applied=self.applied, now=NOW
            )
        for e in effects:
            if isinstance(e, ApplyPlan):
                self.applied = e.plan
                ack = Ack(
                    host=self.core.host,
                    epoch=e.plan.epoch,
                    result=AckResult.APPLIED,
                    applied_at=NOW,
                )
                self.last_ack = self.core.named(ack)
            elif isinstance(e, SendAck):
                self.last_ack = self.core.named(e.ack)
            elif (
                isinstance(e, ResendAck)
                and self.last_ack is not None
                and self.last_ack.epoch >= e.epoch
            ):
                self.last_ack = self.core.named(self.last_ack)


def _retained(state: FabricState, viewer: str) -> list[tuple[str, Plan | PeerRoutes]]:
    """What the broker holds for the viewer's subscriptions: the last of each topic."""
    out: list[tuple[str, Plan | PeerRoutes]] = [("peers", pr) for pr in state.peers.values()]
    return [*out, ("plan", state.published[viewer])]


@settings(max_examples=120, deadline=None, phases=[Phase.generate, Phase.shrink])
@given(
    st.lists(STEP, min_size=1, max_size=4),
    st.sampled_from(NAMES),
    st.randoms(use_true_random=False),
    st.data(),
)
def test_missed_twice_or_out_of_order_ends_in_the_full_plan(history, viewer, rnd, data) -> None:
    # the first solve is the start (nothing down): every host's plan on the bus
    unusables = [{}, *(_unusable(*step) for step in history)]
    state, messages = _history_messages(unusables, viewer)
    # each message: never (0), once or twice; in any order (a stale one is dropped)
    copies = data.draw(st.lists(st.integers(0, 2), min_size=len(messages), max_size=len(messages)))
    stream = [m for m, k in zip(messages, copies, strict=True) for _ in range(k)]
    rnd.shuffle(stream)
    agent = _Agent(viewer)
    for kind, msg in stream:
        agent.deliver(kind, msg)
    assert state.solver is not None
    full = Solver(FABRIC, unusables[-1]).plan(viewer, epoch=0, now=0.0)
    ack = agent.last_ack
    if ack is not None and ack.result == AckResult.APPLIED and state.ack_covers(viewer, ack):
        # converged in the service's eyes: then exactly the full plan is in place
        assert agent.applied is not None and agent.applied.same_assignments(full)
        assert agent.applied.epoch == state.acked_epoch(viewer)
    # the retained messages again, in any order: the full plan, and the ack covers it
    again = _retained(state, viewer)
    rnd.shuffle(again)
    for kind, msg in again:
        agent.deliver(kind, msg)
    assert agent.applied is not None and agent.applied.same_assignments(full)
    assert agent.applied.same_assignments(state.plans[viewer])
    if not state.ack_covers(viewer, agent.last_ack):
        # the routes are right but the retained ack names an older peer routes message (its
        # expansion did not change): the service re-sends the plan (topology.convergence),
        # the agent acks it again, named anew
        agent.deliver("plan", state.published[viewer])
    ack = agent.last_ack
    assert ack is not None and ack.result == AckResult.APPLIED
    assert ack.epoch == state.acked_epoch(viewer) and state.ack_covers(viewer, ack)


def test_a_leaf_failure_publishes_only_the_hosts_that_lost_a_rail() -> None:
    """A leaf down and back: the plans of the SU's hosts and their peer routes (carrying the
    degraded rail while it lasts), no other host's plan; every whole host's compact plan is
    the same before, during and after."""
    state = FabricState(fabric=FABRIC, epoch_start=100)
    start = state.commit(state.compute({}, now=0.0))
    assert len(start.publish) == len(NAMES)
    compact = {p.host: p for p in start.publish if p.shared is not None}
    su0 = NAMES[:SU]
    down = state.commit(state.compute(_unusable(frozenset({(0, 2)}), frozenset()), now=1.0))
    assert sorted(p.host for p in down.publish) == su0
    assert sorted(pr.host for pr in down.peers) == su0
    assert all(pr.degraded == [2] and pr.classes for pr in down.peers)
    assert state.solver is not None and state.solver.degraded == {2}
    back = state.commit(state.compute({}, now=2.0))
    assert sorted(p.host for p in back.publish) == su0
    assert all(pr.degraded == [] and not pr.classes for pr in back.peers)
    for h in NAMES[SU:]:
        assert state.published[h] == compact[h]  # never re-published
        assert state.plans[h].same_assignments(Solver(FABRIC, {}).plan(h, epoch=0, now=0.0))
