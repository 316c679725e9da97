"""The port monitor's per-port record, and the published :class:`~linkguard.models.PortState` of it.

Consumes a :class:`PortRecord` (what :class:`~linkguard.agent.monitor.PortMonitor` remembers of
one port: its latest reading, status, damping history and re-admission references) and the
damping policy. Produces the port's status reason, the key of what makes a change material (a
new state is published only when it changes), and the ``PortState`` itself, with any value a
``PortState`` refuses dropped (logged once) rather than hiding the port. Pure: no clock, no
I/O; ``now`` is monotonic seconds, ``wall`` Unix seconds, from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from linkguard.agent.usability import MAX_REASON
from linkguard.damping import DampingPolicy
from linkguard.drivers.base import PortObservation
from linkguard.models import DampingStatus, LinkLayer, PortDisagreement, PortState, PortStatus

__all__ = [
    "PortRecord",
    "build_state",
    "counter_baseline",
    "hold_display",
    "log_once",
    "material_key",
    "penalty_now",
    "sanitize_fields",
    "status_reason",
]

log = structlog.get_logger(__name__)

#: PortState field limits (linkguard.models): longer values are dropped, not fatal.
_MAX_COUNTERS = 256
_MAX_RATE_GBPS = 100_000.0


@dataclass(eq=False)
class PortRecord:
    """What the monitor remembers of one port (``hca``/``port``; ``rail`` None when unmapped).

    Times are monotonic seconds, rates Gb/s, ``hold_s`` the length (s) of the running hold-down.
    """

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
    # link evidence (linkguard.agent.linkkinds)
    carrier_base: int | None = None  # carrier_changes at the last usable carrier-up reading
    link_reason: str | None = None  # set while a bond has members without carrier
    missed_flap: str | None = None  # why the running hold-down began without a down reading
    disagreement: PortDisagreement | None = None  # the sources' readings while they disagree

    @property
    def key(self) -> str:
        """``"hca/port"``."""
        return f"{self.hca}/{self.port}"


def penalty_now(p: PortRecord, policy: DampingPolicy, now: float) -> float:
    """The port's penalty (RFC 2439 figure of merit) decayed to ``now``."""
    return policy.decayed(p.penalty, now - p.penalty_at) if p.penalty else 0.0


def counter_baseline(
    p: PortRecord, previous: PortObservation | None, obs: PortObservation, *, usable: bool
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


def status_reason(p: PortRecord) -> str | None:
    """Why the port has its status: the unreadable reading's error, the raw reason when DOWN,
    ``"hold_down"``, ``"suppressed"`` (each with ``"; carrier_changes 4 -> 6 while usable"``
    after a flap no reading saw), or the DEGRADED reasons joined by ``"; "``."""
    if p.unreadable is not None:
        return p.unreadable
    return {
        PortStatus.DOWN: p.raw_reason,
        PortStatus.HELD_DOWN: "; ".join(r for r in ("hold_down", p.missed_flap) if r),
        PortStatus.SUPPRESSED: "; ".join(r for r in ("suppressed", p.missed_flap) if r),
        PortStatus.DEGRADED: "; ".join(
            r for r in (p.readmit_reason, p.health_reason, p.link_reason) if r is not None
        ),
    }.get(p.status)


def hold_display(p: PortRecord, policy: DampingPolicy) -> float:
    """The hold-down (s) shown: the running one, else the one the next return would get."""
    if p.hold_until is not None:
        return p.hold_s
    return policy.hold_down_for(p.flaps)


def material_key(p: PortRecord, policy: DampingPolicy) -> tuple:
    """Everything of the published state but the counters, times, ``seq`` and time-decaying
    figures: a new state is published when this changes."""
    o = p.obs
    return (
        p.status,
        status_reason(p),
        p.link_layer,
        p.netdev,
        o.state if o else None,
        o.phys_state if o else None,
        o.carrier if o else None,
        o.rate_gbps if o else None,
        tuple(sorted(o.saturated)) if o else (),
        p.flaps,
        p.suppressed,
        hold_display(p, policy),
        p.gid_index_changed,
        p.disagreement,
    )


def build_state(
    host: str, p: PortRecord, policy: DampingPolicy, *, now: float, wall: float, seq: int
) -> PortState | None:
    """The ``PortState`` of ``p`` at ``now`` (``observed_at`` = ``wall``, with ``seq``). Values
    it refuses are dropped (:func:`sanitize_fields`, logged once as ``port_bad_values``); None
    (logged once as ``port_unpublishable``) only if it still refuses."""
    o = p.obs
    ends = [p.hold_until or now]
    if p.suppressed and p.reuse_at is not None:
        ends.append(p.reuse_at)
    damping = DampingStatus(
        flaps=p.flaps,
        penalty=penalty_now(p, policy, now),
        suppressed=p.suppressed,
        hold_down_s=hold_display(p, policy),
        hold_down_remaining_s=max(0.0, max(ends) - now),
    )
    # values checked by PortState's validation (below), not by their static types
    fields: dict[str, Any] = {
        "host": host,
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
        "reason": (status_reason(p) or "")[:MAX_REASON] or None,
        "damping": damping,
        "counters": dict(o.counters) if o else {},
        "counters_saturated": sorted(o.saturated) if o else [],
        "gid_index_changed": p.gid_index_changed,
        "carrier_changes": o.carrier_changes if o else None,
        "disagreement": p.disagreement,
        "observed_at": wall,
        "seq": seq,
    }
    try:
        return PortState(**fields)
    except ValidationError as exc:
        bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
    log_once(host, p, "bad_values", fields=sorted(bad))
    sanitize_fields(fields, bad)
    try:
        return PortState(**fields)
    except ValidationError as exc:  # pragma: no cover - host/hca/port were checked
        log_once(host, p, "unpublishable", error=str(exc)[:300])
        return None


def sanitize_fields(fields: dict, bad: set[str]) -> None:
    """Drop the values a PortState refuses (NaN/negative/huge rate, bad netdev name,
    > 256 counters, non-int counter values) so one bad value never hides the port."""
    if "rate_gbps" in bad:
        rate = fields["rate_gbps"]
        ok = isinstance(rate, int | float) and math.isfinite(rate)
        fields["rate_gbps"] = rate if ok and 0 <= rate <= _MAX_RATE_GBPS else None
    if "netdev" in bad:
        fields["netdev"] = None
    if "carrier_changes" in bad:
        fields["carrier_changes"] = None
    if "counters" in bad:
        counters = {
            k: (v if isinstance(v, int) and not isinstance(v, bool) else None)
            for k, v in sorted(fields["counters"].items())
            if isinstance(k, str)
        }
        fields["counters"] = dict(list(counters.items())[:_MAX_COUNTERS])
    if "counters_saturated" in bad:
        fields["counters_saturated"] = fields["counters_saturated"][:_MAX_COUNTERS]


def log_once(host: str, p: PortRecord, what: str, **kw: object) -> None:
    """Log ``port_<what>`` for this port the first time only (a bad value is logged once)."""
    if what in p.logged:
        return
    p.logged.add(what)
    log.warning("port_" + what, host=host, port=p.key, **kw)
