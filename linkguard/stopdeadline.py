"""A deadline on a daemon's clean stop: :func:`on_stop_signals`.

Consumes: SIGTERM / SIGINT, the daemon's ``stop`` callable. Produces: ``stop()`` at the first
signal and, when the process is still running :data:`STOP_DEADLINE_S` later, a
``stop_overdue`` error log naming every task still pending and where it waits, then exit
status :data:`EXIT_STOP_OVERDUE` without further teardown.

Why: a stop that waits for a task which lost its cancellation (Python 3.11's ``wait_for``,
see ``tests/test_cancellation.py``), or for an I/O call with no timeout, never ends on its own.
systemd kills the unit after ``TimeoutStopSec`` (15 s in ``deploy/systemd``) and says nothing
about why; the deadline comes first (10 s) and says which task held the stop up. A second
signal during the stop does not restart the clock.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable

import structlog

__all__ = ["EXIT_STOP_OVERDUE", "STOP_DEADLINE_S", "on_stop_signals", "pending_tasks"]

log = structlog.get_logger(__name__)

#: seconds from the first SIGTERM/SIGINT to the forced exit: under systemd's TimeoutStopSec (15 s)
STOP_DEADLINE_S = 10.0
#: exit status of a stop that missed its deadline (EX_SOFTWARE, sysexits.h)
EXIT_STOP_OVERDUE = 70


def pending_tasks(loop: asyncio.AbstractEventLoop) -> list[str]:
    """``"<task name> at <file>:<line> in <function>"`` for every task of ``loop`` not done
    (its innermost frame; ``"<task name>"`` alone when it has none yet)."""
    out = []
    for task in asyncio.all_tasks(loop):
        if task.done():
            continue
        stack = task.get_stack()
        where = ""
        if stack:
            code = stack[-1].f_code
            where = f" at {code.co_filename}:{stack[-1].f_lineno} in {code.co_name}"
        out.append(f"{task.get_name()}{where}")
    return sorted(out)


def on_stop_signals(
    stop: Callable[[], None],
    *,
    process: str,
    deadline_s: float = STOP_DEADLINE_S,
    exit: Callable[[int], None] = os._exit,
) -> None:
    """Call ``stop`` at SIGTERM or SIGINT on the running loop and arm the stop deadline
    (``deadline_s`` seconds, once). ``process``: its role in the ``stop_overdue`` log
    (``agent``, ``topology``). ``exit``: how the overdue process ends (``os._exit``: no
    teardown, which is what hung)."""
    loop = asyncio.get_running_loop()
    armed: list[asyncio.TimerHandle] = []

    def overdue() -> None:
        log.error(
            "stop_overdue",
            process=process,
            deadline_s=deadline_s,
            tasks=pending_tasks(loop),
            hint="a task did not end after the stop; the process exits without finishing "
            "its teardown (report this with the tasks above)",
        )
        sys.stdout.flush()
        sys.stderr.flush()
        exit(EXIT_STOP_OVERDUE)

    def on_signal() -> None:
        if not armed:
            armed.append(loop.call_later(deadline_s, overdue))
        stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
