"""An in-memory MQTT bus with the semantics of :class:`linkguard.bus.Bus` over Mosquitto, for
fleet simulations beyond a few hundred agents (thousands of real agents in one process).

Consumes: the keyword arguments of :class:`~linkguard.bus.Bus` (through
:meth:`MemoryBroker.bus_factory`), publishes, and faults injected on the broker
(:meth:`MemoryBroker.stop` / :meth:`~MemoryBroker.start` = broker outage,
:meth:`~MemoryBroker.kill_client` = one connection cut). Produces:
:class:`~linkguard.bus.BusMessage` to each session's handler, in order, from one consumer task
per session (never inline in the publisher), and the broker's counters.

Semantics copied from Mosquitto 2.0 with MQTT 3.1.1 clean sessions, each checked against the
real thing by tests/test_membus.py:

- filters with ``+`` and ``#`` (``a/#`` matches ``a``; wildcards at the first level never match
  ``$``-topics); one copy per client however many of its filters match a message;
- every SUBSCRIBE delivers the retained messages matching that filter (``retain=True``), live
  messages arrive with ``retain=False``; a zero-length retained publish deletes the retained
  message and still reaches current subscribers (empty payload);
- a will is stored retained and sent to subscribers when the connection is cut
  (:meth:`MemoryBroker.kill_client`) or taken over by a new connection with the same client id,
  never on a clean close (cancellation of :meth:`MemoryBus.run`);
- clean sessions: nothing is queued for a disconnected client; what reached the client before
  the cut is still handled (as aiomqtt drains its queue before raising);
- a broker outage drops every session without wills and loses the retained store (Mosquitto
  without persistence); sessions reconnect with Bus's jittered backoff once it is back,
  resubscribe and call ``on_connect``;
- ``publish`` returns False while disconnected (the message is dropped) and raises ValueError
  on a topic with wildcards or an empty topic; an invalid subscription filter makes ``run``
  raise ValueError (as paho's client-side checks do).

Cost per publish: one dict lookup for exact-topic subscribers plus the wildcard filters that
match the topic (cached per topic), then one deque append per receiving session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import structlog

from linkguard.buslife import BusLife, BusMessage, Handler, Will

__all__ = ["MemoryBroker", "MemoryBus", "matches", "validate_filter", "validate_topic"]

log = structlog.get_logger(__name__)


def validate_topic(topic: str) -> None:
    """ValueError unless ``topic`` can be published to (non-empty, no ``+`` or ``#``), with
    paho's messages."""
    if not topic:
        raise ValueError("Invalid topic.")
    if "+" in topic or "#" in topic:
        raise ValueError("Publish topic cannot contain wildcards.")


def validate_filter(filter_: str) -> None:
    """ValueError unless ``filter_`` is a valid subscription filter: ``+`` and ``#`` take a
    whole level, ``#`` only the last one (paho's messages)."""
    if not filter_:
        raise ValueError("Invalid topic.")
    levels = filter_.split("/")
    for i, level in enumerate(levels):
        if ("+" in level or "#" in level) and len(level) != 1:
            raise ValueError("Invalid subscription filter.")
        if level == "#" and i != len(levels) - 1:
            raise ValueError("Invalid subscription filter.")


def _match_levels(f: tuple[str, ...], t: list[str]) -> bool:
    if t[0].startswith("$") and f[0] in ("+", "#"):
        return False
    n = len(t)
    for i, part in enumerate(f):
        if part == "#":
            return True  # also the parent level: "a/#" matches "a"
        if i >= n or (part != "+" and part != t[i]):
            return False
    return n == len(f)


def matches(filter_: str, topic: str) -> bool:
    """True when the subscription filter ``filter_`` matches the topic ``topic`` (MQTT 3.1.1
    section 4.7). Neither is validated."""
    return _match_levels(tuple(filter_.split("/")), topic.split("/"))


def _is_wildcard(filter_: str) -> bool:
    return "+" in filter_ or "#" in filter_


class _ConnectionLost(Exception):
    """A session ended by the broker (outage, kill, takeover) or a refused connect."""


class _Session:
    """One connected client: its filters and the messages on their way to it."""

    __slots__ = ("client_id", "dropped", "filters", "queue", "waiter", "will")

    def __init__(self, client_id: str, will: Will | None) -> None:
        self.client_id = client_id
        self.will = will
        self.filters: dict[str, None] = {}  # ordered set
        self.queue: deque[BusMessage] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.dropped: str | None = None  # why the broker ended the session

    def push(self, msg: BusMessage) -> int:
        self.queue.append(msg)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return len(self.queue)

    def drop(self, reason: str) -> None:
        self.dropped = reason
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class MemoryBroker:
    """An in-process MQTT 3.1.1 broker model (one event loop; not thread-safe).

    ``broker.bus_factory`` goes wherever a ``Bus`` factory is taken (``SimulatedFleet``,
    ``Agent``, ``TopologyService``). Counters: ``published`` (publishes accepted, wills not
    included), ``delivered`` (messages queued to sessions, retained ones included),
    ``connects`` (sessions opened), ``refused`` (connects while stopped), ``wills`` (wills
    sent), ``takeovers`` (sessions ended by a new connection with the same client id),
    ``max_backlog`` (most messages ever waiting for one session).
    """

    def __init__(self) -> None:
        self._running = True
        self._sessions: dict[str, _Session] = {}
        self._exact: dict[str, dict[_Session, None]] = {}
        self._wild: dict[str, tuple[tuple[str, ...], dict[_Session, None]]] = {}
        self._wild_cache: dict[str, tuple[str, ...]] = {}  # topic -> wildcard filters matching
        self._retained: dict[str, bytes] = {}
        self.published = 0
        self.delivered = 0
        self.connects = 0
        self.refused = 0
        self.wills = 0
        self.takeovers = 0
        self.max_backlog = 0

    def bus_factory(self, **kwargs: Any) -> MemoryBus:
        """A :class:`MemoryBus` on this broker; takes :class:`~linkguard.bus.Bus`'s keyword
        arguments (``host``, ``port``, ``brokers``, credentials and keepalive are accepted and
        ignored)."""
        return MemoryBus(broker=self, **kwargs)

    # -- faults ---------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._running

    def stop(self) -> None:
        """Broker outage: every session drops (no wills: the broker itself is gone), connects
        are refused until :meth:`start`, the retained store is lost. A no-op when stopped."""
        if not self._running:
            return
        self._running = False
        for session in list(self._sessions.values()):
            self._end(session, "broker stopped", will=False)
        self._retained.clear()
        log.info("memory_broker_stopped")

    def start(self) -> None:
        """End an outage: connects succeed again (each client on its own backoff)."""
        if not self._running:
            self._running = True
            log.info("memory_broker_started")

    def kill_client(self, client_id: str) -> None:
        """Cut ``client_id``'s connection without a DISCONNECT: its will is published
        (retained), and its bus reconnects after its backoff, as after a reset TCP connection.
        A no-op when that client is not connected."""
        session = self._sessions.get(client_id)
        if session is not None:
            self._end(session, "connection lost (killed)", will=True)

    # -- inspection -----------------------------------------------------------------------
    @property
    def clients(self) -> list[str]:
        """Client ids connected now, in connection order."""
        return list(self._sessions)

    @property
    def retained(self) -> Mapping[str, bytes]:
        """The retained store, topic -> payload (read-only view)."""
        return MappingProxyType(self._retained)

    def stats(self) -> dict[str, int]:
        """The counters and current sizes, for reports."""
        return {
            "published": self.published,
            "delivered": self.delivered,
            "connects": self.connects,
            "refused": self.refused,
            "wills": self.wills,
            "takeovers": self.takeovers,
            "max_backlog": self.max_backlog,
            "sessions": len(self._sessions),
            "retained": len(self._retained),
            "wildcard_filters": len(self._wild),
        }

    # -- the protocol, called by MemoryBus ------------------------------------------------
    def _connect(self, client_id: str, will: Will | None) -> _Session:
        if not self._running:
            self.refused += 1
            raise _ConnectionLost("connection refused: broker not running")
        old = self._sessions.get(client_id)
        if old is not None:  # Mosquitto disconnects the old connection and sends its will
            self.takeovers += 1
            self._end(old, "session taken over", will=True)
        session = _Session(client_id, will)
        self._sessions[client_id] = session
        self.connects += 1
        return session

    def _subscribe(self, session: _Session, filter_: str) -> None:
        validate_filter(filter_)
        if filter_ not in session.filters:
            session.filters[filter_] = None
            if _is_wildcard(filter_):
                entry = self._wild.get(filter_)
                if entry is None:
                    entry = self._wild[filter_] = (tuple(filter_.split("/")), {})
                    self._wild_cache.clear()
                entry[1][session] = None
            else:
                self._exact.setdefault(filter_, {})[session] = None
        # every SUBSCRIBE (a repeated one too) sends the retained messages of that filter
        if _is_wildcard(filter_):
            levels = tuple(filter_.split("/"))
            found = [
                (t, p) for t, p in self._retained.items() if _match_levels(levels, t.split("/"))
            ]
        else:
            payload = self._retained.get(filter_)
            found = [] if payload is None else [(filter_, payload)]
        for topic, payload in found:
            self._push(session, BusMessage(topic, payload, True))

    def _push(self, session: _Session, msg: BusMessage) -> None:
        backlog = session.push(msg)
        self.delivered += 1
        if backlog > self.max_backlog:
            self.max_backlog = backlog

    def _wildcards_for(self, topic: str) -> tuple[str, ...]:
        found = self._wild_cache.get(topic)
        if found is None:
            levels = topic.split("/")
            found = tuple(f for f, (fl, _) in self._wild.items() if _match_levels(fl, levels))
            self._wild_cache[topic] = found
        return found

    def _publish(self, topic: str, payload: bytes, *, retain: bool) -> None:
        if retain:
            if payload:
                self._retained[topic] = payload
            else:
                self._retained.pop(topic, None)
        exact = self._exact.get(topic)
        wild = self._wildcards_for(topic) if self._wild else ()
        if not wild:
            targets: Mapping[_Session, None] = exact or {}
        else:
            targets = dict(exact) if exact else {}
            for f in wild:
                targets.update(self._wild[f][1])
        if targets:
            msg = BusMessage(topic, payload, False)
            for session in targets:
                self._push(session, msg)

    def _end(self, session: _Session, reason: str | None, *, will: bool) -> None:
        """Remove ``session`` (idempotent); ``reason`` None = the client closed it."""
        if self._sessions.get(session.client_id) is not session:
            return
        del self._sessions[session.client_id]
        for filter_ in session.filters:
            if _is_wildcard(filter_):
                subs = self._wild[filter_][1]
                del subs[session]
                if not subs:
                    del self._wild[filter_]
                    self._wild_cache.clear()
            else:
                subs = self._exact[filter_]
                del subs[session]
                if not subs:
                    del self._exact[filter_]
        if reason is not None:
            session.drop(reason)
        if will and session.will is not None:
            self.wills += 1
            self._publish(session.will.topic, session.will.payload, retain=True)


class MemoryBus(BusLife):
    """One session on a :class:`MemoryBroker`, with :class:`~linkguard.bus.Bus`'s public
    surface: ``async with``, :meth:`close`, :meth:`publish`, :meth:`messages`, :meth:`run`,
    :meth:`wait_connected`, ``connected`` (asyncio.Event), ``connects``.

    :meth:`messages` (:mod:`linkguard.buslife`, the lifetime it shares with the MQTT bus)
    connects, subscribes, calls ``on_connect`` and then yields each message in order; on a
    dropped session it waits ``uniform(min, min(max, min * 2**attempt))`` seconds and
    reconnects. :meth:`run` (the session's one consumer task under ``async with``) hands them
    to ``handler``. They raise only what ``handler``/``on_connect`` raise and ValueError for an
    invalid filter.
    """

    def __init__(
        self,
        *,
        broker: MemoryBroker,
        client_id: str,
        host: str = "memory",
        port: int = 0,
        brokers: Sequence[tuple[str, int]] = (),
        subscriptions: Sequence[str | tuple[str, int]] = (),
        subscribe_qos: int = 1,
        handler: Handler | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        will: Will | None = None,
        username: str | None = None,
        password: str | None = None,
        tls: object = None,
        keepalive_s: int = 15,
        reconnect_min_s: float = 0.2,
        reconnect_max_s: float = 10.0,
        timeout_s: float = 10.0,
        puback_wait: bool = True,
    ) -> None:
        # nothing to reach, encrypt, authenticate or time out; delivery is at once
        del host, port, brokers, subscribe_qos, username, password, tls, keepalive_s, timeout_s
        del puback_wait
        self._broker = broker
        self._client_id = client_id
        self._subscriptions = list(subscriptions)
        self._handler = handler
        self._on_connect = on_connect
        self._will = will
        self._backoff = (reconnect_min_s, reconnect_max_s)
        self._session_now: _Session | None = None
        self._task: asyncio.Task[None] | None = None
        self._lost = (_ConnectionLost,)
        self.connected = asyncio.Event()
        self.connects = 0

    @property
    def broker(self) -> str:
        """Where the session is, for the logs: ``memory``."""
        return "memory"

    async def wait_connected(self, timeout: float) -> None:
        """TimeoutError after ``timeout`` seconds without a connection."""
        async with asyncio.timeout(timeout):
            await self.connected.wait()

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        qos: int = 1,
        wait_puback: bool | None = None,
    ) -> bool:
        """Publish; False (message dropped) when not connected. ValueError on a topic with
        wildcards, an empty topic or a QoS outside 0..2. Yields to the loop once, as a
        network publish does (``wait_puback``: :class:`~linkguard.bus.Bus`'s; delivery here
        is at once)."""
        del wait_puback
        session = self._session_now
        if session is None or session.dropped is not None or not self.connected.is_set():
            log.debug("bus_publish_dropped_disconnected", topic=topic)
            return False
        validate_topic(topic)
        if qos not in (0, 1, 2):
            raise ValueError("Invalid QoS level.")
        broker = self._broker
        broker._publish(topic, bytes(payload), retain=retain)
        broker.published += 1
        await asyncio.sleep(0)
        return True

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[AsyncGenerator[BusMessage, None]]:
        """Connect (refused while the broker is stopped: :class:`_ConnectionLost`), subscribe
        (ValueError for an invalid filter); the session's messages; a clean end (no will)."""
        session = self._broker._connect(self._client_id, self._will)
        self._session_now = session
        try:
            for sub in self._subscriptions:  # (filter, QoS): delivery is in-process
                self._broker._subscribe(session, sub if isinstance(sub, str) else sub[0])
            yield self._consume(session)
        finally:
            self._broker._end(session, None, will=False)  # clean: no will
            self._session_now = None

    async def _after_message(self) -> None:
        await asyncio.sleep(0)  # one message per turn, as aiomqtt's iterator yields

    def _session_lost(self, exc: Exception, *, attempt: int, delay: float) -> None:
        log.warning(
            "bus_disconnected",
            broker=self.broker,
            error=str(exc),
            retry_in_s=round(delay, 2),
            attempt=attempt,
        )

    async def _consume(self, session: _Session) -> AsyncGenerator[BusMessage, None]:
        """The queued messages, until the broker ends the session (:class:`_ConnectionLost`);
        what was queued before the end is still handed out (it had reached the client)."""
        loop = asyncio.get_running_loop()
        queue = session.queue
        while True:
            if queue:
                yield queue.popleft()
                continue
            if session.dropped is not None:
                raise _ConnectionLost(session.dropped)
            session.waiter = loop.create_future()
            try:
                await session.waiter
            finally:
                session.waiter = None
