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
faults``: broker unreachable), 2 bad usage or configuration, or a command whose optional
dependencies are not installed (the message names the extra: ``pip install
'linkguard[service]'``, :mod:`linkguard.extras`); ``exec``: its own (:mod:`linkguard.jobenv`:
69 no usable rail, 75 no current plan, else the command's).

``exec`` is dispatched before anything else is imported or built (asyncio, the other
commands' parsers): it runs at every worker start. Every other command's module imports its
heavy dependencies when it runs, not when the parser is built (issue 23: ``linkguard agent``
loads none of the service's, simulator's or dashboard's packages, which a GPU host does not
install): a command line dispatching lazily to its subcommand's code is the one place where
function-level imports are the design, not a hidden import cycle.
"""

from __future__ import annotations

import argparse
import sys

from linkguard.cli.common import broker_address as broker_address
from linkguard.cli.common import fail
from linkguard.extras import missing_extra_message

__all__ = ["main"]

#: the extra a command's missing-dependency message names when it brings the missing module
#: (else the smallest one that does: :func:`linkguard.extras.install_hint`)
COMMAND_EXTRAS = {"quickstart": "all", "topology": "service", "sim": "sim", "broker": "broker"}


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
    except (ModuleNotFoundError, BaseExceptionGroup) as exc:
        # an optional dependency (an extra) not installed: say which extra, exit 2
        what = f"linkguard {_command_words(args)}"
        message = missing_extra_message(exc, what, prefer=COMMAND_EXTRAS.get(args.command))
        if message is None:
            raise
        return fail(message, 2)


def _command_words(args: argparse.Namespace) -> str:
    """``topology serve``, ``sim run``, ``agent``: the command and its subcommand."""
    sub = getattr(args, f"{args.command}_command", None)
    return f"{args.command} {sub}" if isinstance(sub, str) else str(args.command)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (:func:`linkguard.cli.commands.build_parser`; its modules
    are imported here, on first use, so that ``exec`` loads none of them)."""
    from linkguard.cli.commands import build_parser

    return build_parser()
