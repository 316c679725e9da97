"""The report of a namespace-lab replay (:mod:`linkguard.simulations.labrun`).

Consumes: what a replay measured. Produces: :class:`LabReport` with per-fault flow gaps
(:class:`FaultResult`, :class:`FlowGap`), oracle results and expectations, as text
(:meth:`LabReport.text`, engine-report style) or JSON-able dicts (:meth:`LabReport.to_dict`).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from linkguard.simulations.engine import ExpectResult, mismatch_lines

__all__ = ["FaultResult", "FlowGap", "LabReport", "stderr_progress"]


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


@dataclass
class FaultResult:
    """One down step (the events of one instant that take something down). ``at_s``: from
    the start of the replay; ``last_ack_ms``: from the step to the last ack of the plans it
    caused (None: no plan followed); ``plans_per_host``: most new plans one host got before
    the next fault step; ``checked``: the oracle ran after it settled (else ``note`` why not)."""

    at_s: float
    kind: str
    what: str
    entries: list[int]
    flows: list[FlowGap] = field(default_factory=list)
    last_ack_ms: float | None = None
    plans_per_host: int = 0
    checked: bool = False
    mismatches: int = 0
    note: str = ""

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
    workdir: str | None = None
    wall_s: float = 0.0
    passed: bool = False

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
        for f in self.faults:
            said = []
            if f.flows:
                said.append(
                    f"gap p50 {f.gap_p50_ms:.1f} / max {f.gap_max_ms:.1f} ms, lost {f.lost}"
                )
            if self.linkguard:
                said.append(
                    f"last ack {f.last_ack_ms:.0f} ms"
                    if f.last_ack_ms is not None
                    else "no new plan"
                )
            head = f"  {f.at_s:7.3f} s  {f.what}: {'; '.join(said) or 'no flow measured'}"
            lines.append(head)
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


def stderr_progress(t0: float | None = None) -> Callable[[str], None]:
    """A progress callback that prints ``[lab  12.3 s] message`` lines on stderr."""
    start = time.monotonic() if t0 is None else t0

    def say(msg: str) -> None:
        print(f"[lab {time.monotonic() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    return say
