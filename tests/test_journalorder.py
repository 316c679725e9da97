"""Journaled port events reach the incident builder in their journal's order
(:mod:`linkguard.journalorder`), found by the lab chaos run (issue 21): a port's ``down`` that
was lost on the way and replayed after the port's own later events opened an outage nothing
closed, and ``linkguard report`` showed it open for the whole window. The order, pure; then
the ledger (a real SQLite file) and ``linkguard report`` on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from linkguard.agent.journal import EventJournal
from linkguard.journalorder import JournalOrder
from linkguard.ledger import Ledger
from linkguard.models import PortEvent, PortStatus
from linkguard.topology.changes import Change
from linkguard.topology.fabric import generate_rail_optimized

JID = "0123456789abcdef"
FABRIC = generate_rail_optimized(hosts=2, rails=2)
T0 = 1_700_000_000.0


def test_a_host_s_events_come_out_in_its_journal_s_order() -> None:
    o: JournalOrder[str] = JournalOrder(hold_s=60)
    assert o.offer("h", JID, 1, "e1", at=0.0, held_from=1) == ["e1"]
    assert o.offer("h", JID, 3, "e3", at=1.0, held_from=2) == []  # 2 is still to come
    assert o.offer("h", JID, 4, "e4", at=1.1, held_from=2) == []
    assert o.waiting == 2
    assert o.offer("h", JID, 2, "e2", at=5.0, held_from=2) == ["e2", "e3", "e4"]
    assert o.offer("h", JID, 2, "e2 again", at=6.0) == ["e2 again"]  # a replay: at once
    # another host, and a new journal id for the first one, each start on their own
    assert o.offer("g", JID, 7, "g7", at=7.0, held_from=7) == ["g7"]
    assert o.offer("h", "fedcba9876543210", 1, "n1", at=8.0, held_from=1) == ["n1"]


def test_what_the_journal_gave_up_on_or_a_hole_that_stays_open_holds_nothing_for_good() -> None:
    o: JournalOrder[str] = JournalOrder(hold_s=60)
    assert o.offer("h", JID, 1, "e1", at=0.0, held_from=1) == ["e1"]
    assert o.offer("h", JID, 5, "e5", at=1.0, held_from=2) == []
    # the journal dropped 2..4 past its bound: they will not come
    assert o.offer("h", JID, 6, "e6", at=2.0, held_from=2, lost_to=4) == ["e5", "e6"]
    assert o.offer("h", JID, 8, "e8", at=3.0) == []  # 7 lost on the way, never replayed
    assert o.offer("h", JID, 9, "e9", at=4.0) == []
    assert o.expire(62.9) == []
    assert o.expire(63.0) == ["e8", "e9"]
    assert o.waiting == 0
    assert o.offer("h", JID, 10, "e10", at=64.0) == ["e10"]


def _changes(events: list[PortEvent], order: list[int], t: float) -> list[Change]:
    return [
        Change(i + 1, "port_event", t + i * 0.1, events[k].model_dump(mode="json"))
        for i, k in enumerate(order)
    ]


def test_a_replayed_down_after_the_port_s_later_events_is_one_closed_outage(
    tmp_path: Path,
) -> None:
    """The lab chaos run's case: a port's ``down`` (seq 1) is lost, its ``down -> held_down``
    and ``held_down -> up`` arrive, then the replayed ``down``. The ledger's outage starts at
    the agent's ``down`` and lasts until its ``held_down``, closed; the report says so."""
    j = EventJournal(JID, limit=8)

    def ev(at: float, previous: str, current: str) -> PortEvent:
        return PortEvent(
            host="gpu000",
            hca="mlx5_1",
            port=1,
            rail=1,
            previous=PortStatus(previous),
            current=PortStatus(current),
            at=at,
        )

    events = j.record(
        [
            ev(T0 + 1.0, "up", "down"),
            ev(T0 + 3.5, "down", "held_down"),
            ev(T0 + 4.0, "held_down", "up"),
        ]
    )
    path = tmp_path / "l.sqlite3"
    with Ledger(path) as led:
        led.start_run(FABRIC, source="service", window_start=T0 - 10)
        # 1 lost on the way; the replay of everything unconfirmed after a reconnect: 1, 2, 3
        led.write(_changes(events, [1, 2, 0, 1, 2], T0 + 5), now=T0 + 6)
        outages = led._conn.execute("SELECT at, down_s, open, ports FROM outages").fetchall()
        rows = led._conn.execute("SELECT seq, at FROM port_events ORDER BY id").fetchall()

    assert rows == [(2, T0 + 3.5), (3, T0 + 4.0), (1, T0 + 1.0)]  # as they came, each once
    assert outages == [(T0 + 1.0, 2.5, 0, 1)]
    report = subprocess.run(
        [sys.executable, "-m", "linkguard.cli", "report", "--ledger", str(path), "--format",
         "json"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    listed = json.loads(report.stdout)["outages"]
    assert [(o["at"], o["down_s"], o["open"]) for o in listed] == [(T0 + 1.0, 2.5, False)]
