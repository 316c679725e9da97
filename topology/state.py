"""The topology service's pure core: what it knows and which plans it owes.

Consumes: decoded port states, host statuses, acks, switch-level faults and previously
retained plans, each with ``now``. Produces: the plans to publish (only hosts whose assignments
changed, each with a new epoch) and the set of hosts still owing an ack. No I/O, no clock.

A port counts as unusable when its status is down, held_down or suppressed, or when its leaf is
down or cut off from its rail (switch-level faults: :meth:`FabricState.on_fabric_faults`, the
bus message, or :meth:`FabricState.on_switch_faults`, by link index).
``unknown`` (never read, or unreadable) counts as usable: no information never turns into a
route change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from linkguard.models import (
    Ack,
    AckResult,
    CableRef,
    FabricFaults,
    HostStatus,
    Plan,
    PortState,
    PortStatus,
)
from linkguard.topology.fabric import Fabric
from linkguard.topology.health import Health, SwitchModel
from linkguard.topology.solver import Solver

__all__ = ["UNUSABLE", "FabricState", "Solved"]

UNUSABLE = frozenset({PortStatus.DOWN, PortStatus.HELD_DOWN, PortStatus.SUPPRESSED})


@dataclass(frozen=True)
class Solved:
    plans: list[Plan]  # to publish, in host order
    epoch: int
    unchanged: int  # hosts whose plan did not change


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
    plans: dict[str, Plan] = field(default_factory=dict)
    acks: dict[str, Ack] = field(default_factory=dict)
    dirty: bool = True
    ignored_ports: set[tuple[str, str]] = field(default_factory=set)
    #: the incremental solver, built on the first :meth:`compute`
    solver: Solver | None = field(default=None, repr=False)
    #: switch-level faults and what they cost (:mod:`linkguard.topology.health`)
    health: Health | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._epoch = self.epoch_start - 1
        self._hosts = {h.host for h in self.fabric.hosts}
        self._rail_of = {(h.host, hca.key): hca.rail for h in self.fabric.hosts for hca in h.hcas}
        self._switches: SwitchModel | None = None
        self._solved_unusable: dict[str, frozenset[int]] = {}  # what the solver has now

    @property
    def host_names(self) -> frozenset[str]:
        return frozenset(self._hosts)

    @property
    def epoch(self) -> int:
        return self._epoch

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
        changed = old is None or ((old.status in UNUSABLE) != (st.status in UNUSABLE))
        self.dirty |= changed
        return changed

    def on_host_status(self, hs: HostStatus) -> None:
        self.online[hs.host] = hs.online

    def on_retained_plan(self, plan: Plan) -> None:
        """A plan published before this process started: diff against it, issue above it."""
        if plan.host in self._hosts and plan.epoch > self._epoch:
            self._epoch = plan.epoch
        if plan.host not in self._hosts:
            return
        cur = self.plans.get(plan.host)
        if cur is None or plan.epoch > cur.epoch:
            self.plans[plan.host] = plan

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
        out: dict[str, set[int]] = {}
        for (host, key), st in self.ports.items():
            if st.status in UNUSABLE:
                out.setdefault(host, set()).add(self._rail_of[(host, key)])
        if self.health is not None:
            for host, rails in self.health.unusable.items():
                out.setdefault(host, set()).update(rails)
        return {h: frozenset(r) for h, r in out.items()}

    def prepare(self) -> dict[str, frozenset[int]]:
        """Take the current unusable rails for a solve (clears ``dirty``). Call on the thread
        that records states; hand the result to :meth:`compute`."""
        self.dirty = False
        return self.unusable()

    def compute(self, unusable: dict[str, frozenset[int]], *, now: float) -> dict[str, Plan]:
        """Bring the solver to ``unusable`` and return the plans of the hosts it changed (all
        hosts on the first call: the full build). Touches only the solver, so it can run in a
        worker thread while states keep arriving; one call at a time."""
        epoch = self._epoch + 1
        if self.solver is None:
            self.solver = Solver(self.fabric, unusable)
            names = self.solver.host_names
        else:  # only the hosts whose unusable rails changed, not the whole fleet
            last = self._solved_unusable
            changed = {
                h: unusable.get(h, frozenset())
                for h in unusable.keys() | last.keys()
                if unusable.get(h) != last.get(h)
            }
            names = self.solver.update(changed)
        self._solved_unusable = dict(unusable)
        return {n: self.solver.plan(n, epoch=epoch, now=now) for n in names}

    def solve(self, now: float) -> Solved:
        """Solve (incrementally after the first time); return the plans that differ from the
        last ones."""
        return self.commit(self.compute(self.prepare(), now=now))

    def commit(self, fresh: dict[str, Plan]) -> Solved:
        """Take the plans of a solve done elsewhere (a worker thread): keep and number the ones
        that differ from the last plans. Epochs are re-numbered if this state moved past the
        solve's epoch meanwhile (a retained plan with a higher epoch arrived)."""
        changed = [p for h, p in sorted(fresh.items()) if not p.same_assignments(self.plans.get(h))]
        if changed:
            epoch = max(self._epoch + 1, changed[0].epoch)
            if changed[0].epoch != epoch:
                changed = [p.model_copy(update={"epoch": epoch}) for p in changed]
            self._epoch = epoch
            for p in changed:
                self.plans[p.host] = p
        return Solved(plans=changed, epoch=self._epoch, unchanged=len(fresh) - len(changed))

    def pending_acks(self, hosts: Iterable[str] | None = None) -> list[str]:
        """Hosts whose last plan has no applied ack with its epoch yet."""
        names = self.plans.keys() if hosts is None else hosts
        out = []
        for h in names:
            a, p = self.acks.get(h), self.plans.get(h)
            if p is not None and (a is None or a.epoch < p.epoch or a.result != AckResult.APPLIED):
                out.append(h)
        return sorted(out)
