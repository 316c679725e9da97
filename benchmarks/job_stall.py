"""A training job's stall through host link faults on the namespace lab, with and without
linkguard, in one run. Needs root, Mosquitto and torch==2.13.0 (`pip install -e '.[lab]'`).

    python benchmarks/job_stall.py [--faults 20] [--down-s 3] [--timeout-s 10]
                                   [--compute-ms 50] [--sides both|with|without]
                                   [--agent-set KEY=VALUE ...] [--json FILE] [--workdir D]

A 4-host x 4-rail lab (the golden scenarios' fabric) with its management network; the job of
the job scenarios (:mod:`linkguard.simulations.jobtrain`: PyTorch DDP over Gloo on the CPU, one
rank per host, one Gloo device per GPU endpoint, 8 all-reduces per step over all four rails,
``--compute-ms`` of sleep per step standing for the GPU). Each side builds a fresh lab and
starts the job; ``--faults`` times a host link goes down (the fabric end of its veth: the
host's ports in turn, host-major, rail by rail) for ``--down-s``, comes back, and the job must
step again (and, with linkguard, the re-admission after the agents' 0.5 s hold-down be acked and
the bus be quiet for the service's back-off hold-down) before the next. With linkguard: real
agents, service and Mosquitto; without: static routes, each endpoint subnet via its home rail
(``sim lab --no-linkguard``). A job that loses a rank is started again (on the same lab) and
the faults go on; every lost rank is counted.

Per fault the stall is the job's longest step that the fault owns minus the median step
(:func:`linkguard.simulations.labjob.stalls`, worst rank). Prints per side the stall p50 / p99
/ max (ms), the rank failures, the faults after which the job stepped again before the link
came back, and the steady-state step time of each side (median before the first fault, and
its ratio: linkguard's overhead in the same run), with the targets next to them: p99 < 300 ms,
< 100 ms with ``--agent-set routes.rto_min_ms=...`` (a setting this linkguard's agent must
know). ``--json FILE`` writes ``{"with_linkguard": {"stall_ms": {"p50", "p99", "max"},
"rank_failures", ...}, "without_linkguard": {...}, "step_ms": {...}, "assumptions": "..."}``.
Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess
from linkguard.config import ServiceSettings
from linkguard.logs import configure_logging
from linkguard.simulations.engine import percentile
from linkguard.simulations.jobspec import JobSpec
from linkguard.simulations.jobtrain import bounded
from linkguard.simulations.lab import Lab
from linkguard.simulations.labjob import STORE_PORT, LabJob, torch_problem
from linkguard.simulations.labprocs import (
    Observer,
    Procs,
    agent_overrides,
    observer_bus,
    roce_fabric,
    start_all,
    until,
    write_configs,
)
from linkguard.simulations.labreport import JobFault
from linkguard.topology.generator import generate_rail_optimized

TARGET_P99_MS = 300.0
TARGET_RTO_MIN_P99_MS = 100.0
#: The agents' hold-down: short and constant (no back-off growth over the faults).
DAMPING = DampingPolicy(hold_down_initial_s=0.5, hold_down_max_s=0.5)
#: After a link returns, the job must complete this many steps on every rank.
STEPS_AFTER = 3
#: Steady state before the first fault, after the warm-up, on both sides (s): the step time.
STEADY_S = 8.0
ASSUMPTIONS = (
    "Namespace lab on one 2-core machine: 4 hosts x 4 rails (veths into Linux bridges), one "
    "rank per host of a PyTorch 2.13 DDP job over Gloo (TCP, CPU), one Gloo device per GPU "
    "endpoint so each step's 8 all-reduces cross every rail; compute is a {compute:g} ms sleep "
    "per step; Gloo collective timeout {timeout:g} s; each fault takes one host link down for "
    "{down:g} s. Stall = the longest step a fault owns minus the median step. The job's "
    "traffic is IP (Gloo over TCP), which a route change moves at once (as NCCL's socket "
    "transport, IPoIB, storage); RDMA queue pairs do not move (README, 'Jobs'). Gloo's "
    "connecting sockets are not bound: they take their source from linkguard's routes "
    "(src = the local GPU endpoint; the job starts after the first plans), "
    "and the agents flush the neighbour entries a reroute leaves stale (routes.source, "
    "routes.neighbour_flush: the defaults); routes.rto_min_ms as the agent settings say "
    "(unset: Linux's 200 ms minimum RTO)."
)


@dataclass
class Side:
    """One side's measurements: per fault its (monotonic) time and the job's view of it."""

    linkguard: bool
    times: list[float] = field(default_factory=list)
    faults: list[JobFault] = field(default_factory=list)
    before_up: list[bool] = field(default_factory=list)
    jobs_started: int = 0
    step_median_ms: float | None = None
    step_p99_ms: float | None = None
    rail_mb: dict[int, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        stalls = [f.stall_ms for f in self.faults if f.stall_ms is not None]
        return {
            "stall_ms": {
                "p50": round(statistics.median(stalls), 1) if stalls else None,
                "p99": percentile(stalls, 99) if stalls else None,
                "max": max(stalls, default=None),
            },
            "rank_failures": sum(f.rank_failures for f in self.faults),
            "faults": len(self.faults),
            "faults_measured": len(stalls),
            "resumed_before_link_up": sum(self.before_up),
            "jobs_started": self.jobs_started,
            "step_ms": {"median": self.step_median_ms, "p99": self.step_p99_ms},
            "rail_mb_first_job": self.rail_mb,
            "per_fault": [
                {
                    "stall_ms": f.stall_ms,
                    "steps": f.steps,
                    "rank_failures": f.rank_failures,
                    "resumed": f.resumed,
                    "note": f.note,
                }
                for f in self.faults
            ],
            "wall_s": round(self.wall_s, 1),
        }


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def static_routes(lab: Lab) -> None:
    for lh in lab.hosts:
        script = "".join(
            f"route replace {net} dev {lab.rail(lh.name, r).netdev}\n"
            for r, net in sorted(lab.endpoint_subnets.items())
        )
        subprocess.run(["ip", "-n", lh.netns, "-batch", "-"], input=script, text=True, check=True)


def all_acked_after(obs: Observer, names: list[str], epoch: int) -> bool:
    for h in names:
        plans = [p.epoch for _, p in obs.plans.get(h, []) if p.epoch > epoch]
        if not plans or obs.acked(h, max(plans)) is None:
            return False
    return True


async def quiet(obs: Observer, seconds: float, procs: Procs) -> None:
    def done() -> bool:
        last = max(obs.last_plan_at, max((t for t, _ in obs.states), default=0.0))
        return time.monotonic() - last >= seconds

    await until(done, seconds + 30, "a quiet bus", procs)


async def stepped_after(job: LabJob, t: float, timeout: float) -> bool:
    """Until every rank completed STEPS_AFTER steps after ``t`` (True) or a rank exited or
    ``timeout`` passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ranks = job.poll()
        if any(r.exit_code is not None for r in ranks):
            return False
        if all(sum(1 for e in r.ends if e > t) >= STEPS_AFTER for r in ranks):
            return True
        await asyncio.sleep(0.02)
    return False


async def run_side(linkguard: bool, args: argparse.Namespace, wd: Path) -> Side:
    fabric = generate_rail_optimized(hosts=4, rails=4, hosts_per_su=4, spines_per_su=2)
    names = fabric.host_names
    ports = [(h, r) for r in sorted(fabric.rails) for h in names]
    spec = JobSpec(kind="torch-gloo", compute_ms=args.compute_ms, timeout_s=args.timeout_s)
    side = Side(linkguard)
    started = time.monotonic()
    await asyncio.to_thread(wd.mkdir, parents=True, exist_ok=True)
    lab = Lab.from_fabric(fabric, management=True)
    broker = MosquittoProcess(wd / "broker").start() if linkguard else None
    procs, obs = Procs(wd), Observer()
    holddown_s = ServiceSettings().solve.holddown_ms / 1000
    job: LabJob | None = None
    try:
        bus = None
        if linkguard:
            assert broker is not None
            cfgs = write_configs(
                wd,
                lab,
                roce_fabric(fabric),
                broker.port,
                damping=DAMPING,
                debounce_ms=None,
                agent_extra=agent_overrides(args.agent_settings),
            )
            bus = observer_bus(broker.port, obs)
            await bus.__aenter__()
            await bus.wait_connected(10)
            await start_all(procs, obs, cfgs, names)
        else:
            static_routes(lab)
        check = procs.check_alive

        async def new_job() -> LabJob:
            k = side.jobs_started
            (wd / f"job{k}").mkdir(exist_ok=True)
            j = LabJob(lab, wd / f"job{k}", spec, names, store_port=STORE_PORT + k)
            side.jobs_started += 1
            j.start()
            await j.wait_warm(check)
            return j

        async def measure(j: LabJob, times: list[float], first: bool) -> None:
            await j.stop()
            median = j.median_ms(times[0] if times else None)
            side.faults += j.faults(times, median)
            if first:
                s = j.summary(times[0] if times else None, 0.0)
                side.step_median_ms, side.step_p99_ms = s.median_step_ms, s.p99_step_ms
                side.rail_mb = s.rail_mb

        job = await new_job()
        warm = time.monotonic()
        first_job, times = True, []
        if linkguard:
            await quiet(obs, holddown_s + 0.2, procs)
        # the same steady period on both sides before the first fault: the step time's median
        await asyncio.sleep(max(0.0, warm + STEADY_S - time.monotonic()))
        for i in range(args.faults):
            host, rail = ports[i % len(ports)]
            t_down = time.monotonic()
            await asyncio.to_thread(lab.link_down, host, rail)
            times.append(t_down)
            early = await stepped_after(job, t_down + 0.05, args.down_s)
            await asyncio.sleep(max(0.0, t_down + args.down_s - time.monotonic()))
            e1 = obs.max_epoch()  # before the re-admission (the hold-down is 0.5 s)
            await asyncio.to_thread(lab.link_up, host, rail)
            t_up = time.monotonic()
            side.before_up.append(early)
            ok = await stepped_after(job, t_up, args.timeout_s + 15)
            if linkguard:
                await until(lambda e=e1: all_acked_after(obs, names, e), 15, "re-admission", procs)
                await quiet(obs, holddown_s + 0.2, procs)
            else:
                await asyncio.sleep(1.0)
            if not ok:  # a rank failed (or hung): measure this job, start another
                await measure(job, times, first_job)
                first_job, times = False, []
                say(f"  fault {i + 1}: the job lost a rank; starting it again")
                job = await new_job()
                if linkguard:
                    await quiet(obs, holddown_s + 0.2, procs)
            say(
                f"[{'with' if linkguard else 'without'} linkguard {time.monotonic() - started:6.1f}"
                f" s] fault {i + 1}/{args.faults}: {host} rail {rail} down {args.down_s:g} s; "
                f"the job {'stepped again' if ok else 'FAILED'}"
                + (" before the link returned" if early else "")
            )
        await measure(job, times, first_job)
        job = None
        if bus is not None:
            await bus.__aexit__(None, None, None)
    finally:
        if job is not None:
            job.kill()
        codes = procs.stop()
        if broker is not None:
            broker.stop()
        lab.destroy()
    bad = {n: c for n, c in codes.items() if c}
    if bad:
        say(f"unclean exits: {bad}")
    side.wall_s = time.monotonic() - started
    return side


def fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:.1f}{unit}"


def table(sides: dict[str, Side], rto_min: bool) -> str:
    target = TARGET_RTO_MIN_P99_MS if rto_min else TARGET_P99_MS
    out = [f"{'':34} {'p50':>9} {'p99':>9} {'max':>9}  rank failures  stepped before up"]
    for name, side in sides.items():
        d = side.to_dict()
        st = d["stall_ms"]
        line = (
            f"job stall {name:24} {fmt(st['p50']):>9} {fmt(st['p99']):>9} {fmt(st['max']):>9}"
            f"  {d['rank_failures']:>13}  {d['resumed_before_link_up']:>4} of {d['faults']}"
        )
        if side.linkguard and st["p99"] is not None:
            met = "met" if st["p99"] < target else "NOT met"
            what = " (with rto_min)" if rto_min else ""
            line += f"   target p99 < {target:g} ms{what}: {met}"
        out.append(line)
    w, wo = sides.get("with linkguard"), sides.get("without linkguard")
    for name, side in sides.items():
        out.append(
            f"steady-state step {name:16} median {fmt(side.step_median_ms, ' ms')}, p99 "
            f"{fmt(side.step_p99_ms, ' ms')}"
        )
    if w and wo and w.step_median_ms and wo.step_median_ms:
        out.append(
            f"step time with / without linkguard: {w.step_median_ms / wo.step_median_ms:.2f}"
        )
    return "\n".join(out)


async def main() -> int:
    ap = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n", 1)[0].split()),
        epilog="Needs root, Mosquitto and torch 2.13.0; about 4.7 min at the defaults.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--faults", type=bounded(int, 1, 1000), default=20, help="host link faults per side"
    )
    ap.add_argument("--down-s", type=bounded(float, 0.1, 600), default=3.0, help="each outage (s)")
    ap.add_argument(
        "--timeout-s",
        type=bounded(float, 1, 3600),
        default=10.0,
        help="Gloo collective timeout (s)",
    )
    ap.add_argument(
        "--compute-ms", type=bounded(float, 1, 10_000), default=50.0, help="sleep per step (ms)"
    )
    ap.add_argument("--sides", choices=["both", "with", "without"], default="both")
    ap.add_argument(
        "--agent-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an agent setting (dotted keys enter sections; VALUE is YAML), e.g. "
        "routes.rto_min_ms=20; repeatable",
    )
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--workdir", type=Path, help="keep configs, logs and job records here")
    args = ap.parse_args()
    problem = torch_problem()
    if problem:
        say(f"job_stall: {problem}")
        return 2
    try:
        args.agent_settings = {}
        for a in args.agent_set:
            key, eq, value = a.partition("=")
            if not eq or not key:
                raise ValueError(f"--agent-set {a!r}: expected KEY=VALUE")
            args.agent_settings[key] = yaml.safe_load(value)
        agent_overrides(args.agent_settings)
    except (ValueError, yaml.YAMLError) as exc:
        say(f"job_stall: {exc}")
        return 2
    wd = args.workdir or Path(tempfile.mkdtemp(prefix="job-stall-"))
    configure_logging("console", "warning")
    say(
        f"job_stall: 4 hosts x 4 rails, {args.faults} host link faults of {args.down_s:g} s, "
        f"job step {args.compute_ms:g} ms compute, collective timeout {args.timeout_s:g} s; "
        f"workdir {wd}"
    )
    sides: dict[str, Side] = {}
    if args.sides in ("both", "with"):
        sides["with linkguard"] = await run_side(True, args, wd / "with-linkguard")
    if args.sides in ("both", "without"):
        sides["without linkguard"] = await run_side(False, args, wd / "without-linkguard")
    rto_min = any(k.endswith("rto_min_ms") for k in args.agent_settings)
    print(
        f"job_stall: {args.faults} host link faults ({args.down_s:g} s each) on a 4x4 lab, "
        "PyTorch DDP over Gloo, 4 ranks x 4 Gloo devices"
        + (f"; agent settings {args.agent_settings}" if args.agent_settings else "")
    )
    print(table(sides, rto_min))
    w, wo = sides.get("with linkguard"), sides.get("without linkguard")
    doc = {
        "with_linkguard": w.to_dict() if w else None,
        "without_linkguard": wo.to_dict() if wo else None,
        "step_ms": {
            "with_linkguard": w.step_median_ms if w else None,
            "without_linkguard": wo.step_median_ms if wo else None,
            "ratio": (
                round(w.step_median_ms / wo.step_median_ms, 3)
                if w and wo and w.step_median_ms and wo.step_median_ms
                else None
            ),
        },
        "targets": {"stall_p99_ms": TARGET_P99_MS, "stall_p99_ms_rto_min": TARGET_RTO_MIN_P99_MS},
        "faults": args.faults,
        "down_s": args.down_s,
        "agent_settings": args.agent_settings,
        "assumptions": ASSUMPTIONS.format(
            compute=args.compute_ms, timeout=args.timeout_s, down=args.down_s
        ),
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
