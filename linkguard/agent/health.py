"""Counter health: error-counter rates over a window -> "this up port is degraded".

Consumes: successive ``(counters, saturated)`` readings of each port (from
:class:`~linkguard.drivers.base.PortObservation`), whether the port was usable at each reading,
and the flaps the monitor saw. Produces, per port, a :class:`HealthVerdict`: degraded or not,
and why (``"symbol_error 120/60s"``), plus the next time the verdict can change on its own (a
sample leaving the window, the clear delay running out). Pure: no clock, no I/O; every call
takes ``now`` (monotonic s).

Rules:

* Deltas come from :class:`~linkguard.drivers.counters.CounterBaseline` with
  ``reset_unknown=True``: a first reading, an unreadable counter, a saturated one (stuck at the
  maximum of its width) and a reset (lower than before) give no delta, so they never degrade a
  port. A missing counter simply has no samples.
* A delta counts at the time of the reading that shows it (the sysfs driver re-reads counters
  every ``counters_interval_s`` = 1 s and reports a reading as soon as a counter changed).
* Deltas seen while the port is not usable (down, training) are dropped: link training counts
  symbol errors by design (IBA vol. 2 5.7.x PHY training), that is a flap, not a gray failure.
* The first reading after the port became usable again (not usable -> usable, including after
  an unreadable reading) is a baseline only: its delta spans the down period and the training,
  so it is dropped too; deltas count from the next reading on. A reading the caller marks
  ``baseline=True`` is dropped the same way (the monitor marks the first counter re-read after
  the port came back, when the driver reused counters read before it did).
* Flap counters (``link_downed``, ``link_error_recovery``, ``link_down_events_phy``) count
  every flap, including the ones the monitor saw (and damps): each flap the monitor reports
  (:meth:`CounterHealth.flap`) is matched with one increment of each, once: an increment
  dropped in the same stretch of dropped readings (the flap's own, read while the port was
  down or at its baseline reading, before or after the monitor reported the flap), else the
  next counted increment within ``window_s`` (counters read late). Only the excess (flaps too
  short for the state poll) counts; dropped increments left unmatched when counting resumes
  are forgotten (retrains during one down period).
* Degraded when any counter's count in the last ``window_s`` reaches its ``degrade`` threshold.
  Healthy again only after every counter's count has stayed at or below its ``clear``
  threshold for ``clear_after_s`` without a break (hysteresis: a counter hovering around the
  degrade threshold keeps the port degraded instead of flapping the plans).
* Across an agent restart (:meth:`CounterHealth.degraded_ports` saved,
  :meth:`CounterHealth.seed` on start): a port degraded before is degraded after, with its
  reason, and its clear timer restarts: ``clear_after_s`` of clean readings taken after the
  restart (what the counters did while no agent ran is unknown).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from linkguard.counterpolicy import (
    DEFAULT_THRESHOLDS,
    MIN_WINDOW_S,
    CounterHealthPolicy,
    CounterThreshold,
)
from linkguard.drivers.counters import CounterBaseline

__all__ = [
    "DEFAULT_THRESHOLDS",
    "FLAP_COUNTERS",
    "MIN_WINDOW_S",
    "CounterHealth",
    "CounterHealthPolicy",
    "CounterThreshold",
    "HealthVerdict",
]

#: Counters that count flaps (the monitor's own flaps are subtracted from them).
FLAP_COUNTERS = frozenset({"link_downed", "link_error_recovery", "link_down_events_phy"})


@dataclass(frozen=True)
class HealthVerdict:
    """``degraded`` and, when degraded, ``reason`` naming the worst counter (the one furthest
    over its threshold) when the port became degraded, as ``"<name> <count>/<window>s"`` (kept
    while it stays degraded, so a changing count does not re-publish the state); ``counts``:
    events per counter in the current window (only counters with events)."""

    degraded: bool
    reason: str | None = None
    counts: Mapping[str, int] = field(default_factory=dict)


_HEALTHY = HealthVerdict(False)


@dataclass(eq=False)
class _PortHealth:
    samples: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    #: per flap counter: the time of each flap the monitor saw not yet matched with an increment
    seen_flaps: dict[str, deque[float]] = field(default_factory=dict)
    #: per flap counter: increments dropped since the last counted reading, not yet matched
    dropped_flaps: dict[str, int] = field(default_factory=dict)
    #: the previous reading was usable (False before the first one)
    usable: bool = False
    degraded: bool = False
    reason: str | None = None
    clean_since: float | None = None
    #: the first usable reading since the port was last not usable (monotonic s)
    up_since: float | None = None
    #: when the port became degraded (monotonic s; seeded: converted from the saved wall time)
    degraded_at: float | None = None
    #: when the counts, as last seen over ``clear``, fall back to ``clear`` without new errors
    dirty_until: float | None = None


class CounterHealth:
    """Counter health of one host's ports, by ``"hca/port"`` key. Not thread-safe."""

    def __init__(self, policy: CounterHealthPolicy | None = None) -> None:
        self.policy = policy or CounterHealthPolicy()
        self._baseline = CounterBaseline()
        self._ports: dict[str, _PortHealth] = {}

    # -- inputs --------------------------------------------------------------------------------
    def observe(
        self,
        key: str,
        counters: Mapping[str, int | None],
        saturated: frozenset[str],
        *,
        usable: bool,
        now: float,
        baseline: bool = False,
    ) -> HealthVerdict:
        """Take one reading of ``key``'s counters at ``now``; ``usable``: the port was usable
        at this reading. Its deltas are dropped when it is not usable, when the previous
        reading was not (the first reading after the port came back is a baseline only) and
        when ``baseline`` is True (counters that may span the time the port was not usable).
        A reading of the port not usable restarts a degraded port's clear timer: it clears
        after ``clear_after_s`` of clean readings taken while the link is up. Returns the
        verdict."""
        deltas = self._baseline.update(key, counters, saturated, reset_unknown=True)
        p = self._ports.setdefault(key, _PortHealth())
        counted = usable and p.usable and not baseline
        if usable and not p.usable:
            p.up_since = now
        p.usable = usable
        if not usable:
            # a degraded port's clear_after_s counts clean readings of the link up: the time
            # it is down (or held down) shows nothing, so its clear timer starts again
            p.clean_since = None
        if not counted:
            for name in FLAP_COUNTERS:
                delta = deltas.get(name)
                if delta:  # the increments of a flap the monitor saw are its own
                    left = self._absorb(p, name, delta, now)
                    if left:
                        p.dropped_flaps[name] = p.dropped_flaps.get(name, 0) + left
            return self.evaluate(key, now=now)
        p.dropped_flaps.clear()  # what the down period left unmatched: retrains, not flaps
        if self.policy.enabled:
            for name, delta in deltas.items():
                if not delta or name not in self.policy.thresholds:
                    continue
                if name in FLAP_COUNTERS:
                    delta = self._absorb(p, name, delta, now)
                if delta > 0:
                    p.samples.setdefault(name, deque()).append((now, delta))
        return self.evaluate(key, now=now)

    def flap(self, key: str, *, now: float) -> None:
        """The monitor saw ``key`` flap at ``now``: one increment of each flap counter is
        that flap, not a hidden one: one already dropped since the last counted reading (the
        reading that showed the port down may show its increment too), else the next one
        within ``window_s``."""
        p = self._ports.setdefault(key, _PortHealth())
        for name in FLAP_COUNTERS:
            if p.dropped_flaps.get(name):
                p.dropped_flaps[name] -= 1
            else:
                p.seen_flaps.setdefault(name, deque()).append(now)

    def seed(self, key: str, *, reason: str, since: float) -> None:
        """Start ``key`` degraded with ``reason`` (a verdict saved by the previous agent, see
        :meth:`degraded_ports`), before its first reading. ``since``: monotonic time (s) at
        which it became degraded (reported back by :meth:`degraded_ports`, so repeated
        restarts keep the original time).

        The clear timer restarts: the port is healthy again only after ``clear_after_s`` of
        clean readings from its first evaluation after the seed (its first reading after the
        restart); no wall time is needed. Any samples of ``key`` are dropped, and its first
        reading is a baseline only. A no-op when the policy is disabled (nothing degrades
        then). Raises ``ValueError`` for an empty or non-string reason, one over 200
        characters, or a non-finite ``since``.
        """
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 200:
            raise ValueError(f"reason must be a non-empty string of <= 200 chars, got {reason!r}")
        if not isinstance(since, int | float) or not math.isfinite(since):
            raise ValueError(f"since must be a finite monotonic time, got {since!r}")
        if not self.policy.enabled:
            return
        self._ports[key] = _PortHealth(degraded=True, reason=reason, degraded_at=float(since))

    def degraded_ports(self) -> dict[str, tuple[str, float]]:
        """The ports degraded at their last evaluation, the verdicts worth keeping across an
        agent restart: ``"hca/port"`` -> (reason, monotonic time (s) it became degraded).
        Empty when the policy is disabled."""
        if not self.policy.enabled:
            return {}
        return {
            key: (p.reason or "counters", p.degraded_at if p.degraded_at is not None else 0.0)
            for key, p in self._ports.items()
            if p.degraded
        }

    def forget(self, key: str) -> None:
        """Drop everything about ``key`` (port removed)."""
        self._baseline.forget(key)
        self._ports.pop(key, None)

    # -- decisions -----------------------------------------------------------------------------
    def evaluate(self, key: str, *, now: float) -> HealthVerdict:
        """The verdict of ``key`` at ``now`` (samples older than ``window_s`` dropped first)."""
        p = self._ports.get(key)
        if p is None or not self.policy.enabled:
            return _HEALTHY
        counts = self._counts(p, now)
        th = self.policy.thresholds
        over = [(c / th[n].degrade, n, c) for n, c in counts.items() if c >= th[n].degrade]
        dirty = any(c > th[n].clear for n, c in counts.items())
        if over and not p.degraded:  # the reason stays as first seen: no publish per count
            _, name, count = max(over)
            p.degraded, p.degraded_at = True, now
            p.reason = f"{name} {count}/{self.policy.window_s:g}s"
        if dirty:
            p.clean_since = None
            p.dirty_until = self._dirty_until(p)
        elif p.clean_since is None and p.usable:
            # exact even when this evaluation comes late: no reading came in between; never
            # before the link came up
            p.clean_since = now if p.dirty_until is None else min(now, p.dirty_until)
            if p.up_since is not None:
                p.clean_since = max(p.clean_since, p.up_since)
        if (
            p.degraded
            and p.clean_since is not None
            and (now - p.clean_since >= self.policy.clear_after_s)
        ):
            p.degraded, p.reason, p.degraded_at = False, None, None
        if not p.degraded:
            return HealthVerdict(False, None, counts)
        return HealthVerdict(True, p.reason, counts)

    def next_deadline(self, key: str, *, now: float) -> float | None:
        """When ``key``'s verdict can next change without a new reading (a sample leaving the
        window, the clear delay ending), None when nothing is pending."""
        p = self._ports.get(key)
        if p is None:
            return None
        times = [q[0][0] + self.policy.window_s for q in p.samples.values() if q]
        if p.degraded and p.clean_since is not None:
            times.append(p.clean_since + self.policy.clear_after_s)
        times = [t for t in times if t > now]
        return min(times) if times else None

    # -- internals -----------------------------------------------------------------------------
    def _counts(self, p: _PortHealth, now: float) -> dict[str, int]:
        start = now - self.policy.window_s
        counts: dict[str, int] = {}
        for name, q in list(p.samples.items()):
            while q and q[0][0] <= start:
                q.popleft()
            if q:
                counts[name] = sum(d for _, d in q)
            else:
                del p.samples[name]
        return counts

    def _dirty_until(self, p: _PortHealth) -> float:
        """The time at which every counter's count falls to its ``clear`` threshold as its
        samples leave the window, if no new errors come."""
        th, until = self.policy.thresholds, 0.0
        for name, q in p.samples.items():
            left = sum(d for _, d in q)
            for ts, d in q:
                if left <= th[name].clear:
                    break
                left -= d
                until = max(until, ts + self.policy.window_s)
        return until

    def _absorb(self, p: _PortHealth, name: str, delta: int, now: float) -> int:
        seen = p.seen_flaps.get(name)
        if not seen:
            return delta
        while seen and seen[0] <= now - self.policy.window_s:
            seen.popleft()
        while seen and delta > 0:
            seen.popleft()
            delta -= 1
        return delta
