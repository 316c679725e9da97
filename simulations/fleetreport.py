"""The fleet report: what a generated fault timeline costs a training job, with and without
linkguard.

Consumes: a :class:`~linkguard.simulations.failures.FleetTimeline` and the engine's
:class:`~linkguard.simulations.engine.RunReport` of it. Produces: a :class:`FleetReport`
(:func:`fleet_report`) with a JSON form, a short text table and a PNG plot (:func:`plot`).
:func:`simulate` does it all: generate, replay, report.

The job model (one synchronous job on every GPU of the fabric; times in s):

- An *outage* is one down transition of one timeline entry (a link going down, one down of a
  flap, a leaf reboot taking its ports down). Its length is the longest down episode of the
  ports it took down (clipped at the end of the run).
- **Without linkguard**, an outage longer than NCCL's budget
  (:attr:`~linkguard.simulations.failures.FailureModel.nccl_budget_s`) interrupts the job: every
  GPU idles for detection + restart + half a checkpoint interval
  (:attr:`~linkguard.simulations.failures.FailureModel.restart_cost_s`); the restart is assumed
  to replace the broken host (spares), so how long the link then stays down does not matter. A
  shorter outage stalls the job for its length (at least ``blip_stall_floor_s``).
- **With linkguard**, an outage costs the job its time to reroute (the engine's: the service's
  solve schedule, at least ``reroute_floor_s``, the data-plane gap measured in the namespace
  lab) when every affected host keeps a usable rail, and nothing when no reroute was
  needed (the port was already held down). This assumes the job follows the rail map (issue 7:
  NCCL uses the GPU -> HCA assignment linkguard publishes); otherwise NCCL's own timeout applies
  and the job fares as without. An outage that leaves a host with no usable rail costs as
  without. The reduced bandwidth while a rail is out is not charged (see ``worst_nic_load``).
- An outage that starts while the job is restarting is absorbed (no second interruption); idle
  time is the union of the idle intervals, clipped at the end of the run.
"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from linkguard.simulations.engine import WALL0, RunReport, percentile, run
from linkguard.simulations.failures import (
    FailureModel,
    FleetTimeline,
    expected_counts,
    fleet_scenario,
)
from linkguard.simulations.scenario import Event, Expect, GenerateSpec, LoadedScenario, expand
from linkguard.topology.fabric import home_rails
from linkguard.topology.solver import Solver, nic_load

__all__ = [
    "REPORT_SCHEMA",
    "Cost",
    "FleetReport",
    "Outage",
    "cost_rows",
    "cost_with",
    "cost_without",
    "fleet_report",
    "outages",
    "plot",
    "quantiles",
    "simulate",
    "stderr_progress",
]

#: The ``schema`` of :meth:`FleetReport.to_dict`.
REPORT_SCHEMA = "linkguard.fleet-report/v1"

ASSUMES = (
    "one synchronous job on every GPU; with linkguard a link event costs the job its reroute "
    "time if every host keeps a usable rail, which assumes the job follows the rail map "
    "(issue 7) - otherwise NCCL's own timeout applies, as without; without linkguard a down "
    "past NCCL's budget restarts the job (detection + restart + half a checkpoint interval), "
    "a shorter one stalls it for its length; reduced bandwidth while a rail is out is not "
    "charged"
)


@dataclass(frozen=True)
class Outage:
    """One down transition: timeline ``entry`` and its ``kind``, ``at_s``, ``down_s`` (longest
    down episode of the ports it took down, clipped at the run's end; ``open``: still down at
    the end), ``ports`` taken down, ``isolated``: some host had no rail left up, and the
    engine's ``reroute_ms`` (None: no reroute needed)."""

    entry: int
    kind: str
    at_s: float
    down_s: float
    ports: int
    open: bool = False
    isolated: bool = False
    reroute_ms: float | None = None


@dataclass(frozen=True)
class Cost:
    """What outages cost the job. ``interruptions``: job restarts; ``stalls``: outages that
    paused it without a restart; ``idle_s``: union of the idle intervals (s, all GPUs idle);
    ``idle_gpu_hours`` = idle_s * GPUs / 3600; ``goodput`` = 1 - idle_s / duration;
    ``interruptions_per_1000_gpu_days``."""

    interruptions: int
    stalls: int
    idle_s: float
    idle_gpu_hours: float
    goodput: float
    interruptions_per_1000_gpu_days: float
    intervals: list[tuple[float, float]] = field(default_factory=list, repr=False)


def outages(loaded: LoadedScenario, events: list[Event] | None = None) -> list[Outage]:
    """The down transitions of ``loaded``'s timeline (``events``: its :func:`expand`, given to
    save the work), in time order, without ``reroute_ms``."""
    events = expand(loaded) if events is None else events
    fabric, sc = loaded.fabric, loaded.scenario
    end = sc.duration_s
    rails_of = {h.host: len(h.hcas) for h in fabric.hosts}
    down_rails: dict[str, set[int]] = {}
    since: dict[tuple[str, int], tuple[float, tuple[int, float]]] = {}
    episodes: dict[tuple[int, float], list[float]] = {}
    isolated: set[tuple[int, float]] = set()
    opened: set[tuple[int, float]] = set()
    i = 0
    while i < len(events):
        key = (events[i].entry, events[i].at_s)
        touched: set[str] = set()
        while i < len(events) and (events[i].entry, events[i].at_s) == key:
            e = events[i]
            i += 1
            if not e.kind.startswith("port_"):
                continue
            assert e.host is not None and e.rail is not None
            port = (e.host, e.rail)
            if e.kind == "port_down":
                if port not in since:
                    since[port] = (e.at_s, key)
                    down_rails.setdefault(e.host, set()).add(e.rail)
                    episodes.setdefault(key, [])
                    touched.add(e.host)
            elif port in since:
                t0, cause = since.pop(port)
                down_rails[e.host].discard(e.rail)
                episodes[cause].append(e.at_s - t0)
        if any(len(down_rails[h]) >= rails_of[h] for h in touched):
            isolated.add(key)
    for t0, cause in since.values():
        episodes[cause].append(end - t0)
        opened.add(cause)
    return [
        Outage(
            entry=k[0],
            kind=sc.timeline[k[0]].kind,
            at_s=k[1],
            down_s=round(max(d), 6),
            ports=len(d),
            open=k in opened,
            isolated=k in isolated,
        )
        for k, d in sorted(episodes.items(), key=lambda x: (x[0][1], x[0][0]))
    ]


def _cost(spans: list[tuple[float, float, bool]], gpus: int, duration_s: float) -> Cost:
    """``spans``: (start, length, is_restart) in time order."""
    intervals: list[tuple[float, float]] = []
    restarts: list[tuple[float, float]] = []
    interruptions = stalls = 0
    for start, length, restart in spans:
        if any(a <= start < b for a, b in restarts):
            continue  # the job is restarting anyway
        if length <= 0:
            continue
        iv = (start, min(start + length, duration_s))
        intervals.append(iv)
        if restart:
            interruptions += 1
            restarts.append(iv)
        else:
            stalls += 1
    idle = 0.0
    reach = -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            idle += b - max(a, reach)
            reach = b
    idle = round(idle, 6)
    return Cost(
        interruptions=interruptions,
        stalls=stalls,
        idle_s=idle,
        idle_gpu_hours=round(idle * gpus / 3600, 6),
        goodput=1 - idle / duration_s,
        interruptions_per_1000_gpu_days=interruptions / (gpus * duration_s / 86400) * 1000,
        intervals=intervals,
    )


def _no_linkguard(o: Outage, model: FailureModel) -> tuple[float, float, bool]:
    if o.down_s > model.nccl_budget_s:
        return (o.at_s, model.restart_cost_s, True)
    return (o.at_s, max(o.down_s, model.blip_stall_floor_s), False)


def cost_without(found: list[Outage], model: FailureModel, *, gpus: int, duration_s: float) -> Cost:
    """The job's cost of ``found`` without linkguard (module docstring)."""
    return _cost([_no_linkguard(o, model) for o in found], gpus, duration_s)


def cost_with(found: list[Outage], model: FailureModel, *, gpus: int, duration_s: float) -> Cost:
    """The job's cost of ``found`` with linkguard (module docstring): the reroute time of each
    rerouted outage, the without-linkguard cost of an outage that isolated a host."""
    spans = []
    for o in found:
        if o.isolated:
            spans.append(_no_linkguard(o, model))
        elif o.reroute_ms is not None:
            spans.append((o.at_s, max(o.reroute_ms / 1000, model.reroute_floor_s), False))
    return _cost(spans, gpus, duration_s)


def _percent(x: float) -> str:
    """A fraction as a percentage with 4 decimals, or as many as it takes to show that it is
    not 100 % (0.99999969 -> "99.99997 %"; only exactly 1 prints "100.0000 %")."""
    for places in range(4, 10):
        text = f"{100 * x:.{places}f}"
        if x == 1 or not text.startswith("100."):
            return f"{text} %"
    return f"{100 * x:.9f} %"


def cost_rows(w: Cost, wo: Cost) -> list[tuple[str, str, str]]:
    """The cost table's rows, (label, with linkguard, without), as the fleet report and
    ``linkguard report`` print them."""
    return [
        ("interruptions (job restarts)", f"{w.interruptions}", f"{wo.interruptions}"),
        (
            "  per 1,000 GPU-days",
            f"{w.interruptions_per_1000_gpu_days:.4f}",
            f"{wo.interruptions_per_1000_gpu_days:.4f}",
        ),
        ("stalls", f"{w.stalls}", f"{wo.stalls}"),
        ("job idle (s)", f"{w.idle_s:,.1f}", f"{wo.idle_s:,.1f}"),
        ("idled GPU-hours", f"{w.idle_gpu_hours:,.1f}", f"{wo.idle_gpu_hours:,.1f}"),
        ("goodput", _percent(w.goodput), _percent(wo.goodput)),
    ]


def quantiles(values: list[float]) -> dict[str, float | int | None]:
    """count, p50, p90, p99 and max of ``values`` (None each when empty)."""
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
    }


def worst_nic_load(loaded: LoadedScenario, found: list[Outage]) -> dict[str, object] | None:
    """NIC load (:func:`~linkguard.topology.solver.nic_load`: peer endpoints a host sends out
    of each local rail) at the worst moment: the outage after which one host had the most
    rails down. The plans are re-solved from the ports the scenario had down then (ports held
    down by damping at that moment are not included). None when nothing went down. Keys:
    ``host``, ``at_s``, ``rails_down``, ``load`` (rail -> endpoints), ``max_load``,
    ``baseline_max`` (the same host with every rail up) and ``ratio``."""
    if not found:
        return None
    events = expand(loaded)
    down: set[tuple[str, int]] = set()
    best: tuple[int, float, str, frozenset[tuple[str, int]]] | None = None
    wanted = {(o.entry, o.at_s) for o in found}
    for e in events:
        if e.kind == "port_down":
            down.add((e.host, e.rail))  # type: ignore[arg-type]
        elif e.kind == "port_up":
            down.discard((e.host, e.rail))  # type: ignore[arg-type]
        else:
            continue
        if (e.entry, e.at_s) in wanted and e.kind == "port_down":
            per_host = Counter(h for h, _ in down)
            host, n = min(per_host.items(), key=lambda x: (-x[1], x[0]))
            if best is None or n > best[0]:
                best = (n, e.at_s, host, frozenset(down))
    if best is None:
        return None
    n, at_s, host, snapshot = best
    fabric = loaded.fabric
    unusable: dict[str, set[int]] = {}
    for h, r in snapshot:
        unusable.setdefault(h, set()).add(r)
    per_rail = Counter(r for p in fabric.hosts if p.host != host for r in home_rails(p))
    baseline = Solver(fabric, {}).plan(host, epoch=1, now=WALL0)
    solver = Solver(fabric, {h: frozenset(r) for h, r in unusable.items()})
    load = nic_load(solver.plan(host, epoch=1, now=WALL0), per_rail)
    base = max(nic_load(baseline, per_rail).values(), default=0.0)
    top = max(load.values(), default=0.0)
    return {
        "host": host,
        "at_s": at_s,
        "rails_down": sorted(unusable[host]),
        "load": {str(k): round(v, 3) for k, v in load.items()},
        "max_load": round(top, 3),
        "baseline_max": round(base, 3),
        "ratio": round(top / base, 4) if base else None,
    }


@dataclass
class FleetReport:
    """One fleet run (module docstring). :meth:`to_dict` is the JSON form (schema
    :data:`REPORT_SCHEMA`), :meth:`text` the short table."""

    hosts: int
    rails: int
    gpus: int
    duration_s: float
    seed: int
    model: FailureModel
    counts: dict[str, int]
    expected: dict[str, float]
    dropped: int
    entries: int
    events: int
    outages: list[Outage]
    with_linkguard: Cost
    without_linkguard: Cost
    reroutes: int
    solves: int
    time_to_reroute_ms: dict[str, float | int | None]
    needless_reroutes: int
    worst_nic_load: dict[str, object] | None
    oracle: dict[str, object]
    wall_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        m = self.model

        def cost(c: Cost) -> dict[str, object]:
            d = asdict(c)
            d.pop("intervals")
            return d

        return {
            "schema": REPORT_SCHEMA,
            "fabric": {"hosts": self.hosts, "rails": self.rails, "gpus": self.gpus},
            "duration_s": self.duration_s,
            "days": self.duration_s / 86400,
            "seed": self.seed,
            "model": {
                **asdict(m),
                "nccl_budget_s": m.nccl_budget_s,
                "restart_cost_s": m.restart_cost_s,
                "ride_out_s": m.ride_out_s,
                "leaf_reboots_per_gpu_day": m.leaf_reboot_rate * 86400,
                "nic_losses_per_gpu_day": m.nic_loss_rate * 86400,
                "link_faults_per_link_day": m.link_fault_rate * 86400,
            },
            "faults": {
                "counts": self.counts,
                "expected": {k: round(v, 4) for k, v in self.expected.items()},
                "dropped": self.dropped,
                "timeline_entries": self.entries,
                "events": self.events,
                "outages": len(self.outages),
            },
            "with_linkguard": cost(self.with_linkguard),
            "without_linkguard": cost(self.without_linkguard),
            "assumes": ASSUMES,
            "reroutes": self.reroutes,
            "solves": self.solves,
            "time_to_reroute_ms": self.time_to_reroute_ms,
            "needless_reroutes": self.needless_reroutes,
            "worst_nic_load": self.worst_nic_load,
            "oracle": self.oracle,
            "wall_s": self.wall_s,
            "outages": [asdict(o) for o in self.outages],
        }

    def text(self) -> str:
        w, wo = self.with_linkguard, self.without_linkguard
        days = self.duration_s / 86400
        kinds = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in self.counts.items())
        rows = cost_rows(w, wo)
        lines = [
            f"fleet: {self.hosts} hosts x {self.rails} rails ({self.gpus:,} GPUs), {days:g} days, "
            f"seed {self.seed}: {kinds} ({self.dropped} dropped as overlapping), "
            f"{len(self.outages)} outages",
            f"  {'':30} {'with linkguard':>16} {'without':>12}",
        ]
        lines += [f"  {a:30} {b:>16} {c:>12}" for a, b, c in rows]
        t = self.time_to_reroute_ms
        ttr = (
            f"p50 {t['p50']:g} ms, p99 {t['p99']:g} ms, max {t['max']:g} ms"
            if t["count"]
            else "none"
        )
        lines.append(
            f"  reroutes {self.reroutes} ({self.solves} solves); time to solve {ttr} (each "
            f"stall charged at least {self.model.reroute_floor_s * 1000:g} ms, the data-plane "
            "gap measured in the namespace lab)"
        )
        lines.append(
            f"  needless reroutes: {self.needless_reroutes} (downs shorter than one RC "
            f"retransmit timeout, {self.model.ride_out_s:.2f} s, that still moved traffic)"
        )
        n = self.worst_nic_load
        lines.append(
            f"  worst NIC load: {n['host']} with rails {n['rails_down']} down (day "
            f"{n['at_s'] / 86400:.2f}): {n['max_load']:g} peer endpoints on its busiest NIC vs "
            f"{n['baseline_max']:g} with all rails up ({n['ratio']:g}x)"
            if n
            else "  worst NIC load: no outage"
        )
        o = self.oracle
        lines.append(
            f"  oracle: {o['settles']} settles, {o['mismatches']} mismatches"
            if o["run"]
            else "  oracle: not run (--oracle to check reachability after every solve)"
        )
        lines.append(
            f"  NCCL budget {self.model.nccl_budget_s:.1f} s, restart cost "
            f"{self.model.restart_cost_s:,.0f} s"
        )
        lines += textwrap.wrap(
            f"assumes: {ASSUMES}", 96, initial_indent="  ", subsequent_indent="    "
        )
        if self.wall_s is not None:
            lines.append(f"  wall time {self.wall_s:.1f} s")
        return "\n".join(lines) + "\n"


def fleet_report(
    timeline: FleetTimeline, report: RunReport, *, wall_s: float | None = None
) -> FleetReport:
    """Combine the generated ``timeline`` and the engine's ``report`` of it (module
    docstring)."""
    loaded, model = timeline.loaded, timeline.model
    sc, fabric = loaded.scenario, loaded.fabric
    events = expand(loaded)
    timing = {(f.entry, f.at_s): f.reroute_ms for f in report.faults}
    found = [replace(o, reroute_ms=timing.get((o.entry, o.at_s))) for o in outages(loaded, events)]
    gpus = sum(len(h.endpoints) for h in fabric.hosts)
    kw = {"gpus": gpus, "duration_s": sc.duration_s}
    rerouted = [o.reroute_ms for o in found if o.reroute_ms is not None]
    return FleetReport(
        hosts=len(fabric.hosts),
        rails=len(fabric.rails),
        gpus=gpus,
        duration_s=sc.duration_s,
        seed=sc.seed,
        model=model,
        counts=timeline.counts,
        expected=expected_counts(model, fabric, sc.duration_s),
        dropped=timeline.dropped,
        entries=len(sc.timeline),
        events=len(events),
        outages=found,
        with_linkguard=cost_with(found, model, **kw),
        without_linkguard=cost_without(found, model, **kw),
        reroutes=report.reroutes,
        solves=report.solves,
        time_to_reroute_ms=quantiles(rerouted),
        needless_reroutes=sum(
            1 for o in found if o.reroute_ms is not None and o.down_s < model.ride_out_s
        ),
        worst_nic_load=worst_nic_load(loaded, found),
        oracle={
            "run": sc.expect.reachability,
            "settles": report.settles,
            "mismatches": report.mismatch_count,
            "first": report.mismatches[:5],
        },
        wall_s=wall_s,
    )


def plot(rep: FleetReport, path: Path | str) -> None:
    """Write a PNG to ``path``: cumulative idled GPU-hours over the run with and without
    linkguard, and every outage's length against NCCL's budget and the ride-out threshold.
    Raises OSError when the file cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = rep.duration_s / 86400
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for cost, label, color in (
        (rep.without_linkguard, "without linkguard", "tab:red"),
        (rep.with_linkguard, "with linkguard", "tab:green"),
    ):
        xs, ys, total = [0.0], [0.0], 0.0
        for a, b in sorted(cost.intervals):
            xs += [a / 86400, b / 86400]
            ys += [total, total + (b - a) * rep.gpus / 3600]
            total = ys[-1]
        xs.append(days)
        ys.append(total)
        ax1.plot(xs, ys, label=f"{label}: {total:,.0f} GPU-h", color=color)
    ax1.set_xlabel("day")
    ax1.set_ylabel("idled GPU-hours (cumulative)")
    ax1.set_title(f"{rep.hosts} hosts x {rep.rails} rails, {days:g} days, seed {rep.seed}")
    ax1.legend(loc="upper left")
    ax1.grid(alpha=0.3)
    markers = {"link_down": "o", "flap": "x", "leaf_reboot": "s"}
    for kind, marker in markers.items():
        sel = [o for o in rep.outages if o.kind == kind]
        if sel:
            ax2.scatter(
                [o.at_s / 86400 for o in sel],
                [max(o.down_s, 1e-3) for o in sel],
                marker=marker,
                label=f"{kind} ({len(sel)})",
            )
    ax2.set_yscale("log")
    ax2.axhline(rep.model.nccl_budget_s, color="tab:red", ls="--", label="NCCL budget")
    ax2.axhline(rep.model.ride_out_s, color="tab:gray", ls=":", label="one retransmit timeout")
    ax2.set_xlim(0, days)
    ax2.set_xlabel("day")
    ax2.set_ylabel("outage length (s)")
    ax2.set_title("outages (link downs include NIC losses)")
    ax2.legend(loc="best", fontsize="small")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)


def simulate(
    spec: GenerateSpec,
    *,
    duration_s: float,
    seed: int,
    model: FailureModel | None = None,
    oracle: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[FleetTimeline, FleetReport]:
    """Generate a fault timeline (:func:`~linkguard.simulations.failures.fleet_scenario`),
    replay it through the engine (with the oracle after every solve when ``oracle``) and
    report. ``progress`` gets a line per phase. Raises ValueError for bad parameters."""
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    say(f"generating {spec.hosts} x {spec.rails} fabric and fault timeline")
    ft = fleet_scenario(spec, duration_s=duration_s, seed=seed, model=model)
    sc = ft.loaded.scenario.model_copy(update={"expect": Expect(reachability=oracle)})
    ft = replace(ft, loaded=replace(ft.loaded, scenario=sc))
    say(
        f"replaying {len(sc.timeline)} timeline entries through the engine"
        + (" with the oracle" if oracle else "")
    )

    def replayed(t: float) -> None:
        done = t / duration_s if duration_s else 1.0
        bar = "#" * round(done * 20)
        say(f"replay [{bar:<20}] {done:4.0%} (day {t / 86_400:.1f} of {duration_s / 86_400:g})")

    report = run(ft.loaded, progress=replayed if progress else None)
    say("costing outages, re-solving the worst moment")
    rep = fleet_report(ft, report)
    rep.wall_s = round(time.perf_counter() - t0, 3)
    return ft, rep


def stderr_progress(enabled: bool | None = None) -> Callable[[str], None] | None:
    """A progress callback writing ``fleet: <phase> (<elapsed> s)`` lines to stderr, or None
    when ``enabled`` is False (None: only when stderr is a terminal)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"fleet: {msg} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    return say
