"""Time a fleet run at the published failure rates: one simulated year of 16,384 hosts x 8 rails
in < 60 s wall on 2 cores (issue 23), against the same run at a baseline size.

Usage: ``python benchmarks/fleet_sim.py [--hosts 16384] [--rails 8] [--days 365] [--seed 1]
[--base 2048] [--oracle] [--report] [--stop-after 600]``. Runs ``--base`` hosts first (0: no
baseline), then ``--hosts``, the same days and seed, in this process. Prints per size the wall
time of each phase (fabric + timeline generation, the engine's replay with the time to its
first 1 %, start-up included: every agent's first port states and the full build; the report),
the events and solves, the total against the target (for ``--hosts``; the target is for 16,384
hosts and 365 days) and the ratio to the baseline; ``--report`` also prints the fleet report's
table. ``--oracle`` also checks reachability after every solve (slower). A run still going after
``--stop-after`` wall seconds is stopped (at the next 1 % of its simulated time) and its whole
wall time extrapolated from the part done.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from linkguard.simulations.engine import run
from linkguard.simulations.failures import fleet_scenario
from linkguard.simulations.fleetreport import fleet_report
from linkguard.simulations.scenario import Expect, GenerateSpec

TARGET_S = 60.0  #: issue 23: one simulated year of 16,384 hosts x 8 rails, wall seconds


class _Stopped(Exception):
    """The run passed ``--stop-after`` wall seconds at simulated time ``sim_t`` (s)."""

    def __init__(self, sim_t: float) -> None:
        super().__init__(sim_t)
        self.sim_t = sim_t


def _run(hosts: int, args: argparse.Namespace) -> dict:
    """One fleet run at ``hosts``: wall seconds per phase, events, solves, the report."""
    t0 = time.perf_counter()
    ft = fleet_scenario(
        GenerateSpec(hosts=hosts, rails=args.rails),
        duration_s=args.days * 86400,
        seed=args.seed,
    )
    sc = ft.loaded.scenario.model_copy(update={"expect": Expect(reachability=args.oracle)})
    ft = replace(ft, loaded=replace(ft.loaded, scenario=sc))
    t1 = time.perf_counter()
    started: list[float] = []

    def progress(sim_t: float) -> None:
        started.append(time.perf_counter())
        if args.stop_after and started[-1] - t0 > args.stop_after and sim_t < sc.duration_s:
            raise _Stopped(sim_t)

    try:
        report = run(ft.loaded, progress=progress, progress_steps=100)
    except _Stopped as stop:
        wall = time.perf_counter() - t0
        done = stop.sim_t / sc.duration_s
        print(
            f"fleet sim {hosts} hosts x {args.rails} rails, {args.days:g} days: stopped after "
            f"{wall:.0f} s wall at day {stop.sim_t / 86400:.1f} ({done:.0%} of the run; "
            f"generate {t1 - t0:.1f} s, first 1% of the run with the start-up "
            f"{started[0] - t1:.1f} s); the whole run would take about "
            f"{(t1 - t0) + (wall - (t1 - t0)) / done:.0f} s at this rate"
        )
        return {"total": float("inf"), "engine": float("inf"), "stopped": True}
    t2 = time.perf_counter()
    rep = fleet_report(ft, report)
    t3 = time.perf_counter()
    rep.wall_s = round(t3 - t0, 3)
    first = started[0] if started else t2  # the first progress call: start-up done and more
    print(
        f"fleet sim {hosts} hosts x {args.rails} rails, {args.days:g} days, seed {args.seed}, "
        f"oracle {'on' if args.oracle else 'off'}"
    )
    print(f"  generate {t1 - t0:7.2f} s  ({len(sc.timeline)} timeline entries)")
    print(
        f"  engine   {t2 - t1:7.2f} s  ({report.events} events, {report.solves} solves; "
        f"{first - t1:.2f} s to the first 1% of the run, start-up included)"
    )
    print(f"  report   {t3 - t2:7.2f} s")
    print(f"  total    {t3 - t0:7.2f} s")
    if args.report:
        print(rep.text(), end="")
    return {"total": t3 - t0, "engine": t2 - t1, "generate": t1 - t0, "events": report.events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=16384)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--days", type=float, default=365.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base", type=int, default=2048, help="baseline hosts, same run (0: none)")
    ap.add_argument("--oracle", action="store_true")
    ap.add_argument("--report", action="store_true", help="print the fleet report's table")
    ap.add_argument(
        "--stop-after",
        type=float,
        default=600.0,
        help="stop a run after this many wall seconds (checked at every 1%% of the run) and "
        "extrapolate (0: never; default 600, 10x the target)",
    )
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs")
    base = _run(args.base, args) if 0 < args.base < args.hosts else None
    main_ = _run(args.hosts, args)
    if main_.get("stopped"):
        print(f"\ntarget < {TARGET_S:g} s for 16,384 hosts and 365 days: NOT met (stopped)")
        if base is not None:
            print(f"baseline {args.base} hosts, same days and seed: {base['total']:.1f} s wall")
        return
    total = main_["total"]
    at_target = args.hosts == 16384 and args.days == 365
    verdict = ("met" if total < TARGET_S else "NOT met") if at_target else "n/a (other size)"
    print(
        f"\n{args.hosts} hosts, {args.days:g} days: {total:.1f} s wall; target < {TARGET_S:g} s "
        f"for 16,384 hosts and 365 days: {verdict}"
    )
    if base is not None:
        print(
            f"baseline {args.base} hosts, same days and seed: {base['total']:.1f} s wall "
            f"(engine {base['engine']:.1f} s); ratio {total / base['total']:.1f}x total, "
            f"{main_['engine'] / base['engine']:.1f}x engine"
        )


if __name__ == "__main__":
    main()
