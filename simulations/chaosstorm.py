"""The pure parts of a chaos run (:mod:`linkguard.simulations.chaos`): the storm a seed makes,
the proxy's rules a loss rate makes, and the verdict on what the run observed.

Consumes: host names, rails, a seed, a storm length (s), a loss rate (0..1); after the run, the
per-host convergence times (s from the storm's end) and the proxy's counters. Produces: the
storm (:func:`storm_schedule`, a list of :class:`StormEvent`), the proxy's rules
(:func:`chaos_rules`) and the :class:`ChaosVerdict`. No clock, no bus: the same seed gives the
same storm and the same rules.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from linkguard.simulations.chaosproxy import Rule

__all__ = [
    "ChaosVerdict",
    "EventAudit",
    "StormEvent",
    "audit_events",
    "chaos_rules",
    "percentile",
    "storm_schedule",
    "verdict",
]

#: the share of the loss rate the proxy also duplicates, delays and reorders (each)
SIDE_SHARE = 0.5
#: how late a delayed publish is passed on (s)
DELAY_S = 0.2


@dataclass(frozen=True)
class StormEvent:
    """At ``t_s`` seconds into the storm, the port of ``host`` on ``rail`` goes down or up."""

    t_s: float
    host: str
    rail: int
    action: Literal["link_down", "link_up"]


def storm_schedule(
    hosts: list[str],
    rails: list[int],
    *,
    seed: int,
    duration_s: float,
    events_per_s: float,
    heal: bool = True,
) -> list[StormEvent]:
    """A storm of random port flaps: events at exponential gaps (mean ``1/events_per_s``
    s) within ``duration_s``, each on a random (host, rail); a port that is up goes down, one
    that is down comes up. ``heal``: every port still down at the end comes up at
    ``duration_s`` (the storm leaves the fabric whole). Deterministic for a seed."""
    if duration_s <= 0 or events_per_s <= 0:
        raise ValueError("storm duration_s and events_per_s must be positive")
    if not hosts or not rails:
        raise ValueError("a storm needs at least one host and one rail")
    rng = random.Random(f"chaos-storm/{seed}")
    down: set[tuple[str, int]] = set()
    events: list[StormEvent] = []
    t = rng.expovariate(events_per_s)
    while t < duration_s:
        port = (rng.choice(hosts), rng.choice(rails))
        action: Literal["link_down", "link_up"] = "link_up" if port in down else "link_down"
        (down.discard if port in down else down.add)(port)
        events.append(StormEvent(round(t, 4), port[0], port[1], action))
        t += rng.expovariate(events_per_s)
    if heal:
        events += [StormEvent(duration_s, h, r, "link_up") for h, r in sorted(down)]
    return events


def chaos_rules(
    loss: float,
    *,
    cuts: int,
    topic: str = "#",
    cut_probability: float = 0.01,
    cut_skip: int = 20,
) -> list[Rule]:
    """The proxy's rules for a loss rate: ``loss`` of the publishes on ``topic`` (both
    directions) dropped; of the rest, ``loss * SIDE_SHARE`` each duplicated, delayed by
    :data:`DELAY_S` and reordered; ``cuts`` connections cut (on a publish, ``cut_probability``
    of them, 1 % by default, after the first ``cut_skip``, 20). ``loss`` 0..1."""
    if not 0.0 <= loss <= 1.0:
        raise ValueError(f"loss {loss}: between 0 and 1")
    side = min(1.0, loss * SIDE_SHARE)
    rules = (
        [Rule("cut", "both", topic, probability=cut_probability, count=cuts, skip=cut_skip)]
        if cuts
        else []
    )
    return [
        *rules,
        Rule("drop", "both", topic, probability=loss),
        Rule("duplicate", "both", topic, probability=side),
        Rule("delay", "both", topic, probability=side, delay_s=DELAY_S),
        Rule("reorder", "both", topic, probability=side),
    ]


#: an event's time in the ledger and the agent's agree to this (s): the same number through
#: JSON and SQLite
TIME_TOLERANCE_S = 0.001

#: a journaled event or a ledger row: (host, journal, seq, at (Unix s), hca, port, current)
EventKey = tuple[str, str, int, float, str, int, str]


@dataclass(frozen=True)
class EventAudit:
    """The ledger against the agents' journals: events journaled, journaled events with no
    ledger row (lost), rows beyond one per (host, journal, seq) (duplicated), and rows whose
    time or port differs from the agent's (mismatched)."""

    journaled: int
    lost: int
    duplicated: int
    mismatched: int


def audit_events(journaled: list[EventKey], rows: list[EventKey]) -> EventAudit:
    """Compare what the agents journaled with the ledger's ``port_events`` rows."""
    mine = {(e[0], e[1], e[2]): e for e in journaled}
    seen: dict[tuple[str, str, int], list[EventKey]] = {}
    for r in rows:
        seen.setdefault((r[0], r[1], r[2]), []).append(r)
    lost = sum(1 for k in mine if k not in seen)
    duplicated = sum(len(v) - 1 for v in seen.values())
    mismatched = sum(
        1
        for k, e in mine.items()
        for r in seen.get(k, [])
        if abs(r[3] - e[3]) > TIME_TOLERANCE_S or r[4:] != e[4:]
    )
    return EventAudit(len(mine), lost, duplicated, mismatched)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` percentile (0..100, nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class ChaosVerdict(BaseModel):
    """What a chaos run shows. Times in s from the storm's end (the proxy's rules cleared)."""

    hosts: int = Field(description="hosts in the run")
    within_s: float = Field(description="the stated time every host must ack within (s)")
    converged: bool = Field(description="every host acked its current epoch within within_s")
    not_converged: list[str] = Field(description="hosts that did not, sorted")
    convergence_p50_s: float | None = Field(description="per-host convergence, median (s)")
    convergence_p99_s: float | None = Field(description="per-host convergence, p99 (s)")
    convergence_max_s: float | None = Field(description="the slowest host (s)")
    events_journaled: int | None = Field(None, description="port events the agents journaled")
    events_missing_until_reconnect: int | None = Field(
        None,
        description="journaled events not in the ledger once the hosts converged (the agents "
        "replay unconfirmed events only on a reconnect)",
    )
    events_lost: int | None = Field(
        None, description="journaled events not in the ledger at the end (after a reconnect)"
    )
    events_duplicated: int | None = Field(None, description="ledger rows beyond one per event")
    events_time_mismatch: int | None = Field(
        None, description="ledger rows whose time is not the agent's"
    )
    passed: bool = Field(description="converged, and no event lost, duplicated or re-timed")


def verdict(
    convergence_s: dict[str, float | None],
    *,
    within_s: float,
    journaled: int | None = None,
    missing_until_reconnect: int | None = None,
    lost: int | None = None,
    duplicated: int | None = None,
    time_mismatch: int | None = None,
) -> ChaosVerdict:
    """The verdict from per-host convergence times (None: the host never converged within
    the run's deadline) and, when the ledger was checked, the event counts."""
    late = sorted(h for h, t in convergence_s.items() if t is None or t > within_s)
    times = [t for t in convergence_s.values() if t is not None]
    events_ok = all(not n for n in (lost, duplicated, time_mismatch))
    return ChaosVerdict(
        hosts=len(convergence_s),
        within_s=within_s,
        converged=not late,
        not_converged=late,
        convergence_p50_s=percentile(times, 50),
        convergence_p99_s=percentile(times, 99),
        convergence_max_s=max(times) if times else None,
        events_journaled=journaled,
        events_missing_until_reconnect=missing_until_reconnect,
        events_lost=lost,
        events_duplicated=duplicated,
        events_time_mismatch=time_mismatch,
        passed=not late and events_ok,
    )
