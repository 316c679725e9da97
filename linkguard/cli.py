"""The ``linkguard`` command line.

  linkguard quickstart             the whole flow in one process (embedded broker, simulated hosts)
  linkguard agent                  the per-host daemon
  linkguard topology serve         the topology service
  linkguard fabric generate        print a rail-optimized fabric (JSON/YAML)
  linkguard broker                 an embedded MQTT broker on 127.0.0.1

Exit codes: 0 ok, 1 runtime failure, 2 bad usage or configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from linkguard import __version__

__all__ = ["main"]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c", "--config", type=Path, help="YAML config file (env LINKGUARD_* overrides it)"
    )
    p.add_argument("--log-format", choices=["json", "console"], help="default: json")
    p.add_argument("--log-level", help="debug, info, warning, error (default: info)")
    p.add_argument("--broker", metavar="HOST:PORT", help="MQTT broker (default 127.0.0.1:1883)")


def _overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.log_format:
        out["log_format"] = args.log_format
    if args.log_level:
        out["log_level"] = args.log_level
    if args.broker:
        host, _, port = args.broker.rpartition(":")
        if not host or not port.isdigit():
            raise SystemExit(f"linkguard: --broker must be HOST:PORT, got {args.broker!r}")
        out["bus"] = {"host": host, "port": int(port)}
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linkguard",
        description="Keep multi-node GPU training running when an IB/RoCE link fails or flaps.",
    )
    parser.add_argument("--version", action="version", version=f"linkguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    q = sub.add_parser(
        "quickstart",
        help="run broker, service and simulated agents; take a "
        "link down and back; print what moved and how long it took",
    )
    q.add_argument("--hosts", type=int, default=4, help="hosts in the generated fabric (4)")
    q.add_argument("--rails", type=int, default=4, help="rails per host (4)")
    q.add_argument("--hold-down", type=float, default=2.0, help="hold-down in s (2.0)")
    q.add_argument("--rail", type=int, default=1, help="rail of the first host to fail (1)")
    q.add_argument("-v", "--verbose", action="store_true", help="show the daemons' logs")

    a = sub.add_parser("agent", help="per-host agent: watch ports, publish states, apply plans")
    _add_common(a)
    a.add_argument("--host", help="host name (default: the system host name)")
    a.add_argument("--driver", choices=["sysfs", "netlink"], help="port driver (default sysfs)")
    a.add_argument("--netns", help="network namespace of the netdevs and routes (labs)")

    t = sub.add_parser("topology", help="the topology service")
    tsub = t.add_subparsers(dest="topology_command", required=True, metavar="SUBCOMMAND")
    ts = tsub.add_parser("serve", help="hold the fabric, compute and publish plans")
    _add_common(ts)
    ts.add_argument("--fabric", type=Path, help="fabric file (JSON/YAML); default: generated")

    f = sub.add_parser("fabric", help="fabric files")
    fsub = f.add_subparsers(dest="fabric_command", required=True, metavar="SUBCOMMAND")
    fg = fsub.add_parser("generate", help="print a rail-optimized fabric (DGX SuperPOD style)")
    fg.add_argument("--hosts", type=int, default=32)
    fg.add_argument("--rails", type=int, default=8)
    fg.add_argument("--gpus-per-host", type=int, default=None, help="default: = rails")
    fg.add_argument("--hosts-per-su", type=int, default=32)
    fg.add_argument("--format", choices=["json", "yaml"], default="yaml")
    fg.add_argument("-o", "--output", type=Path, help="write here instead of stdout")

    b = sub.add_parser("broker", help="embedded MQTT broker (amqtt) for single-machine runs")
    b.add_argument("--bind", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    b.add_argument("--port", type=int, default=1883)
    b.add_argument("--log-format", choices=["json", "console"], default="console")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from linkguard.agent.inventory import InventoryError
    from linkguard.config import AgentSettings, ConfigError, ServiceSettings, load_settings
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
        except (TimeoutError, ValueError) as exc:
            print(f"linkguard quickstart failed: {exc}", file=sys.stderr)
            return 1
        return 0

    if args.command == "fabric":
        from linkguard.topology.fabric import dump_fabric, generate_rail_optimized

        try:
            fabric = generate_rail_optimized(
                hosts=args.hosts,
                rails=args.rails,
                gpus_per_host=args.gpus_per_host,
                hosts_per_su=args.hosts_per_su,
            )
        except ValueError as exc:
            print(f"linkguard: {exc}", file=sys.stderr)
            return 2
        text = dump_fabric(fabric, args.format)
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
        return 0

    if args.command == "broker":
        from linkguard.broker import embedded_broker

        configure_logging(args.log_format, "info")

        async def serve() -> None:
            import signal

            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            async with embedded_broker(host=args.bind, port=args.port) as port:
                print(
                    f"linkguard broker listening on {args.bind}:{port}", file=sys.stderr, flush=True
                )
                await stop.wait()

        asyncio.run(serve())
        return 0

    try:
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

        if args.fabric:
            overrides["fabric"] = args.fabric
        settings_s = load_settings(ServiceSettings, args.config, **overrides)
        configure_logging(settings_s.log_format, settings_s.log_level)
        asyncio.run(run_service(settings_s))
        return 0
    except (ConfigError, FabricError, InventoryError, NetnsNotFoundError) as exc:
        print(f"linkguard: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
