"""The chaos run (issue 21, item 4): 64 real agents and the real topology service over a private
Mosquitto, the agents behind the seeded fault-injecting proxy at a 10 % loss rate during a storm
of port flaps (:mod:`linkguard.simulations.chaos`).

Usage: ``python benchmarks/chaos.py [--hosts 64] [--rails 2] [--loss 0.1] [--seed 1]
[--storm-s 5] [--within-s 60] [--resend-after-s 5] [--resend-max-s 60] [--json]`` (the
service's re-send timers default to production's). Prints the publishes the proxy dropped,
duplicated, delayed and reordered and the connections it cut; the per-host convergence after the
storm (p50, p99, max, s) against the stated time; the port events the agents journaled and how many
of them the ledger lacks (target 0), holds twice (target 0) or holds with another time than the
agent's (target 0). Exit status 0 when every target is met.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

from linkguard.logs import configure_logging
from linkguard.simulations.chaos import run_chaos


def _s(v: float | None) -> str:
    return "never" if v is None else f"{v:6.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--rails", type=int, default=2)
    ap.add_argument("--loss", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--storm-s", type=float, default=5.0)
    ap.add_argument("--events-per-s", type=float, default=20.0)
    ap.add_argument("--within-s", type=float, default=60.0)
    ap.add_argument("--resend-after-s", type=float, default=5.0)
    ap.add_argument("--resend-max-s", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    configure_logging("console", "error")
    logging.getLogger("mqtt").setLevel(logging.CRITICAL)

    t0 = time.perf_counter()
    r = asyncio.run(
        run_chaos(
            hosts=args.hosts,
            rails=args.rails,
            loss=args.loss,
            seed=args.seed,
            storm_s=args.storm_s,
            events_per_s=args.events_per_s,
            within_s=args.within_s,
            startup_timeout_s=60,
            resend_after_s=args.resend_after_s,
            resend_max_s=args.resend_max_s,
        )
    )
    wall = time.perf_counter() - t0
    v = r.verdict
    if args.json:
        print(r.model_dump_json(indent=2))
        return 0 if v.passed else 1
    cpus = len(os.sched_getaffinity(0))
    print(
        f"chaos run: {r.hosts} agents x {r.rails} rails, loss {r.loss:.0%}, seed {r.seed}, "
        f"{r.storm_s:g} s storm ({r.port_events} port events), {cpus} CPUs, {wall:.1f} s wall"
    )
    print(f"  re-send after {args.resend_after_s:g} s, back-off up to {args.resend_max_s:g} s")
    print(f"  fleet up (first acks)     {r.startup_s:6.2f} s")
    print(
        f"  publishes dropped {r.dropped}, duplicated {r.duplicated}, delayed {r.delayed}, "
        f"reordered {r.reordered}; connections cut {r.cut} ({r.connections} accepted)"
    )
    target = f"(target: every host <= {v.within_s:g} s)"
    print(f"  convergence p50           {_s(v.convergence_p50_s)}")
    print(f"  convergence p99           {_s(v.convergence_p99_s)}  {target}")
    print(f"  convergence max           {_s(v.convergence_max_s)}")
    if v.not_converged:
        print(f"  NOT converged: {', '.join(v.not_converged)}")
    print(f"  port events journaled     {v.events_journaled}")
    print(f"  missing until a reconnect {v.events_missing_until_reconnect}  (target 0)")
    print(f"  events lost               {v.events_lost}  (target 0; after a reconnect)")
    print(f"  events duplicated         {v.events_duplicated}  (target 0)")
    print(f"  events with another time  {v.events_time_mismatch}  (target 0)")
    print(f"  verdict                   {'PASS' if v.passed else 'FAIL'}")
    return 0 if v.passed else 1


if __name__ == "__main__":
    sys.exit(main())
