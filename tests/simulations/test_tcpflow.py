"""The TCP flow script's record files and stall measure (pure), and its modes on loopback."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

from linkguard.simulations import tcpflow
from linkguard.simulations.tcpflow import read_rounds, stall_ms

TCPFLOW = Path(tcpflow.__file__)


def test_read_rounds_skips_a_line_being_written() -> None:
    text = "local 10.200.128.1\n0 1.000000\n1 1.005000\n2 1.0"
    assert read_rounds(text) == ("10.200.128.1", [1.0, 1.005], None)
    assert read_rounds("error [Errno 113] No route to host\n") == (
        None,
        [],
        "[Errno 113] No route to host",
    )


def test_stall_is_the_longest_gap_around_the_fault() -> None:
    times = [0.0, 0.1, 0.2, 0.3, 0.8, 0.9, 3.0, 3.1]
    # fault at 0.25, back at 2.5: gaps 0.3-0.8 (500 ms) and 0.9-3.0 (2100 ms)
    assert stall_ms(times, 0.25, 2.5) == 2100.0
    # only the gap that starts at the last round before the fault counts from before it
    assert round(stall_ms(times, 0.35, 0.85), 6) == 500.0
    # nothing after the fault in the window: the gap runs to its end
    assert round(stall_ms([0.0, 0.1], 0.15, 1.15), 6) == 1050.0
    assert math.isnan(stall_ms([1.0], 0.5, 2.0))


def test_stream_into_a_sink_and_ping_into_an_echo_on_loopback(tmp_path: Path) -> None:
    procs = []
    try:
        sink = subprocess.Popen(
            [sys.executable, str(TCPFLOW), "sink", "127.0.0.1", "0", str(tmp_path / "r")],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(sink)
        # port 0 is not what a client can use: the sink prints ready; find its port with ss
        assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
        port = _listening_port(sink.pid)
        stream = subprocess.Popen(
            [sys.executable, str(TCPFLOW), "stream", "127.0.0.1", "127.0.0.1", str(port), "1",
             str(tmp_path / "s")],
        )  # fmt: skip
        procs.append(stream)
        echo = subprocess.Popen(
            [sys.executable, str(TCPFLOW), "echo", "127.0.0.1", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(echo)
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        ping = subprocess.Popen(
            [sys.executable, str(TCPFLOW), "ping", "-", "127.0.0.1",
             str(_listening_port(echo.pid)), "1", str(tmp_path / "p")],
        )  # fmt: skip
        procs.append(ping)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = [read_rounds(_text(tmp_path / n)) for n in ("r", "s", "p")]
            if len(got[0][1]) > 20 and len(got[2][1]) > 20:
                break
            time.sleep(0.01)
        (_, received, e1), (local, _, e2), (plocal, rounds, e3) = got
        assert (e1, e2, e3) == (None, None, None)
        assert local == plocal == "127.0.0.1"
        assert len(received) > 20 and len(rounds) > 20
        assert received == sorted(received) and rounds == sorted(rounds)
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


def test_a_refused_connection_is_an_error_line_and_exit_3(tmp_path: Path) -> None:
    out = tmp_path / "p"
    # port 1 on loopback: nothing listens (and nothing else would be sent anywhere)
    code = subprocess.run(
        [sys.executable, str(TCPFLOW), "ping", "127.0.0.1", "127.0.0.1", "1", "5", str(out)],
        timeout=20,
    ).returncode
    assert code == 3
    assert "Connection refused" in (read_rounds(out.read_text())[2] or "")


def _text(p: Path) -> str:
    return p.read_text() if p.exists() else ""


def _listening_port(pid: int) -> int:
    out = subprocess.run(
        ["ss", "-Htlnp"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for line in out:
        if f"pid={pid}," in line:
            return int(line.split()[3].rsplit(":", 1)[1])
    raise AssertionError(f"pid {pid} listens nowhere: {out}")
