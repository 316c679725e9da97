"""A bus session's lifetime, shared by the MQTT bus (:class:`linkguard.bus.Bus`) and the
in-memory one (:class:`linkguard.membus.MemoryBus`): connect, subscribe, announce, hand out
the messages, and on a lost session wait a jittered backoff and do it all again, until stopped.

Consumes: a transport's session (:meth:`BusLife._session`: connect and subscribe, then the
session's messages; the exceptions that mean "this session is gone", :attr:`BusLife._lost`).
Produces: :meth:`BusLife.messages`, every message of every session in arrival order, the
``connected`` event and ``connects`` count, ``bus_connected`` logs, the ``on_connect`` call
after each (re)connection, and :meth:`BusLife.run` / ``async with`` for callers that give a
``handler`` instead of reading the messages themselves.

A consumer reads ``async for message in bus.messages()`` inside
``contextlib.aclosing(...)``: leaving the loop (a stop, a cancellation, an error in the
consumer) then ends the session at once and cleanly (MQTT DISCONNECT, no last will) instead of
whenever the generator is collected (Python closes an abandoned async generator only then).

The backoff before reconnect attempt n (1, 2, ...) is ``uniform(min, min(max, min * 2**n))``
seconds: exponential with full jitter (AWS Architecture Blog, "Exponential Backoff And
Jitter", 2015), so a fleet that lost its broker does not come back in one burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Self

import structlog

from linkguard.takeover import TakeoverWatch

__all__ = ["BusLife", "BusMessage", "Handler", "Will"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class BusMessage:
    topic: str
    payload: bytes
    retain: bool


@dataclass(frozen=True)
class Will:
    """Last will: published retained by the broker when this client vanishes."""

    topic: str
    payload: bytes


Handler = Callable[[BusMessage], Awaitable[None]]


class BusLife:
    """The lifetime of a bus session (a base). A transport sets, in its ``__init__``,
    ``_client_id``, ``_handler``, ``_on_connect``, ``_backoff`` (min, max seconds),
    ``connected`` (asyncio.Event), ``connects`` (0) and ``_task`` (None), and provides
    :meth:`_session`, :attr:`_lost` and :attr:`broker`."""

    _client_id: str
    _handler: Handler | None
    _on_connect: Callable[[], Awaitable[None]] | None
    _backoff: tuple[float, float]
    _task: asyncio.Task[None] | None
    connected: asyncio.Event
    connects: int
    #: the exceptions that end a session (the next one is tried after the backoff)
    _lost: tuple[type[Exception], ...] = ()
    #: sessions another client with this client id ended (:mod:`linkguard.takeover`)
    takeovers: int = 0

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def broker(self) -> str:
        """Where the session is (or is tried next), for the logs."""
        raise NotImplementedError

    def _session(self) -> contextlib.AbstractAsyncContextManager[AsyncGenerator[BusMessage, None]]:
        """Connect and subscribe; the session's messages while it lasts (raising one of
        :attr:`_lost` when it ends); disconnect cleanly on the way out."""
        raise NotImplementedError

    def _session_up(self) -> None:
        """Called once a session is connected and subscribed (before ``on_connect``)."""

    def _session_lost(self, exc: Exception, *, attempt: int, delay: float) -> None:
        """Called when a session ended with ``exc`` (one of :attr:`_lost`); the next attempt,
        number ``attempt``, follows in ``delay`` seconds. Logs it."""
        raise NotImplementedError

    async def _after_message(self) -> None:
        """Called when the consumer is done with a message, before the next is read."""

    def _delay(self, attempt: int) -> float:
        """Full-jitter exponential backoff (s) before attempt number ``attempt`` (1, 2, ...)."""
        lo, hi = self._backoff
        return random.uniform(lo, min(hi, lo * 2**attempt))

    async def messages(self) -> AsyncGenerator[BusMessage, None]:
        """Every message of every session, in arrival order: connect, subscribe, set
        ``connected``, await ``on_connect``, then yield what arrives; on a lost session clear
        ``connected``, log, wait the backoff and reconnect, forever. One consumer at a time;
        read it inside ``contextlib.aclosing``. Raises what ``on_connect`` raises and what
        the transport refuses for good (an invalid subscription filter: ValueError)."""
        attempt = 0
        stopping = False  # the consumer closed the generator (aclose)
        watch = TakeoverWatch()
        while True:
            since: float | None = None  # when this session connected (monotonic s)
            try:
                async with self._session() as received:
                    since = time.monotonic()
                    self.connected.set()
                    self.connects += 1
                    attempt = 0
                    self._session_up()
                    log.info(
                        "bus_connected",
                        broker=self.broker,
                        client_id=self._client_id,
                        connects=self.connects,
                    )
                    if self._on_connect is not None:
                        await self._on_connect()
                    async with contextlib.aclosing(received):
                        async for message in received:
                            try:
                                yield message
                            except GeneratorExit:
                                stopping = True
                                raise
                            await self._after_message()
            except self._lost as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # a disconnect can turn our cancellation into a lost session (aiomqtt's
                    # __aexit__ when its disconnect times out): we are stopping, not
                    # reconnecting
                    raise asyncio.CancelledError from exc
                if stopping:
                    return
                attempt += 1
                delay = self._delay(attempt)
                self._session_lost(exc, attempt=attempt, delay=delay)
                if since is None:
                    watch.attempt_failed()
                elif watch.session_ended(time.monotonic() - since):
                    self._taken_over(watch.streak, nth=watch.streak - watch.repeat)
            finally:
                self.connected.clear()
            await asyncio.sleep(delay)

    def _taken_over(self, streak: int, *, nth: int) -> None:
        """Count a session another client took over; log it when it starts (then once per
        ten more, so an attack cannot flood the log); ``nth``: 0 for the first of a streak."""
        self.takeovers += 1
        if nth % 10 == 0:
            log.error(
                "client_id_taken_over",
                client_id=self._client_id,
                broker=self.broker,
                short_sessions=streak,
                hint="another client connects with this client id (or the broker drops this "
                "connection right after accepting it): bind client ids to users on the broker "
                "(Mosquitto: use_username_as_clientid true, deploy/mosquitto/mosquitto.conf) "
                "and check who holds these credentials",
            )

    async def run(self) -> None:
        """Hand every message to ``handler`` (none: read and dropped), in order, until
        cancelled: :meth:`messages` with the handler as its consumer."""
        async with contextlib.aclosing(self.messages()) as received:
            async for message in received:
                if self._handler is not None:
                    await self._handler(message)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name=f"bus:{self._client_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Clean disconnect (no will) and stop the task started by ``async with``."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
