"""The lab's training job: start one rank per host, follow its steps, measure stalls per fault.

Consumes: a built :class:`~linkguard.simulations.lab.Lab` with its management network, the
scenario's :class:`~linkguard.simulations.jobspec.JobSpec`, and the fault windows of a replay
(monotonic seconds). Produces: the rank processes (:mod:`linkguard.simulations.jobtrain`, started
by path in each host's namespace, the only code that imports torch), their step records
(:class:`RankLog`), and per fault a :class:`~linkguard.simulations.labreport.JobFault`, per run
a :class:`~linkguard.simulations.labreport.JobSummary`.

Where the numbers come from: every rank writes one line per step with the CLOCK_MONOTONIC time
the step ended (after its last all-reduce); a step's time is the difference between two ends.
The *median step* is the median over the steps that ended before the first fault (the first
:data:`WARMUP_SKIP` steps left out: DDP builds its buckets there); a fault's *stall* is the
longest step the fault owns (the steps it hit, and those that started after it and before the
next fault; a step hit by several faults counts for the first) minus the median step, in ms
(:func:`stalls`), the worst over the ranks. A rank that never completes another step stalls
until it fails or the job stops. The rendezvous store runs at rank 0's management address (on
no rail), so a fault never cuts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linkguard.simulations.engine import ExpectResult
from linkguard.simulations.jobspec import JobSpec
from linkguard.simulations.lab import Lab
from linkguard.simulations.labprocs import LabProcessError
from linkguard.simulations.labreport import FaultResult, JobFault, JobSummary, LabReport
from linkguard.simulations.scenario import Expect

__all__ = [
    "JOBTRAIN",
    "TORCH_PIN",
    "LabJob",
    "LabJobError",
    "RankLog",
    "Stall",
    "job_expectations",
    "median_step_ms",
    "stalls",
    "steps_between",
    "torch_problem",
]

#: The rank script (:mod:`linkguard.simulations.jobtrain`), started by path.
JOBTRAIN = Path(__file__).with_name("jobtrain.py")
#: The torch release the lab's job is checked with (CPU build; pyproject's ``lab`` extra).
TORCH_PIN = "torch==2.13.0"
#: The rendezvous store's TCP port, at rank 0's management address.
STORE_PORT = 29500
#: Steps left out of the median step (DDP builds and rebuilds its buckets in the first ones).
WARMUP_SKIP = 3
#: How long the ranks get to import torch, meet and finish their warm-up steps (s).
READY_TIMEOUT_S = 120.0
#: After the stop file appears, the ranks get their collective timeout plus this to exit (s).
STOP_GRACE_S = 10.0


class LabJobError(LabProcessError):
    """The job could not start (no torch, a rank died before its warm-up, a timed-out start);
    the message has the ranks' last log lines."""


def torch_problem() -> str | None:
    """None when this Python can import torch (looked up, not imported); else what to do."""
    if importlib.util.find_spec("torch") is None:
        return (
            f"this scenario's job needs PyTorch in {sys.executable}: "
            f"pip install {TORCH_PIN} --index-url https://download.pytorch.org/whl/cpu "
            "(PyTorch's CPU build; from PyPI this pin is the multi-GB CUDA build on x86_64 "
            "Linux, unless a local wheel of the CPU build is on pip's path)"
        )
    return None


# --------------------------------------------------------------------------------------------
# Measuring (pure: step end times in, numbers out)


def median_step_ms(ends: Sequence[float], before: float | None) -> float | None:
    """Median step time (ms) of the steps that ended before ``before`` (monotonic s; None: all),
    the first :data:`WARMUP_SKIP` left out; all steps after the warm-up when fewer than 3
    ended before it; None with fewer than two steps after the warm-up."""
    pairs = list(itertools.pairwise(ends[WARMUP_SKIP:]))
    durs = [(b - a) * 1000 for a, b in pairs]
    early = [(b - a) * 1000 for a, b in pairs if before is None or b < before]
    use = early if len(early) >= 3 else durs
    return statistics.median(use) if use else None


@dataclass(frozen=True)
class Stall:
    """The worst step one fault caused on one rank: ``stall_ms`` = ``longest_ms`` minus the
    median step (never below 0); ``resumed`` False when that step never ended (the rank
    failed, or hung until the job stopped)."""

    stall_ms: float
    longest_ms: float
    resumed: bool


def stalls(
    ends: Sequence[float], faults: Sequence[float], t_end: float | None, median_ms: float
) -> list[Stall | None]:
    """Per fault (monotonic times, ascending), the longest step of one rank that the fault
    owns, as a :class:`Stall`; None for a fault that owns no step.

    A step runs from the previous step's end to its own (``ends``, monotonic s, ascending).
    A fault owns the steps it hit (it happened while the step ran: start < fault <= end)
    unless an earlier fault hit them first, and the steps that started after it and before
    the next fault. So a step stalled across several flaps counts once, for the first, and
    a fault that came during an earlier fault's stall owns no step. ``t_end``: when the rank
    failed or was stopped without finishing its step (its last step then runs until
    ``t_end`` and did not resume); None when it stopped cleanly after its last step."""
    spans = [(a, b, True) for a, b in itertools.pairwise(ends)]
    if t_end is not None and ends and t_end > ends[-1]:
        spans.append((ends[-1], t_end, False))
    best: list[tuple[float, bool] | None] = [None] * len(faults)
    for a, b, resumed in spans:
        hit = next((k for k, t in enumerate(faults) if a < t <= b), None)
        if hit is None:  # the aftermath of the last fault before it, if any
            hit = max((k for k, t in enumerate(faults) if t <= a), default=None)
        if hit is None:
            continue
        cur = best[hit]
        if cur is None or b - a > cur[0]:
            best[hit] = (b - a, resumed)
    return [
        None
        if x is None
        else Stall(round(max(0.0, x[0] * 1000 - median_ms), 1), round(x[0] * 1000, 1), x[1])
        for x in best
    ]


def steps_between(ends: Sequence[float], t_from: float, t_to: float) -> int:
    """Steps that ended in [``t_from``, ``t_to``)."""
    return sum(1 for e in ends if t_from <= e < t_to)


# --------------------------------------------------------------------------------------------
# One rank's record


@dataclass
class RankLog:
    """What one rank wrote (:mod:`~linkguard.simulations.jobtrain`'s lines): ``ends`` the
    monotonic end time of each step (s), ``error`` (time, steps, message) when a collective
    failed, ``exit_code`` once the process ended (None: running)."""

    rank: int
    host: str
    out: Path
    ready_at: float | None = None
    buckets: int | None = None
    ends: list[float] = field(default_factory=list)
    done_at: float | None = None
    error: tuple[float, int, str] | None = None
    exit_code: int | None = None
    _offset: int = 0

    def read(self) -> None:
        """Parse what the rank wrote since the last read."""
        try:
            with self.out.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for raw in chunk[:end].decode(errors="replace").splitlines():
            parts = raw.split()
            if not parts:
                continue
            try:
                if parts[0] == "step":
                    self.ends.append(float(parts[2]))
                elif parts[0] == "ready":
                    self.ready_at = float(parts[1])
                elif parts[0] == "buckets":
                    self.buckets = int(parts[1])
                elif parts[0] == "done":
                    self.done_at = float(parts[1])
                elif parts[0] == "error":
                    self.error = (float(parts[1]), int(parts[2]), " ".join(parts[3:]))
            except (IndexError, ValueError):
                continue  # a torn line: the rank was killed mid-write

    @property
    def failed(self) -> bool:
        return self.error is not None or (self.exit_code not in (None, 0))

    def failed_at(self, t_stop: float) -> float | None:
        """When the rank failed (its error line, else the job's stop time), None if it did
        not."""
        if self.error is not None:
            return self.error[0]
        return t_stop if self.failed else None


# --------------------------------------------------------------------------------------------
# The job


class LabJob:
    """The ranks of one job on ``lab`` (one per host of ``hosts``, rank = index), their
    records and logs in ``workdir`` (``job-rank<r>.txt`` / ``.log``); the store on rank 0's
    management address, TCP ``store_port`` (another port for a job started again on the same
    lab: the old one may linger in TIME_WAIT)."""

    def __init__(
        self,
        lab: Lab,
        workdir: Path,
        spec: JobSpec,
        hosts: list[str],
        *,
        seed: int = 0,
        store_port: int = STORE_PORT,
    ) -> None:
        self.lab = lab
        self.store_port = store_port
        self.workdir = workdir
        self.spec = spec
        self.hosts = hosts
        self.seed = seed
        self.stop_file = workdir / "job-stop"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ranks = [RankLog(r, h, workdir / f"job-rank{r}.txt") for r, h in enumerate(hosts)]
        self.started_at = 0.0
        self.stopped_at: float | None = None
        self._bytes0: dict[str, dict[int, int]] = {}
        self._bytes1: dict[str, dict[int, int]] = {}

    def argv(self, rank: int) -> list[str]:
        """The command line of ``rank`` (run inside its host's namespace)."""
        s, host = self.spec, self.lab.host(self.hosts[rank])
        store = self.lab.management_address(self.hosts[0])
        return [
            sys.executable, str(JOBTRAIN),
            "--rank", str(rank), "--world", str(len(self.hosts)),
            "--store", f"{store}:{self.store_port}",
            "--devices", ",".join(str(e) for e in host.endpoints),
            "--out", str(self.ranks[rank].out),
            "--compute-ms", f"{s.compute_ms:g}", "--width", str(s.width),
            "--layers", str(s.layers), "--batch", str(s.batch),
            "--timeout-s", f"{s.timeout_s:g}", "--stop-file", str(self.stop_file),
            "--seed", str(self.seed),
        ]  # fmt: skip

    def start(self) -> None:
        """Start every rank (rank 0 first: it serves the store)."""
        problem = torch_problem()
        if problem:
            raise LabJobError(problem)
        self.stop_file.unlink(missing_ok=True)
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10d warns that lab hosts have no hostname
        }
        self.started_at = time.monotonic()
        for rank in range(len(self.hosts)):
            self.ranks[rank].out.write_bytes(b"")
            with open(self.workdir / f"job-rank{rank}.log", "ab") as log:
                self.procs.append(
                    self.lab.exec(
                        self.hosts[rank],
                        self.argv(rank),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )

    def poll(self) -> list[RankLog]:
        """Read every rank's new lines and exit codes; the ranks."""
        for r, p in zip(self.ranks, self.procs, strict=True):
            r.read()
            if r.exit_code is None:
                r.exit_code = p.poll()
                if r.exit_code is not None:
                    r.read()
        return self.ranks

    def tails(self, lines: int = 15) -> str:
        out = []
        for r in range(len(self.ranks)):
            path = self.workdir / f"job-rank{r}.log"
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            rec = self.ranks[r].out
            text += rec.read_text(errors="replace").splitlines()[-3:] if rec.exists() else []
            out.append(f"--- job rank {r} ({self.hosts[r]})\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    async def wait_warm(self, check: Callable[[], None] = lambda: None) -> None:
        """Until every rank completed ``warmup_steps`` steps; :class:`LabJobError` when a rank
        exits first or :data:`READY_TIMEOUT_S` passes. ``check`` runs between polls (the lab's
        own process check). Counts each rank's bytes per rail from here on."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            ranks = self.poll()
            dead = [r for r in ranks if r.exit_code is not None]
            if dead:
                r = dead[0]
                raise LabJobError(
                    f"job rank {r.rank} ({r.host}) exited with {r.exit_code} before its "
                    f"{self.spec.warmup_steps} warm-up steps\n{self.tails()}"
                )
            if all(len(r.ends) >= self.spec.warmup_steps for r in ranks):
                break
            if time.monotonic() > deadline:
                raise LabJobError(
                    f"timed out after {READY_TIMEOUT_S:g} s waiting for the job's "
                    f"{self.spec.warmup_steps} warm-up steps\n{self.tails()}"
                )
            check()
            await asyncio.sleep(0.05)
        self._bytes0 = await asyncio.to_thread(self._rail_bytes)

    async def stop(self) -> None:
        """Ask the ranks to stop after their next step (the stop file: all stop after the
        same step), wait up to the collective timeout plus :data:`STOP_GRACE_S`, then kill
        the stragglers (they count as failed)."""
        self.stopped_at = time.monotonic()
        self._bytes1 = await asyncio.to_thread(self._rail_bytes)
        self.stop_file.touch()
        deadline = self.stopped_at + self.spec.timeout_s + STOP_GRACE_S
        while time.monotonic() < deadline:
            if all(r.exit_code is not None for r in self.poll()):
                return
            await asyncio.sleep(0.05)
        self.kill()
        for r, p in zip(self.ranks, self.procs, strict=True):
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
            if r.exit_code is None:
                r.exit_code = p.returncode if p.returncode is not None else -9
        self.poll()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()

    def _rail_bytes(self) -> dict[str, dict[int, int]]:
        """host -> rail -> bytes sent on its rail netdev so far (the kernel's counters)."""
        out: dict[str, dict[int, int]] = {}
        for h in self.hosts:
            lh = self.lab.host(h)
            proc = subprocess.run(
                ["ip", "-n", lh.netns, "-s", "-j", "link", "show"],
                capture_output=True,
                text=True,
                check=False,
            )
            links = {x["ifname"]: x for x in json.loads(proc.stdout or "[]")}
            out[h] = {
                lr.rail: int(links[lr.netdev]["stats64"]["tx"]["bytes"])
                for lr in lh.rails
                if lr.netdev in links
            }
        return out

    # -- results ---------------------------------------------------------------------------
    def _t_end(self, r: RankLog) -> float:
        if r.error is not None:
            return r.error[0]
        if r.done_at is not None:
            return r.done_at
        return self.stopped_at or time.monotonic()

    def median_ms(self, first_fault: float | None) -> float | None:
        """The job's median step (ms): the median over the ranks' medians."""
        meds = [m for r in self.ranks if (m := median_step_ms(r.ends, first_fault)) is not None]
        return statistics.median(meds) if meds else None

    def faults(self, times: Sequence[float], median_ms: float | None) -> list[JobFault]:
        """The job at each fault (monotonic times, ascending; a fault's window runs to the
        next fault, the last one's to the job's stop): the worst rank's :func:`stalls`, the
        slowest rank's steps in the window, the ranks that failed in it."""
        if not times:
            return []
        stop = self.stopped_at or time.monotonic()
        bounds = [*times[1:], max(stop, times[-1]) + 1e-6]
        per_rank = [
            stalls(r.ends, times, None if r.exit_code == 0 else self._t_end(r), median_ms or 0.0)
            for r in self.ranks
        ]
        failed = [t for r in self.ranks if (t := r.failed_at(stop)) is not None]
        out = []
        for k, (t_from, t_to) in enumerate(zip(times, bounds, strict=True)):
            failed_here = sum(1 for t in failed if t_from <= t < t_to)
            gone = any(t < t_from for t in failed)
            steps = min(steps_between(r.ends, t_from, t_to) for r in self.ranks)
            mine = [x for rank in per_rank if (x := rank[k]) is not None]
            if gone:
                out.append(JobFault(None, None, steps, failed_here, False, "the job had failed"))
            elif median_ms is None:
                out.append(JobFault(None, None, steps, failed_here, True, "no steady state"))
            elif mine:
                worst = max(mine, key=lambda x: x.longest_ms)
                resumed = all(x.resumed for x in mine)
                out.append(JobFault(worst.stall_ms, worst.longest_ms, steps, failed_here, resumed))
            else:
                note = "no step of its own (it came during an earlier fault's stall)"
                out.append(JobFault(None, None, steps, failed_here, True, note))
        return out

    def measure(self, faults: list[tuple[FaultResult, float]], t0: float) -> JobSummary:
        """Set each fault's ``job`` (its window: from its time to the next fault's, the last
        one's to the job's stop) from the faults in order with their monotonic times, and
        return the run's summary; ``t0`` is the replay's time 0."""
        times = [t for _, t in faults]
        first = times[0] if times else None
        for (result, _), jf in zip(faults, self.faults(times, self.median_ms(first)), strict=True):
            result.job = jf
        return self.summary(first, t0)

    def summary(self, first_fault: float | None, t0: float) -> JobSummary:
        """The whole run: ``t0`` is the replay's time 0 (failure times are reported from it)."""
        stop = self.stopped_at or time.monotonic()
        ranks = self.ranks
        durs = sorted(
            (b - a) * 1000
            for r in ranks
            for a, b in itertools.pairwise(r.ends[WARMUP_SKIP:])
            if first_fault is None or b < first_fault
        )
        failures = []
        for r in ranks:
            t = r.failed_at(stop)
            if t is None:
                continue
            why = r.error[2] if r.error else f"exit code {r.exit_code} (did not stop)"
            failures.append(f"rank {r.rank} ({r.host}) at {t - t0:.1f} s: {why}"[:300])
        ready = [r.ends[0] for r in ranks if r.ends]
        rail_mb: dict[int, float] = {}
        for h, rails in self._bytes1.items():
            for rail, b in rails.items():
                mb = (b - self._bytes0.get(h, {}).get(rail, b)) / 1e6
                rail_mb[rail] = round(min(rail_mb.get(rail, mb), mb), 2)
        return JobSummary(
            kind=self.spec.kind,
            ranks=len(ranks),
            devices=len(self.lab.host(self.hosts[0]).endpoints),
            layers=self.spec.layers,
            buckets=max((r.buckets for r in ranks if r.buckets is not None), default=None),
            timeout_s=self.spec.timeout_s,
            median_step_ms=_round(self.median_ms(first_fault)),
            p99_step_ms=_round(durs[min(len(durs) - 1, int(0.99 * len(durs)))] if durs else None),
            steps=min((len(r.ends) for r in ranks), default=0),
            rank_failures=len(failures),
            failures=failures,
            start_s=round(max(ready) - self.started_at, 1) if len(ready) == len(ranks) else None,
            rail_mb=dict(sorted(rail_mb.items())),
        )


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def job_expectations(r: LabReport, ex: Expect) -> list[ExpectResult]:
    """The job's checks of a report with a job: ``job_rank_failures`` (the scenario's limit,
    else 0: with linkguard a rank failure fails the run) and, when set, ``job_max_stall_ms``
    against the worst fault's stall."""
    assert r.job is not None
    limit = ex.job_rank_failures if ex.job_rank_failures is not None else 0
    n = r.job.rank_failures
    first = f"; first: {r.job.failures[0]}" if r.job.failures else ""
    out = [
        ExpectResult(
            "job_rank_failures", limit, n, n <= limit, f"{n} rank(s) failed, limit {limit}{first}"
        )
    ]
    if ex.job_max_stall_ms is not None:
        measured = [(f.job.stall_ms, f) for f in r.faults if f.job and f.job.stall_ms is not None]
        worst = max(measured, key=lambda x: x[0], default=None)
        observed = worst[0] if worst else 0.0
        detail = (
            f"worst job stall {observed:.0f} ms ({worst[1].what} at {worst[1].at_s:g} s)"
            if worst
            else "no job stall measured"
        ) + f", limit {ex.job_max_stall_ms:g} ms"
        out.append(
            ExpectResult(
                "job_max_stall_ms",
                ex.job_max_stall_ms,
                observed,
                observed <= ex.job_max_stall_ms,
                detail,
            )
        )
    return out
