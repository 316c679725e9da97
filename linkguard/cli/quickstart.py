"""``linkguard quickstart``: broker, service and simulated agents in one process
(:func:`linkguard.quickstart.run_quickstart`)."""

from __future__ import annotations

import argparse
import sys

from linkguard.cli.common import Stopped, fail, positive, run_stoppable

#: The embedded broker (amqtt) stops delivering reliably beyond this many agents; it is for trials.
QUICKSTART_MAX_HOSTS = 64


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    q = sub.add_parser(
        "quickstart",
        formatter_class=fmt,
        help="run broker, service and simulated agents; take a link down and "
        "back; print what moved and how long it took",
    )
    q.add_argument(
        "--hosts",
        type=positive(int, lo=2, hi=QUICKSTART_MAX_HOSTS),
        default=4,
        help=f"hosts in the generated fabric (2-{QUICKSTART_MAX_HOSTS})",
    )
    q.add_argument(
        "--rails", type=positive(int, lo=2, hi=16), default=4, help="rails (NICs) per host (2-16)"
    )
    q.add_argument(
        "--hold-down",
        type=positive(float, lo=0.1, hi=60),
        default=2.0,
        help="hold-down before a returning link is reused (s, 0.1-60)",
    )
    q.add_argument(
        "--rail",
        type=positive(int, lo=0, hi=15),
        default=1,
        help="rail of the first host that fails (0 to --rails minus 1)",
    )
    q.add_argument("-v", "--verbose", action="store_true", help="show the daemons' logs")
    q.set_defaults(subparser=q)  # usage errors found after parsing name the subcommand


def check_usage(args: argparse.Namespace) -> None:
    if args.command == "quickstart" and args.rail >= args.rails:
        args.subparser.error(
            f"--rail {args.rail} is not one of the {args.rails} rails (0-{args.rails - 1})"
        )


def run(args: argparse.Namespace) -> int:
    """0 once the link went down and came back, 1 when a step timed out."""

    from linkguard.logs import configure_logging
    from linkguard.quickstart import run_quickstart

    configure_logging("console", "info" if args.verbose else "warning")
    try:  # SIGTERM and SIGINT cancel it: its broker and temporary directory are removed
        run_stoppable(
            run_quickstart(
                hosts=args.hosts,
                rails=args.rails,
                hold_down_s=args.hold_down,
                victim_rail=args.rail,
                out=sys.stdout,
            )
        )
    except Stopped as exc:
        return fail(f"quickstart: {exc}; its broker and files were removed", exc.code)
    except TimeoutError as exc:
        return fail(f"quickstart failed: {exc}", 1)
    return 0
