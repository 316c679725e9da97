"""SIGTERM (systemd, ``timeout``, CI) stops the runs that start something of their own as
cleanly as Ctrl-C: ``sim run --bus mosquitto`` (a private Mosquitto, a temporary directory)
and ``quickstart`` (a temporary directory of per-host state). Exit 143, a line saying so, and
nothing left behind: no broker process, no temporary directory. Real processes, signalled once
what they start is there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import require_binary

SCENARIO = Path(__file__).resolve().parents[1] / "simulations/scenarios/single-link-down.yaml"


def _start(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    env["TMPDIR"] = str(tmp)  # every temporary directory of the run lands here
    return subprocess.Popen(
        [sys.executable, "-m", "linkguard.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(cond, what: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"{what}: the run ended first ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.02)


def _processes_naming(text: str) -> list[int]:
    """PIDs whose command line contains ``text``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline and int(d.name) != os.getpid():
                found.append(int(d.name))
    return found


def _terminate(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the run did not end within 60 s of SIGTERM")
    return proc.returncode, err


def test_sigterm_stops_sim_run_over_mosquitto_and_removes_its_broker(tmp_path: Path) -> None:
    require_binary("mosquitto")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _start(["sim", "run", "--bus", "mosquitto", str(SCENARIO)], tmp)

    def broker_up() -> bool:
        return any(_processes_naming(str(c)) for c in tmp.glob("lg-live-*/broker/mosquitto.conf"))

    try:
        _wait_for(broker_up, "the private Mosquitto", proc)
        (conf,) = tmp.glob("lg-live-*/broker/mosquitto.conf")
        code, err = _terminate(proc)
        assert code == 143, err
        assert "sim run --bus mosquitto: stopped (SIGTERM)" in err
        assert _processes_naming(str(conf)) == []  # the broker went with it
        assert list(tmp.iterdir()) == []  # and its directory
    finally:  # what a failed run left behind
        for pid in _processes_naming(str(tmp)):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_the_quickstart_and_removes_its_state(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _start(["quickstart", "--hold-down", "30"], tmp)
    _wait_for(lambda: any(tmp.glob("linkguard-quickstart-*")), "the quickstart's directory", proc)
    code, err = _terminate(proc)
    assert code == 143, err
    assert "quickstart: stopped (SIGTERM)" in err
    assert list(tmp.iterdir()) == []
