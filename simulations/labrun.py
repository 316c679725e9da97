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
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess
from linkguard.config import ServiceSettings
from linkguard.simulations.jobspec import job_hosts
from linkguard.simulations.lab import Lab
from linkguard.simulations.labdiscover import (
    LldpdSet,
    compare_discovered,
    discover_settings,
    discovered_from_docs,
)
from linkguard.simulations.labflows import FLOW_INTERVAL_MS, choose_flows
from linkguard.simulations.labinject import FaultInjector, LabRig
from linkguard.simulations.labjob import LabJob
from linkguard.simulations.labmeasure import PendingFault, lab_expectations, measure_faults
from linkguard.simulations.labpreflight import (
    MAX_LAB_HOSTS,
    MAX_LAB_RAILS,
    LabRunError,
    check_lab_scenario,
)
from linkguard.simulations.labprocs import (
    Flow,
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
from linkguard.simulations.labreach import Probers
from linkguard.simulations.labreport import (
    FaultResult,
    FlowGap,
    LabPair,
    LabReport,
    stderr_progress,
)
from linkguard.simulations.labsettle import Settler
from linkguard.simulations.labsteps import CONTROL, Step, steps_of
from linkguard.simulations.oracle import pairs_to_check
from linkguard.simulations.scenario import LoadedScenario, expand

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

#: A check is skipped when the next step is due sooner than this (s).
PROBE_BUDGET_S = 0.5
#: Mismatches kept verbatim in a report (all are counted).
MAX_MISMATCHES = 20


class _LabRun:
    """One replay on one lab: sets it up, plays the steps (:class:`FaultInjector`), waits for
    each to settle (:class:`Settler`), checks (:class:`Probers`), measures, tears down."""

    def __init__(
        self,
        loaded: LoadedScenario,
        *,
        linkguard: bool,
        workdir: Path,
        progress: Callable[[str], None],
        agent_settings: dict[str, object] | None = None,
        discover: bool = False,
    ) -> None:
        self.loaded = loaded
        #: the service runs on the fabric discovered from lldpd and the agents
        #: (:mod:`~linkguard.simulations.labdiscover`), not on the generated file
        self.discover = discover and linkguard
        self.lldp: LldpdSet | None = None
        sc = loaded.scenario
        self.sc = sc
        self.fabric = loaded.fabric
        self.linkguard = linkguard
        self.workdir = workdir
        self.say = progress
        self.names = self.fabric.host_names
        self.rig = LabRig(procs=Procs(workdir), linkguard=linkguard)
        self.procs = self.rig.procs
        self.obs = Observer()
        self.inject = FaultInjector(self.fabric, self.rig, reason=f"sim lab {sc.name}")
        self.settler = Settler(
            self.fabric,
            self.obs,
            self.procs,
            self.inject,
            linkguard=linkguard,
            seed=sc.seed,
            debounce_ms=sc.debounce_ms,
        )
        self.probers = Probers()
        self.flows: list[tuple[Flow, str]] = []
        self.t0 = 0.0
        self.events = expand(loaded)
        #: the scenario's agent settings, then the caller's (dotted keys)
        self.agent_settings = {**sc.agent_settings, **(agent_settings or {})}
        self.job: LabJob | None = None
        svc = ServiceSettings()
        #: the service's back-off returns to QUIET after this long without a change (s)
        self.holddown_s = svc.solve.holddown_ms / 1000
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
        f, rig = self.fabric, self.rig
        self.say(f"building the lab: {len(f.hosts)} hosts x {len(f.rails)} rails")
        # Built on the loop's own thread, on purpose: a SIGINT/SIGTERM during the build is
        # handled once it returns, so teardown always knows every namespace and the broker (in a
        # worker thread a cancelled await left the build running, and its namespaces behind).
        lab = rig.lab = Lab.from_fabric(f, management=self.sc.job is not None)
        self.report.netns_prefix = lab.prefix
        broker = rig.broker = MosquittoProcess(self.workdir / "broker").start()
        if self.linkguard:
            service_extra, per_host = await self._discovery(lab)
            rig.cfgs = write_configs(
                self.workdir,
                lab,
                roce_fabric(f),
                broker.port,
                damping=self.sc.damping or DampingPolicy(),
                debounce_ms=self.sc.debounce_ms,
                agent_extra=agent_overrides(self.agent_settings),
                service_extra=service_extra,
                per_host_extra=per_host,
            )
            bus = rig.bus = observer_bus(broker.port, self.obs)
            await bus.__aenter__()
            await bus.wait_connected(10)
            self.say(f"starting the topology service and {len(f.hosts)} agents")
            await start_all(self.procs, self.obs, rig.cfgs, self.names, agents_first=self.discover)
            if self.discover:
                self._check_discovered()
        else:
            self.say("no linkguard: static routes, each endpoint subnet via its home rail")
            await asyncio.to_thread(self._static_routes)
        await self.probers.start(lab, self.names)
        chosen = choose_flows(f, self.inject.targets(self.events))
        flows = start_flows(lab, self.workdir, [s for s, _ in chosen], interval_ms=FLOW_INTERVAL_MS)
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

    async def _discovery(self, lab: Lab) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """With ``discover``: start lldpd in the lab, wait until every host sees its leaves;
        the service's and agents' settings that discover (else nothing)."""
        if not self.discover:
            return {}, {}
        self.say("starting lldpd in every host namespace and on every leaf")
        self.lldp = await asyncio.to_thread(LldpdSet.start, lab, self.workdir)
        await asyncio.to_thread(self.lldp.wait_neighbours, lab)
        return discover_settings(self.lldp, self.names)

    def _check_discovered(self) -> None:
        """The fabric discovery makes from the documents on the bus is the lab's."""
        found = discovered_from_docs(list(self.obs.discovery.values()))
        diffs = compare_discovered(found.fabric, roce_fabric(self.fabric))
        f = found.fabric
        self.report.discovered = {
            "hosts": len(f.hosts) if f else 0,
            "rails": len(f.rails) if f else 0,
            "leaves": sum(s.role == "leaf" for s in f.switches) if f else 0,
            "unknowns": [u.line() for u in found.unknowns],
            "differences": diffs,
        }
        self.say(
            f"discovered {self.report.discovered['hosts']} hosts, "
            f"{self.report.discovered['leaves']} leaves from lldpd: "
            + ("the lab's fabric" if not diffs else f"{len(diffs)} differences")
        )

    async def _start_job(self) -> None:
        assert self.rig.lab is not None and self.sc.job is not None
        spec = self.sc.job
        hosts = job_hosts(spec, self.fabric)
        self.job = LabJob(self.rig.lab, self.workdir, spec, hosts, seed=self.sc.seed)
        self.say(f"starting the job: {spec.kind}, {len(hosts)} ranks (one per host)")
        self.job.start()
        check = self.procs.check_alive if self.linkguard else (lambda: None)
        await self.job.wait_warm(check)
        self.say(f"the job completed {spec.warmup_steps} warm-up steps")

    def _static_routes(self) -> None:
        lab = self.rig.lab
        assert lab is not None
        for lh in lab.hosts:
            script = "".join(
                f"route replace {net} dev {lab.rail(lh.name, r).netdev}\n"
                for r, net in sorted(self.fabric.endpoint_subnets.items())
            )
            subprocess.run(
                ["ip", "-n", lh.netns, "-batch", "-"], input=script, text=True, check=True
            )

    # -- the oracle ------------------------------------------------------------------------------
    async def oracle(self, label: str) -> int:
        """Probe and compare; returns the number of mismatches (also added to the report)."""
        truth = self.inject.truth()
        pairs = pairs_to_check(self.fabric, truth, seed=self.sc.seed)
        found, probes = await self.probers.reach(
            label, self.fabric, truth, pairs, (fl for fl, _ in self.flows)
        )
        if self.linkguard:
            found += [f"{label}: plans: {m}" for m in self.settler.plan_mismatches(truth, pairs)]
        r = self.report
        r.checks += 1
        r.probes += probes
        r.mismatch_count += len(found)
        r.mismatches += found[: MAX_MISMATCHES - len(r.mismatches)]
        return len(found)

    async def replay(self) -> None:
        steps = steps_of(self.events)
        self.report.steps = len(steps)
        await self.oracle("start")
        self.t0 = time.monotonic() + 0.3
        pending: list[PendingFault] = []
        for i, step in enumerate(steps):
            t_due = self.t0 + step.at_s
            await self._sleep_until(t_due)
            epoch0 = self.obs.max_epoch()
            t_step = time.monotonic()
            what = step.what(self.loaded)
            await self.inject.apply(step)
            self.say(f"{step.at_s:7.3f} s  {what}")
            result = None
            if step.is_down:
                kinds = {self.sc.timeline[e.entry].kind for e in step.events}
                result = FaultResult(
                    at_s=step.at_s,
                    kind="+".join(sorted(kinds)),
                    what=what,
                    entries=sorted({e.entry for e in step.events}),
                    host=step.port_host,
                )
                self.report.faults.append(result)
                pending.append((result, step, t_step, epoch0))
            nxt = (
                self.t0 + steps[i + 1].at_s if i + 1 < len(steps) else self.t0 + self.sc.duration_s
            )
            why = await self.settler.settle(t_step, step, nxt - PROBE_BUDGET_S)
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
        why = await self.settler.settle(time.monotonic(), None, end)
        if why is None and self.sc.expect.reachability:
            await self.oracle("end")
        elif why is not None:
            self.report.notes.append(f"final check {why}")

    def _measure(self, pending: list[PendingFault], steps: list[Step], t_end: float) -> None:
        """Flow gaps and ack times per fault, from the flow records and the observer."""
        measure_faults(
            pending,
            steps,
            t0=self.t0,
            t_end=t_end,
            fabric=self.fabric,
            flows=self.flows,
            step_targets=lambda step: self.inject.step_targets(self.events, step),
            obs=self.obs if self.linkguard else None,
        )
        if self.job is not None:
            self.report.job = self.job.measure([(r, t) for r, _, t, _ in pending], self.t0)

    # -- results and teardown --------------------------------------------------------------------
    def finish(self) -> LabReport:
        r = self.report
        r.expectations += lab_expectations(r, self.sc.expect, linkguard=self.linkguard)
        if not self.linkguard and any(e.kind.split("_")[0] in CONTROL for e in self.events):
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
            if self.rig.bus is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await self.rig.bus.close()
        finally:
            if self.job is not None:
                self.job.kill()  # stopped by now unless the run failed; the lab reaps them
            self.probers.kill()
            try:
                self.report.exit_codes = self.procs.stop() if self.linkguard else {}
            finally:
                try:
                    if self.rig.broker is not None:
                        self.rig.broker.stop()
                finally:
                    if self.lldp is not None:
                        self.lldp.stop()
                    if self.rig.lab is not None:
                        self.rig.lab.destroy()
        await self.probers.reap()  # killed above: reap them


async def run_lab(
    loaded: LoadedScenario,
    *,
    linkguard: bool = True,
    workdir: Path | None = None,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
    agent_settings: dict[str, object] | None = None,
    discover: bool = False,
) -> LabReport:
    """Replay ``loaded`` on a lab (module docstring) and return the :class:`LabReport`.

    ``workdir``: configs, logs and flow records go there (kept); default a temporary
    directory, removed afterwards unless ``keep``. ``agent_settings``: added to the scenario's
    (dotted keys, e.g. ``{"routes.rto_min_ms": 20}``). ``discover``: the service runs on the
    fabric discovered from lldpd and the agents' documents, which must be the lab's
    (:mod:`~linkguard.simulations.labdiscover`). Everything the run started (namespaces,
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
        discover=discover,
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
    discover: bool = False,
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
            discover=discover,
        )
    return LabPair(out.get(True), out.get(False))
