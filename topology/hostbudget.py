"""What one host may cost the topology service: :class:`HostBudget`.

Consumes: each message under ``hosts/<host>/...`` of a fabric host (its host, topic, size in
bytes) and ``now`` (monotonic s, the caller's), with the limits of
:class:`~linkguard.config.HostBudgetSettings`. Produces: admit or the reason to drop it
(``messages``, ``bytes``, ``retained_topics``), decided before the message is decoded, with
the drops counted by reason (:attr:`HostBudget.dropped`) and a log line at most once per host
per :data:`LOG_INTERVAL_S` (:class:`Exceeded`).

Two token buckets per host (messages, bytes): a bucket holds up to its burst, refills at its
rate, and a message takes one token from the first and its size from the second, both or
neither (the classic token bucket: J. Turner, "New directions in communications", IEEE
Communications Magazine 24(10), 1986; RFC 2697 uses the same with two rates). A message larger
than the byte burst can never pass. Retained topics: the distinct topics a host publishes on
are counted (a live delivery carries no retain flag, MQTT 3.1.1 section 3.3.1.3, so every topic
counts; all of a host's but ``events`` and ``probes`` are retained ones; an empty payload
deletes one); a new one past the limit is dropped, so a host cannot make the service track
(and re-read at every start) an unbounded set (issue 21: 110,000 retained junk messages slowed
every service start to 4.3 s). Pure: no clock, no I/O;
bounded by the fabric's hosts (the caller asks only for those).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from linkguard.config import HostBudgetSettings
from linkguard.topology.effects import Effect, Log

__all__ = ["LOG_INTERVAL_S", "Exceeded", "HostBudget", "OverBudget"]

#: a host over its budget is logged at most once per this many seconds (CODING_STYLE: a bad
#: input is logged once, then counted)
LOG_INTERVAL_S = 60.0

OverBudget = Literal["messages", "bytes", "retained_topics"]


@dataclass(frozen=True)
class Exceeded:
    """A drop to log: ``host`` went over its budget (``reason``); ``dropped``: its messages
    dropped since the last line for it (this one included)."""

    host: str
    reason: OverBudget
    dropped: int


@dataclass
class _Host:
    messages: float
    bytes: float
    at: float
    retained: set[str] = field(default_factory=set)
    logged_at: float | None = None
    unlogged: int = 0


class HostBudget:
    """Per-host token buckets and retained-topic counts (module docstring)."""

    def __init__(self, limits: HostBudgetSettings) -> None:
        self.limits = limits
        self._hosts: dict[str, _Host] = {}
        #: messages dropped since start, by reason
        self.dropped: Counter[str] = Counter()

    def admit(self, host: str, topic: str, size: int, *, now: float) -> OverBudget | None:
        """None when ``host``'s message (``size`` bytes on ``topic``) fits its budget at
        ``now`` (its tokens taken); else why it does not (counted; nothing taken)."""
        lim = self.limits
        h = self._hosts.get(host)
        if h is None:
            h = self._hosts[host] = _Host(float(lim.messages_burst), float(lim.bytes_burst), now)
        dt = max(0.0, now - h.at)
        h.at = now
        h.messages = min(float(lim.messages_burst), h.messages + dt * lim.messages_per_s)
        h.bytes = min(float(lim.bytes_burst), h.bytes + dt * lim.bytes_per_s)
        reason: OverBudget | None = None
        if size and topic not in h.retained and len(h.retained) >= lim.retained_topics:
            reason = "retained_topics"
        elif h.messages < 1:
            reason = "messages"
        elif h.bytes < size:
            reason = "bytes"
        if reason is not None:
            self.dropped[reason] += 1
            h.unlogged += 1
            return reason
        h.messages -= 1
        h.bytes -= size
        if size:
            h.retained.add(topic)
        else:
            h.retained.discard(topic)  # an empty retained message deletes it on the broker
        return None

    def to_log(self, host: str, reason: OverBudget, now: float) -> Exceeded | None:
        """The line to log for a drop of ``host``'s just counted, or None when one was logged
        less than :data:`LOG_INTERVAL_S` ago."""
        h = self._hosts[host]
        if h.logged_at is not None and now - h.logged_at < LOG_INTERVAL_S:
            return None
        h.logged_at = now
        out = Exceeded(host, reason, h.unlogged)
        h.unlogged = 0
        return out

    def check(self, host: str, topic: str, size: int, *, now: float) -> list[Effect] | None:
        """:meth:`admit` for the service's core: None to go on with the message, else the
        effects of its drop (a ``host_budget_exceeded`` warning when due, else none)."""
        reason = self.admit(host, topic, size, now=now)
        if reason is None:
            return None
        line = self.to_log(host, reason, now)
        if line is None:
            return []
        fields = {
            "host": host,
            "reason": reason,
            "dropped": line.dropped,
            "topic": topic,
            "bytes": size,
            "hint": "this host publishes more than host_budget allows: a broken or compromised "
            "agent (its messages are dropped unread until it slows down)",
        }
        return [Log("warning", "host_budget_exceeded", fields)]

    def forget(self, host: str) -> None:
        """Drop what is kept of ``host`` (it left the fabric)."""
        self._hosts.pop(host, None)
