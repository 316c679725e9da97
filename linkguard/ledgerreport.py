"""The interruption report: what link faults cost a training job on the recorded fleet, with and
without linkguard, next to Meta's published interruption rate.

Consumes: a ledger (:mod:`linkguard.ledger`): its runs, outages, port events, plans and
suppressions in a time window. Produces: a :class:`LedgerReport` (:func:`build_report`) with a
JSON form (schema :data:`REPORT_SCHEMA`), a text table and CSV rows.

The job cost is :mod:`linkguard.transportcost`'s, the one ``linkguard sim fleet`` uses, per
transport (``ip``, ``nccl-ib``, ``nccl-ib-failover``; :data:`~linkguard.jobcost.TRANSPORTS`): the
window's outages become :class:`~linkguard.jobcost.Outage` records, each with its ports
(``outage_ports``) and, from ``port_events``, when each port was up again and when it was back in
use (``up`` after ``held_down`` / ``suppressed``), priced with the job model of the newest run in
the window (:class:`~linkguard.failuremodel.FailureModel`; a service records its defaults), its GPU
count and the window's length. So a ledger written by ``linkguard sim fleet --ledger`` reports the
simulator's own numbers. Fused pairs (``nccl-ib-failover``) are those of a host laid out as the
generator lays one out (:func:`~linkguard.jobcost.generated_fused_rails`): the ledger does not
record host layouts. An outage whose reroute is ``pending`` or ``unconfirmed`` (an affected host
never acked its new plan) is charged as without linkguard for ``ip`` (the RDMA transports' levers,
fail-fast and ``nccl.env``, act on each host's own view).

The window is one stretch from its start to its end: gaps between service runs count as time
without outages. It is the ``since`` / ``until`` asked for, clamped to the runs that overlap
it (first start to last end), so time nobody recorded never dilutes the rates; a service run
still recording (not closed, written within :data:`~linkguard.ledgerrows.LIVE_WITHIN_S`) ends
now. The rows are read by :mod:`linkguard.ledgerrows`. Reroutes and solves leave out each
service run's initial plan build (the simulator leaves out its build at time 0 too). A needless
reroute moved traffic only once its link was back (time to reroute >= down time); an outage
still open is never one (its length is not known yet).
The ``runs`` rows are checked (:class:`~linkguard.ledger.LedgerError` names row and field).

Reference rate: Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4 and Table 5: 419
unexpected interruptions in 54 days of pre-training on 16,384 GPUs (0.47 per 1,000 GPU-days,
one per about 2,100 GPU-days), 35 of them network switch/cable and 7 NIC (together 0.047 per
1,000 GPU-days).

Tables: ``worst_links`` (most flaps: down transitions per host port, then the longest down
time), ``per_rail`` and ``per_leaf`` (outages that took a port of it down, flaps, and down time:
port-seconds down inside the window).
"""

from __future__ import annotations

import math
import sqlite3
import textwrap
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from linkguard.costreport import model_dict, quantiles, reroute_lines, transport_lines
from linkguard.failuremodel import FailureModel
from linkguard.jobcost import COMMON_ASSUMES, TRANSPORTS, Cost, generated_fused_rails, needless
from linkguard.ledgerfile import LedgerError, NoRunError
from linkguard.ledgerrows import (
    Run,
    link_tables,
    outage_links,
    outage_rows,
    read_runs,
    reroute_counts,
)
from linkguard.timestamps import MAX_TIME, iso
from linkguard.transportcost import PricedTransports, TransportCost, assumptions, price_transports

__all__ = ["CSV_HEADER", "REPORT_SCHEMA", "LedgerReport", "build_report", "meta_reference"]

#: The ``schema`` of :meth:`LedgerReport.to_dict`. v2 (v1: one "follows the rail map" price):
#: ``transports`` has each transport's costs, savings and assumptions; ``transport`` names the
#: one the top-level ``with_linkguard`` / ``without_linkguard`` / ``interruptions_avoided`` /
#: ``gpu_hours_saved`` / ``dollars_saved`` repeat (the one asked for; ``ip`` when all are);
#: ``needless_reroutes`` counts reroutes that landed after their link was back.
REPORT_SCHEMA = "linkguard.ledger-report/v2"

#: The columns of :meth:`LedgerReport.csv_rows` (a long table: one value per row).
CSV_HEADER = ("section", "item", "metric", "value")


def meta_reference() -> dict[str, object]:
    """Meta's published interruption rate (the
    :class:`~linkguard.simulations.failures.FailureModel` fields that cite it)."""
    m = FailureModel()
    gpu_days = m.llama3_gpus * m.llama3_days
    link = m.llama3_network + m.llama3_nic
    return {
        "source": 'Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4, Table 5',
        "gpus": m.llama3_gpus,
        "days": m.llama3_days,
        "interruptions": m.llama3_interruptions,
        "per_1000_gpu_days": round(m.llama3_interruptions / gpu_days * 1000, 4),
        "gpu_days_per_interruption": round(gpu_days / m.llama3_interruptions, 1),
        "link_caused": link,
        "link_caused_per_1000_gpu_days": round(link / gpu_days * 1000, 4),
    }


def _zero_cost() -> Cost:
    return Cost(0, 0, 0.0, 0.0, 1.0, 0.0)


@dataclass
class LedgerReport(PricedTransports):
    """The report over one window (module docstring); times in s, money in the price's
    currency. :meth:`to_dict` is the JSON form."""

    ledger: str
    since: float
    until: float
    duration_s: float
    sources: list[str]
    runs: int
    fabric: str
    hosts: int
    rails: int
    gpus: int
    model: FailureModel
    outages: list[dict[str, Any]]
    #: transport -> its costs, in the order printed
    transports: dict[str, TransportCost]
    price_per_gpu_hour: float
    reroutes: int
    solves: int
    time_to_reroute_ms: dict[str, float | int | None]
    needless_reroutes: int
    unconfirmed_reroutes: int
    port_downs: int
    suppressions: int
    worst_links: list[dict[str, Any]] = field(default_factory=list)
    per_rail: list[dict[str, Any]] = field(default_factory=list)
    per_leaf: list[dict[str, Any]] = field(default_factory=list)
    #: the ``since`` / ``until`` asked for (None: not given); ``since`` / ``until`` above are
    #: those clamped to what the runs recorded
    requested_since: float | None = None
    requested_until: float | None = None
    #: the window ends now: a service run is still recording
    live: bool = False

    @property
    def clamped(self) -> bool:
        """The window asked for reached past what the ledger recorded."""
        return (self.requested_since is not None and self.requested_since < self.since) or (
            self.requested_until is not None and self.requested_until > self.until
        )

    @property
    def gpu_days(self) -> float:
        return self.gpus * self.duration_s / 86400

    @property
    def interruptions_avoided(self) -> int:
        """Link-caused interruptions avoided on :attr:`transport` (interruptions without -
        with; negative when linkguard costs restarts)."""
        return self.transports[self.transport].interruptions_avoided

    @property
    def gpu_hours_saved(self) -> float:
        return self.transports[self.transport].gpu_hours_saved

    @property
    def dollars_saved(self) -> float:
        return round(self.gpu_hours_saved * self.price_per_gpu_hour, 2)

    def _transport_dict(self, tc: TransportCost) -> dict[str, object]:
        return tc.to_dict() | {
            "dollars_saved": round(tc.gpu_hours_saved * self.price_per_gpu_hour, 2)
        }

    def outage_counts(self) -> dict[str, Any]:
        """``outages``, ``open`` (still down at the window's end), ``isolated`` (a host lost
        every rail) and ``by_kind`` (kind -> outages)."""
        kinds = Counter(o["kind"] for o in self.outages)
        return {
            "outages": len(self.outages),
            "open": sum(1 for o in self.outages if o["open"]),
            "isolated": sum(1 for o in self.outages if o["isolated"]),
            "by_kind": dict(sorted(kinds.items())),
        }

    def to_dict(self) -> dict[str, object]:
        m = self.model
        return {
            "schema": REPORT_SCHEMA,
            "ledger": self.ledger,
            "sources": self.sources,
            "runs": self.runs,
            "window": {
                "since": self.since,
                "until": self.until,
                "since_iso": iso(self.since),
                "until_iso": iso(self.until),
                "duration_s": self.duration_s,
                "days": self.duration_s / 86400,
                "requested": {"since": self.requested_since, "until": self.requested_until},
                "clamped": self.clamped,
                "live": self.live,
            },
            "fabric": {
                "name": self.fabric,
                "hosts": self.hosts,
                "rails": self.rails,
                "gpus": self.gpus,
            },
            "gpu_days": self.gpu_days,
            "model": model_dict(m),
            "outage_counts": self.outage_counts(),
            "transport": self.transport,
            "with_linkguard": self.with_linkguard.to_dict(),
            "without_linkguard": self.without_linkguard.to_dict(),
            "transports": {k: self._transport_dict(v) for k, v in self.transports.items()},
            "interruptions_avoided": self.interruptions_avoided,
            "reference": meta_reference(),
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "gpu_hours_saved": self.gpu_hours_saved,
            "dollars_saved": self.dollars_saved,
            "reroutes": self.reroutes,
            "solves": self.solves,
            "time_to_reroute_ms": self.time_to_reroute_ms,
            "needless_reroutes": self.needless_reroutes,
            "unconfirmed_reroutes": self.unconfirmed_reroutes,
            "port_downs": self.port_downs,
            "suppressions": self.suppressions,
            "worst_links": self.worst_links,
            "per_rail": self.per_rail,
            "per_leaf": self.per_leaf,
            "assumes": COMMON_ASSUMES,
            "outages": self.outages,
        }

    def text(self) -> str:
        """A few lines, a cost table per transport and three small tables."""
        ref = meta_reference()
        days = self.duration_s / 86400
        n = len(self.outages)
        lines = [
            f"ledger {self.ledger} ({', '.join(self.sources)}; {self.runs} run(s)): "
            f"{self.fabric}, {self.hosts:,} hosts x {self.rails} rails ({self.gpus:,} GPUs)",
            f"  window {iso(self.since)} .. {iso(self.until)}"
            + (" (now: a service run is still recording)" if self.live else "")
            + f": {days:,.2f} days, {self.gpu_days:,.0f} GPU-days",
            f"  {n} outages ({sum(1 for o in self.outages if o['isolated'])} isolated a host, "
            f"{sum(1 for o in self.outages if o['open'])} still open), {self.port_downs} port "
            f"downs, {self.suppressions} suppressions",
        ]
        if self.clamped:
            asked = (
                f"{'-' if self.requested_since is None else iso(self.requested_since)} .. "
                f"{'-' if self.requested_until is None else iso(self.requested_until)}"
            )
            lines.insert(2, f"    (asked {asked}: clamped to what the ledger recorded)")
        for tc in self.transports.values():
            lines += transport_lines(tc, label_width=34, ids="id")
            dollars = round(tc.gpu_hours_saved * self.price_per_gpu_hour, 2)
            lines.append(
                f"  link-caused interruptions avoided: {tc.interruptions_avoided}; GPU-hours "
                f"saved {tc.gpu_hours_saved:,.1f}, at ${self.price_per_gpu_hour:,.2f} per "
                f"GPU-hour ${dollars:,.2f}"
            )
        lines += [
            f"  Meta, Llama 3 (419 in 54 days on 16,384 GPUs): {ref['per_1000_gpu_days']:.4f} "
            f"interruptions per 1,000 GPU-days,",
            f"    all causes (one per {ref['gpu_days_per_interruption']:,.0f} GPU-days); "
            f"{ref['link_caused_per_1000_gpu_days']:.4f} of them switch/cable + NIC",
        ]
        lines += reroute_lines(
            rerouted=sum(1 for o in self.outages if o["reroute"] == "done"),
            held=sum(1 for o in self.outages if o["reroute"] == "none" and not o["isolated"]),
            model=self.model,
            ttr=self.time_to_reroute_ms,
            needless_count=self.needless_reroutes,
            changes=f"{self.reroutes} plan changes in {self.solves} solves; "
            f"{self.unconfirmed_reroutes} unconfirmed (charged as without for ip)",
            clock="from an outage's first down to the last ack of the plans that moved every "
            "affected host; a simulation's ledger: the simulated clock",
        )
        lines.append("worst links (most flaps):")
        if self.worst_links:
            lines.append(
                f"  {'host':16} {'hca/port':12} {'rail':>4} {'leaf':14} {'flaps':>6} "
                f"{'down (s)':>12}"
            )
            for x in self.worst_links:
                lines.append(
                    f"  {x['host']:16} {x['hca']}/{x['port']:<{11 - len(x['hca'])}} "
                    f"{_show(x['rail']):>4} {_show(x['leaf']):14} {x['flaps']:>6} "
                    f"{x['down_s']:>12,.1f}"
                )
        else:
            lines.append("  none")
        lines.append("per rail:")
        lines.append(f"  {'rail':>4} {'outages':>8} {'flaps':>6} {'down (s)':>12}")
        for x in self.per_rail:
            lines.append(
                f"  {_show(x['rail']):>4} {x['outages']:>8} {x['flaps']:>6} {x['down_s']:>12,.1f}"
            )
        lines.append("per leaf:")
        if self.per_leaf:
            lines.append(
                f"  {'leaf':14} {'rail':>4} {'su':>4} {'outages':>8} {'flaps':>6} {'down (s)':>12}"
            )
            for x in self.per_leaf:
                lines.append(
                    f"  {_show(x['leaf']):14} {_show(x['rail']):>4} {_show(x['su']):>4} "
                    f"{x['outages']:>8} {x['flaps']:>6} {x['down_s']:>12,.1f}"
                )
        else:
            lines.append("  none")
        lines += textwrap.wrap(
            f"all transports assume: {COMMON_ASSUMES} (restart_s {self.model.restart_s:g} s, "
            f"checkpoint interval {self.model.checkpoint_interval_s:g} s)",
            96,
            initial_indent="  ",
            subsequent_indent="    ",
        )
        return "\n".join(lines) + "\n"

    def csv_rows(self) -> list[tuple[object, ...]]:
        """The report as a long table: :data:`CSV_HEADER`, then one ``(section, item, metric,
        value)`` row per number of :meth:`text` (sections ``summary`` (its savings: the
        top-level transport's), ``time_to_reroute_ms``, ``outage_counts`` (item: an outage kind,
        or empty for all), ``with_linkguard``, ``with_linkguard_at_once`` (RDMA transports),
        ``without_linkguard`` and ``transport`` (savings, outages charged more with linkguard),
        each with a transport as item, ``link`` (item ``host:hca/port``), ``rail``, ``leaf``);
        the per-outage list and the model are in :meth:`to_dict` only. None is an empty
        value."""
        rows: list[tuple[object, ...]] = [CSV_HEADER]
        ref = meta_reference()
        summary = {
            "since": self.since,
            "until": self.until,
            "requested_since": self.requested_since,
            "requested_until": self.requested_until,
            "clamped": self.clamped,
            "live": self.live,
            "duration_s": self.duration_s,
            "gpus": self.gpus,
            "gpu_days": self.gpu_days,
            "outages": len(self.outages),
            "interruptions_avoided": self.interruptions_avoided,
            "gpu_hours_saved": self.gpu_hours_saved,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "dollars_saved": self.dollars_saved,
            "reroutes": self.reroutes,
            "solves": self.solves,
            "needless_reroutes": self.needless_reroutes,
            "unconfirmed_reroutes": self.unconfirmed_reroutes,
            "port_downs": self.port_downs,
            "suppressions": self.suppressions,
            "meta_per_1000_gpu_days": ref["per_1000_gpu_days"],
            "meta_gpu_days_per_interruption": ref["gpu_days_per_interruption"],
            "meta_link_caused_per_1000_gpu_days": ref["link_caused_per_1000_gpu_days"],
        }
        summary["transport"] = self.transport
        rows += [("summary", "", k, v) for k, v in summary.items()]
        rows += [("time_to_reroute_ms", "", k, v) for k, v in self.time_to_reroute_ms.items()]
        counts = self.outage_counts()
        rows += [("outage_counts", "", k, counts[k]) for k in ("outages", "open", "isolated")]
        rows += [("outage_counts", k, "outages", n) for k, n in counts["by_kind"].items()]
        for t, tc in self.transports.items():
            for name, cost in (
                ("with_linkguard", tc.with_linkguard),
                ("with_linkguard_at_once", tc.with_linkguard_at_once),
                ("without_linkguard", tc.without_linkguard),
            ):
                if cost is not None:
                    rows += [(name, t, k, v) for k, v in cost.to_dict().items()]
            saved = {
                "interruptions_avoided": tc.interruptions_avoided,
                "gpu_hours_saved": tc.gpu_hours_saved,
                "dollars_saved": round(tc.gpu_hours_saved * self.price_per_gpu_hour, 2),
                "costlier_with_linkguard": len(tc.costlier),
            }
            if tc.with_linkguard_at_once is not None:
                saved["costlier_with_linkguard_at_once"] = len(tc.costlier_at_once)
            rows += [("transport", t, k, v) for k, v in saved.items()]
        for x in self.worst_links:
            item = f"{x['host']}:{x['hca']}/{x['port']}"
            rows += [("link", item, k, x[k]) for k in ("rail", "leaf", "flaps", "down_s")]
        for x in self.per_rail:
            rows += [("rail", x["rail"], k, x[k]) for k in ("outages", "flaps", "down_s")]
        for x in self.per_leaf:
            rows += [
                ("leaf", x["leaf"], k, x[k]) for k in ("rail", "su", "outages", "flaps", "down_s")
            ]
        return rows


def _show(v: object) -> str:
    return "-" if v is None else str(v)


def build_report(
    conn: sqlite3.Connection,
    *,
    path: str,
    price_per_gpu_hour: float = 2.0,
    since: float | None = None,
    until: float | None = None,
    now: float | None = None,
    transports: Iterable[str] = TRANSPORTS,
    model_overrides: Mapping[str, Any] | None = None,
) -> LedgerReport:
    """The report of the ledger open on ``conn`` (rows as :class:`sqlite3.Row`) over
    ``[since, until)`` clamped to the coverage of the runs that overlap it (from the first
    one's start to the last one's end; a service run still recording ends at ``now``, default
    the clock), priced on ``transports`` with the newest run's job model, ``model_overrides``
    (:class:`~linkguard.failuremodel.FailureModel` fields, e.g. ``ip_stall_s``) replacing its
    values; see :meth:`linkguard.ledger.Ledger.report` for the errors (ValueError too for an
    unknown transport or an override the model refuses)."""
    transports = tuple(transports)
    unknown = sorted(set(transports) - set(TRANSPORTS))
    if unknown or not transports:
        raise ValueError(
            f"unknown transport {unknown[0] if unknown else '(none)'!r}; "
            f"one of {', '.join(TRANSPORTS)}"
        )
    if not (isinstance(price_per_gpu_hour, int | float) and math.isfinite(price_per_gpu_hour)):
        raise ValueError(f"price_per_gpu_hour must be a finite number, got {price_per_gpu_hour!r}")
    if price_per_gpu_hour < 0:
        raise ValueError(f"price_per_gpu_hour must be >= 0, got {price_per_gpu_hour}")
    for name, v in (("since", since), ("until", until)):
        if v is not None and not (
            isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= MAX_TIME
        ):
            raise ValueError(
                f"{name} must be Unix seconds between 0 and {MAX_TIME:.0f} (1970-01-01 .. "
                f"9999-12-31), got {v!r}"
            )
    if since is not None and until is not None and since >= until:
        raise ValueError(f"since ({iso(since)}) must be before until ({iso(until)})")
    now = time.time() if now is None else now
    runs = read_runs(conn, path, now)
    if not runs:
        raise NoRunError(f"ledger {path} has no runs: nothing was recorded in it yet")
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    window = [r for r in runs if r.start < hi and r.end > lo]
    if not window:
        asked = (
            f"{'the start' if since is None else iso(since)} .. "
            f"{'the end' if until is None else iso(until)}"
        )
        raise NoRunError(
            f"nothing to report: no run in ledger {path} overlaps {asked}; it recorded "
            f"{iso(min(r.start for r in runs))} .. {iso(max(r.end for r in runs))}"
        )
    covered = (min(r.start for r in window), max(r.end for r in window))
    start = covered[0] if since is None else max(since, covered[0])
    end = covered[1] if until is None else min(until, covered[1])
    latest = max(window, key=lambda r: (r.end, r.id))
    try:
        model = replace(latest.model, **dict(model_overrides or {}))
    except TypeError as exc:
        raise ValueError(f"model_overrides: {exc}") from None
    try:
        return _build(
            conn,
            path=path,
            price_per_gpu_hour=price_per_gpu_hour,
            window=window,
            latest=latest,
            model=model,
            transports=transports,
            start=start,
            end=end,
            # rows at the window's very end belong to it unless an explicit until cuts it
            before_end="at < ?" if until is not None and until <= covered[1] else "at <= ?",
            requested=(since, until),
        )
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError) as exc:
        raise LedgerError(
            f"ledger {path}: unreadable contents ({type(exc).__name__}: {exc})"
        ) from exc


def _build(
    conn: sqlite3.Connection,
    *,
    path: str,
    price_per_gpu_hour: float,
    window: list[Run],
    latest: Run,
    model: FailureModel,
    transports: tuple[str, ...],
    start: float,
    end: float,
    before_end: str,
    requested: tuple[float | None, float | None],
) -> LedgerReport:
    """The report over the checked window (:func:`build_report`)."""
    one = window[0]
    whole = (
        len(window) == 1
        and one.closed
        and one.duration_s is not None
        and (start, end) == (one.start, one.end)
    )
    duration = one.duration_s if whole else round(end - start, 6)
    assert duration is not None

    rows = conn.execute(
        f"SELECT * FROM outages WHERE at >= ? AND {before_end} ORDER BY at, id", (start, end)
    ).fetchall()
    found, listed, unconfirmed = outage_rows(rows, start, end)
    gpus = latest.gpus
    ports_of = outage_links(conn, rows, start, end, before_end)
    found = [replace(o, links=ports_of.get(o.entry, ())) for o in found]
    if duration > 0:
        pairs = generated_fused_rails(max(latest.rails, 1))
        priced = price_transports(
            found,
            model,
            gpus=gpus,
            duration_s=duration,
            transports=transports,
            fused=lambda _host, rail: pairs.get(rail, (rail,)),
        )
    else:
        priced = {  # an empty window costs nothing
            t: TransportCost(
                t,
                _zero_cost(),
                _zero_cost(),
                None if t == "ip" else _zero_cost(),
                (),
                assumptions(t, model),
            )
            for t in TRANSPORTS
            if t in transports
        }

    reroutes, solves = reroute_counts(conn, window, start, end, before_end)
    done = [o.reroute_ms for o in found if o.reroute_ms is not None]
    needless_count = sum(1 for o in found if needless(o, model))  # never one still open
    suppressions = conn.execute(
        f"SELECT count(*) FROM suppressions WHERE suppressed = 1 AND at >= ? AND {before_end}",
        (start, end),
    ).fetchone()[0]

    worst, per_rail, per_leaf, port_downs = link_tables(
        conn, [o["id"] for o in listed], latest.rails, start, end, before_end
    )
    return LedgerReport(
        ledger=path,
        since=start,
        until=end,
        duration_s=duration,
        sources=sorted({r.source for r in window}),
        runs=len(window),
        fabric=latest.fabric,
        hosts=latest.hosts,
        rails=latest.rails,
        gpus=gpus,
        model=model,
        outages=listed,
        transports=priced,
        price_per_gpu_hour=float(price_per_gpu_hour),
        reroutes=reroutes,
        solves=solves,
        time_to_reroute_ms=quantiles(done),
        needless_reroutes=needless_count,
        unconfirmed_reroutes=unconfirmed,
        port_downs=port_downs,
        suppressions=int(suppressions),
        worst_links=worst,
        per_rail=per_rail,
        per_leaf=per_leaf,
        requested_since=requested[0],
        requested_until=requested[1],
        live=any(r.live and r.end == end for r in window),
    )
