"""Fixtures shared by the whole suite: a real Mosquitto on a free loopback port."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import structlog

from linkguard.broker import MosquittoProcess
from tests.support import require_binary

#: the workspace's real captures (``../shared/fixtures/real`` next to the repository), or
#: ``$LINKGUARD_FIXTURES`` for a clone elsewhere
FIXTURES = Path(
    os.environ.get(
        "LINKGUARD_FIXTURES",
        Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "real",
    )
)


#: what marks a test module as one that changes the kernel's network state (namespaces, veth
#: pairs, routes, labs): under pytest-xdist (``-n``) all of them run on one worker, one at a
#: time, as without it (a lab test lists every lab namespace; two labs would see each other's)
_KERNEL_MARKS = ("require_root(", "netns", "Lab.create", '"ip"')


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n N --dist loadgroup``, the README's test command): each
    module's tests stay on one worker (module fixtures, a module's private Slurm cluster or
    NATS cluster, start once), and every module touching the kernel's network state shares
    one group, so those run one at a time. Without xdist (``pytest tests/x.py``) nothing is
    marked."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    kernel: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in kernel:
            text = path.read_text(encoding="utf-8", errors="replace")
            kernel[path] = any(m in text for m in _KERNEL_MARKS)
        group = "kernel" if kernel[path] else str(path.relative_to(Path(__file__).parent))
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    """Each test starts with structlog's defaults: a command run in-process (``main([...])``)
    configures logging for the process, and its level would hide later tests' info events
    from ``capture_logs``."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _no_api_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Services built by tests (in-process or ``linkguard topology serve`` subprocesses) open
    no HTTP API on 127.0.0.1:8470 unless the test asks (``api=ApiSettings(port=0)``)."""
    monkeypatch.setenv("LINKGUARD_API__ENABLED", "false")


@dataclass
class Broker:
    host: str
    port: int
    process: subprocess.Popen
    log: Path
    handle: MosquittoProcess


def start_mosquitto(tmp: Path, port: int = 0) -> Broker:
    """Start Mosquitto on ``port`` (0: a free one) of 127.0.0.1 with linkguard's settings
    (:class:`linkguard.broker.MosquittoProcess`)."""
    binary = require_binary("mosquitto")
    m = MosquittoProcess(tmp, port=port, binary=binary).start()
    assert m.process is not None
    return Broker(m.host, m.port, m.process, m.log, m)


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A private Mosquitto for one test, stopped afterwards."""
    broker = start_mosquitto(tmp_path)
    try:
        yield broker
    finally:
        broker.handle.stop()


@pytest.fixture
def fixtures_real() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(
            f"real fixtures not found at {FIXTURES} (set LINKGUARD_FIXTURES to their directory)"
        )
    return FIXTURES
