"""The event journal's decisions (:mod:`linkguard.agent.journal`) and the service's side of it
(:mod:`linkguard.topology.journaldesk`), pure; the journal file over a restart
(:class:`~linkguard.agent.statefiles.StateFiles`); the ledger's de-duplication and gap rows
and its schema 1 -> 2 migration."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from linkguard.agent.journal import EventJournal
from linkguard.agent.monitor import DampingPolicy, PortMonitor
from linkguard.agent.statefiles import StateFiles
from linkguard.incidents import IncidentBuilder, PortPlace
from linkguard.ledger import Ledger
from linkguard.models import EventsConfirmed, PortEvent, PortStatus
from linkguard.topology.changes import Change
from linkguard.topology.effects import Emit, Log, PublishConfirmed
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.journaldesk import JournalDesk

JID = "0123456789abcdef"


def _ev(at: float, current: str = "down", previous: str = "up", hca: str = "mlx5_1") -> PortEvent:
    return PortEvent(
        host="gpu000",
        hca=hca,
        port=1,
        rail=1,
        previous=PortStatus(previous),
        current=PortStatus(current),
        at=at,
    )


def test_events_are_numbered_and_held_until_confirmed() -> None:
    j = EventJournal(JID, limit=8)
    sent = j.record([_ev(1.0), _ev(2.0, "held_down", "down")])
    assert [(e.seq, e.journal, e.held_from, e.lost_from) for e in sent] == [
        (1, JID, 1, None),
        (2, JID, 1, None),
    ]
    assert [e.seq for e in j.pending()] == [1, 2]
    assert not j.confirm(EventsConfirmed(host="gpu000", journal="ffffffffffffffff", upto=2))
    assert j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=1))
    assert [(e.seq, e.held_from) for e in j.pending()] == [(2, 2)]
    assert not j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=1))  # nothing new
    assert j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=2))
    assert j.pending() == [] and j.held_from == 3


def test_past_the_bound_the_oldest_go_into_the_lost_range_and_nothing_is_invented() -> None:
    j = EventJournal(JID, limit=3)
    sent = j.record([_ev(float(t)) for t in range(1, 6)])  # 5 events, room for 3
    assert [e.seq for e in sent] == [3, 4, 5]
    assert j.lost == (1, 2)
    assert [(e.seq, e.held_from, e.lost_from, e.lost_to) for e in j.pending()] == [
        (3, 3, 1, 2),
        (4, 3, 1, 2),
        (5, 3, 1, 2),
    ]
    j.record([_ev(6.0)])
    assert j.lost == (1, 3) and [e.seq for e in j.pending()] == [4, 5, 6]
    # the service recorded the gap and event 4: the range is gone, 5 and 6 are held
    assert j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=4))
    assert j.lost is None and [(e.seq, e.lost_from) for e in j.pending()] == [(5, None), (6, None)]


def test_the_journal_file_carries_the_numbering_over_a_restart(tmp_path: Path) -> None:
    files = StateFiles(
        tmp_path,
        monitor=PortMonitor(host="gpu000", policy=DampingPolicy()),
        counter_health_enabled=False,
    )
    j = files.load_journal(limit=4, host="gpu000")
    j.record([_ev(1.0), _ev(2.0, "held_down", "down")])
    j.confirm(EventsConfirmed(host="gpu000", journal=j.journal, upto=1))
    files.save_journal(j)
    again = files.load_journal(limit=4, host="gpu000")
    assert (again.journal, again.next_seq, again.confirmed) == (j.journal, 3, 1)
    assert [e.seq for e in again.pending()] == [2]
    assert [e.seq for e in again.record([_ev(3.0, "up", "held_down")])] == [3]
    # a smaller bound after the restart: the oldest held ones become the lost range
    files.save_journal(again)
    smaller = files.load_journal(limit=1, host="gpu000")
    assert smaller.lost == (2, 2) and [e.seq for e in smaller.pending()] == [3]
    # a corrupt file: moved aside, a new journal (new id: the service starts it from 0)
    files.journal_path.write_text("{not json")
    fresh = files.load_journal(limit=4, host="gpu000")
    assert fresh.journal != j.journal and fresh.next_seq == 1
    assert (tmp_path / "events.json.bad").read_text() == "{not json"
    # another host's journal is not taken
    files.save_journal(j)
    doc = json.loads(files.journal_path.read_text())
    assert doc["held"]
    assert files.load_journal(limit=4, host="gpu001").journal != j.journal


def _kinds(effects: list) -> list[str]:
    return [e.kind if isinstance(e, Emit) else type(e).__name__ for e in effects]


def test_the_service_takes_each_number_once_and_confirms() -> None:
    desk = JournalDesk()
    j = EventJournal(JID, limit=8)
    a, b = j.record([_ev(1.0), _ev(2.0, "held_down", "down")])
    assert _kinds(desk.on_event(b)) == ["port_event", "PublishConfirmed"]  # 2 before 1
    out = desk.on_event(a)
    assert _kinds(out) == ["port_event", "PublishConfirmed"]
    assert isinstance(out[-1], PublishConfirmed) and out[-1].confirmed.upto == 2
    again = desk.on_event(j.pending()[0])  # a replay: dropped, confirmed again
    assert _kinds(again) == ["Log", "PublishConfirmed"] and desk.duplicates["gpu000"] == 1
    # a new journal (the agent's state dir was wiped) starts again from 1
    fresh = EventJournal("fedcba9876543210", limit=8).record([_ev(3.0)])[0]
    assert _kinds(desk.on_event(fresh)) == ["port_event", "PublishConfirmed"]


def test_a_lost_range_is_one_gap_and_a_restarted_service_trusts_held_from() -> None:
    j = EventJournal(JID, limit=2)
    j.record([_ev(float(t)) for t in range(1, 6)])  # 1..3 lost, 4 and 5 held
    desk = JournalDesk()
    out = desk.on_event(j.pending()[0])
    gaps = [e.data for e in out if isinstance(e, Emit) and e.kind == "journal_gap"]
    assert gaps == [
        {"host": "gpu000", "journal": JID, "seq_from": 1, "seq_to": 3, "events": 3, "at": 4.0}
    ]
    assert any(isinstance(e, Log) and e.event == "journal_gap" for e in out)
    out = desk.on_event(j.pending()[1])
    assert "journal_gap" not in _kinds(out) and out[-1].confirmed.upto == 5  # type: ignore[union-attr]
    # a service that knows nothing (restarted): held_from says 1..5 are settled, no gap
    j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=5))
    later = j.record([_ev(9.0)])[0]
    assert (later.seq, later.held_from, later.lost_from) == (6, 6, None)
    out = JournalDesk().on_event(later)
    assert _kinds(out) == ["port_event", "PublishConfirmed"]
    assert out[-1].confirmed.upto == 6  # type: ignore[union-attr]


def test_an_event_without_a_journal_passes_as_before() -> None:
    assert _kinds(JournalDesk().on_event(_ev(1.0))) == ["port_event"]


def test_bad_journal_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="seq and journal"):
        PortEvent.model_validate({**_ev(1.0).model_dump(), "seq": 3})
    with pytest.raises(ValueError, match="no range below"):
        PortEvent.model_validate(
            {**_ev(1.0).model_dump(), "seq": 3, "journal": JID, "lost_from": 2, "lost_to": 3}
        )


FABRIC = generate_rail_optimized(hosts=2, rails=2)


def _change(seq: int, kind: str, data: dict, at: float) -> Change:
    return Change(seq, kind, at, data)


def test_the_ledger_records_a_replayed_event_once_with_the_agents_time(tmp_path: Path) -> None:
    """The port's state at the reconnect opens the outage at the service's time; the
    replayed events move it to the agent's times; the same events again (a replay the
    service could not tell) add no row; a gap is a row of its own."""
    path = tmp_path / "l.sqlite3"
    j = EventJournal(JID, limit=8)
    down, back = j.record([_ev(1_700_000_000.0), _ev(1_700_000_004.5, "held_down", "down")])
    state = {"host": "gpu000", "hca": "mlx5_1", "port": 1, "status": "held_down"}
    with Ledger(path) as led:
        led.start_run(FABRIC, source="service", window_start=1_699_999_990.0)
        t = 1_700_000_010.0  # the reconnect: the service's time
        led.write(
            [
                _change(1, "port", {**state, "status": "up"}, t - 20),
                _change(2, "port", {**state, "status": "down"}, t),
                _change(3, "port_event", down.model_dump(mode="json"), t + 0.1),
                _change(4, "port_event", back.model_dump(mode="json"), t + 0.2),
                _change(5, "port_event", down.model_dump(mode="json"), t + 0.3),
                _change(
                    6,
                    "journal_gap",
                    {"host": "gpu000", "journal": JID, "seq_from": 7, "seq_to": 9},
                    t + 0.4,
                ),
            ],
            now=t + 1,
        )
        rows = led._conn.execute("SELECT at, current, seq FROM port_events").fetchall()
        outages = led._conn.execute("SELECT at, down_s FROM outages").fetchall()
        gaps = led._conn.execute("SELECT host, seq_from, seq_to FROM journal_gaps").fetchall()
    assert rows == [(1_700_000_000.0, "down", 1), (1_700_000_004.5, "held_down", 2)]
    assert outages == [(1_700_000_000.0, 4.5)]
    assert gaps == [("gpu000", 7, 9)]
    with Ledger(path, create=False) as led:  # the next service run gets the same replay
        led.start_run(FABRIC, source="service", window_start=1_700_000_020.0)
        led.write(
            [
                _change(1, "port_event", down.model_dump(mode="json"), 1_700_000_021.0),
                _change(2, "port_event", back.model_dump(mode="json"), 1_700_000_021.1),
            ],
            now=1_700_000_022.0,
        )
        assert (led.count("port_events"), led.count("outages"), led.count("events")) == (
            2,
            1,
            5,
        )  # the duplicates: no row


def test_a_schema_1_ledger_is_migrated_when_a_service_opens_it(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    Ledger(path).close()
    conn = sqlite3.connect(path)  # back to what schema 1 had
    conn.executescript(
        "DROP INDEX port_events_journal; DROP TABLE journal_gaps;"
        "ALTER TABLE port_events DROP COLUMN journal; ALTER TABLE port_events DROP COLUMN seq;"
        "UPDATE meta SET value='1' WHERE key='schema_version';"
        "INSERT INTO port_events (run_id, at, host, hca, port, previous, current)"
        " VALUES (1, 5.0, 'gpu000', 'mlx5_1', 1, 'up', 'down');"
    )
    conn.commit()
    conn.close()
    with Ledger(path, create=False, read_only=True) as ro:  # the report reads it as it is
        assert ro.schema_version == 1
    with Ledger(path, create=False) as led:
        assert led.schema_version == 2 and led.count("journal_gaps") == 0
        assert led._conn.execute("SELECT at, journal, seq FROM port_events").fetchall() == [
            (5.0, None, None)
        ]


def test_once_a_host_journals_its_states_open_nothing() -> None:
    """(Pure.) After a host's first journaled event, a state seeds a port's status and opens
    nothing: the replayed event that follows it opens the incident at the agent's time."""
    b = IncidentBuilder({("h", "x", 1): PortPlace(1, None, None)})
    b.on_status(("h", "x", 2), "up", 1.0, previous="unknown", journaled=True)
    assert b.on_status(("h", "x", 1), "up", 2.0) == []
    assert b.on_status(("h", "x", 1), "down", 10.0) == []
    touched = b.on_status(("h", "x", 1), "down", 3.0, previous="up", journaled=True)
    assert [(i.at, i.open) for i in touched] == [(3.0, True)]
    touched = b.on_status(("h", "x", 1), "held_down", 4.5, previous="down", journaled=True)
    assert [(i.at, i.down_s) for i in touched] == [(3.0, 1.5)]


def test_the_agent_replays_to_a_service_that_connects_or_restarts() -> None:
    """(Pure, the core.) A live ``service/status`` (the service just connected) or a retained
    one of another instance gets the held events again; the same instance retained, or an
    offline one, does not."""
    from linkguard.agent.core import AgentCore
    from linkguard.agent.effects import PublishEvent
    from linkguard.models import ServiceStatus

    core = AgentCore(host="gpu000", netdevs=(), prefixes=())
    core.use_journal(EventJournal(JID, limit=8))
    core.journal.record([_ev(1.0)])  # type: ignore[union-attr]
    one = ServiceStatus(online=True, instance="aa", started_at=1.0)
    assert core.on_service_status(one, retained=True) == []  # first sight: the announce's
    replayed = core.on_service_status(one, retained=False)
    assert [(type(e), e.replay) for e in replayed] == [(PublishEvent, True)]  # type: ignore[union-attr]
    assert core.on_service_status(one, retained=True) == []
    assert len(core.on_service_status(one, retained=False)) == 1
    assert core.on_service_status(one.model_copy(update={"online": False}), retained=False) == []
    assert (
        len(core.on_service_status(one.model_copy(update={"instance": "bb"}), retained=True)) == 1
    )
    assert core.on_events_confirmed(EventsConfirmed(host="gpu000", journal=JID, upto=1)) == []
    assert core.replay_events() == [] and core.stats.journal_held == 0
