"""Shared test helpers: the rule for tests that need the real thing (root, netns, mosquitto)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

#: .ci/run sets LINKGUARD_REQUIRE_REAL=1: tests that need root, netns or a binary then fail
#: instead of skipping, so CI never goes green on skipped real tests.
REQUIRE_REAL = os.environ.get("LINKGUARD_REQUIRE_REAL", "") not in ("", "0", "false", "no")


#: the real H100 capture (../shared/fixtures/real/leptonai-gpud) and its InfiniBand HCAs in
#: natural name order (its ninth device, mlx5_bond_0, is the RoCE LAG)
H100 = "leptonai-gpud/tree/sys-class-infiniband-h100.0"
H100_IB_HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


def missing(reason: str) -> None:
    """Skip (or fail under LINKGUARD_REQUIRE_REAL=1) with ``reason``."""
    if REQUIRE_REAL:
        pytest.fail(f"LINKGUARD_REQUIRE_REAL=1 but {reason}")
    pytest.skip(reason)


def require_root() -> None:
    """Network namespaces, veth and routing tables need root and iproute2."""
    if os.geteuid() != 0:
        missing("needs root (network namespaces)")
    if shutil.which("ip") is None:
        missing("needs iproute2 (`ip`)")


def require_binary(name: str) -> str:
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path is None:
        missing(f"needs the `{name}` binary")
    return path  # type: ignore[return-value]


async def until(cond: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Wait for ``cond()`` to be true, polling every 10 ms; fail naming ``what`` after
    ``timeout`` seconds. The one way tests wait: on a condition, with a deadline."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def retained(
    port: int, topic: str, *, until_payload: bytes = b"", timeout: float = 10
) -> bytes:
    """The payload retained (or next published) on ``topic`` of the broker on 127.0.0.1:
    ``port`` that contains ``until_payload``, read by a fresh MQTT client."""
    from linkguard.bus import Bus, BusMessage

    got: list[bytes] = []

    async def handler(m: BusMessage) -> None:
        got.append(m.payload)

    async with Bus(
        host="127.0.0.1",
        port=port,
        client_id=f"test-reader-{time.monotonic_ns()}",
        subscriptions=[topic],
        handler=handler,
    ):
        await until(lambda: got and until_payload in got[-1], f"a message on {topic}", timeout)
    return got[-1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 at the moment of asking (bound together, then
    released: the kernel does not hand out the same one twice in one call)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def topology_serve(
    fabric: Path, port: int, log: Path, *, settle_s: float, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``linkguard topology serve`` as a process of its own on the broker at 127.0.0.1:``port``,
    its output appended to ``log``; ``settle_s``: its start-up settle (s); ``env``: more
    ``LINKGUARD_*`` settings."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "linkguard"),
            "topology",
            "serve",
            "--fabric",
            str(fabric),
            "--broker",
            f"127.0.0.1:{port}",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "LINKGUARD_STARTUP_SETTLE_S": f"{settle_s:g}", **(env or {})},
    )


@contextlib.contextmanager
def netns_with(prefix: str, commands: list[str]) -> Iterator[str]:
    """A network namespace ``<prefix>-<random>`` with ``ip -n NS <command>`` run for each of
    ``commands`` (e.g. ``"link add a type veth peer name b"``); deleted on exit. Needs root."""
    require_root()
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in commands:
            subprocess.run(["ip", "-n", ns, *cmd.split()], check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
