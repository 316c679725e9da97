"""``linkguard fabric faults``: publish the switch-level faults known now, retained, to the
topology service; 0 once the broker confirmed, 1 broker unreachable, 2 bad usage, config or a
name the fabric does not have."""

from __future__ import annotations

import argparse
from pathlib import Path

from linkguard.cli.common import broker_address, fail, first_error, positive


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
        raise argparse.ArgumentTypeError(f"{text!r}: {first_error(exc, options)}") from None


def add_parser(fsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        type=positive(float, lo=0.1, hi=300),
        default=5.0,
        metavar="S",
        help="give up when the broker does not answer within S seconds (default 5; a refused "
        "connection fails at once)",
    )


def check_usage(args: argparse.Namespace) -> None:
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
        parser.error(first_error(exc, options))


def run(args: argparse.Namespace) -> int:
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
        return fail(str(exc), 2)
    bus = settings.bus
    from linkguard.settings.discoversection import FabricDiscovery

    discovered = isinstance(settings.fabric, FabricDiscovery)  # known at run time only
    if args.fabric is not None or (
        not discovered and (settings.fabric is not None or settings.generate is not None)
    ):
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
            return fail(f"{exc} (checked against {source}); nothing published", 2)
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
            return fail(
                f"the MQTT broker at {where} refused the connection: {exc.error}: {exc.hint} "
                "(see the bus section of --config); nothing published",
                1,
            )
        return fail(
            f"cannot reach the MQTT broker at {where} within {args.timeout:g} s (is it running? "
            "see --broker, or the bus section of --config); nothing published",
            1,
        )
    except OSError as exc:  # refused, unreachable network, unknown host name: no retrying
        why = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
        return fail(
            f"cannot reach the MQTT broker at {where}: {why} (is it running? see --broker, or "
            "the bus section of --config); nothing published",
            1,
        )
    if not confirmed:
        return fail(f"the broker at {where} did not confirm the publish on {topic}", 1)
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
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(host, port)
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
