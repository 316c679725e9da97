"""What each fault of a namespace-lab replay cost (:mod:`linkguard.simulations.labrun`), and
which of the scenario's expectations held.

Consumes: the faults being measured (:data:`PendingFault`), the steps, the flow records and
what the bus observer saw (plans and acks with the monotonic time they arrived). Produces, into
each :class:`~linkguard.simulations.labreport.FaultResult`: the gap in every flow the fault
touched (:class:`~linkguard.simulations.labreport.FlowGap`, ms), datagrams lost, whether the
flow stayed broken until the fault's end, and with linkguard the most plans a host got for it
and the time to the last host's ack of them (ms). Then the expectations
(:func:`lab_expectations`). Pure: it reads records, runs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from linkguard.simulations.engine import ExpectResult
from linkguard.simulations.labflows import flow_gap, flow_spec, home_rail
from linkguard.simulations.labjob import job_expectations
from linkguard.simulations.labprocs import Flow, Observer
from linkguard.simulations.labreport import FaultResult, FlowGap, LabReport
from linkguard.simulations.labsteps import CONTROL, Step, return_at
from linkguard.simulations.scenario import Expect
from linkguard.topology.fabric import Fabric

__all__ = ["CONTROL_KINDS", "PendingFault", "ack_timing", "lab_expectations", "measure_faults"]

#: A fault being measured: (its result, its step, when it was applied (monotonic s), the
#: highest plan epoch seen on the bus before it).
PendingFault = tuple[FaultResult, Step, float, int]

#: Timeline kinds that touch only the control plane: no data-plane gap is theirs.
CONTROL_KINDS = {"broker_outage", "service_restart", "agent_restart"}


def measure_faults(
    pending: list[PendingFault],
    steps: list[Step],
    *,
    t0: float,
    t_end: float,
    fabric: Fabric,
    flows: list[tuple[Flow, str]],
    step_targets: Callable[[Step], set[tuple[str, int]]],
    obs: Observer | None,
) -> None:
    """Flow gaps and ack times per fault, from the flow records and the observer, into each
    pending fault's result. ``t0``: monotonic time of the timeline's 0; ``t_end``: when the
    replay ended (monotonic); ``flows``: (flow, role "to", "from" or "control");
    ``step_targets``: the (host, rail) ports a step takes down; ``obs``: the bus observer (None
    without linkguard: no ack timing)."""
    fault_times = [t0 + s.at_s for s in steps if s.resources - CONTROL]
    for result, step, t_step, epoch0 in pending:
        back = return_at(step, steps)
        t_back = None if back is None else t0 + back
        res = step.resources
        controls = [(fl, role) for fl, role in flows if role == "control"]
        if res <= CONTROL:
            chosen = controls
        else:
            targets = step_targets(step)
            chosen = [
                (fl, role)
                for fl, role in flows
                if role != "control"
                and (
                    (flow_spec(fl).dst_host, home_rail(fabric, flow_spec(fl).dst)) in targets
                    or (flow_spec(fl).src_host, home_rail(fabric, flow_spec(fl).src)) in targets
                )
            ] or controls  # nothing this step touched carries a flow: show one that passes
        t_to = t_back if t_back is not None else t_end
        for fl, role in chosen:
            gap, lost, resumed = flow_gap(fl, t_step, t_to, t_end)
            if math.isnan(gap):  # fewer than two datagrams around it: nothing to measure
                continue
            until_return = not resumed or (
                t_back is not None and gap / 1000 >= (t_back - t_step) * 0.9
            )
            result.flows.append(
                FlowGap(flow_spec(fl).label, role, round(gap, 1), lost, until_return, resumed)
            )
        if obs is not None:
            later = [t for t in fault_times if t > t_step + 1e-6]
            window_end = min(later) if later else t_end
            ack_timing(obs, fabric.host_names, result, t_step, epoch0, window_end)


def ack_timing(
    obs: Observer, names: list[str], result: FaultResult, t_step: float, epoch0: int, end: float
) -> None:
    """Into ``result``: the most plan epochs above ``epoch0`` one host of ``names`` got in
    (``t_step``, ``end``] (monotonic s), and the time from ``t_step`` to the last applied (not
    fast-path) ack of each host's newest such plan (ms; left None when none came); for a host
    link fault (``result.host``), the time to that host's first fast-path ack in the window."""
    last: float | None = None
    most = 0
    for h in names:
        new = [(t, p) for t, p in obs.plans.get(h, []) if p.epoch > epoch0 and t_step < t <= end]
        epochs = {p.epoch for _, p in new}
        most = max(most, len(epochs))
        if not new:
            continue
        top = max(epochs)
        for t, a in obs.acks.get(h, []):
            if a.epoch == top and a.result == "applied" and not a.fast_path:
                last = t if last is None else max(last, t)
                break
    result.plans_per_host = most
    if last is not None:
        result.last_ack_ms = round((last - t_step) * 1000, 1)
    if result.host is not None:
        fast = [t for t, a in obs.acks.get(result.host, []) if a.fast_path and t_step < t <= end]
        if fast:
            result.fast_path_ms = round((min(fast) - t_step) * 1000, 1)


def lab_expectations(r: LabReport, ex: Expect, *, linkguard: bool) -> list[ExpectResult]:
    """Which of ``ex`` held in the finished report ``r``: ``reachability`` (no mismatch in the
    checks), ``max_reroute_ms`` (the worst data-plane gap of a fabric fault, ms),
    ``max_plans_per_host_per_event`` and ``fast_path`` (with linkguard), and the job's
    (:func:`~linkguard.simulations.labjob.job_expectations`) when it ran one."""
    out: list[ExpectResult] = []
    if ex.reachability:
        out.append(ExpectResult.reachability(r.mismatch_count, r.checks, "checks"))
    data = [(g.gap_ms, f) for f in r.faults if f.kind not in CONTROL_KINDS for g in f.flows]
    if ex.max_reroute_ms is not None:
        worst = max(data, key=lambda x: x[0], default=None)
        observed = worst[0] if worst else 0.0
        detail = (
            f"worst data-plane gap {observed:.1f} ms ({worst[1].what} at {worst[1].at_s:g} s)"
            if worst
            else "no flow gap measured"
        ) + f", limit {ex.max_reroute_ms:g} ms"
        out.append(
            ExpectResult(
                "max_reroute_ms",
                ex.max_reroute_ms,
                observed,
                observed <= ex.max_reroute_ms,
                detail,
            )
        )
    if ex.max_plans_per_host_per_event is not None and linkguard:
        n = max((f.plans_per_host for f in r.faults), default=0)
        out.append(ExpectResult.plans_per_event(n, ex.max_plans_per_host_per_event, per="fault"))
    if ex.fast_path and linkguard:  # each host link fault: that host's fast-path ack
        out.append(ExpectResult.fast_path_acked(r.faults))
    if r.job is not None:
        out += job_expectations(r, ex)
    return out
