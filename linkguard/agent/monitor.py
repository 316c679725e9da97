"""Port monitor: raw port observations -> effective port states (debounce, hold-down, damping).

Consumes :class:`~linkguard.drivers.base.PortObservation` batches from a driver. Produces, per
call, a :class:`MonitorOutput`: the :class:`~linkguard.models.PortState` of every port whose
published state changed materially, the :class:`~linkguard.models.PortEvent` of every status
transition, and the monotonic time at which :meth:`PortMonitor.tick` must run next.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

import structlog
from pydantic import ValidationError

from linkguard.agent.health import CounterHealth, CounterHealthPolicy
from linkguard.damping import DampingPolicy
from linkguard.drivers.base import PortObservation
from linkguard.models import (
    DampingStatus,
    LinkLayer,
    PhysState,
    PortEvent,
    PortRef,
    PortState,
    PortStateName,
    PortStatus,
    port_rate_problem,
)

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

#: PortState field limits (linkguard.models): longer values are truncated / dropped, not fatal.
_MAX_REASON = 200
_MAX_COUNTERS = 256
_MAX_RATE_GBPS = 100_000.0
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


class RawVerdict(NamedTuple):
    """Instantaneous usability of one reading: ``usable`` None = unreadable (unknown)."""

    usable: bool | None
    reason: str | None


_PHYS_REASON = {
    PhysState.SLEEP: "phys_sleep",
    PhysState.POLLING: "phys_polling",
    PhysState.DISABLED: "phys_disabled",
    PhysState.PORT_CONFIGURATION_TRAINING: "phys_training",
    PhysState.LINK_ERROR_RECOVERY: "link_error_recovery",
    PhysState.PHY_TEST: "phys_test",
}


def raw_usability(obs: PortObservation, *, link_layer: LinkLayer | None = None) -> RawVerdict:
    """Classify one reading, before any damping (IBA vol. 1 14.2.5.6 PortState/PhysState).

    InfiniBand: usable iff ``state`` ACTIVE and ``phys_state`` LinkUp (phys None = decide on
    state alone). ACTIVE_DEFER -> "active_defer". INIT/ARMED with LinkUp (or phys unknown) ->
    "no_sm": no subnet manager assignment, not a cable fault. Otherwise the reason names the
    physical state ("phys_polling", "phys_disabled", "link_error_recovery", ...) or "state_down".
    Without ``state`` the netdev carrier decides (IPoIB). Ethernet (RoCE): carrier decides when
    known (False -> "no_carrier") and ``state`` must be ACTIVE when known; LID 0 / no SM is never
    a fault there. ``state`` and ``carrier`` both None, or a NOP state (IBA: "no state change",
    never a real reading), -> unknown with reason "unreadable: <first error>". A device or
    netdev that is gone (``obs.present`` False) is a real fault: unusable, reason "absent: ...".
    ``link_layer`` is the remembered one, used when the reading has none.
    """
    if not obs.present:
        detail = obs.errors[0] if obs.errors else "device gone"
        return RawVerdict(False, f"absent: {detail}"[:_MAX_REASON])
    layer = obs.link_layer or link_layer
    state = None if obs.state == PortStateName.NOP else obs.state
    if state is None and obs.carrier is None:
        detail = obs.errors[0] if obs.errors else f"state {obs.state.value if obs.state else None}"
        return RawVerdict(None, f"unreadable: {detail}"[:_MAX_REASON])
    if layer == LinkLayer.ETHERNET:
        if obs.carrier is False:
            return RawVerdict(False, "no_carrier")
        if state is None or state == PortStateName.ACTIVE:
            return RawVerdict(True, None)
        return RawVerdict(False, f"state_{state.value.lower()}")
    if state is None:  # IB port known only through its netdev (IPoIB)
        return RawVerdict(True, None) if obs.carrier else RawVerdict(False, "no_carrier")
    phys = obs.phys_state
    if state == PortStateName.ACTIVE:
        if phys is None or phys == PhysState.LINK_UP:
            return RawVerdict(True, None)
        return RawVerdict(False, _PHYS_REASON[phys])
    if state == PortStateName.ACTIVE_DEFER:
        return RawVerdict(False, "active_defer")
    if phys is None or phys == PhysState.LINK_UP:
        if state in (PortStateName.INIT, PortStateName.ARMED):
            return RawVerdict(False, "no_sm")
        return RawVerdict(False, "state_down")
    return RawVerdict(False, _PHYS_REASON[phys])


def gid_moves(before: Mapping[int, str], after: Mapping[int, str]) -> list[str]:
    """The GID indexes that a job may no longer use as it did (``NCCL_IB_GID_INDEX``,
    ``ib_write_bw -x``): each index of ``before`` (index -> GID, non-empty entries) that now
    holds another GID or none, as ``"<index>: <old> -> <new or None>"``, by index. A GID value
    may legitimately sit at two indexes (RoCE v1 and v2 entries), so indexes are compared, not
    values; new entries at unused indexes are not moves."""
    return [
        f"{i}: {gid} -> {after.get(i)}" for i, gid in sorted(before.items()) if after.get(i) != gid
    ]


def _check_wall(wall: float) -> None:
    if not (math.isfinite(wall) and wall >= 0):
        raise ValueError(f"wall must be Unix seconds >= 0, got {wall!r}")


@dataclass(eq=False)
class _Port:
    hca: str
    port: int
    rail: int | None
    link_layer: LinkLayer | None = None
    netdev: str | None = None
    obs: PortObservation | None = None
    raw: bool | None = None  # last readable verdict; None = never readable
    raw_reason: str | None = None
    unreadable: str | None = None  # set while the latest reading is unknown
    status: PortStatus = PortStatus.UNKNOWN
    flaps: int = 0
    last_flap: float | None = None
    hold_s: float = 0.0  # length of the running hold-down
    hold_until: float | None = None
    penalty: float = 0.0
    penalty_at: float = 0.0
    suppressed: bool = False
    reuse_at: float | None = None
    published: PortState | None = None
    published_key: tuple | None = None
    logged: set[str] = field(default_factory=set)
    # counter health and re-admission (DEGRADED)
    health_reason: str | None = None  # set while the counters are over a threshold
    counted: bool = False  # the latest reading went to counter health as usable
    awaiting_fresh: bool = False  # back with reused counters: the next re-read is a baseline
    readmit_reason: str | None = None  # set while the re-admission or rate check fails
    ref_rate: float | None = None  # highest rate (Gb/s) held rate_settle_s while not short
    rate_since: float | None = None  # monotonic time (s) the current rate was first read
    admitted_layer: LinkLayer | None = None  # link layer while last UP
    admitted_gids: Mapping[int, str] | None = None  # GID table while last UP
    gid_index_changed: bool = False


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
        #: "hca/port" -> the rate (Gb/s) the port must run at to be re-admitted UP
        self._expected = dict(expected_rates or {})
        self._expected_warned: set[str] = set()  # expected rate below a reading: said once
        if not (math.isfinite(rate_settle_s) and rate_settle_s >= 0):
            raise ValueError(f"rate_settle_s must be a finite number >= 0, got {rate_settle_s!r}")
        self._rate_settle_s = float(rate_settle_s)
        self._ports: dict[str, _Port] = {}
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
                p = _Port(hca=hca, port=int(port), rail=self._rails.get(key))
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

    def _port_for(self, obs: PortObservation) -> _Port | None:
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
        p = _Port(hca=obs.hca, port=obs.port, rail=self._rails.get(key))
        p.ref_rate = self._restored_rates.pop(key, None)
        self._ports[key] = p
        return p

    def _apply(self, p: _Port, obs: PortObservation, now: float) -> None:
        previous_obs, p.obs = p.obs, obs
        if previous_obs is None or obs.rate_gbps != previous_obs.rate_gbps:
            p.rate_since = now
        if obs.link_layer is not None:
            p.link_layer = obs.link_layer
        if obs.netdev is not None:
            p.netdev = obs.netdev
        verdict = raw_usability(obs, link_layer=p.link_layer)
        usable = obs.present and verdict.usable is True
        baseline = self._counter_baseline(p, previous_obs, obs, usable=usable)
        self._health.observe(
            obs.key, obs.counters, obs.saturated, usable=usable, now=now, baseline=baseline
        )
        if not obs.present and p.raw is None:
            # never seen: a configuration mistake (a netdev or HCA name typo), not a fault that
            # should move traffic; a device that was there and vanished is a fault (DOWN)
            self._log_once(
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
            return  # first readable reading (UP/DOWN at once), or no usability change
        if previous and not verdict.usable:
            self._flap(p, now)
        else:  # back: start the hold-down for the current history
            self._expire(p, now)
            p.hold_s = self.policy.hold_down_for(p.flaps)
            p.hold_until = now + p.hold_s

    @staticmethod
    def _counter_baseline(
        p: _Port, previous: PortObservation | None, obs: PortObservation, *, usable: bool
    ) -> bool:
        """Whether ``obs`` is the first counter re-read since the port came back (counter
        health then takes it as a baseline only). Counter health itself takes the reading at
        the edge as the baseline; but a driver may reuse counters between re-reads
        (:attr:`PortObservation.counters_fresh` False: the sysfs driver reads them once a
        second), so that reading may carry counters read while the port was down, and the
        next re-read the rest of the training's errors: that re-read is the baseline then."""
        back = usable and not p.counted and previous is not None  # not the first reading
        p.counted = usable
        if back:
            p.awaiting_fresh = not obs.counters_fresh
            return False
        if not usable:
            p.awaiting_fresh = False
            return False
        if p.awaiting_fresh and obs.counters_fresh:
            p.awaiting_fresh = False
            return True
        return False

    def _flap(self, p: _Port, now: float) -> None:
        pol = self.policy
        self._expire(p, now)
        self._health.flap(f"{p.hca}/{p.port}", now=now)
        p.flaps += 1
        p.last_flap = now
        p.hold_until = None
        if pol.mode == "penalty":
            p.penalty = min(pol.ceiling, self._penalty(p, now) + pol.penalty_per_flap)
            p.penalty_at = now
            if p.penalty > pol.suppress_threshold:
                p.suppressed = True
            if p.suppressed:
                p.reuse_at = now + pol.reuse_delay(p.penalty)

    # -- timers and status --------------------------------------------------------------------
    def _penalty(self, p: _Port, now: float) -> float:
        return self.policy.decayed(p.penalty, now - p.penalty_at) if p.penalty else 0.0

    def _expire(self, p: _Port, now: float) -> None:
        """Clear what has run out at ``now``: flap history (quiet period) and suppression."""
        if p.last_flap is not None and now >= p.last_flap + self.policy.quiet_period_s:
            p.flaps = 0
            p.last_flap = None
        if p.suppressed and p.reuse_at is not None and now >= p.reuse_at:
            p.suppressed = False
            p.reuse_at = None

    def _target(self, p: _Port, now: float) -> PortStatus:
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
            self._readmit(p)
        p.hold_until = None
        return self._up_or_degraded(p, now)

    # -- degraded: counter health and re-admission ----------------------------------------------
    def _up_or_degraded(self, p: _Port, now: float) -> PortStatus:
        """UP, or DEGRADED while the counters, the re-admission check or the rate check say
        so. The rate of a port not short of it (only upwards, once held ``rate_settle_s``)
        and an UP port's link layer and GID table become the reference for its next
        re-admission."""
        key = f"{p.hca}/{p.port}"
        health = self._health.evaluate(key, now=now)
        p.health_reason = health.reason if health.degraded else None
        o = p.obs
        if p.readmit_reason is not None and o is not None:
            layer_ok = p.admitted_layer is None or p.link_layer == p.admitted_layer
            if self._readmit_rate(p, o) is None and layer_ok:
                log.info(
                    "port_readmission_recovered", host=self.host, port=key, was=p.readmit_reason
                )
                p.readmit_reason = None
        expected = self._expected.get(key)
        if (
            expected is not None
            and o is not None
            and o.rate_gbps is not None
            and o.rate_gbps > expected
            and key not in self._expected_warned
        ):  # a typo (40 for 400) turns the rate check off for this port: say so once
            self._expected_warned.add(key)
            log.warning(
                "expected_rate_below_reading",
                host=self.host,
                port=key,
                expected_gbps=expected,
                read_gbps=o.rate_gbps,
                hint="the port is held only to expected_rate_gbps; a slower retrain above it "
                "goes unnoticed. Raise it to the rate the port should run at, or remove it",
            )
        if p.readmit_reason is None and o is not None:
            # the rate rule while up: the same check as at re-admission, on every reading
            p.readmit_reason = self._rate_short(p, o)
            if p.readmit_reason is not None:
                log.warning(
                    "port_rate_below_reference", host=self.host, port=key, reason=p.readmit_reason
                )
        if p.readmit_reason is None and o is not None and self._layer_changed(p):
            # a link-layer change too quick for the state poll: as at re-admission
            p.readmit_reason = self._layer_reason(p)
        if p.readmit_reason is None and self._rate_settled(p, now):
            # a rate held for rate_settle_s (counters may be over a threshold: the rate is
            # still right); one glitched reading (a retrain caught mid-way, a corrupt file)
            # never becomes the bar the port is then held to
            assert p.obs is not None and p.obs.rate_gbps is not None  # _rate_settled: both set
            p.ref_rate = max(p.ref_rate or 0.0, p.obs.rate_gbps)
        if p.readmit_reason is not None or p.health_reason is not None:
            return PortStatus.DEGRADED
        if o is not None:
            p.admitted_layer = p.link_layer
            if o.gids is not None:
                p.admitted_gids = o.gids
        return PortStatus.UP

    def _rate_settled(self, p: _Port, now: float) -> bool:
        o = p.obs
        return (
            o is not None
            and bool(o.rate_gbps)
            and p.rate_since is not None
            and now - p.rate_since >= self._rate_settle_s
        )

    def _rate_deadline(self, p: _Port) -> float | None:
        """When a rate above the port's reference becomes it (a tick is due then), else None."""
        o = p.obs
        if not p.raw or o is None or not o.rate_gbps or p.rate_since is None:
            return None
        if f"{p.hca}/{p.port}" in self._expected or o.rate_gbps <= (p.ref_rate or 0.0):
            return None
        return p.rate_since + self._rate_settle_s

    def _ref_rate(self, p: _Port) -> float | None:
        return self._expected.get(f"{p.hca}/{p.port}") or p.ref_rate

    def _rate_short(self, p: _Port, o: PortObservation) -> str | None:
        """``"rate 200 < 400 Gb/s"`` when ``o``'s rate is below the port's reference rate,
        else None (rate unread, or no reference yet)."""
        ref = self._ref_rate(p)
        if o.rate_gbps is not None and ref is not None and o.rate_gbps < ref:
            return f"rate {o.rate_gbps:g} < {ref:g} Gb/s"
        return None

    def _readmit_rate(self, p: _Port, o: PortObservation) -> str | None:
        """:meth:`_rate_short`, and, for a port that has a learnt reference, an unread rate:
        ``"rate unreadable (was 400 Gb/s)"``. A port is not re-admitted on a rate it cannot
        show (the check would pass on nothing); one that never had a readable rate (the
        netlink driver reads none) has no reference and is not held to one."""
        short = self._rate_short(p, o)
        if short is None and o.rate_gbps is None and p.ref_rate is not None:
            return f"rate unreadable (was {self._ref_rate(p):g} Gb/s)"
        return short

    @staticmethod
    def _layer_changed(p: _Port) -> bool:
        """A link layer read that differs from the one the port had while last UP (an unread
        one is no change while up)."""
        return (
            p.admitted_layer is not None
            and p.link_layer is not None
            and p.link_layer != p.admitted_layer
        )

    def _layer_reason(self, p: _Port) -> str:
        """``"link_layer InfiniBand -> Ethernet"``, logged as ``port_link_layer_changed``."""
        was = p.admitted_layer.value if p.admitted_layer else None
        now_layer = p.link_layer.value if p.link_layer else None
        key = f"{p.hca}/{p.port}"
        log.warning("port_link_layer_changed", host=self.host, port=key, was=was, now=now_layer)
        return f"link_layer {was} -> {now_layer}"

    def _readmit(self, p: _Port) -> None:
        """Compare the port coming back from hold-down with what it was while last UP (rate,
        link layer, GID table); sets ``readmit_reason`` / ``gid_index_changed`` and logs."""
        o, key = p.obs, f"{p.hca}/{p.port}"
        if o is None:
            return
        rate_short = self._readmit_rate(p, o)
        reasons = [] if rate_short is None else [rate_short]
        if p.admitted_layer is not None and p.link_layer != p.admitted_layer:
            reasons.append(self._layer_reason(p))
        p.readmit_reason = "; ".join(reasons) or None
        if p.readmit_reason is not None:
            log.warning(
                "port_readmission_degraded", host=self.host, port=key, reason=p.readmit_reason
            )
        if o.gids is not None and p.admitted_gids is not None:
            moved = gid_moves(p.admitted_gids, o.gids)
            p.gid_index_changed = bool(moved)
            if moved:
                log.warning("port_gid_index_changed", host=self.host, port=key, moved=moved[:16])
            p.admitted_gids = o.gids

    def _settle(self, p: _Port, now: float, wall: float, events: list[PortEvent]) -> None:
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
                reason=self._reason(p),
                at=wall,
            )
        )

    def _deadline(self, p: _Port, now: float) -> float | None:
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
        rate = self._rate_deadline(p)
        if rate is not None:
            times.append(rate)
        times = [t for t in times if t > now]
        return min(times) if times else None

    def _finish(self, now: float, wall: float, events: list[PortEvent]) -> MonitorOutput:
        states = []
        deadline: float | None = None
        for p in self._ports.values():
            self._settle(p, now, wall, events)
            key = self._material(p)
            if key != p.published_key:
                st = self._emit(p, now, wall)
                if st is not None:
                    states.append(st)
            d = self._deadline(p, now)
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        return MonitorOutput(states=states, events=events, next_deadline=deadline)

    # -- publishing ---------------------------------------------------------------------------
    def _reason(self, p: _Port) -> str | None:
        if p.unreadable is not None:
            return p.unreadable
        return {
            PortStatus.DOWN: p.raw_reason,
            PortStatus.HELD_DOWN: "hold_down",
            PortStatus.SUPPRESSED: "suppressed",
            PortStatus.DEGRADED: "; ".join(
                r for r in (p.readmit_reason, p.health_reason) if r is not None
            ),
        }.get(p.status)

    def _hold_display(self, p: _Port) -> float:
        if p.hold_until is not None:
            return p.hold_s
        return self.policy.hold_down_for(p.flaps)

    def _material(self, p: _Port) -> tuple:
        o = p.obs
        return (
            p.status,
            self._reason(p),
            p.link_layer,
            p.netdev,
            o.state if o else None,
            o.phys_state if o else None,
            o.carrier if o else None,
            o.rate_gbps if o else None,
            tuple(sorted(o.saturated)) if o else (),
            p.flaps,
            p.suppressed,
            self._hold_display(p),
            p.gid_index_changed,
        )

    def _emit(self, p: _Port, now: float, wall: float) -> PortState | None:
        self._seq += 1
        st = self._build(p, now, wall, self._seq)
        if st is None:
            self._seq -= 1
            return None
        p.published = st
        p.published_key = self._material(p)
        return st

    def _build(self, p: _Port, now: float, wall: float, seq: int) -> PortState | None:
        o = p.obs
        ends = [p.hold_until or now]
        if p.suppressed and p.reuse_at is not None:
            ends.append(p.reuse_at)
        damping = DampingStatus(
            flaps=p.flaps,
            penalty=self._penalty(p, now),
            suppressed=p.suppressed,
            hold_down_s=self._hold_display(p),
            hold_down_remaining_s=max(0.0, max(ends) - now),
        )
        # values checked by PortState's validation (below), not by their static types
        fields: dict[str, Any] = {
            "host": self.host,
            "hca": p.hca,
            "port": p.port,
            "rail": p.rail,
            "link_layer": p.link_layer,
            "netdev": p.netdev,
            "state": o.state if o else None,
            "phys_state": o.phys_state if o else None,
            "carrier": o.carrier if o else None,
            "rate_gbps": o.rate_gbps if o else None,
            "status": p.status,
            "usable": p.status == PortStatus.UP,
            "reason": (self._reason(p) or "")[:_MAX_REASON] or None,
            "damping": damping,
            "counters": dict(o.counters) if o else {},
            "counters_saturated": sorted(o.saturated) if o else [],
            "gid_index_changed": p.gid_index_changed,
            "observed_at": wall,
            "seq": seq,
        }
        try:
            return PortState(**fields)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
        self._log_once(p, "bad_values", fields=sorted(bad))
        self._sanitize(fields, bad)
        try:
            return PortState(**fields)
        except ValidationError as exc:  # pragma: no cover - host/hca/port were checked
            self._log_once(p, "unpublishable", error=str(exc)[:300])
            return None

    @staticmethod
    def _sanitize(fields: dict, bad: set[str]) -> None:
        """Drop the values a PortState refuses (NaN/negative/huge rate, bad netdev name,
        > 256 counters, non-int counter values) so one bad value never hides the port."""
        if "rate_gbps" in bad:
            rate = fields["rate_gbps"]
            ok = isinstance(rate, int | float) and math.isfinite(rate)
            fields["rate_gbps"] = rate if ok and 0 <= rate <= _MAX_RATE_GBPS else None
        if "netdev" in bad:
            fields["netdev"] = None
        if "counters" in bad:
            counters = {
                k: (v if isinstance(v, int) and not isinstance(v, bool) else None)
                for k, v in sorted(fields["counters"].items())
                if isinstance(k, str)
            }
            fields["counters"] = dict(list(counters.items())[:_MAX_COUNTERS])
        if "counters_saturated" in bad:
            fields["counters_saturated"] = fields["counters_saturated"][:_MAX_COUNTERS]

    def _log_once(self, p: _Port, what: str, **kw: object) -> None:
        if what in p.logged:
            return
        p.logged.add(what)
        log.warning("port_" + what, host=self.host, port=f"{p.hca}/{p.port}", **kw)
