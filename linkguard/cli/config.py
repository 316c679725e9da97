"""``linkguard config check FILE --role agent|service``: validate a settings file and print
the settings it gives.

Consumes: the YAML file, the ``LINKGUARD_*`` environment (as the agent or service would read
it). Produces: on stdout the effective settings as YAML (every key, defaults filled in;
secrets as ``**********``), on stderr one ``warning:`` line per old flat key the file or
environment uses (:class:`~linkguard.config.DeprecatedSetting`, with the new key). Exit 0 valid;
2 invalid, with one ``field.path: message`` line per bad value on stderr (or the file's
problem: missing, not YAML, not a mapping).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linkguard.cli.common import fail


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("config", help="check a settings file (agent or service)")
    csub = c.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    check = csub.add_parser(
        "check",
        help="validate a settings file and print the effective settings",
        description="Load FILE as the agent's or the topology service's settings, with the "
        "LINKGUARD_* environment, as that process would, and print the effective settings as "
        "YAML (defaults filled in, secrets hidden). Old flat keys (route_table, debounce_ms, "
        "...) are accepted with a warning naming the new key.",
        epilog="Exit codes: 0 valid (warnings on stderr), 2 invalid (each bad value as "
        "field.path: message on stderr).",
    )
    check.add_argument("file", type=Path, metavar="FILE", help="the YAML settings file")
    check.add_argument(
        "--role", required=True, choices=["agent", "service"], help="whose settings FILE holds"
    )


def run(args: argparse.Namespace) -> int:
    """``config check``: :func:`linkguard.config.load_settings`, then the settings as YAML."""
    import warnings

    import yaml

    from linkguard.config import (
        AgentSettings,
        ConfigError,
        DeprecatedSetting,
        ServiceSettings,
        load_settings,
    )

    cls = AgentSettings if args.role == "agent" else ServiceSettings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecatedSetting)
        try:
            settings = load_settings(cls, args.file)
        except ConfigError as exc:
            if not exc.errors:
                return fail(f"config check: {exc}", 2)
            print(f"config check: {args.file}: not valid {args.role} settings:", file=sys.stderr)
            for line in exc.errors:
                print(f"  {line}", file=sys.stderr)
            return 2
    for w in caught:
        if issubclass(w.category, DeprecatedSetting):
            print(f"warning: {w.message}", file=sys.stderr)
    print(f"# effective {args.role} settings of {args.file}")
    print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), end="")
    return 0
