"""The agents and the topology service on a 3-node NATS cluster serving MQTT 3.1.1.

Consumes: the Debian ``nats-server`` binary (skips without it; fails under
LINKGUARD_REQUIRE_REAL=1). Produces: a check that a real service and real agents
(:class:`~linkguard.simulations.fleet.SimulatedFleet`), their sessions spread over the three
nodes, converge through the cluster's MQTT listeners and re-plan a link down. (Failing over
to another node when one dies needs a broker list in ``bus``: not there yet.)

Each node: ``server_name`` (JetStream in a cluster needs it), JetStream on with its own
``store_dir`` (NATS keeps MQTT sessions and retained messages in JetStream streams), an
``mqtt`` listener, a ``cluster`` block routing to the other two, and the monitoring port
(``/routez``, ``/jsz``) the fixture polls until the cluster has formed. All on free loopback
ports; the system nats-server on 127.0.0.1:4222 is never touched.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus
from linkguard.config import BusSettings
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.generator import generate_rail_optimized
from tests.support import require_binary

CLUSTER_START_S = 30  # seconds for 3 nodes to route to each other and elect a JetStream leader


@dataclass
class Node:
    name: str
    mqtt_port: int
    http_port: int
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


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[list[Node]]:
    """Three clustered nats-server processes with MQTT and JetStream, stopped afterwards."""
    binary = require_binary("nats-server")
    ports = _free_ports(12)
    client, http, mqtt, route = ports[0:3], ports[3:6], ports[6:9], ports[9:12]
    routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route)
    nodes = []
    for i in range(3):
        d = tmp_path / f"n{i}"
        d.mkdir()
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
        nodes.append(Node(f"lg-n{i}", mqtt[i], http[i], conf, d / "nats.log"))
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


class _Spread:
    """A Bus factory that puts the n-th session on node n mod 3, so the service and the
    agents are on different nodes (the fleet shares one BusSettings)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.on: dict[str, Node] = {}

    def __call__(self, **kwargs: Any) -> Bus:
        node = self.nodes[len(self.on) % len(self.nodes)]
        self.on[kwargs["client_id"]] = node
        return Bus(**{**kwargs, "host": "127.0.0.1", "port": node.mqtt_port})


def _fleet(nodes: list[Node], tmp_path: Path, factory: _Spread) -> SimulatedFleet:
    bus = BusSettings(
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
        keepalive_s=5,
    )
    return SimulatedFleet(
        generate_rail_optimized(hosts=4, rails=2),
        bus=bus,
        workdir=tmp_path / "fleet",
        damping=DampingPolicy(hold_down_initial_s=0.5),
        debounce_ms=50,
        bus_factory=factory,
    )


async def _link_down_acked(fleet: SimulatedFleet, host: str, rail: int) -> None:
    """Take ``host``'s ``rail`` down; wait for the new plans and every host's ack of them."""
    state = fleet.service.state
    before = state.epoch
    fleet.link_down(host, rail)
    await wait_until(lambda: state.epoch > before, 60, f"the solve of {host} rail {rail} down")
    assert host in {h for h, p in state.plans.items() if p.epoch > before}
    await fleet.wait_all_acked(epoch_floor=before + 1, timeout=60)
    assert state.unusable() == {host: frozenset({rail})}
    assert fleet.agents[host].applier.applied_epoch == state.plans[host].epoch > before


@pytest.mark.real
async def test_fleet_converges_on_nats_cluster(nats_cluster: list[Node], tmp_path: Path) -> None:
    factory = _Spread(nats_cluster)
    async with _fleet(nats_cluster, tmp_path, factory) as fleet:
        await fleet.wait_all_acked(timeout=60)
        # the sessions are on all three nodes: plans and acks cross the cluster's routes
        assert {n.name for n in factory.on.values()} == {n.name for n in nats_cluster}
        assert all(a.bus.connected.is_set() for a in fleet.agents.values())
        await _link_down_acked(fleet, "gpu002", 1)
