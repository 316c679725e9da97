"""Switch-level faults over the bus: ``linkguard fabric faults`` publishes a FabricFaults set
retained on ``fabric/faults``; a real topology service (in-process, real Mosquitto) applies
it to its plans and keeps the health on ``service/health``; impossible or malformed sets are
dropped whole."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.bus import Bus, BusMessage
from linkguard.cli import main
from linkguard.config import BusSettings, ServiceSettings
from linkguard.models import CableRef, FabricFaults, Plan, decode, encode
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from linkguard.topology.solver import egress, solve
from tests.support import retained, until

# 64 hosts x 4 rails = 2 SUs of 32 hosts; every leaf has 4 cables to each of the 8 spines
FABRIC = generate_rail_optimized(hosts=64, rails=4)
SPINES = [s.name for s in FABRIC.switches if s.role == "spine"]
SU0 = [h.host for h in FABRIC.hosts[:32]]
NOMINAL_GBPS = 256 * 400.0 / 2  # 8 leaves x 32 uplinks of 400 Gb/s, halved
LEAF_GBPS = 32 * 400.0


def _cut_off(leaf: str, reason: str | None = None) -> FabricFaults:
    """Every uplink of ``leaf`` down, named both ways round."""
    cables = [
        CableRef(a=leaf, b=s) if i % 2 else CableRef(a=s, b=leaf) for i, s in enumerate(SPINES)
    ]
    return FabricFaults(cables_down=cables, reason=reason, at=time.time())


def _same(plans: dict[str, Plan], want: dict[str, Plan]) -> bool:
    return plans.keys() == want.keys() and all(plans[h].same_assignments(want[h]) for h in want)


@pytest.fixture
async def service_on_bus(mosquitto):
    """A running service on FABRIC, its first plans made, and an operator client that
    collects every ``service/health`` document."""
    bus = BusSettings(port=mosquitto.port, reconnect_min_s=0.05, max_message_bytes=64 * 1024)
    service = TopologyService(
        ServiceSettings(bus=bus, debounce_ms=0, startup_settle_s=0), fabric=FABRIC
    )
    task = asyncio.create_task(service.run())
    health: list[dict] = []

    async def on_health(msg: BusMessage) -> None:
        health.append(json.loads(msg.payload))

    try:
        async with Bus(
            host="127.0.0.1",
            port=mosquitto.port,
            client_id="operator",
            subscriptions=[topics.service_health()],
            handler=on_health,
        ) as operator:
            await operator.wait_connected(10)
            await until(lambda: len(service.state.plans) == 64, "the first plans")
            await until(lambda: health, "the nominal health")
            yield service, operator, health
    finally:
        service.stop()
        await asyncio.wait_for(task, 10)


@pytest.mark.real
async def test_a_cut_off_leaf_moves_its_rail_and_clearing_moves_it_back(service_on_bus) -> None:
    service, operator, health = service_on_bus
    nominal = health[-1]
    assert nominal["faults"] is None and nominal["leaves_cut_off"] == []
    assert nominal["bisection_gbps"] == nominal["nominal_bisection_gbps"] == NOMINAL_GBPS
    original = dict(service.state.plans)
    ep = FABRIC.host("gpu005").endpoints[1]  # GPU 1 of an SU-0 host: home rail 1
    assert egress(original["gpu040"], ep) == (1,)

    faults = _cut_off("su0-leaf1", reason="CHG-1")
    with capture_logs() as logs:
        await operator.publish(topics.fabric_faults(), encode(faults), retain=True)
        # SU 0's hosts lose rail 1: every plan is what the solver makes of exactly that
        want = solve(FABRIC, {h: frozenset({1}) for h in SU0}, epoch=1, now=0.0)
        await until(lambda: _same(service.state.plans, want), "plans without SU 0's rail 1")
        await until(lambda: health[-1]["faults"] is not None, "the health of the faults")
    out = egress(service.state.plans["gpu040"], ep)
    assert out and 1 not in out
    assert all(
        a.rail != 1 for h in SU0 for a in service.state.plans[h].rail_assignments if a.gpu == 1
    )
    doc = health[-1]
    assert doc["leaves_cut_off"] == ["su0-leaf1"] and doc["leaves_down"] == []
    assert doc["hosts_losing_rails"] == 32
    assert doc["bisection_gbps"] == NOMINAL_GBPS - LEAF_GBPS / 2
    assert doc["nominal_bisection_gbps"] == NOMINAL_GBPS
    assert doc["faults"] == faults.model_dump(mode="json") and doc["at"] >= faults.at
    (event,) = [e for e in logs if e["event"] == "fabric_faults"]
    assert event["leaves_cut_off"] == ["su0-leaf1"] and event["hosts_losing_rails"] == 32
    assert len(event["cables_down"]) == 8 and event["reason"] == "CHG-1"

    cleared = FabricFaults(reason="repaired", at=time.time())
    await operator.publish(topics.fabric_faults(), encode(cleared), retain=True)
    await until(lambda: _same(service.state.plans, original), "the original plans")
    await until(lambda: health[-1]["faults"] == cleared.model_dump(mode="json"), "health")
    assert health[-1]["leaves_cut_off"] == [] and health[-1]["hosts_losing_rails"] == 0
    assert health[-1]["bisection_gbps"] == NOMINAL_GBPS
    assert service.dropped == {}


@pytest.mark.real
async def test_impossible_or_malformed_faults_are_dropped_whole(service_on_bus) -> None:
    service, operator, health = service_on_bus
    good = FabricFaults(switches_down=["su1-spine0"], at=time.time())  # moves nothing
    await operator.publish(topics.fabric_faults(), encode(good), retain=True)
    await until(lambda: health[-1]["faults"] is not None, "the good set applied")
    plans, epoch, state_health = (
        dict(service.state.plans),
        service.state.epoch,
        service.state.health,
    )
    seen = len(health)
    cases = [
        (  # a real leaf down, named together with a switch the fabric does not have
            FabricFaults(switches_down=["su0-leaf2", "su7-spine9"], at=time.time()),
            "invalid",
            "unknown switch 'su7-spine9'",
        ),
        (
            FabricFaults(cables_down=[CableRef(a="su0-leaf2", b="su0-spine0", count=5)], at=1),
            "invalid",
            "5 down but the fabric has only 4",
        ),
        (b'{"switches_down": ["su0-leaf2"], "at": ', "not_json", "Invalid JSON"),
        (b'{"switches_down": ["su0-leaf2"]}', "invalid", "at: Field required"),
    ]
    with capture_logs() as logs:
        for payload, _, _ in cases:
            data = payload if isinstance(payload, bytes) else encode(payload)
            await operator.publish(topics.fabric_faults(), data, retain=True)
        await until(lambda: sum(service.dropped.values()) == len(cases), "all four dropped")
    assert service.dropped == {"invalid": 3, "not_json": 1}
    dropped = [e for e in logs if e["event"] == "message_dropped"]
    assert [(e["topic"], e["reason"]) for e in dropped] == [
        (topics.fabric_faults(), reason) for _, reason, _ in cases
    ]
    for e, (_, _, detail) in zip(dropped, cases, strict=True):
        assert detail in e["detail"], e
    assert not [e for e in logs if e["event"] == "fabric_faults"]
    assert service.state.health is state_health and service.faults == good
    assert service.state.epoch == epoch and service.state.plans == plans
    # the next good set still gets through: the first health document since the bad ones
    repaired = FabricFaults(at=time.time())
    await operator.publish(topics.fabric_faults(), encode(repaired), retain=True)
    await until(lambda: len(health) > seen, "the next health document")
    assert health[seen]["faults"] == repaired.model_dump(mode="json")
    assert service.state.plans == plans  # a spine coming back moves nothing either


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "linkguard.cli",
        "fabric",
        "faults",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.real
async def test_cli_publishes_the_set_the_service_applies(service_on_bus, mosquitto) -> None:
    service, _, health = service_on_bus
    broker = f"127.0.0.1:{mosquitto.port}"
    cables = [f"{s},su1-leaf3" for s in SPINES[:7]] + [f"su1-leaf3,{SPINES[7]},4"]
    args = [f"--cable-down={c}" for c in cables]
    code, out, err = await _cli("--broker", broker, *args, "--switch-down", "su0-spine2")
    assert (code, err) == (0, "")
    assert "1 switch(es) down, cables down between 8 switch pair(s)" in out
    doc = decode(FabricFaults, await retained(mosquitto.port, topics.fabric_faults()))
    assert doc.switches_down == ["su0-spine2"] and doc.reason is None
    assert [(c.a, c.b, c.count) for c in doc.cables_down] == [
        *((s, "su1-leaf3", None) for s in SPINES[:7]),
        ("su1-leaf3", SPINES[7], 4),
    ]
    await until(lambda: health[-1]["leaves_cut_off"] == ["su1-leaf3"], "the leaf cut off")
    assert service.state.unusable() == {h.host: frozenset({3}) for h in FABRIC.hosts[32:]}

    code, out, err = await _cli("--broker", broker, "--clear", "--reason", "all repaired")
    assert (code, err) == (0, "") and "no faults (cleared)" in out
    doc = decode(
        FabricFaults,
        await retained(mosquitto.port, topics.fabric_faults(), until_payload=b"all repaired"),
    )
    assert doc.switches_down == [] and doc.cables_down == [] and doc.reason == "all repaired"
    await until(lambda: service.state.unusable() == {}, "the rail back")


@pytest.mark.real
async def test_cli_unreachable_broker_exits_1() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = await _cli(
        "--broker", f"127.0.0.1:{port}", "--switch-down", "su0-leaf0", "--timeout", "0.5"
    )
    assert code == 1 and out == ""
    assert f"cannot reach the MQTT broker at 127.0.0.1:{port} within 0.5 s" in err
    assert "nothing published" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nothing to publish"),
        (["--clear", "--switch-down", "x"], "--clear publishes an empty set"),
        (["--cable-down", "a"], "must be A,B or A,B,COUNT"),
        (["--cable-down", "a,b,two"], "COUNT must be a whole number"),
        (["--cable-down", "a,b,0"], "COUNT: Input should be greater than or equal to 1"),
        (["--cable-down", "a,a"], "a cable joins two switches"),
        (["--cable-down", "a,b", "--cable-down", "b,a,1"], "cables between b and a listed twice"),
        (["--switch-down=bad name"], "--switch-down 'bad name': a switch name is letters"),
        (["--switch-down", "x", "--reason", "r" * 201], "--reason: String should have at most"),
        (["--clear", "--broker", "localhost"], "HOST:PORT"),
    ],
)
def test_cli_bad_arguments_exit_2(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["fabric", "faults", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "linkguard fabric faults" in err


def test_cli_bad_config_exits_2(tmp_path, capsys) -> None:
    missing = tmp_path / "service.yaml"
    assert main(["fabric", "faults", "-c", str(missing), "--clear"]) == 2
    assert f"config file {missing} does not exist" in capsys.readouterr().err
