"""The ``linkguard`` command line.

  linkguard quickstart             the whole flow in one process (embedded broker, simulated hosts)
  linkguard agent                  the per-host daemon
  linkguard topology serve         the topology service
  linkguard fabric generate        print a rail-optimized fabric (JSON/YAML)
  linkguard fabric show            summarize a fabric (file or generator): tiers, cables, SUs
  linkguard fabric export          write a fabric as JSON, YAML, Graphviz DOT or ibnetdiscover
  linkguard fabric audit           compare the expected fabric with a dump / an observed fabric
  linkguard fabric faults          publish the switch-level faults (retained) to the service
  linkguard broker                 an embedded MQTT broker on 127.0.0.1
  linkguard sim check              validate scenario files (fabric, fault timeline, expectations)
  linkguard sim run                replay a scenario on a simulated clock and check it (oracle)
  linkguard sim fleet              published failure rates on a generated fleet: cost with/without
  linkguard sim lab                replay a scenario on network namespaces (real kernel, agents)
  linkguard report                 the interruption report of a ledger (text, JSON, CSV)
  linkguard keys generate          the service's Ed25519 key pair for signed plans
  linkguard rails follow           stream this host's rail map from the agent's Unix socket
  linkguard nccl env               NCCL settings for jobs starting now (usable ports, fused NICs)
  linkguard exec -- CMD            run a job's worker with the NCCL settings of this moment
  linkguard layout                 this host's GPU-NIC layout (PCIe switch, NUMA) from sysfs or XML

Exit codes: 0 ok, 1 runtime failure (``fabric audit``: an error-severity finding; ``fabric
faults``: broker unreachable), 2 bad usage or configuration; ``exec``: its own
(:mod:`linkguard.jobenv`: 69 no usable rail, 75 no current plan, else the command's).

``exec`` is dispatched before anything else is imported or built (asyncio, the other
commands' parsers): it runs at every worker start.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from linkguard import __version__

if TYPE_CHECKING:  # the commands import what they run when they run
    from linkguard.simulations.engine import RunReport
    from linkguard.simulations.live import LiveReport

__all__ = ["main"]

_BROKER = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)):"
    r"(?P<port>\d{1,5})$"
)
#: The embedded broker (amqtt) stops delivering reliably beyond this many agents; it is for trials.
QUICKSTART_MAX_HOSTS = 64


def broker_address(text: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[IPv6]:PORT`` (argparse type; ValueError on anything else)."""
    m = _BROKER.match(text)
    port = int(m["port"]) if m else 0
    if not m or not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be HOST:PORT or [IPV6]:PORT with port 1-65535, got {text!r}"
        )
    return (m["v6"] or m["host"], port)


def _positive(kind: type, *, lo: float, hi: float):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not lo <= v <= hi:
            show = str if kind is int else "{:g}".format  # 1000000, not 1e+06
            raise argparse.ArgumentTypeError(
                f"must be between {show(lo)} and {show(hi)}, got {text}"
            )
        return v

    return parse


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


#: ``--transport`` choices: one transport, or ``all`` (linkguard.jobcost.TRANSPORTS)
TRANSPORT_CHOICES = ("ip", "nccl-ib", "nccl-ib-failover", "all")


def _ip_stall_file(text: str) -> tuple[float, str]:
    """``--ip-stall-from FILE`` (argparse type): the lab job benchmark's JSON
    (:func:`linkguard.failuremodel.ip_stall_from_json`) -> (seconds, source note)."""
    from linkguard.failuremodel import ip_stall_from_json

    try:
        data = Path(text).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc}") from None
    try:
        return ip_stall_from_json(data, source=text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_transport_args(p: argparse.ArgumentParser) -> None:
    """``--transport``, ``--ip-stall-from`` / ``--ip-stall-ms`` of ``sim fleet`` and ``report``."""
    from linkguard.failuremodel import IP_STALL_MAX_MS

    p.add_argument(
        "--transport",
        choices=TRANSPORT_CHOICES,
        default="all",
        help="the job's transport to price outages for: ip (Gloo, NCCL's socket transport, "
        "IPoIB: a reroute moves it), nccl-ib (NCCL's IB transport: queue pairs stay on their "
        "port), nccl-ib-failover (NCCL >= 2.29.7 fused NICs), or all (default: a table each)",
    )
    stall = p.add_mutually_exclusive_group()
    stall.add_argument(
        "--ip-stall-from",
        type=_ip_stall_file,
        metavar="FILE",
        help="the ip transport's stall per rerouted outage from the lab job benchmark's JSON "
        '(benchmarks/job_stall.py): {"with_linkguard": {"stall_ms": {"p99": MS}}}',
    )
    stall.add_argument(
        "--ip-stall-ms",
        type=_positive(float, lo=0, hi=IP_STALL_MAX_MS),
        metavar="MS",
        help="the ip transport's stall per rerouted outage, in ms (default: "
        "linkguard.failuremodel.IP_STALL_S)",
    )


class _ModelOverrides(TypedDict, total=False):
    ip_stall_s: float
    ip_stall_source: str


def _model_overrides(args: argparse.Namespace) -> _ModelOverrides:
    """The job model fields ``--ip-stall-from`` / ``--ip-stall-ms`` set."""
    if args.ip_stall_from is not None:
        seconds, source = args.ip_stall_from
        return {"ip_stall_s": seconds, "ip_stall_source": source}
    if args.ip_stall_ms is not None:
        return {"ip_stall_s": args.ip_stall_ms / 1000, "ip_stall_source": "--ip-stall-ms"}
    return {}


def _transports(args: argparse.Namespace) -> tuple[str, ...]:
    from linkguard.jobcost import TRANSPORTS

    return TRANSPORTS if args.transport == "all" else (args.transport,)


def _cable(text: str):
    """``A,B`` or ``A,B,COUNT`` -> a :class:`~linkguard.models.CableRef` (argparse type)."""
    from pydantic import ValidationError

    from linkguard.models import CableRef

    parts = [x.strip() for x in text.split(",")]
    if len(parts) not in (2, 3) or not all(parts):
        raise argparse.ArgumentTypeError(
            f"must be A,B or A,B,COUNT (two switch names, optionally a count), got {text!r}"
        )
    if len(parts) == 3 and not parts[2].isdigit():
        raise argparse.ArgumentTypeError(f"COUNT must be a whole number >= 1, got {parts[2]!r}")
    try:
        return CableRef(a=parts[0], b=parts[1], count=int(parts[2]) if len(parts) == 3 else None)
    except ValidationError as exc:
        options = {"a": "switch", "b": "switch", "count": "COUNT"}
        raise argparse.ArgumentTypeError(f"{text!r}: {_first_error(exc, options)}") from None


def _first_error(exc, options: dict[str, str] | None = None) -> str:
    """The first error of a pydantic ``ValidationError`` as a command-line message: the
    option (``options`` maps field names to options), the value when short, what is wrong."""
    e = exc.errors()[0]
    field = str(e["loc"][0]) if e["loc"] else ""
    where = (options or {}).get(field, field)
    value = e.get("input")
    if where and isinstance(value, str) and len(value) <= 60:
        where += f" {value!r}"
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "string_pattern_mismatch":
        msg = "a switch name is letters, digits, '.', '_' and '-', starting with a letter or digit"
    return f"{where}: {msg}" if where else msg


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c",
        "--config",
        type=Path,
        help="YAML config file (LINKGUARD_* environment variables override it)",
    )
    p.add_argument("--log-format", choices=["json", "console"], help="default: json")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    p.add_argument(
        "--broker",
        metavar="HOST:PORT",
        type=broker_address,
        help="MQTT broker (default 127.0.0.1:1883)",
    )


def _overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.log_format:
        out["log_format"] = args.log_format
    if args.log_level:
        out["log_level"] = args.log_level
    if args.broker:
        out["bus"] = {"host": args.broker[0], "port": args.broker[1]}
    return out


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
        type=_positive(int, lo=1, hi=16384),
        default=d("hosts"),
        help="compute hosts (default 32)",
    )
    g.add_argument(
        "--rails",
        type=_positive(int, lo=1, hi=16),
        default=d("rails"),
        help="rails = compute NICs per host (default 8)",
    )
    g.add_argument(
        "--gpus-per-host", type=_positive(int, lo=1, hi=64), default=None, help="default: = rails"
    )
    g.add_argument(
        "--hosts-per-su",
        type=_positive(int, lo=1, hi=1024),
        default=d("hosts_per_su"),
        help="node slots per scalable unit (default 32)",
    )
    g.add_argument(
        "--management-hosts-per-su",
        type=_positive(int, lo=0, hi=1023),
        default=d("management_hosts_per_su"),
        help="slots per SU left for management, e.g. the UFM appliance (default 0)",
    )
    g.add_argument(
        "--spines-per-su",
        type=_positive(int, lo=0, hi=64),
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
        type=_positive(int, lo=0, hi=64),
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


def _check_fabric_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors argparse cannot express (exit 2 with a message naming the option)."""
    if args.command != "fabric" or args.fabric_command == "faults":  # see _check_faults_usage
        return
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


def _check_faults_usage(args: argparse.Namespace) -> None:
    """``fabric faults``: build the FabricFaults to publish into ``args.faults``; exit 2 (with
    the subcommand's usage) when the options do not make one."""
    if args.command != "fabric" or args.fabric_command != "faults":
        return
    import time

    from pydantic import ValidationError

    from linkguard.models import FabricFaults

    parser = args.subparser
    given = bool(args.switch_down or args.cable_down)
    if args.clear and given:
        parser.error("--clear publishes an empty set: give it without --switch-down/--cable-down")
    if not args.clear and not given:
        parser.error(
            "nothing to publish: give every --switch-down/--cable-down that is down now (the "
            "set replaces the previous one), or --clear when nothing is"
        )
    try:
        args.faults = FabricFaults(
            switches_down=args.switch_down,
            cables_down=args.cable_down,
            reason=args.reason,
            at=time.time(),
        )
    except ValidationError as exc:
        options = {"switches_down": "--switch-down", "reason": "--reason"}
        parser.error(_first_error(exc, options))


def _export_format(args: argparse.Namespace) -> str | None:
    from linkguard.topology.export import format_from_suffix

    if args.format:
        return args.format
    if args.output is None:
        return "yaml"
    return format_from_suffix(args.output)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(
        prog="linkguard",
        description="Keep multi-node GPU training running when an IB/RoCE link fails or flaps.",
    )
    parser.add_argument("--version", action="version", version=f"linkguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    q = sub.add_parser(
        "quickstart",
        formatter_class=fmt,
        help="run broker, service and simulated agents; take a link down and "
        "back; print what moved and how long it took",
    )
    q.add_argument(
        "--hosts",
        type=_positive(int, lo=2, hi=QUICKSTART_MAX_HOSTS),
        default=4,
        help=f"hosts in the generated fabric (2-{QUICKSTART_MAX_HOSTS})",
    )
    q.add_argument(
        "--rails", type=_positive(int, lo=2, hi=16), default=4, help="rails (NICs) per host"
    )
    q.add_argument(
        "--hold-down",
        type=_positive(float, lo=0.1, hi=60),
        default=2.0,
        help="hold-down before a returning link is reused (s)",
    )
    q.add_argument(
        "--rail",
        type=_positive(int, lo=0, hi=15),
        default=1,
        help="rail of the first host that fails",
    )
    q.add_argument("-v", "--verbose", action="store_true", help="show the daemons' logs")
    q.set_defaults(subparser=q)  # usage errors found after parsing name the subcommand

    a = sub.add_parser("agent", help="per-host agent: watch ports, publish states, apply plans")
    _add_common(a)
    a.add_argument("--host", type=_nonempty, help="host name (default: the system host name)")
    a.add_argument("--driver", choices=["sysfs", "netlink"], help="port driver (default sysfs)")
    a.add_argument(
        "--netns", type=_nonempty, help="network namespace of the netdevs and routes (labs)"
    )

    t = sub.add_parser("topology", help="the topology service")
    tsub = t.add_subparsers(dest="topology_command", required=True, metavar="SUBCOMMAND")
    ts = tsub.add_parser("serve", help="hold the fabric, compute and publish plans")
    _add_common(ts)
    ts.add_argument(
        "--fabric",
        type=Path,
        help="fabric file (JSON/YAML), e.g. from `linkguard fabric generate`; replaces the "
        "config's fabric:, and is an error (exit 2) when the config has generate: instead",
    )

    f = sub.add_parser("fabric", help="fabric files")
    fsub = f.add_subparsers(dest="fabric_command", required=True, metavar="SUBCOMMAND")
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

    fs = fsub.add_parser(
        "show",
        help="summarize a fabric: hosts, SUs, rails, switches per tier, cables by kind and "
        "rate, a per-SU table and the first hosts",
    )
    _add_fabric_source(fs)
    fs.add_argument(
        "--show-hosts",
        type=_positive(int, lo=0, hi=1_000_000),
        default=8,
        metavar="N",
        help="list the first N hosts (default 8, 0: none)",
    )
    fs.add_argument("-o", "--output", type=Path, help="write here instead of stdout")

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

    fault = fsub.add_parser(
        "faults",
        help="publish the switch-level faults known now (switches and switch-to-switch cables "
        "down) to the topology service",
        description="Publish the complete set of switch-level faults known now, retained (QoS 1) "
        "on linkguard/v1/fabric/faults. Each publish replaces the previous set: list everything "
        "that is still down; --clear publishes an empty set (all repaired). With --fabric FILE, "
        "or a --config whose fabric: or generate: names the service's fabric, the names are "
        "checked here first. The topology service checks them too: it refuses a "
        "whole set that names an unknown switch or a cable its fabric does not have (the "
        "previous set stays in effect and is published back on the topic; the refusal shows as "
        "'refused' in the health) and keeps the resulting health (leaves cut off, uplink "
        "capacity, bisection, degraded rails) retained on linkguard/v1/service/health.",
        epilog="Example: linkguard fabric faults --broker mqtt:1883 --fabric fabric.yaml "
        "--switch-down su3-spine1 --cable-down su0-leaf2,su0-spine0,2 --reason CHG-1234. Exit "
        "codes: 0 published, 1 broker unreachable or publish not confirmed, 2 bad usage or "
        "configuration, or a name the fabric (--fabric, else the config's) does not have.",
    )
    fault.set_defaults(subparser=fault)
    fault.add_argument(
        "-c",
        "--config",
        type=Path,
        help="the topology service's YAML config: its bus section (broker, credentials) is "
        "used, and its fabric (fabric: or generate:) to check the names as --fabric does; "
        "LINKGUARD_* variables override it",
    )
    fault.add_argument(
        "--broker",
        metavar="HOST:PORT",
        type=broker_address,
        help="MQTT broker (default: the config's, else 127.0.0.1:1883)",
    )
    fault.add_argument(
        "--switch-down",
        action="append",
        default=[],
        metavar="NAME",
        help="a switch that is down (repeat for several)",
    )
    fault.add_argument(
        "--cable-down",
        action="append",
        default=[],
        type=_cable,
        metavar="A,B[,COUNT]",
        help="cables down between switches A and B, either order: all of them, or COUNT of "
        "the parallel cables there (repeat for other pairs; each pair once)",
    )
    fault.add_argument("--reason", help="why, up to 200 characters (e.g. a ticket)")
    fault.add_argument(
        "--clear", action="store_true", help="publish an empty set: nothing is down any more"
    )
    fault.add_argument(
        "--fabric",
        type=Path,
        metavar="FILE",
        help="the service's fabric file (JSON/YAML): check every switch and cable against it "
        "before publishing, as the service does (a name it lacks: exit 2, nothing published); "
        "given with --config, this file is checked, not the config's fabric",
    )
    fault.add_argument(
        "--timeout",
        type=_positive(float, lo=0.1, hi=300),
        default=5.0,
        metavar="S",
        help="give up when the broker does not answer within S seconds (default 5; a refused "
        "connection fails at once)",
    )

    b = sub.add_parser(
        "broker", formatter_class=fmt, help="embedded MQTT broker (amqtt) for single-machine trials"
    )
    b.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    b.add_argument("--port", type=_positive(int, lo=1, hi=65535), default=1883)
    b.add_argument("--log-format", choices=["json", "console"], default="console")

    nc = sub.add_parser("nccl", help="NCCL settings for jobs from the host's current plan")
    ncsub = nc.add_subparsers(dest="nccl_command", required=True, metavar="SUBCOMMAND")
    ne = ncsub.add_parser(
        "env",
        help="NCCL_IB_HCA of the usable ports (and the fused-NIC failover settings)",
        description="Print the NCCL settings for jobs starting now on a host: NCCL_IB_HCA "
        "with the usable ports only (held-down, suppressed, down and degraded ones left out; "
        "exact names, =mlx5_0:1,...), NCCL_TOPO_FILE when the agent renders one, or with "
        "--profile failover the fused-NIC layout for NCCL >= 2.29.7's port failover. Without "
        "--host: what this host's agent wrote next to its rail map (nccl.json). With --host: "
        "rendered from the topology service's API (its plan and port states of that host).",
        epilog="Exit codes: 0 done, 1 nothing rendered yet, no agent running (its files may "
        "be stale: --allow-stale) or the service unreachable, 2 bad "
        "arguments or configuration, an unknown host. Warnings (a fused NIC that already lost "
        "a port) go to stderr with --format env/shell. Use: set -a; . /run/linkguard/nccl.env; "
        'or eval "$(linkguard nccl env --format shell)".',
    )
    ne.add_argument(
        "-c", "--config", type=Path, help="the agent's YAML config (where its files are)"
    )
    ne.add_argument("--host", type=_nonempty, help="ask the topology service about host H")
    ne.add_argument(
        "--api",
        default="http://127.0.0.1:8470",
        metavar="URL",
        help="the topology service's API (with --host; default http://127.0.0.1:8470)",
    )
    ne.add_argument("--format", choices=["env", "json", "shell"], default="env")
    ne.add_argument(
        "--profile",
        choices=["plain", "failover"],
        default="plain",
        help="plain: NCCL_IB_HCA (+ NCCL_TOPO_FILE); failover: fused NICs with port failover",
    )
    ne.add_argument(
        "--allow-stale",
        action="store_true",
        help="print the agent's files though no agent holds agent.lock (the agent is not "
        "running: they may name a lost rail; without this, exit 1 as linkguard exec's 75)",
    )

    from linkguard.jobenv import add_arguments as exec_arguments

    ex = sub.add_parser(
        "exec",
        help="run a job's worker with the host's NCCL settings of this moment (usable rails)",
    )
    exec_arguments(ex)

    lay = sub.add_parser(
        "layout",
        help="this host's GPU-NIC layout: PCIe switch, NUMA node, nearest NICs",
        description="Print which NIC sits near which GPU on this host, read from the PCI "
        "sysfs tree (ROOT/bus/pci/devices) or from an NCCL topology file (NCCL_TOPO_FILE "
        "XML): each GPU with its PCI bus id, NUMA node and PCIe switch, and every NIC nearest "
        "first with its affinity (switch: same PCIe switch; numa: same NUMA node; any). "
        "--format fabric prints the host entry's pcie_switch per HCA and gpu_pcie_switch "
        "(YAML) to paste into a fabric file.",
        epilog="Exit codes: 0 printed, 1 no GPU found (no layout to print), 2 an NCCL "
        "topology file that cannot be read or used.",
    )
    lay.add_argument(
        "--sysfs",
        type=Path,
        default=Path("/"),
        metavar="ROOT",
        help="root the PCI tree is read under: ROOT/sys/bus/pci/devices, or ROOT/bus/pci/"
        "devices when ROOT is a sysfs mount (default /)",
    )
    lay.add_argument(
        "--nccl-topo", type=Path, metavar="FILE", help="read an NCCL topology XML instead"
    )
    lay.add_argument("--format", choices=["text", "json", "fabric"], default="text")

    k = sub.add_parser("keys", help="signing keys for plans (Ed25519)")
    ksub = k.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    kg = ksub.add_parser(
        "generate",
        help="write the service's key pair: service.key (0600) and service.pub",
        description="Write a new Ed25519 key pair for signed plans: DIR/service.key (PEM PKCS "
        "#8, mode 0600: the service's signing_key) and DIR/service.pub (PEM: every agent's "
        "service_public_key). Prints the paths and the key id.",
        epilog="Exit codes: 0 written, 1 DIR cannot be written, 2 a key file exists already "
        "(nothing written; --force replaces both).",
    )
    kg.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write")
    kg.add_argument("--force", action="store_true", help="replace an existing key pair")

    ra = sub.add_parser("rails", help="this host's rail map, from the agent's local socket")
    rasub = ra.add_subparsers(dest="rails_command", required=True, metavar="SUBCOMMAND")
    rf = rasub.add_parser(
        "follow",
        help="print the current rail map, then every change, one JSON line each",
        description="Connect to the agent's rails_socket (linkguard.agent.localsub; no broker "
        "credentials needed, only access to the socket: mode 0660, rails_socket_group) and "
        "print what it sends: the current rail map, then each change as it happens, one "
        'linkguard.rail-change/v1 JSON document per line ("kind": current / change / error).',
        epilog="Exit codes: 0 after --count lines, 1 the agent closed the connection or cut "
        "this reader for falling behind (reconnect to resume), 2 no socket there or no "
        "permission, or a bad configuration.",
    )
    rf.add_argument("--socket", type=Path, metavar="PATH", help="default: the config's")
    rf.add_argument("-c", "--config", type=Path, help="the agent's YAML config (rails_socket)")
    rf.add_argument(
        "--count",
        type=_positive(int, lo=1, hi=10**9),
        metavar="N",
        help="stop after N lines (1: just the current rail map)",
    )

    sim = sub.add_parser("sim", help="fault-injection simulations driven by scenario files")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")
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
        type=_positive(int, lo=0, hi=1_000_000),
        default=5,
        metavar="N",
        help="list the first N events of each (default 5, 0: none)",
    )
    sr = simsub.add_parser(
        "run",
        help="replay a scenario through the real monitor and solver on a simulated clock",
        description="Replay a scenario deterministically, without bus or threads: the real "
        "port monitor per host, the real service state and solver (solves scheduled by the "
        "service's RFC 8405 back-off, plans applied at once), the oracle after every solve. "
        "Prints solves, plans per host, reroute times, re-admissions, oracle mismatches and "
        "which `expect` held. Broker, service and agent outages are modelled: nothing reaches "
        "the service or the agents while away, the latest states once back. With "
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
        "with linkguard, then without (static routes), one lab after the other.",
        epilog="Exit codes: 0 passed (--no-linkguard: the run completed), 1 an oracle mismatch, "
        "a failed expectation (max_reroute_ms applies to the data-plane gap) or a process that "
        "died, 2 not root, not a valid scenario or a scenario the lab cannot build.",
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
        type=_positive(int, lo=2, hi=16384),
        default=2048,
        help="hosts in the generated fabric (2-16384, default 2048: one job needs a peer; "
        "hosts x rails <= 131,072 ports)",
    )
    sf.add_argument(
        "--rails",
        type=_positive(int, lo=1, hi=64),
        default=8,
        help="rails (compute NICs) per host (default 8)",
    )
    sf.add_argument(
        "--days",
        type=_positive(float, lo=0.001, hi=366),
        default=30.0,
        help="simulated days (default 30)",
    )
    sf.add_argument(
        "--seed",
        type=_positive(int, lo=0, hi=2**63 - 1),
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
    _add_transport_args(sf)
    rp = sub.add_parser(
        "report",
        help="the interruption report of a ledger: cost with/without linkguard, worst links",
        description="Read a ledger (the topology service's, `ledger.path`, or one written by "
        "`sim fleet --ledger`) and report over a time window: interruptions per 1,000 "
        "GPU-days next to Meta's published rate (Llama 3: 419 in 54 days on 16,384 GPUs), "
        "link-caused interruptions avoided, idled GPU-hours with and without linkguard, "
        "GPU-hours and money saved per transport (--transport), reroutes, worst links, "
        "per-rail and per-leaf tables. The cost model is the fleet simulator's "
        "(linkguard.jobcost), with the newest run's job model.",
        epilog="Exit codes: 0 done, 1 the output could not be written, 2 bad arguments, no "
        "run in the window, or a missing, empty, unreadable, corrupted or newer-schema ledger. "
        "The ledger is opened read-only: the report never creates or changes a file.",
    )
    rp.add_argument("--ledger", type=Path, required=True, metavar="PATH", help="the ledger file")
    rp.add_argument("--format", choices=["text", "json", "csv"], default="text")
    rp.add_argument(
        "--price-per-gpu-hour",
        type=_positive(float, lo=0, hi=1e6),
        default=2.0,
        metavar="X",
        help="what an idle GPU-hour costs (default 2.0)",
    )
    rp.add_argument(
        "--since",
        type=_time,
        metavar="TIME",
        help="window start: ISO 8601 (2023-11-20, 2023-11-20T12:00:00Z; UTC unless a zone is "
        "given) or Unix seconds with at least 9 digits or a decimal point (1700000000; a "
        "bare 20231120 is refused as ambiguous); default the ledger's first run. The window "
        "is clamped to what the ledger recorded",
    )
    rp.add_argument(
        "--until",
        type=_time,
        metavar="TIME",
        help="window end (exclusive), as --since; default the ledger's last record (now while "
        "a service is recording)",
    )
    rp.add_argument("--out", type=Path, metavar="F", help="write to F instead of stdout")
    _add_transport_args(rp)
    return parser


def _time(text: str) -> float:
    """``--since`` / ``--until`` (argparse type): :func:`linkguard.ledger.parse_time`."""
    from linkguard.ledger import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:  # every worker start: no other command's parser or imports
        from linkguard.jobenv import main as exec_main

        return exec_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "quickstart" and args.rail >= args.rails:
        args.subparser.error(
            f"--rail {args.rail} is not one of the {args.rails} rails (0-{args.rails - 1})"
        )
    _check_fabric_usage(parser, args)
    _check_faults_usage(args)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return 130


def _fail(msg: str, code: int) -> int:
    print(f"linkguard: {msg}", file=sys.stderr)
    return code


def _dispatch(args: argparse.Namespace) -> int:
    import asyncio

    from linkguard.agent.inventory import InventoryError
    from linkguard.config import ConfigError
    from linkguard.drivers.netlink import NetnsNotFoundError
    from linkguard.logs import configure_logging
    from linkguard.topology.fabric import FabricError

    if args.command == "quickstart":
        from linkguard.quickstart import run_quickstart

        configure_logging("console", "info" if args.verbose else "warning")
        try:
            asyncio.run(
                run_quickstart(
                    hosts=args.hosts,
                    rails=args.rails,
                    hold_down_s=args.hold_down,
                    victim_rail=args.rail,
                    out=sys.stdout,
                )
            )
        except TimeoutError as exc:
            return _fail(f"quickstart failed: {exc}", 1)
        return 0

    simple = {
        "fabric": _fabric,
        "broker": _broker,
        "report": _report,
        "nccl": _nccl_env,
        "keys": _keys,
        "layout": _layout,
        "rails": _rails_follow,
    }
    if args.command in simple:
        return simple[args.command](args)

    if args.command == "sim":
        handler = {"run": _sim_run, "fleet": _sim_fleet, "lab": _sim_lab}.get(
            args.sim_command, _sim_check
        )
        return handler(args)

    from linkguard.drivers.routes import NotPermittedError
    from linkguard.presence import DuplicateInstanceError

    user_errors = (ConfigError, FabricError, InventoryError, NetnsNotFoundError, NotPermittedError)
    try:
        return _daemon(args)
    except Exception as exc:
        # a daemon's task group wraps errors in an ExceptionGroup: unwrap the known ones
        group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("", [exc])
        for kinds, code in ((user_errors, 2), (DuplicateInstanceError, 1)):
            mine, rest = group.split(kinds)
            if mine is not None and rest is None:
                return _fail("; ".join(str(e) for e in _leaves(mine)), code)
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def _daemon(args: argparse.Namespace) -> int:
    """``agent`` and ``topology serve``: settings, logging, run until SIGTERM."""
    import asyncio

    from linkguard.config import AgentSettings, ServiceSettings, load_settings
    from linkguard.logs import configure_logging

    overrides = _overrides(args)
    if args.command == "agent":
        from linkguard.agent.daemon import run_agent

        for name in ("host", "driver", "netns"):
            if getattr(args, name):
                overrides[name] = getattr(args, name)
        settings = load_settings(AgentSettings, args.config, **overrides)
        configure_logging(settings.log_format, settings.log_level)
        asyncio.run(run_agent(settings))
        return 0
    from linkguard.topology.service import run_service

    if args.fabric:  # replaces the config's fabric:; with its generate: ServiceSettings refuses
        overrides["fabric"] = args.fabric
    service_settings = load_settings(ServiceSettings, args.config, **overrides)
    configure_logging(service_settings.log_format, service_settings.log_level)
    asyncio.run(run_service(service_settings))
    return 0


def _generator_kwargs(args: argparse.Namespace) -> dict:
    """The generator options that were given (absent ones keep the generator's defaults)."""
    return {k: getattr(args, k) for k in _GENERATOR_DEFAULTS if getattr(args, k) is not None}


def _fabric(args: argparse.Namespace) -> int:
    """``fabric generate|show|export``: exit 2 on bad parameters or a bad fabric file, 1 when
    the output cannot be written."""
    from linkguard.logs import configure_logging
    from linkguard.topology.export import render, summary_text
    from linkguard.topology.fabric import FabricError, load_fabric, serving_problems
    from linkguard.topology.generator import generate_rail_optimized

    if args.fabric_command == "faults":
        return _faults(args)
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
        return _fail(str(exc), 2)
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
            return _fail(str(exc), 2)
    return _write(args.output, text)


def _layout(args: argparse.Namespace) -> int:
    """``layout``: the host layout (:mod:`linkguard.layout`) as text, JSON or a fabric-file
    fragment; exit 1 without GPUs, 2 for an NCCL file that cannot be used."""
    from linkguard.layout import LayoutError
    from linkguard.layoutview import fabric_fragment, layout_document, layout_text

    if args.nccl_topo is not None:
        from linkguard.layout import load_nccl_topo

        try:
            layout = load_nccl_topo(args.nccl_topo)
        except LayoutError as exc:
            return _fail(str(exc), 2)
    else:
        from linkguard.drivers.pci import read_pci_layout
        from linkguard.logs import configure_logging

        configure_logging("console", "error")  # unreadable values are listed in the output
        root = args.sysfs
        if not (root / "bus" / "pci").is_dir() and (root / "sys" / "bus" / "pci").is_dir():
            root = root / "sys"
        layout = read_pci_layout(root)
    if not layout.gpus:
        where = layout.source or str(args.sysfs)
        return _fail(
            f"no GPU found in {where} ({len(layout.nics)} RDMA NIC(s)): nothing to lay out; "
            "give --nccl-topo FILE or --sysfs ROOT of a GPU host",
            1,
        )
    if args.format == "json":
        import json

        text = json.dumps(layout_document(layout), indent=1) + "\n"
    elif args.format == "fabric":
        import yaml

        try:
            text = yaml.safe_dump(fabric_fragment(layout), sort_keys=False)
        except LayoutError as exc:
            return _fail(str(exc), 2)
    else:
        text = layout_text(layout)
    sys.stdout.write(text)
    return 0


def _write(output: Path | None, text: str) -> int:
    """``text`` to ``output`` or stdout; 0, or 1 when the file cannot be written."""
    if not output:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        return _fail(f"cannot write {output}: {exc.strerror or exc}", 1)
    return 0


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
        return _fail(str(exc), 2)
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
    code = _write(args.output, text)
    return code or (1 if any(f.severity == "error" for f in findings) else 0)


def _faults(args: argparse.Namespace) -> int:
    """``fabric faults``: publish ``args.faults`` retained; 0 once the broker confirmed it, 1
    when it cannot be reached or does not confirm, 2 for a bad config, a bad fabric or a name
    that fabric does not have (checked as the service checks it:
    :meth:`~linkguard.topology.state.FabricState.assess_faults`). The fabric: ``--fabric``,
    else the config's (``fabric:`` or ``generate:``, as the service would load it), else
    none (names unchecked)."""
    import asyncio

    from linkguard import topics
    from linkguard.config import ConfigError, ServiceSettings, load_settings
    from linkguard.logs import configure_logging
    from linkguard.models import encode

    overrides = {"bus": {"host": args.broker[0], "port": args.broker[1]}} if args.broker else {}
    try:
        settings = load_settings(ServiceSettings, args.config, **overrides)
    except ConfigError as exc:
        return _fail(str(exc), 2)
    bus = settings.bus
    if args.fabric is not None or settings.fabric is not None or settings.generate is not None:
        from linkguard.topology.fabric import load_fabric
        from linkguard.topology.service import fabric_from_settings
        from linkguard.topology.state import FabricState

        # --fabric FILE wins over the config's fabric, as --broker over its broker
        source = (
            f"--fabric {args.fabric}"
            if args.fabric
            else f"the fabric of {args.config or 'the LINKGUARD_* settings'}"
        )
        try:
            fabric = load_fabric(args.fabric) if args.fabric else fabric_from_settings(settings)
            FabricState(fabric=fabric, epoch_start=0).assess_faults(args.faults)
        except ValueError as exc:  # a bad file (FabricError) or a name the fabric lacks
            return _fail(f"{exc} (checked against {source}); nothing published", 2)
    # the bus logs every failed connection attempt; one message below says it once
    configure_logging("console", "error")
    where = " or ".join(f"{h}:{p}" for h, p in bus.broker_addresses())
    topic = topics.fabric_faults()
    try:
        confirmed = asyncio.run(
            _publish_retained(bus, topic, encode(args.faults), timeout=args.timeout)
        )
    except TimeoutError as exc:  # before OSError: it is one
        from linkguard.bus import BusConnectTimeout

        if isinstance(exc, BusConnectTimeout) and exc.refused:  # bad credentials, TLS failed
            return _fail(
                f"the MQTT broker at {where} refused the connection: {exc.error}: {exc.hint} "
                "(see the bus section of --config); nothing published",
                1,
            )
        return _fail(
            f"cannot reach the MQTT broker at {where} within {args.timeout:g} s (is it running? "
            "see --broker, or the bus section of --config); nothing published",
            1,
        )
    except OSError as exc:  # refused, unreachable network, unknown host name: no retrying
        why = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
        return _fail(
            f"cannot reach the MQTT broker at {where}: {why} (is it running? see --broker, or "
            "the bus section of --config); nothing published",
            1,
        )
    if not confirmed:
        return _fail(f"the broker at {where} did not confirm the publish on {topic}", 1)
    f = args.faults
    what = (
        "no faults (cleared)"
        if args.clear
        else f"{len(f.switches_down)} switch(es) down, cables down between "
        f"{len(f.cables_down)} switch pair(s)"
    )
    print(f"published to {topic} on {where} (retained): {what}")
    return 0


async def _publish_retained(bus, topic: str, payload: bytes, *, timeout: float) -> bool:
    """Connect to the broker of ``bus`` (BusSettings), publish ``payload`` retained with QoS 1,
    disconnect. True once the broker acknowledged it. Raises TimeoutError when the broker does
    not answer within ``timeout`` seconds, and OSError at once when its address refuses the
    connection (ConnectionRefusedError), cannot be reached or does not resolve."""
    import asyncio
    import os
    import secrets

    from linkguard.bus import Bus

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    # the bus retries a refused connection until the timeout: one plain TCP connection first
    # makes "nothing listens there" fail at once (an unresponsive broker still times out);
    # with a broker list, the first that accepts will do
    addresses = bus.broker_addresses()
    for i, (host, port) in enumerate(addresses):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except OSError:
            if i == len(addresses) - 1:
                raise
            continue
        writer.close()
        break
    async with Bus(
        **bus.connection(),
        client_id=f"linkguard-cli-{os.getpid()}-{secrets.token_hex(4)}",
        timeout_s=timeout,
    ) as client:
        await client.wait_connected(max(deadline - loop.time(), 0.01))
        return await client.publish(topic, payload, retain=True)


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
            code = _fail(str(exc), 2)
            continue
        except ValueError as exc:
            code = _fail(f"{path}: {exc}", 2)
            continue
        sys.stdout.write(summary_text(loaded, expand(loaded), first=args.events))
    return code


def _sim_run(args: argparse.Namespace) -> int:
    """``sim run``: replay one scenario (:func:`linkguard.simulations.engine.run`), print the
    report (text or JSON); 0 passed, 1 failed, 2 not a valid scenario."""
    import asyncio

    from linkguard.simulations.engine import run
    from linkguard.simulations.scenario import ScenarioError, load_scenario

    try:
        loaded = load_scenario(args.file)
    except ScenarioError as exc:
        return _fail(str(exc), 2)
    report: RunReport | LiveReport
    if args.bus == "model":
        report = run(loaded)
    else:
        from linkguard.logs import configure_logging
        from linkguard.simulations import live

        _quiet_sim_logging(configure_logging)
        try:
            report = asyncio.run(live.run(loaded, bus=args.bus))
        except (OSError, ImportError, TimeoutError) as exc:
            return _fail(f"sim run --bus {args.bus}: {exc}", 1)
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
    import asyncio
    import json
    import signal

    from linkguard.logs import configure_logging
    from linkguard.simulations.lab import LabError
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
        return _fail(str(exc), 2)
    if args.no_linkguard and args.skip_baseline:
        return _fail("--no-linkguard runs only the baseline, --skip-baseline skips it", 2)
    if args.workdir is not None:  # before any namespace exists: a clear error, nothing built
        try:
            args.workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _fail(f"--workdir {args.workdir}: {exc.strerror or exc}", 2)
    _quiet_sim_logging(configure_logging)

    stopped_by: list[str] = []

    async def main() -> LabReport | LabPair:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # cancel the run: its teardown runs

            def stop(name: str = sig.name) -> None:
                stopped_by.append(name)
                task.cancel()

            loop.add_signal_handler(sig, stop)
        if loaded.scenario.job is not None:  # both halves in one run, unless told
            halves = (False,) if args.no_linkguard else (True,) if args.skip_baseline else None
            return await run_lab_halves(
                loaded,
                halves=halves or (True, False),
                workdir=args.workdir,
                keep=args.keep,
                progress=lab_progress(),
                agent_settings=agent_settings,
            )
        return await run_lab(
            loaded,
            linkguard=not args.no_linkguard,
            workdir=args.workdir,
            keep=args.keep,
            progress=lab_progress(),
            agent_settings=agent_settings,
        )

    try:
        report = asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        name = stopped_by[0] if stopped_by else "SIGINT"
        code = 143 if name == "SIGTERM" else 130
        return _fail(f"sim lab: stopped ({name}); the lab was torn down", code)
    except (LabProcessError, LabError) as exc:
        return _fail(f"sim lab failed (the lab was torn down): {exc}", 1)
    sys.stdout.write(report.text())
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            return _fail(f"sim lab: cannot write {args.json}: {exc}", 1)
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
        return _fail(f"sim fleet: {exc.errors()[0]['msg'].removeprefix('Value error, ')}", 2)
    for out in (args.json, args.plot, args.scenario_out):
        # before a run of seconds to minutes, not after it
        if out is not None and not out.resolve().parent.is_dir():
            return _fail(f"sim fleet: cannot write {out}: {out.parent} is not a directory", 1)
    if args.ledger is not None and (args.ledger.exists() or args.ledger.is_symlink()):
        return _fail(
            f"sim fleet: --ledger {args.ledger} exists; a simulation writes a new ledger "
            "(remove it or choose another path)",
            2,
        )
    if args.ledger is not None and not args.ledger.resolve().parent.is_dir():
        return _fail(
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
        model=FailureModel(**_model_overrides(args)),
        transports=_transports(args),
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
        return _fail(f"sim fleet: cannot write output: {exc}", 1)
    if args.ledger is not None:
        from linkguard.ledger import Ledger, LedgerError
        from linkguard.simulations.ledgerrecord import record_simulation

        try:
            with Ledger(args.ledger) as ledger:
                record_simulation(ledger, ft, rep)
        except (LedgerError, OSError) as exc:
            return _fail(f"sim fleet: cannot write the ledger: {exc}", 1)
    return 1 if rep.oracle["mismatches"] else 0


def _report(args: argparse.Namespace) -> int:
    """``report``: the ledger's interruption report (:meth:`linkguard.ledger.Ledger.report`)
    as text, JSON or CSV. 0 done, 1 unwritable output, 2 bad arguments or ledger."""
    import csv
    import io
    import json

    from linkguard.ledger import Ledger, LedgerError

    if args.since is not None and args.until is not None and args.since >= args.until:
        return _fail("report: --since must be before --until", 2)
    if args.out is not None and not args.out.resolve().parent.is_dir():
        return _fail(f"report: cannot write {args.out}: {args.out.parent} is not a directory", 1)
    try:
        with Ledger(args.ledger, read_only=True) as ledger:  # creates and changes nothing
            rep = ledger.report(
                price_per_gpu_hour=args.price_per_gpu_hour,
                since=args.since,
                until=args.until,
                transports=_transports(args),
                model_overrides=_model_overrides(args),
            )
    except (LedgerError, ValueError) as exc:
        return _fail(f"report: {exc}", 2)
    if args.format == "json":
        text = json.dumps(rep.to_dict(), indent=2) + "\n"
    elif args.format == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rep.csv_rows())
        text = buf.getvalue()
    else:
        text = rep.text()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        return _fail(f"report: cannot write {args.out}: {exc}", 1)
    return 0


def _nccl_env(args: argparse.Namespace) -> int:
    """``nccl env``: this host's agent's ``nccl.json`` (:class:`linkguard.nccl.NcclFiles`), or
    with ``--host`` a rendering from the service's ``GET /api/v1/hosts/{host}``; printed as
    KEY=VALUE lines, ``export`` lines or the JSON document."""
    import json

    from linkguard.config import AgentSettings, ConfigError, load_settings
    from linkguard.jobenv import AGENT_LOCK, agent_running
    from linkguard.nccl import NcclFiles, env_lines

    if args.host is None:
        try:
            settings = load_settings(AgentSettings, args.config)
        except ConfigError as exc:
            return _fail(f"nccl env: {exc}", 2)
        path = settings.rail_map_path.parent / NcclFiles.JSON
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return _fail(
                f"nccl env: {path} does not exist: is the agent running? (it writes it with "
                "its first plan or port state)",
                1,
            )
        except (OSError, ValueError) as exc:
            return _fail(f"nccl env: cannot read {path}: {exc}", 1)
        if not args.allow_stale and agent_running(path.parent) is False:
            return _fail(
                f"nccl env: no agent holds {path.parent / AGENT_LOCK} (the agent is not "
                f"running), so {path.name} may be stale; --allow-stale prints it anyway",
                1,
            )
    else:
        try:
            if not args.api.startswith(("http://", "https://")):
                return _fail(f"nccl env: --api {args.api!r}: give an http:// or https:// URL", 2)
            doc = _nccl_from_api(args.api, args.host)
        except LookupError as exc:
            return _fail(f"nccl env: {exc}", 2)
        except (OSError, ValueError) as exc:
            return _fail(f"nccl env: {exc}", 1)
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    try:
        env = doc["env"] if args.profile == "plain" else doc["failover"]["env"]
        warnings = doc["failover"]["warnings"] if args.profile == "failover" else []
    except (KeyError, TypeError):
        return _fail("nccl env: the rendering has no env: written by another version?", 1)
    for w in warnings:
        print(f"linkguard: warning: {w}", file=sys.stderr)
    sys.stdout.write(env_lines(env, export=args.format == "shell"))
    return 0


def _nccl_from_api(api: str, host: str) -> dict:
    """The NCCL rendering of ``host`` from the service's host view (its HCAs, their states,
    its plan). LookupError: unknown host; OSError: unreachable;
    ValueError: an answer that is not a host view."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    from pydantic import ValidationError

    from linkguard.models import HCAInfo, HostInventory, LinkLayer, Plan, PortState
    from linkguard.nccl import render

    url = f"{api.rstrip('/')}/api/v1/hosts/{urllib.parse.quote(host, safe='')}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--api {api!r}: give an http:// or https:// URL")
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # scheme checked above
            body = resp.read(16 * 1024 * 1024)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2000).decode("utf-8", "replace")
        if exc.code == 404:
            raise LookupError(f"{host}: {detail}") from None
        raise OSError(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise OSError(f"{url}: {exc.reason}") from None
    try:
        view = json.loads(body)
        states = [PortState.model_validate(h["state"]) for h in view["hcas"] if h["state"]]
        layers = {s.key: s.link_layer for s in states if s.link_layer is not None}
        inv = HostInventory(
            host=view["host"],
            hcas=[
                HCAInfo(
                    hca=h["hca"],
                    port=h["port"],
                    rail=h["rail"],
                    netdev=h.get("netdev"),
                    link_layer=layers.get(f"{h['hca']}/{h['port']}", LinkLayer.INFINIBAND),
                )
                for h in view["hcas"]
            ],
        )
        plan = Plan.model_validate(view["plan"]) if view.get("plan") else None
    except (KeyError, TypeError, ValidationError, json.JSONDecodeError) as exc:
        raise ValueError(f"{url}: not a host view: {exc}") from None
    # the agent's own rule on the agent's own states (status, rate against the host's other
    # ports), not the dashboard's "degraded" mark (a rate below the fabric's cable rate): the
    # same answer as the host's nccl.env
    return render(inv, states, plan).to_dict()


def _keys(args: argparse.Namespace) -> int:
    """``keys generate``: :func:`linkguard.signing.generate_keys`."""
    from linkguard.signing import Verifier, generate_keys

    try:
        key, pub = generate_keys(args.out, force=args.force)
    except FileExistsError as exc:
        return _fail(f"keys generate: {exc}", 2)
    except OSError as exc:
        return _fail(f"keys generate: cannot write {args.out}: {exc.strerror or exc}", 1)
    print(f"signing key (service: signing_key): {key}")
    print(f"public key (agents: service_public_key): {pub}")
    print(f"key id: {Verifier.from_file(pub).key_id}")
    return 0


def _rails_follow(args: argparse.Namespace) -> int:
    """``rails follow``: :func:`linkguard.agent.localsub.follow` on ``--socket``, else the
    config's ``rails_socket``, else ``/run/linkguard/rails.sock``."""
    import asyncio

    from linkguard.agent.localsub import follow
    from linkguard.config import AgentSettings, ConfigError, load_settings

    path = args.socket
    if path is None and args.config is not None:
        try:
            path = load_settings(AgentSettings, args.config).rails_socket
        except ConfigError as exc:
            return _fail(f"rails follow: {exc}", 2)
        if path is None:
            return _fail(f"rails follow: {args.config} sets no rails_socket", 2)
    path = path or Path("/run/linkguard/rails.sock")
    try:
        return asyncio.run(follow(path, count=args.count))
    except BrokenPipeError:  # stdout closed (| head)
        return 0
    except OSError as exc:
        return _fail(f"rails follow: cannot connect to {path}: {exc.strerror or exc}", 2)


def _broker(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from linkguard.broker import embedded_broker
    from linkguard.logs import configure_logging

    configure_logging(args.log_format, "info")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with embedded_broker(host=args.bind, port=args.port) as port:
            print(f"linkguard broker listening on {args.bind}:{port}", file=sys.stderr, flush=True)
            await stop.wait()

    try:
        asyncio.run(serve())
    except OSError as exc:
        return _fail(str(exc), 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
