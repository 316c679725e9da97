"""``linkguard agent`` and ``linkguard topology serve``: settings, logging, run until SIGTERM.
A bad configuration, fabric or inventory exits 2, another instance running exits 1."""

from __future__ import annotations

import argparse
from pathlib import Path

from linkguard.cli.common import add_common, daemon_overrides, fail, nonempty


def add_agent_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("agent", help="per-host agent: watch ports, publish states, apply plans")
    add_common(a)
    a.add_argument("--host", type=nonempty, help="host name (default: the system host name)")
    a.add_argument("--driver", choices=["sysfs", "netlink"], help="port driver (default sysfs)")
    a.add_argument(
        "--netns", type=nonempty, help="network namespace of the netdevs and routes (labs)"
    )


def add_topology_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser("topology", help="the topology service")
    tsub = t.add_subparsers(dest="topology_command", required=True, metavar="SUBCOMMAND")
    ts = tsub.add_parser("serve", help="hold the fabric, compute and publish plans")
    add_common(ts)
    ts.add_argument(
        "--fabric",
        type=Path,
        help="fabric file (JSON/YAML), e.g. from `linkguard fabric generate`; replaces the "
        "config's fabric:, and is an error (exit 2) when the config has generate: instead",
    )


def run(args: argparse.Namespace) -> int:
    from linkguard.agent.inventory import InventoryError
    from linkguard.config import ConfigError
    from linkguard.drivers.netlink import NetnsNotFoundError
    from linkguard.drivers.routes import NotPermittedError
    from linkguard.presence import DuplicateInstanceError

    user_errors: tuple[type[Exception], ...] = (
        ConfigError,
        InventoryError,
        NetnsNotFoundError,
        NotPermittedError,
    )
    if args.command == "topology":  # the agent's base install has no service (issue 23)
        from linkguard.topology.fabric import FabricError

        user_errors += (FabricError,)
    try:
        return run_daemon(args)
    except Exception as exc:
        # a daemon's task group wraps errors in an ExceptionGroup: unwrap the known ones
        group = exc if isinstance(exc, BaseExceptionGroup) else BaseExceptionGroup("", [exc])
        for kinds, code in ((user_errors, 2), (DuplicateInstanceError, 1)):
            mine, rest = group.split(kinds)
            if mine is not None and rest is None:
                return fail("; ".join(str(e) for e in _leaves(mine)), code)
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


def run_daemon(args: argparse.Namespace) -> int:
    """``agent`` and ``topology serve``: settings, logging, run until SIGTERM."""
    import asyncio

    from linkguard.config import AgentSettings, ServiceSettings, load_settings
    from linkguard.logs import configure_logging

    overrides = daemon_overrides(args)
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
