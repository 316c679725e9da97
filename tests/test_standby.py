"""Issue 6, part "standby": a standby topology service takes over through a lease in etcd, the
lease's revision is the plans' term, and agents refuse plans of a deposed leader.

Real processes: an etcd (Debian ``etcd-server``) this suite starts on free loopback ports with
a temporary data dir, a private Mosquitto, two ``linkguard topology serve`` processes with
``leader.etcd`` configured (lease TTL 2 s, etcd's minimum) and real agents (simulated ports,
in-memory route tables) in the test process. A reader on ``plans/+`` and ``peers/+`` records
every plan and peer routes message with its term, so who published what is read off the bus.

* (a) both services run: only the lease holder publishes; the standby stays up, announces
  nothing and is not taken for a duplicate service; a clean stop (SIGTERM) of the leader
  revokes its lease and the standby takes over without waiting for the TTL;
* (b) SIGKILL the leader: the standby takes over within TTL + a bound, re-issues every plan
  with its (higher) term, the agents apply them, and a link down after the takeover is
  re-planned by it;
* (c) SIGSTOP the leader until the standby has taken over, SIGCONT it: it publishes nothing
  more (its local lease deadline has passed), logs ``leadership_lost`` and exits 1; a plan or
  peer routes message of its term (what it would have sent) is refused by every agent as
  ``deposed_leader``, counted, and changes no route;
* etcd down: the leader steps down at its local deadline (before its lease could expire) and
  exits 1, the standby cannot win, nobody publishes, the agents keep their routes; etcd back,
  the standby leads with a higher term;
* (d) the agent's term rules, on the real agent with an in-memory table: a lower term is
  refused, a higher term with a lower epoch is applied, within one term the epoch decides.

Measured takeover times are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.agent.plans import PlanRefused, check_plan
from linkguard.broker import free_port
from linkguard.bus import Bus, BusMessage
from linkguard.config import BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import Plan, decode, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
from linkguard.topology.leader import EtcdLease, SoleLeader, leadership_from_settings
from linkguard.topology.solver import Solver
from tests.support import require_binary, retained, until

FABRIC = generate_rail_optimized(hosts=3, rails=2)
HOSTS = FABRIC.host_names
ME = HOSTS[0]
TTL_S = 2
#: a takeover after the leader dies: its lease runs out (at most TTL_S after its last
#: keepalive), the standby's next poll (0.5 s), a solve and the publish; the rest is slack
#: for a loaded 2-core CI machine
TAKEOVER_BOUND_S = TTL_S + 3.0


# -- etcd ----------------------------------------------------------------------------------------


@dataclass
class Etcd:
    process: subprocess.Popen
    port: int
    peer_port: int
    log: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


async def start_etcd(tmp: Path, ports: tuple[int, int] | None = None) -> Etcd:
    """etcd on free loopback client and peer ports (or ``ports``, to restart one), data in
    ``tmp``; ready when a read through the client library answers."""
    binary = require_binary("etcd")
    client, peer = ports or (free_port(), free_port())
    log = tmp / "etcd.log"
    c_url, p_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen(
        [
            binary,
            "--name=lg",
            f"--data-dir={tmp / 'etcd-data'}",
            f"--listen-client-urls={c_url}",
            f"--advertise-client-urls={c_url}",
            f"--listen-peer-urls={p_url}",
            f"--initial-advertise-peer-urls={p_url}",
            f"--initial-cluster=lg={p_url}",
            "--logger=zap",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    etcd = Etcd(proc, client, peer, log)
    import aetcd

    deadline = time.monotonic() + 20
    while True:
        try:
            async with aetcd.Client(host="127.0.0.1", port=client, timeout=1) as c:
                await c.get(b"/probe")
            return etcd
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"etcd did not start: {log.read_text()[-2000:]}") from None
            await asyncio.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


# -- the rig ---------------------------------------------------------------------------------------


@dataclass
class Seen:
    at: float  # monotonic, in this process
    topic: str
    term: int
    epoch: int
    payload: bytes


@dataclass
class Rig:
    tmp: Path
    etcd: Etcd
    port: int
    fabric_path: Path
    agents: dict[str, Agent]
    seen: list[Seen] = field(default_factory=list)
    services: dict[str, subprocess.Popen] = field(default_factory=dict)

    def serve(self, name: str) -> subprocess.Popen:
        """``linkguard topology serve`` with the etcd leader election, logging to
        ``<name>.log``."""
        env = {
            **os.environ,
            "LINKGUARD_STARTUP_SETTLE_S": "0.5",
            "LINKGUARD_LEADER__ETCD__ENDPOINTS": json.dumps([self.etcd.endpoint]),
            "LINKGUARD_LEADER__ETCD__TTL_S": str(TTL_S),
        }
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "linkguard"),
                "topology",
                "serve",
                "--fabric",
                str(self.fabric_path),
                "--broker",
                f"127.0.0.1:{self.port}",
            ],
            stdout=(self.tmp / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.services[name] = proc
        return proc

    def events(self, name: str, event: str) -> list[dict]:
        out = []
        for line in (self.tmp / f"{name}.log").read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("event") == event:
                out.append(doc)
        return out

    async def logged(self, name: str, event: str, timeout: float = 20) -> dict:
        await until(lambda: self.events(name, event), f"{event} in {name}.log", timeout)
        return self.events(name, event)[0]

    def terms_since(self, t: float) -> set[int]:
        return {s.term for s in self.seen if s.at >= t}

    def all_on_term(self, term: int) -> bool:
        return all(
            a.applier.plan is not None and a.applier.plan.term == term for a in self.agents.values()
        )


def _agent(tmp: Path, host: str, port: int) -> Agent:
    s = agent_settings_for(
        FABRIC,
        host,
        workdir=tmp,
        bus=BusSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.3),
        damping=DampingPolicy(hold_down_initial_s=60),
    )
    src = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(host).hcas])
    return Agent(s, source=src, table=MemoryRouteTable(), discovered=[])


@asynccontextmanager
async def rig(mosquitto, tmp: Path) -> AsyncIterator[Rig]:
    """etcd, the agents of every host, and a reader of every plan and peer routes message;
    the services are started by the test (:meth:`Rig.serve`) and killed at the end."""
    etcd = await start_etcd(tmp)
    fabric_path = tmp / "fabric.yaml"
    fabric_path.write_text(dump_fabric(FABRIC, "yaml"))
    port = mosquitto.port
    r = Rig(tmp, etcd, port, fabric_path, {h: _agent(tmp, h, port) for h in HOSTS})

    async def record(m: BusMessage) -> None:
        if not m.payload:
            return
        doc = json.loads(m.payload)
        r.seen.append(Seen(time.monotonic(), m.topic, doc.get("term", 0), doc["epoch"], m.payload))

    reader = Bus(
        host="127.0.0.1",
        port=port,
        client_id="test-plan-reader",
        subscriptions=[topics.all_plans(), topics.all_peer_routes()],
        handler=record,
    )
    tasks = [asyncio.create_task(a.run()) for a in r.agents.values()]
    try:
        async with reader:
            await reader.wait_connected(10)
            yield r
    finally:
        for proc in r.services.values():
            _stop(proc)
        for a in r.agents.values():
            a.stop()
        _, pending = await asyncio.wait(tasks, timeout=15)
        for t in pending:
            t.cancel()
        _stop(r.etcd.process)
        assert not pending, f"{len(pending)} agent(s) ignored stop"


async def _leader_and_standby(r: Rig) -> tuple[int, subprocess.Popen, subprocess.Popen]:
    """Start service A, wait until it leads and every agent applied its plans; then start B
    and wait until it stands by. Returns (A's term, A, B)."""
    a = r.serve("a")
    active = await r.logged("a", "leader_active")
    term_a = active["term"]
    assert active["role"] == "leader" and term_a > 0
    await until(lambda: r.all_on_term(term_a), "every agent on A's plans", timeout=20)
    b = r.serve("b")
    standby = await r.logged("b", "leader_standby")
    assert standby["role"] == "standby" and standby["term"] is None
    await r.logged("b", "bus_connected")
    return term_a, a, b


# -- (a) one publisher ---------------------------------------------------------------------------


@pytest.mark.real
async def test_only_the_lease_holder_publishes_while_both_run(mosquitto, tmp_path: Path) -> None:
    async with rig(mosquitto, tmp_path) as r:
        term_a, a, b = await _leader_and_standby(r)
        t0 = time.monotonic()
        me = r.agents[ME]
        before = me.applier.plan
        assert before is not None
        me.source.link_down("mlx5_1")
        await until(
            lambda: me.applier.plan is not before and me.applier.plan.epoch > before.epoch,
            "the leader re-plans the link down",
            timeout=20,
        )
        await until(lambda: r.terms_since(t0), "the re-plan on the bus")
        # the standby saw the same (warm) but published nothing: every message is A's
        assert {s.term for s in r.seen} == {term_a}
        assert r.all_on_term(term_a)
        assert a.poll() is None and b.poll() is None  # neither yielded as a duplicate
        assert not r.events("b", "plans_published")
        assert not r.events("b", "duplicate_service") and not r.events("a", "duplicate_service")
        # service/status names the leader and its term
        status = json.loads(
            await retained(r.port, topics.service_status(), until_payload=b"leader")
        )
        assert (status["role"], status["term"], status["online"]) == ("leader", term_a, True)

        # a clean stop (SIGTERM) revokes the lease: the standby need not wait for the TTL
        a.send_signal(signal.SIGTERM)
        t_term = time.monotonic()
        assert await asyncio.to_thread(a.wait, 10) == 0
        assert r.events("a", "leader_resigned")
        await until(
            lambda: any(t > term_a for t in r.terms_since(t_term)),
            "the standby's plans after the leader's clean stop",
            timeout=TAKEOVER_BOUND_S,
        )
        handover = min(s.at for s in r.seen if s.at >= t_term and s.term > term_a) - t_term
        print(
            f"\nhandover after SIGTERM (lease revoked): first plan of B on the bus {handover:.2f} s"
        )
        assert r.terms_since(t_term) == {(await r.logged("b", "leader_active"))["term"]}


# -- (b) SIGKILL the leader --------------------------------------------------------------------


@pytest.mark.real
async def test_sigkill_leader_standby_takes_over_with_higher_term(
    mosquitto, tmp_path: Path
) -> None:
    async with rig(mosquitto, tmp_path) as r:
        term_a, a, b = await _leader_and_standby(r)
        a.send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        assert a.wait(5) == -signal.SIGKILL
        await until(
            lambda: any(t > term_a for t in r.terms_since(t_kill)),
            "a plan of a higher term on the bus",
            timeout=TAKEOVER_BOUND_S + 5,
        )
        first = min(s.at for s in r.seen if s.at >= t_kill and s.term > term_a)
        await until(lambda: r.all_on_term(r.agents[ME].applier.plan.term), "agents", 10)
        term_b = (await r.logged("b", "leader_active"))["term"]
        assert term_b > term_a
        await until(lambda: r.all_on_term(term_b), "every agent on B's plans", timeout=10)
        applied = time.monotonic()
        print(
            f"\ntakeover after SIGKILL (lease TTL {TTL_S} s): first plan of term {term_b} on "
            f"the bus {first - t_kill:.2f} s, every agent applied <= {applied - t_kill:.2f} s"
        )
        assert first - t_kill < TAKEOVER_BOUND_S
        # every plan and peer routes message since the kill is B's (A is dead)
        assert r.terms_since(t_kill) == {term_b}
        assert sum(ag.stats.plans_refused.total() for ag in r.agents.values()) == 0
        # a link down after the takeover is re-planned by B
        other = r.agents[HOSTS[1]]
        epoch, routes = other.applier.plan.epoch, dict(other.table.routes)
        r.agents[ME].source.link_down("mlx5_0")
        await until(
            lambda: other.applier.plan.epoch > epoch and other.table.routes != routes,
            "B re-plans the link down",
            timeout=20,
        )
        assert other.applier.plan.term == term_b
        replanned = r.events("b", "plans_published")
        assert any(f"{ME}:[0]" in d.get("unusable", []) for d in replanned)
        assert b.poll() is None


# -- (c) a deposed leader --------------------------------------------------------------------------


@pytest.mark.real
async def test_deposed_leader_is_refused_and_steps_down(mosquitto, tmp_path: Path) -> None:
    async with rig(mosquitto, tmp_path) as r:
        term_a, a, b = await _leader_and_standby(r)
        last_a = {s.topic: s for s in r.seen if s.term == term_a}
        a.send_signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            active = await r.logged("b", "leader_active", timeout=TAKEOVER_BOUND_S + 5)
            term_b = active["term"]
            assert term_b > term_a
            await until(lambda: r.all_on_term(term_b), "every agent on B's plans", timeout=10)
            print(
                f"\ntakeover from a frozen leader (SIGSTOP, lease TTL {TTL_S} s): every agent "
                f"on term {term_b} after {time.monotonic() - t_stop:.2f} s"
            )
            # work for the frozen leader: a link down it will find queued when it runs again
            me = r.agents[ME]
            epoch = me.applier.plan.epoch
            me.source.link_down("mlx5_1")
            await until(lambda: me.applier.plan.epoch > epoch, "B re-plans", timeout=20)
        finally:
            a.send_signal(signal.SIGCONT)
        t_cont = time.monotonic()
        # A finds its local lease deadline passed: it stops without publishing and exits 1
        lost = await r.logged("a", "leadership_lost", timeout=10)
        assert lost["term"] == term_a
        assert await asyncio.to_thread(a.wait, 10) == 1
        assert term_a not in r.terms_since(t_cont)
        assert b.poll() is None

        # what a deposed leader would send (a packet in flight, a leader without a lease
        # check): its last plan and peer routes with a fresh epoch above every one seen
        tables = {h: dict(ag.table.routes) for h, ag in r.agents.items()}
        top = max(s.epoch for s in r.seen) + 1000
        sender = Bus(host="127.0.0.1", port=r.port, client_id="deposed", subscriptions=[])
        async with sender:
            await sender.wait_connected(10)
            plan_topic = topics.plan(ME)
            old = decode(Plan, last_a[plan_topic].payload, topic=plan_topic, expect_host=ME)
            assert old.term == term_a
            await sender.publish(
                plan_topic, encode(old.model_copy(update={"epoch": top})), retain=False
            )
            # peer routes of the deposed term that would impair a peer (rail 0 of the last
            # host), on every agent's peers/+ subscription
            peer = HOSTS[-1]
            pr = Solver(FABRIC, {peer: frozenset({0})}).peer_routes(peer, epoch=top, now=1.0)
            assert pr.classes  # it would add routes
            await sender.publish(
                topics.peer_routes(peer),
                encode(pr.model_copy(update={"term": term_a})),
                retain=False,
            )
            await until(
                lambda: (
                    r.agents[ME].stats.plans_refused["deposed_leader"] == 2
                    and all(
                        ag.stats.plans_refused["deposed_leader"] == 1
                        for h, ag in r.agents.items()
                        if h != ME
                    )
                ),
                "every agent refuses the deposed leader's messages",
            )
        for h, ag in r.agents.items():
            assert ag.table.routes == tables[h], h
            assert ag.applier.plan.term == term_b and ag.term == term_b
            assert (Path(ag.settings.state_dir) / "term").read_text().strip() == str(term_b)


# -- etcd down ----------------------------------------------------------------------------------


@pytest.mark.real
async def test_etcd_outage_leader_steps_down_nobody_steers_until_it_is_back(
    mosquitto, tmp_path: Path
) -> None:
    """etcd SIGKILLed: the leader cannot renew, steps down at its local deadline (before its
    lease could expire) and exits 1; the standby cannot win a lease, so nobody publishes and the
    agents keep their routes. etcd back (same data): the old lease runs out, the standby wins
    with a higher term and the agents take its plans."""
    async with rig(mosquitto, tmp_path) as r:
        term_a, a, b = await _leader_and_standby(r)
        tables = {h: dict(ag.table.routes) for h, ag in r.agents.items()}
        r.etcd.process.kill()
        r.etcd.process.wait(10)
        t_down = time.monotonic()
        lost = await r.logged("a", "leadership_lost", timeout=TTL_S + 5)
        assert await asyncio.to_thread(a.wait, 10) == 1
        print(f"\nleader stepped down {time.monotonic() - t_down:.2f} s after etcd died")
        assert lost["term"] == term_a
        assert not r.terms_since(t_down) - {term_a}  # nothing of another term
        await asyncio.sleep(TTL_S)  # a standby that wrongly led would publish meanwhile
        assert not r.terms_since(t_down) - {term_a}
        assert b.poll() is None and not r.events("b", "leader_active")
        assert {h: ag.table.routes for h, ag in r.agents.items()} == tables

        r.etcd = await start_etcd(tmp_path, (r.etcd.port, r.etcd.peer_port))
        t_up = time.monotonic()
        term_b = (await r.logged("b", "leader_active", timeout=TAKEOVER_BOUND_S + 10))["term"]
        assert term_b > term_a
        await until(lambda: r.all_on_term(term_b), "every agent on B's plans", timeout=10)
        print(f"standby led {time.monotonic() - t_up:.2f} s after etcd came back (term {term_b})")


# -- (d) the agent's term rules ------------------------------------------------------------------


def _plan(epoch: int, term: int, *, down: frozenset[int] = frozenset()) -> Plan:
    solver = Solver(FABRIC, {ME: down} if down else {})
    return solver.plan(ME, epoch=epoch, now=1.0).model_copy(update={"term": term})


def _check(plan: Plan, applied: Plan | None) -> None:
    h = FABRIC.host(ME)
    check_plan(
        plan,
        host=ME,
        applied_epoch=applied.epoch if applied else None,
        applied_term=applied.term if applied else 0,
        netdevs={x.netdev for x in h.hcas if x.netdev},
        prefixes=[],
    )


def test_check_plan_orders_by_term_then_epoch() -> None:
    applied = _plan(100, 5)
    with pytest.raises(PlanRefused) as e:
        _check(_plan(500, 4), applied)  # a lower term, whatever its epoch
    assert e.value.reason == "deposed_leader"
    _check(_plan(50, 6), applied)  # a higher term with a lower epoch
    _check(_plan(101, 5), applied)  # one term: a newer epoch
    for epoch in (100, 99):  # one term: the same or an older epoch
        with pytest.raises(PlanRefused) as e:
            _check(_plan(epoch, 5), applied)
        assert e.value.reason == "stale_epoch"


async def test_agent_refuses_lower_term_applies_higher_term_with_lower_epoch(
    tmp_path: Path,
) -> None:
    agent = _agent(tmp_path, ME, free_port())
    await agent.applier.start()

    async def deliver(plan: Plan) -> None:
        await agent._on_message(BusMessage(topics.plan(ME), encode(plan), retain=True))

    await deliver(_plan(100, 5))
    assert (agent.applier.plan.term, agent.applier.plan.epoch, agent.term) == (5, 100, 5)
    nominal = dict(agent.table.routes)

    await deliver(_plan(500, 4, down=frozenset({1})))  # deposed: never applied
    assert agent.stats.plans_refused["deposed_leader"] == 1
    assert (agent.applier.plan.term, agent.applier.plan.epoch) == (5, 100)
    assert agent.table.routes == nominal

    await deliver(_plan(90, 5, down=frozenset({1})))  # one term, older epoch: stale
    assert agent.stats.plans_refused["stale_epoch"] == 1
    assert agent.table.routes == nominal

    await deliver(_plan(50, 6, down=frozenset({1})))  # a new leader, its epochs lower
    assert (agent.applier.plan.term, agent.applier.plan.epoch, agent.term) == (6, 50, 6)
    assert agent.table.routes != nominal
    assert (tmp_path / ME / "term").read_text().strip() == "6"

    await deliver(_plan(51, 6))  # the same term: the epoch decides
    assert (agent.applier.plan.term, agent.applier.plan.epoch) == (6, 51)
    assert agent.table.routes == nominal
    assert agent.stats.plans_refused.total() == 2

    # a restart keeps the highest term: the deposed leader stays refused
    again = _agent(tmp_path, ME, free_port())
    await again.applier.start()
    again._restore_term()
    assert again.term == 6
    await again._on_message(
        BusMessage(topics.plan(ME), encode(_plan(10**6, 5, down=frozenset({0}))), retain=True)
    )
    assert again.stats.plans_refused["deposed_leader"] == 1


def test_leader_settings_pick_the_backend() -> None:
    assert isinstance(
        leadership_from_settings(ServiceSettings().leader, fabric="f", identity="x"), SoleLeader
    )
    s = ServiceSettings(leader={"etcd": {"endpoints": "127.0.0.1:2379", "ttl_s": 3}})
    lease = leadership_from_settings(s.leader, fabric="rail", identity="x")
    assert isinstance(lease, EtcdLease)
    assert (lease.key, lease.ttl_s, lease.endpoints) == (
        b"/linkguard/rail/leader",
        3,
        [("127.0.0.1", 2379)],
    )
    assert not lease.is_leader() and lease.describe()["role"] == "standby"
    for bad in ({"endpoints": []}, {"endpoints": ["x"]}, {"endpoints": ["h:1"], "ttl_s": 1}):
        with pytest.raises(ValueError):
            ServiceSettings(leader={"etcd": bad})
