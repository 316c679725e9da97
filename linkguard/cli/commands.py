"""The command tree: :func:`build_parser` (one ``add_parser`` per command group, in the order
``--help`` lists them), the usage checks argparse cannot express, and :func:`dispatch` to each
group's handler (``run`` of the module named after the group)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from linkguard import __version__
from linkguard.cli import (
    broker,
    config,
    daemon,
    fabric,
    faults,
    keys,
    layout,
    nccl,
    quickstart,
    rails,
    report,
    sim,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="linkguard",
        description="Keep multi-node GPU training running when an IB/RoCE link fails or flaps.",
    )
    parser.add_argument("--version", action="version", version=f"linkguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    quickstart.add_parser(sub)
    daemon.add_agent_parser(sub)
    daemon.add_topology_parser(sub)
    fabric.add_parser(sub)
    broker.add_parser(sub)
    nccl.add_parser(sub)
    nccl.add_exec_parser(sub)
    layout.add_parser(sub)
    keys.add_parser(sub)
    config.add_parser(sub)
    rails.add_parser(sub)
    sim.add_parser(sub)
    report.add_parser(sub)
    return parser


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Usage errors found after parsing: exit 2 with the subcommand's usage."""
    quickstart.check_usage(args)
    fabric.check_usage(parser, args)
    faults.check_usage(args)


#: command -> its handler: the exit code
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "quickstart": quickstart.run,
    "agent": daemon.run,
    "topology": daemon.run,
    "fabric": fabric.run,
    "broker": broker.run,
    "report": report.run,
    "nccl": nccl.run,
    "keys": keys.run,
    "config": config.run,
    "layout": layout.run,
    "rails": rails.run,
    "sim": sim.run,
}


def dispatch(args: argparse.Namespace) -> int:
    return HANDLERS[args.command](args)
