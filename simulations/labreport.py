"""The report of a namespace-lab replay (:mod:`linkguard.simulations.labrun`).

Consumes: what a replay measured. Produces: :class:`LabReport` with per-fault flow gaps
(:class:`FaultResult`, :class:`FlowGap`), the training job's stall per fault
(:class:`JobFault`) and over the run (:class:`JobSummary`), oracle results and expectations,
as text (:meth:`LabReport.text`, engine-report style) or JSON-able dicts
(:meth:`LabReport.to_dict`); :class:`LabPair` puts a job scenario's two halves (with and
without linkguard, one run) side by side.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from linkguard.simulations.engine import ExpectResult, mismatch_lines

__all__ = [
    "FaultResult",
    "FlowGap",
    "JobFault",
    "JobSummary",
    "LabPair",
    "LabReport",
    "stderr_progress",
]


@dataclass(frozen=True)
class FlowGap:
    """One flow at one fault. ``gap_ms``: the longest silence between two datagrams from the
    fault until its repair (or the end); ``lost``: datagrams missing around it;
    ``until_return``: the flow stayed silent until the failed part came back (or never
    resumed: ``resumed`` False)."""

    flow: str
    role: str  # "to" / "from" the faulted port, "control"
    gap_ms: float
    lost: int
    until_return: bool
    resumed: bool


@dataclass(frozen=True)
class JobFault:
    """The training job during one fault's window (from the fault to the next fault, or the
    end of the job). ``stall_ms``: the longest step that overlaps the window minus the
    job's median step (ms; the worst rank); ``longest_step_ms`` that step; ``steps``: steps
    completed in the window (the slowest rank); ``rank_failures``: ranks that failed in it;
    ``resumed``: every rank completed a step after its stall (False: a rank stalled until it
    failed or the job ended); ``note`` when nothing could be measured (the job had failed
    already). Source: :mod:`linkguard.simulations.labjob`."""

    stall_ms: float | None
    longest_step_ms: float | None
    steps: int
    rank_failures: int
    resumed: bool
    note: str = ""

    def text(self) -> str:
        if self.stall_ms is None:
            return f"{self.note or 'not measured'}, {self.steps} steps"
        how = "" if self.resumed else " (did not resume)"
        fails = f", {self.rank_failures} rank(s) FAILED" if self.rank_failures else ""
        return f"stall {self.stall_ms:.0f} ms{how}, {self.steps} steps{fails}"


@dataclass
class JobSummary:
    """The job over the whole run. ``devices``: Gloo devices per rank (one per GPU endpoint);
    ``buckets``: all-reduces DDP makes per step (plus one for the stop flag);
    ``median_step_ms`` / ``p99_step_ms``: steady-state step times before the first fault
    (ms); ``steps``: steps the slowest rank completed; ``start_s``: from starting the ranks
    to every rank's first step (s); ``rail_mb``: per rail, the MB the host that sent least
    on it sent from the warm-up to the stop (the kernel's counters: every rail carries job
    traffic when none is 0)."""

    kind: str
    ranks: int
    devices: int
    layers: int
    buckets: int | None
    timeout_s: float
    median_step_ms: float | None
    p99_step_ms: float | None
    steps: int
    rank_failures: int
    failures: list[str]
    start_s: float | None
    rail_mb: dict[int, float]

    def text(self) -> str:
        med = f"{self.median_step_ms:.1f}" if self.median_step_ms is not None else "?"
        p99 = f"{self.p99_step_ms:.1f}" if self.p99_step_ms is not None else "?"
        rails = ", ".join(f"rail {r} {mb:.1f}" for r, mb in self.rail_mb.items())
        return (
            f"  job {self.kind}: {self.ranks} ranks x {self.devices} Gloo devices, "
            f"{self.buckets if self.buckets is not None else '?'} buckets per step, "
            f"collective timeout {self.timeout_s:g} s; step {med} ms median / {p99} ms p99 "
            f"before the first fault; {self.steps} steps, {self.rank_failures} rank failure(s)"
            + (f"\n    MB sent per rail (least of any host): {rails}" if rails else "")
            + "".join(
                f"\n    note: some host sent no job traffic on rail {r}"
                for r, mb in self.rail_mb.items()
                if mb < 0.1
            )
        )


@dataclass
class FaultResult:
    """One down step (the events of one instant that take something down). ``at_s``: from
    the start of the replay; ``last_ack_ms``: from the step to the last ack of the plans it
    caused (None: no plan followed); ``plans_per_host``: most new plans one host got before
    the next fault step; ``checked``: the oracle ran after it settled (else ``note`` why not).
    ``host``: set when the step takes down ports of that one host only (a host link fault);
    ``fast_path_ms``: from the step to that host's first fast-path ack on the bus (None: none
    came before the next fault step)."""

    at_s: float
    kind: str
    what: str
    entries: list[int]
    flows: list[FlowGap] = field(default_factory=list)
    last_ack_ms: float | None = None
    host: str | None = None
    fast_path_ms: float | None = None
    plans_per_host: int = 0
    checked: bool = False
    mismatches: int = 0
    note: str = ""
    job: JobFault | None = None

    @property
    def gap_p50_ms(self) -> float | None:
        gaps = [f.gap_ms for f in self.flows]
        return statistics.median(gaps) if gaps else None

    @property
    def gap_max_ms(self) -> float | None:
        return max((f.gap_ms for f in self.flows), default=None)

    @property
    def lost(self) -> int:
        return sum(max(f.lost, 0) for f in self.flows)


@dataclass
class LabReport:
    """What a lab replay measured and whether it passed (see the module docstring). Times:
    ``*_s`` seconds from the start of the replay, ``*_ms`` milliseconds. ``passed``: with
    linkguard, no oracle mismatch, every expectation held and every process exited
    cleanly; without it, the run completed (mismatches and expectations are reported as the
    expected breakage). :meth:`to_dict` is JSON-able."""

    scenario: str
    path: str
    linkguard: bool
    hosts: int
    rails: int
    sus: int
    duration_s: float
    debounce_ms: float | None
    flows: int = 0
    interval_ms: float = 2.0
    steps: int = 0
    faults: list[FaultResult] = field(default_factory=list)
    checks: int = 0
    probes: int = 0
    mismatch_count: int = 0
    mismatches: list[str] = field(default_factory=list)
    expectations: list[ExpectResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    job: JobSummary | None = None
    agent_settings: dict[str, object] = field(default_factory=dict)
    workdir: str | None = None
    #: the lab's network namespaces are ``<netns_prefix>h0``, ..., ``<netns_prefix>fab``
    netns_prefix: str | None = None
    wall_s: float = 0.0
    passed: bool = False
    #: with --discover: what was discovered (hosts, rails, leaves, unknowns, differences from
    #: the lab's fabric); None on the generated fabric
    discovered: dict[str, Any] | None = None

    @property
    def failures(self) -> list[str]:
        """Why the run did not pass, one sentence each (empty when it passed)."""
        if not self.linkguard:
            return []
        out = [f"{e.name}: {e.detail}" for e in self.expectations if not e.held]
        if self.mismatch_count:
            out.insert(
                0, f"oracle: {self.mismatch_count} mismatch(es), first: {self.mismatches[0]}"
            )
        bad = {n: c for n, c in self.exit_codes.items() if c != 0}
        if bad:
            out.append(f"unclean exits: {bad}")
        if self.discovered and self.discovered["differences"]:
            first = self.discovered["differences"][0]
            out.append(f"discovered fabric is not the lab's: {first}")
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        for f, fd in zip(self.faults, d["faults"], strict=True):
            fd.update(gap_p50_ms=f.gap_p50_ms, gap_max_ms=f.gap_max_ms, lost=f.lost)
        d["failures"] = self.failures
        return d

    def text(self) -> str:
        """A short human-readable report."""
        mode = "with linkguard" if self.linkguard else "WITHOUT linkguard (static routes)"
        verdict = "PASSED" if self.passed else "FAILED"
        if not self.linkguard:
            verdict = "baseline run completed"
        procs = f"{self.hosts} agents, service, " if self.linkguard else ""
        lines = [
            f"{self.scenario} on the lab, {mode}: {verdict}",
            f"  {self.hosts} hosts x {self.rails} rails ({self.sus} SU), {procs}mosquitto; "
            f"{self.flows} UDP flows, one datagram per {self.interval_ms:g} ms; {self.steps} "
            f"steps in {self.duration_s:g} s"
            + (f", debounce {self.debounce_ms:g} ms" if self.debounce_ms is not None else ""),
        ]
        if self.discovered is not None:
            d = self.discovered
            same = "the lab's fabric" if not d["differences"] else "NOT the lab's fabric"
            lines.append(
                f"  fabric discovered from lldpd and the agents: {d['hosts']} hosts, "
                f"{d['rails']} rails, {d['leaves']} leaves, {len(d['unknowns'])} unknowns: {same}"
            )
        if self.agent_settings:
            sets = ", ".join(f"{k}={v}" for k, v in self.agent_settings.items())
            lines.append(f"  agent settings added: {sets}")
        for f in self.faults:
            said = []
            if f.flows:
                said.append(
                    f"gap p50 {f.gap_p50_ms:.1f} / max {f.gap_max_ms:.1f} ms, lost {f.lost}"
                )
            if self.linkguard and f.fast_path_ms is not None:
                said.append(f"fast path {f.fast_path_ms:.0f} ms")
            if self.linkguard:
                said.append(
                    f"last ack {f.last_ack_ms:.0f} ms"
                    if f.last_ack_ms is not None
                    else "no new plan"
                )
            head = f"  {f.at_s:7.3f} s  {f.what}: {'; '.join(said) or 'no flow measured'}"
            lines.append(head)
            if f.job is not None:
                lines.append(f"      job     {f.job.text()}")
            for g in f.flows:
                if g.until_return and not self.linkguard:
                    how = (
                        f"broken for {g.gap_ms:.0f} ms, until the link returned"
                        if g.resumed
                        else f"broken for {g.gap_ms:.0f} ms, never resumed"
                    )
                elif not g.resumed:
                    how = f"broken for {g.gap_ms:.0f} ms, never resumed"
                else:
                    how = f"gap {g.gap_ms:.1f} ms"
                lines.append(f"      {g.role:7} {g.flow}  {how}, {g.lost} lost")
            if f.note:
                lines.append(f"      ({f.note})")
        if self.job is not None:
            lines.append(self.job.text())
            lines += [f"    failed: {x}" for x in self.job.failures]
        what = (
            "mismatches" if self.linkguard else "mismatches (expected breakage without linkguard)"
        )
        lines.append(
            f"  oracle: {self.checks} checks, {self.probes} kernel probes, "
            f"{self.mismatch_count} {what}"
        )
        lines += mismatch_lines(self.mismatch_count, self.mismatches)
        for e in self.expectations:
            state = "held" if e.held else ("FAILED" if self.linkguard else "not met")
            lines.append(f"  expect {e.name}: {state} ({e.detail})")
        lines += [f"  note: {n}" for n in self.notes]
        bad = {n: c for n, c in self.exit_codes.items() if c != 0}
        if bad:
            lines.append(f"  unclean exits: {bad}")
        if self.workdir:
            lines.append(f"  logs and flow records kept in {self.workdir}")
        return "\n".join(lines) + "\n"


@dataclass
class LabPair:
    """A job scenario's two halves from one ``sim lab`` run: ``with_linkguard`` (agents and
    service) and ``without_linkguard`` (static routes, the ``--no-linkguard`` baseline), the
    same scenario and job on a fresh lab each; either may be None when it was not run.
    ``passed``: the with-linkguard half passed (the baseline's breakage is the finding)."""

    with_linkguard: LabReport | None
    without_linkguard: LabReport | None

    @property
    def passed(self) -> bool:
        if self.with_linkguard is None:
            return self.without_linkguard is not None and self.without_linkguard.passed
        return self.with_linkguard.passed

    def to_dict(self) -> dict[str, object]:
        return {
            "with_linkguard": self.with_linkguard.to_dict() if self.with_linkguard else None,
            "without_linkguard": (
                self.without_linkguard.to_dict() if self.without_linkguard else None
            ),
            "passed": self.passed,
        }

    def text(self) -> str:
        halves = [r for r in (self.with_linkguard, self.without_linkguard) if r is not None]
        out = "".join(r.text() for r in halves)
        w, wo = self.with_linkguard, self.without_linkguard
        if w is None or wo is None or w.job is None or wo.job is None:
            return out
        lines = [
            f"{w.scenario}: the job with and without linkguard (stall = longest step beyond "
            "the median step; steps and rank failures in the fault's window)"
        ]
        for a, b in zip(w.faults, wo.faults, strict=False):
            lines.append(f"  {a.at_s:7.3f} s  {a.what}")
            lines.append(f"      with linkguard     {a.job.text() if a.job else '-'}")
            lines.append(f"      without            {b.job.text() if b.job else '-'}")
        ma, mb = w.job.median_step_ms, wo.job.median_step_ms
        ratio = f" (ratio {ma / mb:.2f})" if ma and mb else ""
        lines.append(
            f"  steady-state step: {ma} ms with linkguard, {mb} ms without{ratio}; rank "
            f"failures: {w.job.rank_failures} with, {wo.job.rank_failures} without"
        )
        verdict = "PASSED" if self.passed else "FAILED"
        lines.append(f"  {w.scenario}: {verdict} (judged on the with-linkguard half)")
        return out + "\n".join(lines) + "\n"


def stderr_progress(t0: float | None = None) -> Callable[[str], None]:
    """A progress callback that prints ``[lab  12.3 s] message`` lines on stderr."""
    start = time.monotonic() if t0 is None else t0

    def say(msg: str) -> None:
        print(f"[lab {time.monotonic() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    return say
