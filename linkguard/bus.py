"""The MQTT bus adapter: the only module that imports the MQTT client (aiomqtt 2.x).

Consumes: a broker address or a list of them (the nodes of a broker cluster), optional TLS
parameters (:class:`TlsConfig`) and credentials, and the topics to subscribe to. Produces:
raw messages (:meth:`Bus.messages`, or to a handler), and publishes (QoS 1). Uses MQTT 3.1.1
only, so Mosquitto, NATS's MQTT listener and the embedded amqtt broker all work.
The connection is kept by :meth:`Bus.messages` (:mod:`linkguard.buslife`, shared with the
in-memory bus): on any error it waits a jittered exponential backoff (min..max, full jitter)
and reconnects, resubscribes and calls ``on_connect`` (which re-publishes current state, so a
broker outage never replays stale state). With several brokers each failed attempt or lost
connection moves to the next one, round robin
(``bus_connected broker=host:port`` says where the session is); the last will goes with
every connection.

The bus reports connected only once every subscription is granted: a SUBACK refusal (0x80:
the broker's ACL, or a NATS node that cannot create the subscription's JetStream consumer
while the cluster's Raft groups re-elect after a node died) is logged
(``bus_subscription_refused``), counted (:attr:`Bus.subscriptions_refused`) and retried in
the same session with the backoff (the granted ones kept); when a whole round is refused
after ``timeout_s`` without any granted, the session is dropped and the next broker tried.
So the bus is never connected but deaf. A broker that refuses the credentials (CONNACK 4/5)
and a TLS failure are logged as errors with what to check (``bus_refused``) and kept in
:attr:`Bus.last_error`; the password is never logged. Under MQTT 3.1.1 a publish the ACL
forbids is acknowledged and silently dropped by Mosquitto: the publisher cannot tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import aiomqtt
import structlog

from linkguard.buslife import BusLife, BusMessage, Handler, Will

__all__ = [
    "Bus",
    "BusConnectTimeout",
    "BusMessage",
    "BusSession",
    "Handler",
    "SubscriptionRefused",
    "TlsConfig",
    "Will",
]

log = structlog.get_logger(__name__)

#: QoS 1 messages in flight to the broker at once (paho's default is 20); Mosquitto's
#: ``max_inflight_messages`` in deploy/mosquitto/mosquitto.conf sets the broker's side.
MAX_INFLIGHT = 256
#: aiomqtt logs a warning above this many publish calls awaiting their acknowledgement.
PENDING_CALLS_WARN = 4096
#: Disable Nagle's algorithm: without it a plan (or an ack) written right after the PUBACK of
#: an incoming message waits for the broker's delayed ACK of that PUBACK, ~40 ms on Linux
#: (measured on the namespace lab: plans reached agents 32-35 ms after the service sent them).
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the broker: the broker's certificate is always verified (chain and expiry).

    ``ca_file``: PEM CA certificate(s) that signed the broker's certificate (None: the
    system's trusted CAs). ``cert_file``/``key_file``: a PEM client certificate and its key
    (optional; ``key_file`` None: the key is in ``cert_file``). ``insecure``: skip only the
    check that the certificate names the host connected to (tests; never in production).
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False

    def context(self) -> ssl.SSLContext:
        """A client context, TLS 1.2 or later. Raises OSError (ssl.SSLError included) when a
        file is missing or is not a PEM certificate / key."""
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(self.ca_file) if self.ca_file else None
        )
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        ctx.check_hostname = not self.insecure
        return ctx


class BusConnectTimeout(TimeoutError):
    """:meth:`Bus.wait_connected` timed out; the message says why the last attempt failed.
    ``error``: that failure (None: no answer yet); ``hint``: what to check, when known;
    ``refused``: the broker or TLS said no (credentials, certificate), retrying will not help."""

    def __init__(self, message: str, *, error: str | None, hint: str | None, refused: bool) -> None:
        super().__init__(message)
        self.error = error
        self.hint = hint
        self.refused = refused


_BAD_LOGIN = (
    "the broker refused the user name or password (check bus.username and "
    "bus.password / bus.password_file against the broker's password_file)"
)
_NOT_AUTHORISED = (
    "the broker refused this client: not authorised (check bus.username and the password; "
    "Mosquitto 2 answers this to a wrong password too; anonymous clients need "
    "allow_anonymous)"
)
#: CONNACK refusals that mean "fix the configuration", not "retry later": MQTT 3.1.1 return
#: codes 4 and 5, which paho 2 reports as the MQTT 5 reason codes 134 and 135
_REFUSED = {4: _BAD_LOGIN, 134: _BAD_LOGIN, 5: _NOT_AUTHORISED, 135: _NOT_AUTHORISED}


def _explain(exc: Exception, *, tls: bool) -> tuple[str, str | None, bool]:
    """(error text, what to check or None, refused) for a failed connection attempt;
    refused: the broker or the TLS layer said no, retrying will not help until the
    configuration changes."""
    text = str(exc)
    rc = getattr(exc, "rc", None)
    code = getattr(rc, "value", rc)
    if isinstance(exc, aiomqtt.MqttCodeError) and code in _REFUSED:
        return text, _REFUSED[code], True
    low = text.lower()
    if any(w in low for w in ("certificate", "ssl", "tls", "handshake")):
        hint = (
            "TLS failed: check bus.ca_file (the CA that signed the broker's certificate), "
            "that the certificate names bus.host, and the client certificate and key"
        )
        return text, hint, True
    if "timed out" in low:  # no CONNACK: the broker may have closed the connection silently
        hint = (
            "no answer to CONNECT: a broker that requires a client certificate closes the "
            "connection when bus.cert_file is missing or not signed by its CA"
            if tls
            else "no answer to CONNECT: if this port is a TLS listener, set bus.tls and bus.ca_file"
        )
        return text, hint, False
    return text, None, False


def _reraise_lost_cancel() -> None:
    """Raise CancelledError when the current task is being cancelled but got here anyway.

    On Python 3.11, ``asyncio.wait_for`` (used inside aiomqtt's publish) can swallow a
    cancellation that arrives as the awaited operation completes (CPython gh-86296, fixed in
    3.12): the task then carries on and waits forever in its next await, and SIGTERM never
    stops the daemon. Checked after every await into aiomqtt."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _failed(granted: object) -> bool:
    """True for a SUBACK entry that refuses the subscription (0x80; paho gives ReasonCode
    objects or ints)."""
    value = getattr(granted, "value", granted)
    return isinstance(value, int) and value >= 0x80


_SUB_REFUSED_HINT = (
    "the broker's ACL does not let this user read them, or (NATS) JetStream cannot create "
    "their consumers yet (after a node died, until its Raft groups have new leaders: /jsz)"
)


class SubscriptionRefused(aiomqtt.MqttError):
    """The broker kept refusing subscriptions (SUBACK 0x80) for ``timeout_s``: the session is
    dropped and the next broker tried. ``topics``: the refused filters."""

    def __init__(self, topics: list[str], broker: str) -> None:
        super().__init__(f"subscription refused by {broker}: {', '.join(topics)}")
        self.topics = topics


class BusSession(Protocol):
    """What the agent, the topology service and the simulations use of a bus session:
    :class:`Bus`, the simulations' :class:`~linkguard.membus.MemoryBus` and the service's
    :class:`~linkguard.topology.leader.FencedBus` (a bus behind the leadership fence)."""

    @property
    def connected(self) -> asyncio.Event: ...
    def messages(self) -> AsyncGenerator[BusMessage, None]: ...
    async def run(self) -> None: ...
    async def close(self) -> None: ...
    async def wait_connected(self, timeout: float) -> None: ...
    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        qos: int = 1,
        wait_puback: bool | None = None,
    ) -> bool: ...


class Bus(BusLife):
    """One MQTT session that reconnects by itself.

    A wiring module reads ``async for message in bus.messages()`` (the session's lifetime is
    :class:`~linkguard.buslife.BusLife`'s); ``async with Bus(...) as bus`` instead starts a
    task that hands each message to ``handler``. ``publish`` returns False (and
    drops the message) while disconnected: callers re-publish their current state from
    ``on_connect``. Raises nothing on broker failures; they are logged and retried, and the
    last one is kept in :attr:`last_error` (None once connected).
    ``subscriptions``: topic filters, subscribed at ``subscribe_qos`` (0 or 1, default 1),
    or (filter, QoS) pairs.
    ``tls``: connect with TLS (None: plain TCP). ``username``/``password``: MQTT credentials
    (the password is never logged). ``brokers``: (host, port) of each broker to use, tried in
    turn (round robin) after each failed attempt or lost connection; empty: ``host``/``port``
    only. ValueError when neither is given or a port is outside 1..65535.
    ``puback_wait`` False: a QoS 1 :meth:`publish` does not wait for its PUBACK (the agent's:
    its loop must not stall on the bus; see :meth:`publish`).
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        client_id: str,
        brokers: Sequence[tuple[str, int]] = (),
        subscriptions: Sequence[str | tuple[str, int]] = (),
        subscribe_qos: int = 1,
        handler: Handler | None = None,
        on_connect: Callable[[], Awaitable[None]] | None = None,
        will: Will | None = None,
        username: str | None = None,
        password: str | None = None,
        tls: TlsConfig | None = None,
        keepalive_s: int = 15,
        reconnect_min_s: float = 0.2,
        reconnect_max_s: float = 10.0,
        timeout_s: float = 10.0,
        puback_wait: bool = True,
    ) -> None:
        if brokers:
            self._brokers = [(str(h), int(p)) for h, p in brokers]
        elif host is not None and port is not None:
            self._brokers = [(host, port)]
        else:
            raise ValueError("Bus needs host and port, or brokers")
        for h, p in self._brokers:
            if not h or not 1 <= p <= 65535:
                raise ValueError(f"bad broker address {h!r}:{p} (host:port, port 1..65535)")
        self._at = 0  # index in _brokers of the current (or next) broker
        self._client_id = client_id
        if subscribe_qos not in (0, 1):
            raise ValueError(f"subscribe_qos {subscribe_qos!r}: 0 or 1")
        self._subscriptions = [
            (sub, subscribe_qos) if isinstance(sub, str) else sub for sub in subscriptions
        ]
        self._handler = handler
        self._on_connect = on_connect
        self._will = will
        self._username = username
        self._password = password
        self._tls = tls
        self._keepalive = keepalive_s
        self._backoff = (reconnect_min_s, reconnect_max_s)
        self._timeout = timeout_s
        self._puback_wait = puback_wait
        self._client: aiomqtt.Client | None = None
        self._lost = (aiomqtt.MqttError,)
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.connects = 0
        #: why the last connection attempt failed or the connection was lost (None: connected
        #: or not tried yet); ``hint`` says what to check when that is known
        self.last_error: str | None = None
        self.last_hint: str | None = None
        #: the last failure was a refusal (credentials, TLS), not a network or broker outage
        self.last_refused = False
        #: subscription filters the broker refused on the last SUBACK (empty: all granted)
        self.refused_subscriptions: list[str] = []
        #: SUBACK refusals (0x80) since start, one per refused filter and attempt
        self.subscriptions_refused = 0
        #: times the bus moved on to another broker of the list after a failure
        self.failovers = 0
        remote = [
            f"{h}:{p}" for h, p in self._brokers if h not in ("127.0.0.1", "::1", "localhost")
        ]
        if password is not None and tls is None and remote:
            log.warning(
                "bus_credentials_in_clear",
                broker=",".join(remote),
                hint="the password crosses the network unencrypted: set bus.tls: true",
            )

    @property
    def broker(self) -> str:
        """``host:port`` of the broker connected to (while connected) or tried next."""
        host, port = self._brokers[self._at]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def brokers(self) -> list[str]:
        """Every broker of the list, ``host:port``, in the order they are tried."""
        return [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self._brokers]

    async def wait_connected(self, timeout: float) -> None:
        """Wait until connected. Raises :class:`BusConnectTimeout` (a TimeoutError) after
        ``timeout`` seconds, with the last connection error and what to check."""
        try:
            async with asyncio.timeout(timeout):
                await self.connected.wait()
        except TimeoutError:
            why = self.last_error or "no answer yet"
            hint = f"; {self.last_hint}" if self.last_hint else ""
            where = " or ".join(self.brokers)
            raise BusConnectTimeout(
                f"not connected to the MQTT broker at {where} within {timeout:g} s: {why}{hint}",
                error=self.last_error,
                hint=self.last_hint,
                refused=self.last_refused,
            ) from None

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        qos: int = 1,
        wait_puback: bool | None = None,
    ) -> bool:
        """Publish (QoS 1 unless told). False when not connected or the publish failed.
        ``wait_puback``: wait for a QoS 1 PUBACK (up to ``timeout_s``) or not; None: the
        constructor's ``puback_wait``. Without waiting, a QoS 1 publish returns once the
        client has it (sent, or queued behind :data:`MAX_INFLIGHT` others) and its PUBACK
        is waited for by nobody: a PUBACK that never comes on a connection that stays up
        (a broker that lost the message, a half-open connection before the keepalive ends
        it) holds no caller; the message is gone with the session like any unacknowledged
        one, and callers re-publish their state on the next connect."""
        client = self._client
        if client is None or not self.connected.is_set():
            log.debug("bus_publish_dropped_disconnected", topic=topic)
            return False
        if qos and not (self._puback_wait if wait_puback is None else wait_puback):
            # paho's publish only queues the packet (non-blocking); aiomqtt's would then wait
            # for the PUBACK up to timeout_s (10 s) before returning
            info = client._client.publish(topic, payload, qos, retain)
            if info.rc != 0:  # MQTT_ERR_SUCCESS
                log.warning("bus_publish_failed", topic=topic, error=f"rc {info.rc}",
                            broker=self.broker)  # fmt: skip
                return False
            return True
        try:
            await client.publish(topic, payload, qos=qos, retain=retain)
        except aiomqtt.MqttError as exc:
            _reraise_lost_cancel()
            log.warning("bus_publish_failed", topic=topic, error=str(exc), broker=self.broker)
            return False
        _reraise_lost_cancel()
        return True

    def _tls_context(self) -> ssl.SSLContext | None:
        """A fresh context per attempt (renewed certificates are picked up on reconnect);
        unreadable files become an MqttError, logged and retried like any failed connect."""
        if self._tls is None:
            return None
        try:
            return self._tls.context()
        except OSError as exc:  # ssl.SSLError included
            raise aiomqtt.MqttError(f"TLS files: {exc}") from None

    async def _subscribe_all(self, client: aiomqtt.Client) -> None:
        """Subscribe every filter; retry the refused ones (SUBACK 0x80) in the same session,
        with the backoff, keeping those granted. Raises :class:`SubscriptionRefused` when a
        whole round was refused and none was granted for ``timeout_s`` (the next broker may do
        better). A NATS node answers a refused QoS 1 SUBSCRIBE after its 4 s JetStream API
        timeout, so one round of n refusals takes 4n s there."""
        loop = asyncio.get_running_loop()
        progress_at = loop.time()
        pending = list(self._subscriptions)
        tries = 0
        while pending:
            denied = []
            for topic, qos in pending:
                granted = await client.subscribe(topic, qos=qos)
                _reraise_lost_cancel()
                if any(_failed(g) for g in granted or ()):
                    denied.append((topic, qos))
            self.refused_subscriptions = [t for t, _ in denied]
            if not denied:
                return
            if len(denied) < len(pending):
                progress_at = loop.time()
            self.subscriptions_refused += len(denied)
            tries += 1
            delay = self._delay(tries)
            if len(denied) == len(pending) and loop.time() + delay - progress_at > self._timeout:
                log.error(
                    "bus_subscription_refused",
                    broker=self.broker,
                    client_id=self._client_id,
                    topics=self.refused_subscriptions,
                    tries=tries,
                    hint=_SUB_REFUSED_HINT,
                    then="reconnecting",
                )
                raise SubscriptionRefused(self.refused_subscriptions, self.broker)
            log.warning(
                "bus_subscription_refused",
                broker=self.broker,
                client_id=self._client_id,
                topics=self.refused_subscriptions,
                tries=tries,
                retry_in_s=round(delay, 2),
            )
            await asyncio.sleep(delay)
            pending = denied

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[AsyncGenerator[BusMessage, None]]:
        """Connect to the current broker (with the last will), subscribe every filter; the
        session's messages; disconnect on the way out."""
        will = (
            aiomqtt.Will(self._will.topic, self._will.payload, qos=1, retain=True)
            if self._will
            else None
        )
        host, port = self._brokers[self._at]
        try:
            async with aiomqtt.Client(
                host,
                port,
                identifier=self._client_id,
                username=self._username,
                password=self._password,
                tls_context=self._tls_context(),
                protocol=aiomqtt.ProtocolVersion.V311,
                clean_session=True,
                keepalive=self._keepalive,
                will=will,
                timeout=self._timeout,
                max_inflight_messages=MAX_INFLIGHT,
                socket_options=NO_DELAY,
            ) as client:
                # the service publishes a plan per changed host at once (hundreds of QoS 1
                # calls awaiting their PUBACKs): expected, not worth aiomqtt's warning at 10
                client.pending_calls_threshold = PENDING_CALLS_WARN
                self._client = client
                await self._subscribe_all(client)
                yield self._receive(client)
        finally:
            self._client = None

    @staticmethod
    async def _receive(client: aiomqtt.Client) -> AsyncGenerator[BusMessage, None]:
        """The session's messages as :class:`BusMessage` (payload as bytes)."""
        async for message in client.messages:
            payload = message.payload
            if isinstance(payload, str):
                payload = payload.encode()
            elif not isinstance(payload, bytes | bytearray):
                payload = b"" if payload is None else str(payload).encode()
            yield BusMessage(str(message.topic), bytes(payload), bool(message.retain))

    def _session_up(self) -> None:
        self.last_error = self.last_hint = None
        self.last_refused = False

    async def _after_message(self) -> None:
        _reraise_lost_cancel()

    def _session_lost(self, exc: Exception, *, attempt: int, delay: float) -> None:
        """Keep why (:attr:`last_error`, :attr:`last_hint`, :attr:`last_refused`), move to the
        next broker of the list, log ``bus_refused`` (an error: the configuration must
        change) or ``bus_disconnected``."""
        if isinstance(exc, SubscriptionRefused):
            self.last_error, self.last_hint, refused = str(exc), _SUB_REFUSED_HINT, False
        else:
            tls = self._tls is not None
            self.last_error, self.last_hint, refused = _explain(exc, tls=tls)
        self.last_refused = refused
        fields = {
            "broker": self.broker,
            "error": self.last_error,
            "retry_in_s": round(delay, 2),
            "attempt": attempt,
        }
        if len(self._brokers) > 1:
            self._at = (self._at + 1) % len(self._brokers)
            self.failovers += 1
            fields["next_broker"] = self.broker
        if self.last_hint is not None:
            fields["hint"] = self.last_hint
        if refused:
            log.error("bus_refused", **fields, user=self._username)
        else:
            log.warning("bus_disconnected", **fields)
