"""``linkguard sim check|run|lab|fleet|chaos``: scenario files checked, replayed on a simulated
clock or a real bus, on network namespaces, the fleet simulation at published failure rates,
and the chaos run (:mod:`linkguard.cli.simchaos`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from linkguard.cli.common import Stopped, fail, positive, run_stoppable
from linkguard.cli.cost import add_transport_args, model_overrides, transports
from linkguard.cli.simchaos import add_chaos, sim_chaos

if TYPE_CHECKING:  # the commands import what they run when they run
    from linkguard.simulations.engine import RunReport
    from linkguard.simulations.live import LiveReport


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="fault-injection simulations driven by scenario files")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")
    _add_check(simsub)
    _add_run(simsub)
    _add_lab(simsub)
    _add_fleet(simsub)
    add_chaos(simsub)


def _add_check(simsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sc = simsub.add_parser(
        "check",
        help="validate scenario files and summarize them",
        description="Validate scenario files (schema linkguard.scenario/v1: a fabric, a "
        "timeline of faults, expectations) against their fabric, and print for each: the "
        "fabric's size, the duration, the events the timeline expands to per kind, and the "
        "first events. The shipped scenarios are in simulations/scenarios/.",
        epilog="Exit codes: 0 every file is valid, 2 at least one is not (each error names "
        "the file and the timeline entry).",
    )
    sc.add_argument("files", nargs="+", type=Path, metavar="FILE", help="scenario file (YAML)")
    sc.add_argument(
        "--events",
        type=positive(int, lo=0, hi=1_000_000),
        default=5,
        metavar="N",
        help="list the first N events of each (default 5, 0: none)",
    )


def _add_run(simsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sr = simsub.add_parser(
        "run",
        help="replay a scenario through the real agent and service cores on a simulated clock",
        description="Replay a scenario deterministically, without bus or threads: the real "
        "port monitor and agent core per host (fast path included), the real service core "
        "(state, solver, solves scheduled by its RFC 8405 back-off, plans applied at once), "
        "the oracle after every solve. Prints solves, plans per host, reroute times, fast "
        "paths, re-admissions, oracle mismatches and which `expect` held. Broker, service and "
        "agent outages are modelled: nothing reaches the service or the agents while away, "
        "the latest states once back. With "
        "--bus mosquitto or memory, the scenario runs in real time on a simulated fleet instead: "
        "the real service and one real agent per host (simulated ports, in-memory route "
        "tables) over a private Mosquitto or the in-memory broker, outages included; it adds "
        "the fast path and down -> first/last ack times, and the oracle checks the routes the "
        "agents installed.",
        epilog="Exit codes: 0 passed, 1 an oracle mismatch or an expectation failed (or the "
        "fleet could not start), 2 the file is not a valid scenario.",
    )
    sr.add_argument("file", type=Path, metavar="FILE", help="scenario file (YAML)")
    sr.add_argument("--json", action="store_true", help="print the report as JSON")
    sr.add_argument(
        "--bus",
        choices=["model", "mosquitto", "memory"],
        default="model",
        help="model: the simulated-clock replay (default); mosquitto / memory: real time over "
        "a real bus (linkguard.simulations.live)",
    )


def _add_lab(simsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sl = simsub.add_parser(
        "lab",
        help="replay a scenario on network namespaces: real kernel, agents, service, Mosquitto",
        description="Build the scenario's fabric from network namespaces (a namespace per "
        "host, a bridge per leaf, a spine bridge per rail when there are several SUs), start a "
        "private Mosquitto, the topology service and one agent per host, send UDP flows between "
        "GPU endpoints and replay the scenario's events in real time (links down/up in the "
        "kernel, switch faults published and cut in the fabric, broker/service/agent killed "
        "and restarted). Prints per fault the gap in each affected flow, datagrams lost and the "
        "time to the last ack, and the oracle's mismatches (UDP probes between endpoints vs "
        "the model's reachability after every settle). Needs root; generated fabrics of at "
        "most 32 hosts and 16 rails. A scenario with a job: also runs a PyTorch training job "
        "(Gloo, CPU; needs torch==2.13.0) with one rank per host bound to the GPU endpoints, "
        "reports its stall, steps and rank failures per fault, and runs twice by default: "
        "with linkguard, then without (static routes), one lab after the other. A scenario "
        "with a chaos: section (simulations/scenarios/lab-chaos.yaml) is a lab chaos run "
        "instead: the agents reach Mosquitto through the seeded chaos proxy (drop, duplicate, "
        "delay, reorder, cut; the service connects directly) while a seeded storm sets host "
        "links down and up in the kernel; then every host must ack the service's current "
        "epoch within chaos.within_s, the ledger must hold every journaled port event once at "
        "the agent's time, every host namespace's routes must be exactly what its plan "
        "implies (no leaked or duplicated route or rule), and `linkguard report` must list "
        "each outage once with its true start and length. It prints the proxy's counts, the "
        "convergence times, the events and the routes checked (docs/simulations.md).",
        epilog="Exit codes: 0 passed (--no-linkguard: the run completed), 1 an oracle mismatch, "
        "a failed expectation (max_reroute_ms applies to the data-plane gap), a failed chaos "
        "check or a process that died, 2 not root, not a valid scenario or a scenario the lab "
        "cannot build.",
    )
    sl.add_argument("file", type=Path, metavar="FILE", help="scenario file (YAML)")
    sl.add_argument(
        "--no-linkguard",
        action="store_true",
        help="baseline: no agents or service, static routes via each endpoint's home rail; "
        "shows how long flows stay broken without rerouting (mismatches are not failures); "
        "a job scenario then runs only this half",
    )
    sl.add_argument(
        "--skip-baseline",
        action="store_true",
        help="a job scenario runs only the with-linkguard half (default: both halves)",
    )
    sl.add_argument(
        "--agent-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_key_value,
        help="an agent setting for every lab agent (repeatable; dotted keys enter sections, "
        "e.g. routes.rto_min_ms=20; VALUE is YAML), over the scenario's agent_settings:",
    )
    sl.add_argument(
        "--discover",
        action="store_true",
        help="run the service on a discovered fabric: lldpd in every host namespace and on "
        "every leaf, the agents' discovery documents (their lldpd's neighbours), `fabric: "
        "{discover: {lldp: true}}`; the fabric discovered must be the lab's (docs/discovery.md)",
    )
    sl.add_argument("--json", type=Path, metavar="F", help="also write the report as JSON to F")
    sl.add_argument(
        "--workdir",
        type=Path,
        metavar="D",
        help="configs, logs and flow records go to D (kept); default a temporary directory",
    )
    sl.add_argument(
        "--keep", action="store_true", help="keep the temporary directory (its path is printed)"
    )


def _add_fleet(simsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sf = simsub.add_parser(
        "fleet",
        help="random faults at published rates on a generated fleet; job cost with/without",
        description="Generate a rail-optimized fabric and a seeded fault timeline at published "
        "rates (Llama 3 switch/cable and NIC interruptions, Alibaba HPN NIC-ToR link failures; "
        "linkguard.simulations.failures), replay it through the engine, and print what it "
        "costs one job on every GPU with and without linkguard, per transport (--transport): "
        "interruptions per 1,000 GPU-days, idled GPU-hours, goodput, outages that cost more "
        "with linkguard; then reroutes, time to reroute, needless reroutes, worst NIC load. "
        "Each transport's table states what it assumes.",
        epilog="Exit codes: 0 done (and, with --oracle, no mismatch), 1 an oracle mismatch or "
        "an output file could not be written, 2 bad arguments.",
    )
    sf.add_argument(
        "--hosts",
        type=positive(int, lo=2, hi=16384),
        default=2048,
        help="hosts in the generated fabric (2-16384, default 2048: one job needs a peer; "
        "hosts x rails <= 131,072 ports)",
    )
    sf.add_argument(
        "--rails",
        type=positive(int, lo=1, hi=64),
        default=8,
        help="rails (compute NICs) per host (default 8)",
    )
    sf.add_argument(
        "--days",
        type=positive(float, lo=0.001, hi=366),
        default=30.0,
        help="simulated days (default 30)",
    )
    sf.add_argument(
        "--seed",
        type=positive(int, lo=0, hi=2**63 - 1),
        default=1,
        help="seed of the fault timeline (default 1; same seed, same run)",
    )
    sf.add_argument("--json", type=Path, metavar="F", help="write the report as JSON to F")
    sf.add_argument("--plot", type=Path, metavar="F.png", help="write a PNG plot to F.png")
    sf.add_argument(
        "--scenario-out",
        type=Path,
        metavar="F.yaml",
        help="write the generated scenario to F.yaml (replay it with `sim run`)",
    )
    sf.add_argument(
        "--oracle",
        action="store_true",
        help="check reachability after every solve (about 5x slower at 2,048 hosts)",
    )
    sf.add_argument(
        "--progress",
        action="store_true",
        help="progress lines on stderr (default: only when stderr is a terminal)",
    )
    sf.add_argument(
        "--ledger",
        type=Path,
        metavar="PATH",
        help="also write the run to a new ledger at PATH (SQLite; must not exist yet), for "
        "`linkguard report --ledger PATH`",
    )
    add_transport_args(sf)


def run(args: argparse.Namespace) -> int:
    handler = {"run": _sim_run, "fleet": _sim_fleet, "lab": _sim_lab, "chaos": sim_chaos}.get(
        args.sim_command, _sim_check
    )
    return handler(args)


def _sim_check(args: argparse.Namespace) -> int:
    """``sim check``: a summary per valid file on stdout, an error per invalid one on stderr;
    0 when all are valid, else 2."""
    from linkguard.simulations.labprocs import agent_overrides
    from linkguard.simulations.scenario import ScenarioError, expand, load_scenario, summary_text

    code = 0
    for path in args.files:
        try:
            loaded = load_scenario(path)
            agent_overrides(loaded.scenario.agent_settings)  # as sim lab checks them
        except ScenarioError as exc:
            code = fail(str(exc), 2)
            continue
        except ValueError as exc:
            code = fail(f"{path}: {exc}", 2)
            continue
        sys.stdout.write(summary_text(loaded, expand(loaded), first=args.events))
    return code


def _sim_run(args: argparse.Namespace) -> int:
    """``sim run``: replay one scenario (:func:`linkguard.simulations.engine.run`), print the
    report (text or JSON); 0 passed, 1 failed, 2 not a valid scenario."""

    from linkguard.simulations.engine import run
    from linkguard.simulations.scenario import ScenarioError, load_scenario

    try:
        loaded = load_scenario(args.file)
    except ScenarioError as exc:
        return fail(str(exc), 2)
    if loaded.scenario.chaos is not None:  # a storm in the kernel: nothing to replay here
        return fail(
            f"{args.file}: a chaos: scenario runs on the namespace lab (`linkguard sim lab "
            f"{args.file}`); the simulator's chaos run is `linkguard sim chaos`",
            2,
        )
    report: RunReport | LiveReport
    if args.bus == "model":
        report = run(loaded)
    else:
        from linkguard.logs import configure_logging
        from linkguard.simulations import live

        _quiet_sim_logging(configure_logging)
        try:
            report = run_stoppable(live.run(loaded, bus=args.bus))
        except Stopped as exc:
            return fail(
                f"sim run --bus {args.bus}: {exc}; its broker and files were removed", exc.code
            )
        except (OSError, ImportError, TimeoutError) as exc:
            return fail(f"sim run --bus {args.bus}: {exc}", 1)
    if args.json:
        import json

        print(json.dumps(report.to_dict(), indent=2))
    else:
        sys.stdout.write(report.text())
    return 0 if report.passed else 1


def _quiet_sim_logging(configure_logging: Callable[..., None]) -> None:
    """A simulation's own components (in-process agents and service, the lab's bus observer)
    log errors only: a scripted broker outage or crash makes them warn about reconnects by the
    dozen, and paho logs the cut socket at ERROR; the report says what happened."""
    import logging

    configure_logging("console", "error")
    logging.getLogger("mqtt").setLevel(logging.CRITICAL)


def _key_value(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` with VALUE read as a YAML scalar (``20`` -> 20, ``true`` -> True)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        raise argparse.ArgumentTypeError(f"{key}: {value!r} is not a YAML value") from None


def _sim_lab(args: argparse.Namespace) -> int:
    """``sim lab``: replay one scenario on a namespace lab
    (:func:`linkguard.simulations.labrun.run_lab`), progress on stderr, the report on stdout
    (and as JSON with --json). 0 passed, 1 failed, 2 cannot run here or not a valid scenario.
    SIGTERM and SIGINT (Ctrl-C) cancel the run; its teardown removes the lab (exit 143 / 130)."""
    import json

    from linkguard.logs import configure_logging
    from linkguard.simulations.lab import LabError
    from linkguard.simulations.labchaos import LabChaosReport, run_lab_chaos
    from linkguard.simulations.labprocs import LabProcessError
    from linkguard.simulations.labrun import (
        LabPair,
        LabReport,
        LabRunError,
        check_lab_scenario,
        run_lab,
        run_lab_halves,
    )
    from linkguard.simulations.labrun import stderr_progress as lab_progress
    from linkguard.simulations.scenario import ScenarioError, load_scenario

    agent_settings = dict(args.agent_set)
    try:
        loaded = load_scenario(args.file)
        check_lab_scenario(loaded, agent_settings=agent_settings)
    except (ScenarioError, LabRunError) as exc:
        return fail(str(exc), 2)
    if args.discover and (loaded.scenario.chaos is not None or args.no_linkguard):
        return fail("--discover: runs the service with linkguard, not a chaos: scenario", 2)
    if loaded.scenario.chaos is not None and args.no_linkguard:
        return fail("--no-linkguard: a chaos: scenario checks linkguard itself", 2)
    if args.no_linkguard and args.skip_baseline:
        return fail("--no-linkguard runs only the baseline, --skip-baseline skips it", 2)
    if args.workdir is not None:  # before any namespace exists: a clear error, nothing built
        try:
            args.workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return fail(f"--workdir {args.workdir}: {exc.strerror or exc}", 2)
    _quiet_sim_logging(configure_logging)

    async def main() -> LabReport | LabPair | LabChaosReport:
        if loaded.scenario.chaos is not None:  # the seeded storm behind the chaos proxy
            return await run_lab_chaos(
                loaded,
                workdir=args.workdir,
                keep=args.keep,
                progress=lab_progress(),
                agent_settings=agent_settings,
            )
        if loaded.scenario.job is not None:  # both halves in one run, unless told
            halves = (False,) if args.no_linkguard else (True,) if args.skip_baseline else None
            return await run_lab_halves(
                loaded,
                halves=halves or (True, False),
                workdir=args.workdir,
                keep=args.keep,
                progress=lab_progress(),
                agent_settings=agent_settings,
                discover=args.discover,
            )
        return await run_lab(
            loaded,
            linkguard=not args.no_linkguard,
            workdir=args.workdir,
            keep=args.keep,
            progress=lab_progress(),
            agent_settings=agent_settings,
            discover=args.discover,
        )

    try:  # SIGTERM and SIGINT cancel the run: its teardown removes the lab
        report = run_stoppable(main())
    except Stopped as exc:
        return fail(f"sim lab: {exc}; the lab was torn down", exc.code)
    except (LabProcessError, LabError) as exc:
        return fail(f"sim lab failed (the lab was torn down): {exc}", 1)
    sys.stdout.write(report.text())
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            return fail(f"sim lab: cannot write {args.json}: {exc}", 1)
    return 0 if report.passed else 1


def _sim_fleet(args: argparse.Namespace) -> int:
    """``sim fleet``: generate, replay and cost a fleet run
    (:func:`linkguard.simulations.fleetreport.simulate`); print the table, write the JSON,
    plot and scenario when asked. 0 done, 1 oracle mismatch or unwritable output, 2 bad
    arguments."""
    import json

    from pydantic import ValidationError

    from linkguard.simulations.fleetreport import plot, simulate, stderr_progress
    from linkguard.simulations.scenario import Expect, GenerateSpec, dump_scenario

    try:
        spec = GenerateSpec(hosts=args.hosts, rails=args.rails)
    except ValidationError as exc:
        return fail(f"sim fleet: {exc.errors()[0]['msg'].removeprefix('Value error, ')}", 2)
    for out in (args.json, args.plot, args.scenario_out):
        # before a run of seconds to minutes, not after it
        if out is not None and not out.resolve().parent.is_dir():
            return fail(f"sim fleet: cannot write {out}: {out.parent} is not a directory", 1)
    if args.ledger is not None and (args.ledger.exists() or args.ledger.is_symlink()):
        return fail(
            f"sim fleet: --ledger {args.ledger} exists; a simulation writes a new ledger "
            "(remove it or choose another path)",
            2,
        )
    if args.ledger is not None and not args.ledger.resolve().parent.is_dir():
        return fail(
            f"sim fleet: --ledger {args.ledger}: {args.ledger.parent} is not a directory", 2
        )
    from linkguard.failuremodel import FailureModel

    progress = stderr_progress(True if args.progress else None)
    ft, rep = simulate(
        spec,
        duration_s=args.days * 86400,
        seed=args.seed,
        oracle=args.oracle,
        progress=progress,
        model=FailureModel(**model_overrides(args)),
        transports=transports(args),
    )
    sys.stdout.write(rep.text())
    try:
        if args.json is not None:
            args.json.write_text(json.dumps(rep.to_dict(), indent=2) + "\n", encoding="utf-8")
        if args.plot is not None:
            plot(rep, args.plot)
        if args.scenario_out is not None:
            # with the oracle on, whatever this run did: replaying the file should check it
            sc = ft.loaded.scenario.model_copy(update={"expect": Expect()})
            args.scenario_out.write_text(dump_scenario(sc), encoding="utf-8")
    except OSError as exc:
        return fail(f"sim fleet: cannot write output: {exc}", 1)
    if args.ledger is not None:
        from linkguard.ledger import Ledger, LedgerError
        from linkguard.simulations.ledgerrecord import record_simulation

        try:
            with Ledger(args.ledger) as ledger:
                record_simulation(ledger, ft, rep)
        except (LedgerError, OSError) as exc:
            return fail(f"sim fleet: cannot write the ledger: {exc}", 1)
    return 1 if rep.oracle["mismatches"] else 0
