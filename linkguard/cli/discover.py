"""``linkguard fabric discover`` (a fabric file from the hosts' discovery documents and a
switch graph) and ``linkguard fabric facts`` (this host's discovery document).

Exit codes: 0 a fabric was written (what could not be determined is listed on stderr and in
``--unknowns``), 1 no host could be placed, the broker could not be reached or the output
cannot be written, 2 bad usage or an input file that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from linkguard.cli.common import broker_address, fail, positive, write

__all__ = ["add_parsers", "run"]


def add_parsers(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = fsub.add_parser(
        "discover",
        help="build a fabric file from what the hosts report (agents on the bus, or facts "
        "files) and an ibnetdiscover dump or LLDP neighbour tables",
        description="Build a fabric the topology service accepts from what is real: each "
        "host's discovery document (the agents publish it retained on "
        "linkguard/v1/hosts/<host>/discovery; `linkguard fabric facts` prints one) and the "
        "switch graph: an ibnetdiscover dump for InfiniBand, or LLDP for RoCE (the neighbours "
        "the agents' lldpd saw, plus the switches' own `lldpctl -f json` for the spine "
        "cables). Each HCA port goes on the leaf it is cabled to; a leaf's rail is the rail "
        "most of its ports have in their hosts' own numbering. Ports and hosts it cannot place "
        "are listed on stderr (and in --unknowns), host and device named, with the rule that "
        "left them out (docs/discovery.md).",
        epilog="Example: linkguard fabric discover --broker mqtt:1883 --ibnetdiscover "
        "ibnetdiscover.txt --rail-prefix 10.100.0.0/16 -o fabric.yaml. Exit codes: 0 fabric "
        "written, 1 no host placed / broker unreachable / output not writable, 2 bad usage or "
        "input.",
    )
    d.set_defaults(subparser=d)
    src = d.add_argument_group("host reports (one or both)")
    src.add_argument(
        "--broker",
        metavar="HOST:PORT",
        type=broker_address,
        help="read every retained hosts/+/discovery from this MQTT broker",
    )
    src.add_argument(
        "-c",
        "--config",
        type=Path,
        help="a topology service config whose bus section (broker, credentials, TLS) to use",
    )
    src.add_argument(
        "--wait",
        type=positive(float, lo=0.1, hi=600),
        default=3.0,
        metavar="S",
        help="with the bus: collect for S seconds after connecting (default 3; retained "
        "documents arrive at once)",
    )
    src.add_argument(
        "--facts",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a discovery document (JSON, as `fabric facts` writes) or a directory of them "
        "(*.json); repeat for several",
    )
    graph = d.add_argument_group("switch graph (one)")
    graph.add_argument("--ibnetdiscover", type=Path, metavar="FILE", help="ibnetdiscover output")
    graph.add_argument(
        "--guid-map",
        type=Path,
        metavar="FILE",
        help="with --ibnetdiscover: GUID -> host map (`H-<guid> <host>` or node-name-map lines)",
    )
    graph.add_argument(
        "--lldp",
        action="store_true",
        help="RoCE: the LLDP neighbours in the hosts' documents are the host cables",
    )
    graph.add_argument(
        "--switch-lldp",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="with --lldp: a switch's own `lldpctl -f json` (its spine cables); repeat",
    )
    plan = d.add_argument_group("addresses the hosts do not report")
    plan.add_argument(
        "--rail-prefix",
        metavar="CIDR",
        help="plan the rail addresses of ports without one in this prefix (the generator's "
        "layout); default: such ports are left out",
    )
    plan.add_argument(
        "--endpoint-prefix",
        metavar="CIDR",
        help="plan GPU endpoints for hosts whose agent has none configured (rail-major); "
        "default: such hosts are left out",
    )
    plan.add_argument(
        "--gpus-per-host",
        type=positive(int, lo=1, hi=64),
        help="GPUs per host for planned endpoints (default: the host's GPU layout, else one "
        "per rail)",
    )
    d.add_argument("--name", default="discovered", help="the fabric's name (default discovered)")
    d.add_argument(
        "-o", "--output", type=Path, help="the fabric file (.json: JSON, else YAML); default stdout"
    )
    d.add_argument(
        "--unknowns",
        type=Path,
        metavar="FILE",
        help="also write what could not be determined as JSON [{host, device, rule, detail}]",
    )

    f = fsub.add_parser(
        "facts",
        help="print this host's discovery document (what an agent publishes for discover)",
        description="Collect what this host reports for `fabric discover`: every RDMA port "
        "with its GUIDs (sysfs), the netdevs with bonds and IPv4 addresses (rtnetlink), "
        "lldpd's neighbours, and the agent's inventory from an agent config. Save one per host "
        "and give them to `fabric discover --facts DIR` where no bus is at hand.",
    )
    f.set_defaults(subparser=f)
    f.add_argument(
        "-c", "--config", type=Path, help="the agent's config (host, sysfs_root, ports, netns)"
    )
    f.add_argument("--host", help="the host name (default: the config's, else this host's)")
    f.add_argument("-o", "--output", type=Path, help="write here instead of stdout")


def _load_facts(paths: list[Path]):
    from linkguard.models import BadMessage, decode
    from linkguard.models.discovery import HostDiscovery

    out: dict[str, HostDiscovery] = {}
    where: dict[str, Path] = {}
    for p in paths:
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for file in files:
            try:
                doc = decode(HostDiscovery, file.read_bytes(), topic=str(file))
            except OSError as exc:
                raise ValueError(f"{file}: cannot read: {exc.strerror or exc}") from None
            except BadMessage as exc:
                raise ValueError(f"{file}: not a discovery document: {exc.detail}") from None
            if doc.host in out:  # a cloned machine, or fabric facts on the system host name
                raise ValueError(
                    f"{file}: host {doc.host!r} again (also in {where[doc.host]}): each host "
                    "name once (set `host:` in the agent config)"
                )
            out[doc.host], where[doc.host] = doc, file
    return out


async def _collect_bus(bus, wait_s: float):
    """Every retained ``hosts/+/discovery`` on the broker of ``bus`` (BusSettings), within
    ``wait_s`` seconds of connecting; bad documents are reported and skipped."""
    import asyncio
    import os
    import secrets

    from linkguard import topics
    from linkguard.bus import Bus
    from linkguard.models import BadMessage, decode
    from linkguard.models.discovery import HostDiscovery

    found: dict[str, HostDiscovery] = {}
    bad: list[str] = []

    async def take(m) -> None:
        parsed = topics.parse(m.topic)
        if parsed is None or parsed.kind != "discovery" or not m.payload:
            return
        try:
            doc = decode(HostDiscovery, m.payload, topic=m.topic, expect_host=parsed.host)
        except BadMessage as exc:
            bad.append(f"{m.topic}: {exc.detail}")
            return
        found[doc.host] = doc

    async with Bus(
        **bus.connection(),
        client_id=f"linkguard-discover-{os.getpid()}-{secrets.token_hex(4)}",
        subscriptions=[topics.all_discovery()],
        handler=take,
        timeout_s=10.0,
    ) as client:
        await client.wait_connected(10.0)
        await asyncio.sleep(wait_s)
    return found, bad


def run(args: argparse.Namespace) -> int:
    """``fabric discover`` / ``fabric facts``."""
    from linkguard.logs import configure_logging

    configure_logging("console", "error")  # stdout carries the document; logs go to stderr
    if args.fabric_command == "facts":
        return _facts(args)
    return _discover(args)


def _facts(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from linkguard.agent.assembly import discover, make_inventory
    from linkguard.agent.discoveryio import collect_discovery
    from linkguard.agent.inventory import InventoryError
    from linkguard.config import AgentSettings, ConfigError, load_settings

    overrides = {"host": args.host} if args.host else {}
    try:
        settings = load_settings(AgentSettings, args.config, **overrides)
    except ConfigError as exc:
        return fail(str(exc), 2)
    try:
        inventory = make_inventory(settings, discover(settings))
    except InventoryError as exc:
        print(f"linkguard: note: no inventory ({exc}); ports still listed", file=sys.stderr)
        inventory = None
    doc = asyncio.run(collect_discovery(settings, inventory, wall=time.time()))
    for line in doc.problems:
        print(f"linkguard: note: {line}", file=sys.stderr)
    return write(args.output, doc.model_dump_json(indent=2) + "\n")


def _discover(args: argparse.Namespace) -> int:
    import asyncio

    from linkguard.drivers.lldp import LldpError, read_lldp_file
    from linkguard.topology.discover import discover_fabric
    from linkguard.topology.export import render
    from linkguard.topology.ibnetdiscover import (
        FabricImportError,
        load_guid_map,
        parse_ibnetdiscover,
    )
    from linkguard.topology.switchgraph import from_ibnetdiscover, from_lldp

    parser = args.subparser
    if not args.facts and args.broker is None and args.config is None:
        parser.error("no host reports: give --broker (or --config) and/or --facts")
    if bool(args.ibnetdiscover) == bool(args.lldp):
        parser.error("give one switch graph: --ibnetdiscover FILE or --lldp")
    if args.guid_map and not args.ibnetdiscover:
        parser.error("--guid-map goes with --ibnetdiscover")
    if args.switch_lldp and not args.lldp:
        parser.error("--switch-lldp goes with --lldp")
    if not args.name.strip() or len(args.name) > 128:
        parser.error("--name: 1 to 128 characters")
    specs = [spec.partition("=") for spec in args.switch_lldp]
    for spec, (name, sep, file) in zip(args.switch_lldp, specs, strict=True):
        if not sep or not name or not file:
            parser.error(f"--switch-lldp {spec!r}: give NAME=FILE")
    try:
        hosts = _load_facts(args.facts)
    except ValueError as exc:
        return fail(str(exc), 2)
    if args.broker is not None or args.config is not None:
        from linkguard.config import ConfigError, ServiceSettings, load_settings

        over = {"bus": {"host": args.broker[0], "port": args.broker[1]}} if args.broker else {}
        try:
            bus = load_settings(ServiceSettings, args.config, **over).bus
        except ConfigError as exc:
            return fail(str(exc), 2)
        where = " or ".join(f"{h}:{p}" for h, p in bus.broker_addresses())
        try:
            found, bad = asyncio.run(_collect_bus(bus, args.wait))
        except (OSError, TimeoutError) as exc:
            return fail(f"cannot read the discovery documents from {where}: {exc}", 1)
        for line in bad:
            print(f"linkguard: warning: skipped {line}", file=sys.stderr)
        print(f"linkguard: note: {len(found)} discovery documents from {where}", file=sys.stderr)
        hosts = {**found, **hosts}  # a file given beside the bus wins
    if not hosts:
        return fail("no discovery document found (are the agents running? --facts?)", 1)
    try:
        if args.ibnetdiscover:
            text = args.ibnetdiscover.read_bytes().decode("utf-8", errors="replace")
            topo = parse_ibnetdiscover(text, source=str(args.ibnetdiscover))
            gmap = load_guid_map(args.guid_map) if args.guid_map else None
            graph = from_ibnetdiscover(topo, gmap)
        else:
            switches = {name: read_lldp_file(file) for name, _, file in specs}
            graph = from_lldp({h: d.lldp for h, d in hosts.items()}, switches)
        result = discover_fabric(
            list(hosts.values()),
            graph,
            name=args.name,
            rail_prefix=args.rail_prefix,
            endpoint_prefix=args.endpoint_prefix,
            gpus_per_host=args.gpus_per_host,
        )
    except OSError as exc:
        return fail(f"cannot read {exc.filename}: {exc.strerror or exc}", 2)
    except (FabricImportError, LldpError, ValueError) as exc:
        return fail(str(exc), 2)
    for line in result.notes:
        print(f"linkguard: note: {line}", file=sys.stderr)
    for line in result.warnings:
        print(f"linkguard: warning: {line}", file=sys.stderr)
    for u in result.unknowns:
        print(f"linkguard: unknown: {u.line()}", file=sys.stderr)
    if args.unknowns is not None:
        rows = [
            {"host": u.host, "device": u.device, "rule": u.rule, "detail": u.detail}
            for u in result.unknowns
        ]
        code = write(args.unknowns, json.dumps(rows, indent=2) + "\n")
        if code:
            return code
    if result.fabric is None:
        return fail(f"no host could be placed ({len(result.unknowns)} unknowns above)", 1)
    fmt = "json" if args.output is not None and args.output.suffix == ".json" else "yaml"
    f = result.fabric
    print(
        f"linkguard: discovered {len(f.hosts)} hosts, {len(f.rails)} rails, "
        f"{len(f.switches)} switches, {len(f.links)} links; {len(result.unknowns)} unknowns",
        file=sys.stderr,
    )
    return write(args.output, render(f, fmt))
