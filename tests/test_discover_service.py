"""The topology service on a discovered fabric (``fabric: {discover: ...}``), real Mosquitto:
it plans the hosts whose discovery documents are on the bus, plans a host when its document
arrives later, refuses a forged document, and puts what contradicts the expected fabric in its
fleet audit."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.bus import Bus
from linkguard.config import BusSettings, ServiceSettings
from linkguard.models import HCAInfo, HostInventory, LinkLayer, Plan, decode, encode
from linkguard.models.discovery import HostDiscovery, NetdevFacts, RdmaPortFacts
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
from linkguard.topology.service import run_discovered
from tests.support import retained, until
from tests.topology.test_discover import _dump

pytestmark = pytest.mark.real


def _guid(h: int, r: int) -> str:
    return f"{h + 0xA0:08x}{r:08x}"  # never a switch GUID of _dump (1, 2, ...)


def _doc(h: int, rails: int = 2) -> HostDiscovery:
    """Host ``gpu00h`` as an agent reports it: one IB HCA per rail with its GUIDs, IPoIB
    netdev and the address the generator gives it, two configured GPU endpoints."""
    name = f"gpu{h:03d}"
    ports, netdevs, hcas = [], [], []
    for r in range(rails):
        addr = ipaddress.IPv4Interface(f"10.100.{r}.{h + 1}/24")
        ports.append(
            RdmaPortFacts(
                hca=f"mlx5_{r}",
                link_layer=LinkLayer.INFINIBAND,
                netdev=f"ib{r}",
                node_guid=_guid(h, r),
                port_guid=_guid(h, r),
            )
        )
        netdevs.append(NetdevFacts(name=f"ib{r}", kind="ipoib", ipv4=[addr]))
        hcas.append(HCAInfo(hca=f"mlx5_{r}", rail=r, netdev=f"ib{r}"))
    inv = HostInventory(
        host=name,
        hcas=hcas,
        endpoints=[ipaddress.IPv4Address(f"10.200.{g}.{h + 1}") for g in range(rails)],
    )
    return HostDiscovery(host=name, inventory=inv, ports=ports, netdevs=netdevs)


async def _publish(port: int, *docs: tuple[str, bytes]) -> None:
    async with Bus(host="127.0.0.1", port=port, client_id=f"t-{time.monotonic_ns()}") as bus:
        await bus.wait_connected(5)
        for topic, payload in docs:
            assert await bus.publish(topic, payload, retain=True, wait_puback=True)


async def test_the_service_plans_what_it_discovers(mosquitto, tmp_path: Path) -> None:
    hosts, rails = 3, 2
    # leaf r holds rail r of every host, but gpu001's rail 1 is cabled to leaf 0
    cables = [(_guid(h, r), f"su0-leaf{r}", h + 1) for h in range(hosts) for r in range(rails)]
    cables[3] = (_guid(1, 1), "su0-leaf0", 10)
    dump = tmp_path / "ibnetdiscover.txt"
    dump.write_text(_dump(cables))
    # the fabric that should be: every host's rail r on leaf r
    expected = generate_rail_optimized(
        hosts=hosts,
        rails=rails,
        hosts_per_su=hosts,
        spines_per_su=0,
        hca="mlx5_{r}",
        netdev="ib{r}",
    )
    exp_path = tmp_path / "expected.yaml"
    exp_path.write_text(dump_fabric(expected, "yaml"))
    settings = ServiceSettings(
        fabric={
            "discover": {"ibnetdiscover": dump, "settle_s": 0.3, "name": "lab"},
            "expected": exp_path,
        },
        bus=BusSettings(port=mosquitto.port, reconnect_min_s=0.05),
        api={"enabled": False},
        startup_settle_s=0.2,
    )
    await _publish(
        mosquitto.port,
        (topics.discovery("gpu000"), encode(_doc(0))),
        (topics.discovery("gpu001"), encode(_doc(1))),
        # forged: gpu001's document on gpu009's topic
        (topics.discovery("gpu009"), encode(_doc(1))),
    )
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(run_discovered(settings, settings.fabric, stop=stop))
        try:
            for h in (0, 1):
                plan = decode(Plan, await retained(mosquitto.port, topics.plan(f"gpu{h:03d}")))
                assert plan.host == f"gpu{h:03d}"
            # gpu002 reports later: the fabric is built again and gpu002 gets a plan
            await _publish(mosquitto.port, (topics.discovery("gpu002"), encode(_doc(2))))
            plan = decode(Plan, await retained(mosquitto.port, topics.plan("gpu002"), timeout=15))
            assert plan.host == "gpu002"
            audit = json.loads(await retained(mosquitto.port, topics.service_audit(), timeout=15))
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    built = [e for e in logs if e["event"] == "fabric_discovered"]
    assert [e["hosts"] for e in built][:1] == [2] and built[-1]["hosts"] == 3
    assert any(e["event"] == "fabric_discovery_changed" and e["hosts"] == 3 for e in logs)
    refused = [e for e in logs if e["event"] == "discovery_document_refused"]
    assert refused and "gpu009" in refused[0]["detail"] and "gpu001" in refused[0]["detail"]
    # the discovered switches are named by the dump (S-000...), the expected ones su0-leaf<r>:
    # matched by the hosts' votes; the port discovery left out (not rail-optimized) is the one
    # contradiction, in the audit
    assert [(f["kind"], f["subject"]) for f in audit["findings"]] == [
        ("missing_link", "gpu001:mlx5_1/1")
    ]


async def test_a_host_that_cannot_be_placed_keeps_the_service_waiting(
    mosquitto, tmp_path: Path
) -> None:
    dump = tmp_path / "ibnetdiscover.txt"
    dump.write_text(_dump([("00000000000000aa", "leaf", 1)]))  # nobody's GUID
    settings = ServiceSettings(
        fabric={"discover": {"ibnetdiscover": dump, "settle_s": 0.2}},
        bus=BusSettings(port=mosquitto.port, reconnect_min_s=0.05),
        api={"enabled": False},
    )
    await _publish(
        mosquitto.port,
        (topics.discovery("gpu000"), encode(_doc(0))),
        (topics.discovery("junk"), b"{garbage"),
    )
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(run_discovered(settings, settings.fabric, stop=stop))
        await until(lambda: any(e["event"] == "fabric_discovery_waiting" for e in logs), "waiting")
        stop.set()
        await asyncio.wait_for(task, 10)
    refused = [e["detail"] for e in logs if e["event"] == "discovery_document_refused"]
    assert refused and refused[0].startswith("linkguard/v1/hosts/junk/discovery: not_json")
    unknown = {(e["host"], e["device"], e["rule"]) for e in logs if e.get("rule")}
    assert unknown == {
        ("gpu000", "mlx5_0/1", "not_in_switch_graph"),
        ("gpu000", "mlx5_1/1", "not_in_switch_graph"),
    }


def test_config_check_reads_the_discovery_inputs(tmp_path: Path) -> None:
    """``linkguard config check`` refuses what the service would refuse at start: a switch
    graph file that cannot be read, a second graph; it takes a good one."""
    import subprocess
    import sys

    dump = tmp_path / "dump.txt"
    dump.write_text(_dump([(_guid(0, 0), "leaf", 1)]))

    def check(fabric: str) -> subprocess.CompletedProcess[str]:
        cfg = tmp_path / "topology.yaml"
        cfg.write_text(f"fabric: {fabric}\napi: {{enabled: false}}\n")
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "linkguard.cli",
                "config",
                "check",
                str(cfg),
                "--role",
                "service",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = check(f"{{discover: {{ibnetdiscover: {dump}, rail_prefix: 10.100.0.0/16}}}}")
    assert ok.returncode == 0, ok.stderr
    assert "ibnetdiscover: " + str(dump) in ok.stdout
    missing = check(f"{{discover: {{ibnetdiscover: {tmp_path / 'absent.txt'}}}}}")
    assert missing.returncode != 0
    assert "fabric.discover: cannot read" in missing.stdout + missing.stderr
    both = check(f"{{discover: {{ibnetdiscover: {dump}, lldp: true}}}}")
    assert both.returncode != 0
    assert "give one switch graph" in both.stdout + both.stderr
    typo = check(f"{{discover: {{ibnetdiscover: {dump}, setle_s: 3}}}}")
    said = typo.stdout + typo.stderr
    assert typo.returncode != 0 and "fabric.discovery.discover.setle_s" in said
    assert "lax-or-strict" not in said  # the discovery section's error, not the file path's
