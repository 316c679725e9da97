"""Replay a scenario on a network-namespace lab: real kernel, real agents, service and Mosquitto.

Consumes: a :class:`~linkguard.simulations.scenario.LoadedScenario` whose fabric is generated
and small (at most :data:`MAX_LAB_HOSTS` hosts, :data:`MAX_LAB_RAILS` rails). Produces: a
:class:`LabReport`: per fault (each down transition) the gap in every affected UDP flow (ms),
datagrams lost and the time from the fault to the last ack of the plans it caused; the
reachability oracle's mismatches; which of the scenario's ``expect`` held. Needs root.

What runs (:func:`run_lab`):

- the lab of the scenario's fabric (:meth:`~linkguard.simulations.lab.Lab.from_fabric`: the
  same host names, addresses and endpoints, a leaf bridge per leaf, a spine bridge per rail
  when there are several SUs), a private Mosquitto, ``linkguard topology serve`` and one
  ``linkguard agent`` per host (netlink driver, the scenario's damping and debounce);
- UDP flows between GPU endpoints, one datagram every 2 ms: for every (host, rail) a fault
  touches, one flow to its endpoint on that rail and one from it (the peer's endpoint on the
  same rail, in another SU when there is one), and one control flow that no fault touches;
- the scenario's expanded events in real time: ``port_down``/``port_up`` set the fabric end
  of the host's veth down/up (the host sees carrier loss); switch and cable events publish
  the whole :class:`~linkguard.models.FabricFaults` set (retained, ``fabric/faults``) and make
  the data-plane effect: a leaf that is down or cut off from its rail's spines
  (:mod:`linkguard.topology.health`) loses its uplink to the spine bridge; ``broker_*`` stops
  and starts Mosquitto (same port), ``service_*`` and ``agent_*`` SIGKILL and restart the
  process. The first event comes once the bus was quiet for the service's
  ``solve.holddown_ms`` (its RFC 8405 back-off is back in QUIET, as in a fabric that was
  stable), so a first failure is solved after ``solve.initial_ms``, not the long delay.

After every step (the events of one instant), once it *settles* (the broker, the service and
every agent up, every port change seen on the bus, every host's latest plan acked and no plan
for :data:`QUIET_S`), the oracle probes reachability in the kernel: UDP echo probes from
endpoint to endpoint (every ordered pair of hosts from
:func:`~linkguard.simulations.oracle.pairs_to_check`, GPU g to GPU g, plus the flows' pairs),
compared with the model (reachable iff some rail is physically usable at both hosts: links up,
leaf up and not cut off). It also runs the plan oracle
(:func:`~linkguard.simulations.oracle.check`) on the plans the hosts acked, with the ports
their agents hold down counted as unusable.

``linkguard=False`` (``--no-linkguard``) is the baseline: no agents or service; static routes
as a fabric without linkguard has them (each endpoint subnet via its home rail only), so a
flow through a failed link stays broken until the link returns; the oracle's mismatches are
then the expected breakage, not a failure.

A scenario with a ``job:`` also gets a management network and runs a training job across the
hosts (:mod:`linkguard.simulations.labjob`), started once the flows run and warm before the
first fault, stopped after the last step settled; each fault then reports the job's stall,
steps and rank failures, and with linkguard a rank failure (beyond ``job_rank_failures``, 0)
or a stall above ``job_max_stall_ms`` fails the run. :func:`run_lab_halves` runs such a
scenario with and without linkguard, one after the other, for one report
(:class:`~linkguard.simulations.labreport.LabPair`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from linkguard import topics
from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess
from linkguard.bus import Bus
from linkguard.config import ServiceSettings
from linkguard.models import CableRef, FabricFaults, PortStateName, PortStatus, encode
from linkguard.simulations.engine import ExpectResult
from linkguard.simulations.jobspec import job_hosts
from linkguard.simulations.lab import Lab
from linkguard.simulations.labjob import LabJob, job_expectations, torch_problem
from linkguard.simulations.labprocs import (
    UDPFLOW,
    Flow,
    FlowSpec,
    LabProcessError,
    Observer,
    Procs,
    agent_overrides,
    observer_bus,
    roce_fabric,
    start_all,
    start_flows,
    until,
    write_configs,
)
from linkguard.simulations.labreport import (
    FaultResult,
    FlowGap,
    LabPair,
    LabReport,
    stderr_progress,
)
from linkguard.simulations.oracle import check, pairs_to_check
from linkguard.simulations.scenario import Event, LoadedScenario, expand
from linkguard.topology.fabric import Fabric
from linkguard.topology.state import FabricState

__all__ = [
    "MAX_LAB_HOSTS",
    "MAX_LAB_RAILS",
    "FaultResult",
    "FlowGap",
    "LabPair",
    "LabReport",
    "LabRunError",
    "check_lab_scenario",
    "choose_flows",
    "run_lab",
    "run_lab_halves",
    "stderr_progress",
]

#: Largest fabric the lab builds (hosts, rails): each host is a namespace, each port a veth
#: pair, each agent a Python process (~60 MB); 32 agents fit a small machine.
MAX_LAB_HOSTS = 32
MAX_LAB_RAILS = 16
#: UDP ports: flows from FLOW_PORT_BASE on, the probe echo on PROBE_PORT.
FLOW_PORT_BASE = 46000
PROBE_PORT = 47999
#: At most this many (host, rail) targets get flows (two each).
MAX_TARGETS = 16
#: One datagram per flow this often (ms): the resolution of a measured gap.
FLOW_INTERVAL_MS = 2.0
#: A step has settled when no plan arrived for this long (and at least this long after it).
QUIET_S = 0.4
#: Give up waiting for a settle after this long (s).
SETTLE_TIMEOUT_S = 10.0
#: A probe not answered within this long (ms, sent again every 50 ms) counts as unreachable.
PROBE_TIMEOUT_MS = 300.0
#: A check is skipped when the next step is due sooner than this (s).
PROBE_BUDGET_S = 0.5
#: Mismatches kept verbatim in a report (all are counted).
MAX_MISMATCHES = 20

_CONTROL = {"broker", "service", "agent"}


class LabRunError(RuntimeError):
    """The scenario cannot run on the lab here (not root, no mosquitto, a fabric file, a
    fabric too large); the message says why."""


def check_lab_scenario(
    loaded: LoadedScenario,
    *,
    environment: bool = True,
    agent_settings: dict[str, object] | None = None,
) -> None:
    """Raise :class:`LabRunError` when ``loaded`` cannot run on a lab: a fabric file, a fabric
    too large or without rail-major endpoints, agent settings (the scenario's, then
    ``agent_settings``) the agent refuses; with ``environment``, also when this machine
    lacks what the lab needs (root, iproute2, Mosquitto, and torch for a job)."""
    sc, fabric = loaded.scenario, loaded.fabric
    try:
        agent_overrides({**sc.agent_settings, **(agent_settings or {})})
    except ValueError as exc:
        raise LabRunError(f"{loaded.path}: {exc}") from None
    if sc.fabric.generate is None:
        raise LabRunError(
            f"{loaded.path}: the lab builds generated fabrics only (fabric: generate: {{...}}); "
            f"this scenario uses the fabric file {sc.fabric.file!r}: use `sim run` for it"
        )
    if len(fabric.hosts) > MAX_LAB_HOSTS or len(fabric.rails) > MAX_LAB_RAILS:
        raise LabRunError(
            f"{loaded.path}: {len(fabric.hosts)} hosts x {len(fabric.rails)} rails is too large "
            f"for a lab (at most {MAX_LAB_HOSTS} hosts and {MAX_LAB_RAILS} rails: every host is "
            "a namespace with its own agent process); use `sim run` for it"
        )
    if not fabric.endpoint_subnets:
        raise LabRunError(f"{loaded.path}: the lab needs rail-major endpoints (endpoint_subnets)")
    if not environment:
        return
    if os.geteuid() != 0:
        raise LabRunError(
            "sim lab needs root: it builds network namespaces and veth pairs (run it as root, "
            "e.g. with sudo)"
        )
    if shutil.which("ip") is None:
        raise LabRunError("sim lab needs iproute2 (`ip`)")
    if not (shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")):
        raise LabRunError("sim lab needs Mosquitto (Debian package `mosquitto`)")
    if sc.job is not None and (problem := torch_problem()):
        raise LabRunError(f"{loaded.path}: {problem}")


# --------------------------------------------------------------------------------------------
# Steps and flows


@dataclass
class _Step:
    """The events of one instant."""

    at_s: float
    events: list[Event]

    @property
    def is_down(self) -> bool:
        return any(e.kind.endswith("_down") for e in self.events)

    @property
    def resources(self) -> set[str]:
        return {e.kind.rsplit("_", 1)[0] for e in self.events}

    def what(self, loaded: LoadedScenario) -> str:
        """E.g. ``link_down gpu001 rail 1``, ``leaf_reboot su0-leaf2 down``, ``uplink_loss
        down: su1-leaf3/su0-spine0, su1-leaf3/su0-spine1``."""
        groups: dict[str, list[str]] = {}
        for i in sorted({e.entry for e in self.events}):
            f = loaded.scenario.timeline[i]
            mine = [e for e in self.events if e.entry == i]
            first = mine[0]
            down = any(e.kind.endswith("_down") for e in mine)
            if first.switch is not None:
                key, item = f"{f.kind} {'down' if down else 'up'}", first.switch
            elif first.cable is not None:
                c = first.cable
                key = f"{f.kind} {'down' if down else 'up'}"
                item = f"{c.a}/{c.b}" + ("" if c.count is None else f" ({c.count})")
            elif first.rail is not None:
                key, item = f.kind, f"{first.host} rail {first.rail}"
                if f.kind in ("flap", "port_cycle"):
                    item += f" {first.state}/{first.phys_state}"
            elif first.host is not None:
                key, item = f"{f.kind} {'down' if down else 'up'}", str(first.host)
            else:
                key, item = f"{f.kind} {'down' if down else 'up'}", ""
            groups.setdefault(key, []).append(item)
        parts = []
        for key, items in groups.items():
            items = [i for i in items if i]
            if len(items) > 1:
                parts.append(f"{key}: {', '.join(items)}")
            else:
                parts.append(" ".join([key.split(" ")[0], *items, *key.split(" ")[1:]]))
        return "; ".join(parts)


def _steps(events: list[Event]) -> list[_Step]:
    out: list[_Step] = []
    for e in events:
        if out and out[-1].at_s == e.at_s:
            out[-1].events.append(e)
        else:
            out.append(_Step(e.at_s, [e]))
    return out


def _spec(fl: Flow) -> FlowSpec:
    """What ``fl`` carries (every flow a run starts has its spec)."""
    assert fl.spec is not None
    return fl.spec


def _home_rail(fabric: Fabric, ep: IPv4Address) -> int | None:
    for r, net in fabric.endpoint_subnets.items():
        if ep in net:
            return r
    return None


def _endpoint_on(fabric: Fabric, host: str, rail: int) -> IPv4Address | None:
    for ep in fabric.host(host).endpoints:
        if _home_rail(fabric, ep) == rail:
            return ep
    return None


def _su_of(fabric: Fabric) -> dict[str, int]:
    sus = {s.name: s.su for s in fabric.switches}
    out: dict[str, int] = {}
    for link in fabric.links:
        if link.kind == "host-leaf":
            port, leaf = (link.a, link.b) if ":" in link.a else (link.b, link.a)
            su = sus.get(leaf)
            if su is not None:
                out.setdefault(port.split(":", 1)[0], su)
    return out


def choose_flows(fabric: Fabric, targets: Iterable[tuple[str, int]]) -> list[tuple[FlowSpec, str]]:
    """Flows for the (host, rail) ``targets`` a scenario faults: per target, one flow to its
    endpoint on that rail and one from it, with a peer whose port on that rail is not a
    target (in another SU when there is one), plus one control flow between two hosts on a
    rail no target touches. Returns (spec, role) with role "to", "from" or "control"."""
    names = fabric.host_names
    su = _su_of(fabric)
    tset = sorted(set(targets), key=lambda t: (names.index(t[0]), t[1]))[:MAX_TARGETS]
    hit = set(tset)
    touched = {h for h, _ in tset}
    out: list[tuple[FlowSpec, str]] = []
    port = FLOW_PORT_BASE
    uses: dict[str, int] = {}
    for host, rail in tset:
        i = names.index(host)
        order = names[i + 1 :] + names[:i]
        cands = [p for p in order if (p, rail) not in hit] or order
        cands.sort(key=lambda p: (su.get(p) == su.get(host), p in touched, uses.get(p, 0)))
        if not cands:
            continue
        peer = cands[0]
        uses[peer] = uses.get(peer, 0) + 1
        mine, theirs = _endpoint_on(fabric, host, rail), _endpoint_on(fabric, peer, rail)
        if mine is None or theirs is None:
            continue
        out.append((FlowSpec(peer, theirs, host, mine, port), "to"))
        out.append((FlowSpec(host, mine, peer, theirs, port + 1), "from"))
        port += 2
    for rail in sorted(fabric.rails):
        free = [h for h in names if (h, rail) not in hit and h not in touched] or [
            h for h in names if (h, rail) not in hit
        ]
        if len(free) >= 2:
            a, b = free[0], free[-1]
            ea, eb = _endpoint_on(fabric, a, rail), _endpoint_on(fabric, b, rail)
            if ea is not None and eb is not None:
                out.append((FlowSpec(a, ea, b, eb, port), "control"))
                break
    return out


def _gap(flow: Flow, t_from: float, t_to: float, t_end: float) -> tuple[float, int, bool]:
    """(longest silence in ms that ends after ``t_from`` and starts before ``t_to``, datagrams
    lost around it, resumed); an unresumed flow's silence runs until ``t_end``."""
    rows = sorted((ts, seq) for seq, ts in flow.arrivals())
    best: tuple[float, int, int] | None = None  # (gap s, index of a, index of b)
    prev: tuple[float, int] | None = None
    for k, (ts, _) in enumerate(rows):
        if prev is not None and ts >= t_from and rows[prev[1]][0] <= t_to:
            g = ts - rows[prev[1]][0]
            if best is None or g > best[0]:
                best = (g, prev[1], k)
        prev = (ts, k)
    last_before = max((k for k, (ts, _) in enumerate(rows) if ts <= t_to), default=None)
    if last_before is not None and last_before == len(rows) - 1:
        g = t_end - rows[last_before][0]  # silent from there to the end
        if best is None or g > best[0]:
            return g * 1000, -1, False
    if best is None:
        return float("nan"), -1, True
    g, a, b = best
    lost = rows[b][1] - rows[a][1] - 1
    return g * 1000, max(lost, 0), True


# --------------------------------------------------------------------------------------------
# Probes


class _Prober:
    """The ``probe`` process of one host (:mod:`linkguard.simulations.udpflow`)."""

    def __init__(self, host: str, proc: asyncio.subprocess.Process) -> None:
        self.host = host
        self.proc = proc

    @classmethod
    async def start(cls, lab: Lab, host: str) -> _Prober:
        lh = lab.host(host)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", lh.netns, sys.executable, str(UDPFLOW), "probe",
            str(PROBE_PORT), *(str(e) for e in lh.endpoints),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 15)
        if line.strip() != b"ready":
            raise LabProcessError(f"prober of {host} did not start: {line!r}")
        return cls(host, proc)

    async def probe(self, probes: list[tuple[str, IPv4Address, IPv4Address]]) -> dict[str, bool]:
        """id -> answered, for probes (id, src, dst) sent from this host."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        lines = [f"p {pid} {src} {dst}\n" for pid, src, dst in probes]
        self.proc.stdin.write(("".join(lines) + f"go {PROBE_TIMEOUT_MS:g}\n").encode())
        await self.proc.stdin.drain()
        out: dict[str, bool] = {}
        while True:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), 30)).decode().split()
            if not line:
                raise LabProcessError(f"prober of {self.host} exited")
            if line[0] == "done":
                return out
            out[line[1]] = line[2] == "1"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


# --------------------------------------------------------------------------------------------
# The run


class _LabRun:
    def __init__(
        self,
        loaded: LoadedScenario,
        *,
        linkguard: bool,
        workdir: Path,
        progress: Callable[[str], None],
        agent_settings: dict[str, object] | None = None,
    ) -> None:
        self.loaded = loaded
        sc = loaded.scenario
        self.sc = sc
        self.fabric = loaded.fabric
        self.linkguard = linkguard
        self.workdir = workdir
        self.say = progress
        self.names = self.fabric.host_names
        self.state = FabricState(fabric=self.fabric, epoch_start=0)
        self.lab: Lab | None = None
        self.broker: MosquittoProcess | None = None
        self.procs = Procs(workdir)
        self.obs = Observer()
        self.bus: Bus | None = None
        self.cfgs: dict[str, Path] = {}
        self.probers: dict[str, _Prober] = {}
        self.flows: list[tuple[Flow, str]] = []
        self.ports_down: set[tuple[str, int]] = set()
        self.switches_down: set[str] = set()
        self.cables_down: dict[tuple[str, str], CableRef] = {}
        self.uplinks_down: set[str] = set()
        self.control_down: set[str] = set()  # "broker", "service", "agent:<host>"
        self.faults_pending = False  # a FabricFaults publish the broker did not take
        self.probe_seq = 0
        self.t0 = 0.0
        self.events = expand(loaded)
        #: the scenario's agent settings, then the caller's (dotted keys)
        self.agent_settings = {**sc.agent_settings, **(agent_settings or {})}
        self.job: LabJob | None = None
        svc = ServiceSettings()
        #: the service's back-off returns to QUIET after this long without a change (s)
        self.holddown_s = svc.solve.holddown_ms / 1000
        #: the longest the service may batch changes before it solves, plus a margin (s)
        self.max_wait_s = max(svc.solve.long_ms, self.sc.debounce_ms or 0.0) / 1000 + 0.5
        self.report = LabReport(
            scenario=sc.name,
            path=str(loaded.path),
            linkguard=linkguard,
            hosts=len(self.fabric.hosts),
            rails=len(self.fabric.rails),
            interval_ms=FLOW_INTERVAL_MS,
            sus=len({s.su for s in self.fabric.switches if s.role == "leaf"}) or 1,
            duration_s=sc.duration_s,
            debounce_ms=(sc.debounce_ms if sc.debounce_ms is not None else svc.solve.short_ms)
            if linkguard
            else None,
            agent_settings=dict(self.agent_settings) if linkguard else {},
        )

    # -- setup ---------------------------------------------------------------------------------
    async def setup(self) -> None:
        f = self.fabric
        self.say(f"building the lab: {len(f.hosts)} hosts x {len(f.rails)} rails")
        # Built on the loop's own thread, on purpose: a SIGINT/SIGTERM during the build is
        # handled once it returns, so teardown always knows every namespace and the broker (in a
        # worker thread a cancelled await left the build running, and its namespaces behind).
        self.lab = Lab.from_fabric(f, management=self.sc.job is not None)
        self.broker = MosquittoProcess(self.workdir / "broker").start()
        if self.linkguard:
            self.cfgs = write_configs(
                self.workdir,
                self.lab,
                roce_fabric(f),
                self.broker.port,
                damping=self.sc.damping or DampingPolicy(),
                debounce_ms=self.sc.debounce_ms,
                agent_extra=agent_overrides(self.agent_settings),
            )
            self.bus = observer_bus(self.broker.port, self.obs)
            await self.bus.__aenter__()
            await self.bus.wait_connected(10)
            self.say(f"starting the topology service and {len(f.hosts)} agents")
            await start_all(self.procs, self.obs, self.cfgs, self.names)
        else:
            self.say("no linkguard: static routes, each endpoint subnet via its home rail")
            await asyncio.to_thread(self._static_routes)
        self.probers = dict(
            zip(
                self.names,
                await asyncio.gather(*(_Prober.start(self.lab, h) for h in self.names)),
                strict=True,
            )
        )
        chosen = choose_flows(f, self._targets())
        flows = start_flows(
            self.lab, self.workdir, [s for s, _ in chosen], interval_ms=FLOW_INTERVAL_MS
        )
        self.flows = [(fl, role) for fl, (_, role) in zip(flows, chosen, strict=True)]
        self.report.flows = len(self.flows)
        await until(
            lambda: all(fl.arrivals() for fl, _ in self.flows),
            10,
            "every UDP flow to deliver before the first fault",
            self.procs,
        )
        self.say(f"{len(self.flows)} UDP flows running")
        if self.sc.job is not None:
            await self._start_job()
        if self.linkguard:
            # a fabric that was stable: the service's solve back-off is back in QUIET, so the
            # first fault is solved after solve.initial_ms, not after the long delay
            hold = self.holddown_s
            self.say(f"waiting until the bus was quiet for {hold:g} s (the service's back-off)")

            def quiet() -> bool:
                last = max(self.obs.last_plan_at, max((t for t, _ in self.obs.states), default=0))
                return time.monotonic() - last >= hold

            await until(quiet, hold + 30, "a quiet bus before the first fault", self.procs)

    async def _start_job(self) -> None:
        assert self.lab is not None and self.sc.job is not None
        spec = self.sc.job
        hosts = job_hosts(spec, self.fabric)
        self.job = LabJob(self.lab, self.workdir, spec, hosts, seed=self.sc.seed)
        self.say(f"starting the job: {spec.kind}, {len(hosts)} ranks (one per host)")
        self.job.start()
        check = self.procs.check_alive if self.linkguard else (lambda: None)
        await self.job.wait_warm(check)
        self.say(f"the job completed {spec.warmup_steps} warm-up steps")

    def _static_routes(self) -> None:
        assert self.lab is not None
        for lh in self.lab.hosts:
            script = "".join(
                f"route replace {net} dev {self.lab.rail(lh.name, r).netdev}\n"
                for r, net in sorted(self.fabric.endpoint_subnets.items())
            )
            subprocess.run(
                ["ip", "-n", lh.netns, "-batch", "-"], input=script, text=True, check=True
            )

    def _targets(self) -> set[tuple[str, int]]:
        """Every (host, rail) a port, switch or cable event makes unusable."""
        out: set[tuple[str, int]] = set()
        switches: set[str] = set()
        cables: dict[tuple[str, str], CableRef] = {}
        for e in self.events:
            if e.kind == "port_down":
                out.add(e.port_key)
            elif e.kind.startswith(("switch_", "cables_")):
                self._track_switch(e, switches, cables)
                for h, rails in self._health(switches, cables).unusable.items():
                    out |= {(h, r) for r in rails}
        return out

    @staticmethod
    def _track_switch(
        e: Event, switches: set[str], cables: dict[tuple[str, str], CableRef]
    ) -> None:
        if e.kind == "switch_down":
            switches.add(e.switch_name)
        elif e.kind == "switch_up":
            switches.discard(e.switch_name)
        elif e.kind == "cables_down":
            cables[e.cable_ref.pair] = e.cable_ref
        elif e.kind == "cables_up":
            cables.pop(e.cable_ref.pair, None)

    def _faults(self, switches: set[str], cables: dict[tuple[str, str], CableRef]) -> FabricFaults:
        return FabricFaults(
            switches_down=sorted(switches),
            cables_down=[cables[k] for k in sorted(cables)],
            reason=f"sim lab {self.sc.name}",
            at=time.time(),
        )

    def _health(self, switches: set[str], cables: dict[tuple[str, str], CableRef]):
        return self.state.assess_faults(self._faults(switches, cables))

    # -- applying events -------------------------------------------------------------------------
    async def apply(self, step: _Step) -> None:
        assert self.lab is not None and self.broker is not None
        links: list[tuple[str, bool]] = []
        switch_change = False
        control: list[Event] = []
        for e in step.events:
            if e.kind in ("port_down", "port_up"):
                key = e.port_key
                up = e.kind == "port_up"
                (self.ports_down.discard if up else self.ports_down.add)(key)
                links.append((self.lab.fabric_port(*key), up))
            elif e.kind.startswith(("switch_", "cables_")):
                self._track_switch(e, self.switches_down, self.cables_down)
                switch_change = True
            else:
                control.append(e)
        if switch_change:
            health = self._health(self.switches_down, self.cables_down)
            cut = {lu.leaf for lu in health.leaves if lu.cut_off and lu.leaf in self.lab.uplinks}
            links += [(self.lab.uplinks[leaf], False) for leaf in sorted(cut - self.uplinks_down)]
            links += [(self.lab.uplinks[leaf], True) for leaf in sorted(self.uplinks_down - cut)]
            self.uplinks_down = cut
        await asyncio.to_thread(self.lab.set_links, links)
        if switch_change and self.linkguard:
            await self._publish_faults()
        for e in control:
            await self._control(e)

    async def _publish_faults(self) -> None:
        assert self.bus is not None
        payload = encode(self._faults(self.switches_down, self.cables_down))
        ok = await self.bus.publish(topics.fabric_faults(), payload, retain=True)
        self.faults_pending = not ok

    async def _control(self, e: Event) -> None:
        assert self.broker is not None
        what = e.kind.rsplit("_", 1)[0]
        down = e.kind.endswith("_down")
        key = what if e.host is None else f"{what}:{e.host}"
        (self.control_down.add if down else self.control_down.discard)(key)
        if what == "broker":
            if down:
                await asyncio.to_thread(self.broker.stop)
            else:
                await asyncio.to_thread(self.broker.start)
                if self.linkguard and (
                    self.switches_down or self.cables_down or self.faults_pending
                ):
                    # the broker lost its retained messages: the operator's set comes back
                    assert self.bus is not None  # linkguard runs: the observer's bus is up
                    await self.bus.wait_connected(10)
                    await self._publish_faults()
            return
        if not self.linkguard:
            return
        name = "service" if what == "service" else e.host
        assert name is not None
        if down:
            await asyncio.to_thread(self.procs.kill, name)
        elif name == "service":
            self.procs.start("service", ["topology", "serve", "-c", str(self.cfgs["service"])])
        else:
            self.procs.start(name, ["agent", "-c", str(self.cfgs[name])])

    # -- settling and the oracle -----------------------------------------------------------------
    def _caught_up(self, t_step: float, step: _Step | None) -> bool:
        """The bus shows what ``step`` changed: the new state of every port it moved (on a
        host whose agent runs), every state again after the broker or an agent came back,
        a plan for every host after the service came back."""
        if step is None:
            return True
        for e in step.events:
            if e.kind in ("port_down", "port_up"):
                if f"agent:{e.host}" in self.control_down:
                    continue
                seen = self.obs.ports.get(e.port_key)
                if seen is None or seen[0] < t_step:
                    return False
                active = seen[1].state == PortStateName.ACTIVE
                if active != (e.kind == "port_up"):
                    return False
            elif e.kind in ("broker_up", "agent_up"):
                hosts = (
                    self.fabric.hosts if e.kind == "broker_up" else [self.fabric.host(e.host_name)]
                )
                for inv in hosts:
                    for c in inv.hcas:
                        seen = self.obs.ports.get((inv.host, c.rail))
                        if seen is None or seen[0] < t_step:
                            return False
            elif e.kind == "service_up":
                for h in self.names:
                    plans = self.obs.plans.get(h)
                    if not plans or plans[-1][0] < t_step:
                        return False
        return True

    def _all_acked(self) -> bool:
        for h in self.names:
            plan = self.obs.latest_plan(h)
            if plan is None or self.obs.acked(h, plan.epoch) is None:
                return False
        return True

    async def settle(self, t_step: float, step: _Step | None, deadline: float) -> str | None:
        """Wait until the fabric settled after ``step``; None when it did, else why not.

        Settled: the control plane is up, the bus caught up (:meth:`_caught_up`), every host
        acked its latest plan, no plan came for :data:`QUIET_S`, and either the acked plans
        agree with the model or the service's longest batching delay has passed as well
        (then the check reports what still disagrees)."""
        if self.control_down:
            return f"not checked: {', '.join(sorted(self.control_down))} down"
        if not self.linkguard:
            await asyncio.sleep(max(0.0, min(QUIET_S, deadline - time.monotonic())))
            return None
        deadline = min(deadline, t_step + SETTLE_TIMEOUT_S)
        seen_at: float | None = None
        memo: tuple[object, bool] | None = None
        while True:
            now = time.monotonic()
            if seen_at is None and self._caught_up(t_step, step):
                seen_at = now
            if seen_at is not None:
                quiet = now - max(seen_at, self.obs.last_plan_at, t_step)
                if quiet >= QUIET_S and self._all_acked():
                    if quiet >= self.max_wait_s:
                        return None
                    key = (self.obs.last_plan_at, len(self.obs.states))
                    if memo is None or memo[0] != key:
                        truth = self._truth()
                        pairs = pairs_to_check(self.fabric, truth, seed=self.sc.seed)
                        memo = (key, not self._plan_mismatches(truth, pairs))
                    if memo[1]:
                        return None
            if now >= deadline:
                return "not checked: not settled before the next step"
            self.procs.check_alive()
            await asyncio.sleep(0.01)

    def _truth(self) -> dict[str, set[int]]:
        """Rails physically unusable now: links down, leaves down or cut off."""
        out: dict[str, set[int]] = {}
        for h, r in self.ports_down:
            out.setdefault(h, set()).add(r)
        for h, rails in self._health(self.switches_down, self.cables_down).unusable.items():
            out.setdefault(h, set()).update(rails)
        return out

    async def oracle(self, label: str) -> int:
        """Probe and compare; returns the number of mismatches (also added to the report)."""
        truth = self._truth()
        usable = {
            h.host: {c.rail for c in h.hcas} - truth.get(h.host, set()) for h in self.fabric.hosts
        }
        pairs = pairs_to_check(self.fabric, truth, seed=self.sc.seed)
        wanted: dict[tuple[IPv4Address, IPv4Address], tuple[str, str]] = {}
        for a, b in pairs:
            src_eps, dst_eps = self.fabric.host(a).endpoints, self.fabric.host(b).endpoints
            for g, dst in enumerate(dst_eps):
                wanted[(src_eps[g % len(src_eps)], dst)] = (a, b)
        for fl, _ in self.flows:
            s = fl.spec
            assert s is not None
            wanted[(s.src, s.dst)] = (s.src_host, s.dst_host)
        by_host: dict[str, list[tuple[str, IPv4Address, IPv4Address]]] = {}
        ids: dict[str, tuple[IPv4Address, IPv4Address]] = {}
        for (src, dst), (a, _) in wanted.items():
            self.probe_seq += 1
            pid = str(self.probe_seq)
            ids[pid] = (src, dst)
            by_host.setdefault(a, []).append((pid, src, dst))
        results: dict[str, bool] = {}
        for part in await asyncio.gather(
            *(self.probers[h].probe(probes) for h, probes in by_host.items())
        ):
            results.update(part)
        found: list[str] = []
        for pid, (src, dst) in ids.items():
            a, b = wanted[(src, dst)]
            expect = bool(usable[a] & usable[b])
            got = results.get(pid, False)
            if expect != got:
                kind = "unreachable" if expect else "reachable against the model"
                found.append(
                    f"{label}: {kind}: {a} {src} -> {b} {dst} (usable at both: "
                    f"{sorted(usable[a] & usable[b])})"
                )
        if self.linkguard:
            found += [f"{label}: plans: {m}" for m in self._plan_mismatches(truth, pairs)]
        r = self.report
        r.checks += 1
        r.probes += len(ids)
        r.mismatch_count += len(found)
        r.mismatches += found[: MAX_MISMATCHES - len(r.mismatches)]
        return len(found)

    def _plan_mismatches(self, truth: dict[str, set[int]], pairs: list[tuple[str, str]]) -> list:
        held = {k: set(v) for k, v in truth.items()}
        for (h, rail), (_, st) in self.obs.ports.items():
            if st.status in (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED) or not st.usable:
                held.setdefault(h, set()).add(rail)
        plans = {h: self.obs.latest_plan(h) for h in self.names}
        return check(self.fabric, held, plans, pairs)

    # -- the replay ------------------------------------------------------------------------------
    async def replay(self) -> None:
        steps = _steps(self.events)
        self.report.steps = len(steps)
        await self.oracle("start")
        self.t0 = time.monotonic() + 0.3
        pending: list[tuple[FaultResult, _Step, float, int]] = []
        for i, step in enumerate(steps):
            t_due = self.t0 + step.at_s
            await self._sleep_until(t_due)
            epoch0 = self.obs.max_epoch()
            t_step = time.monotonic()
            what = step.what(self.loaded)
            await self.apply(step)
            self.say(f"{step.at_s:7.3f} s  {what}")
            result = None
            if step.is_down:
                kinds = {self.sc.timeline[e.entry].kind for e in step.events}
                result = FaultResult(
                    at_s=step.at_s,
                    kind="+".join(sorted(kinds)),
                    what=what,
                    entries=sorted({e.entry for e in step.events}),
                )
                self.report.faults.append(result)
                pending.append((result, step, t_step, epoch0))
            nxt = (
                self.t0 + steps[i + 1].at_s if i + 1 < len(steps) else self.t0 + self.sc.duration_s
            )
            why = await self.settle(t_step, step, nxt - PROBE_BUDGET_S)
            if why is None and self.sc.expect.reachability:
                n = await self.oracle(f"{step.at_s:g} s")
                if result is not None:
                    result.checked, result.mismatches = True, n
            elif result is not None:
                result.note = why or "reachability not checked (expect.reachability false)"
        end = self.t0 + self.sc.duration_s
        await self._finish_wait(end)
        t_end = time.monotonic()
        self.t_end = t_end
        if self.job is not None:  # the job runs to the scenario's end: steps after the faults
            await self._sleep_until(end)
            self.say("stopping the job")
            await self.job.stop()
        self._measure(pending, steps, t_end)

    async def _sleep_until(self, t: float) -> None:
        while True:
            left = t - time.monotonic()
            if left <= 0:
                return
            if self.linkguard:
                self.procs.check_alive()
            await asyncio.sleep(min(left, 0.05))

    async def _finish_wait(self, end: float) -> None:
        """After the last step: until every port is back in use and settled (then the final
        check), or the scenario's end."""
        if not self.linkguard:
            await self._sleep_until(min(end, time.monotonic() + 1.0))
            if self.sc.expect.reachability:
                await self.oracle("end")
            return

        def all_up() -> bool:
            return all(st.usable for (_, st) in self.obs.ports.values()) and len(
                self.obs.ports
            ) >= sum(len(h.hcas) for h in self.fabric.hosts)

        while time.monotonic() < end - PROBE_BUDGET_S and not all_up():
            self.procs.check_alive()
            await asyncio.sleep(0.02)
        why = await self.settle(time.monotonic(), None, end)
        if why is None and self.sc.expect.reachability:
            await self.oracle("end")
        elif why is not None:
            self.report.notes.append(f"final check {why}")

    def _measure(self, pending: list, steps: list[_Step], t_end: float) -> None:
        """Flow gaps and ack times per fault, from the flow records and the observer."""
        fault_times = [self.t0 + s.at_s for s in steps if s.resources - _CONTROL]
        for result, step, t_step, epoch0 in pending:
            t_back = self._return_time(step, steps)
            res = step.resources
            controls = [(fl, role) for fl, role in self.flows if role == "control"]
            if res <= _CONTROL:
                chosen = controls
            else:
                targets = self._step_targets(step)
                chosen = [
                    (fl, role)
                    for fl, role in self.flows
                    if role != "control"
                    and (
                        (_spec(fl).dst_host, _home_rail(self.fabric, _spec(fl).dst)) in targets
                        or (_spec(fl).src_host, _home_rail(self.fabric, _spec(fl).src)) in targets
                    )
                ] or controls  # nothing this step touched carries a flow: show one that passes
            t_to = t_back if t_back is not None else t_end
            for fl, role in chosen:
                gap, lost, resumed = _gap(fl, t_step, t_to, t_end)
                if math.isnan(gap):  # fewer than two datagrams around it: nothing to measure
                    continue
                until_return = not resumed or (
                    t_back is not None and gap / 1000 >= (t_back - t_step) * 0.9
                )
                result.flows.append(
                    FlowGap(_spec(fl).label, role, round(gap, 1), lost, until_return, resumed)
                )
            if self.linkguard:
                later = [t for t in fault_times if t > t_step + 1e-6]
                window_end = min(later) if later else t_end
                self._ack_timing(result, t_step, epoch0, window_end)
        if self.job is not None:
            self.report.job = self.job.measure([(r, t) for r, _, t, _ in pending], self.t0)

    def _step_targets(self, step: _Step) -> set[tuple[str, int]]:
        """The (host, rail) ports ``step`` takes down: its port downs, and the ports its switch
        and cable events make unusable that were usable just before."""
        out: set[tuple[str, int]] = {e.port_key for e in step.events if e.kind == "port_down"}
        if not any(e.kind.startswith(("switch_", "cables_")) for e in step.events):
            return out
        switches: set[str] = set()
        cables: dict[tuple[str, str], CableRef] = {}
        for e in self.events:
            if e.at_s >= step.at_s:
                break
            self._track_switch(e, switches, cables)
        before = self._health(switches, cables).unusable
        for e in step.events:
            self._track_switch(e, switches, cables)
        for h, rails in self._health(switches, cables).unusable.items():
            out |= {(h, r) for r in rails - before.get(h, frozenset())}
        return out

    def _return_time(self, step: _Step, steps: list[_Step]) -> float | None:
        """When what ``step`` took down came back (monotonic), None when it did not."""
        downs = {self._res_key(e) for e in step.events if e.kind.endswith("_down")}
        for later in steps:
            if later.at_s <= step.at_s:
                continue
            ups = {self._res_key(e) for e in later.events if e.kind.endswith("_up")}
            if downs & ups:
                return self.t0 + later.at_s
        return None

    @staticmethod
    def _res_key(e: Event) -> tuple:
        kind = e.kind.rsplit("_", 1)[0]
        if kind == "port":
            return (kind, e.host, e.rail)
        if kind == "switch":
            return (kind, e.switch)
        if kind == "cables":
            return (kind, e.cable_ref.pair)
        return (kind, e.host)

    def _ack_timing(self, result: FaultResult, t_step: float, epoch0: int, end: float) -> None:
        last: float | None = None
        most = 0
        for h in self.names:
            new = [
                (t, p)
                for t, p in self.obs.plans.get(h, [])
                if p.epoch > epoch0 and t_step < t <= end
            ]
            epochs = {p.epoch for _, p in new}
            most = max(most, len(epochs))
            if not new:
                continue
            top = max(epochs)
            for t, a in self.obs.acks.get(h, []):
                if a.epoch == top and a.result == "applied" and not a.fast_path:
                    last = t if last is None else max(last, t)
                    break
        result.plans_per_host = most
        if last is not None:
            result.last_ack_ms = round((last - t_step) * 1000, 1)

    # -- results and teardown --------------------------------------------------------------------
    def finish(self) -> LabReport:
        r = self.report
        ex = self.sc.expect
        if ex.reachability:
            r.expectations.append(ExpectResult.reachability(r.mismatch_count, r.checks, "checks"))
        data = [(g.gap_ms, f) for f in r.faults if f.kind not in _CONTROL_KINDS for g in f.flows]
        if ex.max_reroute_ms is not None:
            worst = max(data, key=lambda x: x[0], default=None)
            observed = worst[0] if worst else 0.0
            detail = (
                f"worst data-plane gap {observed:.1f} ms ({worst[1].what} at {worst[1].at_s:g} s)"
                if worst
                else "no flow gap measured"
            ) + f", limit {ex.max_reroute_ms:g} ms"
            r.expectations.append(
                ExpectResult(
                    "max_reroute_ms",
                    ex.max_reroute_ms,
                    observed,
                    observed <= ex.max_reroute_ms,
                    detail,
                )
            )
        if ex.max_plans_per_host_per_event is not None and self.linkguard:
            n = max((f.plans_per_host for f in r.faults), default=0)
            r.expectations.append(
                ExpectResult.plans_per_event(n, ex.max_plans_per_host_per_event, per="fault")
            )
        if r.job is not None:
            r.expectations += job_expectations(r, ex)
        if not self.linkguard and any(e.kind.split("_")[0] in _CONTROL for e in self.events):
            r.notes.append(
                "broker, service and agent events have nothing to act on without linkguard"
            )
        r.passed = not r.failures
        return r

    async def teardown(self) -> None:
        """Stop everything the run started, in order: the bus observer, the probers, the
        linkguard processes (their exit codes go to the report), the broker, the lab (its
        flows and namespaces). The blocking part runs on this thread, so a second
        cancellation cannot cut it short."""
        try:
            if self.bus is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.bus.close(), 5)
        finally:
            if self.job is not None:
                self.job.kill()  # stopped by now unless the run failed; the lab reaps them
            for p in self.probers.values():
                p.kill()
            try:
                self.report.exit_codes = self.procs.stop() if self.linkguard else {}
            finally:
                try:
                    if self.broker is not None:
                        self.broker.stop()
                finally:
                    if self.lab is not None:
                        self.lab.destroy()
        for p in self.probers.values():  # killed above: reap them
            with contextlib.suppress(Exception):
                await asyncio.wait_for(p.proc.wait(), 5)


_CONTROL_KINDS = {"broker_outage", "service_restart", "agent_restart"}


async def run_lab(
    loaded: LoadedScenario,
    *,
    linkguard: bool = True,
    workdir: Path | None = None,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
    agent_settings: dict[str, object] | None = None,
) -> LabReport:
    """Replay ``loaded`` on a lab (module docstring) and return the :class:`LabReport`.

    ``workdir``: configs, logs and flow records go there (kept); default a temporary
    directory, removed afterwards unless ``keep``. ``agent_settings``: added to the scenario's
    (dotted keys, e.g. ``{"routes.rto_min_ms": 20}``). Everything the run started (namespaces,
    processes, the broker) is gone when it returns or raises, also on cancellation
    (Ctrl-C, SIGTERM through the caller). Raises :class:`LabRunError` when the scenario
    cannot run here, :class:`LabProcessError` when a process dies or a wait times out and
    :class:`~linkguard.simulations.lab.LabError` when the kernel refuses a lab change."""
    check_lab_scenario(loaded, agent_settings=agent_settings)
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="linkguard-lab-")) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    run = _LabRun(
        loaded,
        linkguard=linkguard,
        workdir=wd,
        progress=progress or (lambda _: None),
        agent_settings=agent_settings,
    )
    started = time.monotonic()
    try:
        try:
            await run.setup()
            await run.replay()
        finally:
            await run.teardown()
        report = run.finish()
    finally:
        if own and not keep:
            shutil.rmtree(wd, ignore_errors=True)
    report.wall_s = round(time.monotonic() - started, 1)
    if not own or keep:
        report.workdir = str(wd)
    return report


async def run_lab_halves(
    loaded: LoadedScenario,
    *,
    halves: tuple[bool, ...] = (True, False),
    workdir: Path | None = None,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
    agent_settings: dict[str, object] | None = None,
) -> LabPair:
    """Run ``loaded`` once per entry of ``halves`` (True: with linkguard, False: the
    ``--no-linkguard`` baseline), each on a fresh lab, one after the other (one lab at a time
    on a small machine); with a ``workdir`` each half gets its own subdirectory
    (``with-linkguard``, ``without-linkguard``). Same errors as :func:`run_lab`."""
    say = progress or (lambda _: None)
    out: dict[bool, LabReport] = {}
    for lg in halves:
        name = "with-linkguard" if lg else "without-linkguard"
        say(f"--- {loaded.scenario.name}: {name.replace('-', ' ')}")
        out[lg] = await run_lab(
            loaded,
            linkguard=lg,
            workdir=None if workdir is None else workdir / name,
            keep=keep,
            progress=progress,
            agent_settings=agent_settings,
        )
    return LabPair(out.get(True), out.get(False))
