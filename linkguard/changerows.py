"""The ledger's rows for each change of the topology service's feed, and its incidents'
rows.

Consumes: :class:`~linkguard.changerecord.ChangeRecord` s (the service's
:class:`~linkguard.topology.changes.Change`) in the order the service saw them, with where each
port sits (:func:`~linkguard.incidents.port_places`). Produces: rows for the ledger's tables
(:data:`~linkguard.ledgerfile.INSERTS`' columns: ``events`` for every change, ``port_events``,
``journal_gaps``, ``suppressions``, ``plans``, ``acks``, ``audit_findings``) and the
:class:`~linkguard.incidents.Incident` s each change touched (:class:`ChangeRows`, pure), and
the SQL that writes an incident (:func:`write_incident`, on the writer's connection).
Journaled port events reach the incident builder in their journal's order
(:mod:`linkguard.journalorder`); their ``port_events`` rows are written as they come.

Bad input: ``data`` values of the wrong type are left out (a ``host`` that is not a string
names no host); a ``port`` change loses its ``counters`` and an ``audit`` change its findings
list in the ``events`` row (the findings get rows of their own).
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from linkguard.changerecord import ChangeRecord
from linkguard.incidents import Incident, IncidentBuilder, PortKey, PortPlace
from linkguard.journalorder import JournalOrder

__all__ = ["SUBJECT_PORT", "ChangeRows", "Rows", "write_incident"]

#: An audit finding's subject that names a host port: ``<host>:<hca>/<port>``.
SUBJECT_PORT = re.compile(r"^(?P<host>[^:\s]+):(?P<hca>[^/\s]+)/(?P<port>\d{1,3})$")

#: Rows to insert, by table (the keys of :data:`~linkguard.ledgerfile.INSERTS`).
Rows = dict[str, list[tuple[object, ...]]]


class ChangeRows:
    """The rows of one run's changes (module docstring). ``run_id``: the ``runs`` row they
    belong to; ``places``: (host, hca, port) -> where it sits; ``builder``: the run's
    :class:`~linkguard.incidents.IncidentBuilder`. Pure: :meth:`record` appends to the rows
    it is given and returns the incidents it changed."""

    def __init__(
        self, run_id: int, places: dict[PortKey, PortPlace], builder: IncidentBuilder
    ) -> None:
        self.run_id = run_id
        self.places = places
        self.builder = builder
        #: each port's damping suppression as last recorded (a row when it flips)
        self.suppressed: dict[PortKey, bool] = {}
        #: (host, journal, seq) of the journaled port events recorded in this run
        self.journaled: set[tuple[str, str, int]] = set()
        #: journaled port events on their way to the builder, in each journal's order
        self.order: JournalOrder[Callable[[], list[Incident]]] = JournalOrder()

    @staticmethod
    def journal_key(c: ChangeRecord) -> tuple[str, str, int] | None:
        """(host, journal, seq) of a journaled ``port_event`` change; None for any other."""
        d = c.data
        if c.kind != "port_event":
            return None
        host, journal, seq = d.get("host"), d.get("journal"), d.get("seq")
        if isinstance(host, str) and isinstance(journal, str) and isinstance(seq, int):
            return host, journal, seq
        return None

    def record(self, c: ChangeRecord, rows: Rows) -> list[Incident]:
        """Rows for one change into ``rows`` (table -> rows, :data:`~linkguard.ledgerfile.INSERTS`'
        columns); the incidents it touched. A journaled port event recorded before in this
        run (a replay the service could not tell) adds nothing."""
        jkey = self.journal_key(c)
        if jkey is not None:
            if jkey in self.journaled:
                return []
            self.journaled.add(jkey)
        d, run, at = c.data, self.run_id, c.at
        host = d.get("host") if isinstance(d.get("host"), str) else None
        hca = d.get("hca") if isinstance(d.get("hca"), str) else None
        port = d.get("port") if isinstance(d.get("port"), int) else None
        rail = d.get("rail") if isinstance(d.get("rail"), int) else None
        key = (host, hca, port) if host and hca and port is not None else None
        place = self.places.get(key) if key else None
        if place is not None and place.rail is not None:
            rail = place.rail
        leaf, su = (place.leaf, place.su) if place else (None, None)
        data: dict[str, Any] = d
        touched: list[Incident] = []
        if c.kind == "port" and key is not None:
            data = {k: v for k, v in d.items() if k not in ("counters", "counters_saturated")}
            status = str(d.get("status", "unknown"))
            touched = self.builder.on_status(
                key,
                status,
                at,
                reason=d.get("reason"),
                rail=rail,
            )
            damping = d.get("damping") or {}
            suppressed = bool(damping.get("suppressed", False))
            if suppressed != self.suppressed.get(key, False):
                self.suppressed[key] = suppressed
                rows["suppressions"].append(
                    (
                        run,
                        at,
                        host,
                        hca,
                        port,
                        rail,
                        leaf,
                        su,
                        int(suppressed),
                        int(damping.get("flaps", 0) or 0),
                        float(damping.get("penalty", 0.0) or 0.0),
                    )
                )
        elif c.kind == "port_event" and key is not None:
            previous, current = str(d.get("previous")), str(d.get("current"))
            event_at = float(d.get("at", at) or at)
            journal = d.get("journal") if isinstance(d.get("journal"), str) else None
            seq = d.get("seq") if isinstance(d.get("seq"), int) and journal else None
            reason = d.get("reason")
            rows["port_events"].append(
                (
                    run,
                    event_at,
                    host,
                    hca,
                    port,
                    rail,
                    leaf,
                    su,
                    previous,
                    current,
                    reason,
                    journal,
                    seq,
                )
            )
            to_builder: Callable[[], list[Incident]] = functools.partial(
                self.builder.on_status,
                key,
                current,
                # a journaled event: the agent's time (it may come long after, replayed)
                event_at if seq is not None else at,
                previous=previous,
                reason=d.get("reason"),
                rail=rail,
                journaled=seq is not None,
            )
            ready = [to_builder]
            if seq is not None and journal is not None and host is not None:
                # to the incident builder in the journal's order (linkguard.journalorder)
                held, lost = d.get("held_from"), d.get("lost_to")
                ready = self.order.offer(
                    host,
                    journal,
                    seq,
                    to_builder,
                    at=at,
                    held_from=held if isinstance(held, int) else None,
                    lost_to=lost if isinstance(lost, int) else None,
                )
            touched = [inc for call in ready for inc in call()]
        elif c.kind == "journal_gap" and host:
            rows["journal_gaps"].append(
                (run, at, host, d.get("journal"), d.get("seq_from"), d.get("seq_to"))
            )
        elif c.kind == "plans":
            hosts = [h for h in d.get("hosts", []) if isinstance(h, str)]
            peers = d.get("peer_routes", [])
            rows["plans"].append(
                (
                    run,
                    int(d.get("epoch", 0)),
                    at,
                    len(hosts),
                    len(peers) if isinstance(peers, list) else int(peers or 0),
                    d.get("messages"),
                    d.get("solve_ms"),
                )
            )
            touched = self.builder.on_plans(int(d.get("epoch", 0)), hosts, at)
        elif c.kind == "ack" and host:
            result = str(d.get("result"))
            fast = bool(d.get("fast_path", False))
            epoch = int(d.get("epoch", 0))
            rows["acks"].append((run, host, epoch, result, d.get("apply_ms"), int(fast), at))
            touched = self.builder.on_ack(host, epoch, result=result, fast_path=fast, at=at)
        elif c.kind == "audit":
            findings = d.get("findings") or []
            data = {k: v for k, v in d.items() if k != "findings"}
            data["findings_count"] = len(findings)
            for f in findings:
                if not isinstance(f, dict):
                    continue
                subject = str(f.get("subject", ""))
                m = SUBJECT_PORT.match(subject)
                rows["audit_findings"].append(
                    (
                        run,
                        at,
                        str(f.get("kind", "")),
                        str(f.get("severity", "")),
                        subject,
                        m["host"]
                        if m
                        else (subject if subject in self.builder.host_ports else None),
                        m["hca"] if m else None,
                        int(m["port"]) if m else None,
                        f.get("expected"),
                        f.get("observed"),
                        f.get("detail"),
                    )
                )
        rows["events"].append(
            (run, c.seq, c.kind, at, host, hca, port, rail, leaf, su, json.dumps(data))
        )
        for call in self.order.expire(at):  # events that waited too long for a hole to fill
            touched += call()
        return list(dict.fromkeys(touched))  # each incident once, in order


def write_incident(
    conn: sqlite3.Connection, inc: Incident, *, run_id: int, run_start: float
) -> None:
    """Insert ``inc``'s ``outages`` row (its id into ``inc.row_id``) or update it, and add the
    ``outage_ports`` rows of the ports that joined since (``inc.new_ports``, then cleared).
    ``run_start``: the run's window start (Unix s; ``at_s`` is relative to it)."""
    values = (
        inc.kind,
        inc.down_s,
        len(inc.ports),
        int(inc.isolated),
        int(inc.open),
        inc.reroute,
        inc.reroute_ms,
        inc.cause,
    )
    if inc.row_id is None:
        cur = conn.execute(
            "INSERT INTO outages (run_id, at, at_s, kind, down_s, ports, isolated, open,"
            " reroute, reroute_ms, cause) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, inc.at, round(inc.at - run_start, 6), *values),
        )
        inc.row_id = int(cur.lastrowid or 0)
    else:
        conn.execute(  # ``at`` too: a journaled event that came late may start it earlier
            "UPDATE outages SET kind=?, down_s=?, ports=?, isolated=?, open=?, reroute=?,"
            " reroute_ms=?, cause=?, at=?, at_s=? WHERE id=?",
            (*values, inc.at, round(inc.at - run_start, 6), inc.row_id),
        )
    if inc.new_ports:
        conn.executemany(
            "INSERT OR IGNORE INTO outage_ports VALUES (?,?,?,?,?,?,?)",
            [
                (inc.row_id, *k, inc.ports[k].rail, inc.ports[k].leaf, inc.ports[k].su)
                for k in inc.new_ports
            ],
        )
        inc.new_ports = []
