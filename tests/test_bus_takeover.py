"""Issue 21 (hardening): a host cannot knock the topology service off the bus.

* On the deploy broker (deploy/mosquitto/mosquitto.conf and its ACL, TLS, make-certs.sh's
  users; :mod:`tests.test_bus_security` starts it) a host that connects with the service's
  client id (read from the retained ``service/status``'s instance) gets its own user name as
  client id (``use_username_as_clientid``): the service keeps its one session.
* The ACL grants a host its own topics at their depth only: junk deeper under its name (or
  beside its topics) never reaches the service, nor is it retained.
* Where the broker does not bind ids (a plain Mosquitto), the service notices the takeover:
  ``client_id_taken_over`` logged and ``linkguard_bus_client_id_taken_over_total`` counted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.bus import Bus
from linkguard.config import BusSettings, ServiceSettings
from linkguard.metrics import ServiceMetrics
from linkguard.models import HostStatus, encode
from linkguard.takeover import TakeoverWatch
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until
from tests.test_bus_security import (  # noqa: F401 (certs: the module's fixture)
    SERVICE,
    Inbox,
    certs,
    client,
    hardened_broker,
)

pytestmark = pytest.mark.real

FABRIC = generate_rail_optimized(hosts=2, rails=2)
A = FABRIC.hosts[0].host  # gpu000: also its MQTT user name


def _service(bus: BusSettings) -> TopologyService:
    return TopologyService(ServiceSettings(bus=bus, startup_settle_s=0), fabric=FABRIC)


async def test_a_host_with_the_services_client_id_does_not_kick_it(
    certs: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    with hardened_broker(certs, tmp_path) as secured:
        service = _service(secured.bus(SERVICE))
        task = asyncio.create_task(service.run())
        try:
            await service.bus.wait_connected(10)
            stolen = service.bus.client_id
            assert stolen.startswith("linkguard-topology-")
            attacker = Bus(**secured.bus(A).connection(), client_id=stolen)
            async with attacker:
                await attacker.wait_connected(10)
                status = HostStatus(host=A, online=True, instance="aa")
                assert await attacker.publish(topics.status(A), encode(status), retain=True)
                # the service hears the attacker's status on the session it had all along
                await until(lambda: service.state.online.get(A) is True, "A online")
                assert service.bus.connects == 1 and service.bus.connected.is_set()
            assert f"as {A} (p2, c1, k15, u'{A}')" in secured.log()  # its id: its user
            assert service.bus.connects == 1 and service.bus.takeovers == 0
        finally:
            service.stop()
            await asyncio.wait_for(task, 15)


async def test_a_host_writes_its_topics_only_at_their_depth(
    certs: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    with hardened_broker(certs, tmp_path) as secured:
        watch = Inbox()
        async with (
            client(
                secured.bus(SERVICE),
                "service",
                subscriptions=[topics.all_host_topics()],
                handler=watch,
            ) as service,
            client(secured.bus(A), "a") as a,
        ):
            await service.wait_connected(10)
            await a.wait_connected(10)
            host = f"linkguard/v1/hosts/{A}"
            junk = [
                f"{host}/junk",
                f"{host}/junk/deeper/still",
                f"{host}/ports/mlx5_0/1/extra",
                f"{host}/ports/mlx5_0",
                f"{host}/status/extra",
                f"{host}/inventory/x",
            ]
            for topic in junk:
                assert await a.publish(topic, b"junk", retain=True)
            mine = [
                topics.inventory(A),
                topics.port_state(A, "mlx5_0", 1),
                topics.ack(A),
                topics.probe_report(A),
            ]
            for topic in mine:
                assert await a.publish(topic, b"mine", retain=True)
            assert await a.publish(topics.events(A), b"control")
            await until(lambda: watch.index(topics.events(A), b"control") is not None, "control")
            assert [m.topic for m in watch.messages if m.payload == b"junk"] == []
            assert {m.topic for m in watch.messages if m.payload == b"mine"} == set(mine)


async def test_the_service_notices_a_takeover_of_its_client_id(mosquitto) -> None:
    """A plain Mosquitto (any client id for anyone): another client that keeps connecting
    with the service's id kicks it; the service says so (once, then every tenth) and counts."""
    service = _service(BusSettings(port=mosquitto.port, reconnect_min_s=0.05, reconnect_max_s=0.2))
    task = asyncio.create_task(service.run())
    try:
        await service.bus.wait_connected(10)
        attacker = Bus(
            host="127.0.0.1",
            port=mosquitto.port,
            client_id=service.bus.client_id,
            reconnect_min_s=0.05,
            reconnect_max_s=0.2,
        )
        with capture_logs() as logs:
            async with attacker:
                await until(lambda: service.bus.takeovers >= 2, "two takeovers noticed", 15)
        taken = [e for e in logs if e["event"] == "client_id_taken_over"]
        ours = [e for e in taken if e["client_id"] == service.bus.client_id]
        assert (
            ours
            and ours[0]["log_level"] == "error"
            and "use_username_as_clientid" in (ours[0]["hint"])
        )
        # logged when it starts, then once per ten more: fewer lines than takeovers
        assert len(ours) <= 1 + service.bus.takeovers // 10 + 1
        body, _ = ServiceMetrics(service).render()
        got = [
            line
            for line in body.decode().splitlines()
            if line.startswith("linkguard_bus_client_id_taken_over_total ")
        ]
        assert got and float(got[0].split()[1]) >= 2
        # the attacker gone, the service's session holds again
        connects = service.bus.connects
        await service.bus.wait_connected(10)
        assert service.bus.connects >= connects
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)


def test_the_takeover_watch_needs_repeated_short_sessions() -> None:
    w = TakeoverWatch(short_s=10, repeat=2)
    assert not w.session_ended(3600)  # a broker restart: one long session ends
    assert not w.session_ended(1.2)  # one short one: a flaky network, perhaps
    assert w.session_ended(1.1) and w.session_ended(0.9)  # kicked again and again
    w.attempt_failed()  # the broker is away: not a takeover
    assert not w.session_ended(1.0)
    assert not w.session_ended(30) and w.streak == 0


async def test_the_deploy_acl_lets_the_service_remove_a_departed_hosts_retained(
    certs: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """gpu001 left the fabric (the service's fabric is gpu000 alone): what it left retained,
    published with its own credentials, is deleted by the service under the deploy ACL."""
    b = FABRIC.hosts[1].host
    with hardened_broker(certs, tmp_path) as secured:
        async with client(secured.bus(b), "b") as old:
            await old.wait_connected(10)
            offline = HostStatus(host=b, online=False, reason="stopped")
            assert await old.publish(topics.status(b), encode(offline), retain=True)
            assert await old.publish(topics.port_state(b, "mlx5_0", 1), b"{}", retain=True)
        alone = generate_rail_optimized(hosts=1, rails=2)
        service = TopologyService(
            ServiceSettings(bus=secured.bus(SERVICE), startup_settle_s=0.2), fabric=alone
        )
        task = asyncio.create_task(service.run())
        try:
            with capture_logs() as logs:
                await until(
                    lambda: any(e["event"] == "stale_host_cleared" for e in logs), "cleared"
                )
        finally:
            service.stop()
            await asyncio.wait_for(task, 15)
        assert [(e["host"], e["topics"]) for e in logs if e["event"] == "stale_host_cleared"] == [
            (b, 2)
        ]
        got = Inbox()
        async with (
            client(
                secured.bus(SERVICE),
                "reader",
                subscriptions=[topics.all_host_topics()],
                handler=got,
            ) as reader,
            client(secured.bus(A), "a") as a,
        ):
            await reader.wait_connected(10)
            await a.wait_connected(10)
            assert await a.publish(topics.events(A), b"control")
            await until(lambda: got.index(topics.events(A), b"control") is not None, "control")
        assert [m.topic for m in got.messages if f"/{b}/" in m.topic] == []
