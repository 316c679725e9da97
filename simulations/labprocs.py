"""The live parts of a namespace lab run: configs, linkguard processes, a bus observer, UDP flows.

Consumes: a built :class:`~linkguard.simulations.lab.Lab`, its :class:`Fabric` and the port of
a private Mosquitto. Produces: agent and service config files (:func:`write_configs`), the
``linkguard agent`` / ``linkguard topology serve`` subprocesses with their logs (:class:`Procs`),
what the bus carries with the monotonic time it arrived (:class:`Observer`), and UDP flows
between GPU endpoints whose receivers log every datagram (:func:`start_flows`, :class:`Flow`).
Shared by ``linkguard sim lab`` (:mod:`linkguard.simulations.labrun`), the lab benchmark and the
end-to-end tests.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Literal

import yaml

from linkguard import topics
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus, BusMessage
from linkguard.config import AgentSettings, ConfigError, load_settings
from linkguard.models import (
    Ack,
    HCAInfo,
    HostInventory,
    LinkLayer,
    PeerRoutes,
    Plan,
    PortState,
    decode,
    expand_plan,
)
from linkguard.models.discovery import HostDiscovery
from linkguard.simulations.lab import Lab
from linkguard.topology.fabric import Fabric, dump_fabric

__all__ = [
    "TABLE",
    "UDPFLOW",
    "Flow",
    "FlowSpec",
    "LabProcessError",
    "Observer",
    "Procs",
    "agent_overrides",
    "lab_fabric",
    "observer_bus",
    "outages_after_reroute",
    "roce_fabric",
    "start_all",
    "start_flow",
    "start_flows",
    "until",
    "write_configs",
]

#: linkguard's routing table in lab hosts.
TABLE = 4242
#: The flow and probe script (:mod:`linkguard.simulations.udpflow`), started by path.
UDPFLOW = Path(__file__).with_name("udpflow.py")


#: Agent settings the lab writes itself (its namespaces, ports, table, bus, state): an
#: override from ``agent_settings`` / ``--agent-set`` is refused.
LAB_AGENT_KEYS = frozenset(
    {"host", "driver", "netns", "ports", "endpoints", "bus", "route_table", "routes.table",
     "state_dir", "rail_map_path", "damping", "shutdown_policy", "sysfs_root", "metrics_listen"}
)  # fmt: skip


def agent_overrides(settings: Mapping[str, object]) -> dict[str, Any]:
    """``{"routes.rto_min_ms": 20, "log_level": "debug"}`` as the nested mapping an agent
    config holds (``{"routes": {"rto_min_ms": 20}, ...}``), checked by the agent's own
    settings model (:func:`~linkguard.config.load_settings`), so a key this linkguard does not
    know is refused here, before a lab is built. Raises ValueError naming the key: one the lab
    sets itself (:data:`LAB_AGENT_KEYS`), two keys that collide, a bad value."""
    nested: dict[str, Any] = {}
    for key, value in settings.items():
        parts = key.split(".")
        lab_key = next((k for k in (".".join(parts[:2]), parts[0]) if k in LAB_AGENT_KEYS), None)
        if lab_key is not None:
            raise ValueError(
                f"agent setting {key}: the lab sets {lab_key} itself (its namespaces, ports, "
                "table and bus; damping comes from the scenario's damping:)"
            )
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"agent setting {key}: {part} is given a value and a section")
        if parts[-1] in node:
            raise ValueError(f"agent setting {key} is given twice")
        node[parts[-1]] = value
    if nested:
        try:
            load_settings(AgentSettings, None, **nested)
        except ConfigError as exc:
            given = ", ".join(f"{k}={v!r}" for k, v in settings.items())
            detail = str(exc).split("): ", 1)[-1]
            raise ValueError(f"agent settings {given}: this agent refuses them: {detail}") from None
    return nested


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


class LabProcessError(RuntimeError):
    """A lab process exited when it should run, or a wait timed out; the message has the tails
    of the processes' logs."""


def lab_fabric(lab: Lab, *, hca: Callable[[int], str] = lambda r: f"mlx5_{r}") -> Fabric:
    """The service's view of a :meth:`Lab.create` lab: one HCA per rail (RoCE, netdev
    ``rail<r>``)."""
    hosts = []
    for h in lab.hosts:
        hosts.append(
            HostInventory(
                host=h.name,
                hcas=[
                    HCAInfo(
                        hca=hca(r.rail),
                        port=1,
                        rail=r.rail,
                        link_layer=LinkLayer.ETHERNET,
                        netdev=r.netdev,
                        address=r.address,
                        numa_node=0,
                    )
                    for r in h.rails
                ],
                endpoints=h.endpoints,
            )
        )
    return Fabric(name=f"lab-{lab.prefix}", hosts=hosts, endpoint_subnets=lab.endpoint_subnets)


def roce_fabric(fabric: Fabric) -> Fabric:
    """``fabric`` with every HCA's link layer Ethernet (RoCE): the lab's ports are veths whose
    health the agents read from netlink. Everything else (names, switches, links, subnets)
    is kept."""
    data = fabric.model_dump()
    for host in data["hosts"]:
        for hca in host["hcas"]:
            hca["link_layer"] = LinkLayer.ETHERNET
    return Fabric.model_validate(data)


async def until(
    cond: Callable[[], Any], timeout: float, what: str, procs: Procs | None = None
) -> Any:
    """Wait (polling every 10 ms) until ``cond()`` is truthy and return it. Raises
    :class:`LabProcessError` after ``timeout`` seconds (with what the test saw on the bus,
    ``procs.seen``, and the processes' last lines), or at once when one of ``procs`` died."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            detail = procs.tails() if procs else ""
            if procs and procs.seen is not None:
                detail = f"--- seen on the bus\n{procs.seen()}\n{detail}"
            raise LabProcessError(f"timed out after {timeout} s waiting for {what}\n{detail}")
        if procs:
            procs.check_alive()
        await asyncio.sleep(0.01)


class Procs:
    """linkguard processes of one lab run (``python -m linkguard.cli ...``), each logging to
    ``workdir/<name>.log`` (appended across restarts); all stopped by :meth:`stop`. Each runs
    in its own session, so a Ctrl-C at the terminal reaches the runner only, which stops
    them in order."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()  # stopped on purpose (a fault), not expected to run
        #: what the test saw on the bus, printed with the process tails when a wait times out
        self.seen: Callable[[], str] | None = None

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start (or restart) process ``name`` running ``linkguard <argv>``."""
        log = open(self.workdir / f"{name}.log", "a")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # -P: the working directory is not put first on sys.path: run from a clone's root
        # after a plain `pip install .`, `-m` would import the clone's source tree, which has
        # no linkguard.drivers (top-level drivers/, mapped into the package at install)
        p = subprocess.Popen(
            [sys.executable, "-P", "-m", "linkguard.cli", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()  # the child has its own copy
        self.procs[name] = p
        self.killed.discard(name)
        return p

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` (a crash: no clean shutdown, its routes stay) and wait for it."""
        p = self.procs[name]
        self.killed.add(name)
        if p.poll() is None:
            p.kill()
        p.wait(10)

    def check_alive(self) -> None:
        """Raises :class:`LabProcessError` when a process exited that was not killed."""
        for name, p in self.procs.items():
            if name not in self.killed and p.poll() is not None:
                raise LabProcessError(f"{name} exited with {p.returncode}\n{self.tails()}")

    def tails(self, lines: int = 25) -> str:
        out = []
        for name in self.procs:
            path = self.workdir / f"{name}.log"
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"--- {name} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def stop(self) -> dict[str, int]:
        """SIGTERM everything still running, wait, SIGKILL stragglers; returns the exit codes
        of the processes not killed on purpose."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                code = p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait(5)
            if name not in self.killed:
                codes[name] = code
        return codes


@dataclass
class Observer:
    """Collects what is on the bus, with the monotonic time each message arrived. ``plans``:
    each host's full plans over time, a compact plan expanded with the peer routes seen so
    far (:func:`~linkguard.models.expand_plan`; again whenever a peer's message changes)."""

    acks: dict[str, list[tuple[float, Ack]]] = field(default_factory=dict)
    plans: dict[str, list[tuple[float, Plan]]] = field(default_factory=dict)
    received: dict[str, Plan] = field(default_factory=dict)  # as published, compact or full
    peers: dict[str, PeerRoutes] = field(default_factory=dict)
    states: list[tuple[float, PortState]] = field(default_factory=list)
    #: (host, rail) -> (arrival, latest state) of that port
    ports: dict[tuple[str, int], tuple[float, PortState]] = field(default_factory=dict)
    #: arrival time of the latest plan (0.0: none yet)
    last_plan_at: float = 0.0
    #: messages received by topic kind (ack, plan, port, ...)
    kinds: Counter[str] = field(default_factory=Counter)
    #: each host's latest discovery document (``fabric discover``)
    discovery: dict[str, HostDiscovery] = field(default_factory=dict)

    async def handle(self, msg: BusMessage) -> None:
        p = topics.parse(msg.topic)
        now = time.monotonic()
        if p is None or not msg.payload:
            return
        self.kinds[p.kind] += 1
        if p.kind == "ack":
            self.acks.setdefault(p.host, []).append((now, decode(Ack, msg.payload)))
        elif p.kind == "plan":
            plan = self.received[p.host] = decode(Plan, msg.payload)
            self.plans.setdefault(p.host, []).append((now, expand_plan(plan, self.peers)))
            self.last_plan_at = now
        elif p.kind == "peers":
            self.peers[p.host] = decode(PeerRoutes, msg.payload)
            for host, plan in self.received.items():
                if plan.shared is not None:
                    self.plans[host].append((now, expand_plan(plan, self.peers)))
            self.last_plan_at = now
        elif p.kind == "discovery":
            self.discovery[p.host] = decode(HostDiscovery, msg.payload)
        elif p.kind == "port":
            st = decode(PortState, msg.payload)
            self.states.append((now, st))
            if st.rail is not None:
                self.ports[(st.host, st.rail)] = (now, st)

    def latest_plan(self, host: str) -> Plan | None:
        return self.plans[host][-1][1] if self.plans.get(host) else None

    def summary(self, hosts: list[str]) -> str:
        """One line per host: the epochs of the plans and acks seen (for a timed-out wait)."""
        lines = []
        for h in hosts:
            plans = [p.epoch for _, p in self.plans.get(h, [])]
            acks = [(a.epoch, a.result, a.fast_path) for _, a in self.acks.get(h, [])]
            lines.append(f"{h}: plans {plans} acks (epoch, result, fast path) {acks}")
        lines.append(f"messages by kind: {dict(self.kinds)}")
        return "\n".join(lines)

    def max_epoch(self) -> int:
        """The highest plan epoch seen so far (0: none)."""
        return max((p.epoch for seen in self.plans.values() for _, p in seen), default=0)

    def acked(self, host: str, epoch: int) -> float | None:
        """Arrival time of the first applied, non-fast-path ack of ``epoch`` or later."""
        for t, a in self.acks.get(host, []):
            if a.epoch >= epoch and a.result == "applied" and not a.fast_path:
                return t
        return None


def observer_bus(port: int, observer: Observer) -> Bus:
    """A bus session on 127.0.0.1:``port`` that feeds ``observer`` every host message and
    plan (reconnects by itself after a broker outage). It subscribes at the QoS the lab's
    processes do: ``LINKGUARD_BUS__SUBSCRIBE_QOS`` when set (they inherit the environment),
    else 1."""
    qos = int(os.environ.get("LINKGUARD_BUS__SUBSCRIBE_QOS", "1"))  # Bus refuses all but 0, 1
    return Bus(
        host="127.0.0.1",
        port=port,
        client_id=f"observer-{os.getpid()}",
        subscriptions=[topics.all_host_topics(), topics.all_plans(), topics.all_peer_routes()],
        subscribe_qos=qos,
        handler=observer.handle,
        reconnect_min_s=0.05,
        reconnect_max_s=0.5,
    )


def write_configs(
    workdir: Path,
    lab: Lab,
    fabric: Fabric,
    broker_port: int,
    *,
    driver: str = "netlink",
    hold_down_s: float | None = None,
    damping: DampingPolicy | None = None,
    debounce_ms: float | None = 20.0,
    poll_interval_ms: float = 20.0,
    roce: bool = True,
    sysfs_roots: dict[str, Path] | None = None,
    service_extra: dict[str, Any] | None = None,
    agent_extra: Mapping[str, Any] | None = None,
    per_host_extra: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Path]:
    """Write ``workdir/fabric.yaml``, the service config and one agent config per host (lab
    host i is fabric host i); returns ``{"service": path, host: path, ...}``.

    Agents: ``driver`` (netlink: the rail netdevs' carrier), routes in table :data:`TABLE`,
    ``damping`` (default: the policy's defaults with ``hold_down_initial_s=hold_down_s`` when
    given), withdraw on shutdown. Service: ``debounce_ms`` (None: the service's default) and
    any other settings in ``service_extra`` (merged; e.g. ``{"solve": {"initial_ms": 0}}``).
    Every agent also gets ``agent_extra`` (nested, as :func:`agent_overrides` returns it, e.g.
    ``{"routes": {"rto_min_ms": 20}}``), merged over what the lab writes, then its own
    ``per_host_extra[host]``."""
    (workdir / "fabric.yaml").write_text(dump_fabric(fabric, "yaml"))
    paths: dict[str, Path] = {}
    svc: dict[str, Any] = {
        "fabric": str(workdir / "fabric.yaml"),
        "bus": {"port": broker_port, "reconnect_min_s": 0.05, "reconnect_max_s": 0.5},
        "startup_settle_s": 0.5,
        "log_format": "json",
        "api": {"enabled": False},  # no HTTP API: 127.0.0.1:8470 may be taken on this machine
    }
    if debounce_ms is not None:
        svc["solve"] = {"short_ms": debounce_ms}
    _merge(svc, copy.deepcopy(dict(service_extra or {})))
    paths["service"] = workdir / "service.yaml"
    paths["service"].write_text(yaml.safe_dump(svc))
    if damping is not None:
        policy = damping.model_dump(mode="json")
    else:
        policy = {"hold_down_initial_s": hold_down_s, "hold_down_max_s": 60} if hold_down_s else {}
    for lh, inv in zip(lab.hosts, fabric.hosts, strict=True):
        cfg: dict[str, Any] = {
            "host": inv.host,
            "driver": driver,
            "netns": lh.netns,
            "bus": {"port": broker_port, "reconnect_min_s": 0.05, "reconnect_max_s": 0.5},
            "ports": [
                {
                    "hca": h.hca,
                    "port": h.port,
                    "rail": h.rail,
                    "netdev": h.netdev,
                    "link_layer": "Ethernet" if roce else None,
                    "address": str(h.address),
                }
                for h in inv.hcas
            ],
            "endpoints": [str(e) for e in inv.endpoints],
            "routes": {"table": TABLE},
            "state_dir": str(workdir / inv.host),
            "rail_map_path": str(workdir / inv.host / "rail-map.json"),
            "damping": policy,
            "shutdown_policy": "withdraw",
            "poll_interval_ms": poll_interval_ms,
            "log_format": "json",
            "metrics_listen": None,  # one loopback for every lab agent: no exporter ports
        }
        if sysfs_roots:
            cfg["sysfs_root"] = str(sysfs_roots[inv.host])
        for p in cfg["ports"]:
            if p["link_layer"] is None:
                del p["link_layer"]
        _merge(cfg, copy.deepcopy(dict(agent_extra or {})))
        _merge(cfg, copy.deepcopy(dict((per_host_extra or {}).get(inv.host, {}))))
        paths[inv.host] = workdir / f"agent-{inv.host}.yaml"
        paths[inv.host].write_text(yaml.safe_dump(cfg))
    return paths


async def start_all(
    procs: Procs,
    obs: Observer,
    cfgs: dict[str, Path],
    names: list[str],
    *,
    agents_first: bool = False,
) -> int:
    """Start the service and one agent per host from ``cfgs`` (see :func:`write_configs`), wait
    (up to 30 s) until every host acked its first plan; the highest epoch among those plans.
    ``agents_first`` (a service on a discovered fabric): the agents, then, once every host's
    discovery document is on the bus, the service."""
    procs.seen = lambda: obs.summary(names)
    if not agents_first:
        procs.start("service", ["topology", "serve", "-c", str(cfgs["service"])])
    for n in names:
        procs.start(n, ["agent", "-c", str(cfgs[n])])
    if agents_first:
        await until(lambda: set(names) <= set(obs.discovery), 30, "every discovery document", procs)
        procs.start("service", ["topology", "serve", "-c", str(cfgs["service"])])

    def all_acked() -> bool:
        for n in names:
            plan = obs.latest_plan(n)
            if not (plan and obs.acked(n, plan.epoch)):
                return False
        return True

    await until(all_acked, 30, "initial plans acked", procs)
    epochs = []
    for n in names:
        plan = obs.latest_plan(n)
        assert plan is not None  # every host acked a plan (waited for above)
        epochs.append(plan.epoch)
    return max(epochs)


# --------------------------------------------------------------------------------------------
# Flows


@dataclass(frozen=True)
class FlowSpec:
    """A flow from endpoint ``src`` on lab host ``src_host`` to ``dst`` on ``dst_host`` (lab
    host names), to ``port``: UDP datagrams, or with ``proto="tcp"`` fixed-size records on one
    TCP connection (:mod:`~linkguard.simulations.udpflow`)."""

    src_host: str
    src: IPv4Address
    dst_host: str
    dst: IPv4Address
    port: int
    proto: Literal["udp", "tcp"] = "udp"

    @property
    def label(self) -> str:
        tcp = " (tcp)" if self.proto == "tcp" else ""
        return f"{self.src_host} {self.src} -> {self.dst_host} {self.dst}{tcp}"


@dataclass
class Flow:
    """A running flow: its receiver logs one line ``seq monotonic_s`` per datagram to ``out``.
    ``recv`` and ``send`` are the processes (shared by the flows of one host)."""

    spec: FlowSpec | None
    recv: subprocess.Popen[Any]
    send: subprocess.Popen[Any]
    out: Path
    _rows: list[tuple[int, float]] = field(default_factory=list, repr=False)
    _offset: int = field(default=0, repr=False)

    def arrivals(self) -> list[tuple[int, float]]:
        """(seq, arrival monotonic s) of every datagram received so far (read incrementally)."""
        with self.out.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line being written stays for the next read
        self._offset += end
        for line in chunk[:end].splitlines():
            parts = line.split()
            if len(parts) == 2:
                self._rows.append((int(parts[0]), float(parts[1])))
        return self._rows

    def received_after(self, t: float) -> int:
        return sum(1 for _, ts in self.arrivals() if ts > t)

    def outage(self, t_from: float, t_to: float) -> tuple[float, int]:
        """(longest silence in ms, datagrams lost) between ``t_from`` and ``t_to``;
        (inf, -1) with fewer than two arrivals there."""
        rows = sorted((ts, seq) for seq, ts in self.arrivals() if t_from <= ts <= t_to)
        if len(rows) < 2:
            return float("inf"), -1
        gap = max(b[0] - a[0] for a, b in itertools.pairwise(rows)) * 1000
        seqs = {seq for _, seq in rows}
        lost = (max(seqs) - min(seqs) + 1) - len(seqs)
        return gap, lost


def start_flows(
    lab: Lab, workdir: Path, specs: Sequence[FlowSpec], *, interval_ms: float = 2.0
) -> list[Flow]:
    """Start ``specs``: one receiver process per destination host and protocol and one sender
    per source host and protocol (every ``interval_ms`` one datagram or record per flow),
    inside the hosts' namespaces (a TCP sender connects once its receiver listens). The lab
    kills them on destroy. Returns one :class:`Flow` per spec, in order."""
    outs = {s: workdir / f"flow-{s.proto}-{s.src}-{s.dst}-{s.port}.txt" for s in specs}
    for out in outs.values():
        out.write_bytes(b"")  # empty now: a record left by an earlier run must not be read
    py = [sys.executable, str(UDPFLOW)]
    mode = {"udp": ("recv", "send"), "tcp": ("tcprecv", "tcpsend")}
    recvs: dict[tuple[str, str], subprocess.Popen[Any]] = {}
    for key, group in itertools.groupby(
        sorted(specs, key=lambda s: (s.dst_host, s.proto)), lambda s: (s.dst_host, s.proto)
    ):
        args = [a for s in group for a in (str(s.dst), str(s.port), str(outs[s]))]
        recvs[key] = lab.exec(key[0], [*py, mode[key[1]][0], *args])
    sends: dict[tuple[str, str], subprocess.Popen[Any]] = {}
    for key, group in itertools.groupby(
        sorted(specs, key=lambda s: (s.src_host, s.proto)), lambda s: (s.src_host, s.proto)
    ):
        args = [a for s in group for a in (str(s.src), str(s.dst), str(s.port))]
        sends[key] = lab.exec(key[0], [*py, mode[key[1]][1], str(interval_ms), *args])
    return [
        Flow(s, recvs[(s.dst_host, s.proto)], sends[(s.src_host, s.proto)], outs[s]) for s in specs
    ]


def start_flow(
    lab: Lab,
    workdir: Path,
    src_host: int,
    src_gpu: int,
    dst_host: int,
    dst_gpu: int,
    port: int,
    interval_ms: float = 2.0,
) -> Flow:
    """One flow from GPU ``src_gpu`` of lab host index ``src_host`` to ``dst_gpu`` of
    ``dst_host`` (see :func:`start_flows`)."""
    s, d = lab.hosts[src_host], lab.hosts[dst_host]
    spec = FlowSpec(s.name, s.endpoints[src_gpu], d.name, d.endpoints[dst_gpu], port)
    return start_flows(lab, workdir, [spec], interval_ms=interval_ms)[0]


async def outages_after_reroute(
    flows: list[Flow], t_down: float, t_last_ack: float, procs: Procs
) -> list[tuple[float, int]]:
    """Wait (up to 10 s) until every flow delivered again after the last ack; per flow
    (longest silence in ms, datagrams lost) from half a second before the fault until now."""
    await until(
        lambda: all(f.received_after(t_last_ack) > 5 for f in flows),
        10,
        "UDP flows to resume after the reroute",
        procs,
    )
    now = time.monotonic()
    return [f.outage(t_down - 0.5, now) for f in flows]
