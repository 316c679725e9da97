"""``linkguard fabric generate|show|export|audit`` (``faults``: :mod:`linkguard.cli.faults`):
fabric files from the generator, an ibnetdiscover dump or a file; exit 2 on bad parameters or a
bad fabric, 1 when the output cannot be written (``audit``: or an error-severity finding)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linkguard.cli import discover, faults
from linkguard.cli.common import fail, positive, write

#: Generator options shared by ``fabric generate``/``show``/``export``, with their defaults.
_GENERATOR_DEFAULTS = {
    "hosts": 32,
    "rails": 8,
    "gpus_per_host": None,
    "hosts_per_su": 32,
    "management_hosts_per_su": 0,
    "spines_per_su": 4,
    "core": None,
    "rails_per_pcie_switch": 0,
}


def _add_generator_options(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The rail-optimized generator's parameters. Without ``defaults`` they parse to None when
    absent (``show``/``export`` accept them only with ``--generate``)."""

    def d(name: str):
        return _GENERATOR_DEFAULTS[name] if defaults else None

    g = p.add_argument_group("generator (DGX SuperPOD rail-optimized)")
    g.add_argument(
        "--hosts",
        type=positive(int, lo=1, hi=16384),
        default=d("hosts"),
        help="compute hosts (default 32). Addresses: HCAs in 10.100.0.0/16, GPU endpoints in "
        "10.200.0.0/16, each widened to fit above 8,190 hosts x 8 rails (16,384 hosts: "
        "10.100.0.0/14 and 10.200.0.0/14; agents then need endpoint_prefixes: [10.200.0.0/14])",
    )
    g.add_argument(
        "--rails",
        type=positive(int, lo=1, hi=16),
        default=d("rails"),
        help="rails = compute NICs per host (default 8)",
    )
    g.add_argument(
        "--gpus-per-host", type=positive(int, lo=1, hi=64), default=None, help="default: = rails"
    )
    g.add_argument(
        "--hosts-per-su",
        type=positive(int, lo=1, hi=1024),
        default=d("hosts_per_su"),
        help="node slots per scalable unit (default 32)",
    )
    g.add_argument(
        "--management-hosts-per-su",
        type=positive(int, lo=0, hi=1023),
        default=d("management_hosts_per_su"),
        help="slots per SU left for management, e.g. the UFM appliance (default 0)",
    )
    g.add_argument(
        "--spines-per-su",
        type=positive(int, lo=0, hi=64),
        default=d("spines_per_su"),
        help="spine switches per SU (default 4)",
    )
    g.add_argument(
        "--core",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="core tier above the spines (default: added when two tiers cannot be cabled, i.e. "
        "SUs x spines-per-SU exceeds a leaf's uplinks (max of hosts-per-SU and spines-per-SU): "
        "from 9 SUs at the default sizes; and always from 16 SUs)",
    )
    g.add_argument(
        "--rails-per-pcie-switch",
        type=positive(int, lo=0, hi=64),
        default=d("rails_per_pcie_switch"),
        metavar="K",
        help="put the HCAs of K consecutive rails, and the GPUs homed on them, on one PCIe "
        "switch (pcie0, pcie1, ...; the solver's first preference for alternates), e.g. 2 "
        "for DGX A100-like hosts; with the NUMA split K must divide rails/2 (default 0: no "
        "switch ids)",
    )


def _add_fabric_source(p: argparse.ArgumentParser) -> None:
    """Exactly one fabric source: a fabric file, the generator, or an ibnetdiscover dump."""
    p.set_defaults(subparser=p)  # usage errors found after parsing name the subcommand
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--fabric", type=Path, metavar="FILE", help="fabric file (JSON/YAML)")
    src.add_argument(
        "--ibnetdiscover",
        type=Path,
        metavar="FILE",
        help="import `ibnetdiscover` output (rails inferred from the leaf each HCA hangs off)",
    )
    p.add_argument(
        "--guid-map",
        type=Path,
        metavar="FILE",
        help="with --ibnetdiscover: GUID -> host name map (`H-<guid> <host>` lines, or a "
        'node-name-map\'s `0x<guid> "<host> <device>"`)',
    )
    src.add_argument(
        "--generate",
        action="store_true",
        help="generate a rail-optimized fabric from the generator options below",
    )
    _add_generator_options(p, defaults=False)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    f = sub.add_parser("fabric", help="fabric files")
    fsub = f.add_subparsers(dest="fabric_command", required=True, metavar="SUBCOMMAND")
    _add_generate(fsub)
    _add_show(fsub)
    _add_export(fsub)
    _add_audit(fsub)
    faults.add_parser(fsub)
    discover.add_parsers(fsub)


def _add_generate(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # no ArgumentDefaultsHelpFormatter: the generator options' help already names the defaults
    fg = fsub.add_parser("generate", help="print a rail-optimized fabric (DGX SuperPOD style)")
    _add_generator_options(fg, defaults=True)
    fg.add_argument(
        "--format",
        choices=["json", "yaml"],
        default=None,
        help="default: from the -o suffix (.json, .yaml/.yml), else yaml; a format the suffix "
        "contradicts is refused",
    )
    fg.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    fg.set_defaults(subparser=fg)


def _add_show(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fs = fsub.add_parser(
        "show",
        help="summarize a fabric: hosts, SUs, rails, switches per tier, cables by kind and "
        "rate, a per-SU table and the first hosts",
    )
    _add_fabric_source(fs)
    fs.add_argument(
        "--show-hosts",
        type=positive(int, lo=0, hi=1_000_000),
        default=8,
        metavar="N",
        help="list the first N hosts (default 8, 0: none)",
    )
    fs.add_argument("-o", "--output", type=Path, help="write here instead of stdout")


def _add_export(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fe = fsub.add_parser(
        "export",
        help="write a fabric as JSON, YAML, Graphviz DOT or ibnetdiscover output",
        description="Write a fabric as JSON, YAML, Graphviz DOT or the text `ibnetdiscover` "
        "prints (what --ibnetdiscover and `fabric audit --ibnetdiscover` read). For "
        "ibnetdiscover, --fabric FILE is read as an observed fabric (as `fabric audit --fabric` "
        "reads it): an HCA may be cabled to another rail's leaf, so a dump of a cabling fault "
        "can be written from an edited copy of the expected fabric.",
    )
    _add_fabric_source(fe)
    fe.add_argument(
        "--format",
        choices=["json", "yaml", "dot", "ibnetdiscover"],
        default=None,
        help="default: from the -o suffix (.json, .yaml/.yml, .dot/.gv, .topo), else yaml; a "
        "format the suffix contradicts is refused",
    )
    fe.add_argument(
        "--aggregate",
        action="store_true",
        help="DOT only: one node per (SU, rail) instead of one per host, and one per group of "
        "core switches cabled alike (for big fabrics)",
    )
    fe.add_argument("-o", "--output", type=Path, help="write here instead of stdout")


def _add_audit(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fa = fsub.add_parser(
        "audit",
        help="compare the expected fabric with an ibnetdiscover dump and/or an observed fabric "
        "file: missing or extra cables, wrong rates, HCAs on another rail's leaf, duplicate "
        "GUIDs, hosts that never reported; exit 1 on errors",
        description="Fleet audit: compare the expected fabric (--expected FILE or "
        "--expected-generate) with what was observed (--ibnetdiscover DUMP and/or --fabric FILE).",
        epilog="Offline there are no agents: an expected host 'never reported' when it is absent "
        "from every observed source (with only a dump: the hosts absent from the dump). With "
        "both sources, each is compared and the findings are combined. Exit codes: 0 no "
        "error-severity finding (warnings allowed), 1 at least one error, 2 bad usage or input.",
    )
    fa.set_defaults(subparser=fa)
    want = fa.add_mutually_exclusive_group(required=True)
    want.add_argument(
        "--expected", type=Path, metavar="FILE", help="the expected fabric file (JSON/YAML)"
    )
    want.add_argument(
        "--expected-generate",
        action="store_true",
        help="expect the generator's rail-optimized fabric (generator options below)",
    )
    fa.add_argument(
        "--ibnetdiscover", type=Path, metavar="DUMP", help="observed: `ibnetdiscover` output"
    )
    fa.add_argument(
        "--guid-map",
        type=Path,
        metavar="FILE",
        help="with --ibnetdiscover: GUID -> host name map (`H-<guid> <host>` lines, or a "
        'node-name-map\'s `0x<guid> "<host> <device>"`)',
    )
    fa.add_argument(
        "--fabric",
        type=Path,
        metavar="FILE",
        help="observed: a fabric file (JSON/YAML) as found; unlike an expected one it may cable "
        "an HCA to another rail's leaf (reported as wrong_rail)",
    )
    fa.add_argument("--format", choices=["table", "json"], default="table", help="default: table")
    fa.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    _add_generator_options(fa, defaults=False)


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot express (exit 2 with a message naming the option)."""
    if args.command != "fabric" or args.fabric_command in ("faults", "discover", "facts"):
        return  # see faults.check_usage; discover's are checked in discover.run
    parser = args.subparser
    if args.fabric_command == "generate":
        _check_format_suffix(parser, args, writes=("json", "yaml"))
        return
    is_audit = args.fabric_command == "audit"
    if args.guid_map and not args.ibnetdiscover:
        parser.error("--guid-map goes with --ibnetdiscover")
    if not (args.expected_generate if is_audit else args.generate):
        given = [
            "--" + name.replace("_", "-")
            for name in _GENERATOR_DEFAULTS
            if getattr(args, name) is not None
        ]
        if given:
            flag = "--expected-generate" if is_audit else "--generate"
            parser.error(f"{', '.join(given)}: generator options need {flag}")
    if is_audit:
        if not (args.ibnetdiscover or args.fabric):
            parser.error(
                "nothing observed to audit: give --ibnetdiscover DUMP and/or --fabric FILE"
            )
        return
    if args.fabric_command == "export":
        _check_format_suffix(parser, args, writes=("json", "yaml", "dot", "ibnetdiscover"))
        fmt = _export_format(args)
        if fmt is None:
            parser.error(
                f"cannot tell the format of {args.output} from its suffix: give --format "
                "json, yaml, dot or ibnetdiscover"
            )
        if args.aggregate and fmt != "dot":
            parser.error(f"--aggregate applies to DOT only, not to {fmt}")


def _check_format_suffix(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, writes: tuple[str, ...]
) -> None:
    """``fabric generate|export -o FILE``: exit 2 when ``--format`` contradicts the suffix of
    FILE (YAML into ``x.json``: later loads fail), or without ``--format`` when the suffix
    names a format the subcommand does not write (``writes``)."""
    from linkguard.topology.export import format_from_suffix

    implied = format_from_suffix(args.output) if args.output else None
    if implied is None:
        return
    if args.format and args.format != implied:
        parser.error(
            f"--format {args.format} contradicts -o {args.output}, whose suffix means "
            f"{implied}: make them agree, or leave --format out"
        )
    if implied not in writes:
        parser.error(
            f"-o {args.output}: its suffix means {implied}, but this subcommand writes "
            f"{' or '.join(writes)} (`fabric export` writes {implied})"
        )


def _export_format(args: argparse.Namespace) -> str | None:
    from linkguard.topology.export import format_from_suffix

    if args.format:
        return args.format
    if args.output is None:
        return "yaml"
    return format_from_suffix(args.output)


def _generator_kwargs(args: argparse.Namespace) -> dict:
    """The generator options that were given (absent ones keep the generator's defaults)."""
    return {k: getattr(args, k) for k in _GENERATOR_DEFAULTS if getattr(args, k) is not None}


def run(args: argparse.Namespace) -> int:
    """``fabric generate|show|export``: exit 2 on bad parameters or a bad fabric file, 1 when
    the output cannot be written."""
    from linkguard.logs import configure_logging
    from linkguard.topology.export import render, summary_text
    from linkguard.topology.fabric import FabricError, load_fabric, serving_problems
    from linkguard.topology.generator import generate_rail_optimized

    if args.fabric_command == "faults":
        return faults.run(args)
    if args.fabric_command in ("discover", "facts"):
        return discover.run(args)
    configure_logging("console", "warning")  # stdout carries the fabric; logs go to stderr
    if args.fabric_command == "audit":
        return _audit(args)
    try:
        if args.fabric_command == "generate" or args.generate:
            fabric = generate_rail_optimized(**_generator_kwargs(args))
        elif args.ibnetdiscover:
            from linkguard.topology.ibnetdiscover import import_ibnetdiscover

            imported = import_ibnetdiscover(args.ibnetdiscover, guid_map=args.guid_map)
            fabric = imported.fabric
            for line in imported.notes:
                print(f"linkguard: note: {line}", file=sys.stderr)
            for line in imported.warnings:
                print(f"linkguard: warning: {line}", file=sys.stderr)
        else:  # a dump records what is cabled: read the file as an observed fabric
            dump = args.fabric_command == "export" and _export_format(args) == "ibnetdiscover"
            fabric = load_fabric(args.fabric, observed=dump)
    except (ValueError, FabricError) as exc:  # FabricError is a ValueError; named for clarity
        return fail(str(exc), 2)
    if args.fabric_command == "generate":
        fmt = args.format or ("json" if args.output and args.output.suffix == ".json" else "yaml")
        text = render(fabric, fmt)
    elif args.fabric_command == "show":
        for problem in serving_problems(fabric):  # the service refuses such a fabric
            print(f"linkguard: note: `topology serve` would refuse it: {problem}", file=sys.stderr)
        text = summary_text(fabric, hosts_shown=args.show_hosts)
    else:
        try:
            text = render(fabric, _export_format(args) or "yaml", aggregate=args.aggregate)
        except ValueError as exc:  # ibnetdiscover: a node with more than 255 ports
            return fail(str(exc), 2)
    return write(args.output, text)


def _audit(args: argparse.Namespace) -> int:
    """``fabric audit``: 0 without error findings, 1 with (or when the output cannot be
    written), 2 for a bad expected fabric, dump, GUID map or observed fabric file."""
    from linkguard.topology.audit import audit, format_json, format_table, sort_findings
    from linkguard.topology.fabric import Fabric, load_fabric
    from linkguard.topology.generator import generate_rail_optimized
    from linkguard.topology.ibnetdiscover import import_ibnetdiscover

    observed: list[tuple[Fabric, dict[str, str] | None]] = []
    try:
        if args.expected_generate:
            expected = generate_rail_optimized(**_generator_kwargs(args))
        else:
            expected = load_fabric(args.expected)
        if args.ibnetdiscover:
            imported = import_ibnetdiscover(args.ibnetdiscover, guid_map=args.guid_map)
            for line in imported.warnings:
                print(f"linkguard: warning: {args.ibnetdiscover}: {line}", file=sys.stderr)
            observed.append((imported.fabric, imported.guids))
        if args.fabric:
            observed.append((load_fabric(args.fabric, observed=True), None))
    except ValueError as exc:  # FabricError, FabricImportError, generator parameters
        return fail(str(exc), 2)
    findings = []
    for i, (fabric, guids) in enumerate(observed):
        # with two sources a host in either has reported; host findings come from the first
        others = {h for j, (f, _) in enumerate(observed) if j != i for h in f.host_names}
        found = audit(
            expected,
            observed=fabric,
            observed_guids=guids,
            reported_hosts=others if len(observed) > 1 else None,
            reported_as="the other observed source",
        )
        if i:
            found = [f for f in found if f.kind not in ("missing_host", "unknown_host")]
        findings += found
    findings = sort_findings(findings)
    text = format_json(findings) if args.format == "json" else format_table(findings)
    code = write(args.output, text)
    return code or (1 if any(f.severity == "error" for f in findings) else 0)
