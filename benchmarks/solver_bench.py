"""Time the pure solver: full solve (all hosts, with backups) of generated rail-optimized fabrics.

Usage: ``python benchmarks/solver_bench.py [--runs 5] [--sizes 32,256]``. Prints, per size, the
median wall time of ``solve()`` for all rails up and with one rail of one host down, plus the
busiest NIC's route count (normal vs. degraded). No I/O besides stdout.
"""

from __future__ import annotations

import argparse

from _timing import median_s

from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import load_report, solve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sizes", default="32,256", help="comma-separated host counts")
    ap.add_argument("--rails", type=int, default=8)
    args = ap.parse_args()
    print(f"{'hosts':>6} {'rails':>5} {'routes':>8} {'case':<14} {'median':>9}  busiest NIC")
    for hosts in (int(x) for x in args.sizes.split(",")):
        fabric = generate_rail_optimized(hosts=hosts, rails=args.rails)
        victim = fabric.host_names[hosts // 2]
        cases = {"all-up": {}, "one-rail-down": {victim: frozenset({3 % args.rails})}}
        for case, unusable in cases.items():

            def run(fabric=fabric, unusable=unusable):
                return solve(fabric, unusable, epoch=1, now=0.0)

            median = median_s(run, args.runs)
            plans = run()
            routes = sum(len(p.routes) for p in plans.values())
            busiest = max(max(v.values(), default=0) for v in load_report(plans).values())
            print(
                f"{hosts:>6} {args.rails:>5} {routes:>8} {case:<14} {median * 1000:>7.1f} ms"
                f"  {busiest} routes"
            )


if __name__ == "__main__":
    main()
