"""Time a fleet run: 30 simulated days of 2,048 hosts x 8 rails at the published failure rates.

Usage: ``python benchmarks/fleet_sim.py [--hosts 2048] [--rails 8] [--days 30] [--seed 1]
[--oracle]``. Prints the wall time of each phase (fabric + timeline generation, the engine's
replay, the report) and the total against the issue's target (< 60 s on 2 cores), then the
report's table. ``--oracle`` also checks reachability after every solve (slower).
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

TARGET_S = 60.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2048)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--oracle", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    ft = fleet_scenario(
        GenerateSpec(hosts=args.hosts, rails=args.rails),
        duration_s=args.days * 86400,
        seed=args.seed,
    )
    sc = ft.loaded.scenario.model_copy(update={"expect": Expect(reachability=args.oracle)})
    ft = replace(ft, loaded=replace(ft.loaded, scenario=sc))
    t1 = time.perf_counter()
    report = run(ft.loaded)
    t2 = time.perf_counter()
    rep = fleet_report(ft, report)
    t3 = time.perf_counter()
    rep.wall_s = round(t3 - t0, 3)
    total = t3 - t0
    cpus = len(os.sched_getaffinity(0))
    print(
        f"fleet sim {args.hosts} hosts x {args.rails} rails, {args.days:g} days, seed "
        f"{args.seed}, oracle {'on' if args.oracle else 'off'}, {cpus} CPUs"
    )
    print(f"  generate {t1 - t0:7.2f} s  ({len(sc.timeline)} timeline entries)")
    print(f"  engine   {t2 - t1:7.2f} s  ({report.events} events, {report.solves} solves)")
    print(f"  report   {t3 - t2:7.2f} s")
    verdict = "within" if total < TARGET_S else "ABOVE"
    print(f"  total    {total:7.2f} s  ({verdict} the {TARGET_S:g} s target)")
    print(rep.text(), end="")


if __name__ == "__main__":
    main()
