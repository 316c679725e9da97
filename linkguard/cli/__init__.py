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
import sys

from linkguard.cli.common import broker_address as broker_address

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exec"]:  # every worker start: no other command's parser or imports
        from linkguard.jobenv import main as exec_main

        return exec_main(argv[1:])
    from linkguard.cli.commands import check_usage, dispatch

    parser = build_parser()
    args = parser.parse_args(argv)
    check_usage(parser, args)
    try:
        return dispatch(args)
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (:func:`linkguard.cli.commands.build_parser`; its modules
    are imported here, on first use, so that ``exec`` loads none of them)."""
    from linkguard.cli.commands import build_parser

    return build_parser()
