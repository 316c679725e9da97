"""The topology service's pure core: what it knows and which plans it owes.

Consumes: decoded port states, host statuses, acks and previously retained plans, each with
``now``. Produces: the plans to publish (only hosts whose assignments changed, each with a new
epoch) and the set of hosts still owing an ack. No I/O, no clock.

A port counts as unusable when its status is down, held_down or suppressed. ``unknown`` (never
read, or unreadable) counts as usable: no information never turns into a route change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from linkguard.models import Ack, AckResult, HostStatus, Plan, PortState, PortStatus
from linkguard.topology.fabric import Fabric
from linkguard.topology.solver import solve

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

    def __post_init__(self) -> None:
        self._epoch = self.epoch_start - 1
        self._hosts = {h.host for h in self.fabric.hosts}
        self._rail_of = {(h.host, hca.key): hca.rail for h in self.fabric.hosts for hca in h.hcas}

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

    def on_ack(self, ack: Ack) -> None:
        self.acks[ack.host] = ack

    def unusable(self) -> dict[str, frozenset[int]]:
        out: dict[str, set[int]] = {}
        for (host, key), st in self.ports.items():
            if st.status in UNUSABLE:
                out.setdefault(host, set()).add(self._rail_of[(host, key)])
        return {h: frozenset(r) for h, r in out.items()}

    def solve(self, now: float) -> Solved:
        """Solve the whole fabric; return the plans that differ from the last ones."""
        self.dirty = False
        return self.commit(solve(self.fabric, self.unusable(), epoch=self._epoch + 1, now=now))

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
