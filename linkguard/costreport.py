"""The parts of a cost report that ``linkguard sim fleet`` and ``linkguard report`` print alike:
a table per transport with its assumptions, the reroute lines, time-to-reroute quantiles and the
model's JSON form.

Consumes: :class:`~linkguard.transportcost.TransportCost` and
:class:`~linkguard.failuremodel.FailureModel`. Produces: text lines and dicts; no I/O.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable
from dataclasses import asdict

from linkguard.failuremodel import FailureModel
from linkguard.jobcost import TITLES, Cost
from linkguard.transportcost import TransportCost

__all__ = [
    "cost_rows",
    "model_dict",
    "percent",
    "percentile",
    "quantiles",
    "reroute_lines",
    "transport_lines",
]


def percent(x: float) -> str:
    """A fraction as a percentage with 4 decimals, or as many as it takes to show that it is
    not 100 % (0.99999969 -> "99.99997 %"; only exactly 1 prints "100.0000 %")."""
    for places in range(4, 10):
        text = f"{100 * x:.{places}f}"
        if x == 1 or not text.startswith("100."):
            return f"{text} %"
    return f"{100 * x:.9f} %"


def cost_rows(*costs: Cost) -> list[tuple[str, ...]]:
    """The cost table's rows: (label, one column per cost)."""
    return [
        ("interruptions (job restarts)", *(f"{c.interruptions}" for c in costs)),
        ("  per 1,000 GPU-days", *(f"{c.interruptions_per_1000_gpu_days:.4f}" for c in costs)),
        ("stalls", *(f"{c.stalls}" for c in costs)),
        ("job idle (s)", *(f"{c.idle_s:,.1f}" for c in costs)),
        ("idled GPU-hours", *(f"{c.idle_gpu_hours:,.1f}" for c in costs)),
        ("goodput", *(percent(c.goodput) for c in costs)),
    ]


def transport_lines(
    tc: TransportCost, *, label_width: int = 30, wrap: int = 96, ids: str = "entry"
) -> list[str]:
    """A transport's block of a text report: title, table (with linkguard, fail fast at once
    for the RDMA transports, without), the outages charged more with linkguard (named by
    ``ids``: ``entry``, a timeline entry, or ``id``, a ledger row), assumptions."""
    heads = ["with linkguard"]
    costs = [tc.with_linkguard]
    if tc.with_linkguard_at_once is not None:
        heads.append("fail fast at once")
        costs.append(tc.with_linkguard_at_once)
    heads.append("without")
    costs.append(tc.without_linkguard)
    lines = [
        f"transport {tc.transport} ({TITLES[tc.transport]})",
        f"  {'':{label_width}}" + "".join(f" {h:>17}" for h in heads),
    ]
    for label, *cells in cost_rows(*costs):
        lines.append(f"  {label:{label_width}}" + "".join(f" {c:>17}" for c in cells))

    def listed(entries: tuple[int, ...]) -> str:
        shown = ", ".join(str(e) for e in entries[:6]) + (", ..." if len(entries) > 6 else "")
        return f"{len(entries)}" + (f" ({ids} {shown})" if entries else "")

    dearer = f"  outages charged more with linkguard than without: {listed(tc.costlier)}"
    if tc.with_linkguard_at_once is not None:
        dearer += f"; failing fast at once: {listed(tc.costlier_at_once)}"
    lines.append(dearer)
    lines += textwrap.wrap(
        f"assumes: {tc.assumes}", wrap, initial_indent="  ", subsequent_indent="    "
    )
    return lines


def model_dict(m: FailureModel) -> dict[str, object]:
    """The model's fields and the derived numbers the reports use (JSON)."""
    return {
        **asdict(m),
        "nccl_budget_s": m.nccl_budget_s,
        "restart_cost_s": m.restart_cost_s,
        "ride_out_s": m.ride_out_s,
        "fail_fast_after_s": m.grace_s,
        "tcp_retransmissions_s": list(m.tcp_retransmissions_s),
        "tcp_give_up_s": m.tcp_give_up_s,
        "ip_fail_s": m.ip_fail_s,
    }


def reroute_lines(
    *,
    rerouted: int,
    held: int,
    model: FailureModel,
    ttr: dict[str, float | int | None],
    needless_count: int,
    changes: str,
    clock: str,
) -> list[str]:
    """The reroute lines of a text report: outages ``rerouted`` and ``held`` (needed no
    reroute), ``changes`` (plans, solves), time to reroute ``ttr`` (``clock``: what it measures,
    on which clock), needless reroutes and what they are."""
    when = (
        f"p50 {ttr['p50']:g} ms, p99 {ttr['p99']:g} ms, max {ttr['max']:g} ms"
        if ttr["count"]
        else "none"
    )
    paragraphs = [
        f"reroutes: {rerouted} outages rerouted, {held} needed none (ports already held out); "
        f"{changes}",
        f"time to reroute {when} ({clock}); each charged at least "
        f"{model.reroute_floor_s * 1000:g} ms, the lab's data-plane gap",
        f"needless reroutes: {needless_count} (traffic moved off a link only once it was back: "
        "a move there and back for nothing)",
    ]
    return [
        line
        for text in paragraphs
        for line in textwrap.wrap(text, 96, initial_indent="  ", subsequent_indent="    ")
    ]


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank (the smallest value with at
    least ``q`` % of the values at or below it); None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))
    return xs[k]


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
