"""``linkguard sim chaos``: the chaos run (:mod:`linkguard.simulations.chaos`) from a shell:
real agents and the real service over a private Mosquitto, the agents behind the seeded
fault-injecting proxy during a storm of port flaps; prints the figures, or the report as JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from linkguard.cli.common import Stopped, fail, positive, run_stoppable

__all__ = ["add_chaos", "sim_chaos"]


def add_chaos(simsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sc = simsub.add_parser(
        "chaos",
        help="a seeded chaos run: real agents behind a lossy MQTT proxy during a port storm",
        description="Start a private Mosquitto, the topology service and one agent per host of "
        "a generated rail-optimized fabric, the agents behind the chaos proxy; play a seeded "
        "storm of port flaps while the proxy drops --loss of the publishes (and duplicates, "
        "delays and reorders some, and cuts connections); then clear the faults and measure "
        "how long each host takes to ack the service's current epoch, and check the ledger "
        "holds every journaled port event once with the agent's time.",
        epilog="Exit codes: 0 passed, 1 failed (or no mosquitto binary), 2 bad arguments.",
    )
    sc.add_argument(
        "--hosts", type=positive(int, lo=2, hi=512), default=8, help="agents (default 8)"
    )
    sc.add_argument(
        "--rails", type=positive(int, lo=1, hi=8), default=2, help="rails per host (default 2)"
    )
    sc.add_argument(
        "--loss", type=float, default=0.1, help="drop probability per publish (0..1, 0.1)"
    )
    sc.add_argument(
        "--seed", type=positive(int, lo=0, hi=2**63 - 1), default=1, help="seed (default 1)"
    )
    sc.add_argument(
        "--storm-s",
        type=positive(float, lo=0.1, hi=600),
        default=5.0,
        help="the storm's length (s, default 5)",
    )
    sc.add_argument(
        "--within-s",
        type=positive(float, lo=0.1, hi=3600),
        default=15.0,
        help="the stated convergence time (s, default 15)",
    )
    sc.add_argument(
        "--workdir",
        type=Path,
        help="keep the run's files here (the agents' state dirs, the broker's files and the "
        "ledger, ledger.sqlite3: `linkguard report --ledger DIR/ledger.sqlite3`); new or "
        "empty; default a temporary directory, removed afterwards",
    )
    sc.add_argument("--json", action="store_true", help="print the report as JSON")


def sim_chaos(args: argparse.Namespace) -> int:
    """``sim chaos``: run it, print the figures; 0 passed, 1 failed."""
    import logging

    from linkguard.logs import configure_logging
    from linkguard.simulations.chaos import run_chaos

    if not 0.0 <= args.loss <= 1.0:
        return fail(f"sim chaos: --loss {args.loss}: between 0 and 1", 2)
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        return fail(f"sim chaos: --workdir {args.workdir}: not empty (a run's files go there)", 2)
    configure_logging("console", "error")
    logging.getLogger("mqtt").setLevel(logging.CRITICAL)
    try:
        r = run_stoppable(
            run_chaos(
                hosts=args.hosts,
                rails=args.rails,
                loss=args.loss,
                seed=args.seed,
                storm_s=args.storm_s,
                within_s=args.within_s,
                workdir=args.workdir,
            )
        )
    except Stopped as exc:
        return fail(f"sim chaos: {exc}; its broker and files were removed", exc.code)
    except (OSError, TimeoutError) as exc:
        return fail(f"sim chaos: {exc}", 1)
    v = r.verdict
    if args.json:
        print(r.model_dump_json(indent=2))
    else:
        print(
            f"chaos: {r.hosts} hosts, loss {r.loss:.0%}, seed {r.seed}: dropped {r.dropped}, "
            f"duplicated {r.duplicated}, delayed {r.delayed}, reordered {r.reordered}, cut "
            f"{r.cut}; convergence p50 {_s(v.convergence_p50_s)} p99 {_s(v.convergence_p99_s)} "
            f"(every host within {v.within_s:g} s: {v.converged}); events journaled "
            f"{v.events_journaled}, missing until a reconnect {v.events_missing_until_reconnect}, "
            f"lost {v.events_lost}, duplicated {v.events_duplicated}, "
            f"re-timed {v.events_time_mismatch}: {'PASS' if v.passed else 'FAIL'}"
        )
    return 0 if v.passed else 1


def _s(v: float | None) -> str:
    return "never" if v is None else f"{v:.3f} s"
