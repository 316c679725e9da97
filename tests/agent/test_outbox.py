"""The agent's outbox (linkguard.agent.outbox): latest wins per key, in first-put order, an
ack of epoch N never after one of N+1, the bound. The bus side is tests/test_ack_outbox_bus.py."""

from __future__ import annotations

import pytest

from linkguard.agent.outbox import Outbox


def test_a_newer_message_replaces_a_waiting_one_in_its_place() -> None:
    box = Outbox()
    box.put("ack", "t/ack", b"epoch 1", retain=True)
    box.put("ev#1", "t/events", b"event 1", retain=False)
    box.put("ack", "t/ack", b"epoch 2", retain=True)
    first, second = box.take(), None
    assert first is not None and (first.topic, first.payload, first.retain) == (
        "t/ack",
        b"epoch 2",
        True,
    )
    box.done()
    second = box.take()
    assert second is not None and second.payload == b"event 1"
    box.done()
    assert box.take() is None and box.replaced == 1


def test_an_older_ack_is_never_handed_out_after_a_newer_one() -> None:
    box = Outbox()
    box.put("ack", "t/ack", b"1", retain=True)
    sent = [box.take()]
    assert box.in_flight == "ack" and not box.superseded()
    box.put("ack", "t/ack", b"2", retain=True)
    assert box.superseded()  # the wiring stops waiting for 1's PUBACK
    box.done()
    box.put("ack", "t/ack", b"3", retain=True)
    sent.append(box.take())
    box.done()
    assert [m.payload for m in sent if m is not None] == [b"1", b"3"]
    assert not box.superseded() and len(box) == 0


def test_past_its_bound_the_oldest_waiting_message_is_dropped_and_counted() -> None:
    box = Outbox(limit=2)
    for i in range(3):
        box.put(f"k{i}", "t", str(i).encode(), retain=False)
    assert len(box) == 2 and box.dropped == 1
    out = box.take()
    assert out is not None and out.payload == b"1"
    box.clear()
    assert box.take() is None
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Outbox(limit=0)
