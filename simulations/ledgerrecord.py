"""A fleet simulation written to the interruption ledger as one closed run.

Consumes: a fleet simulation (:class:`~linkguard.simulations.failures.FleetTimeline` and the
simulator's :class:`~linkguard.simulations.fleetreport.FleetReport`).
Produces: a run in a :class:`~linkguard.ledger.Ledger` (:meth:`~linkguard.ledger.Ledger.start_run`,
then :meth:`~linkguard.ledger.Ledger.write_closed_run`), which ``linkguard report`` reads as it
reads a service's run. Here, not in the ledger, so that the ledger (which the service imports)
imports nothing of the simulations.
"""

from __future__ import annotations

import json

from linkguard.ledger import Ledger, PortKey, PortPlace
from linkguard.simulations.engine import WALL0, return_rail
from linkguard.simulations.failures import FleetTimeline
from linkguard.simulations.fleetreport import FleetReport
from linkguard.simulations.scenario import expand

__all__ = ["record_simulation"]


def record_simulation(ledger: Ledger, timeline: FleetTimeline, report: FleetReport) -> int:
    """Write one fleet simulation (:func:`linkguard.simulations.fleetreport.simulate`) to
    ``ledger`` as a run: its window (from :data:`~linkguard.simulations.engine.WALL0`), job
    model, the port transitions of the expanded timeline and of the engine's hold-downs (``up``
    -> ``down`` -> ``held_down`` -> ``up``, as a service records them; a port back in use at
    once goes ``down`` -> ``up``) in ``port_events`` and ``events``, its outages with the
    engine's ``reroute_ms`` and the ports each took down, and its ``reroutes`` / ``solves`` /
    ``plans`` as the run's stats. Returns the run id. Raises
    :class:`~linkguard.ledger.LedgerError` as the ledger's writes do."""
    loaded = timeline.loaded
    fabric = loaded.fabric
    run = ledger.start_run(
        fabric,
        source="simulation",
        model=timeline.model,
        window_start=WALL0,
        window_end=WALL0 + report.duration_s,
        duration_s=report.duration_s,
        stats={
            "reroutes": report.reroutes,
            "solves": report.solves,
            "seed": report.seed,
            "needless_reroutes": report.needless_reroutes,
        },
    )
    places = ledger.places
    key_of = {(h.host, c.rail): (h.host, c.hca, c.port) for h in fabric.hosts for c in h.hcas}
    # (at_s, order, host, rail, kind): the timeline's port events, then the engine's returns
    # to use at the same instant
    moves: list[tuple[float, int, str | None, int | None, str, str, int]] = [
        (e.at_s, 0, e.host, e.rail, e.kind, f"{e.state}/{e.phys_state}", e.entry)
        for e in expand(loaded)
        if e.kind.startswith("port_")
    ]
    moves += [
        (float(r["at_s"]), 1, str(r["host"]), return_rail(r), "return", "hold-down over", -1)
        for r in report.returns
    ]
    moves.sort(key=lambda m: (m[0], m[1]))
    back_at = {(m[2], m[3], m[0]) for m in moves if m[4] == "return"}
    status: dict[tuple[str, int], str] = {}  # absent: up
    taken: dict[tuple[int, float], list[PortKey]] = {}
    port_rows, event_rows = [], []
    for at_s, _, host, rail, kind, reason, entry in moves:
        assert host is not None and rail is not None
        key: PortKey = key_of[(host, rail)]
        now = status.get((host, rail), "up")
        if kind == "port_down":
            if now == "down":
                continue  # another reading of a port already down: no transition
            taken.setdefault((entry, at_s), []).append(key)
            current = "down"
        elif kind == "port_up":
            if now != "down":
                continue
            current = "up" if (host, rail, at_s) in back_at else "held_down"
        elif now == "held_down":  # the engine put the port back in use
            current = "up"
        else:
            continue
        status[(host, rail)] = current
        pl = places.get(key, PortPlace(rail, None, None))
        at = WALL0 + at_s
        port_rows.append(
            # journal, seq: the simulated agents keep no journal
            (
                run,
                at,
                host,
                key[1],
                key[2],
                pl.rail,
                pl.leaf,
                pl.su,
                now,
                current,
                reason,
                None,
                None,
            )
        )
        data = {
            "host": host,
            "hca": key[1],
            "port": key[2],
            "rail": rail,
            "previous": now,
            "current": current,
            "reason": reason,
            "at": at,
        }
        if entry >= 0:
            data["timeline_entry"] = entry
        event_rows.append(
            (
                run,
                None,
                "port_event",
                at,
                host,
                key[1],
                key[2],
                pl.rail,
                pl.leaf,
                pl.su,
                json.dumps(data),
            )
        )
    ledger.write_closed_run(
        run,
        port_rows=port_rows,
        event_rows=event_rows,
        outages=[
            (
                (
                    WALL0 + o.at_s,
                    o.at_s,
                    o.kind,
                    o.down_s,
                    o.ports,
                    int(o.isolated),
                    int(o.open),
                    "none" if o.reroute_ms is None else "done",
                    o.reroute_ms,
                    f"timeline[{o.entry}]",
                ),
                taken.get((o.entry, o.at_s), []),
            )
            for o in report.outages
        ],
    )
    return run
