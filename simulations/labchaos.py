"""A chaos run on the namespace lab: the real kernel, the real agents and service as processes,
the seeded fault-injecting MQTT proxy (:mod:`linkguard.simulations.chaosproxy`) between the
agents and the broker. ``linkguard sim lab`` runs it for a scenario with a ``chaos:`` section
(:class:`~linkguard.simulations.chaosspec.ChaosSpec`).

Consumes: a :class:`~linkguard.simulations.scenario.LoadedScenario` with ``chaos:`` (its
generated fabric, seed, damping, debounce, agent settings). Produces: a :class:`LabChaosReport`.

Who connects where: the agents (``linkguard agent``, one per host namespace) connect to the
proxy; the topology service (``linkguard topology serve``, with a ledger) and the run's own
bus observer connect to Mosquitto directly, so what the observer sees is what the service
sent and received.

The run (:func:`run_lab_chaos`): build the lab, start Mosquitto, the proxy, the service and the
agents, wait until every host acked its first plan; turn the proxy's rules on
(:func:`~linkguard.simulations.chaosstorm.chaos_rules`) and play the seeded storm
(:func:`~linkguard.simulations.chaosstorm.storm_schedule`, healed at its end) in the kernel: the
fabric end of a host's veth set down/up, so the agent sees carrier loss through netlink; clear
the rules (the storm's end). Then the checks, each failing the run with a sentence:

1. **Convergence**: every host's latest applied ack is at least the epoch the service owes
   it (its plan's, or for a compact plan the highest of that and the peer routes'), and the
   bus quiet for :data:`QUIET_S`, within ``chaos.within_s`` of the storm's end; per host, the
   time it last became acked. The ports' states on the bus (what the service has) must then
   be the kernel's (all up), after the reconnect of check 2 at the latest.
2. **Events**: every event the agents journaled (``state_dir/events.json``'s numbering, with
   the ``at`` of each as the proxy saw it leave the agent) is in the ledger's ``port_events``
   exactly once per (host, journal, seq), with the agent's time. When some are missing once
   the hosts converged, the proxy cuts every connection once (the agents replay what the
   service has not confirmed on a reconnect) and the ledger is read again:
   ``missing_until_reconnect`` counts the first, ``lost`` the second.
3. **Routes**: in each host namespace, the IPv4 routes of every table but ``local`` are exactly
   what the acked plan implies (:func:`~linkguard.simulations.labchaoscheck.expected_routes`:
   linkguard's table as the plan asks, the connected rail subnets in ``main``), no route twice,
   none elsewhere; no policy rule twice.
4. **Report**: ``linkguard report --format json`` on the ledger (the service stopped, so the
   ledger is complete) lists each outage once: every down episode of the agents' events is in
   exactly one outage, every outage has one, and each starts at its first port's down (the
   agent's time) and lasts its longest episode
   (:func:`~linkguard.simulations.labchaoscheck.outage_problems`).
5. **Times**: each kernel link change that held for :data:`STEADY_S` reached its agent's
   events within :data:`DETECT_WITHIN_S` (a link-down an event to ``down``, a link-up one
   that leaves ``down``): the agent's ``at`` is what the ledger keeps as the truth.

Every wait has a deadline; the processes, the proxy, the broker and the namespaces are gone
when it returns or raises. Needs root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from linkguard import topics
from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess
from linkguard.bus import Bus
from linkguard.simulations.chaosproxy import ChaosProxy, Packet, publish_payload
from linkguard.simulations.chaosspec import ChaosSpec
from linkguard.simulations.chaosstorm import (
    StormEvent,
    audit_events,
    chaos_rules,
    percentile,
    storm_schedule,
)
from linkguard.simulations.lab import Lab
from linkguard.simulations.labchaoscheck import (
    down_episodes,
    expected_routes,
    outage_problems,
    route_problems,
    rule_problems,
)
from linkguard.simulations.labpreflight import check_lab_scenario
from linkguard.simulations.labprocs import (
    TABLE,
    LabProcessError,
    Observer,
    Procs,
    agent_overrides,
    observer_bus,
    roce_fabric,
    start_all,
    until,
    write_configs,
)
from linkguard.simulations.labsettle import acked_as_service
from linkguard.simulations.scenario import LoadedScenario

__all__ = ["LabChaosReport", "run_lab_chaos"]

#: the watch after the storm lasts ``within_s`` plus this (s), to tell late from never
MARGIN_S = 5.0
#: how long the journals get to be confirmed after the hosts converged (s)
CONFIRM_S = 3.0
#: no plan or peer routes on the bus for this long before the kernel's routes are read (s)
QUIET_S = 1.0
#: publishes let through before a cut may happen (the lab's storm is short)
CUT_SKIP = 5
#: a kernel change reaches its agent's events within this (s; measured: at most ~1 ms, 8.3 s
#: while the agent's port loop waited on a lost PUBACK)
DETECT_WITHIN_S = 2.0
#: a kernel change undone sooner than this (s) is not held to that (the agent may not see it)
STEADY_S = 0.2
#: the watch's polling interval (s)
POLL_S = 0.01


class LabChaosReport(BaseModel):
    """A lab chaos run's figures and verdict. Times in s; counts of PUBLISH packets through
    the proxy (both directions) unless said otherwise."""

    scenario: str
    hosts: int
    rails: int
    seed: int
    chaos: ChaosSpec
    connects: str = Field(
        "agents through the proxy; the service and the observer directly to Mosquitto"
    )
    storm_events: int = Field(0, description="port faults set in the kernel (healing included)")
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    reordered: int = 0
    cut: int = Field(0, description="connections cut by a rule")
    connections: int = Field(0, description="agent connections the proxy accepted")
    startup_s: float | None = None
    convergence_s: dict[str, float | None] = Field(default_factory=dict)
    convergence_p50_s: float | None = None
    convergence_max_s: float | None = None
    detect_max_ms: float | None = Field(
        None,
        description="the largest gap from a kernel link change to its agent's event (ms)",
    )
    events_journaled: int = 0
    events_missing_until_reconnect: int = 0
    ports_stale_until_reconnect: int = Field(
        0,
        description="ports whose state on the bus was not the kernel's once the hosts "
        "converged (a lost publish: an agent publishes its states again on a reconnect)",
    )
    events_lost: int = 0
    events_duplicated: int = 0
    events_time_mismatch: int = 0
    routes_checked: int = Field(0, description="routes compared, every host namespace")
    outages: int = Field(0, description="outages in `linkguard report`")
    episodes: int = Field(0, description="port down episodes in the agents' events")
    failures: list[str] = Field(default_factory=list)
    passed: bool = False
    wall_s: float | None = None
    workdir: str | None = None

    def text(self) -> str:
        """The report for a terminal: what was done, what was measured, what failed."""
        c = self.chaos
        lines = [
            f"lab chaos {self.scenario}: {self.hosts} hosts x {self.rails} rails, seed "
            f"{self.seed}, loss {c.loss:.0%}, storm {c.storm_s:g} s ({self.storm_events} "
            f"port faults in the kernel); {self.connects}",
            f"  proxy: dropped {self.dropped}, duplicated {self.duplicated}, delayed "
            f"{self.delayed}, reordered {self.reordered}, cut {self.cut} (agent connections "
            f"{self.connections})",
            f"  convergence after the storm: p50 {self.convergence_p50_s} s, max "
            f"{self.convergence_max_s} s (stated: within {c.within_s:g} s); startup "
            f"{self.startup_s} s; kernel change to agent event at most {self.detect_max_ms} ms",
            f"  events: journaled {self.events_journaled}, missing until a reconnect "
            f"{self.events_missing_until_reconnect}, lost {self.events_lost}, duplicated "
            f"{self.events_duplicated}, re-timed {self.events_time_mismatch}; port states "
            f"stale until a reconnect {self.ports_stale_until_reconnect}",
            f"  routes checked {self.routes_checked} (every table of every host namespace); "
            f"report: {self.outages} outages for {self.episodes} port down episodes",
        ]
        lines += [f"  FAILED: {f}" for f in self.failures]
        lines.append(f"{'PASS' if self.passed else 'FAIL'} ({self.wall_s} s)")
        if self.workdir:
            lines.append(f"  files: {self.workdir}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json")


class _Run:
    def __init__(self, loaded: LoadedScenario, workdir: Path, say: Callable[[str], None],
                 agent_settings: dict[str, object]) -> None:  # fmt: skip
        sc = loaded.scenario
        assert sc.chaos is not None
        self.loaded, self.spec, self.workdir, self.say = loaded, sc.chaos, workdir, say
        self.fabric = loaded.fabric
        self.names = list(self.fabric.host_names)
        self.agent_settings = {**sc.agent_settings, **agent_settings}
        self.procs = Procs(workdir)
        self.obs = Observer()
        self.lab: Lab | None = None
        self.broker: MosquittoProcess | None = None
        self.proxy = ChaosProxy("127.0.0.1", 0, seed=sc.seed)
        self.bus: Bus | None = None
        #: (host, journal, seq) -> the event as the agent published it (first copy)
        self.sent: dict[tuple[str, str, int], dict[str, Any]] = {}
        #: (host, rail, action, wall time the kernel change was made)
        self.kernel: list[tuple[str, int, str, float]] = []
        self.report = LabChaosReport(
            scenario=sc.name,
            hosts=len(self.fabric.hosts),
            rails=len(self.fabric.rails),
            seed=sc.seed,
            chaos=self.spec,
        )

    def _tap(self, direction: str, packet: Packet) -> None:
        parsed = topics.parse(packet.topic or "")
        if direction != "up" or parsed is None or parsed.kind != "events":
            return
        with contextlib.suppress(ValueError, KeyError, TypeError):  # not an event: not ours
            ev = json.loads(publish_payload(packet))
            if isinstance(ev, dict) and ev.get("journal") and ev.get("seq"):
                float(ev["at"])  # a time to compare
                self.sent.setdefault((str(ev["host"]), str(ev["journal"]), int(ev["seq"])), ev)

    async def setup(self) -> None:
        f, sc = self.fabric, self.loaded.scenario
        self.say(f"building the lab: {len(f.hosts)} hosts x {len(f.rails)} rails")
        lab = self.lab = Lab.from_fabric(f)
        broker = self.broker = MosquittoProcess(self.workdir / "broker").start()
        self.proxy.broker = (broker.host, broker.port)
        self.proxy.tap = self._tap
        await self.proxy.start()
        extra = agent_overrides(self.agent_settings)
        extra.setdefault("bus", {})["port"] = self.proxy.port  # the agents: through the proxy
        cfgs = write_configs(
            self.workdir,
            lab,
            roce_fabric(f),
            broker.port,
            damping=sc.damping or DampingPolicy(),
            debounce_ms=sc.debounce_ms,
            agent_extra=extra,
            service_extra={
                "ledger": {"path": str(self.workdir / "ledger.sqlite3")},
                "convergence": {
                    "resend_after_s": self.spec.resend_after_s,
                    "resend_max_s": self.spec.resend_max_s,
                },
            },
        )
        self.bus = observer_bus(broker.port, self.obs)
        await self.bus.__aenter__()
        await self.bus.wait_connected(10)
        self.say(f"starting the service (direct) and {len(f.hosts)} agents (via the proxy)")
        t0 = time.monotonic()
        await start_all(self.procs, self.obs, cfgs, self.names)
        self.report.startup_s = round(time.monotonic() - t0, 3)

    async def storm(self) -> None:
        spec, lab = self.spec, self.lab
        assert lab is not None
        storm = storm_schedule(
            self.names,
            sorted(self.fabric.rails),
            seed=self.loaded.scenario.seed,
            duration_s=spec.storm_s,
            events_per_s=spec.events_per_s,
        )
        self.report.storm_events = len(storm)
        self.say(f"storm: {len(storm)} port faults in {spec.storm_s:g} s, proxy loss "
                 f"{spec.loss:.0%}, {spec.cuts} cuts")  # fmt: skip
        self.proxy.rules = chaos_rules(
            spec.loss, cuts=spec.cuts, cut_probability=spec.cut_probability, cut_skip=CUT_SKIP
        )
        t0 = time.monotonic()
        try:
            for at in sorted({e.t_s for e in storm}):
                batch = [e for e in storm if e.t_s == at]
                while (left := t0 + at - time.monotonic()) > 0:
                    self.procs.check_alive()
                    await asyncio.sleep(min(left, 0.05))
                await asyncio.to_thread(self._set, batch)
        finally:
            self.proxy.rules = []

    def _set(self, batch: list[StormEvent]) -> None:
        assert self.lab is not None
        changes = [(self.lab.fabric_port(e.host, e.rail), e.action == "link_up") for e in batch]
        self.lab.set_links(changes)
        wall = time.time()
        self.kernel += [(e.host, e.rail, e.action, wall) for e in batch]

    async def converge(self) -> None:
        """Check 1 (module docstring): until every host acked what it is owed and no plan
        came for :data:`QUIET_S` (the hold-downs after the heal re-plan), or the deadline."""
        end, deadline = time.monotonic(), self.spec.within_s + MARGIN_S
        since: dict[str, float | None] = dict.fromkeys(self.names)
        while True:
            now = time.monotonic()
            for h in self.names:
                if not acked_as_service(self.obs, h):
                    since[h] = None
                elif since[h] is None:
                    since[h] = round(max(0.0, now - end), 3)
            settled = now - self.obs.last_plan_at >= QUIET_S
            if (settled and all(t is not None for t in since.values())) or now - end > deadline:
                break
            self.procs.check_alive()
            await asyncio.sleep(POLL_S)
        r = self.report
        r.convergence_s = since
        times = [t for t in since.values() if t is not None]
        r.convergence_p50_s = percentile(times, 50)
        r.convergence_max_s = max(times) if times else None
        late = sorted(h for h, t in since.items() if t is None or t > self.spec.within_s)
        if late:
            r.failures.append(
                f"hosts not acking the service's current epoch within {self.spec.within_s:g} s "
                f"of the storm's end: {', '.join(late)}\n{self.obs.summary(late)}"
            )

    def _stale(self) -> list[str]:
        """Ports whose latest state on the bus (what the service has) is not usable, though
        the storm healed every one in the kernel."""
        total = sum(len(h.hcas) for h in self.fabric.hosts)
        seen = {(h, rl): st for (h, rl), (_, st) in self.obs.ports.items()}
        out = [f"{h} rail {rl} ({st.status.value})" for (h, rl), st in sorted(seen.items())
               if not st.usable]  # fmt: skip
        return out if len(seen) >= total else [*out, f"{total - len(seen)} never reported"]

    def _journals(self) -> dict[str, dict[str, Any]]:
        out = {}
        for h in self.names:
            with contextlib.suppress(OSError, ValueError):
                out[h] = json.loads((self.workdir / h / "events.json").read_text())
        return out

    def _journaled(self) -> set[tuple[str, str, int]]:
        """Every (host, journal, seq) the agents numbered: seen leaving an agent, or below a
        journal's ``next_seq`` (saved with each event)."""
        keys = set(self.sent)
        for h, doc in self._journals().items():
            keys |= {(h, str(doc.get("journal")), s) for s in range(1, int(doc.get("next_seq", 1)))}
        return keys

    def _missing(self) -> int:
        """Events the agents journaled that the ledger does not hold yet (read as it is
        written)."""
        try:
            rows = _ledger(self.workdir / "ledger.sqlite3", "SELECT host, journal, seq FROM "
                           "port_events")  # fmt: skip
        except sqlite3.Error:
            return -1
        return len(self._journaled() - {(h, j, s) for h, j, s in rows})

    async def confirm(self) -> None:
        """Every journaled event in the ledger and every port's state on the bus usable (the
        kernel's); else one cut of every agent connection (on a reconnect the agents replay
        what the service has not confirmed and publish their port states again) and a second
        wait; what is still missing or stale then fails the run."""

        def done() -> bool:
            return self._missing() == 0 and not self._stale()

        with contextlib.suppress(LabProcessError):
            await until(done, CONFIRM_S, "events in the ledger, port states current")
        r = self.report
        r.events_missing_until_reconnect = max(self._missing(), 0)
        r.ports_stale_until_reconnect = len(self._stale())
        if not done():
            self.say(f"{r.events_missing_until_reconnect} events not in the ledger, "
                     f"{r.ports_stale_until_reconnect} port states stale: cutting every agent "
                     "connection once (they replay and publish again on reconnect)")  # fmt: skip
            self.proxy.cut()
            with contextlib.suppress(LabProcessError):
                await until(done, self.spec.within_s, "events and port states after a reconnect")
        if stale := self._stale():
            r.failures.append(
                "the service's port states are not the kernel's after a reconnect: "
                + ", ".join(stale)
            )

    async def routes(self) -> None:
        """Check 3 (module docstring), once the bus was quiet for :data:`QUIET_S`."""

        def quiet() -> bool:
            return time.monotonic() - self.obs.last_plan_at >= QUIET_S and all(
                acked_as_service(self.obs, h) for h in self.names
            )

        with contextlib.suppress(LabProcessError):
            await until(quiet, QUIET_S + 10, "a quiet bus")
        assert self.lab is not None
        n = 0
        for lh in self.lab.hosts:
            plan = self.obs.latest_plan(lh.name)
            if plan is None:
                self.report.failures.append(f"{lh.name}: no plan seen")
                continue
            connected = [(str(r.network), r.netdev) for r in lh.rails]
            want = expected_routes(plan, TABLE, connected)
            rows = json.loads(_ip(lh.netns, "route", "show", "table", "all") or "[]")
            rules = json.loads(_ip(lh.netns, "rule", "show") or "[]")
            n += sum(1 for row in rows if row.get("table") != "local")
            self.report.failures += route_problems(lh.name, want, rows)
            self.report.failures += rule_problems(lh.name, rules)
        self.report.routes_checked = n

    def events(self) -> list[dict[str, Any]]:
        """Check 2 (module docstring), on the stopped service's ledger; the agents' events as
        they left the agents."""
        r = self.report
        sent = [
            (h, j, s, float(e["at"]), str(e.get("hca", "")), int(e.get("port", 0)),
             str(e.get("current", "")))
            for (h, j, s), e in self.sent.items()
        ]  # fmt: skip
        rows = _ledger(self.workdir / "ledger.sqlite3", "SELECT host, journal, seq, at, hca, "
                       "port, current FROM port_events")  # fmt: skip
        # duplicates and times: every event seen leaving an agent against the rows
        audit = audit_events(sent, [(h, j or "", s or 0, at, hca, p, c) for h, j, s, at, hca, p, c
                                    in rows])  # fmt: skip
        # lost: every number the journals gave out (a few may never have left the agent)
        numbered = self._journaled()
        in_ledger = {(h, j, s) for h, j, s, *_ in rows}
        r.events_journaled, r.events_lost = len(numbered), len(numbered - in_ledger)
        r.events_duplicated, r.events_time_mismatch = audit.duplicated, audit.mismatched
        if r.events_lost or r.events_duplicated or r.events_time_mismatch:
            r.failures.append(
                f"ledger: of {r.events_journaled} port events the agents journaled, "
                f"{r.events_lost} missing, {r.events_duplicated} extra rows, "
                f"{r.events_time_mismatch} not at the agent's time or port"
            )
        return list(self.sent.values())

    def detect(self, events: list[dict[str, Any]]) -> None:
        """Check 5 (module docstring): each kernel change of a port (one that held for
        :data:`STEADY_S`) reached its agent's events within :data:`DETECT_WITHIN_S`: a
        link-down an event to ``down``, a link-up one that leaves ``down``."""
        gaps: list[tuple[float, str]] = []
        for i, (host, rail, action, wall) in enumerate(self.kernel):
            nxt = [w for h, r, _, w in self.kernel[i + 1 :] if (h, r) == (host, rail)]
            if nxt and nxt[0] - wall < STEADY_S:
                continue  # undone at once: the agent may never see it
            down = action == "link_down"
            seen = [
                e["at"] for e in events
                if e["host"] == host and e.get("rail") == rail and e["at"] >= wall - 1.0
                and (e["current"] == "down" if down else e["previous"] == "down")
            ]  # fmt: skip
            gap = (min(seen) - wall) if seen else math.inf
            gaps.append((max(0.0, gap), f"{host} rail {rail} {action} at {wall:.3f}"))
        worst = max(gaps, default=(0.0, ""))
        self.report.detect_max_ms = round(worst[0] * 1000, 1) if gaps else None
        if worst[0] > DETECT_WITHIN_S:
            self.report.failures.append(
                f"{worst[1]}: the agent's event came {worst[0]:.3f} s later (more than "
                f"{DETECT_WITHIN_S:g} s; the ledger keeps the agent's time as the truth)"
            )

    def outages(self, events: list[dict[str, Any]]) -> None:
        """Check 4 (module docstring): ``linkguard report`` as a user runs it."""
        ledger = self.workdir / "ledger.sqlite3"
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "linkguard.cli", "report", "--ledger", str(ledger),
             "--format", "json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            self.report.failures.append(f"linkguard report exited {proc.returncode}: "
                                        f"{proc.stderr.strip()[-500:]}")  # fmt: skip
            return
        outages = json.loads(proc.stdout)["outages"]
        eps = down_episodes(events)
        self.report.outages, self.report.episodes = len(outages), len(eps)
        ports = _ledger(ledger, "SELECT outage_id, host, hca, port FROM outage_ports")
        self.report.failures += [f"report: {p}" for p in outage_problems(eps, outages, ports)]

    async def teardown(self) -> None:
        try:
            if self.bus is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await self.bus.close()
            await self.proxy.close()
        finally:
            try:
                self.procs.stop()
            finally:
                try:
                    if self.broker is not None:
                        self.broker.stop()
                finally:
                    if self.lab is not None:
                        self.lab.destroy()


def _ip(netns: str, *args: str) -> str:
    return subprocess.run(["ip", "-4", "-j", "-n", netns, *args], capture_output=True,
                          text=True, check=True, timeout=30).stdout  # fmt: skip


def _ledger(path: Path, query: str) -> list[Any]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute(query).fetchall()


def _proxy_counts(report: LabChaosReport, proxy: ChaosProxy) -> None:
    s = proxy.stats

    def both(action: str) -> int:
        return int(s[("up", action)] + s[("down", action)])

    report.dropped, report.duplicated = both("drop"), both("duplicate")
    report.delayed, report.reordered, report.cut = both("delay"), both("reorder"), both("cut")
    report.connections = int(s[("both", "connections")])


async def run_lab_chaos(
    loaded: LoadedScenario,
    *,
    workdir: Path | None = None,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
    agent_settings: dict[str, object] | None = None,
) -> LabChaosReport:
    """Run the lab chaos run of the module docstring for ``loaded`` (which has ``chaos:``)
    and return its report (``passed`` False with ``failures`` when a check did not hold).
    ``workdir``, ``keep``, ``agent_settings``: as :func:`~linkguard.simulations.labrun.run_lab`.
    Raises :class:`~linkguard.simulations.labpreflight.LabRunError` when it cannot run here,
    ValueError for a scenario without ``chaos:``,
    :class:`~linkguard.simulations.labprocs.LabProcessError` when a process dies or the first
    plans are not acked within 30 s, :class:`~linkguard.simulations.lab.LabError` when the
    kernel refuses a lab change."""
    if loaded.scenario.chaos is None:
        raise ValueError(f"{loaded.path}: no chaos: section")
    check_lab_scenario(loaded, agent_settings=agent_settings)
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="linkguard-labchaos-")) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    run = _Run(loaded, wd, progress or (lambda _: None), dict(agent_settings or {}))
    started = time.monotonic()
    try:
        try:
            await run.setup()
            await run.storm()
            await run.converge()
            await run.confirm()
            await run.routes()
            _proxy_counts(run.report, run.proxy)
            run.say("stopping the processes (the service closes its ledger)")
        finally:
            await run.teardown()
        events = run.events()
        run.detect(events)
        run.outages(events)
    finally:
        if own and not keep:
            shutil.rmtree(wd, ignore_errors=True)
    report = run.report
    report.passed = not report.failures
    report.wall_s = round(time.monotonic() - started, 1)
    if not own or keep:
        report.workdir = str(wd)
    return report
