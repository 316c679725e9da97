"""The per-host budget's decisions (:mod:`linkguard.topology.hostbudget`), driven by ``now``."""

from __future__ import annotations

from linkguard.config import HostBudgetSettings
from linkguard.topology.effects import Log
from linkguard.topology.hostbudget import LOG_INTERVAL_S, HostBudget

LIMITS = HostBudgetSettings(
    messages_per_s=10, messages_burst=5, bytes_per_s=1000, bytes_burst=2048, retained_topics=8
)


def test_messages_refill_at_their_rate_after_the_burst() -> None:
    b = HostBudget(LIMITS)
    assert [b.admit("h", "t", 10, now=0.0) for _ in range(6)] == [None] * 5 + ["messages"]
    assert b.admit("h", "t", 10, now=0.05) == "messages"  # half a token back
    assert b.admit("h", "t", 10, now=0.1) is None  # one token back (10/s)
    assert b.admit("other", "t", 10, now=0.1) is None  # its own bucket
    assert b.dropped == {"messages": 2}


def test_bytes_a_message_above_the_burst_never_passes() -> None:
    b = HostBudget(LIMITS)
    assert b.admit("h", "t", 4096, now=0.0) == "bytes"
    assert b.admit("h", "t", 4096, now=1e6) == "bytes"
    assert b.admit("h", "t", 2000, now=1e6) is None
    assert b.admit("h", "t", 1000, now=1e6) == "bytes"  # 48 bytes left
    assert b.admit("h", "t", 1000, now=1e6 + 1.0) is None  # 1000 B/s refilled


def test_a_new_topic_past_the_limit_is_dropped_and_an_empty_one_frees_it() -> None:
    b = HostBudget(LIMITS.model_copy(update={"messages_burst": 100}))
    for i in range(8):
        assert b.admit("h", f"t{i}", 1, now=float(i)) is None
    assert b.admit("h", "t8", 1, now=10.0) == "retained_topics"
    assert b.admit("h", "t0", 1, now=10.0) is None  # a known topic still passes
    assert b.admit("h", "t0", 0, now=10.0) is None  # deleted: its slot is free
    assert b.admit("h", "t8", 1, now=10.0) is None


def test_a_host_over_budget_is_logged_once_per_interval_with_what_it_lost() -> None:
    b = HostBudget(LIMITS.model_copy(update={"messages_burst": 1, "messages_per_s": 0.001}))
    assert b.check("h", "t", 1, now=0.0) is None
    first = b.check("h", "t", 1, now=0.0)
    assert first is not None and len(first) == 1 and isinstance(first[0], Log)
    assert (first[0].event, first[0].fields["reason"]) == ("host_budget_exceeded", "messages")
    assert all(b.check("h", "t", 1, now=1.0) == [] for _ in range(9))
    again = b.check("h", "t", 1, now=LOG_INTERVAL_S)
    assert again is not None and isinstance(again[0], Log)
    assert again[0].fields["dropped"] == 10  # the 9 unlogged ones and this one
    assert b.dropped == {"messages": 11}
