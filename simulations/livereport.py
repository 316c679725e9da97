"""The report of a real-time replay (:mod:`linkguard.simulations.live`): what it did and whether
the scenario's expectations held.

Consumes: what the replay measured (:class:`LiveFault` per down transition, :class:`Recovery`
per end of an outage, the oracle's mismatches, plan counts). Produces: a :class:`LiveReport`,
JSON-able (:meth:`LiveReport.to_dict`) or a few lines for people (:meth:`LiveReport.text`), and
its expectations (:func:`live_expectations`). Times in ms from the transition, ``at_s`` in s
from time 0 (the fleet at rest).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from linkguard.simulations.engine import (
    ExpectResult,
    PlanCounts,
    PortReturn,
    mismatch_lines,
    percentile,
)
from linkguard.simulations.scenario import Expect

__all__ = ["LiveFault", "LiveReport", "Recovery", "live_expectations"]


def _figures(values: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values, default=None),
    }


@dataclass(frozen=True)
class LiveFault:
    """One down transition (port, switch or cable) of one timeline entry. Times in ms from
    the transition. ``fast_path_ms``: the host's agent acked its backup (None: no port fault,
    no backup, or none seen). ``epoch``: the plan epoch it caused (None: the truth did not
    change, e.g. a port already held down or a spine whose leaves keep other uplinks, or no
    plan came); ``plans``: hosts given a new plan by that solve (hosts with compact plans
    through the peer routes of ``epoch``, the others a plan of ``epoch`` + 1, see
    :mod:`linkguard.topology.state`), ``acked``: how many of them acked it applied;
    ``first_ack_ms``/``last_ack_ms``: their first and last ack as the service received them
    over the bus (``last_ack_ms`` None unless all acked)."""

    entry: int
    kind: str
    at_s: float
    host: str | None
    rerouted: bool
    fast_path_ms: float | None
    epoch: int | None
    plans: int
    acked: int
    first_ack_ms: float | None
    last_ack_ms: float | None


@dataclass(frozen=True)
class Recovery:
    """The end of an outage (``broker_up``, ``service_up``, ``agent_up``): ms until the
    fleet settled again (None: not within the timeout)."""

    entry: int
    kind: str
    at_s: float
    host: str | None
    settled_ms: float | None


@dataclass
class LiveReport(PlanCounts):
    """What a live replay did and whether the scenario's expectations held; the fields of
    :class:`~linkguard.simulations.engine.RunReport` where they mean the same, plus the bus,
    the wall time, fault latencies and recoveries. Times: ``at_s`` from time 0 (first plans
    acked), ``*_ms`` from the transition. ``solves``/``plans_per_host`` leave out the first
    build; ``plans_per_host`` counts distinct epochs seen on the bus. ``unsettled``: settles
    that timed out (one sentence each). ``passed``: every settle came, no oracle mismatch,
    every expectation held. :meth:`to_dict` is JSON-able."""

    scenario: str
    path: str
    bus: str
    duration_s: float
    debounce_ms: float
    #: the service's RFC 8405 solve back-off: initial, short (``debounce_ms``), long delay (ms)
    solve_delays_ms: list[float] = field(default_factory=list)
    ended_s: float = 0.0
    startup_s: float = 0.0
    events: int = 0
    solves: int = 0
    plans_per_host: dict[str, int] = field(default_factory=dict)
    settles: int = 0
    unsettled: list[str] = field(default_factory=list)
    mismatch_count: int = 0
    mismatches: list[str] = field(default_factory=list)
    faults: list[LiveFault] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    readmissions: list[PortReturn] = field(default_factory=list)
    max_plans_per_host_per_event: int = 0
    expectations: list[ExpectResult] = field(default_factory=list)
    passed: bool = False

    def latency(self) -> dict[str, dict[str, float | int | None]]:
        """n, p50, p99 and max (ms) of the faults' fast path, first ack and last ack."""
        return {
            name: _figures([v for f in self.faults if (v := getattr(f, name)) is not None])
            for name in ("fast_path_ms", "first_ack_ms", "last_ack_ms")
        }

    @property
    def failures(self) -> list[str]:
        """Why the run did not pass, one sentence each (empty when it passed)."""
        out = [f"settle: {u}" for u in self.unsettled]
        if self.mismatch_count:
            out.append(f"oracle: {self.mismatch_count} mismatch(es), first: {self.mismatches[0]}")
        out += [f"{e.name}: {e.detail}" for e in self.expectations if not e.held]
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["plans_total"] = self.plans_total
        d["plans_max_per_host"] = self.plans_max_per_host
        d["latency"] = self.latency()
        d["failures"] = self.failures
        return d

    def text(self) -> str:
        """A short human-readable report (a few lines)."""

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        rerouted = [f for f in self.faults if f.rerouted]
        lines = [
            f"{self.scenario} ({self.bus} bus): {'PASSED' if self.passed else 'FAILED'}",
            f"  {self.events} events, ran {self.ended_s:.1f} s of {self.duration_s:g} s (real "
            f"time, fleet at rest after {self.startup_s:.1f} s), solve back-off "
            f"{'/'.join(f'{d:g}' for d in self.solve_delays_ms) or self.debounce_ms} ms; "
            f"{self.solves} solves",
            f"  plans: {self.plans_total} new host plans, "
            f"at most {self.plans_max_per_host} per host, "
            f"{self.max_plans_per_host_per_event} per host per event",
            f"  down transitions: {len(self.faults)}, rerouted {len(rerouted)}",
        ]
        for f in self.faults:
            what = [
                f"    {f.at_s:7.3f} s timeline[{f.entry}] {f.kind}"
                + (f" {f.host}" if f.host else "")
            ]
            if f.fast_path_ms is not None:
                what.append(f"fast path {ms(f.fast_path_ms)} ms")
            if f.epoch is not None:
                what.append(
                    f"{f.plans} hosts re-planned (epoch {f.epoch}), "
                    f"acked first {ms(f.first_ack_ms)} / "
                    f"last {ms(f.last_ack_ms)} ms"
                    + ("" if f.acked == f.plans else f" ({f.acked} acked)")
                )
            else:
                what.append("no plan came" if f.rerouted else "no reroute needed")
            lines.append(", ".join(what))
        lat = self.latency()
        if lat["last_ack_ms"]["n"]:
            parts = [
                f"{name.removesuffix('_ms').replace('_', ' ')} p50 {ms(v['p50'])} p99 "
                f"{ms(v['p99'])} max {ms(v['max'])}"
                for name, v in lat.items()
                if v["n"]
            ]
            lines.append("  ms from the fault: " + "; ".join(parts))
        for r in self.recoveries:
            who = f" {r.host}" if r.host else ""
            lines.append(
                f"  {r.kind}{who} at {r.at_s:g} s: settled again after {ms(r.settled_ms)} ms"
            )
        lines += [
            f"  re-admitted {r['host']} rail {r['rail']} at {r['at_s']:.2f} s"
            for r in self.readmissions
        ]
        lines.append(
            f"  oracle (installed routes): {self.settles} settles, {self.mismatch_count} mismatches"
        )
        lines += mismatch_lines(self.mismatch_count, self.mismatches)
        lines += [f"  NOT SETTLED: {u}" for u in self.unsettled[:5]]
        for e in self.expectations:
            lines.append(f"  expect {e.name}: {'held' if e.held else 'FAILED'} ({e.detail})")
        return "\n".join(lines) + "\n"


def live_expectations(ex: Expect, r: LiveReport) -> list[ExpectResult]:
    """Which of the scenario's expectations ``ex`` held in report ``r`` (its faults, settles
    and mismatches filled in): ``reachability`` (no oracle mismatch, every settle came),
    ``max_reroute_ms`` (every rerouting fault's last ack within it, ms),
    ``max_plans_per_host_per_event``."""
    out = []
    if ex.reachability:
        out.append(
            ExpectResult.reachability(
                r.mismatch_count, r.settles, "settles", unsettled=len(r.unsettled)
            )
        )
    if ex.max_reroute_ms is not None:
        timed = [f for f in r.faults if f.rerouted]
        missing = [f for f in timed if f.last_ack_ms is None]
        worst = max(timed, key=lambda f: f.last_ack_ms or 0.0, default=None)
        observed = None if missing else (worst.last_ack_ms if worst else 0.0)
        held = not missing and (observed or 0.0) <= ex.max_reroute_ms
        if missing:
            detail = f"{len(missing)} rerouting fault(s) without every ack"
        elif worst:
            detail = (
                f"slowest down -> last ack {observed:g} ms (timeline[{worst.entry}] at "
                f"{worst.at_s:g} s)"
            )
        else:
            detail = "no reroute"
        out.append(
            ExpectResult(
                "max_reroute_ms",
                ex.max_reroute_ms,
                observed,
                held,
                detail + f", limit {ex.max_reroute_ms:g} ms",
            )
        )
    if (limit := ex.max_plans_per_host_per_event) is not None:
        out.append(ExpectResult.plans_per_event(r.max_plans_per_host_per_event, limit))
    if ex.fast_path:  # each down transition of one host's ports: a fast-path ack
        out.append(ExpectResult.fast_path_acked(r.faults))
    return out
