"""The stop deadline (issue 21, "Bounded shutdown"): a daemon whose stop hangs exits after
:data:`~linkguard.stopdeadline.STOP_DEADLINE_S`, saying which task held it up."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

from linkguard.stopdeadline import EXIT_STOP_OVERDUE, STOP_DEADLINE_S

#: a daemon in miniature: stops at SIGTERM, then its teardown waits for a task that never ends
#: (as a task that lost its cancellation does), with the deadline armed the way
#: run_agent / run_service arm it
DAEMON = textwrap.dedent(
    """
    import asyncio, structlog
    from linkguard.stopdeadline import on_stop_signals
    structlog.configure(processors=[structlog.processors.JSONRenderer()])

    async def main():
        stopped = asyncio.Event()
        on_stop_signals(stopped.set, process="agent", deadline_s={deadline})
        print("ready", flush=True)
        await stopped.wait()
        stuck = asyncio.create_task(asyncio.Event().wait(), name="probes")
        await stuck  # never ends
    asyncio.run(main())
    """
)


def _daemon(deadline_s: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON.format(deadline=deadline_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stop_that_hangs_ends_at_its_deadline_naming_the_task() -> None:
    proc = _daemon(0.5)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    assert proc.returncode == EXIT_STOP_OVERDUE == 70, err
    assert 0.5 <= took < 5, took
    [line] = [json.loads(x) for x in out.splitlines() if "stop_overdue" in x]
    assert line["process"] == "agent" and line["deadline_s"] == 0.5
    assert any(t.startswith("probes at ") and " in wait" in t for t in line["tasks"]), line


def test_a_second_signal_does_not_restart_the_clock() -> None:
    proc = _daemon(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.6)  # the signal's spacing, not a wait for an outcome
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=10)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    assert proc.returncode == EXIT_STOP_OVERDUE
    assert 1.0 <= took < 1.5, took  # from the first signal: 1.6 s and more if it restarted


def test_the_deadline_comes_before_systemd_kills_the_unit() -> None:
    from pathlib import Path

    units = Path(__file__).resolve().parents[1] / "deploy" / "systemd"
    for unit in ("linkguard-agent.service", "linkguard-topology.service"):
        [line] = [
            x for x in (units / unit).read_text().splitlines() if x.startswith("TimeoutStopSec=")
        ]
        assert float(line.split("=")[1]) > STOP_DEADLINE_S, unit
