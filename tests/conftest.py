"""Fixtures shared by the whole suite: a real Mosquitto on a free loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from tests.support import require_binary

#: the workspace's real captures (``../shared/fixtures/real`` next to the repository), or
#: ``$LINKGUARD_FIXTURES`` for a clone elsewhere
FIXTURES = Path(
    os.environ.get(
        "LINKGUARD_FIXTURES",
        Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "real",
    )
)


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Each test starts with structlog's defaults: a command run in-process (``main([...])``)
    configures logging for the process, and its level would hide later tests' info events
    from ``capture_logs``."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@dataclass
class Broker:
    host: str
    port: int
    process: subprocess.Popen
    log: Path


def _wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"mosquitto did not listen on {host}:{port} within {timeout} s")


def start_mosquitto(tmp: Path, port: int = 0) -> Broker:
    """Start Mosquitto on ``port`` (0: a free one) of 127.0.0.1 with linkguard's settings."""
    binary = require_binary("mosquitto")
    if port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    conf = tmp / "mosquitto.conf"
    log = tmp / "mosquitto.log"
    # max_queued_messages: Mosquitto's default (1000) silently drops QoS 1 messages under
    # fan-in; every broker config linkguard ships or starts raises it.
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "max_queued_messages 100000\n"
        "max_inflight_messages 0\n"
        f"log_dest file {log}\n"
        "log_type error\nlog_type warning\n"
    )
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _wait_port("127.0.0.1", port, 10)
    except TimeoutError:
        proc.kill()
        raise
    return Broker("127.0.0.1", port, proc, log)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A private Mosquitto for one test, stopped afterwards."""
    broker = start_mosquitto(tmp_path)
    try:
        yield broker
    finally:
        broker.process.terminate()
        try:
            broker.process.wait(5)
        except subprocess.TimeoutExpired:
            broker.process.kill()


@pytest.fixture
def fixtures_real() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(
            f"real fixtures not found at {FIXTURES} (set LINKGUARD_FIXTURES to their directory)"
        )
    return FIXTURES
