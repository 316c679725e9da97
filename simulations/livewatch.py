"""Watching a real-time replay (:mod:`linkguard.simulations.live`): what the fleet did, when
it settled, and what each transition cost.

Consumes: the running :class:`~linkguard.simulations.fleet.SimulatedFleet` (its service's state,
its agents' monitors, appliers and acks, their route tables) and what the replay changed (ports
down, the switch-level faults' :class:`~linkguard.topology.state.FabricState`, outages,
transitions). Produces, into the :class:`~linkguard.simulations.livereport.LiveReport`: settles
(the oracle on the installed routes at each new settled state,
:func:`~linkguard.simulations.liveoracle.installed_mismatches`), settles that timed out,
recoveries, re-admissions; and per down transition its
:class:`~linkguard.simulations.livereport.LiveFault` (fast path, plan epoch, first and last
ack, in ms from the transition). "Settled" is defined in
the live module's docstring. Times are monotonic seconds (``time.monotonic``), as read by
:meth:`LiveWatch.run`'s polls every :data:`POLL_S`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from linkguard.models import AckResult, PortStatus
from linkguard.simulations.engine import MAX_MISMATCHES
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.simulations.liveoracle import installed_mismatches
from linkguard.simulations.livereport import LiveFault, LiveReport, Recovery
from linkguard.simulations.oracle import check, pairs_to_check
from linkguard.simulations.scenario import Event, LoadedScenario
from linkguard.topology.state import FabricState

__all__ = ["POLL_S", "SETTLE_POLL_S", "LiveWatch", "Pending", "Transition"]

_HELD = (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED)

#: How often the watcher looks for new plans, acks and fast paths (s), and for a settle.
POLL_S = 0.002
SETTLE_POLL_S = 0.01

#: A transition: (timeline entry, at_s), every primitive event of one entry at one instant.
Transition = tuple[int, float]


@dataclass
class Pending:
    """A down transition being timed."""

    key: Transition
    kind: str
    host: str | None
    t0: float  # monotonic
    wall0: float
    rerouted: bool
    epoch_before: int
    fast_hosts: set[str]
    fast_path_ms: float | None = None


class LiveWatch:
    """The watcher of one replay. The replay writes what it changed (``raw_down``, ``model``,
    ``broker_up``, ``service_up``, ``agents_down``, ``touched``, ``transitions``, ``pending``,
    ``recovering``, ``unsettled_since``, ``t_start``); the watcher tracks the rest."""

    def __init__(
        self,
        loaded: LoadedScenario,
        *,
        fleet: SimulatedFleet,
        report: LiveReport,
        settle_timeout_s: float,
    ) -> None:
        self.loaded = loaded
        self.fabric = loaded.fabric
        self.fleet = fleet
        self.report = report
        self.settle_timeout_s = settle_timeout_s
        self.model = FabricState(fabric=self.fabric, epoch_start=1)  # switch faults -> rails
        self.raw_down: set[tuple[str, int]] = set()
        self.broker_up = True
        self.service_up = True
        self.agents_down: set[str] = set()
        #: hosts whose monitors may hold a port (a port event or a restart since time 0)
        self.touched: set[str] = set()
        self.t_start = 0.0
        self.transitions: list[tuple[float, Transition]] = []  # (monotonic, transition)
        self.pending: list[Pending] = []
        self.closed: list[Pending] = []
        self.recovering: list[tuple[Event, float]] = []  # *_up of outages, monotonic
        self.unsettled_since: float | None = None
        self.checked: object = None
        self.plans_ok: tuple[object, bool] = (None, False)
        self.settled_at: float | None = None  # the last look that found the fleet settled
        #: (service, its solve count) when a solve was last seen due: settled only after it
        self.owed: tuple[int, int] | None = None
        self.next_settle_look = 0.0
        #: what the service committed and received: (host, epoch) -> monotonic, first seen
        self.plan_seen: dict[tuple[str, int], float] = {}
        self.ack_seen: dict[tuple[str, int], float] = {}
        self.status: dict[tuple[str, str], PortStatus] = {}  # touched hosts' monitor status

    # -- truth -----------------------------------------------------------------------------------
    def _held(self) -> dict[str, set[int]]:
        """Rails the running agents' monitors hold down or suppress (touched hosts only: the
        others read ACTIVE since time 0)."""
        out: dict[str, set[int]] = defaultdict(set)
        for host in self.touched - self.agents_down:
            mon = self.fleet.agents[host].monitor
            for c in self.fabric.host(host).hcas:
                st = mon.state(c.key)
                if st is not None and st.status in _HELD:
                    out[host].add(c.rail)
        return out

    def truth(self) -> dict[str, frozenset[int]]:
        """Rails unusable in fact: ports the scenario has down, rails lost to switch faults,
        ports the (running) agents' monitors hold down or suppress."""
        out = self._held()
        for host, rail in self.raw_down:
            out[host].add(rail)
        if self.model.health is not None:
            for host, rails in self.model.health.unusable.items():
                out[host] |= rails
        return {h: frozenset(r) for h, r in out.items() if r}

    # -- settling --------------------------------------------------------------------------------
    def _outage(self) -> bool:
        return not (self.broker_up and self.service_up) or bool(self.agents_down)

    def _settled(self) -> object | None:
        """A signature of the settled state, or None when not settled (module docstring)."""
        if self._outage():
            return None
        service = self.fleet.service
        state = service.state
        if state.dirty or state.solver is None or self.owed == (id(service), service.solves):
            return None
        if not self.fleet.all_acked():
            return None
        agents = self.fleet.agents
        if any(agents[h].applier.applied_epoch != state.acked_epoch(h) for h in state.published):
            return None
        truth = self.truth()
        if {h: r for h, r in state.unusable().items() if r} != truth:
            return None
        sig = (
            id(service),
            state.epoch,
            tuple(sorted(truth.items())),
            tuple((h, tuple(sorted(a.applier.locally_down))) for h, a in sorted(agents.items())),
        )
        if self.plans_ok[0] != sig:  # the service's plans must satisfy the model too
            ok = not self.loaded.scenario.expect.reachability or not check(
                self.fabric, truth, state.plans, self._pairs(truth)
            )
            self.plans_ok = (sig, ok)
        return sig if self.plans_ok[1] else None

    def _pairs(self, truth: Mapping[str, frozenset[int]]) -> list[tuple[str, str]]:
        return pairs_to_check(self.fabric, truth, seed=self.loaded.scenario.seed)

    def _check_installed(self, now: float, *, why: str) -> None:
        self.report.settles += 1
        if not self.loaded.scenario.expect.reachability:
            return
        truth = self.truth()
        found = installed_mismatches(
            self.fabric, truth, self.fleet, self.agents_down, self._pairs(truth)
        )
        self.report.mismatch_count += len(found)
        room = MAX_MISMATCHES - len(self.report.mismatches)
        at = now - self.t_start
        self.report.mismatches += [f"{at:.3f} s ({why}): {m}" for m in found[:room]]

    def track(self, now: float) -> None:
        """Record what is new since the last look: plans the service committed, applied acks
        it received, fast-path acks of pending faults, re-admissions."""
        service = self.fleet.service
        state = service.state
        if state.dirty or getattr(getattr(service, "backoff", None), "due", None) is not None:
            self.owed = (id(service), service.solves)  # a solve is due: not settled before it
        # epochs only (the full plans are built for the oracle), and not while a restarted
        # service still reads the retained plans and peer routes: before its first solve its
        # view of them (and of the epochs hosts ack) is partial
        for h in state.published if state.solver is not None else ():
            epoch = state.acked_epoch(h)
            assert epoch is not None  # a published plan's host has one
            self.plan_seen.setdefault((h, epoch), now)
        for h, a in state.acks.items():
            if a.result == AckResult.APPLIED:
                self.ack_seen.setdefault((h, a.epoch), now)
        for p in self.pending:
            if p.fast_path_ms is None:
                for h in p.fast_hosts:
                    ack = self.fleet.agents[h].last_ack
                    if ack is not None and ack.fast_path and ack.applied_at >= p.wall0:
                        p.fast_path_ms = round((ack.applied_at - p.wall0) * 1000, 3)
        for host in self.touched - self.agents_down:
            mon = self.fleet.agents[host].monitor
            for c in self.fabric.host(host).hcas:
                st = mon.state(c.key)
                if st is None:
                    continue
                before = self.status.get((host, c.key))
                self.status[(host, c.key)] = st.status
                if before in _HELD and st.status == PortStatus.UP:
                    at = round(now - self.t_start, 3)
                    self.report.readmissions.append({"host": host, "rail": c.rail, "at_s": at})

    def _poll(self, *, force: bool = False) -> bool:
        """One look of the watcher: tracking every time, the settle every SETTLE_POLL_S (or
        now, ``force``): a new settled state gets the oracle, a settle closes the pending
        transitions, a wait beyond the timeout is reported. True when settled now."""
        now = time.monotonic()
        self.track(now)
        if now < self.next_settle_look and not force:
            return False
        self.next_settle_look = now + SETTLE_POLL_S
        sig = self._settled()
        if sig is not None:
            if sig != self.checked:
                self.checked = sig
                self._check_installed(now, why="settled")
            if self.unsettled_since is not None:
                self.unsettled_since = None
                self.close(now, settled=True)
            self.settled_at = now
            return True
        if self.unsettled_since is None or self._outage():
            self.unsettled_since = now  # the timeout counts from the end of an outage
        elif now - self.unsettled_since > self.settle_timeout_s:
            self.report.unsettled.append(
                f"not settled within {self.settle_timeout_s:g} s of "
                f"{self.unsettled_since - self.t_start:.3f} s ({self.why_unsettled()})"
            )
            self._check_installed(now, why="timeout")
            self.checked = None
            self.unsettled_since = None
            self.close(now, settled=False)
        return False

    def why_unsettled(self) -> str:
        state = self.fleet.service.state
        if self._outage():
            return "an outage is in progress"
        if state.dirty or state.solver is None:
            return "the service has an unsolved change"
        pending = state.pending_acks()
        if pending:
            return f"hosts without an applied ack of their plan: {', '.join(pending[:6])}"
        behind = sorted(
            h
            for h in state.published
            if self.fleet.agents[h].applier.applied_epoch != state.acked_epoch(h)
        )
        if behind:
            return f"agents not at the service's epoch: {', '.join(behind[:6])}"
        truth = self.truth()
        unusable = {h: r for h, r in state.unusable().items() if r}
        if unusable != truth:
            diff = [
                f"{h} {sorted(truth.get(h, ()))} vs {sorted(unusable.get(h, ()))}"
                for h in sorted(truth.keys() | unusable.keys())
                if truth.get(h) != unusable.get(h)
            ]
            return "unusable rails, truth vs service: " + ", ".join(diff[:4])
        return "the service's plans do not satisfy the model"

    def close(self, now: float, *, settled: bool) -> None:
        """The fleet settled (or the wait timed out): close the pending transitions and
        recoveries (fault timings are computed at the end, from what was tracked)."""
        self.closed += self.pending
        self.pending = []
        for e, t0 in self.recovering:
            self.report.recoveries.append(
                Recovery(
                    entry=e.entry,
                    kind=e.kind,
                    at_s=e.at_s,
                    host=e.host,
                    settled_ms=round((now - t0) * 1000, 3) if settled else None,
                )
            )
        self.recovering = []

    def timing(self, p: Pending) -> LiveFault:
        """``p``'s fast path, plan epoch and acks, from what the service committed and
        received (its first new epoch after the transition, when the truth changed)."""
        epoch = None
        if p.rerouted:
            later = [
                e for (_, e), at in self.plan_seen.items() if e > p.epoch_before and at >= p.t0
            ]
            epoch = min(later, default=None)
        # one solve's epochs: its peer routes' and, one above, its plans' (committed together)
        t_e = min((at for (_, e), at in self.plan_seen.items() if e == epoch), default=None)
        mine = {h: e for (h, e), at in self.plan_seen.items() if e >= (epoch or 0) and at == t_e}
        hosts = sorted(mine)
        acks = []
        for h in hosts:
            seen = [at for (host, e), at in self.ack_seen.items() if host == h and e >= mine[h]]
            if seen:
                acks.append(min(seen))
        return LiveFault(
            entry=p.key[0],
            kind=p.kind,
            at_s=p.key[1],
            host=p.host,
            rerouted=p.rerouted,
            fast_path_ms=p.fast_path_ms,
            epoch=epoch,
            plans=len(hosts),
            acked=len(acks),
            first_ack_ms=round((min(acks) - p.t0) * 1000, 3) if acks else None,
            last_ack_ms=(
                round((max(acks) - p.t0) * 1000, 3) if acks and len(acks) == len(hosts) else None
            ),
        )

    async def run(self) -> None:
        """Poll every :data:`POLL_S` until cancelled (:meth:`_poll`: tracking, settles)."""
        while True:
            self._poll()
            await asyncio.sleep(POLL_S)

    def quiet(self) -> bool:
        """The timeline's effects are over: settled since the last transition, nothing
        pending, no port held down."""
        return (
            self.settled_at is not None
            and (not self.transitions or self.settled_at > self.transitions[-1][0])
            and not self.pending
            and not self.recovering
            and not self._held()
            and self._poll(force=True)
        )

    def plan_counts(self, baseline: set[tuple[str, int]]) -> tuple[dict[str, int], int]:
        """(new plans per host, the most plans one host got for one transition), counting the
        plans seen on the bus but not those in ``baseline`` (host, epoch: time 0's); a plan
        counts for the latest transition before it."""
        per_host: Counter[str] = Counter()
        per_event: dict[Transition, Counter[str]] = defaultdict(Counter)
        for (host, epoch), at in sorted(self.plan_seen.items(), key=lambda x: x[1]):
            if (host, epoch) in baseline:
                continue
            per_host[host] += 1
            cause = None
            for t, key in self.transitions:  # the latest transition before the plan
                if t <= at:
                    cause = key
            if cause is not None:
                per_event[cause][host] += 1
        most = max((n for c in per_event.values() for n in c.values()), default=0)
        return dict(sorted(per_host.items())), most
