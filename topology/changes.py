"""The topology service's change feed: what changed in the fabric, in the order the service saw
it, for the ledger, the HTTP API's stream and the dashboard.

Consumes: :meth:`ChangeFeed.emit` calls from :mod:`linkguard.topology.service` (one per
accepted change). Produces: :class:`Change` records, numbered from 1, to every subscriber:
synchronous callbacks (:meth:`ChangeFeed.subscribe`, called inside ``emit``; they must not
block: the ledger queues its writes) and asyncio queues (:meth:`ChangeFeed.listen`, one per
stream client; a client that falls ``queue_size`` changes behind gets one ``resync`` change and
loses the rest until it reads again). The last ``backlog`` changes stay readable
(:meth:`ChangeFeed.since`), so a stream client that reconnects with its last seen ``seq``
(SSE ``Last-Event-ID``) misses nothing younger.

Kinds and their ``data`` (JSON-ready dicts):

- ``port``: a port's :class:`~linkguard.models.PortState` (``model_dump(mode="json")``) when
  what the dashboard shows of it changed: status, usable, reason, rate, suppressed, flaps or
  hold-down (the agents' periodic re-publish of the same state is not a change);
- ``port_event``: an agent's :class:`~linkguard.models.PortEvent` (a status transition);
- ``journal_gap``: numbers of an agent's event journal that are missing for good (the
  journal's bound was passed while the service did not confirm them): ``host``,
  ``journal``, ``seq_from``, ``seq_to``, ``events``, ``at`` (the agent's time of the event
  that reported it; :mod:`linkguard.topology.journaldesk`);
- ``host``: a :class:`~linkguard.models.HostStatus` (agent online / offline);
- ``plans``: a publish: ``epoch``, ``hosts`` (re-planned), ``peer_routes`` (impaired hosts
  whose peer routes went out), ``solve_ms``, ``messages``;
- ``ack``: an :class:`~linkguard.models.Ack`;
- ``audit``: the fleet audit document (``service/audit``);
- ``health``: the switch-level health document (``service/health``);
- ``resync`` (stream clients only): changes were lost; reload the state.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog

__all__ = ["KINDS", "Change", "ChangeFeed"]

log = structlog.get_logger(__name__)

KINDS = ("port", "port_event", "journal_gap", "host", "plans", "ack", "audit", "health")


@dataclass(frozen=True)
class Change:
    """One change: ``seq`` (1, 2, ... per service run), ``kind`` (see the module), ``at``
    (wall-clock s since the Unix epoch, when the service took it), ``data``."""

    seq: int
    kind: str
    at: float
    data: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "at": self.at, "data": self.data}


class ChangeFeed:
    """See the module docstring. ``backlog``: changes kept for :meth:`since`."""

    def __init__(self, *, backlog: int = 4096) -> None:
        self.seq = 0
        self._backlog: deque[Change] = deque(maxlen=backlog)
        self._callbacks: list[Callable[[Change], None]] = []
        self._queues: list[asyncio.Queue[Change]] = []

    def emit(self, kind: str, data: dict[str, Any], *, at: float | None = None) -> Change:
        """Number ``data`` as the next change of ``kind`` and hand it to every subscriber. A
        callback that raises is logged and skipped; the others still get the change. Raises
        ValueError for a kind not in :data:`KINDS`."""
        if kind not in KINDS:
            raise ValueError(f"unknown change kind {kind!r}; one of {', '.join(KINDS)}")
        self.seq += 1
        change = Change(self.seq, kind, time.time() if at is None else at, data)
        self._backlog.append(change)
        for cb in list(self._callbacks):
            try:
                cb(change)
            except Exception as exc:  # a broken consumer must not stop the service
                log.error("change_consumer_failed", consumer=repr(cb), error=repr(exc))
        for q in self._queues:
            if q.full():
                continue  # its resync marker is already queued
            if q.qsize() == q.maxsize - 1:
                q.put_nowait(Change(change.seq, "resync", change.at, {"lost_from": change.seq}))
            else:
                q.put_nowait(change)
        return change

    def subscribe(self, callback: Callable[[Change], None]) -> Callable[[], None]:
        """Call ``callback(change)`` on every change from now on; returns the unsubscribe."""
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback)

    @contextmanager
    def listen(self, *, queue_size: int = 1024) -> Iterator[asyncio.Queue[Change]]:
        """A queue that receives every change while the ``with`` block lasts (a stream
        client). ``queue_size`` >= 2."""
        q: asyncio.Queue[Change] = asyncio.Queue(maxsize=max(2, queue_size))
        self._queues.append(q)
        try:
            yield q
        finally:
            self._queues.remove(q)

    def since(self, seq: int) -> list[Change] | None:
        """The changes after ``seq`` still in the backlog, oldest first; None when some of
        them already left it (the caller must reload the state)."""
        if seq >= self.seq:
            return []
        kept = list(self._backlog)
        if not kept or kept[0].seq > seq + 1:
            return None
        return [c for c in kept if c.seq > seq]

    def backlog(self) -> list[Change]:
        """Every change still kept, oldest first."""
        return list(self._backlog)

    @property
    def listeners(self) -> int:
        return len(self._queues)
