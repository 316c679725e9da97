"""The host's rail map as a job sees it, and its changes: the one document that both the
job-facing hooks (:mod:`linkguard.agent.hooks`) and the local subscription socket
(:mod:`linkguard.agent.localsub`) hand out.

Consumes: the plan in place (None before the first one), the local ports down whose
precomputed backups are overlaid (the fast path), the host's rails by port (``"hca/port" ->
rail``, the inventory) and the monitor's :class:`~linkguard.models.PortState`s. Produces:
a :class:`RailView` (pure, from those) and, through :class:`RailChanges`, one
``linkguard.rail-change/v1`` JSON document each time what a job cares about changes (the
GPU -> HCA map, the rails lost, the ports held down, suppressed, degraded or down); a new
plan epoch that changes none of it is not a change.

The document (keys always present; lists sorted; GPU indices as strings, JSON object keys)::

    {"schema": "linkguard.rail-change/v1", "seq": 3, "host": "gpu017", "epoch": 41,
     "time": 1764560000.12, "reason": "fast_path",
     "rails_total": 8, "rails_usable": [0, 1, 2, 4, 5, 6, 7], "rails_lost": [3],
     "rail_map_before": {"0": "mlx5_0:1", ..., "3": "mlx5_3:1"},
     "rail_map_after": {"0": "mlx5_0:1", ..., "3": "mlx5_4:1"},
     "ports_down": ["mlx5_3/1"], "ports_held_down": [], "ports_suppressed": [],
     "ports_degraded": [], "fast_path_ports": ["mlx5_3/1"]}

``seq`` counts changes from 1 per agent run; ``epoch`` is the applied plan's (None before
one); ``time`` is wall-clock seconds; ``reason`` is ``plan`` (a plan from the service was
applied), ``fast_path`` (a local port went down and its precomputed backup was applied),
``port_event`` (a port changed status without a route change) or ``start`` (the plan restored
from the state dir when the agent started). ``rail_map_before`` is None on the first change.
The NCCL settings for a communicator built now (``NCCL_IB_HCA`` without held-down, suppressed
or degraded ports) are in the agent's ``nccl.env`` / ``linkguard nccl env``
(:mod:`linkguard.nccl`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from linkguard.models import Plan, PortState, PortStatus, RailAssignment

__all__ = ["SCHEMA", "RailChanges", "RailView", "assignments", "degraded_ports", "rail_view"]

SCHEMA = "linkguard.rail-change/v1"

_NOT_IN_USE = {
    PortStatus.DOWN: "down",
    PortStatus.HELD_DOWN: "held_down",
    PortStatus.SUPPRESSED: "suppressed",
    PortStatus.DEGRADED: "degraded",
}


@dataclass(frozen=True)
class RailView:
    """What the host's GPUs can use now. ``gpus``: GPU index (str) -> ``"hca:port"``;
    ``rails``: every rail of the host; ``lost``: the rails out of use (their port is down, held
    down, suppressed or degraded, a fast path covers it, or the plan moved a GPU off it); port
    lists hold ``"hca/port"`` keys."""

    epoch: int | None
    gpus: Mapping[str, str]
    rails: tuple[int, ...]
    lost: tuple[int, ...]
    down: tuple[str, ...] = ()
    held_down: tuple[str, ...] = ()
    suppressed: tuple[str, ...] = ()
    degraded: tuple[str, ...] = ()
    fast_path_ports: tuple[str, ...] = ()

    @property
    def usable(self) -> tuple[int, ...]:
        return tuple(r for r in self.rails if r not in self.lost)

    def same_as(self, other: RailView | None) -> bool:
        """True when ``other`` says the same to a job (the epoch aside)."""
        return other is not None and (
            dict(self.gpus),
            self.rails,
            self.lost,
            self.down,
            self.held_down,
            self.suppressed,
            self.degraded,
            self.fast_path_ports,
        ) == (
            dict(other.gpus),
            other.rails,
            other.lost,
            other.down,
            other.held_down,
            other.suppressed,
            other.degraded,
            other.fast_path_ports,
        )


def degraded_ports(states: Iterable[PortState]) -> list[str]:
    """Ports the monitor calls degraded (status ``degraded``: error counters, or back slower)
    and up ports running slower than the fastest up port of the host with the same link layer
    (one that came back at 200 Gb/s next to 400 Gb/s ones; ``rate_gbps`` from sysfs ``rate``),
    sorted: the rule :func:`linkguard.nccl.port_verdicts` applies on the host."""
    states = list(states)
    up = [s for s in states if s.status == PortStatus.UP and s.rate_gbps]
    best: dict[object, float] = {}
    for s in up:
        best[s.link_layer] = max(best.get(s.link_layer, 0.0), s.rate_gbps or 0.0)
    slow = {s.key for s in up if (s.rate_gbps or 0.0) < best[s.link_layer]}
    return sorted(slow | {s.key for s in states if s.status == PortStatus.DEGRADED})


def assignments(
    plan: Plan, locally_down: Iterable[str]
) -> tuple[list[RailAssignment], tuple[str, ...]]:
    """The GPU -> port assignments of ``plan`` with the backups of ``locally_down`` ports
    overlaid (as :func:`~linkguard.agent.plans.effective` does, without the routes: cheap on
    any plan size), by GPU, and the ports whose backups are overlaid, sorted."""
    down = set(locally_down)
    backups = sorted((b for b in plan.backups if f"{b.hca}/{b.port}" in down), key=lambda b: b.rail)
    by_gpu = {a.gpu: a for a in plan.rail_assignments}
    for b in backups:
        for a in b.rail_assignments:
            by_gpu[a.gpu] = a
    fast = tuple(sorted(f"{b.hca}/{b.port}" for b in backups))
    return [by_gpu[g] for g in sorted(by_gpu)], fast


def rail_view(
    *,
    plan: Plan | None,
    locally_down: Iterable[str] = (),
    rails: Mapping[str, int],
    states: Iterable[PortState],
) -> RailView:
    """The :class:`RailView` of ``plan`` (None: no plan yet, no GPU mapped) with the fast path
    of the ``locally_down`` ports, on a host whose ports serve ``rails`` (``"hca/port" ->
    rail``), its ports as ``states`` say. Pure."""
    states = list(states)
    by_status: dict[str, list[str]] = {name: [] for name in _NOT_IN_USE.values()}
    lost: set[int] = set()
    for s in states:
        name = _NOT_IN_USE.get(s.status)
        if name is not None:
            by_status[name].append(s.key)
            if s.key in rails:
                lost.add(rails[s.key])
    gpus: dict[str, str] = {}
    fast: tuple[str, ...] = ()
    if plan is not None:
        used, fast = assignments(plan, locally_down)
        for a in used:
            gpus[str(a.gpu)] = f"{a.hca}:{a.port}"
            if a.rail != a.home_rail:
                lost.add(a.home_rail)
        lost.update(rails[k] for k in fast if k in rails)
    return RailView(
        epoch=plan.epoch if plan is not None else None,
        gpus=dict(sorted(gpus.items(), key=lambda kv: int(kv[0]))),
        rails=tuple(sorted(set(rails.values()) | lost)),
        lost=tuple(sorted(lost)),
        down=tuple(sorted(by_status["down"])),
        held_down=tuple(sorted(by_status["held_down"])),
        suppressed=tuple(sorted(by_status["suppressed"])),
        degraded=tuple(degraded_ports(states)),
        fast_path_ports=fast,
    )


class RailChanges:
    """The change documents of one host, in order. Not thread-safe (the agent's event loop)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.seq = 0
        self.view: RailView | None = None  # the last one that made a change
        self.last: dict[str, Any] | None = None  # the last change document

    def observe(self, view: RailView, *, now: float, reason: str) -> dict[str, Any] | None:
        """The change document for ``view`` (``now``: wall-clock seconds; ``reason`` as the
        module says), or None when it says the same as the last one."""
        if view.same_as(self.view):
            return None
        before = dict(self.view.gpus) if self.view is not None else None
        self.seq += 1
        self.view = view
        self.last = document(self.host, view, seq=self.seq, now=now, reason=reason, before=before)
        return self.last

    def current(self, *, now: float) -> dict[str, Any]:
        """The last change document, or (none yet) one of an empty view with ``seq`` 0 and
        reason ``none``: what a new subscriber gets first."""
        if self.last is not None:
            return self.last
        empty = RailView(epoch=None, gpus={}, rails=(), lost=())
        return document(self.host, empty, seq=0, now=now, reason="none", before=None)


def document(
    host: str,
    view: RailView,
    *,
    seq: int,
    now: float,
    reason: str,
    before: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The ``linkguard.rail-change/v1`` document of ``view`` (see the module docstring)."""
    return {
        "schema": SCHEMA,
        "seq": seq,
        "host": host,
        "epoch": view.epoch,
        "time": round(now, 6),
        "reason": reason,
        "rails_total": len(view.rails),
        "rails_usable": list(view.usable),
        "rails_lost": list(view.lost),
        "rail_map_before": dict(before) if before is not None else None,
        "rail_map_after": dict(view.gpus),
        "ports_down": list(view.down),
        "ports_held_down": list(view.held_down),
        "ports_suppressed": list(view.suppressed),
        "ports_degraded": list(view.degraded),
        "fast_path_ports": list(view.fast_path_ports),
    }
