"""The ledger's rows as the interruption report reads them: runs checked field by field,
per-port flap and down-time tables, and each outage's ports with when they were back.

Consumes: an open ledger connection (rows as :class:`sqlite3.Row`, :mod:`linkguard.ledgerfile`'s
tables). Produces: :class:`Run` records (:func:`read_runs`; :class:`~linkguard.ledger.
LedgerError` names the row and field of an impossible value), the tables :func:`port_tables`
and :func:`link_tables` build, the outages of a window (:func:`outage_rows`), its reroute and
solve counts (:func:`reroute_counts`) and the :class:`~linkguard.jobcost.Link` records
:func:`outage_links` gives :mod:`linkguard.ledgerreport`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from typing import Any

from linkguard.failuremodel import FailureModel
from linkguard.jobcost import Link, Outage
from linkguard.ledgerfile import HEARTBEAT_S, LedgerError, model_from_json
from linkguard.timestamps import MAX_TIME

__all__ = [
    "LINK_MATCH_S",
    "LIVE_WITHIN_S",
    "MAX_RAILS",
    "WORST_LINKS",
    "Run",
    "blank",
    "link_tables",
    "outage_links",
    "outage_rows",
    "port_tables",
    "read_runs",
    "reroute_counts",
]


@dataclass(frozen=True)
class Run:
    """A ``runs`` row, checked (:func:`read_runs`); ``end``: its window end, or ``now`` for a
    service run still recording (``live``)."""

    id: int
    source: str
    fabric: str
    hosts: int
    gpus: int
    rails: int
    start: float
    end: float
    duration_s: float | None
    closed: bool
    live: bool
    model: FailureModel
    stats: dict[str, Any]


#: A service run not closed whose window end is older than this (s) stopped without closing
#: (killed): its end is its last write, not now. A running service writes every 30 s.
LIVE_WITHIN_S = 3 * HEARTBEAT_S

#: The most rails a run may name (a sanity bound: the per-rail table has one row each).
MAX_RAILS = 1024


def read_runs(conn: sqlite3.Connection, path: str, now: float) -> list[Run]:
    """The ``runs`` rows as :class:`Run`; raises :class:`LedgerError` naming the row and
    field of a value no run can have (a corrupted or hand-edited ledger)."""
    return [
        _read_run(_Row(r, path), now)
        for r in conn.execute("SELECT * FROM runs ORDER BY window_start, id")
    ]


@dataclass(frozen=True)
class _Row:
    """One ``runs`` row and checked reads of its fields."""

    row: sqlite3.Row
    path: str

    def bad(self, name: str, expected: str, *given: object) -> LedgerError:
        """The error for field ``name`` (its value: ``given`` if any, else the column's)."""
        value = given[0] if given else self.row[name]
        return LedgerError(
            f"ledger {self.path}: runs row id={self.row['id']!r}: {name} is {value!r}, "
            f"expected {expected}"
        )

    def integer(self, name: str, lo: int, hi: int | None = None) -> int:
        v = self.row[name]
        if not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise self.bad(name, f"an integer >= {lo}" + (f" and <= {hi}" if hi else ""))
        return v

    def seconds(self, name: str) -> float:
        v = self.row[name]
        if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= MAX_TIME):
            raise self.bad(name, f"Unix seconds between 0 and {MAX_TIME:.0f}")
        return float(v)

    def json_object(self, name: str) -> dict[str, Any]:
        try:
            v = json.loads(self.row[name])
        except (TypeError, ValueError):
            v = None
        if not isinstance(v, dict):
            raise self.bad(name, "a JSON object")
        return v


def _read_run(r: _Row, now: float) -> Run:
    row = r.row
    if row["source"] not in ("service", "simulation"):
        raise r.bad("source", "'service' or 'simulation'")
    if not isinstance(row["fabric"], str):
        raise r.bad("fabric", "a name")
    start, end = r.seconds("window_start"), r.seconds("window_end")
    if end < start:
        raise r.bad("window_end", f"not before window_start {start!r}")
    duration = row["duration_s"]
    if duration is not None and not (
        isinstance(duration, int | float) and math.isfinite(duration) and duration > 0
    ):
        raise r.bad("duration_s", "NULL or a number of seconds > 0")
    closed = r.integer("closed", 0, 1) == 1
    stats = r.json_object("stats")
    for key in ("reroutes", "solves", "initial_epoch"):
        if key in stats and (not isinstance(stats[key], int) or stats[key] < 0):
            raise r.bad(f"stats.{key}", "an integer >= 0", stats[key])
    r.json_object("model")
    live = row["source"] == "service" and not closed and now - end <= LIVE_WITHIN_S
    return Run(
        id=r.integer("id", 0),
        source=row["source"],
        fabric=row["fabric"],
        hosts=r.integer("hosts", 0),
        gpus=r.integer("gpus", 1),
        rails=r.integer("rails", 0, MAX_RAILS),
        start=start,
        end=max(end, now) if live else end,
        duration_s=None if duration is None else float(duration),
        closed=closed,
        live=live,
        model=model_from_json(row["model"]),
        stats=stats,
    )


#: A port's down in ``port_events`` belongs to an outage when it is this close to the outage's
#: ``at`` (s): ports join an incident within ``incident_window_s`` (1 s) of its first down, and
#: the agents' clocks (port_events) and the service's (outages) may differ a little.
LINK_MATCH_S = 5.0


def outage_links(
    conn: sqlite3.Connection,
    outages: list[sqlite3.Row],
    start: float,
    end: float,
    before_end: str,
) -> dict[int, tuple[Link, ...]]:
    """outage id -> its ports (``outage_ports``) as :class:`~linkguard.jobcost.Link`: from
    each port's own down in ``port_events`` (the one nearest the outage's ``at``) to its next
    transition out of ``down`` (``down_s``) and to its next ``up`` (``out_s``: back in use
    after a hold-down), both counted from the outage's ``at``; still down or out at the
    window's end: until then. A port whose down is not in ``port_events`` counts as down for
    the outage's ``down_s``, in use again then."""
    at_of = {int(r["id"]): (r["at"], r["down_s"]) for r in outages}
    members: dict[int, list[tuple[str, str, int, int]]] = {}
    ids = list(at_of)
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        for p in conn.execute(
            f"SELECT outage_id, host, hca, port, rail FROM outage_ports"
            f" WHERE outage_id IN ({','.join('?' * len(chunk))}) ORDER BY host, hca, port",
            chunk,
        ):
            rail = p["rail"] if isinstance(p["rail"], int) else -1
            members.setdefault(int(p["outage_id"]), []).append(
                (p["host"], p["hca"], int(p["port"]), rail)
            )
    wanted = {m[:3] for ms in members.values() for m in ms}
    history: dict[tuple[str, str, int], list[tuple[float, str]]] = {}
    if wanted:
        for r in conn.execute(
            f"SELECT at, host, hca, port, current FROM port_events WHERE {before_end}"
            " ORDER BY at, id",
            (end,),
        ):
            key = (r["host"], r["hca"], int(r["port"]))
            if key in wanted:
                history.setdefault(key, []).append((r["at"], r["current"]))
    out: dict[int, tuple[Link, ...]] = {}
    for oid, ms in members.items():
        at, down_s = at_of[oid]
        links = []
        for host, hca, port, rail in ms:
            seen = history.get((host, hca, port), [])
            downs = [k for k, (t, cur) in enumerate(seen) if cur == "down"]
            k = min(downs, key=lambda k: abs(seen[k][0] - at), default=None)
            if k is None or abs(seen[k][0] - at) > LINK_MATCH_S:
                fallback = down_s if down_s is not None else max(end - at, 0.0)
                links.append(Link(host, rail, round(fallback, 6)))
                continue
            up = next((t for t, cur in seen[k + 1 :] if cur != "down"), end)
            back = next((t for t, cur in seen[k + 1 :] if cur == "up"), end)
            down_for = max(up - at, 0.0)
            links.append(Link(host, rail, round(down_for, 6), round(max(back - at, down_for), 6)))
        out[oid] = tuple(links)
    return out


def blank(**extra: object) -> dict[str, Any]:
    return {"outage_ids": set(), "flaps": 0, "down_s": 0.0, **extra}


def port_tables(
    conn: sqlite3.Connection, start: float, end: float, before_end: str
) -> tuple[
    dict[tuple[str, str, int], dict[str, Any]],
    dict[Any, dict[str, Any]],
    dict[str, dict[str, Any]],
    int,
]:
    """Per port, rail and leaf: flaps (down transitions in the window) and down time
    (port-seconds down, clipped to the window; a port still down at the end counts to it)."""
    links: dict[tuple[str, str, int], dict[str, Any]] = {}
    down_since: dict[tuple[str, str, int], tuple[float, sqlite3.Row]] = {}
    rails: dict[Any, dict[str, Any]] = {}
    leaves: dict[str, dict[str, Any]] = {}
    downs = 0

    def entry(r: sqlite3.Row) -> dict[str, Any]:
        key = (r["host"], r["hca"], int(r["port"]))
        x = links.get(key)
        if x is None:
            x = links[key] = {
                "host": r["host"],
                "hca": r["hca"],
                "port": int(r["port"]),
                "rail": r["rail"],
                "leaf": r["leaf"],
                "su": r["su"],
                "flaps": 0,
                "down_s": 0.0,
            }
        return x

    def add_down(x: dict[str, Any], a: float, b: float) -> None:
        length = min(b, end) - max(a, start)
        if length > 0:
            x["down_s"] += length

    for r in conn.execute(
        f"SELECT at, host, hca, port, rail, leaf, su, previous, current FROM port_events"
        f" WHERE {before_end} ORDER BY at, id",
        (end,),
    ):
        key = (r["host"], r["hca"], int(r["port"]))
        if r["current"] == "down":
            if key not in down_since:
                down_since[key] = (r["at"], r)
                if r["at"] >= start and r["previous"] != "down":
                    entry(r)["flaps"] += 1
                    downs += 1
        elif key in down_since:
            add_down(entry(r), down_since.pop(key)[0], r["at"])
    for t0, r in down_since.values():  # still down at the end
        add_down(entry(r), t0, end)
    for x in links.values():
        rail = rails.setdefault(x["rail"], blank())
        rail["flaps"] += x["flaps"]
        rail["down_s"] += x["down_s"]
        if x["leaf"] is not None:
            leaf = leaves.setdefault(x["leaf"], blank(rail=x["rail"], su=x["su"]))
            leaf["flaps"] += x["flaps"]
            leaf["down_s"] += x["down_s"]
    links = {k: v for k, v in links.items() if v["flaps"] or v["down_s"]}
    return links, rails, leaves, downs


#: Rows of ``worst_links``.
WORST_LINKS = 10


def outage_rows(
    rows: list[sqlite3.Row], start: float, end: float
) -> tuple[list[Outage], list[dict[str, Any]], int]:
    """The window's ``outages`` rows (``start``/``end``: the window, Unix s) as the job model's
    :class:`~linkguard.jobcost.Outage` records (``at_s`` from ``start``; an open outage is down
    until ``end``; an unconfirmed reroute is charged as isolated), the report's per-outage
    dicts, and how many reroutes were ``pending`` or ``unconfirmed``."""
    found: list[Outage] = []
    listed: list[dict[str, Any]] = []
    unconfirmed = 0
    for r in rows:
        open_ = bool(r["open"]) or r["down_s"] is None
        down_s = r["down_s"] if r["down_s"] is not None else round(max(end - r["at"], 0.0), 6)
        not_confirmed = r["reroute"] in ("pending", "unconfirmed")
        unconfirmed += not_confirmed
        reroute_ms = r["reroute_ms"] if r["reroute"] == "done" else None
        at_s = round(r["at"] - start, 6)
        found.append(
            Outage(
                entry=int(r["id"]),
                kind=r["kind"],
                at_s=at_s,
                down_s=float(down_s),
                ports=int(r["ports"]),
                open=open_,
                # an unconfirmed reroute is charged as without linkguard
                isolated=bool(r["isolated"]) or not_confirmed,
                reroute_ms=reroute_ms,
            )
        )
        listed.append(
            {
                "id": int(r["id"]),
                "at": r["at"],
                "at_s": at_s,
                "kind": r["kind"],
                "down_s": down_s,
                "ports": int(r["ports"]),
                "open": open_,
                "isolated": bool(r["isolated"]),
                "reroute": r["reroute"],
                "reroute_ms": reroute_ms,
                "cause": r["cause"],
            }
        )
    return found, listed, unconfirmed


def reroute_counts(
    conn: sqlite3.Connection, window: list[Run], start: float, end: float, before_end: str
) -> tuple[int, int]:
    """(reroutes, solves) in the window: the service's plans changes (each run's initial
    build left out) plus a simulation run's own counts."""
    in_window = f"at >= ? AND {before_end}"
    query = f"SELECT count(*) FROM plans WHERE {in_window}"
    plans = conn.execute(query, (start, end)).fetchone()[0]
    # the service emits a plans change per solve that re-plans; like the simulator, leave out
    # each service run's initial build (its first plans change, stats.initial_epoch)
    for r in window:
        if r.source == "service" and "initial_epoch" in r.stats:
            plans -= conn.execute(
                f"SELECT count(*) FROM plans WHERE run_id = ? AND epoch = ? AND {in_window}",
                (r.id, r.stats["initial_epoch"], start, end),
            ).fetchone()[0]
    reroutes = solves = int(plans)
    for r in window:
        if r.source == "simulation":
            reroutes += r.stats.get("reroutes", 0)
            solves += r.stats.get("solves", 0)
    return reroutes, solves


def link_tables(
    conn: sqlite3.Connection,
    ids: list[int],
    n_rails: int,
    start: float,
    end: float,
    before_end: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], int]:
    """The report's tables over the window: ``worst_links`` (the :data:`WORST_LINKS` ports
    with the most flaps, then the longest down time), ``per_rail`` (every rail below
    ``n_rails``, and any other a port reported) and ``per_leaf`` (outages among ``ids`` that
    took a port of it down, flaps, down time in s rounded to µs), and the port downs."""
    links, rails, leaves, port_downs = port_tables(conn, start, end, before_end)
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        for p in conn.execute(
            f"SELECT DISTINCT outage_id, rail, leaf, su FROM outage_ports"
            f" WHERE outage_id IN ({marks})",
            chunk,
        ):
            rails.setdefault(p["rail"], blank())["outage_ids"].add(p["outage_id"])
            if p["leaf"] is not None:
                leaf = leaves.setdefault(p["leaf"], blank(rail=p["rail"], su=p["su"]))
                leaf["outage_ids"].add(p["outage_id"])
    for rail in range(n_rails):
        rails.setdefault(rail, blank())
    worst = sorted(
        (x for x in links.values() if x["flaps"] > 0),
        key=lambda x: (-x["flaps"], -x["down_s"], x["host"], x["hca"], x["port"]),
    )[:WORST_LINKS]
    per_rail = [
        {
            "rail": k,
            "outages": len(v["outage_ids"]),
            "flaps": v["flaps"],
            "down_s": round(v["down_s"], 6),
        }
        for k, v in sorted(rails.items(), key=lambda x: (x[0] is None, x[0] or 0))
    ]
    per_leaf = [
        {
            "leaf": k,
            "rail": v["rail"],
            "su": v["su"],
            "outages": len(v["outage_ids"]),
            "flaps": v["flaps"],
            "down_s": round(v["down_s"], 6),
        }
        for k, v in sorted(
            leaves.items(),
            key=lambda x: (x[1]["su"] is None, x[1]["su"] or 0, x[1]["rail"] or 0, x[0]),
        )
    ]
    worst = [x | {"down_s": round(x["down_s"], 6)} for x in worst]
    return worst, per_rail, per_leaf, port_downs
