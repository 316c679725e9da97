"""``linkguard rails follow``: stream this host's rail map from the agent's Unix socket."""

from __future__ import annotations

import argparse
from pathlib import Path

from linkguard.cli.common import fail, positive


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ra = sub.add_parser("rails", help="this host's rail map, from the agent's local socket")
    rasub = ra.add_subparsers(dest="rails_command", required=True, metavar="SUBCOMMAND")
    rf = rasub.add_parser(
        "follow",
        help="print the current rail map, then every change, one JSON line each",
        description="Connect to the agent's rails_socket.path (linkguard.agent.localsub; no "
        "broker credentials needed, only access to the socket: mode 0660, rails_socket.group) and "
        "print what it sends: the current rail map, then each change as it happens, one "
        'linkguard.rail-change/v1 JSON document per line ("kind": current / change / error).',
        epilog="Exit codes: 0 after --count lines, 1 the agent closed the connection or cut "
        "this reader for falling behind (reconnect to resume), 2 no socket there or no "
        "permission, or a bad configuration.",
    )
    rf.add_argument("--socket", type=Path, metavar="PATH", help="default: the config's")
    rf.add_argument("-c", "--config", type=Path, help="the agent's YAML config (rails_socket.path)")
    rf.add_argument(
        "--count",
        type=positive(int, lo=1, hi=10**9),
        metavar="N",
        help="stop after N lines (1: just the current rail map)",
    )


def run(args: argparse.Namespace) -> int:
    """``rails follow``: :func:`linkguard.agent.localsub.follow` on ``--socket``, else the
    config's ``rails_socket.path``, else ``/run/linkguard/rails.sock``."""
    import asyncio

    from linkguard.agent.localsub import follow
    from linkguard.config import AgentSettings, ConfigError, load_settings

    path = args.socket
    if path is None and args.config is not None:
        try:
            path = load_settings(AgentSettings, args.config).rails_socket.path
        except ConfigError as exc:
            return fail(f"rails follow: {exc}", 2)
        if path is None:
            return fail(f"rails follow: {args.config} sets no rails_socket.path", 2)
    path = path or Path("/run/linkguard/rails.sock")
    try:
        return asyncio.run(follow(path, count=args.count))
    except BrokenPipeError:  # stdout closed (| head)
        return 0
    except OSError as exc:
        return fail(f"rails follow: cannot connect to {path}: {exc.strerror or exc}", 2)
