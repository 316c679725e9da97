"""Switch-level faults over the bus: ``linkguard fabric faults`` publishes a FabricFaults set
retained on ``fabric/faults``; a real topology service (in-process, real Mosquitto) applies
it to its plans and keeps the health on ``service/health``; impossible or malformed sets are
dropped whole."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.bus import Bus, BusMessage
from linkguard.cli import main
from linkguard.config import BusSettings, ServiceSettings
from linkguard.models import CableRef, FabricFaults, Plan, decode, encode
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
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


@contextlib.asynccontextmanager
async def _service(port: int) -> AsyncIterator[TopologyService]:
    """A topology service on FABRIC running until the block ends, its plans made (or taken
    from the retained ones)."""
    bus = BusSettings(port=port, reconnect_min_s=0.05, max_message_bytes=64 * 1024)
    service = TopologyService(
        ServiceSettings(bus=bus, solve={"short_ms": 0}, startup_settle_s=0), fabric=FABRIC
    )
    task = asyncio.create_task(service.run())
    try:
        await until(lambda: len(service.state.plans) == 64, "the first plans")
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def _operator(port: int) -> AsyncIterator[tuple[Bus, list[dict]]]:
    """An operator client that collects every ``service/health`` document."""
    health: list[dict] = []

    async def on_health(msg: BusMessage) -> None:
        health.append(json.loads(msg.payload))

    async with Bus(
        host="127.0.0.1",
        port=port,
        client_id="operator",
        subscriptions=[topics.service_health()],
        handler=on_health,
    ) as operator:
        await operator.wait_connected(10)
        yield operator, health


@pytest.fixture
async def service_on_bus(mosquitto):
    """A running service on FABRIC, its first plans made, and an operator client that
    collects every ``service/health`` document."""
    async with _operator(mosquitto.port) as (operator, health), _service(mosquitto.port) as service:
        await until(lambda: health, "the nominal health")
        yield service, operator, health


@pytest.mark.real
async def test_a_cut_off_leaf_moves_its_rail_and_clearing_moves_it_back(service_on_bus) -> None:
    service, operator, health = service_on_bus
    nominal = health[-1]
    assert nominal["faults"] is None and nominal["leaves_cut_off"] == []
    assert nominal["refused"] is None and nominal["degraded_rails"] == []
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
        # 32 hosts without rail 1 make it degraded (>= DEGRADED_AFTER_HOSTS): once solved,
        # the health says so
        await until(lambda: health[-1]["degraded_rails"] == [1], "rail 1 degraded")
    assert service.state.solver.degraded == {1}
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
    assert doc["refused"] is None
    (event,) = [e for e in logs if e["event"] == "fabric_faults"]
    assert event["leaves_cut_off"] == ["su0-leaf1"] and event["hosts_losing_rails"] == 32
    assert len(event["cables_down"]) == 8 and event["reason"] == "CHG-1"

    cleared = FabricFaults(reason="repaired", at=time.time())
    await operator.publish(topics.fabric_faults(), encode(cleared), retain=True)
    await until(lambda: _same(service.state.plans, original), "the original plans")
    await until(lambda: health[-1]["faults"] == cleared.model_dump(mode="json"), "health")
    assert health[-1]["leaves_cut_off"] == [] and health[-1]["hosts_losing_rails"] == 0
    assert health[-1]["bisection_gbps"] == NOMINAL_GBPS
    await until(lambda: health[-1]["degraded_rails"] == [], "rail 1 no longer degraded")
    assert service.dropped == {}


@pytest.mark.real
async def test_impossible_or_malformed_faults_are_refused_and_the_good_set_put_back(
    service_on_bus, mosquitto
) -> None:
    service, operator, health = service_on_bus
    good = FabricFaults(switches_down=["su1-spine0"], at=time.time())  # moves nothing
    await operator.publish(topics.fabric_faults(), encode(good), retain=True)
    await until(lambda: health[-1]["faults"] is not None, "the good set applied")
    plans, epoch, state_health = (
        dict(service.state.plans),
        service.state.epoch,
        service.state.health,
    )
    unknown = FabricFaults(switches_down=["su0-leaf2", "su7-spine9"], at=time.time())
    cases = [
        (  # a real leaf down, named together with a switch the fabric does not have
            unknown,
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
        (b'{"reason": "' + b"x" * 70_000 + b'", "at": 1}', "oversized", "bytes > 65536"),
    ]
    for payload, reason, detail in cases:
        data = payload if isinstance(payload, bytes) else encode(payload)
        seen = len(health)
        with capture_logs() as logs:
            await operator.publish(topics.fabric_faults(), data, retain=True)
            await until(lambda n=seen: len(health) > n, f"the health refusing {data[:40]!r}")
        (dropped,) = [e for e in logs if e["event"] == "message_dropped"]
        assert (dropped["topic"], dropped["reason"]) == (topics.fabric_faults(), reason)
        assert detail in dropped["detail"]
        assert not [e for e in logs if e["event"] == "fabric_faults"]
        # the refused set replaced the good one on the broker: the service put the good one
        # back (before its health document), so a restarted service reads the good one
        assert decode(FabricFaults, await retained(mosquitto.port, topics.fabric_faults())) == good
        refused = health[-1]["refused"]
        assert refused["reason"] == reason and detail in refused["detail"]
        assert refused["at"] >= health[-1]["at"]
        # the refused payload as JSON; as text when it is not JSON (the first 2,000 bytes)
        want = json.loads(data) if reason == "invalid" else data[:2000].decode()
        assert refused["faults"] == want
        assert health[-1]["faults"] == good.model_dump(mode="json")
    assert service.dropped == {"invalid": 3, "not_json": 1, "oversized": 1}
    assert service.state.health is state_health and service.faults == good
    assert service.state.epoch == epoch and service.state.plans == plans
    # the next good set gets through, and the health no longer shows a refusal
    repaired = FabricFaults(at=time.time())
    await operator.publish(topics.fabric_faults(), encode(repaired), retain=True)
    await until(lambda: health[-1]["faults"] == repaired.model_dump(mode="json"), "repaired")
    assert health[-1]["refused"] is None
    assert service.state.plans == plans  # a spine coming back moves nothing either


def _good_typo_want() -> tuple[FabricFaults, FabricFaults, dict[str, Plan]]:
    """A set that cuts su0-leaf1 off, a typo'd set naming su0-leaf11, and the plans of the
    good set (SU 0's hosts without rail 1)."""
    good = _cut_off("su0-leaf1", reason="CHG-1")
    typo = FabricFaults(switches_down=["su0-leaf11"], reason="CHG-2", at=time.time())
    return good, typo, solve(FABRIC, {h: frozenset({1}) for h in SU0}, epoch=1, now=0.0)


@pytest.mark.real
async def test_a_refused_set_leaves_the_good_one_in_force_after_a_restart(mosquitto) -> None:
    """The user's case: a good set, then a typo'd one, then a service restart. The restarted
    service must plan with the good set, not with nothing."""
    good, typo, want = _good_typo_want()
    async with _operator(mosquitto.port) as (operator, health):
        async with _service(mosquitto.port) as first:
            await operator.publish(topics.fabric_faults(), encode(good), retain=True)
            await until(lambda: _same(first.state.plans, want), "plans without SU 0's rail 1")
            await operator.publish(topics.fabric_faults(), encode(typo), retain=True)
            await until(lambda: health[-1]["refused"] is not None, "the typo refused")
            assert "unknown switch 'su0-leaf11'" in health[-1]["refused"]["detail"]
            assert first.faults == good and _same(first.state.plans, want)
        health.clear()
        async with _service(mosquitto.port) as second:
            await until(lambda: second.faults == good, "the good set read back")
            await until(lambda: health[-1]["degraded_rails"] == [1], "the health after solving")
            await until(lambda: _same(second.state.plans, want), "the good set's plans")
            assert second.state.unusable() == {h: frozenset({1}) for h in SU0}
            doc = health[-1]
            assert doc["faults"] == good.model_dump(mode="json") and doc["refused"] is None
            assert doc["leaves_cut_off"] == ["su0-leaf1"] and doc["hosts_losing_rails"] == 32
            assert second.dropped == {}


@pytest.mark.real
async def test_a_set_refused_at_start_falls_back_to_the_set_the_last_service_accepted(
    mosquitto,
) -> None:
    """A typo'd set published while no service runs: the next service refuses it and keeps
    the set the previous instance had accepted (from its retained service/health)."""
    good, typo, want = _good_typo_want()
    async with _operator(mosquitto.port) as (operator, health):
        async with _service(mosquitto.port) as first:
            await operator.publish(topics.fabric_faults(), encode(good), retain=True)
            await until(lambda: _same(first.state.plans, want), "plans without SU 0's rail 1")
        await operator.publish(topics.fabric_faults(), encode(typo), retain=True)
        health.clear()
        async with _service(mosquitto.port) as second:
            await until(lambda: health and health[-1]["refused"] is not None, "the typo refused")
            await until(lambda: _same(second.state.plans, want), "the good set's plans")
            doc = health[-1]
            assert doc["faults"] == good.model_dump(mode="json")
            assert doc["refused"]["faults"] == typo.model_dump(mode="json")
            assert doc["leaves_cut_off"] == ["su0-leaf1"]
            assert second.faults == good
    assert decode(FabricFaults, await retained(mosquitto.port, topics.fabric_faults())) == good


@pytest.mark.real
async def test_a_set_refused_when_none_was_ever_accepted_is_left_on_the_broker(
    mosquitto,
) -> None:
    """Nothing to put back: the service publishes nothing on fabric/faults (an empty set
    would claim that nothing is down), runs without switch-level faults and reports the
    refusal; the refused set stays retained for the operator to correct."""
    typo = FabricFaults(switches_down=["su0-leaf11"], at=time.time())
    async with _operator(mosquitto.port) as (operator, health):
        await operator.publish(topics.fabric_faults(), encode(typo), retain=True)
        async with _service(mosquitto.port) as service:
            await until(lambda: health and health[-1]["refused"] is not None, "the typo refused")
            doc = health[-1]
            assert doc["faults"] is None and doc["leaves_cut_off"] == []
            assert doc["refused"]["faults"] == typo.model_dump(mode="json")
            assert service.faults is None and service.state.unusable() == {}
    assert decode(FabricFaults, await retained(mosquitto.port, topics.fabric_faults())) == typo


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
async def test_cli_publishes_the_set_the_service_applies(
    service_on_bus, mosquitto, tmp_path
) -> None:
    service, _, health = service_on_bus
    broker = f"127.0.0.1:{mosquitto.port}"
    cables = [f"{s},su1-leaf3" for s in SPINES[:7]] + [f"su1-leaf3,{SPINES[7]},4"]
    args = [f"--cable-down={c}" for c in cables]
    path = tmp_path / "fabric.json"
    path.write_text(dump_fabric(FABRIC))
    code, out, err = await _cli(
        "--broker", broker, "--fabric", str(path), *args, "--switch-down", "su0-spine2"
    )
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


def _free_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.real
async def test_cli_refused_connection_fails_at_once() -> None:
    port = _free_port()
    t0 = time.monotonic()
    code, out, err = await _cli(
        "--broker", f"127.0.0.1:{port}", "--switch-down", "su0-leaf0", "--timeout", "30"
    )
    assert time.monotonic() - t0 < 15  # not the 30 s timeout: nothing listens there
    assert code == 1 and out == ""
    assert f"cannot reach the MQTT broker at 127.0.0.1:{port}: connection refused" in err
    assert "nothing published" in err and "Traceback" not in err


@pytest.mark.real
async def test_cli_unresponsive_broker_exits_1_after_the_timeout() -> None:
    with socket.socket() as listener:  # accepts TCP connections (backlog), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        code, out, err = await _cli(
            "--broker", f"127.0.0.1:{port}", "--switch-down", "su0-leaf0", "--timeout", "0.5"
        )
        assert time.monotonic() - t0 >= 0.5
    assert code == 1 and out == ""
    assert f"cannot reach the MQTT broker at 127.0.0.1:{port} within 0.5 s" in err
    assert "nothing published" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--switch-down", "su9-spine0"], "unknown switch 'su9-spine0' in fabric"),
        (["--cable-down", "su0-leaf0,su0-leaf1"], "no cable between these switches"),
        (["--cable-down", "su0-leaf0,su0-spine0,5"], "5 down but the fabric has only 4"),
    ],
)
def test_cli_checks_names_against_a_fabric_file(argv, message, tmp_path, capsys) -> None:
    path = tmp_path / "fabric.json"
    path.write_text(dump_fabric(FABRIC))
    # nothing listens on the broker's port: exit 2 (not 1) shows it never tried to publish
    broker = f"127.0.0.1:{_free_port()}"
    assert main(["fabric", "faults", "--fabric", str(path), "--broker", broker, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "nothing published" in err


def test_cli_bad_fabric_file_exits_2(tmp_path, capsys) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text("name: [")
    assert main(["fabric", "faults", "--fabric", str(path), "--clear"]) == 2
    assert str(path) in capsys.readouterr().err


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
        (
            ["--switch-down", "x", "--switch-down", "y", "--switch-down", "x"],
            "switch x listed twice",
        ),
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


@pytest.mark.parametrize("source", ["fabric", "generate"])
def test_cli_checks_names_against_the_configs_fabric(source, tmp_path, capsys) -> None:
    """``-c service.yaml`` with a ``fabric:`` file or a ``generate:`` section: the names are
    checked against that fabric as against ``--fabric FILE``; nothing is published."""
    config = tmp_path / "service.yaml"
    if source == "fabric":
        path = tmp_path / "fabric.json"
        path.write_text(dump_fabric(FABRIC))
        config.write_text(f"fabric: {path}\n")
    else:
        config.write_text("generate:\n  hosts: 64\n  rails: 4\n")
    broker = f"127.0.0.1:{_free_port()}"  # exit 2, not 1: it never tried to publish
    argv = ["fabric", "faults", "-c", str(config), "--broker", broker]
    assert main([*argv, "--switch-down", "BADNAME"]) == 2
    err = capsys.readouterr().err
    assert "unknown switch 'BADNAME' in fabric" in err and "nothing published" in err
    assert main([*argv, "--cable-down", "su0-leaf0,su0-spine0,5"]) == 2
    assert "5 down but the fabric has only 4" in capsys.readouterr().err
    # the names are right: it goes on to publish (and finds no broker)
    assert main([*argv, "--switch-down", "su1-spine3"]) == 1
    assert "cannot reach the MQTT broker" in capsys.readouterr().err


def test_cli_fabric_option_wins_over_the_configs(tmp_path, capsys) -> None:
    """``--fabric FILE`` is checked instead of the config's fabric, as ``--broker`` is used
    instead of the config's broker."""
    config = tmp_path / "service.yaml"
    config.write_text("generate:\n  hosts: 4\n  rails: 2\n")  # one SU: no su1-leaf3
    path = tmp_path / "fabric.json"
    path.write_text(dump_fabric(FABRIC))
    broker = f"127.0.0.1:{_free_port()}"
    argv = ["fabric", "faults", "-c", str(config), "--broker", broker]
    assert main([*argv, "--switch-down", "su1-leaf3"]) == 2
    assert "unknown switch 'su1-leaf3'" in capsys.readouterr().err
    assert main([*argv, "--fabric", str(path), "--switch-down", "su1-leaf3"]) == 1
    assert "cannot reach the MQTT broker" in capsys.readouterr().err


def test_cli_bad_fabric_in_the_config_exits_2(tmp_path, capsys) -> None:
    config = tmp_path / "service.yaml"
    config.write_text(f"fabric: {tmp_path / 'absent.yaml'}\n")
    broker = f"127.0.0.1:{_free_port()}"
    assert main(["fabric", "faults", "-c", str(config), "--broker", broker, "--clear"]) == 2
    err = capsys.readouterr().err
    assert "absent.yaml" in err and "nothing published" in err
