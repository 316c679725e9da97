"""A failure model from published rates, turned into a seeded fault timeline for a fabric.

Consumes: a generated fabric's parameters (:class:`~linkguard.simulations.scenario.GenerateSpec`),
a duration and a seed. Produces: a
:class:`~linkguard.simulations.scenario.LoadedScenario` whose timeline (``link_down`` /
``link_up`` pairs, ``flap`` and ``leaf_reboot`` entries, the scenario models) the engine
(:func:`linkguard.simulations.engine.run`) replays (:func:`fleet_scenario`).

The rates and costs are the fields of :class:`FailureModel`; each names its source. What they
give at 2,048 hosts x 8 rails (16,384 GPUs and host links) over 30 days, on average: 9.3 host
link faults (HPN's rate; half of them flaps), 3.9 NIC losses and 10.1 leaf reboots (Llama 3's
counts scaled per GPU-day), about 23 timeline entries.

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

_MONTH_S = 30 * 86400.0
_DAY_S = 86400.0


@dataclass(frozen=True)
class FailureModel:
    """Failure rates and job costs. Times in seconds. Every field says where it comes from;
    "assumption" marks the ones no cited source gives (change them for your fleet)."""

    llama3_gpus: int = 16384
    """Llama 3 training cluster size (GPUs). Meta, "The Llama 3 Herd of Models" (2024), 3.3.4."""
    llama3_days: float = 54.0
    """Length of the Llama 3 snapshot period (days). Meta 2024, 3.3.4 / Table 5."""
    llama3_interruptions: int = 419
    """Unexpected job interruptions in that period (all causes). Meta 2024, Table 5."""
    llama3_network: int = 35
    """Of those, "Network Switch/Cable". Meta 2024, Table 5."""
    llama3_nic: int = 7
    """Of those, "NIC". Meta 2024, Table 5."""
    link_failures_per_link_month: float = 0.00057
    """Fraction of NIC-ToR links that fail per month (0.057 %). Alibaba, "Alibaba HPN: A Data
    Center Network for Large Language Model Training", SIGCOMM 2024, section 2."""
    flap_fraction: float = 0.5
    """Share of the host link faults (at HPN's rate) that are flaps, short downs that come back
    by themselves, rather than downs that wait for a repair. Assumption: HPN (section 2) reports
    link flaps as frequent and each halting training (> 9 s), without a per-link rate."""
    flap_period_s: tuple[float, float] = (1.0, 6.0)
    """A flap's down/up period, uniform in this range (down half of it: 0.5-3 s per down).
    Assumption (an IB port retrains in seconds, OpenSM sweeps every 10 s)."""
    flap_cycles: tuple[int, int] = (1, 5)
    """Down/up cycles per flap, uniform integers in this range. Assumption."""
    repair_median_s: float = 1800.0
    """A host link down that is not a flap stays down for a lognormal time with this median
    (30 min: reseat or swap a cable/transceiver). Assumption."""
    repair_sigma: float = 1.2
    """Sigma of that lognormal (p10 6.4 min, p90 2.6 h). Assumption."""
    nic_repair_median_s: float = 4 * 3600.0
    """A lost NIC (its rail port down) comes back after a lognormal time with this median (4 h:
    drain the host, swap the card). Assumption."""
    nic_repair_sigma: float = 0.8
    """Sigma of that lognormal. Assumption."""
    leaf_reboot_down_s: float = 300.0
    """How long a rebooting leaf keeps its host ports down (5 min). Assumption (a switch
    reload takes minutes)."""
    nccl_ib_timeout: int = 20
    """``NCCL_IB_TIMEOUT`` (NCCL's default): one RC retransmit timeout is
    4.096 us * 2**timeout = 4.29 s. NCCL environment variable docs."""
    nccl_ib_retry_cnt: int = 7
    """``NCCL_IB_RETRY_CNT`` (NCCL's default): retries before the QP errors and the job fails.
    NCCL environment variable docs. Budget: retry_cnt * 4.29 s = 30.1 s."""
    restart_s: float = 750.0
    """Time to restart the job after an interruption, mid-point of the issue's 5-20 min
    (reschedule, reload, re-init NCCL). Assumption within the issue's range."""
    checkpoint_interval_s: float = 1800.0
    """Checkpoint interval; a restart loses half of it on average. Assumption (30 min)."""
    blip_stall_floor_s: float = 0.0
    """Without linkguard, a down shorter than NCCL's budget stalls the job for
    max(its duration, this). HPN (SIGCOMM 2024, section 2) measured > 9 s of halted training per
    single-ToR flap; 0 (the blip's own duration, as the issue's model says) keeps the
    comparison conservative. Set 9 for HPN's figure."""
    reroute_floor_s: float = 0.05
    """With linkguard, a rerouted outage stalls the job for max(the engine's time to reroute,
    this). The engine's time is the service's solve schedule only (its plans apply at once);
    this is the data-plane gap measured end to end on real kernels: p99 48.4 ms of the flow into
    the failed rail over 50 single link faults (``benchmarks/lab_gap.py``, 4 hosts x 4 rails,
    real agents, service and Mosquitto, 2 cores), rounded up to 50 ms."""

    def __post_init__(self) -> None:
        if not 0 <= self.flap_fraction <= 1:
            raise ValueError(f"flap_fraction must be in [0, 1], got {self.flap_fraction}")
        lo, hi = self.flap_period_s
        if not 0.02 < lo <= hi:
            raise ValueError(f"flap_period_s must be 0.02 < lo <= hi, got {self.flap_period_s}")
        if not 1 <= self.flap_cycles[0] <= self.flap_cycles[1]:
            raise ValueError(f"flap_cycles must be 1 <= lo <= hi, got {self.flap_cycles}")
        positive = {
            "repair_median_s": self.repair_median_s,
            "nic_repair_median_s": self.nic_repair_median_s,
            "leaf_reboot_down_s": self.leaf_reboot_down_s,
            "llama3_gpus": self.llama3_gpus,
            "llama3_days": self.llama3_days,
        }
        bad = [k for k, v in positive.items() if not (math.isfinite(v) and v > 0)]
        bad += [
            k
            for k, v in {
                "repair_sigma": self.repair_sigma,
                "nic_repair_sigma": self.nic_repair_sigma,
                "link_failures_per_link_month": self.link_failures_per_link_month,
                "restart_s": self.restart_s,
                "checkpoint_interval_s": self.checkpoint_interval_s,
                "blip_stall_floor_s": self.blip_stall_floor_s,
                "reroute_floor_s": self.reroute_floor_s,
            }.items()
            if not (math.isfinite(v) and v >= 0)
        ]
        if bad:
            raise ValueError(f"must be finite and positive: {', '.join(bad)}")

    # -- derived rates -------------------------------------------------------------------------
    @property
    def retransmit_timeout_s(self) -> float:
        """One RC retransmit timeout, 4.096 us * 2**NCCL_IB_TIMEOUT (4.29 s at 20)."""
        return 4.096e-6 * 2**self.nccl_ib_timeout

    @property
    def nccl_budget_s(self) -> float:
        """How long a link may stay down before NCCL fails the job:
        NCCL_IB_RETRY_CNT retransmit timeouts (30.1 s at 20 / 7)."""
        return self.nccl_ib_retry_cnt * self.retransmit_timeout_s

    @property
    def ride_out_s(self) -> float:
        """A down shorter than one retransmit timeout is recovered by RC's own retry; moving
        traffic off it was needless (the report's ``needless_reroutes``)."""
        return self.retransmit_timeout_s

    @property
    def restart_cost_s(self) -> float:
        """Job time lost per interruption: detection + restart + half a checkpoint interval
        (30.1 + 750 + 900 = 1680 s by default)."""
        return self.nccl_budget_s + self.restart_s + self.checkpoint_interval_s / 2

    @property
    def link_fault_rate(self) -> float:
        """Host link faults (downs and flaps) per host link per second (HPN)."""
        return self.link_failures_per_link_month / _MONTH_S

    @property
    def nic_loss_rate(self) -> float:
        """NIC losses per GPU per second: Llama 3's NIC interruptions per GPU-second."""
        return self.llama3_nic / (self.llama3_gpus * self.llama3_days * _DAY_S)

    @property
    def leaf_reboot_rate(self) -> float:
        """Leaf reboots per GPU per second, derived: Llama 3's switch/cable interruptions minus
        the cable failures HPN's rate predicts on its cluster (one NIC-ToR link per GPU:
        16,384 * 0.057 % * 54/30 = 16.8 of 35), per GPU-second. A leaf reboot stands for every
        switch failure (a rail-optimized leaf serves a fixed number of GPUs, so per GPU is per
        leaf). Never negative."""
        cables = self.llama3_gpus * self.link_failures_per_link_month * self.llama3_days * 86400
        cables /= _MONTH_S
        return max(self.llama3_network - cables, 0.0) / (
            self.llama3_gpus * self.llama3_days * _DAY_S
        )


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
