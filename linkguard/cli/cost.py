"""The job cost options of ``sim fleet`` and ``report``: which transport to price outages for
(:data:`linkguard.jobcost.TRANSPORTS`) and the ip transport's stall per rerouted outage."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypedDict

from linkguard.cli.common import positive

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


def add_transport_args(p: argparse.ArgumentParser) -> None:
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
        type=positive(float, lo=0, hi=IP_STALL_MAX_MS),
        metavar="MS",
        help="the ip transport's stall per rerouted outage, in ms (default: "
        "linkguard.failuremodel.IP_STALL_S)",
    )


class _ModelOverrides(TypedDict, total=False):
    ip_stall_s: float
    ip_stall_source: str


def model_overrides(args: argparse.Namespace) -> _ModelOverrides:
    """The job model fields ``--ip-stall-from`` / ``--ip-stall-ms`` set."""
    if args.ip_stall_from is not None:
        seconds, source = args.ip_stall_from
        return {"ip_stall_s": seconds, "ip_stall_source": source}
    if args.ip_stall_ms is not None:
        return {"ip_stall_s": args.ip_stall_ms / 1000, "ip_stall_source": "--ip-stall-ms"}
    return {}


def transports(args: argparse.Namespace) -> tuple[str, ...]:
    from linkguard.jobcost import TRANSPORTS

    return TRANSPORTS if args.transport == "all" else (args.transport,)
