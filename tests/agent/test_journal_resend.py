"""The journal's timed re-send (:meth:`linkguard.agent.journal.EventJournal.resend_due`), pure:
an unconfirmed event goes again after ``after_s``, then after a doubling wait capped at
``max_s``; a confirmed one never. The bus side is tests/test_journal_resend_bus.py."""

from __future__ import annotations

from linkguard.agent.core import AgentCore
from linkguard.agent.effects import PublishEvent
from linkguard.agent.journal import EventJournal
from linkguard.models import EventsConfirmed, PortEvent, PortStatus

JID = "0123456789abcdef"


def _ev(at: float) -> PortEvent:
    return PortEvent(
        host="gpu000",
        hca="mlx5_1",
        port=1,
        rail=1,
        previous=PortStatus.UP,
        current=PortStatus.DOWN,
        at=at,
    )


def test_an_unconfirmed_event_goes_again_with_a_capped_back_off() -> None:
    j = EventJournal(JID, limit=8)
    j.record([_ev(1.0)])
    sent_at = []
    now, due = 100.0, None
    assert j.resend_due(now, after_s=1, max_s=3) == ([], 101.0)  # first seen: scheduled
    for now in [100.5, 101.0, 102.9, 103.0, 105.0, 106.0, 108.9, 109.0]:
        events, due = j.resend_due(now, after_s=1, max_s=3)
        if events:
            assert [e.seq for e in events] == [1] and events[0].held_from == 1
            sent_at.append(now)
    # waits 1, 2, 3 (capped), 3
    assert sent_at == [101.0, 103.0, 106.0, 109.0] and due == 112.0 and j.resent == 4


def test_a_confirmed_event_is_never_sent_again_and_nothing_held_means_no_timer() -> None:
    j = EventJournal(JID, limit=8)
    j.record([_ev(1.0), _ev(2.0)])
    j.resend_due(0.0, after_s=1, max_s=60)
    assert j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=1))
    events, due = j.resend_due(1.0, after_s=1, max_s=60)
    assert [e.seq for e in events] == [2] and due == 3.0
    assert j.confirm(EventsConfirmed(host="gpu000", journal=JID, upto=2))
    assert j.resend_due(10.0, after_s=1, max_s=60) == ([], None)


def test_the_core_turns_due_events_into_replayed_publishes() -> None:
    core = AgentCore(host="gpu000", netdevs=[], prefixes=[], journal_resend_s=(2.0, 8.0))
    assert core.due(0.0) == ([], None)  # no journal
    core.use_journal(EventJournal(JID, limit=8))
    assert core.journal is not None
    core.journal.record([_ev(1.0)])
    assert core.due(10.0) == ([], 12.0)
    effects, due = core.due(12.0)
    assert [(type(e), e.replay) for e in effects if isinstance(e, PublishEvent)] == [
        (PublishEvent, True)
    ]
    assert due == 16.0 and core.stats.journal_resent == 1
