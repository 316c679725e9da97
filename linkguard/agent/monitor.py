"""Port monitor: raw port observations -> effective port states (debounce, hold-down, damping).

Consumes :class:`~linkguard.drivers.base.PortObservation` batches from a driver. Produces, per
call, a :class:`MonitorOutput`: the :class:`~linkguard.models.PortState` of every port whose
published state changed materially, the :class:`~linkguard.models.PortEvent` of every status
transition, and the monotonic time at which :meth:`PortMonitor.tick` must run next.
The decisions it takes from its siblings: a reading's usability before damping
(:mod:`linkguard.agent.usability`), the re-admission check and the rate rule
(:mod:`linkguard.agent.readmission`), and the per-port record and the ``PortState`` built from it
(:mod:`linkguard.agent.portrecord`); counter health is :mod:`linkguard.agent.health`.

Pure decision code: no clock, no I/O, no asyncio. Every method takes ``now`` (monotonic seconds,
used for all decisions; ``PortObservation.monotonic`` is ignored) and ``wall`` (Unix seconds,
only copied into ``observed_at`` / ``at``). The rules (issue 2, section 4):

* A port leaving the usable state is acted on at once: status DOWN and an event, same call.
* A port coming back is HELD_DOWN until it has been raw-usable continuously for the current
  hold-down; going down again meanwhile is another flap and restarts it.
* ``backoff`` mode: the hold-down doubles per flap from ``hold_down_initial_s`` up to
  ``hold_down_max_s``; ``quiet_period_s`` after the last flap the history is cleared.
* ``penalty`` mode (RFC 2439 section 4): each flap adds ``penalty_per_flap`` to a figure of merit
  that decays exponentially with ``half_life_s``, clipped to the ceiling
  ``reuse * 2**(max_suppress/half_life)``; above ``suppress_threshold`` the port is SUPPRESSED
  until the figure decays to ``reuse_threshold``; it also needs ``hold_down_initial_s`` of
  stability after each return.
* An unreadable reading (``state`` and ``carrier`` both None) never changes the status.
* The first readable observation of a port is UP or DOWN at once (no hold-down at agent start).
* A port that would be UP is DEGRADED (up, but drained by the service) while
  (a) its error counters are over a threshold (:mod:`linkguard.agent.health`: rates over a
  window, with hysteresis), (b) the re-admission check failed, or (c) its rate is below its
  reference (the rate rule while up, below). The re-admission check runs
  once, when a hold-down (or suppression) ends: the port's latest reading (the sysfs driver
  re-reads rate and link layer at most ``counters_interval_s`` = 1 s earlier, the GID table at
  its last state change or re-discovery) is compared with what it had while last UP. A rate
  below that (or below the port's configured ``expected_rates``) -> DEGRADED
  ``"rate 200 < 400 Gb/s"`` until the rate is back (a link layer read while UP that differs
  from the admitted one is taken the same way at once); a rate that cannot be read (``N/A``, a
  broken file) where the port had a learnt one -> DEGRADED ``"rate unreadable (was 400
  Gb/s)"`` until a reading passes the check; a changed link layer -> DEGRADED
  ``"link_layer InfiniBand -> Ethernet"`` until it is back (logged); GID indexes that moved are
  logged and published as ``gid_index_changed`` (the port is still re-admitted).
* The rate rule holds while the port is up too (a retrain too fast for the state poll, or a
  width/speed downgrade without a visible flap): every reading of a port that would be UP whose
  rate is below its reference (``expected_rates`` when configured, else the highest rate held
  for ``rate_settle_s`` = 3 s while not below the reference; a port's first readings have no
  learnt reference, and one glitched reading never becomes it) makes it DEGRADED with the same
  reason, ``"rate 200 < 400 Gb/s"``, logged as ``port_rate_below_reference``, and it is UP again
  at the first reading at or above the reference, as after re-admission (no further
  hold-down). The reference only learns a higher rate: never a lower one. The agent keeps the
  learnt references across restarts (:meth:`PortMonitor.reference_rates`); a port that now
  runs slower for good is accepted by configuring its ``expected_rate_gbps``.
* DEGRADED is not an emergency: no fast path (the agent's fast path acts on DOWN only); the
  topology service counts it unusable and re-plans. A DEGRADED port that goes down flaps like
  an UP one.
* Link evidence (:mod:`linkguard.agent.linkkinds`): ``carrier_changes`` rising between usable
  readings is a flap; a bond with a member down is DEGRADED; disagreeing sources are shown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import structlog
from pydantic import ValidationError

from linkguard.agent.health import CounterHealth, CounterHealthPolicy
from linkguard.agent.linkkinds import bond_reason, bond_verdict, disagreement, missed_flap
from linkguard.agent.portrecord import (
    PortRecord,
    build_state,
    counter_baseline,
    log_once,
    material_key,
    penalty_now,
    status_reason,
)
from linkguard.agent.readmission import Readmission, gid_moves
from linkguard.agent.usability import RawVerdict, raw_usability
from linkguard.damping import DampingPolicy
from linkguard.drivers.base import PortObservation
from linkguard.models import PortEvent, PortRef, PortState, PortStatus, port_rate_problem

T = TypeVar("T")

__all__ = [
    "DampingPolicy",
    "MonitorOutput",
    "PortMonitor",
    "RawVerdict",
    "gid_moves",
    "raw_usability",
]

log = structlog.get_logger(__name__)

#: how far ahead of this clock a saved time may be before it is taken as a wrong clock (s)
_CLOCK_SLACK_S = 60.0
_NO_RAILS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class MonitorOutput:
    """Effects of one :meth:`PortMonitor.observe` / :meth:`PortMonitor.tick` call.

    ``states``: ports whose published state changed materially (anything but ``counters``,
    ``observed_at``, ``seq`` and the time-decaying ``damping.penalty`` /
    ``damping.hold_down_remaining_s``), to publish now, at most one per port. ``events``: status
    transitions in the order they happened (``previous`` UNKNOWN = first readable reading).
    ``next_deadline``: monotonic time (s) at which ``tick()`` must be called next (hold-down
    expiry, penalty decay to reuse, quiet-period history reset), None if nothing is pending.
    """

    states: list[PortState] = field(default_factory=list)
    events: list[PortEvent] = field(default_factory=list)
    next_deadline: float | None = None


def _check_wall(wall: float) -> None:
    if not (math.isfinite(wall) and wall >= 0):
        raise ValueError(f"wall must be Unix seconds >= 0, got {wall!r}")


class PortMonitor:
    """Turns raw observations of one host's ports into effective port states.

    ``rails`` maps ``"hca/port"`` to the rail index copied into states and events (None when
    absent). ``host`` must be a valid host name (``ValueError`` otherwise); every method raises
    ``ValueError`` for a non-finite ``now`` or a negative/non-finite ``wall``. Observations of a
    port whose name cannot be published (bad HCA name, port outside 1..255) are logged once and
    ignored; bad rate/netdev/counter values are logged once and left out of the state.
    ``expected_rates`` maps ``"hca/port"`` to the rate (Gb/s) it must run at (else a learnt
    one); ``rate_settle_s`` (s, >= 0, ``ValueError`` otherwise) is how long a higher rate must
    hold before it becomes a port's learnt reference (the agent passes 3 s, or two state polls
    when they are slower).
    """

    def __init__(
        self,
        *,
        host: str,
        policy: DampingPolicy,
        rails: Mapping[str, int] = _NO_RAILS,
        health: CounterHealthPolicy | None = None,
        expected_rates: Mapping[str, float] = _NO_RAILS,
        rate_settle_s: float = 3.0,
    ) -> None:
        try:
            PortRef(host=host, hca="probe", port=1)
        except ValidationError as exc:
            raise ValueError(f"invalid host name {host!r}: {exc.errors()[0]['msg']}") from None
        self.host = host
        self.policy = policy
        self._rails = dict(rails or {})
        self._health = CounterHealth(health)
        # re-admission after hold-down and the rate rule (DEGRADED); ValueError on a bad
        # rate_settle_s
        self._readmission = Readmission(
            host=host, expected_rates=expected_rates, rate_settle_s=rate_settle_s
        )
        #: "hca/port" -> the rate (Gb/s) the port must run at to be re-admitted UP
        self._expected = self._readmission.expected
        self._ports: dict[str, PortRecord] = {}
        self._rejected: set[str] = set()
        self._restored_rates: dict[str, float] = {}  # reference rates for ports not yet read
        self._seq = 0
        self._now: float | None = None
        self._wall = 0.0
        self._clock_warned = False

    # -- public API ---------------------------------------------------------------------------
    def observe(
        self, batch: Iterable[PortObservation], *, now: float, wall: float
    ) -> MonitorOutput:
        """Apply a batch of readings at ``now`` (in order; several per port are fine), then
        every timer due at ``now``. Returns the resulting states, events and next deadline."""
        now = self._advance_clock(now, wall)
        events: list[PortEvent] = []
        for obs in batch:
            p = self._port_for(obs)
            if p is None:
                continue
            self._apply(p, obs, now)
            self._settle(p, now, wall, events)
        return self._finish(now, wall, events)

    def tick(self, *, now: float, wall: float) -> MonitorOutput:
        """Run every timer due at ``now`` (hold-down expiry, reuse, history reset)."""
        now = self._advance_clock(now, wall)
        return self._finish(now, wall, [])

    def snapshot(self, *, wall: float) -> list[PortState]:
        """Current state of every port (for a periodic refresh or a reconnect), each with a new
        ``seq``. Time-dependent figures are taken at the ``now`` of the last call."""
        _check_wall(wall)
        now = self._now if self._now is not None else 0.0
        out = []
        for p in self._ports.values():
            st = self._emit(p, now, wall)
            if st is not None:
                out.append(st)
        return out

    def state(self, key: str) -> PortState | None:
        """Read-only view of port ``"hca/port"`` at the last call's time (it carries the ``seq``
        of that port's last emitted state; nothing is emitted). None for an unknown key."""
        p = self._ports.get(key)
        if p is None:
            return None
        now = self._now if self._now is not None else 0.0
        seq = p.published.seq if p.published is not None else 0
        return self._build(p, now, self._wall, seq)

    # -- history across restarts -------------------------------------------------------------
    def history(self, *, now: float, wall: float) -> dict[str, dict[str, object]]:
        """The damping history worth keeping across an agent restart, per ``"hca/port"``:
        whether the port was usable, its flap count, hold-down and penalty, with every time as
        wall-clock seconds (monotonic time does not survive a restart). Ports with no history
        (up, never flapped) are left out."""
        off = wall - now

        def w(t: float | None) -> float | None:
            return None if t is None else t + off

        out: dict[str, dict[str, object]] = {}
        for key, p in self._ports.items():
            if p.raw is None or (
                p.raw
                and p.flaps == 0
                and p.hold_until is None
                and not p.suppressed
                and p.penalty == 0
            ):
                continue
            out[key] = {
                "raw": p.raw,
                "flaps": p.flaps,
                "hold_s": p.hold_s,
                "penalty": p.penalty,
                "suppressed": p.suppressed,
                "last_flap": w(p.last_flap),
                "hold_until": w(p.hold_until),
                "penalty_at": w(p.penalty_at),
                "reuse_at": w(p.reuse_at),
            }
        return out

    def _watched(self, saved: Mapping[str, T], event: str) -> dict[str, T]:
        """The entries of ``saved`` (by ``"hca/port"``) of ports this monitor watches; with
        ``rails`` given, the others (a port removed from ``ports:``, or not discovered now)
        are dropped, logged once as ``event``: restored, one would be published with no
        reading, or held to a rate it no longer has to run at."""
        if not self._rails:
            return dict(saved)
        gone = sorted(str(k) for k in saved if k not in self._rails)
        if gone:
            log.info(
                event,
                host=self.host,
                ports=gone[:64],
                why="not among this agent's ports (removed from ports:, or not discovered)",
            )
        return {k: v for k, v in saved.items() if k in self._rails}

    def restore(
        self, history: Mapping[str, Mapping[str, Any]], *, now: float, wall: float
    ) -> list[str]:
        """Take back a :meth:`history` saved by the previous agent, before the first reading: a
        port that was down or held down when it stopped is not UP at once when the new agent
        starts, it is held down as its history says (a crash loop must not bypass damping).
        History older than the quiet period is dropped; so is that of a port this monitor
        does not watch (given ``rails``: one no longer configured or discovered, which would
        otherwise be published with no reading, logged as ``damping_history_dropped``); a
        malformed entry is logged and ignored. Returns the ports restored."""
        off = wall - now
        restored = []
        for key, h in self._watched(history, "damping_history_dropped").items():
            try:
                hca, _, port = key.partition("/")
                PortRef(host=self.host, hca=hca, port=int(port))

                # JSON values as the file had them: a wrong type is a TypeError/ValueError here
                def m(field: str, h: Mapping[str, Any] = h) -> float | None:
                    v = h.get(field)
                    return None if v is None else float(v) - off

                last_flap = m("last_flap")
                if last_flap is not None and now >= last_flap + self.policy.quiet_period_s:
                    continue
                p = PortRecord(hca=hca, port=int(port), rail=self._rails.get(key))
                p.raw = bool(h["raw"])
                p.raw_reason = None if p.raw else "down before restart"
                p.flaps = int(h["flaps"])
                p.last_flap = last_flap
                p.hold_s = float(h["hold_s"])
                p.hold_until = m("hold_until")
                p.penalty = float(h["penalty"])
                p.penalty_at = m("penalty_at") or now
                p.suppressed = bool(h["suppressed"])
                p.reuse_at = m("reuse_at")
                p.ref_rate = self._restored_rates.pop(key, None)
            except (KeyError, TypeError, ValueError, ValidationError) as exc:
                log.warning(
                    "damping_history_ignored", host=self.host, port=key, error=str(exc)[:200]
                )
                continue
            self._ports[key] = p
            restored.append(key)
        return restored

    def health_history(self, *, now: float, wall: float) -> dict[str, dict[str, object]]:
        """The counter-health verdicts worth keeping across an agent restart: per ``"hca/port"``
        degraded on its error counters, ``{"reason": "symbol_error 150/60s", "since": <Unix
        s it became degraded>}``. Ports not degraded on their counters are left out."""
        off = wall - now
        return {
            key: {"reason": reason, "since": since + off}
            for key, (reason, since) in self._health.degraded_ports().items()
        }

    def reference_rates(self) -> dict[str, float]:
        """Per ``"hca/port"``, the rate (Gb/s) learnt as the port's bar (the highest that held
        ``rate_settle_s`` while the port was not short of it; :meth:`_up_or_degraded`), worth
        keeping across an agent restart: a port that runs at 200 after a retrain from 400 must
        not be taken as a healthy 200 Gb/s port by the next agent. Ports with none are left
        out (and configured ``expected_rate_gbps`` ports: the setting is their bar)."""
        out = {k: r for k, r in self._restored_rates.items() if k not in self._expected}
        for key, p in self._ports.items():
            if p.ref_rate is not None and key not in self._expected:
                out[key] = p.ref_rate
        return out

    def restore_reference_rates(self, rates: Mapping[str, object]) -> list[str]:
        """Take back :meth:`reference_rates` saved by the previous agent, before the first
        reading: each port's first reading is held to it, as if the agent had not stopped. A
        malformed entry (a bad port name, a rate that is not a number, or one no port reports:
        :func:`~linkguard.models.port_rate_problem`) is logged (``reference_rate_ignored``)
        and ignored. Returns the ports restored."""
        restored = []
        for key, rate in self._watched(rates, "reference_rates_dropped").items():
            try:
                hca, _, port = key.partition("/")
                PortRef(host=self.host, hca=hca, port=int(port))
                if isinstance(rate, bool) or not isinstance(rate, int | float):
                    raise ValueError(f"rate must be Gb/s, got {rate!r}"[:200])
                problem = port_rate_problem(rate)  # a hand edit: 401 holds a port for good
                if problem is not None:
                    raise ValueError(problem)
            except (AttributeError, TypeError, ValueError, ValidationError) as exc:
                log.warning(
                    "reference_rate_ignored", host=self.host, port=str(key)[:100], error=str(exc)
                )
                continue
            p = self._ports.get(key)
            if p is not None:
                p.ref_rate = max(p.ref_rate or 0.0, float(rate))
            else:
                self._restored_rates[key] = float(rate)
            restored.append(key)
        return restored

    def restore_health(
        self, history: Mapping[str, Mapping[str, object]], *, now: float, wall: float
    ) -> list[str]:
        """Take back a :meth:`health_history` saved by the previous agent, before the first
        reading: a port degraded on its counters when it stopped is DEGRADED, with the same
        reason, from its first reading on, until ``clear_after_s`` of clean readings taken
        after the restart (the clear timer restarts at load: the counters of the time no agent
        ran are unknown; see :meth:`CounterHealth.seed`). A malformed entry is logged and
        ignored. Returns the ports restored (none when counter health is disabled)."""
        off = wall - now
        restored = []
        for key, h in self._watched(history, "counter_health_history_dropped").items():
            try:
                hca, _, port = key.partition("/")
                PortRef(host=self.host, hca=hca, port=int(port))
                since, reason = h.get("since"), h["reason"]
                if isinstance(since, bool) or not isinstance(since, int | float):
                    raise ValueError(f"since must be Unix seconds, got {since!r}")
                if not isinstance(reason, str):
                    raise ValueError(f"reason must be a string, got {reason!r}"[:200])
                if since > wall + _CLOCK_SLACK_S:
                    # a clock that was ahead when the file was written (or an edited file): the
                    # verdict stands, its age is unknown; counted from now
                    log.warning(
                        "counter_health_since_in_future",
                        host=self.host,
                        port=key,
                        since=since,
                        wall=wall,
                    )
                    since = wall
                self._health.seed(key, reason=reason, since=float(since) - off)
            except (AttributeError, KeyError, TypeError, ValueError, ValidationError) as exc:
                log.warning(
                    "counter_health_history_ignored",
                    host=self.host,
                    port=str(key)[:100],
                    error=str(exc)[:200],
                )
                continue
            if self._health.policy.enabled:
                restored.append(key)
        return restored

    # -- observation --------------------------------------------------------------------------
    def _advance_clock(self, now: float, wall: float) -> float:
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite monotonic time, got {now!r}")
        _check_wall(wall)
        if self._now is not None and now < self._now:
            if not self._clock_warned:
                log.warning("monitor_clock_backwards", now=now, last=self._now)
                self._clock_warned = True
            now = self._now
        self._now = now
        self._wall = wall
        return now

    def _port_for(self, obs: PortObservation) -> PortRecord | None:
        key = obs.key
        p = self._ports.get(key)
        if p is not None:
            return p
        try:
            PortRef(host=self.host, hca=obs.hca, port=obs.port)
        except (ValidationError, TypeError) as exc:
            if key not in self._rejected:
                self._rejected.add(key)
                log.warning("port_rejected", host=self.host, port=key, error=str(exc)[:300])
            return None
        p = PortRecord(hca=obs.hca, port=obs.port, rail=self._rails.get(key))
        p.ref_rate = self._restored_rates.pop(key, None)
        self._ports[key] = p
        return p

    def _apply(self, p: PortRecord, obs: PortObservation, now: float) -> None:
        previous_obs, p.obs = p.obs, obs
        if previous_obs is None or obs.rate_gbps != previous_obs.rate_gbps:
            p.rate_since = now
        if obs.link_layer is not None:
            p.link_layer = obs.link_layer
        if obs.netdev is not None:
            p.netdev = obs.netdev
        # a bond's members and the netdev's carrier evidence (linkguard.agent.linkkinds)
        verdict = bond_verdict(raw_usability(obs, link_layer=p.link_layer), obs)
        usable = obs.present and verdict.usable is True
        p.link_reason, p.disagreement = bond_reason(obs), disagreement(obs)
        missed = missed_flap(p, obs, usable=usable)
        baseline = counter_baseline(p, previous_obs, obs, usable=usable)
        self._health.observe(
            obs.key, obs.counters, obs.saturated, usable=usable, now=now, baseline=baseline
        )
        if not obs.present and p.raw is None:
            # never seen: a configuration mistake (a netdev or HCA name typo), not a fault that
            # should move traffic; a device that was there and vanished is a fault (DOWN)
            log_once(
                self.host,
                p,
                "absent",
                error=verdict.reason,
                hint="check ports[].hca / ports[].netdev in the config",
            )
            p.unreadable = verdict.reason
            return
        if verdict.usable is None:
            p.unreadable = verdict.reason
            return
        p.unreadable = None
        previous, p.raw, p.raw_reason = p.raw, verdict.usable, verdict.reason
        if previous is None or previous == verdict.usable:
            if previous and missed is not None:  # down and up between two readings
                log.warning("port_missed_flap", host=self.host, port=p.key, reason=missed)
                self._flap(p, now)
            else:
                return  # first readable reading (UP/DOWN at once), or no usability change
        elif previous and not verdict.usable:
            self._flap(p, now)
        p.missed_flap = missed
        if verdict.usable:  # back (or a missed flap): the hold-down for the current history
            self._expire(p, now)
            p.hold_s = self.policy.hold_down_for(p.flaps)
            p.hold_until = now + p.hold_s

    def _flap(self, p: PortRecord, now: float) -> None:
        pol = self.policy
        self._expire(p, now)
        self._health.flap(f"{p.hca}/{p.port}", now=now)
        p.flaps += 1
        p.last_flap = now
        p.hold_until = None
        if pol.mode == "penalty":
            p.penalty = min(pol.ceiling, penalty_now(p, self.policy, now) + pol.penalty_per_flap)
            p.penalty_at = now
            if p.penalty > pol.suppress_threshold:
                p.suppressed = True
            if p.suppressed:
                p.reuse_at = now + pol.reuse_delay(p.penalty)

    # -- timers and status --------------------------------------------------------------------
    def _expire(self, p: PortRecord, now: float) -> None:
        """Clear what has run out at ``now``: flap history (quiet period) and suppression."""
        if p.last_flap is not None and now >= p.last_flap + self.policy.quiet_period_s:
            p.flaps = 0
            p.last_flap = None
        if p.suppressed and p.reuse_at is not None and now >= p.reuse_at:
            p.suppressed = False
            p.reuse_at = None

    def _target(self, p: PortRecord, now: float) -> PortStatus:
        if p.raw is None:
            return PortStatus.UNKNOWN
        if p.unreadable is not None:
            return p.status  # an unknown reading never changes the status
        if not p.raw:
            return PortStatus.DOWN
        if p.suppressed:
            return PortStatus.SUPPRESSED
        if p.hold_until is not None and now < p.hold_until:
            return PortStatus.HELD_DOWN
        if p.hold_until is not None:  # the hold-down is over: the re-admission check
            self._readmission.readmit(p)
        p.hold_until = None
        return self._up_or_degraded(p, now)

    # -- degraded: counter health, then re-admission and the rate rule -----------------------
    def _up_or_degraded(self, p: PortRecord, now: float) -> PortStatus:
        """UP, or DEGRADED while the counters (:mod:`linkguard.agent.health`), the
        re-admission check or the rate check (:mod:`linkguard.agent.readmission`) say so."""
        health = self._health.evaluate(p.key, now=now)
        p.health_reason = health.reason if health.degraded else None
        return self._readmission.up_or_degraded(p, now)

    def _settle(self, p: PortRecord, now: float, wall: float, events: list[PortEvent]) -> None:
        self._expire(p, now)
        target = self._target(p, now)
        if target == p.status:
            return
        previous, p.status = p.status, target
        events.append(
            PortEvent(
                host=self.host,
                hca=p.hca,
                port=p.port,
                rail=p.rail,
                previous=previous,
                current=target,
                reason=status_reason(p),
                at=wall,
            )
        )

    def _deadline(self, p: PortRecord, now: float) -> float | None:
        times = []
        if p.hold_until is not None and p.raw and p.unreadable is None:
            times.append(p.hold_until)
        if p.suppressed and p.reuse_at is not None:
            times.append(p.reuse_at)
        if p.last_flap is not None:
            times.append(p.last_flap + self.policy.quiet_period_s)
        health = self._health.next_deadline(f"{p.hca}/{p.port}", now=now)
        if health is not None:
            times.append(health)
        rate = self._readmission.rate_deadline(p)
        if rate is not None:
            times.append(rate)
        times = [t for t in times if t > now]
        return min(times) if times else None

    def _finish(self, now: float, wall: float, events: list[PortEvent]) -> MonitorOutput:
        states = []
        deadline: float | None = None
        for p in self._ports.values():
            self._settle(p, now, wall, events)
            key = material_key(p, self.policy)
            if key != p.published_key:
                st = self._emit(p, now, wall)
                if st is not None:
                    states.append(st)
            d = self._deadline(p, now)
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        return MonitorOutput(states=states, events=events, next_deadline=deadline)

    # -- publishing ---------------------------------------------------------------------------
    def _emit(self, p: PortRecord, now: float, wall: float) -> PortState | None:
        self._seq += 1
        st = self._build(p, now, wall, self._seq)
        if st is None:
            self._seq -= 1
            return None
        p.published = st
        p.published_key = material_key(p, self.policy)
        return st

    def _build(self, p: PortRecord, now: float, wall: float, seq: int) -> PortState | None:
        return build_state(self.host, p, self.policy, now=now, wall=wall, seq=seq)
