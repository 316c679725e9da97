"""End-to-end harness: a namespace lab, real agent and service processes, a real Mosquitto,
an MQTT observer and UDP flows between GPU endpoints."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from linkguard import topics
from linkguard.bus import Bus, BusMessage
from linkguard.models import Ack, HCAInfo, HostInventory, LinkLayer, Plan, PortState, decode
from linkguard.simulations.lab import Lab
from linkguard.topology.fabric import Fabric, dump_fabric

TABLE = 4242
UDPFLOW = Path(__file__).with_name("udpflow.py")


def lab_fabric(lab: Lab, *, hca: Callable[[int], str] = lambda r: f"mlx5_{r}") -> Fabric:
    """The service's view of a lab: one HCA per rail (RoCE, netdev ``rail<r>``)."""
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


def _table_json(netns: str, table: int) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "route", "show", "table", str(table)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out or "[]")


def kernel_table(netns: str, table: int = TABLE) -> dict[str, tuple]:
    """destination -> (type, gateway, devs) of one table, as ``ip -j route`` shows it; devs is
    a sorted tuple (several for a multipath route)."""
    res = {}
    for r in _table_json(netns, table):
        devs = [r["dev"]] if "dev" in r else [n["dev"] for n in r.get("nexthops", [])]
        res[r["dst"]] = (r.get("type", "unicast"), r.get("gateway"), tuple(sorted(devs)))
    return res


def kernel_routes(netns: str, table: int = TABLE) -> dict[str, tuple[str | None, str | None]]:
    """destination -> (gateway, dev) of one table, as ``ip -j route`` shows it."""
    return {r["dst"]: (r.get("gateway"), r.get("dev")) for r in _table_json(netns, table)}


@dataclass
class Observer:
    """Collects what is on the bus, with the monotonic time each message arrived."""

    acks: dict[str, list[tuple[float, Ack]]] = field(default_factory=dict)
    plans: dict[str, list[tuple[float, Plan]]] = field(default_factory=dict)
    states: list[tuple[float, PortState]] = field(default_factory=list)

    async def handle(self, msg: BusMessage) -> None:
        p = topics.parse(msg.topic)
        now = time.monotonic()
        if p is None:
            return
        if p.kind == "ack":
            self.acks.setdefault(p.host, []).append((now, decode(Ack, msg.payload)))
        elif p.kind == "plan":
            self.plans.setdefault(p.host, []).append((now, decode(Plan, msg.payload)))
        elif p.kind == "port":
            self.states.append((now, decode(PortState, msg.payload)))

    def latest_plan(self, host: str) -> Plan | None:
        return self.plans[host][-1][1] if self.plans.get(host) else None

    def acked(self, host: str, epoch: int) -> float | None:
        """Arrival time of the first applied, non-fast-path ack of ``epoch`` or later."""
        for t, a in self.acks.get(host, []):
            if a.epoch >= epoch and a.result == "applied" and not a.fast_path:
                return t
        return None


async def until(cond: Callable[[], Any], timeout: float, what: str, procs: Procs | None = None):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            detail = procs.tails() if procs else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{detail}")
        if procs:
            procs.check_alive()
        await asyncio.sleep(0.01)


class Procs:
    """linkguard processes of one test, with their logs; all stopped by :meth:`stop`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen(
            [sys.executable, "-m", "linkguard.cli", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.procs[name] = p
        return p

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode}\n{self.tails()}")

    def tails(self, lines: int = 25) -> str:
        out = []
        for name in self.procs:
            text = (self.workdir / f"{name}.log").read_text(errors="replace").splitlines()
            out.append(f"--- {name} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def stop(self) -> dict[str, int]:
        """SIGTERM everything, wait, SIGKILL stragglers; returns the exit codes."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = {}
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait(5)
        return codes


def write_configs(
    workdir: Path,
    lab: Lab,
    fabric: Fabric,
    broker_port: int,
    *,
    driver: str,
    hold_down_s: float,
    roce: bool = True,
    sysfs_roots: dict[str, Path] | None = None,
) -> dict:
    """Service + one agent config per host; returns {"service": path, host: path...}."""
    (workdir / "fabric.yaml").write_text(dump_fabric(fabric, "yaml"))
    paths: dict[str, Path] = {}
    svc = {
        "fabric": str(workdir / "fabric.yaml"),
        "bus": {"port": broker_port},
        "debounce_ms": 20,
        "startup_settle_s": 0.5,
        "log_format": "json",
    }
    paths["service"] = workdir / "service.yaml"
    paths["service"].write_text(yaml.safe_dump(svc))
    for lh, inv in zip(lab.hosts, fabric.hosts, strict=True):
        cfg: dict[str, Any] = {
            "host": inv.host,
            "driver": driver,
            "netns": lh.netns,
            "bus": {"port": broker_port, "reconnect_min_s": 0.05},
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
            "route_table": TABLE,
            "state_dir": str(workdir / inv.host),
            "rail_map_path": str(workdir / inv.host / "rail-map.json"),
            "damping": {"hold_down_initial_s": hold_down_s, "hold_down_max_s": 60},
            "shutdown_policy": "withdraw",
            "poll_interval_ms": 20,
            "log_format": "json",
        }
        if sysfs_roots:
            cfg["sysfs_root"] = str(sysfs_roots[inv.host])
        for p in cfg["ports"]:
            if p["link_layer"] is None:
                del p["link_layer"]
        paths[inv.host] = workdir / f"agent-{inv.host}.yaml"
        paths[inv.host].write_text(yaml.safe_dump(cfg))
    return paths


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


@dataclass
class Flow:
    recv: subprocess.Popen
    send: subprocess.Popen
    out: Path

    def arrivals(self) -> list[tuple[int, float]]:
        rows = []
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                rows.append((int(parts[0]), float(parts[1])))
        return rows

    def received_after(self, t: float) -> int:
        return sum(1 for _, ts in self.arrivals() if ts > t)

    def outage(self, t_from: float, t_to: float) -> tuple[float, int]:
        """(longest silence in ms, datagrams lost) between ``t_from`` and ``t_to``."""
        rows = sorted((ts, seq) for seq, ts in self.arrivals() if t_from <= ts <= t_to)
        if len(rows) < 2:
            return float("inf"), -1
        gap = max(b[0] - a[0] for a, b in itertools.pairwise(rows)) * 1000
        seqs = {seq for _, seq in rows}
        lost = (max(seqs) - min(seqs) + 1) - len(seqs)
        return gap, lost


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
    src = lab.hosts[src_host].endpoints[src_gpu]
    dst = lab.hosts[dst_host].endpoints[dst_gpu]
    out = workdir / f"flow-{src}-{dst}.txt"
    out.touch()
    recv = lab.exec(dst_host, [sys.executable, str(UDPFLOW), "recv", str(dst), str(port), str(out)])
    send = lab.exec(
        src_host,
        [sys.executable, str(UDPFLOW), "send", str(src), str(dst), str(port), str(interval_ms)],
    )
    return Flow(recv=recv, send=send, out=out)


async def start_all(procs: Procs, obs: Observer, cfgs: dict, names: list[str]) -> int:
    """Start the service and one agent per host from ``cfgs`` (see :func:`write_configs`), wait
    until every host acked its first plan; the highest epoch among those plans."""
    procs.start("service", ["topology", "serve", "-c", str(cfgs["service"])])
    for n in names:
        procs.start(n, ["agent", "-c", str(cfgs[n])])
    await until(
        lambda: all(obs.latest_plan(n) and obs.acked(n, obs.latest_plan(n).epoch) for n in names),
        30,
        "initial plans acked",
        procs,
    )
    return max(obs.latest_plan(n).epoch for n in names)


async def outages_after_reroute(
    flows: list[Flow], t_down: float, t_last_ack: float, procs: Procs
) -> list[tuple[float, int]]:
    """Wait until every flow delivered again after the last ack; per flow (longest silence in
    ms, datagrams lost) from half a second before the fault until now."""
    await until(
        lambda: all(f.received_after(t_last_ack) > 5 for f in flows),
        10,
        "UDP flows to resume after the reroute",
        procs,
    )
    now = time.monotonic()
    return [f.outage(t_down - 0.5, now) for f in flows]


def observer_bus(port: int, observer: Observer) -> Bus:
    return Bus(
        host="127.0.0.1",
        port=port,
        client_id=f"observer-{os.getpid()}",
        subscriptions=[topics.all_host_topics(), topics.all_plans()],
        handler=observer.handle,
    )
