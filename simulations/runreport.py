"""The report of a replay on the simulated clock (:mod:`linkguard.simulations.engine`) and the
pieces the other runners' reports share with it.

Consumes: what a replay observed (counts, transitions, returns, fast paths, oracle
mismatches, expectations). Produces: :class:`RunReport` (JSON-able with
:meth:`RunReport.to_dict`, a few lines with :meth:`RunReport.text`), :class:`ExpectResult`,
:class:`FaultTiming`, :class:`PortReturn`, :class:`FastPathTaken` and :class:`PlanCounts`,
used by the live (:mod:`linkguard.simulations.live`) and lab runners as well. Times: ``at_s``
simulated (or run) seconds from time 0, ``*_ms`` milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Protocol, TypedDict

__all__ = [
    "MAX_MISMATCHES",
    "WALL0",
    "ExpectResult",
    "FastPathTaken",
    "FaultTiming",
    "PlanCounts",
    "PortReturn",
    "RunReport",
    "mismatch_lines",
    "return_rail",
]

#: Mismatches kept verbatim in a report (all are counted).
MAX_MISMATCHES = 20

#: Wall-clock time of simulated time 0 (Unix s), for ``observed_at`` and plans' ``issued_at``.
WALL0 = 1_700_000_000.0


class PortReturn(TypedDict):
    """A port usable again (a report's ``returns`` and ``readmissions``): its host, its rail
    (None only for a port without one, which no simulated fabric has), when (s)."""

    host: str
    rail: int | None
    at_s: float


class FastPathTaken(TypedDict):
    """An agent's fast path (a report's ``fast_paths``): a port of ``host`` (``port``,
    "hca/port", on ``rail``) went down and its agent overlaid the backup of the plan in place
    at once, at ``at_s`` (s)."""

    host: str
    port: str
    rail: int | None
    at_s: float


def return_rail(r: PortReturn) -> int:
    """``r``'s rail; TypeError for a return without one (as ``int(None)`` raised here)."""
    rail = r["rail"]
    if rail is None:
        raise TypeError(f"a return of {r['host']} at {r['at_s']} s without a rail")
    return rail


def mismatch_lines(count: int, kept: list[str], shown: int = 5) -> list[str]:
    """A report's oracle mismatches as text lines: the first ``shown`` of those ``kept``
    (reports keep :data:`MAX_MISMATCHES`), then how many more there were."""
    lines = [f"    {m}" for m in kept[:shown]]
    if count > shown:
        lines.append(f"    ... and {count - shown} more (--json lists the first {MAX_MISMATCHES})")
    return lines


class PlanCounts:
    """``plans_per_host`` (host -> plans it received) summed up, for the run reports."""

    plans_per_host: dict[str, int]

    @property
    def plans_total(self) -> int:
        return sum(self.plans_per_host.values())

    @property
    def plans_max_per_host(self) -> int:
        return max(self.plans_per_host.values(), default=0)


@dataclass(frozen=True)
class FaultTiming:
    """One down transition of one timeline entry. ``reroute_ms``: simulated ms from the
    transition to the solve that moved traffic off it; None when no reroute was needed (the
    plans already avoided it: a port still held down, a spine whose leaves keep other uplinks)."""

    entry: int
    kind: str
    at_s: float
    reroute_ms: float | None


class _TimedFault(Protocol):
    """A down transition of a real run (the live runner's ``LiveFault``)."""

    @property
    def host(self) -> str | None: ...
    @property
    def at_s(self) -> float: ...
    @property
    def fast_path_ms(self) -> float | None: ...


@dataclass(frozen=True)
class ExpectResult:
    """One scenario expectation: its limit, what the run observed, whether it held and why."""

    name: str
    limit: object
    observed: object
    held: bool
    detail: str

    @classmethod
    def reachability(
        cls, mismatches: int, looked: int, what: str, *, unsettled: int = 0
    ) -> ExpectResult:
        """The oracle's verdict: held when it found no mismatch in ``looked`` ``what``
        (settles, checks) and nothing stayed unsettled."""
        return cls(
            "reachability",
            True,
            mismatches,
            mismatches == 0 and not unsettled,
            f"{mismatches} oracle mismatches in {looked} {what}"
            + (f", {unsettled} not settled" if unsettled else ""),
        )

    @classmethod
    def plans_per_event(
        cls, most: int, limit: int, *, per: str = "event", where: str = ""
    ) -> ExpectResult:
        """``max_plans_per_host_per_event``: held when no host got more than ``limit`` new
        plans for one event (``per``); ``where``: the host and event of the worst, if known."""
        return cls(
            "max_plans_per_host_per_event",
            limit,
            most,
            most <= limit,
            f"at most {most} plan(s) per host per {per}"
            + (f" ({where})" if where else "")
            + f", limit {limit}",
        )

    @classmethod
    def fast_path(cls, covered: int, wanted: int, *, missed: str = "") -> ExpectResult:
        """``fast_path``: held when each of the ``wanted`` ports that went down in use (at
        least one) got its agent's fast path at once (``covered`` did); ``missed``: the first
        that did not, if any."""
        held = wanted > 0 and covered == wanted
        detail = f"{covered} of {wanted} port(s) down in use moved by their agent's fast path"
        if missed:
            detail += f" (not: {missed})"
        elif not wanted:
            detail += " (no port went down in use)"
        return cls("fast_path", True, covered, held, detail)

    @classmethod
    def fast_path_acked(cls, faults: Iterable[_TimedFault]) -> ExpectResult:
        """``fast_path`` over a real run's down transitions: each of one host's ports (a
        ``host``) got a fast-path ack (a ``fast_path_ms``)."""
        ports = [f for f in faults if f.host is not None]
        missed = [f for f in ports if f.fast_path_ms is None]
        where = f"{missed[0].host} at {missed[0].at_s:g} s" if missed else ""
        return cls.fast_path(len(ports) - len(missed), len(ports), missed=where)


@dataclass
class RunReport(PlanCounts):
    """What a replay did and whether the scenario's expectations held. Times in simulated s
    (``at_s``) or ms (``*_ms``). ``solves``, ``reroutes`` and ``plans_per_host`` leave out the
    full build at time 0. ``readmissions``: ports back in use after their hold-down or
    suppression, ``{host, rail, at_s}``; ``returns``: every port usable again after being down,
    held down, suppressed or degraded (readmissions included), same keys. ``fast_paths``: the
    agents' fast paths, ``{host, port, rail, at_s}``. ``skipped``: what was not modelled (events,
    a job), one note each. ``passed``: no oracle mismatch and every expectation held.
    :meth:`to_dict` is JSON-able."""

    scenario: str
    path: str
    duration_s: float
    debounce_ms: float
    #: the service's RFC 8405 solve back-off: initial, short (``debounce_ms``), long delay (ms)
    solve_delays_ms: list[float] = field(default_factory=list)
    events: int = 0
    skipped: list[str] = field(default_factory=list)
    solves: int = 0
    reroutes: int = 0
    plans_per_host: dict[str, int] = field(default_factory=dict)
    settles: int = 0
    settles_skipped: int = 0
    mismatch_count: int = 0
    mismatches: list[str] = field(default_factory=list)
    faults: list[FaultTiming] = field(default_factory=list)
    readmissions: list[PortReturn] = field(default_factory=list)
    returns: list[PortReturn] = field(default_factory=list)
    max_plans_per_host_per_event: int = 0
    expectations: list[ExpectResult] = field(default_factory=list)
    passed: bool = False
    #: the agents' fast paths, in time order (a port down in use whose plan had a backup)
    fast_paths: list[FastPathTaken] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        """Why the run did not pass, one sentence each (empty when it passed)."""
        out = [f"{e.name}: {e.detail}" for e in self.expectations if not e.held]
        if self.mismatch_count:
            out.insert(
                0, f"oracle: {self.mismatch_count} mismatch(es), first: {self.mismatches[0]}"
            )
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["plans_total"] = self.plans_total
        d["plans_max_per_host"] = self.plans_max_per_host
        d["failures"] = self.failures
        return d

    def text(self) -> str:
        """A short human-readable report (a few lines)."""
        timed = [f.reroute_ms for f in self.faults if f.reroute_ms is not None]
        lines = [
            f"{self.scenario}: {'PASSED' if self.passed else 'FAILED'}",
            f"  {self.events} events in {self.duration_s:g} s simulated, solve back-off "
            f"{'/'.join(f'{d:g}' for d in self.solve_delays_ms)} ms; {self.solves} solves, "
            f"{self.reroutes} reroutes",
            f"  plans: {self.plans_total} new host plans, "
            f"at most {self.plans_max_per_host} per host, "
            f"{self.max_plans_per_host_per_event} per host per event",
            f"  down transitions: {len(self.faults)}, rerouted {len(timed)}"
            + (f" (max {max(timed):g} ms on the simulated clock)" if timed else ""),
        ]
        lines += [
            f"  fast path: {f['host']} {f['port']} (rail {f['rail']}) at {f['at_s']:g} s"
            for f in self.fast_paths[:5]
        ]
        if len(self.fast_paths) > 5:
            lines.append(f"  ... and {len(self.fast_paths) - 5} more fast paths")
        lines += [
            f"  re-admitted {r['host']} rail {r['rail']} at {r['at_s']:g} s"
            for r in self.readmissions
        ]
        skipped = (
            f" ({self.settles_skipped} skipped during outages)" if self.settles_skipped else ""
        )
        lines.append(f"  oracle: {self.settles} settles{skipped}, {self.mismatch_count} mismatches")
        lines += mismatch_lines(self.mismatch_count, self.mismatches)
        for e in self.expectations:
            lines.append(f"  expect {e.name}: {'held' if e.held else 'FAILED'} ({e.detail})")
        if self.skipped:
            lines.append(f"  not modelled, skipped: {len(self.skipped)}")
            lines += [f"    {s}" for s in self.skipped[:5]]
        return "\n".join(lines) + "\n"
