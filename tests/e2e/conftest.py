"""The broker the e2e tests run on: a private Mosquitto (the default), or with
``LINKGUARD_E2E_BROKER=nats`` a 3-node NATS cluster serving MQTT (tests/natscluster.py), so the
same tests run unchanged on a clustered broker (issue 6; CI runs both). The fixture keeps the
name ``mosquitto`` the tests ask for; on NATS it gives the first node's MQTT listener (host,
port), and every process of the test connects there: retained messages, QoS 1 publishes and
last wills then go through JetStream's replicated streams. On NATS every process subscribes at
QoS 0, the setting for NATS (docs/operations.md): a QoS 1 subscription is a JetStream consumer,
and under CPU load nats-server 2.9.10's consumers skipped messages (8 of 28 loaded runs lost a
plan or an ack; none of 16 at QoS 0)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import start_mosquitto
from tests.natscluster import start_cluster

BROKERS = ("mosquitto", "nats")


@dataclass
class ClusterNode:
    host: str
    port: int


@pytest.fixture
def mosquitto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    kind = os.environ.get("LINKGUARD_E2E_BROKER", "mosquitto")
    if kind not in BROKERS:
        pytest.fail(f"LINKGUARD_E2E_BROKER={kind!r}: expected one of {', '.join(BROKERS)}")
    if kind == "nats":
        # the setting for NATS (docs/operations.md), for the service, the agents (they inherit
        # the environment) and the test's observer: QoS 0 subscriptions, no JetStream consumers
        monkeypatch.setenv("LINKGUARD_BUS__SUBSCRIBE_QOS", "0")
        with start_cluster(tmp_path / "nats") as nodes:
            yield ClusterNode("127.0.0.1", nodes[0].mqtt_port)
        return
    broker = start_mosquitto(tmp_path)
    try:
        yield broker
    finally:
        broker.handle.stop()
