"""Signed plans (:mod:`linkguard.signing`): the real service signs every plan and peer routes
message, real agents that hold its public key verify them, and forged ones published by a
rogue bus client (unsigned, another key, a modified body, a replay, out of scope) are refused,
counted and never applied or persisted. A tampered state file is refused on restart; the
service refuses a world-readable key; ``linkguard keys generate`` writes a usable pair."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.applier import kernel_routes
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.agent.plans import effective
from linkguard.bus import Bus
from linkguard.cli import main
from linkguard.config import BusSettings, ConfigError, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.membus import MemoryBroker
from linkguard.models import PeerRoutes, Plan, decode, encode
from linkguard.signing import (
    KeyFileError,
    SignatureError,
    Signer,
    Verifier,
    generate_keys,
    unwrap,
)
from linkguard.simulations.fleet import SimulatedFleet, agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from linkguard.topology.solver import Solver, solve
from tests.support import require_binary, until
from tests.support import retained as read_retained

FABRIC = generate_rail_optimized(hosts=4, rails=2)
V = FABRIC.hosts[1].host  # the victim of the forged plans
W = FABRIC.hosts[2].host  # a whole host: takes V's peer routes
X = FABRIC.hosts[3].host


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keys(tmp_path / "keys")


# -- the envelope ---------------------------------------------------------------------------


def test_envelope_wire_format_and_verification() -> None:
    signer = Signer(Ed25519PrivateKey.generate())
    body = encode(solve(FABRIC, {}, epoch=7, now=1.0)[V])
    sealed = signer.seal(body)
    doc = json.loads(sealed)
    assert list(doc) == ["v", "alg", "key_id", "sig", "body"]
    assert (doc["v"], doc["alg"]) == (1, "ed25519")
    raw = signer.verifier.public_key.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert doc["key_id"] == hashlib.sha256(raw).hexdigest()[:16] == signer.key_id
    assert len(base64.b64decode(doc["sig"], validate=True)) == 64
    assert doc["body"].encode() == body  # the exact bytes that were signed
    opened = unwrap(sealed, signer.verifier)
    assert (opened.body, opened.signed, opened.verified) == (body, True, True)
    assert decode(Plan, opened.body, expect_host=V).epoch == 7
    # without a key: the body, unverified; a plain message as it is
    assert unwrap(sealed, None).body == body and not unwrap(sealed, None).verified
    assert unwrap(body, None).body == body and not unwrap(body, None).signed
    # with a key: plain messages only when signatures are not required
    with pytest.raises(SignatureError) as exc:
        unwrap(body, signer.verifier)
    assert exc.value.reason == "unsigned"
    assert unwrap(body, signer.verifier, require=False).body == body


def _forge(sealed: bytes, **edit: object) -> bytes:
    doc = json.loads(sealed)
    doc.update(edit)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda s, o: o.seal(s.body), "unknown_key"),
        (lambda s, o: _forge(o.seal(s.body), key_id=s.key_id), "bad_signature"),
        (
            lambda s, o: _forge(s.sealed, body=s.body.decode().replace('"epoch":7', '"epoch":8')),
            "bad_signature",
        ),
        (lambda s, o: _forge(s.sealed, v=2), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, v=True), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, alg="rsa"), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, extra=1), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, sig="!" * 88), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, sig=base64.b64encode(b"x" * 63).decode()), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, body={"host": V}), "bad_envelope"),
        (lambda s, o: _forge(s.sealed, body="\ud800"), "bad_envelope"),
        (lambda s, o: b'{"sig": 1}', "bad_envelope"),
        (lambda s, o: b"[1, 2]", "unsigned"),
        (lambda s, o: b"\xff\xfe not json", "unsigned"),
    ],
    ids=[
        "other-key",
        "other-key-claiming-the-key-id",
        "modified-body",
        "version",
        "bool-version",
        "algorithm",
        "extra-field",
        "sig-not-base64",
        "sig-length",
        "body-not-a-string",
        "lone-surrogate",
        "sig-only",
        "not-an-object",
        "not-json",
    ],
)
def test_forged_envelopes_are_refused(make: Callable, reason: str) -> None:
    class S:
        signer = Signer(Ed25519PrivateKey.generate())
        body = encode(solve(FABRIC, {}, epoch=7, now=1.0)[V])
        sealed = signer.seal(body)
        key_id = signer.key_id

    other = Signer(Ed25519PrivateKey.generate())
    with pytest.raises(SignatureError) as exc:
        unwrap(make(S, other), S.signer.verifier)
    assert exc.value.reason == reason


# -- key files ------------------------------------------------------------------------------


def test_keys_generate_round_trip(tmp_path: Path, capsys) -> None:
    out = tmp_path / "k"
    assert main(["keys", "generate", "--out", str(out)]) == 0
    key, pub = out / "service.key", out / "service.pub"
    assert key.stat().st_mode & 0o777 == 0o600 and pub.stat().st_mode & 0o777 == 0o644
    signer, verifier = Signer.from_file(key), Verifier.from_file(pub)
    assert (
        signer.key_id == verifier.key_id and f"key id: {signer.key_id}" in capsys.readouterr().out
    )
    assert unwrap(signer.seal(b'{"a":1}'), verifier).body == b'{"a":1}'
    before = key.read_bytes(), pub.read_bytes()
    assert main(["keys", "generate", "--out", str(out)]) == 2  # never overwritten silently
    assert "already exist" in capsys.readouterr().err
    assert (key.read_bytes(), pub.read_bytes()) == before
    assert main(["keys", "generate", "--out", str(out), "--force"]) == 0
    assert Signer.from_file(key).key_id != signer.key_id == verifier.key_id
    assert Signer.from_file(key).key_id == Verifier.from_file(pub).key_id
    assert main(["keys", "generate", "--out", str(key)]) == 1  # a file, not a directory
    assert "not a directory" in capsys.readouterr().err
    # raw 32-byte keys load too
    raw = Ed25519PrivateKey.generate()
    (tmp_path / "raw.key").write_bytes(
        raw.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
    )
    (tmp_path / "raw.key").chmod(0o400)
    (tmp_path / "raw.pub").write_bytes(
        raw.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    assert (
        Signer.from_file(tmp_path / "raw.key").key_id
        == Verifier.from_file(tmp_path / "raw.pub").key_id
    )


def test_service_refuses_a_world_readable_key(tmp_path: Path, keys, capsys) -> None:
    key, pub = keys
    secret = key.read_bytes()
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644"):
        TopologyService(ServiceSettings(signing_key=key), fabric=FABRIC)
    key.chmod(0o640)
    with pytest.raises(KeyFileError, match="group or others"):
        Signer.from_file(key)
    # through the command line: exit 2, the fix named, no key material printed
    cfg = tmp_path / "service.yaml"
    cfg.write_text(f"signing_key: {key}\ngenerate: {{hosts: 4, rails: 2}}\n")
    assert main(["topology", "serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"chmod 600 {key}" in err
    body = b"".join(secret.splitlines()[1:-1]).decode()
    assert body not in err and body[:20] not in err
    # not a key, a public key where the private one belongs, a missing file
    bad = tmp_path / "bad.key"
    bad.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    bad.chmod(0o600)
    pub_copy = tmp_path / "pub.key"
    pub_copy.write_bytes(pub.read_bytes())
    pub_copy.chmod(0o600)
    for path in (bad, pub_copy, tmp_path / "missing.key"):
        with pytest.raises(KeyFileError, match="signing key"):
            Signer.from_file(path)


def test_agent_refuses_an_unusable_public_key(tmp_path: Path) -> None:
    bad = tmp_path / "service.pub"
    bad.write_text("ssh-rsa AAAA nothing\n")
    settings = agent_settings_for(
        FABRIC, V, bus=BusSettings(), workdir=tmp_path, damping=DampingPolicy()
    ).model_copy(update={"service_public_key": bad})
    with pytest.raises(ConfigError, match="not an Ed25519 public key"):
        Agent(settings, source=SimulatedPortSource([]), table=MemoryRouteTable(), discovered=[])
    settings = settings.model_copy(update={"service_public_key": tmp_path / "missing.pub"})
    with pytest.raises(ConfigError, match="public key"):
        Agent(settings, source=SimulatedPortSource([]), table=MemoryRouteTable(), discovered=[])


# -- a fleet with keys ----------------------------------------------------------------------


class Rig:
    """A signed fleet and a rogue client on the same broker."""

    def __init__(
        self,
        fleet: SimulatedFleet,
        rogue,
        signer: Signer,
        retained: Callable[[str, bytes], Awaitable[bytes]],
    ) -> None:
        self.fleet, self.rogue, self.signer = fleet, rogue, signer
        #: (topic, expected payload) -> the payload the broker retains once it is that one
        self.retained = retained

    def agent(self, host: str) -> Agent:
        return self.fleet.agents[host]

    def state(self, host: str) -> tuple[object, ...]:
        """What must not change when a forged message arrives."""
        a = self.agent(host)
        return (
            dict(self.fleet.tables[host].routes),
            self.fleet.tables[host].changes,
            a.applier.plan,
            a.stats.plans_applied,
            a.applier.plan_path.read_bytes(),
        )


@contextlib.asynccontextmanager
async def _signed_fleet(
    kind: str, tmp: Path, keys: tuple[Path, Path], *, public_key: bool = True
) -> AsyncIterator[Rig]:
    key, pub = keys
    broker_proc = None
    if kind == "memory":
        broker = MemoryBroker()
        bus, factory = BusSettings(), broker.bus_factory
        rogue = broker.bus_factory(client_id="rogue")

        async def retained(topic: str, want: bytes) -> bytes:
            await until(lambda: broker.retained.get(topic) == want, f"{topic} retained")
            return broker.retained[topic]
    else:
        from tests.conftest import start_mosquitto

        require_binary("mosquitto")
        broker_proc = start_mosquitto(tmp / "broker")
        bus, factory = BusSettings(port=broker_proc.port, reconnect_min_s=0.05), Bus
        rogue = Bus(host="127.0.0.1", port=broker_proc.port, client_id="rogue")

        async def retained(topic: str, want: bytes) -> bytes:
            return await read_retained(broker_proc.port, topic, until_payload=want)

    try:
        fleet = SimulatedFleet(
            FABRIC,
            bus=bus,
            workdir=tmp / "fleet",
            bus_factory=factory,
            signing_key=key,
            service_public_key=pub if public_key else None,
        )
        async with fleet, rogue:
            await rogue.wait_connected(10)
            await fleet.wait_all_acked()
            yield Rig(fleet, rogue, Signer.from_file(key), retained)
    finally:
        if broker_proc is not None:
            broker_proc.handle.stop()


async def _fault(fleet: SimulatedFleet, host: str, rail: int) -> None:
    """Take ``host``'s ``rail`` down; return once every host acked the plans it caused."""
    state = fleet.service.state
    before = state.epoch
    fleet.link_down(host, rail)
    await until(lambda: state.epoch > before, f"the solve of {host} rail {rail} down")
    await fleet.wait_all_acked(epoch_floor=before + 1)  # each host needs a /32 for it


def _forged_plan(epoch: int, **edit: object) -> bytes:
    """V's full plan as if its rail 0 were lost (different from what it has), JSON."""
    doc = json.loads(encode(solve(FABRIC, {V: frozenset({0})}, epoch=epoch, now=time.time())[V]))
    doc.update(edit)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("bus", ["memory", pytest.param("mosquitto", marks=pytest.mark.real)])
async def test_forged_plans_are_refused_and_never_applied(bus: str, tmp_path: Path, keys) -> None:
    async with _signed_fleet(bus, tmp_path, keys) as rig:
        agent = rig.agent(V)
        # V holds its compact plan as received: the service's envelope, verified
        first = agent.applier.plan_path.read_bytes()
        assert unwrap(first, rig.signer.verifier).verified
        e1 = decode(Plan, unwrap(first, None).body).epoch
        # V loses rail 1: a full plan of a newer epoch; every whole host takes V's peer routes
        rig.fleet.link_down(V, 1)
        await until(
            lambda: agent.applier.plan is not None and agent.applier.plan.epoch > e1, "V's plan"
        )
        await rig.fleet.wait_all_acked(epoch_floor=e1 + 1)
        current = agent.applier.plan_path.read_bytes()
        e2 = decode(Plan, unwrap(current, rig.signer.verifier).body).epoch
        assert agent.applier.plan.epoch == e2 and agent.applier.plan.shared is None
        assert rig.agent(W).peers[V].classes  # W routes around V's lost rail
        assert (
            rig.agent(W)
            .applier.peers_dir.joinpath(f"{V}.json")
            .read_bytes()
            .startswith(b'{"v":1,"alg":"ed25519"')
        )
        before, w_before = rig.state(V), rig.state(W)
        other = Signer(Ed25519PrivateKey.generate())
        drops = agent.stats.messages_dropped
        refusals = agent.stats.plans_refused

        async def attack(payload: bytes, counter, reason: str, topic: str = topics.plan(V)):
            n = counter[reason]
            with capture_logs() as logs:
                await rig.rogue.publish(topic, payload, retain=True)
                await until(lambda: counter[reason] == n + 1, f"{reason} counted")
            level = "info" if reason == "stale_epoch" else "warning"  # late copies are normal
            assert any(e.get("reason") == reason and e["log_level"] == level for e in logs)
            assert rig.state(V) == before, f"{reason}: V's routes, plan or state file changed"

        big = 2**62  # a far-future epoch: would freeze V's plans if it were taken
        await attack(_forged_plan(big), drops, "unsigned")
        await attack(other.seal(_forged_plan(big)), drops, "unknown_key")
        claimed = json.loads(other.seal(_forged_plan(big)))
        claimed["key_id"] = rig.signer.key_id
        await attack(json.dumps(claimed).encode(), drops, "bad_signature")
        env = json.loads(current)  # the service's own signature on a modified body
        env["body"] = env["body"].replace(f'"epoch":{e2}', f'"epoch":{big}')
        assert env["body"] != json.loads(current)["body"]
        await attack(json.dumps(env).encode(), drops, "bad_signature")
        await attack(b'{"v":1,"alg":"ed25519","sig":"x"}', drops, "bad_envelope")
        # a replay of V's older signed plan: stale, not looked at; a redelivery of the current
        # one changes nothing and counts nothing (an unsigned marker shows it was handled)
        await attack(first, drops, "stale_epoch")
        stale = drops["stale_epoch"]
        await rig.rogue.publish(topics.plan(V), current, retain=True)
        await attack(b"{}", drops, "unsigned")
        assert drops["stale_epoch"] == stale and refusals["stale_epoch"] == 0
        # signed with the service's key but out of scope: the applier's checks still run
        doc = json.loads(_forged_plan(e2 + 1))
        for pr in doc["prefix_routes"]:
            pr["netdevs"] = ["evil0" for _ in pr["rails"]]
        await attack(rig.signer.seal(json.dumps(doc).encode()), refusals, "out_of_scope")
        doc = json.loads(_forged_plan(e2 + 1))
        doc["prefix_routes"].append(
            {"prefix": "192.0.2.0/24", "home_rail": 0, "rails": [0], "netdevs": ["rail0"]}
        )
        await attack(rig.signer.seal(json.dumps(doc).encode()), refusals, "out_of_scope")
        assert refusals["out_of_scope"] == 2

        # peer routes: the same rules, and a deletion cannot be signed (ignored)
        legit = rig.fleet.service.state.peers[V]
        w_drops = rig.agent(W).stats.messages_dropped
        forged = legit.model_copy(update={"epoch": big, "classes": [], "modulus": 1})
        await rig.rogue.publish(topics.peer_routes(V), encode(forged), retain=True)
        await until(lambda: w_drops["unsigned"] == 1, "W drops unsigned peer routes")
        scoped = legit.model_copy(
            update={"epoch": e2 + 1, "endpoints": ["192.0.2.1"] * len(legit.endpoints)}
        )
        await rig.rogue.publish(topics.peer_routes(V), rig.signer.seal(encode(scoped)), retain=True)
        await until(lambda: w_drops["out_of_scope"] == 1, "W drops out-of-scope peer routes")
        with capture_logs() as logs:
            await rig.rogue.publish(topics.peer_routes(V), b"", retain=True)
            await rig.rogue.publish(topics.peer_routes(V), b"{}", retain=True)  # marker
            await until(lambda: w_drops["unsigned"] == 2, "the deletion handled")
        assert any(e["event"] == "peer_routes_deletion_ignored" for e in logs)
        assert rig.state(W) == w_before and rig.agent(W).peers[V] == legit
        assert rig.state(V) == before

        # what the metrics export (linkguard_messages_dropped / linkguard_plans_refused)
        text = generate_latest(agent.metrics.registry).decode()
        for line in (
            'linkguard_messages_dropped_total{reason="unsigned"} ',
            'linkguard_messages_dropped_total{reason="bad_signature"} 2.0',
            'linkguard_plans_refused_total{reason="out_of_scope"} 2.0',
        ):
            assert line in text, line

        # the broker retained the rogue's last messages: the service saw them (not its own)
        # and put its own back, so the next agent to connect gets the real ones (the waits
        # above were on the agents; the service reads the same messages on its own session)
        await until(lambda: rig.fleet.service.dropped["foreign"] >= 10, "the service saw them")
        assert rig.fleet.service.dropped["foreign"] >= 10
        assert await rig.retained(topics.plan(V), current) == current
        legit_sealed = rig.signer.seal(encode(legit))
        assert await rig.retained(topics.peer_routes(V), legit_sealed) == legit_sealed

        # the service's next plans still apply everywhere, V's persisted as received
        rig.fleet.link_down(X, 0)
        await rig.fleet.wait_all_acked(epoch_floor=e2 + 1)
        assert agent.applier.plan.epoch > e2
        assert unwrap(agent.applier.plan_path.read_bytes(), rig.signer.verifier).verified


async def test_agent_without_a_key_applies_signed_plans_and_says_so(tmp_path: Path, keys) -> None:
    with capture_logs() as logs:
        async with _signed_fleet("memory", tmp_path, keys, public_key=False) as rig:
            await _fault(rig.fleet, V, 0)
    said = [(e["host"], e["log_level"]) for e in logs if e["event"] == "plans_not_verified"]
    assert sorted(said) == [(h, "info") for h in sorted(rig.fleet.agents)]  # simulated tables
    # once per agent, whatever it received
    said = [e for e in logs if e["event"] == "signed_plan_not_verified"]
    assert len(said) == len(rig.fleet.agents)


def _restart(rig_settings, table: MemoryRouteTable, broker: MemoryBroker | None = None) -> Agent:
    """A new agent with the settings of a stopped one, on ``broker`` (default an empty
    in-memory one: nothing retained, only what it restores from its state dir)."""
    return Agent(
        rig_settings,
        source=SimulatedPortSource(
            [active_port(h.hca, h.port) for h in FABRIC.host(rig_settings.host).hcas]
        ),
        table=table,
        discovered=[],
        bus_factory=(broker or MemoryBroker()).bus_factory,
    )


async def _started(agent: Agent) -> list[dict]:
    """Run ``agent`` until it restored its state (it is connected by then), stop it; its
    logs."""
    with capture_logs() as logs:
        task = asyncio.create_task(agent.run())
        await until(lambda: agent.bus.connected.is_set(), "the restarted agent connected")
        agent.stop()
        await asyncio.wait_for(task, 10)
    return logs


async def test_tampered_state_files_are_refused_on_restart(tmp_path: Path, keys) -> None:
    async with _signed_fleet("memory", tmp_path, keys) as rig:
        await _fault(rig.fleet, X, 1)  # W, whole, expands its compact plan with X's peer routes
        settings = rig.agent(W).settings
        applied = rig.agent(W).applier.plan
        assert applied.routes and {r.peer for r in applied.routes} == {X}
    plan_file = settings.state_dir / "last-plan.json"
    peer_file = settings.state_dir / "peers" / f"{X}.json"
    good_plan, good_peer = plan_file.read_bytes(), peer_file.read_bytes()

    # untouched: restored, verified, the same table
    table = MemoryRouteTable()
    agent = _restart(settings, table)
    logs = await _started(agent)
    assert agent.applier.plan == applied
    assert table.routes == kernel_routes(effective(applied, ()))
    assert not [e for e in logs if e["event"] == "state_file_refused"]

    # the plan file changed after it was received (a netdev renamed in its body): refused
    env = json.loads(good_plan)
    env["body"] = env["body"].replace('"rail0"', '"evil0"')
    assert env["body"] != json.loads(good_plan)["body"]
    plan_file.write_text(json.dumps(env))
    table = MemoryRouteTable()
    agent = _restart(settings, table)
    logs = await _started(agent)
    refused = [e for e in logs if e["event"] == "state_file_refused"]
    assert [(e["reason"], e["path"], e["log_level"]) for e in refused] == [
        ("bad_signature", str(plan_file), "error")
    ]
    assert agent.applier.plan is None and table.routes == {}

    # an unsigned plan file (left by an agent that ran without a key) is refused as well
    plan_file.write_bytes(unwrap(good_plan, None).body)
    agent = _restart(settings, MemoryRouteTable())
    logs = await _started(agent)
    assert [e["reason"] for e in logs if e["event"] == "state_file_refused"] == ["unsigned"]
    assert agent.applier.plan is None

    # a tampered peer file: that file is refused, the plan restored without its routes
    plan_file.write_bytes(good_plan)
    env = json.loads(good_peer)
    env["sig"] = base64.b64encode(bytes(64)).decode()
    peer_file.write_text(json.dumps(env))
    agent = _restart(settings, MemoryRouteTable())
    logs = await _started(agent)
    assert [(e["reason"], e["path"]) for e in logs if e["event"] == "state_file_refused"] == [
        ("bad_signature", str(peer_file))
    ]
    assert agent.applier.plan is not None and agent.applier.plan.routes == []
    assert X not in agent.peers


async def test_service_replaces_foreign_retained_plans(tmp_path: Path, keys) -> None:
    """Retained plans and peer routes on the broker that the service's key did not sign (a
    rogue's, or another service's) are not taken as what is on the bus: the service publishes
    its own, and a forged epoch does not move its epochs."""
    key, pub = keys
    broker = MemoryBroker()
    rogue = broker.bus_factory(client_id="rogue")
    other = Signer(Ed25519PrivateKey.generate())
    forged_epoch = 2**62
    async with rogue:
        await rogue.wait_connected(5)
        await rogue.publish(topics.plan(V), other.seal(_forged_plan(forged_epoch)), retain=True)
        await rogue.publish(topics.plan(W), _forged_plan(forged_epoch), retain=True)
        solver = Solver(FABRIC)
        solver.update({X: {0}})  # X is whole when the fleet starts: these are forged
        peers = solver.peer_routes(X, epoch=forged_epoch, now=1.0)
        await rogue.publish(topics.peer_routes(X), encode(peers), retain=True)
    with capture_logs() as logs:
        fleet = SimulatedFleet(
            FABRIC,
            bus=BusSettings(),
            workdir=tmp_path / "fleet",
            bus_factory=broker.bus_factory,
            signing_key=key,
            service_public_key=pub,
        )
        async with fleet:
            await fleet.wait_all_acked()
            state = fleet.service.state
            assert state.epoch < forged_epoch
            verifier = Verifier.from_file(pub)
            for host in (V, W):
                body = unwrap(broker.retained[topics.plan(host)], verifier).body
                assert decode(Plan, body).epoch == state.published[host].epoch
            assert topics.peer_routes(X) not in broker.retained  # deleted: X is whole
    replaced = {e["topic"]: e["action"] for e in logs if e["event"] == "foreign_retained_replaced"}
    assert replaced == {
        topics.plan(V): "the first solve publishes this service's own",
        topics.plan(W): "the first solve publishes this service's own",
        topics.peer_routes(X): "deleted",
    }
    assert fleet.service.dropped["unknown_key"] == 1 and fleet.service.dropped["unsigned"] == 2


def test_verify_cost_per_message(keys) -> None:
    """Decode + verify of one peer routes message of a 256-host fabric: printed (``-s``)."""
    key, pub = keys
    signer, verifier = Signer.from_file(key), Verifier.from_file(pub)
    fabric = generate_rail_optimized(hosts=256, rails=8)
    solver = Solver(fabric)
    host = fabric.hosts[7].host
    solver.update({host: {3}})
    body = encode(solver.peer_routes(host, epoch=5, now=1.0))
    sealed = signer.seal(body)
    n = 300
    t0 = time.perf_counter()
    for _ in range(n):
        decode(PeerRoutes, body, expect_host=host)
    plain = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        decode(PeerRoutes, unwrap(sealed, verifier).body, expect_host=host)
    signed = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        signer.seal(body)
    seal = (time.perf_counter() - t0) / n
    print(
        f"\npeer routes message {len(body)} B ({len(sealed)} B signed): decode {plain * 1e6:.0f}"
        f" us, unwrap + verify + decode {signed * 1e6:.0f} us, seal {seal * 1e6:.0f} us"
    )
    assert decode(PeerRoutes, unwrap(sealed, verifier).body) == decode(PeerRoutes, body)


async def test_roll_out_mode_applies_unsigned_plans_but_verifies_signed_ones(
    tmp_path: Path, keys
) -> None:
    """``require_signed_plans: false`` (while keys are rolled out): unsigned plans apply, a
    signed one must still carry the service's valid signature."""
    key, pub = keys
    broker = MemoryBroker()
    settings = agent_settings_for(
        FABRIC, V, bus=BusSettings(), workdir=tmp_path, damping=DampingPolicy()
    ).model_copy(update={"service_public_key": pub, "require_signed_plans": False})
    agent = _restart(settings, MemoryRouteTable(), broker)
    sender = broker.bus_factory(client_id="sender")
    with capture_logs() as logs:
        task = asyncio.create_task(agent.run())
        async with sender:
            await sender.wait_connected(5)
            await agent.bus.wait_connected(5)
            await sender.publish(topics.plan(V), encode(solve(FABRIC, {}, epoch=5, now=1.0)[V]))
            await until(lambda: agent.applier.applied_epoch == 5, "the unsigned plan applied")
            other = Signer(Ed25519PrivateKey.generate())
            await sender.publish(topics.plan(V), other.seal(_forged_plan(6)))
            await until(lambda: agent.stats.messages_dropped["unknown_key"] == 1, "refused")
            signer = Signer.from_file(key)
            await sender.publish(topics.plan(V), signer.seal(_forged_plan(7)))
            await until(lambda: agent.applier.applied_epoch == 7, "the signed plan applied")
        agent.stop()
        await asyncio.wait_for(task, 10)
    assert [e["log_level"] for e in logs if e["event"] == "unsigned_plans_accepted"] == ["warning"]
