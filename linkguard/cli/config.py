"""``linkguard config check FILE --role agent|service``: validate a settings file and print
the settings it gives.

Consumes: the YAML file, the ``LINKGUARD_*`` environment (as the agent or service would read
it). Produces: on stdout the effective settings as YAML (every key, defaults filled in;
secrets as ``**********``), on stderr one ``warning:`` line per old flat key the file or
environment uses (:class:`~linkguard.config.DeprecatedSetting`, with the new key). Exit 0 valid;
2 invalid, with one ``field.path: message`` line per bad value on stderr (or the file's
problem: missing, not YAML, not a mapping), or one line per thing the process would refuse at
start from the settings alone (:func:`start_problems`: the fabric, key files, the agent's
driver and ports). The printed settings load again as the same settings (secrets aside).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linkguard.cli.common import fail

if TYPE_CHECKING:
    from linkguard.config import AgentSettings, ServiceSettings


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
    from linkguard.logs import configure_logging

    # the warnings are printed below, once each: not also as `deprecated_setting` log lines
    configure_logging("console", "error")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecatedSetting)
        try:
            settings: AgentSettings | ServiceSettings = (
                load_settings(AgentSettings, args.file)
                if args.role == "agent"
                else load_settings(ServiceSettings, args.file)
            )
        except ConfigError as exc:
            if not exc.errors:
                return fail(f"config check: {exc}", 2)
            print(f"config check: {args.file}: not valid {args.role} settings:", file=sys.stderr)
            for line in exc.errors:
                print(f"  {line}", file=sys.stderr)
            other = "service" if args.role == "agent" else "agent"
            if _other_roles(exc.errors, ServiceSettings if other == "service" else AgentSettings):
                print(f"hint: these keys are the {other}'s: --role {other}?", file=sys.stderr)
            return 2
    for w in caught:
        if issubclass(w.category, DeprecatedSetting):
            print(f"warning: {w.message}", file=sys.stderr)
    problems = start_problems(settings)
    if problems:
        print(f"config check: {args.file}: the {args.role} would not start:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 2
    print(f"# effective {args.role} settings of {args.file}")
    print(yaml.safe_dump(effective(settings), sort_keys=False), end="")
    return 0


def _other_roles(errors: list[str], other: type[AgentSettings] | type[ServiceSettings]) -> bool:
    """Every key refused as unknown is a setting of ``other`` (the file is the other role's)."""
    extra = [e.split(":", 1)[0] for e in errors if e.endswith("Extra inputs are not permitted")]
    return bool(extra) and set(extra) <= set(other.model_fields)


def effective(settings: AgentSettings | ServiceSettings) -> dict[str, Any]:
    """The settings as a YAML-able mapping that loads again as the same settings (secrets
    aside): every key with its value, defaults filled in, except an empty ``bus.brokers``
    (its default, "use bus.host and bus.port"; given explicitly, an empty list is refused)."""
    doc = settings.model_dump(mode="json")
    if not doc["bus"].get("brokers"):
        doc["bus"].pop("brokers", None)
    return doc


def start_problems(settings: AgentSettings | ServiceSettings) -> list[str]:
    """What the process would refuse at start from ``settings`` alone, before it touches the
    host or the bus: the agent's driver, its configured ports (rails and ports unique, as
    :func:`~linkguard.agent.inventory.build_inventory` checks; when every port gives its
    rail, no sysfs is needed) and its ``service_public_key``; the service's fabric (read and
    checked as :func:`~linkguard.topology.serviceio.fabric_from_settings` does) and its
    ``signing_key``. One line per problem (empty: none)."""
    from linkguard.config import AgentSettings, ConfigError
    from linkguard.signing import Signer, Verifier

    problems: list[str] = []
    if isinstance(settings, AgentSettings):
        from linkguard.agent.inventory import InventoryError, build_inventory

        if settings.driver == "simulated":
            problems.append(
                "driver: 'simulated' exists for quickstart and tests only; use sysfs or netlink"
            )
        if settings.ports and all(p.rail is not None for p in settings.ports):
            try:
                build_inventory(settings.host, configured=settings.ports)
            except InventoryError as exc:
                problems.append(f"ports: {exc}")
        if settings.service_public_key is not None:
            try:
                Verifier.from_file(settings.service_public_key)
            except ConfigError as exc:
                problems.append(f"service_public_key: {exc}")
        return problems
    from linkguard.settings.discoversection import FabricDiscovery
    from linkguard.topology.fabric import FabricError
    from linkguard.topology.serviceio import fabric_from_settings

    try:
        if isinstance(settings.fabric, FabricDiscovery):
            from linkguard.topology.discoverio import load_discovery

            load_discovery(settings.fabric)  # the switch graph and the expected fabric
        else:
            fabric_from_settings(settings)
    except (ConfigError, FabricError) as exc:
        problems.append(f"fabric: {exc}")
    if settings.signing_key is not None:
        try:
            Signer.from_file(settings.signing_key)
        except ConfigError as exc:
            problems.append(f"signing_key: {exc}")
    return problems
