"""``linkguard report``: the interruption report of a ledger (text, JSON, CSV)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linkguard.cli.common import fail, positive
from linkguard.cli.cost import add_transport_args, model_overrides, transports


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = sub.add_parser(
        "report",
        help="the interruption report of a ledger: cost with/without linkguard, worst links",
        description="Read a ledger (the topology service's, `ledger.path`, or one written by "
        "`sim fleet --ledger`) and report over a time window: interruptions per 1,000 "
        "GPU-days next to Meta's published rate (Llama 3: 419 in 54 days on 16,384 GPUs), "
        "link-caused interruptions avoided, idled GPU-hours with and without linkguard, "
        "GPU-hours and money saved per transport (--transport), reroutes, worst links, "
        "per-rail and per-leaf tables. The cost model is the fleet simulator's "
        "(linkguard.jobcost), with the newest run's job model.",
        epilog="Exit codes: 0 done, 1 the output could not be written, 2 bad arguments, no "
        "run in the window, or a missing, empty, unreadable, corrupted or newer-schema ledger. "
        "The ledger is opened read-only: the report never creates or changes a file.",
    )
    rp.add_argument("--ledger", type=Path, required=True, metavar="PATH", help="the ledger file")
    rp.add_argument("--format", choices=["text", "json", "csv"], default="text")
    rp.add_argument(
        "--price-per-gpu-hour",
        type=positive(float, lo=0, hi=1e6),
        default=2.0,
        metavar="X",
        help="what an idle GPU-hour costs (default 2.0)",
    )
    rp.add_argument(
        "--since",
        type=_time,
        metavar="TIME",
        help="window start: ISO 8601 (2023-11-20, 2023-11-20T12:00:00Z; UTC unless a zone is "
        "given) or Unix seconds with at least 9 digits or a decimal point (1700000000; a "
        "bare 20231120 is refused as ambiguous); default the ledger's first run. The window "
        "is clamped to what the ledger recorded",
    )
    rp.add_argument(
        "--until",
        type=_time,
        metavar="TIME",
        help="window end (exclusive), as --since; default the ledger's last record (now while "
        "a service is recording)",
    )
    rp.add_argument("--out", type=Path, metavar="F", help="write to F instead of stdout")
    add_transport_args(rp)


def _time(text: str) -> float:
    """``--since`` / ``--until`` (argparse type): :func:`linkguard.ledger.parse_time`."""
    from linkguard.ledger import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """``report``: the ledger's interruption report (:meth:`linkguard.ledger.Ledger.report`)
    as text, JSON or CSV. 0 done, 1 unwritable output, 2 bad arguments or ledger."""
    import csv
    import io
    import json

    from linkguard.ledger import Ledger, LedgerError

    if args.since is not None and args.until is not None and args.since >= args.until:
        return fail("report: --since must be before --until", 2)
    if args.out is not None and not args.out.resolve().parent.is_dir():
        return fail(f"report: cannot write {args.out}: {args.out.parent} is not a directory", 1)
    try:
        with Ledger(args.ledger, read_only=True) as ledger:  # creates and changes nothing
            rep = ledger.report(
                price_per_gpu_hour=args.price_per_gpu_hour,
                since=args.since,
                until=args.until,
                transports=transports(args),
                model_overrides=model_overrides(args),
            )
    except (LedgerError, ValueError) as exc:
        return fail(f"report: {exc}", 2)
    if args.format == "json":
        text = json.dumps(rep.to_dict(), indent=2) + "\n"
    elif args.format == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rep.csv_rows())
        text = buf.getvalue()
    else:
        text = rep.text()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        return fail(f"report: cannot write {args.out}: {exc}", 1)
    return 0
