"""The topology service's pure core: what it knows and which plans it owes.

Consumes: decoded port states, host statuses, acks, switch-level faults and previously
retained plans and peer routes, each with ``now``. Produces: the messages to publish (plans of
hosts whose assignments changed and :class:`~linkguard.models.PeerRoutes` that changed, each
with a new epoch), every host's full plan (``plans``: what it should have in place, a whole
host's compact plan expanded with the peer routes) and the set of hosts still owing an ack. No
I/O, no clock.

Epochs: one counter for plans and peer routes; a solve that publishes both gives its peer
routes one epoch and its plans the next. A host with a compact plan acks the highest of its
plan's epoch and every peer routes message's (:func:`~linkguard.models.expand_plan`), so its
full plan in ``plans`` carries that epoch.

A port counts as unusable when its status is down, held_down, suppressed or degraded (up but
drained: error counters over a threshold, or back slower; its traffic moves as for a down port,
with the agent's hysteresis keeping noisy counters from flapping plans), or when its leaf is
down or cut off from its rail (switch-level faults: :meth:`FabricState.on_fabric_faults`, the
bus message, or :meth:`FabricState.on_switch_faults`, by link index), or when per-rail probes
localised it as dropping packets (:attr:`FabricState.probe_suspect`, set by the service).
``unknown`` (never read, or unreadable) counts as usable: no information never turns into a
route change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from linkguard.models import (
    Ack,
    AckResult,
    CableRef,
    FabricFaults,
    HostStatus,
    PeerRoutes,
    Plan,
    PortState,
    PortStatus,
    ack_covers,
    expand_plan,
)
from linkguard.topology.fabric import Fabric
from linkguard.topology.health import Health, SwitchModel
from linkguard.topology.solver import Solver

__all__ = ["UNUSABLE", "FabricState", "RouteAround", "Solved"]

UNUSABLE = frozenset(
    {PortStatus.DOWN, PortStatus.HELD_DOWN, PortStatus.SUPPRESSED, PortStatus.DEGRADED}
)


@dataclass(frozen=True)
class Fresh:
    """One solve's output (:meth:`FabricState.compute`): the hosts whose full plan changed
    (the solver's answer; every host on the first build), the plans as published (compact
    for whole hosts in shared mode) that may have changed, and the peer routes that may
    have."""

    changed: list[str]
    published: dict[str, Plan]
    peers: dict[str, PeerRoutes] = field(default_factory=dict)


class FullPlans(Mapping[str, Plan]):
    """Every host's full plan, read-only, derived from what is on the bus: a full plan as
    published, or a compact one expanded with the peer routes
    (:func:`~linkguard.models.expand_plan`: exactly the solver's full plan, with the epoch the
    host acks), built on first access and kept until either changes. The solve never builds
    them (2,048 plan models per event at 2,048 hosts)."""

    def __init__(self, state: FabricState) -> None:
        self._state = state
        self._cache: dict[str, Plan] = {}

    def __getitem__(self, host: str) -> Plan:
        plan = self._cache.get(host)
        if plan is None:
            pub = self._state.published[host]
            plan = pub if pub.shared is None else expand_plan(pub, self._state.peers)
            self._cache[host] = plan
        return plan

    def __iter__(self) -> Iterator[str]:
        return iter(self._state.published)

    def __len__(self) -> int:
        return len(self._state.published)

    def forget(self, hosts: Iterable[str] | None = None) -> None:
        """Drop the cached plans of ``hosts`` (None: of every host with a compact plan)."""
        if hosts is None:
            pub = self._state.published
            self._cache = {h: p for h, p in self._cache.items() if pub[h].shared is None}
        else:
            for h in hosts:
                self._cache.pop(h, None)


@dataclass(frozen=True)
class RouteAround:
    """:meth:`FabricState.route_around`'s answer: hosts routed around from now on, whether
    more hosts are lost than may be routed around at once (nothing added then), and when the
    next lost host's grace period ends (monotonic s; None: none waiting)."""

    added: list[str]
    held: bool
    due_at: float | None


@dataclass(frozen=True)
class Solved:
    hosts: list[str]  # hosts whose full plan changed, in host order
    epoch: int
    unchanged: int  # hosts whose full plan did not change
    #: to publish, in host order: plans (``plans/<host>``) and peer routes (``peers/<host>``)
    publish: list[Plan] = field(default_factory=list)
    peers: list[PeerRoutes] = field(default_factory=list)
    full: Mapping[str, Plan] = field(default_factory=dict, repr=False)

    @property
    def plans(self) -> list[Plan]:
        """The full plans of :attr:`hosts` (built on access)."""
        return [self.full[h] for h in self.hosts]


@dataclass
class FabricState:
    """Port states of the whole fabric and the last plan of every host.

    ``epoch_start``: first epoch this process issues; the service passes its start time in ms
    so that a restarted service's epochs are above the retained ones.
    """

    fabric: Fabric
    epoch_start: int
    ports: dict[tuple[str, str], PortState] = field(default_factory=dict)  # (host, "hca/port")
    online: dict[str, bool] = field(default_factory=dict)
    #: hosts whose agent's last will arrived (and has not come back): when it was seen
    #: (monotonic s, the caller's ``now``)
    lost: dict[str, float] = field(default_factory=dict)
    #: hosts routed around (:meth:`route_around`): all their rails count as unusable, and
    #: their own plans are not re-published until they are back
    away: set[str] = field(default_factory=set)
    #: online hosts whose agent says it cannot write its state files
    #: (``HostStatus.state_write_failing``): shown as such, never as current
    state_write_failing: set[str] = field(default_factory=set)
    #: what a host's agent found wrong with its RDMA devices (``HostStatus.device_problems``)
    device_problems: dict[str, list[str]] = field(default_factory=dict)
    #: what is on the bus: plans (compact or full) and peer routes, retained or published
    published: dict[str, Plan] = field(default_factory=dict)
    peers: dict[str, PeerRoutes] = field(default_factory=dict)
    acks: dict[str, Ack] = field(default_factory=dict)
    dirty: bool = True
    ignored_ports: set[tuple[str, str]] = field(default_factory=set)
    #: the incremental solver, built on the first :meth:`compute`
    solver: Solver | None = field(default=None, repr=False)
    #: switch-level faults and what they cost (:mod:`linkguard.topology.health`)
    health: Health | None = field(default=None, repr=False)
    #: (host, rail) ports that per-rail probes localised as dropping packets (the service's
    #: probe verdicts, :mod:`linkguard.topology.localize`): unusable like a degraded port
    probe_suspect: set[tuple[str, int]] = field(default_factory=set)
    #: compact plans + shared peer routes where the fabric allows (:class:`Solver` ``shared``)
    shared: bool = True
    #: the leader term stamped on every plan and peer routes message (0: no election;
    #: :mod:`linkguard.topology.leader`); set with :meth:`set_term`
    term: int = 0

    def __post_init__(self) -> None:
        self._epoch = self.epoch_start - 1
        self._hosts = {h.host for h in self.fabric.hosts}
        self._rail_of = {(h.host, hca.key): hca.rail for h in self.fabric.hosts for hca in h.hcas}
        self._rails_of = {h.host: frozenset(hca.rail for hca in h.hcas) for h in self.fabric.hosts}
        self._switches: SwitchModel | None = None
        # the ports in ``ports`` whose status is UNUSABLE, kept by on_port_state: a solve reads
        # these instead of every port of the fleet (131,072 at 16,384 x 8)
        self._out = {k for k, st in self.ports.items() if st.status in UNUSABLE}
        self._solved_unusable: dict[str, frozenset[int]] = {}  # what the solver has now
        self._peers_epoch = 0  # the highest epoch of the peer routes on the bus
        # hosts whose retained plan or peer routes arrived after the first solve (to compare
        # at the next one), and the ones the solve in progress compares
        self._late: set[str] = set()
        self._recheck: set[str] = set()
        #: every host's full plan (what it should have in place; see :class:`FullPlans`)
        self.plans = FullPlans(self)

    @property
    def host_names(self) -> frozenset[str]:
        return frozenset(self._hosts)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_term(self, term: int) -> None:
        """Issue as leader of ``term`` from now on: every host's plan and peer routes on the
        bus of another term is published again at the next solve, stamped with ``term`` (so
        each agent learns the new term and refuses the deposed leader's), with a new epoch."""
        if term == self.term:
            return
        self.term = term
        for h in set(self.published) | set(self.peers):
            self._arrived_late(h)

    def on_port_state(self, st: PortState) -> bool:
        """Record ``st``; True when it changes which rails are usable (a solve is due).
        States of ports the fabric does not know are recorded in ``ignored_ports``."""
        key = (st.host, st.key)
        if key not in self._rail_of:
            self.ignored_ports.add(key)
            return False
        old = self.ports.get(key)
        if old is not None and old.seq > st.seq and old.observed_at > st.observed_at:
            return False  # an older state arriving late
        self.ports[key] = st
        if st.status in UNUSABLE:
            self._out.add(key)
        else:
            self._out.discard(key)
        changed = old is None or ((old.status in UNUSABLE) != (st.status in UNUSABLE))
        self.dirty |= changed
        return changed

    def on_host_status(self, hs: HostStatus, *, now: float = 0.0) -> None:
        """Record ``hs`` seen at ``now`` (monotonic s). A last will (``reason="lost"``) starts
        the host's grace period (:meth:`route_around`); the agent back online ends it and
        returns a routed-around host's rails to its port states (``dirty`` set)."""
        self.online[hs.host] = hs.online
        if hs.online and hs.state_write_failing:
            self.state_write_failing.add(hs.host)
        else:
            self.state_write_failing.discard(hs.host)
        if hs.online:
            self.device_problems[hs.host] = list(hs.device_problems or [])
        if hs.online or hs.reason != "lost":
            self.lost.pop(hs.host, None)
            if hs.host in self.away:
                self.away.discard(hs.host)
                self.dirty = True
        elif hs.host in self._hosts:
            self.lost.setdefault(hs.host, now)

    def route_around(self, now: float, *, after_s: float | None, limit: int) -> RouteAround:
        """Which hosts lost ``after_s`` ago or more (their last will, see
        :meth:`on_host_status`) to route around from now on: all their rails count as unusable
        (``dirty`` set when any), so every peer's plan marks their endpoints ``unreachable``.
        At most ``limit`` hosts are routed around at once: while more are lost (or routed
        around), none is added (``held``). Pure: ``now`` and the limits come from the caller.
        ``after_s`` None: never (nothing is added, nothing is due)."""
        if after_s is None:
            return RouteAround(added=[], held=False, due_at=None)
        lost = set(self.lost) - self.away
        if len(lost | self.away) > limit:
            return RouteAround(added=[], held=True, due_at=None)
        added = sorted(h for h in lost if now - self.lost[h] >= after_s)
        if added:
            self.away.update(added)
            self.dirty = True
        waiting = [self.lost[h] + after_s for h in lost.difference(added)]
        return RouteAround(added=added, held=False, due_at=min(waiting) if waiting else None)

    def on_retained_plan(self, plan: Plan) -> None:
        """A plan published before this process started: diff against it, issue above it."""
        if plan.host not in self._hosts:
            return
        self._epoch = max(self._epoch, plan.epoch)
        cur = self.published.get(plan.host)
        if cur is None or plan.epoch > cur.epoch:
            self.published[plan.host] = plan
            self.plans.forget([plan.host])
            self._arrived_late(plan.host)

    def on_retained_peers(self, peers: PeerRoutes) -> None:
        """Peer routes published before this process started: diff against them, issue above."""
        if peers.host not in self._hosts:
            return
        self._epoch = max(self._epoch, peers.epoch)
        cur = self.peers.get(peers.host)
        if cur is None or peers.epoch > cur.epoch:
            self.peers[peers.host] = peers
            self._peers_epoch = max(self._peers_epoch, peers.epoch)
            self.plans.forget()
            self._arrived_late(peers.host)

    def _arrived_late(self, host: str) -> None:
        if self.solver is not None:  # after the first solve: compare it at the next one
            self._late.add(host)
            self.dirty = True

    def _model(self) -> SwitchModel:
        if self._switches is None:
            self._switches = SwitchModel(self.fabric)
        return self._switches

    def cable_indices(self, cables: Iterable[CableRef]) -> list[int]:
        """Indices into ``fabric.links`` of ``cables``: for each, the cables of any kind but
        ``host-leaf`` between its two switches (either order), all of them or the first
        ``count`` in link order. Raises ValueError naming the cable when a switch is unknown,
        the two have no cable between them, or ``count`` exceeds the cables there. Pure (reads
        the fabric only): safe on a worker thread."""
        model = self._model()
        out: list[int] = []
        for ref in cables:
            for end in (ref.a, ref.b):
                if end not in model.names:
                    raise ValueError(
                        f"cable {ref.a}-{ref.b}: unknown switch {end!r} in fabric "
                        f"{self.fabric.name!r}"
                    )
            there = [i for i, *_ in model.pairs.get(ref.pair, ())]
            if not there:
                raise ValueError(
                    f"cable {ref.a}-{ref.b}: no cable between these switches in fabric "
                    f"{self.fabric.name!r}"
                )
            if ref.count is not None and ref.count > len(there):
                raise ValueError(
                    f"cable {ref.a}-{ref.b}: {ref.count} down but the fabric has only "
                    f"{len(there)} between them"
                )
            out.extend(there[: ref.count])
        return out

    def assess_faults(self, faults: FabricFaults) -> Health:
        """The health ``faults`` would give, without recording it (see :meth:`on_health`).
        Raises ValueError as :meth:`cable_indices` does, or on an unknown switch down. Pure
        and CPU-bound (about 35 ms at 2,048 hosts x 8 rails): the service runs it in a worker
        thread."""
        return self._model().assess(
            switches_down=faults.switches_down, links_down=self.cable_indices(faults.cables_down)
        )

    def on_health(self, health: Health) -> None:
        """Replace the known switch-level faults by ``health`` (from :meth:`assess_faults`):
        ports behind a leaf that is down or cut off count as unusable from now on; ``dirty``
        is set when that changes which rails are usable."""
        old = self.health.unusable if self.health else {}
        self.health = health
        self.dirty |= health.unusable != old

    def on_probe_verdict(self, host: str, rail: int, *, suspect: bool) -> bool:
        """Mark ``host``'s port on ``rail`` as localised by probes to drop packets
        (``suspect``) or clear it. Returns whether the mark changed (``dirty`` is set then); a
        host or rail the fabric lacks changes nothing."""
        if rail not in self._rails_of.get(host, ()):
            return False
        key = (host, rail)
        if suspect == (key in self.probe_suspect):
            return False
        (self.probe_suspect.add if suspect else self.probe_suspect.discard)(key)
        self.dirty = True
        return True

    def on_switch_faults(
        self, *, switches_down: Iterable[str] = (), links_down: Iterable[int] = ()
    ) -> Health:
        """Replace the known switch-level faults (switch names, indices into the fabric's
        links), as :meth:`on_health`. Raises ValueError on an unknown switch or link index
        (nothing is changed then)."""
        health = self._model().assess(switches_down=switches_down, links_down=links_down)
        self.on_health(health)
        return health

    def on_fabric_faults(self, faults: FabricFaults) -> Health:
        """Replace the known switch-level faults by ``faults`` (the bus message: switch names
        and cables by their two ends, resolved by :meth:`cable_indices`). Raises ValueError on
        an unknown switch, a cable that is not there or a count above the cables there; nothing
        is changed then."""
        health = self.assess_faults(faults)
        self.on_health(health)
        return health

    def on_ack(self, ack: Ack) -> None:
        self.acks[ack.host] = ack

    def unusable(self) -> dict[str, frozenset[int]]:
        out: dict[str, set[int]] = {h: set(self._rails_of[h]) for h in self.away}
        for host, key in self._out:
            out.setdefault(host, set()).add(self._rail_of[(host, key)])
        if self.health is not None:
            for host, rails in self.health.unusable.items():
                out.setdefault(host, set()).update(rails)
        for host, rail in self.probe_suspect:
            out.setdefault(host, set()).add(rail)
        return {h: frozenset(r) for h, r in out.items()}

    def prepare(self) -> dict[str, frozenset[int]]:
        """Take the current unusable rails for a solve (clears ``dirty``). Call on the thread
        that records states; hand the result to :meth:`compute`."""
        self.dirty = False
        self._recheck, self._late = self._late, set()
        return self.unusable()

    def compute(self, unusable: dict[str, frozenset[int]], *, now: float) -> Fresh:
        """Bring the solver to ``unusable`` and return the plans of the hosts it changed (all
        hosts on the first call: the full build) and the peer routes that may have changed.
        Touches only the solver, so it can run in a worker thread while states keep arriving;
        one call at a time."""
        epoch = self._epoch + 1
        if self.solver is None:
            self.solver = Solver(self.fabric, unusable, shared=self.shared)
            names = self.solver.host_names
            # retained peer routes of hosts that are whole now: replace them by empty ones
            peer_names = sorted(set(self.solver.take_changed_peers()) | set(list(self.peers)))
        else:  # only the hosts whose unusable rails changed, not the whole fleet
            last = self._solved_unusable
            changed = {
                h: unusable.get(h, frozenset())
                for h in unusable.keys() | last.keys()
                if unusable.get(h) != last.get(h)
            }
            names = self.solver.update(changed)
            peer_names = self.solver.take_changed_peers()
        self._solved_unusable = dict(unusable)
        s = self.solver
        # retained messages read after the first solve (a short startup settle): compare them
        late = {h for h in self._recheck if h in self._hosts}
        peer_names = sorted(set(peer_names) | late)
        compact = s.take_changed_compact() | late
        return Fresh(
            changed=list(names),
            # a whole host's compact plan changes only with its own rails (or the degraded
            # ones): the others keep theirs while every full plan gains a peer's /32
            published={
                n: s.compact_plan(n, epoch=epoch, now=now)
                for n in sorted(compact | set(names))
                if n in compact or not s.is_shared(n)
            },
            peers={n: s.peer_routes(n, epoch=epoch, now=now) for n in peer_names},
        )

    def solve(self, now: float) -> Solved:
        """Solve (incrementally after the first time); return what differs from the last."""
        return self.commit(self.compute(self.prepare(), now=now))

    def commit(self, fresh: Fresh) -> Solved:
        """Take a solve done elsewhere (a worker thread): keep and number the plans and peer
        routes that differ from the ones on the bus, and the full plans. Epochs are re-numbered
        if this state moved past the solve's epoch meanwhile (a retained plan with a higher
        epoch arrived). Each carries :attr:`term`; one on the bus of another term counts as
        differing (:meth:`set_term`)."""
        # a host routed around keeps the plan it had: it is not there to apply one, and an
        # agent coming back must not start from a plan without any usable rail
        publish = [
            p
            for h, p in sorted(fresh.published.items())
            if h not in self.away
            and (not p.same_assignments(self.published.get(h)) or self._other_term(h))
        ]
        peers = [
            pr
            for h, pr in sorted(fresh.peers.items())
            if not pr.same_routes(self.peers.get(h)) or self._other_term(h, peers=True)
        ]
        if publish or peers:
            epoch = max(self._epoch + 1, (publish or peers)[0].epoch)
            if peers:
                peers = [pr.model_copy(update={"epoch": epoch, "term": self.term}) for pr in peers]
                self._peers_epoch = epoch
                # plans of the same solve one above: a host whose plan changes acks that
                # plan, never the peer routes alone (the service publishes full plans, then
                # peer routes, then compact plans)
                epoch += bool(publish)
            publish = [p.model_copy(update={"epoch": epoch, "term": self.term}) for p in publish]
            self._epoch = epoch
            self.published.update((p.host, p) for p in publish)
            self.peers.update((pr.host, pr) for pr in peers)
        # the full plans follow: every compact one moves with new peer routes
        self.plans.forget(None if peers else ())
        self.plans.forget(p.host for p in publish)
        changed = [h for h in fresh.changed if h in self.published and h not in self.away]
        return Solved(
            hosts=changed,
            epoch=self._epoch,
            unchanged=len(self.published) - len(changed),
            publish=publish,
            peers=peers,
            full=self.plans,
        )

    def _other_term(self, host: str, *, peers: bool = False) -> bool:
        """True when ``host``'s plan (``peers``: peer routes) on the bus has another term."""
        on_bus = (self.peers if peers else self.published).get(host)
        return on_bus is not None and on_bus.term != self.term

    def acked_epoch(self, host: str) -> int | None:
        """The epoch ``host`` acks once it applied what it should (None: no plan yet): its
        plan's, or for a compact plan the highest of that and the peer routes'."""
        pub = self.published.get(host)
        if pub is None:
            return None
        return pub.epoch if pub.shared is None else max(pub.epoch, self._peers_epoch)

    def ack_covers(self, host: str, ack: Ack | None) -> bool:
        """True when ``ack`` answers what ``host`` owes (:func:`~linkguard.models.ack_covers`:
        the epoch of :meth:`acked_epoch`, and for a compact plan every peer routes message on
        the bus the ack names as held); also True when nothing is owed (no plan yet)."""
        owed, pub = self.acked_epoch(host), self.published.get(host)
        if owed is None or pub is None:
            return True
        return ack is not None and ack_covers(ack, owed, pub, self.peers)

    def pending_acks(self, hosts: Iterable[str] | None = None) -> list[str]:
        """Hosts whose last plan has no applied ack that covers it yet (:meth:`ack_covers`)."""
        names = self.published.keys() if hosts is None else hosts
        out = []
        for h in names:
            a = self.acks.get(h)
            if self.acked_epoch(h) is not None and (
                a is None or a.result != AckResult.APPLIED or not self.ack_covers(h, a)
            ):
                out.append(h)
        return sorted(out)
