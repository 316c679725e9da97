"""A failure model from published rates, turned into a seeded fault timeline for a fabric.

Consumes: a generated fabric's parameters (:class:`~linkguard.simulations.scenario.GenerateSpec`),
a duration and a seed. Produces: a
:class:`~linkguard.simulations.scenario.LoadedScenario` whose timeline (``link_down`` /
``link_up`` pairs, ``flap`` and ``leaf_reboot`` entries, the scenario models) the engine
(:func:`linkguard.simulations.engine.run`) replays (:func:`fleet_scenario`).

The rates and costs are the fields of :class:`~linkguard.failuremodel.FailureModel` (defined in
``linkguard/`` because the ledger report reads it too; re-exported here); each names its
source. What they give at 2,048 hosts x 8 rails (16,384 GPUs and host links) over 30 days, on
average: 9.3 host link faults (HPN's rate; half of them flaps), 3.9 NIC losses and 10.1 leaf
reboots (Llama 3's counts scaled per GPU-day), about 23 timeline entries.

Faults are drawn as independent Poisson processes (exponential gaps; one generator per fault
class, seeded with ``f"{seed}/{class}"``, so changing one rate does not move the others) and
placed uniformly on the fabric's host ports or leaves. A fault that would overlap another on
the same port or leaf (the scenario checks refuse that) is dropped and counted in
:attr:`FleetTimeline.dropped`; at these rates that is rare.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from linkguard.failuremodel import FailureModel
from linkguard.simulations.scenario import (
    SCHEMA,
    GenerateSpec,
    LoadedScenario,
    Scenario,
    ScenarioError,
    _check,
    _leaf_ports,
)
from linkguard.topology.fabric import Fabric
from linkguard.topology.generator import generate_rail_optimized

__all__ = ["FailureModel", "FleetTimeline", "expected_counts", "fleet_scenario"]


def expected_counts(model: FailureModel, fabric: Fabric, duration_s: float) -> dict[str, float]:
    """Mean number of faults per class for ``fabric`` over ``duration_s`` s: ``link_downs``,
    ``flaps``, ``nic_losses``, ``leaf_reboots`` (before dropping overlaps)."""
    links = sum(len(h.hcas) for h in fabric.hosts)
    gpus = sum(len(h.endpoints) for h in fabric.hosts)
    faults = model.link_fault_rate * links * duration_s
    return {
        "link_downs": faults * (1 - model.flap_fraction),
        "flaps": faults * model.flap_fraction,
        "nic_losses": model.nic_loss_rate * gpus * duration_s,
        "leaf_reboots": model.leaf_reboot_rate * gpus * duration_s,
    }


@dataclass
class FleetTimeline:
    """A generated scenario and what went into it: ``counts`` of kept faults per class (keys
    of :func:`expected_counts`), ``dropped`` faults (overlapping an earlier one)."""

    loaded: LoadedScenario
    model: FailureModel
    counts: dict[str, int] = field(default_factory=dict)
    dropped: int = 0


def _arrivals(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    """Poisson arrival times (s) of ``rate`` per second in [0, duration_s)."""
    out: list[float] = []
    if rate <= 0:
        return out
    t = rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def fleet_scenario(
    spec: GenerateSpec,
    *,
    duration_s: float,
    seed: int,
    model: FailureModel | None = None,
    name: str = "fleet",
    path: Path | str = "<fleet>",
    debounce_ms: float | None = None,
) -> FleetTimeline:
    """A seeded random fault timeline for the fabric ``spec`` generates, over ``duration_s``
    s at ``model``'s rates (module docstring), as a validated scenario the engine runs.
    Deterministic: the same spec, duration, seed and model give the same timeline. Entry
    times are rounded to the millisecond. A repair that would end after ``duration_s``
    leaves the port down (a ``link_down`` without its ``link_up``); flaps and leaf reboots
    are shortened to fit.

    Raises ValueError for a non-positive duration or a bad model, and
    :class:`~linkguard.simulations.scenario.ScenarioError` should the timeline not pass the
    scenario checks (a bug)."""
    model = model or FailureModel()
    fabric = generate_rail_optimized(**spec.model_dump())
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    end = duration_s
    ports = [(h.host, c.rail) for h in fabric.hosts for c in sorted(h.hcas, key=lambda c: c.rail)]
    gpus = sum(len(h.endpoints) for h in fabric.hosts)
    leaf_ports = _leaf_ports(fabric)
    leaves = sorted(leaf_ports)
    rng = {k: random.Random(f"{seed}/{k}") for k in ("link", "nic", "leaf")}

    # (at_s, class, draw) candidates; the draws are taken now so that dropping one changes
    # nothing else
    cands: list[tuple[float, str, tuple]] = []
    for t in _arrivals(rng["link"], model.link_fault_rate * len(ports), end):
        r = rng["link"]
        port = ports[r.randrange(len(ports))]
        if r.random() < model.flap_fraction:
            period = r.uniform(*model.flap_period_s)
            cycles = r.randint(*model.flap_cycles)
            cands.append((t, "flaps", (port, period, cycles)))
        else:
            down = r.lognormvariate(math.log(model.repair_median_s), model.repair_sigma)
            cands.append((t, "link_downs", (port, down)))
    for t in _arrivals(rng["nic"], model.nic_loss_rate * gpus, end):
        r = rng["nic"]
        port = ports[r.randrange(len(ports))]
        down = r.lognormvariate(math.log(model.nic_repair_median_s), model.nic_repair_sigma)
        cands.append((t, "nic_losses", (port, down)))
    if leaves:
        for t in _arrivals(rng["leaf"], model.leaf_reboot_rate * gpus, end):
            cands.append((t, "leaf_reboots", (leaves[rng["leaf"].randrange(len(leaves))],)))
    cands.sort(key=lambda c: (c[0], c[1]))

    held: dict[tuple, list[tuple[float, float]]] = {}
    timeline: list[dict] = []
    counts = dict.fromkeys(("link_downs", "flaps", "nic_losses", "leaf_reboots"), 0)
    dropped = 0

    def free(keys: list[tuple], start: float, stop: float) -> bool:
        return all(not (s <= stop and start <= e) for k in keys for s, e in held.get(k, []))

    for t, cls, draw in cands:
        at = round(t, 3)
        entries: list[dict] = []
        keys: list[tuple]  # the resources the draw holds: ("port", host, rail), ("leaf", leaf)
        if cls == "flaps":
            (host, rail), period, cycles = draw
            period = round(period, 3)
            cycles = min(cycles, math.floor((end - at) / period))
            if cycles < 1:
                continue
            keys, stop = [("port", host, rail)], at + cycles * period
            entries.append(
                {
                    "at_s": at,
                    "kind": "flap",
                    "host": host,
                    "rail": rail,
                    "period_s": period,
                    "duration_s": round(cycles * period, 6),
                }
            )
        elif cls == "leaf_reboots":
            (leaf,) = draw
            down = min(model.leaf_reboot_down_s, round(end - at, 3))
            if down <= 0:
                continue
            keys = [("leaf", leaf)] + [("port", h, r) for h, r, _, _ in leaf_ports[leaf]]
            stop = at + down
            entries.append({"at_s": at, "kind": "leaf_reboot", "leaf": leaf, "down_s": down})
        else:
            (host, rail), down = draw
            up = round(at + max(down, 0.001), 3)
            keys, stop = [("port", host, rail)], (up if up < end else math.inf)
            entries.append({"at_s": at, "kind": "link_down", "host": host, "rail": rail})
            if up < end:
                entries.append({"at_s": up, "kind": "link_up", "host": host, "rail": rail})
        if not free(keys, at, stop):
            dropped += 1
            continue
        for k in keys:
            held.setdefault(k, []).append((at, stop))
        counts[cls] += 1
        timeline += entries
    timeline.sort(key=lambda e: e["at_s"])
    scenario = Scenario.model_validate(
        {
            "schema": SCHEMA,
            "name": name,
            "description": (
                f"Faults at published rates (linkguard.simulations.failures), seed {seed}: "
                + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items())
                + "."
            ),
            "fabric": {"generate": spec.model_dump(exclude_none=True)},
            "duration_s": duration_s,
            "seed": seed,
            "debounce_ms": debounce_ms,
            "expect": {"reachability": True},
            "timeline": timeline,
        }
    )
    problems = _check(scenario, fabric)
    if problems:
        raise ScenarioError(f"{path}: generated timeline is invalid: {'; '.join(problems[:5])}")
    loaded = LoadedScenario(path=Path(path), scenario=scenario, fabric=fabric)
    return FleetTimeline(loaded=loaded, model=model, counts=counts, dropped=dropped)
