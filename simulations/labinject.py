"""Fault injection on a namespace lab (:mod:`linkguard.simulations.labrun`): a step's events made
real in the kernel, on the bus and on the processes.

Consumes: the steps of a replay (:class:`~linkguard.simulations.labsteps.Step`) and what the run
started (:class:`LabRig`: the lab, Mosquitto, the observer's bus, the linkguard processes).
Produces the effects: ``port_down``/``port_up`` set the fabric end of the host's veth down/up;
switch and cable events publish the whole :class:`~linkguard.models.FabricFaults` set
(retained, ``fabric/faults``, cables sorted by pair) and cut a leaf that is down or cut off
from its rail's spines (:mod:`linkguard.topology.health`) off the spine bridge; ``broker_*``
stops and starts Mosquitto (same port), ``service_*`` and ``agent_*`` SIGKILL and restart the
process. Keeps what is down, from which the rails physically unusable now follow
(:meth:`FaultInjector.truth`), and which (host, rail) ports a scenario or a step makes
unusable (:meth:`FaultInjector.targets`, :meth:`FaultInjector.step_targets`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from linkguard import topics
from linkguard.broker import MosquittoProcess
from linkguard.bus import Bus
from linkguard.models import encode
from linkguard.simulations.faultset import SWITCH_KINDS, FaultSet
from linkguard.simulations.lab import Lab
from linkguard.simulations.labprocs import Procs
from linkguard.simulations.labsteps import Step
from linkguard.simulations.scenario import Event
from linkguard.topology.fabric import Fabric
from linkguard.topology.health import Health
from linkguard.topology.state import FabricState

__all__ = ["FaultInjector", "LabRig"]


@dataclass
class LabRig:
    """What a lab run started (None until its setup started it): the lab, Mosquitto, the bus
    observer's connection, the linkguard processes and their config files (``service`` and
    one per host)."""

    procs: Procs
    linkguard: bool
    lab: Lab | None = None
    broker: MosquittoProcess | None = None
    bus: Bus | None = None
    cfgs: dict[str, Path] = field(default_factory=dict)


class FaultInjector:
    """Applies steps to a lab (module docstring) and keeps what is down. ``reason``: the
    published fault set's ``reason``."""

    def __init__(self, fabric: Fabric, rig: LabRig, *, reason: str) -> None:
        self.fabric = fabric
        self.rig = rig
        self.reason = reason
        self.state = FabricState(fabric=fabric, epoch_start=0)
        self.ports_down: set[tuple[str, int]] = set()
        self.faults = FaultSet()
        self.uplinks_down: set[str] = set()
        self.control_down: set[str] = set()  # "broker", "service", "agent:<host>"
        self.faults_pending = False  # a FabricFaults publish the broker did not take

    def health(self, faults: FaultSet) -> Health:
        """What the switch-level ``faults`` do to the fabric (leaves down or cut off, rails
        unusable per host), by the service's own model."""
        return self.state.assess_faults(
            faults.faults(at=time.time(), reason=self.reason, sort_cables=True)
        )

    def targets(self, events: list[Event]) -> set[tuple[str, int]]:
        """Every (host, rail) a port, switch or cable event of ``events`` makes unusable."""
        out: set[tuple[str, int]] = set()
        faults = FaultSet()
        for e in events:
            if e.kind == "port_down":
                out.add(e.port_key)
            elif faults.apply(e):
                for h, rails in self.health(faults).unusable.items():
                    out |= {(h, r) for r in rails}
        return out

    def step_targets(self, events: list[Event], step: Step) -> set[tuple[str, int]]:
        """The (host, rail) ports ``step`` takes down: its port downs, and the ports its switch
        and cable events make unusable that were usable just before (``events``: all of the
        scenario's, in time order)."""
        out: set[tuple[str, int]] = {e.port_key for e in step.events if e.kind == "port_down"}
        if not any(e.kind in SWITCH_KINDS for e in step.events):
            return out
        faults = FaultSet()
        for e in events:
            if e.at_s >= step.at_s:
                break
            faults.apply(e)
        before = self.health(faults).unusable
        for e in step.events:
            faults.apply(e)
        for h, rails in self.health(faults).unusable.items():
            out |= {(h, r) for r in rails - before.get(h, frozenset())}
        return out

    def truth(self) -> dict[str, set[int]]:
        """Rails physically unusable now: links down, leaves down or cut off."""
        out: dict[str, set[int]] = {}
        for h, r in self.ports_down:
            out.setdefault(h, set()).add(r)
        for h, rails in self.health(self.faults).unusable.items():
            out.setdefault(h, set()).update(rails)
        return out

    async def apply(self, step: Step) -> None:
        """Make ``step``'s events real: links, then the fault set, then the processes."""
        lab = self.rig.lab
        assert lab is not None and self.rig.broker is not None
        links: list[tuple[str, bool]] = []
        switch_change = False
        control: list[Event] = []
        for e in step.events:
            if e.kind in ("port_down", "port_up"):
                key = e.port_key
                up = e.kind == "port_up"
                (self.ports_down.discard if up else self.ports_down.add)(key)
                links.append((lab.fabric_port(*key), up))
            elif self.faults.apply(e):
                switch_change = True
            else:
                control.append(e)
        if switch_change:
            health = self.health(self.faults)
            cut = {lu.leaf for lu in health.leaves if lu.cut_off and lu.leaf in lab.uplinks}
            links += [(lab.uplinks[leaf], False) for leaf in sorted(cut - self.uplinks_down)]
            links += [(lab.uplinks[leaf], True) for leaf in sorted(self.uplinks_down - cut)]
            self.uplinks_down = cut
        await asyncio.to_thread(lab.set_links, links)
        if switch_change and self.rig.linkguard:
            await self._publish_faults()
        for e in control:
            await self._control(e)

    async def _publish_faults(self) -> None:
        assert self.rig.bus is not None
        faults = self.faults.faults(at=time.time(), reason=self.reason, sort_cables=True)
        ok = await self.rig.bus.publish(topics.fabric_faults(), encode(faults), retain=True)
        self.faults_pending = not ok

    async def _control(self, e: Event) -> None:
        rig = self.rig
        assert rig.broker is not None
        what = e.kind.rsplit("_", 1)[0]
        down = e.kind.endswith("_down")
        key = what if e.host is None else f"{what}:{e.host}"
        (self.control_down.add if down else self.control_down.discard)(key)
        if what == "broker":
            if down:
                await asyncio.to_thread(rig.broker.stop)
            else:
                await asyncio.to_thread(rig.broker.start)
                if rig.linkguard and (self.faults or self.faults_pending):
                    # the broker lost its retained messages: the operator's set comes back
                    assert rig.bus is not None  # linkguard runs: the observer's bus is up
                    await rig.bus.wait_connected(10)
                    await self._publish_faults()
            return
        if not rig.linkguard:
            return
        name = "service" if what == "service" else e.host
        assert name is not None
        if down:
            await asyncio.to_thread(rig.procs.kill, name)
        elif name == "service":
            rig.procs.start("service", ["topology", "serve", "-c", str(rig.cfgs["service"])])
        else:
            rig.procs.start(name, ["agent", "-c", str(rig.cfgs[name])])
