"""Bus security on a real Mosquitto run with deploy/mosquitto/mosquitto.conf and its ACL,
certificates and passwords made by deploy/make-certs.sh, and real linkguard Bus clients.

Shown: a host publishes its own state but not another host's, nor a plan, nor fabric faults
(the broker drops them), cannot forge another host's last will, reads its own plan but not
another host's; the operator sets faults (also through `linkguard fabric faults`);
unauthenticated, wrong-password, plain-TCP and wrong-CA clients are refused with a clear
error; a topology service and two agents with their own credentials run end to end over TLS
(plans applied and acked). Also: BusSettings' file checks and make-certs.sh's output.

"Nothing arrives" is shown with a positive control: a message sent after the forbidden one,
by the same client, on a topic the receiver may read; Mosquitto delivers one publisher's
messages in order, so once the control is in, the forbidden one would be in before it.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess, free_port
from linkguard.bus import Bus, BusConnectTimeout, BusMessage, Will
from linkguard.cli import main
from linkguard.config import (
    AgentSettings,
    ApiSettings,
    BusSettings,
    ConfigError,
    ServiceSettings,
    load_settings,
)
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import AckResult
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import missing, require_binary, until

pytestmark = pytest.mark.real

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
FABRIC = generate_rail_optimized(hosts=2, rails=2)
A, B = (h.host for h in FABRIC.hosts)  # gpu000, gpu001: also their MQTT user names
SERVICE, OPERATOR = "linkguard-topology", "linkguard-operator"


def _run_make_certs(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(DEPLOY / "make-certs.sh"), "-o", str(out), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """make-certs.sh output for hosts A and B (plus the service and operator users), with the
    deploy ACL next to it: what /etc/mosquitto/linkguard/ holds in production."""
    for binary in ("openssl", "mosquitto", "mosquitto_passwd"):
        if shutil.which(binary) is None and not os.path.exists(f"/usr/sbin/{binary}"):
            missing(f"needs the `{binary}` binary")
    out = tmp_path_factory.mktemp("bus-certs") / "etc"
    _run_make_certs(out, "-c", A, B)  # -c: client certificates too
    shutil.copy(DEPLOY / "mosquitto" / "acl", out / "acl")
    return out


MTLS = (
    "\nrequire_certificate false\n",
    "\nrequire_certificate true\nuse_identity_as_username true\n",
)


def deploy_config(etc: Path, workdir: Path, port: int, *, mtls: bool = False) -> str:
    """deploy/mosquitto/mosquitto.conf with its paths under ``etc`` and ``workdir``, its TLS
    listener on 127.0.0.1:``port`` and this process's user; nothing else changed, except the
    mutual-TLS lines its comment gives with ``mtls``."""
    text = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    subs = [
        ("\nlistener 8883\n", f"\nlistener {port} 127.0.0.1\n", 1),
        ("/etc/mosquitto/linkguard/", f"{etc}/", None),
        ("pid_file /run/mosquitto/mosquitto.pid", f"pid_file {workdir}/mosquitto.pid", 1),
        ("\nuser mosquitto\n", f"\nuser {pwd.getpwuid(os.geteuid()).pw_name}\n", 1),
        ("persistence_location /var/lib/mosquitto/", f"persistence_location {data}/", 1),
        ("log_dest file /var/log/mosquitto/mosquitto.log", f"log_dest file {workdir}/log", 1),
        *([(*MTLS, 1)] if mtls else []),
    ]
    for old, new, count in subs:
        n = text.count(old)
        assert n >= 1 if count is None else n == count, f"{old!r} occurs {n} times in deploy"
        text = text.replace(old, new)
    return text


@dataclass
class Secured:
    """A running hardened broker and how to connect to it."""

    etc: Path
    port: int
    broker: MosquittoProcess

    def bus(self, user: str | None, **kw: object) -> BusSettings:
        """BusSettings for ``user`` (None: no credentials), TLS with the bus CA."""
        fields: dict[str, object] = {
            "port": self.port,
            "tls": True,
            "ca_file": self.etc / "ca.crt",
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.3,
        }
        if user is not None:
            fields |= {"username": user, "password_file": self.etc / "users" / f"{user}.password"}
        return BusSettings(**(fields | kw))  # type: ignore[arg-type]

    def log(self) -> str:
        return (self.broker.workdir / "log").read_text()


@contextmanager
def hardened_broker(certs: Path, workdir: Path, *, mtls: bool = False) -> Iterator[Secured]:
    """Mosquitto running the deploy config on a free loopback port, stopped afterwards."""
    port = free_port()
    binary = require_binary("mosquitto")
    config = deploy_config(certs, workdir, port, mtls=mtls)
    broker = MosquittoProcess(workdir, port=port, binary=binary, config=config)
    try:
        broker.start()
    except TimeoutError:
        log = workdir / "log"
        pytest.fail(f"mosquitto did not start: {log.read_text() if log.exists() else 'no log'}")
    try:
        yield Secured(certs, port, broker)
    finally:
        broker.stop()


@pytest.fixture
def secured(certs: Path, tmp_path: Path) -> Iterator[Secured]:
    with hardened_broker(certs, tmp_path) as s:
        yield s


class Inbox:
    """Messages a Bus handler received, in order."""

    def __init__(self) -> None:
        self.messages: list[BusMessage] = []

    async def __call__(self, msg: BusMessage) -> None:
        self.messages.append(msg)

    def topics(self) -> list[str]:
        return [m.topic for m in self.messages]

    def index(self, topic: str, payload: bytes) -> int | None:
        for i, m in enumerate(self.messages):
            if m.topic == topic and m.payload == payload:
                return i
        return None


def client(settings: BusSettings, name: str, *, subscriptions=(), handler=None) -> Bus:
    return Bus(
        **settings.connection(),
        client_id=f"test-{name}-{time.monotonic_ns()}",
        subscriptions=subscriptions,
        handler=handler,
    )


# ------------------------------------------------------------------------------------------


async def test_a_host_publishes_its_own_state_but_not_another_hosts(secured: Secured) -> None:
    watch = Inbox()  # the service's view: it reads hosts/# and plans/#
    async with (
        client(
            secured.bus(SERVICE),
            "service",
            subscriptions=[topics.all_host_topics(), topics.all_plans()],
            handler=watch,
        ) as service,
        client(secured.bus(A), "a") as a,
        # B also presents its client certificate (make-certs.sh -c); this listener does not
        # ask for it (require_certificate false; mutual TLS: test_mutual_tls_variant)
        client(
            secured.bus(
                B,
                cert_file=secured.etc / "users" / f"{B}.crt",
                key_file=secured.etc / "users" / f"{B}.key",
            ),
            "b",
        ) as b,
    ):
        for bus in (service, a, b):
            await bus.wait_connected(10)
        assert service.refused_subscriptions == []

        own, forged, control = b"A: mlx5_0 up", b"forged by A", b"control from A"
        # 1. A's own port state reaches the service
        assert await a.publish(topics.port_state(A, "mlx5_0", 1), own, retain=True)
        await until(lambda: watch.index(topics.port_state(A, "mlx5_0", 1), own) is not None, "A")

        # 2. A writes under B's name and as the service (a plan for B), then a control message
        # on its own topic: the control arrives, the forgeries never do. Mosquitto
        # acknowledges the forbidden publishes (MQTT 3.1.1 cannot refuse one) and drops them.
        forged_topics = [
            topics.port_state(B, "mlx5_0", 1),
            topics.status(B),
            topics.ack(B),
            topics.plan(B),
            topics.plan(A),
        ]
        for topic in forged_topics:
            assert await a.publish(topic, forged, retain=True)
        assert await a.publish(topics.events(A), control)
        await until(lambda: watch.index(topics.events(A), control) is not None, "A's control")
        assert [m.topic for m in watch.messages if m.payload == forged] == []

        # 3. positive control on B's topic: B itself can publish there, and the service sees it
        legit = b"B: mlx5_0 up"
        assert await b.publish(topics.port_state(B, "mlx5_0", 1), legit, retain=True)
        await until(lambda: watch.index(topics.port_state(B, "mlx5_0", 1), legit) is not None, "B")

    # 4. retained: a fresh reader of B's topics gets B's own state, none of A's forgeries
    fresh = Inbox()
    async with client(
        secured.bus(SERVICE), "fresh", subscriptions=[topics.all_host_topics()], handler=fresh
    ) as reader:
        await reader.wait_connected(10)
        await until(lambda: len(fresh.messages) >= 2, "the retained port states")
        async with client(secured.bus(A), "a2") as a2:  # control after the retained ones
            await a2.wait_connected(10)
            assert await a2.publish(topics.events(A), control)
            await until(lambda: fresh.index(topics.events(A), control) is not None, "control")
    retained = {m.topic: m.payload for m in fresh.messages if m.retain}
    assert retained == {
        topics.port_state(A, "mlx5_0", 1): own,
        topics.port_state(B, "mlx5_0", 1): legit,
    }


def _sever(bus: Bus) -> None:
    """Cut ``bus``'s connection without an MQTT DISCONNECT (a crashed process): the broker
    publishes its last will. Reaches into aiomqtt/paho for the socket, as
    linkguard.simulations.livebus does."""
    sock = bus._client._client.socket()  # type: ignore[union-attr]
    sock.shutdown(socket.SHUT_RDWR)


async def test_a_host_cannot_forge_another_hosts_last_will(secured: Secured) -> None:
    """A will on another host's status topic (the agent's "I am offline") is accepted at
    connect but never published: the broker checks it against the ACL like any publish."""
    watch = Inbox()
    async with client(
        secured.bus(SERVICE), "service", subscriptions=[topics.all_host_topics()], handler=watch
    ) as service:
        await service.wait_connected(10)
        for name, victim in (("own-will", A), ("forged-will", B)):
            will = Will(topics.status(victim), f"{name}: {victim} offline".encode())
            bus = Bus(**secured.bus(A).connection(), client_id=f"test-{name}", will=will)
            async with bus:
                await bus.wait_connected(10)
                # the broker names the client by its user (use_username_as_clientid)
                closed = f"Client {A} closed its connection"
                before = secured.log().count(closed)
                _sever(bus)
                # the broker noticed the cut (and sent the will, if allowed) before logging it
                await until(lambda c=closed, b=before: secured.log().count(c) > b, f"{name} gone")
        async with client(secured.bus(A), "a") as a:
            await a.wait_connected(10)
            assert await a.publish(topics.events(A), b"control")
            await until(lambda: watch.index(topics.events(A), b"control") is not None, "control")
    assert [(m.topic, m.payload) for m in watch.messages] == [
        (topics.status(A), b"own-will: gpu000 offline"),  # the will mechanism works
        (topics.events(A), b"control"),
    ]


async def test_a_host_reads_its_own_plan_but_not_another_hosts(secured: Secured) -> None:
    got = Inbox()
    plan_a, plan_b = b"plan for A", b"plan for B"
    async with client(secured.bus(SERVICE), "service") as service:
        await service.wait_connected(10)
        # retained before A subscribes: its subscription would deliver them at once
        assert await service.publish(topics.plan(B), plan_b + b" (retained)", retain=True)
        assert await service.publish(topics.plan(A), plan_a + b" (retained)", retain=True)
        async with client(
            secured.bus(A),
            "a",
            # what a hostile agent would ask for: B's plan, every plan, and the shared topics
            subscriptions=[
                topics.plan(B),
                topics.all_plans(),
                topics.plan(A),
                topics.all_peer_routes(),
                topics.service_health(),
                topics.fabric_faults(),
            ],
            handler=got,
        ) as a:
            await a.wait_connected(10)
            await until(lambda: got.index(topics.plan(A), plan_a + b" (retained)") is not None, "A")
            # live: B's plan, then A's plan and the shared topics as controls
            assert await service.publish(topics.plan(B), plan_b, retain=True)
            assert await service.publish(topics.peer_routes(B), b"peers of B", retain=True)
            assert await service.publish(topics.service_health(), b"health", retain=True)
            assert await service.publish(topics.plan(A), plan_a, retain=True)
            await until(lambda: got.index(topics.plan(A), plan_a) is not None, "A's live plan")
    assert topics.plan(B) not in got.topics()
    # the shared topics it may read did arrive (before the last control)
    assert got.index(topics.peer_routes(B), b"peers of B") is not None
    assert got.index(topics.service_health(), b"health") is not None
    # Mosquitto 2.0 grants the subscription to plans/B and filters each message on read
    # access, so the refusal is silent; both ways nothing of B's arrives
    print(f"\nrefused subscriptions (SUBACK 0x80): {a.refused_subscriptions}")


async def test_the_operator_sets_faults_and_hosts_cannot(secured: Secured) -> None:
    seen = Inbox()
    async with (
        client(
            secured.bus(SERVICE),
            "service",
            subscriptions=[topics.fabric_faults(), topics.all_host_topics()],
            handler=seen,
        ) as service,
        client(secured.bus(OPERATOR), "operator") as operator,
        client(secured.bus(A), "a") as a,
    ):
        for bus in (service, operator, a):
            await bus.wait_connected(10)
        assert await a.publish(topics.fabric_faults(), b"forged faults by A", retain=True)
        assert await a.publish(topics.events(A), b"control")
        assert await operator.publish(topics.fabric_faults(), b"faults by the operator")
        await until(lambda: seen.index(topics.events(A), b"control") is not None, "A's control")
        await until(
            lambda: seen.index(topics.fabric_faults(), b"faults by the operator") is not None,
            "the operator's faults",
        )
    assert [m.payload for m in seen.messages if m.topic == topics.fabric_faults()] == [
        b"faults by the operator"
    ]


def test_the_operator_cli_publishes_faults_with_its_credentials(
    secured: Secured, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``linkguard fabric faults -c operator.yaml``: published over TLS as the operator; a
    wrong password exits 1 saying the broker refused it (not "cannot reach")."""
    config = tmp_path / "operator.yaml"
    pw = secured.etc / "users" / f"{OPERATOR}.password"
    bus = (
        f"bus:\n  port: {secured.port}\n  tls: true\n  ca_file: {secured.etc / 'ca.crt'}\n"
        f"  username: {OPERATOR}\n"
    )
    config.write_text(bus + f"  password_file: {pw}\n")
    argv = ["fabric", "faults", "-c", str(config), "--switch-down", "su0-leaf1"]
    assert main([*argv, "--timeout", "10"]) == 0, capsys.readouterr().err
    assert "published to linkguard/v1/fabric/faults" in capsys.readouterr().out

    async def read() -> bytes:
        got = Inbox()
        async with client(
            secured.bus(SERVICE), "reader", subscriptions=[topics.fabric_faults()], handler=got
        ):
            await until(lambda: got.messages, "the retained faults")
        return got.messages[0].payload

    assert b'"su0-leaf1"' in asyncio.run(read())

    config.write_text(bus + "  password: wrong-password\n")
    assert main([*argv, "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert f"the MQTT broker at 127.0.0.1:{secured.port} refused the connection" in err, err
    assert "not authorised" in err and "nothing published" in err
    assert "wrong-password" not in err


async def test_clients_without_credentials_tls_or_the_right_ca_are_refused(
    secured: Secured, tmp_path: Path
) -> None:
    password = (secured.etc / "users" / f"{A}.password").read_text().strip()
    other_ca = tmp_path / "other-ca"
    _run_make_certs(other_ca)
    cases = {
        "anonymous": (secured.bus(None), "not authorised"),
        "wrong password": (
            secured.bus(None, username=A, password="not-" + password),
            "not authorised",
        ),
        "unknown user": (secured.bus(None, username="gpu999", password=password), "not auth"),
        "plain TCP": (
            BusSettings(port=secured.port, username=A, password=password),
            "if this port is a TLS listener, set bus.tls",
        ),
        "another CA": (
            secured.bus(A, ca_file=other_ca / "ca.crt"),
            "certificate verify failed",
        ),
    }
    with capture_logs() as logs:
        for name, (settings, expected) in cases.items():
            bus = Bus(**settings.connection(), client_id=f"test-{name}", timeout_s=1.0)
            async with bus:
                await until(lambda b=bus: b.last_error is not None, f"{name}: a failed connect")
                # what a caller waiting for the connection is told
                with pytest.raises(BusConnectTimeout) as exc:
                    await bus.wait_connected(0.1)
                assert bus.connects == 0
            message = str(exc.value)
            assert expected.lower() in message.lower(), (name, message)
            assert f"127.0.0.1:{secured.port}" in message, message
            print(f"\n{name}: {message}")
    # refusals are errors with a hint; the password appears in no log line
    refused = [e for e in logs if e["event"] == "bus_refused"]
    assert refused and all(e["log_level"] == "error" and e["hint"] for e in refused)
    assert not [e for e in logs if password in repr(e)]
    # the broker's side: Mosquitto logged the refused logins
    await until(lambda: "not authorised" in secured.log(), "mosquitto's log of the refusals")


async def test_mutual_tls_variant(certs: Path, tmp_path: Path) -> None:
    """The conf's mutual-TLS alternative: the client certificate's CN is the user (no
    password), the same ACL applies; no certificate, or one of another CA, fails."""
    other_ca = tmp_path / "other-ca"
    _run_make_certs(other_ca, "-c", A)

    def cert(etc: Path, user: str) -> dict[str, Path]:
        return {
            "cert_file": etc / "users" / f"{user}.crt",
            "key_file": etc / "users" / f"{user}.key",
        }

    with hardened_broker(certs, tmp_path / "broker", mtls=True) as secured:
        watch = Inbox()
        async with (
            client(
                secured.bus(None, **cert(certs, SERVICE)),
                "service",
                subscriptions=[topics.all_host_topics()],
                handler=watch,
            ) as service,
            client(secured.bus(None, **cert(certs, A)), "a") as a,
        ):
            await service.wait_connected(10)
            await a.wait_connected(10)
            assert await a.publish(topics.port_state(B, "mlx5_0", 1), b"forged")
            assert await a.publish(topics.port_state(A, "mlx5_0", 1), b"own")
            await until(
                lambda: watch.index(topics.port_state(A, "mlx5_0", 1), b"own") is not None, "A"
            )
            assert watch.topics() == [topics.port_state(A, "mlx5_0", 1)]
        for name, settings in {
            "no certificate": secured.bus(A),  # a valid password does not replace it
            "another CA's certificate": secured.bus(None, **cert(other_ca, A)),
        }.items():
            bus = Bus(**settings.connection(), client_id=f"test-{name}", timeout_s=1.0)
            async with bus:
                await until(lambda b=bus: b.last_error is not None, f"{name}: a failed connect")
                assert bus.connects == 0, name
            assert bus.last_hint is not None and "client certificate" in bus.last_hint, name
            print(f"\n{name}: {bus.last_error} ({bus.last_hint})")


async def test_agents_and_service_run_end_to_end_over_tls_with_own_credentials(
    secured: Secured, tmp_path: Path
) -> None:
    fleet = _SecuredFleet(FABRIC, secured, tmp_path)
    async with fleet:
        await until(fleet.all_acked, "every host's plan applied and acked", timeout=20)
        epoch0 = fleet.service.state.epoch
        for agent in fleet.agents.values():
            assert agent.bus.refused_subscriptions == []
            assert agent.applier.plan is not None and agent.applier.plan.host == agent.host
        assert fleet.service.bus.refused_subscriptions == []
        # a link event flows agent -> service -> plans -> acks over the secured broker
        hca = FABRIC.host(A).hcas[1]
        fleet.sources[A].link_down(hca.hca, hca.port)
        await until(
            lambda: fleet.service.state.unusable() == {A: frozenset({1})}, "A's rail 1 down"
        )
        await until(lambda: fleet.all_acked(epoch0 + 1), "the new plans acked", timeout=20)
        assert all(
            a.last_ack is not None and a.last_ack.epoch > epoch0 for a in fleet.agents.values()
        )


class _SecuredFleet:
    """The topology service and one agent per fabric host (simulated ports, in-memory route
    tables), each with its own user and password over TLS, as in production."""

    def __init__(self, fabric: Fabric, secured: Secured, workdir: Path) -> None:
        self.service = TopologyService(
            ServiceSettings(
                bus=secured.bus(SERVICE),
                solve={"short_ms": 20},
                startup_settle_s=0.2,
                api=ApiSettings(enabled=False),
            ),
            fabric=fabric,
        )
        self.sources: dict[str, SimulatedPortSource] = {}
        self.agents: dict[str, Agent] = {}
        for inv in fabric.hosts:
            settings: AgentSettings = agent_settings_for(
                fabric,
                inv.host,
                bus=secured.bus(inv.host),
                workdir=workdir,
                damping=DampingPolicy(),
            )
            self.sources[inv.host] = SimulatedPortSource(
                [active_port(h.hca, h.port, link_layer=h.link_layer) for h in inv.hcas]
            )
            self.agents[inv.host] = Agent(
                settings, source=self.sources[inv.host], table=MemoryRouteTable(), discovered=[]
            )
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> _SecuredFleet:
        self._tasks = [asyncio.create_task(self.service.run(), name="service")]
        self._tasks += [asyncio.create_task(a.run(), name=h) for h, a in self.agents.items()]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for a in self.agents.values():
            a.stop()
        self.service.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def all_acked(self, epoch_floor: int = 0) -> bool:
        state = self.service.state
        return len(state.published) == len(self.agents) and all(
            h in state.acks
            and state.acks[h].result == AckResult.APPLIED
            and state.acks[h].epoch == state.acked_epoch(h)
            and state.acks[h].epoch >= epoch_floor
            for h in self.agents
        )


# ------------------------------------------------------------------------------------------
# Settings and the script, without a broker


def test_bus_settings_check_tls_files_and_never_show_the_password(
    certs: Path, tmp_path: Path
) -> None:
    pw_file = certs / "users" / f"{A}.password"
    s = BusSettings(tls=True, ca_file=certs / "ca.crt", username=A, password_file=pw_file)
    conn = s.connection()
    assert (
        conn["password"] == pw_file.read_text().strip() and conn["tls"].ca_file == certs / "ca.crt"
    )
    inline = BusSettings(username=A, password="s3cret-value")
    assert "s3cret-value" not in repr(inline) and "s3cret-value" not in str(inline.model_dump())
    assert inline.connection()["password"] == "s3cret-value"

    config = tmp_path / "agent.yaml"
    bad = {
        "ca_file: /nonexistent/ca.crt": "bus: ca_file /nonexistent/ca.crt does not exist",
        f"ca_file: {certs}": "is not a file",
        f"ca_file: {pw_file}": "is not a PEM CA certificate",
        f"ca_file: {certs / 'ca.crt'}\n  cert_file: {certs / 'users' / (A + '.password')}": (
            "not a PEM certificate and its private key"
        ),
        f"ca_file: {certs / 'ca.crt'}\n  key_file: {certs / 'broker.key'}": "key_file needs",
    }
    for lines, expected in bad.items():
        config.write_text(f"host: {A}\nbus:\n  tls: true\n  {lines}\n")
        with pytest.raises(ConfigError, match="bus") as exc:
            load_settings(AgentSettings, config)
        assert expected in str(exc.value), str(exc.value)
    for lines, expected in {
        f"username: {A}\n  password: x\n  password_file: {pw_file}": "not both",
        "password: x": "a password needs a username",
        f"username: {A}\n  password_file: {tmp_path / 'none'}": "password_file",
        f"ca_file: {certs / 'ca.crt'}": "tls is off",
    }.items():
        config.write_text(f"host: {A}\nbus:\n  {lines}\n")
        with pytest.raises(ConfigError) as exc:
            load_settings(AgentSettings, config)
        assert expected in str(exc.value), str(exc.value)
        assert "s3cret" not in str(exc.value)
    # an unreadable password file (a file the agent's user may not read): chmod 000 is not
    # enough for root, so only checked as another user
    if os.geteuid() != 0:
        locked = tmp_path / "locked.password"
        locked.write_text("x\n")
        locked.chmod(0)
        config.write_text(f"host: {A}\nbus:\n  username: {A}\n  password_file: {locked}\n")
        with pytest.raises(ConfigError, match="not readable"):
            load_settings(AgentSettings, config)


def test_make_certs_is_idempotent_and_keeps_keys_private(tmp_path: Path) -> None:
    require_binary("openssl")
    out = tmp_path / "out"
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("# the GPU hosts\nh1\n\n h2 \n")
    subprocess.run(
        ["bash", str(DEPLOY / "make-certs.sh"), "-o", str(out), "-f", str(hosts_file), "-c"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    snapshot = {f: (out / f).read_bytes() for f in files}
    users = ["h1", "h2", "linkguard-operator", "linkguard-topology"]
    for u in users:
        assert {f"users/{u}.password", f"users/{u}.crt", f"users/{u}.key"} <= set(files)
    plain = (out / "passwd.plain").read_text().splitlines()
    assert [line.split(":")[0] for line in plain] == users
    for f in files:
        mode = stat.S_IMODE((out / f).stat().st_mode)
        private = f.endswith((".key", ".password")) or f.startswith("passwd")
        assert mode == (0o600 if private else 0o644), (f, oct(mode))
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    # the broker certificate names localhost and 127.0.0.1; certificates verify against the CA
    text = subprocess.run(
        ["openssl", "x509", "-in", str(out / "broker.crt"), "-noout", "-ext", "subjectAltName"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "DNS:localhost" in text and "IP Address:127.0.0.1" in text
    subprocess.run(
        ["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "broker.crt")]
        + [str(out / "users" / f"{u}.crt") for u in users],
        check=True,
        capture_output=True,
    )
    # a second run with one more host: everything kept, the new host added
    again = _run_make_certs(out, "-f", str(hosts_file), "h3")
    for f, data in snapshot.items():
        if f not in ("passwd", "passwd.plain"):  # rewritten (new user; hashes are salted)
            assert (out / f).read_bytes() == data, f
    assert (out / "users" / "h3.password").exists()
    assert "made a password for h3" in again.stdout and "h1" not in again.stdout
    assert len((out / "passwd.plain").read_text().splitlines()) == 5
    # bad names are refused, naming the rule
    bad = subprocess.run(
        ["bash", str(DEPLOY / "make-certs.sh"), "-o", str(out), "gpu/7"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "letters, digits" in bad.stderr


async def test_probes_a_host_reads_its_own_targets_and_reports_only_as_itself(
    secured: Secured,
) -> None:
    got, seen = Inbox(), Inbox()
    async with client(
        secured.bus(SERVICE), "service", subscriptions=[topics.all_host_topics()], handler=seen
    ) as service:
        await service.wait_connected(10)
        assert await service.publish(topics.probe_targets(B), b"targets of B", retain=True)
        async with client(
            secured.bus(A),
            "a",
            subscriptions=[
                topics.probe_targets(B),
                f"{topics.PREFIX}/probes/+",
                topics.probe_targets(A),
            ],
            handler=got,
        ) as a:
            await a.wait_connected(10)
            # A's report as B is dropped by the broker; its own arrives (the control after it)
            assert await a.publish(topics.probe_report(B), b"forged report")
            assert await a.publish(topics.probe_report(A), b"own report")
            await until(lambda: seen.index(topics.probe_report(A), b"own report") is not None, "A")
            # live targets of B, then A's own as the control
            assert await service.publish(topics.probe_targets(B), b"targets of B 2", retain=True)
            assert await service.publish(topics.probe_targets(A), b"targets of A", retain=True)
            await until(
                lambda: got.index(topics.probe_targets(A), b"targets of A") is not None, "A's"
            )
    assert topics.probe_targets(B) not in got.topics()
    assert topics.probe_report(B) not in seen.topics()
