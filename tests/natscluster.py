"""A 3-node NATS cluster serving MQTT 3.1.1 (Debian ``nats-server`` 2.9, JetStream on), on free
loopback ports, for tests/test_nats_cluster.py and the e2e tests run on it
(``LINKGUARD_E2E_BROKER=nats``, tests/e2e/conftest.py).

Each node: ``server_name`` (JetStream in a cluster needs it), JetStream on with its own
``store_dir``, an ``mqtt`` listener, a ``cluster`` block routing to the other two, its NATS
client port (the JetStream API) and the monitoring port (``/routez``, ``/jsz``) polled until the
cluster has formed. The system nats-server on 127.0.0.1:4222 is never touched.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from linkguard.bus import Bus
from tests.support import free_ports, require_binary

CLUSTER_START_S = 30  # seconds for 3 nodes to route to each other and elect a JetStream leader
#: the JetStream streams NATS keeps MQTT state in (nats-server 2.9 server/mqtt.go)
MQTT_STREAMS = ("$MQTT_sess", "$MQTT_msgs", "$MQTT_rmsgs")
#: seconds allowed for the sessions of a dead node to be back on another one (measured 17-70 s
#: with nats-server 2.9.10: see the module docstring)
REELECTION_S = 120


@dataclass
class Node:
    name: str
    mqtt_port: int
    http_port: int
    client_port: int
    conf: Path
    log: Path
    process: subprocess.Popen | None = None

    @property
    def broker(self) -> str:
        return f"127.0.0.1:{self.mqtt_port}"

    def monitor(self, path: str) -> dict[str, Any] | None:
        """The JSON of a monitoring endpoint, or None while the node does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=1) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def leaders(self) -> dict[str, str | None]:
        """Who leads what, as this node sees it: ``meta`` (the JetStream meta group) and each
        MQTT stream (missing: this node does not know the stream; None: no leader now)."""
        jsz = self.monitor("/jsz?accounts=true&streams=true") or {}
        out: dict[str, str | None] = {"meta": (jsz.get("meta_cluster") or {}).get("leader")}
        for account in jsz.get("account_details") or ():
            for stream in account.get("stream_detail") or ():
                out[stream["name"]] = (stream.get("cluster") or {}).get("leader")
        return out

    def js_api(self, subject: str) -> dict[str, Any]:
        """One JetStream API request over the NATS client protocol (no NATS client library
        here): the JSON reply. OSError/ValueError when the node does not answer."""
        with socket.create_connection(("127.0.0.1", self.client_port), timeout=5) as s:
            f = s.makefile("rb")
            f.readline()  # INFO {...}
            s.sendall(
                b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.lg 1\r\n'
                + f"PUB {subject} _INBOX.lg 0\r\n\r\n".encode()
            )
            while line := f.readline():
                if line.startswith(b"PING"):
                    s.sendall(b"PONG\r\n")
                elif line.startswith(b"MSG "):
                    size = int(line.split()[-1])
                    return json.loads(f.read(size + 2)[:size])
                elif line.startswith(b"-ERR"):
                    raise ValueError(line.decode().strip())
            raise OSError(f"{self.name} closed the connection")


def _mqtt_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _formed(nodes: list[Node]) -> bool:
    for node in nodes:
        routes = node.monitor("/routez")
        jsz = node.monitor("/jsz")
        if not routes or routes.get("num_routes", 0) < len(nodes) - 1:
            return False
        if not jsz or not (jsz.get("meta_cluster") or {}).get("leader"):
            return False
        if not _mqtt_accepts(node.mqtt_port):
            return False
    return True


async def _warm_up(nodes: list[Node]) -> None:
    """One MQTT session per node, in turn: the first MQTT client of an account makes the
    cluster create its MQTT streams (R3); CONNECTs that race that creation on other nodes
    time out ("lookup sessions stream ... timeout" in the node's log)."""
    for node in nodes:
        async with Bus(host="127.0.0.1", port=node.mqtt_port, client_id=f"warm-{node.name}") as b:
            await b.wait_connected(CLUSTER_START_S)


@contextmanager
def start_cluster(tmp_path: Path) -> Iterator[list[Node]]:
    """Three clustered nats-server processes with MQTT and JetStream in ``tmp_path``, formed
    and warmed up (each node has served one MQTT session), stopped on exit. Fails the test
    (with the nodes' logs) when the cluster does not form within :data:`CLUSTER_START_S`."""
    binary = require_binary("nats-server")
    ports = free_ports(12)
    client, http, mqtt, route = ports[0:3], ports[3:6], ports[6:9], ports[9:12]
    routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route)
    nodes = []
    for i in range(3):
        d = tmp_path / f"n{i}"
        d.mkdir(parents=True)
        conf = d / "nats.conf"
        conf.write_text(
            f"server_name: lg-n{i}\n"
            f"listen: 127.0.0.1:{client[i]}\n"
            f"http: 127.0.0.1:{http[i]}\n"
            f'jetstream {{ store_dir: "{d / "js"}" }}\n'
            f"mqtt {{ listen: 127.0.0.1:{mqtt[i]} }}\n"
            f"cluster {{ name: linkguard-test, listen: 127.0.0.1:{route[i]}, "
            f"routes: [{routes}] }}\n"
        )
        nodes.append(Node(f"lg-n{i}", mqtt[i], http[i], client[i], conf, d / "nats.log"))
    try:
        for node in nodes:
            node.process = subprocess.Popen(
                [binary, "-c", str(node.conf), "-l", str(node.log)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + CLUSTER_START_S
        while not _formed(nodes):
            dead = [n.name for n in nodes if n.process and n.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(n.log.read_text()[-2000:] for n in nodes if n.log.exists())
                pytest.fail(f"NATS cluster not formed (exited: {dead}):\n{logs}")
            time.sleep(0.05)
        asyncio.run(_warm_up(nodes))
        yield nodes
    finally:
        for node in nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    node.kill()
