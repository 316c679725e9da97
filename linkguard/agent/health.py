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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from linkguard.drivers.counters import CounterBaseline
from linkguard.models import SettingsModel

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


#: Shortest ``window_s`` (s) of :class:`CounterHealthPolicy`: 5 counter readings (the sysfs
#: driver re-reads counters every ``counters_interval_s`` = 1 s), so a window sees a rate, not
#: a single delta; a shorter one would rarely hold more than one reading and degrade nothing.
MIN_WINDOW_S = 5.0


class CounterThreshold(BaseModel):
    """Events per window: ``degrade`` or more drains the port; it comes back once the count
    stays at or below ``clear`` (< ``degrade``) for the policy's ``clear_after_s``.

    Both are whole numbers, strictly: an int, or a string of digits (the environment's
    ``..._DEGRADE=50``); a bool (YAML ``true``), a float or anything else raises
    ``pydantic.ValidationError``, the same from YAML and from the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    degrade: int = Field(ge=1, le=2**32, strict=True)
    clear: int = Field(ge=0, le=2**32, strict=True)

    @field_validator("degrade", "clear", mode="before")
    @classmethod
    def _whole_number(cls, v: object) -> object:
        if isinstance(v, int) and not isinstance(v, bool):  # YAML true/false: not 1/0 events
            return v
        if isinstance(v, str) and v.strip().lstrip("+").isdigit():  # the environment's text
            return int(v.strip())
        shown = str(v).lower() if isinstance(v, bool) else repr(v)
        raise ValueError(f"must be a whole number of events per window, not {shown}")

    @model_validator(mode="after")
    def _clear_below(self) -> CounterThreshold:
        if self.clear >= self.degrade:
            raise ValueError(
                f"clear ({self.clear}) must be below degrade ({self.degrade}), or a degraded "
                "port would clear while still over its threshold"
            )
        return self


def _t(degrade: int, clear: int) -> CounterThreshold:
    return CounterThreshold(degrade=degrade, clear=clear)


#: Defaults per counter, events per 60 s window (see :class:`CounterHealthPolicy` for why).
DEFAULT_THRESHOLDS: Mapping[str, CounterThreshold] = MappingProxyType(
    {
        # IB PMA PortCounters (sysfs counters/, IBA vol. 1 16.1.3.5)
        "symbol_error": _t(100, 10),
        "port_rcv_errors": _t(100, 10),
        "link_error_recovery": _t(3, 0),
        "link_downed": _t(2, 0),
        "local_link_integrity_errors": _t(2, 0),
        "excessive_buffer_overrun_errors": _t(2, 0),
        # RoCE netdev PHY counters (mlx5 ethtool -S)
        "rx_symbol_err_phy": _t(100, 10),
        "rx_crc_errors_phy": _t(100, 10),
        "link_down_events_phy": _t(2, 0),
    }
)


class CounterHealthPolicy(SettingsModel):
    """When error counters drain an up port (``counter_health`` in the agent settings).

    ``window_s`` (s) = 60: thresholds are events per 60 s. ``clear_after_s`` (s) = 300: a
    degraded port returns after 5 minutes below every ``clear`` threshold, the damping's
    ``hold_down_max_s`` (a drained rail costs ~1/7 of one NIC's bandwidth, DESIGN.md; a port
    re-admitted too early costs retransmits and another re-plan). ``enabled`` False: never.

    Default thresholds (``DEFAULT_THRESHOLDS``) and where they come from:

    * ``symbol_error``, ``port_rcv_errors`` (IB), ``rx_symbol_err_phy``, ``rx_crc_errors_phy``
      (RoCE): degrade at 100 per 60 s, clear at 10. Derived from the link BER the standards
      require, 1e-12 (IBTA vol. 2 PHY for SDR..EDR; IEEE 802.3 for 25G+ lanes; HDR/NDR and
      400GbE meet it after FEC): at 400 Gb/s that allows 0.4 errors/s = 24 per minute, at
      100 Gb/s 6. 100/min is 4x worse than in-spec at the fastest link and 16x at 100 Gb/s,
      while a healthy link (FEC-corrected) shows ~0; clear at 10/min is in spec everywhere.
      A judgement on top of the spec figure, not a vendor number.
    * ``link_error_recovery`` 3, ``link_downed`` 2, ``link_down_events_phy`` 2 per 60 s (clear
      0): beyond the flaps the monitor saw, so these are retrains too short for the 100 ms
      state poll; each one stalls the link. Judgement (infiniband-diags' ibcheckerrs and
      ibqueryerrors flag any non-zero value; two in a minute is a pattern, one may be noise).
    * ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors`` 2 per 60 s (clear
      0): each increment already means a PHY error threshold (PortInfo.LocalPhyErrors) or the
      overrun threshold (PortInfo.OverrunErrors) was crossed (IBA vol. 1 16.1.3.5); 4-bit
      counters that saturate at 15. Judgement.

    ``thresholds`` given in the settings replace the defaults per counter name (a name not
    given keeps its default); set a counter's ``degrade`` very high to ignore it. A counter may
    give only one of the two: ``clear`` alone keeps the default ``degrade``; ``degrade`` alone
    keeps the default ``clear`` when that is below it, else takes ``degrade // 10`` (the
    defaults' 100/10 ratio; 0 below 10). Raises ``pydantic.ValidationError`` for a
    non-finite/non-positive time, a ``window_s`` under :data:`MIN_WINDOW_S` (5 s: counters are
    read once a second), a ``clear_after_s`` under 1 s (one counter reading), a threshold that
    is not a whole number (a bool included), ``clear >= degrade`` (naming the counter), a
    counter given neither, a counter name that is not one of ``DEFAULT_THRESHOLDS`` (a typo
    must not be ignored).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    enabled: bool = True
    window_s: float = Field(
        60.0, gt=0, le=86_400, description=f"events counted over this long (s), >= {MIN_WINDOW_S:g}"
    )
    # >= 1 s: counters are read once a second; a shorter time would clear on one clean reading
    clear_after_s: float = Field(300.0, ge=1.0, le=86_400)
    thresholds: dict[str, CounterThreshold] = Field(default_factory=dict, max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _fill_thresholds(cls, data: object) -> object:
        # a counter given only degrade or only clear gets the other one (class docstring)
        if not isinstance(data, Mapping):
            return data  # pydantic says what is wrong
        given = data.get("thresholds")
        if not isinstance(given, Mapping):
            return data  # absent, or not a mapping: pydantic says what is wrong
        unknown = [n for n in given if n not in DEFAULT_THRESHOLDS]
        if any(not isinstance(given[n], Mapping) or len(given[n]) < 2 for n in unknown):
            _unknown_counters(unknown)  # not "clear: field required" for a misspelt name
        filled = {}
        for name, t in given.items():
            if isinstance(t, Mapping) and name in DEFAULT_THRESHOLDS:
                t = _fill_threshold(name, t)
            filled[name] = t
        return {**data, "thresholds": filled}

    @field_validator("window_s")
    @classmethod
    def _whole_readings(cls, v: float) -> float:
        if v < MIN_WINDOW_S:
            raise ValueError(
                f"{v:g} s is too short: counters are read once a second (the sysfs driver's "
                f"counters_interval_s = 1 s), so a window under {MIN_WINDOW_S:g} s (5 readings) "
                f"would rarely see a rate and never degrade a port; give window_s >= "
                f"{MIN_WINDOW_S:g}"
            )
        return v

    @model_validator(mode="after")
    def _merge_defaults(self) -> CounterHealthPolicy:
        if not (math.isfinite(self.window_s) and math.isfinite(self.clear_after_s)):
            raise ValueError("window_s and clear_after_s must be finite seconds")
        unknown = [n for n in self.thresholds if n not in DEFAULT_THRESHOLDS]
        if unknown:
            _unknown_counters(unknown)
        merged = {**DEFAULT_THRESHOLDS, **self.thresholds}
        object.__setattr__(self, "thresholds", merged)
        return self


def _unknown_counters(names: Sequence[object]) -> None:
    """ValueError naming the counters that are not in ``DEFAULT_THRESHOLDS``."""
    raise ValueError(
        f"thresholds: unknown counter(s) {', '.join(sorted(map(str, names)))}; known: "
        f"{', '.join(sorted(DEFAULT_THRESHOLDS))}"
    )


def _as_int(v: object) -> int | None:
    """``v`` as an int when it plainly is one (YAML int, or a string of digits from the
    environment), else None (pydantic then reports the bad value)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lstrip("+").isdigit():
        return int(v.strip())
    return None


def _fill_threshold(name: str, t: Mapping[str, object]) -> dict[str, object]:
    """``t`` (one counter's override) with the missing ``degrade`` or ``clear`` filled in from
    ``DEFAULT_THRESHOLDS[name]``; ValueError naming the counter when neither is given, a key
    is neither, or the pair has ``clear >= degrade``."""
    default = DEFAULT_THRESHOLDS[name]
    out = dict(t)
    extra = sorted(str(k) for k in out if k not in ("degrade", "clear"))
    if extra:  # a misspelt key (``degrad``; the environment's ..._DEGRAD) is named
        raise ValueError(
            f"thresholds.{name}: unknown key(s) {', '.join(extra)}; give degrade, clear or both"
        )
    if "degrade" not in out and "clear" not in out:
        raise ValueError(f"thresholds.{name}: give degrade, clear or both")
    if "degrade" not in out:
        out["degrade"] = default.degrade
    elif "clear" not in out:
        d = _as_int(out["degrade"])
        # a degrade under 1 is refused on its own; the clear filled in must not add an error
        keep = d is None or d < 1 or default.clear < d
        out["clear"] = default.clear if d is None or keep else d // 10
    d, c = _as_int(out["degrade"]), _as_int(out["clear"])
    if d is not None and d >= 1 and c is not None and c >= d:  # degrade 0: pydantic's ge=1
        which = ", the default degrade" if "degrade" not in t else ""
        raise ValueError(
            f"thresholds.{name}: clear ({c}) must be below degrade ({d}{which}), or a degraded "
            "port would clear while still over its threshold"
        )
    return out


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
