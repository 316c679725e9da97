"""A seedable fault-injecting MQTT proxy: TCP between MQTT clients and a broker, dropping,
delaying, duplicating and reordering PUBLISH packets per direction, and cutting connections.

Consumes: the broker's address, the rules (:class:`Rule`: an action, a direction, an MQTT topic
filter, a probability, a budget) and a seed. Produces: a listening socket clients connect to
instead of the broker (:attr:`ChaosProxy.port`), every byte passed on except what the rules
take, and :attr:`ChaosProxy.stats` (packets per direction and action) and
:attr:`ChaosProxy.actions` (what was done to which topic, in order).

Packets are framed by the MQTT fixed header (type, flags, remaining length: 1-4 bytes of 7-bit
groups, MQTT 3.1.1 section 2.2.3); a PUBLISH's topic is read from its variable header. Every
other packet (CONNECT, PUBACK, SUBSCRIBE, PINGREQ, ...) passes unchanged and in order. The
first rule whose direction and topic filter match a PUBLISH and whose draw (probability) and
budget (``count``) allow it decides what happens to it:

- ``drop``: it is not passed on. Dropping a QoS 1 PUBLISH towards a client means the broker
  re-sends it only when that client reconnects (MQTT 3.1.1 section 4.4) as a real loss on
  that hop would; towards the broker, the client re-sends it only on reconnect as well.
- ``delay``: passed on ``delay_s`` later (later packets overtake it).
- ``duplicate``: passed on twice (the second copy with the DUP flag when QoS > 0).
- ``reorder``: held until the next packet in the same direction has been passed on (at most
  ``delay_s``, default :data:`REORDER_MAX_S`), then passed on.
- ``cut``: dropped, and the connection is closed on both sides (the broker sees the client
  vanish without DISCONNECT: its last will fires).

``direction``: ``up`` (client -> broker), ``down`` (broker -> client) or ``both``.
Deterministic given the seed: each connection draws from its own generator, seeded with the
proxy's seed, its connection number (in accept order) and the direction; a test that opens
its connections in a fixed order sees the same faults on every run. :meth:`ChaosProxy.cut`
closes every connection at once (a broker restart, as the clients see it).

Use (tests, a simulator or lab chaos run, ``benchmarks/chaos.py``)::

    async with ChaosProxy("127.0.0.1", broker_port, [Rule("drop", "down", "linkguard/v1/plans/#",
                                                          count=1)], seed=7) as proxy:
        ... clients connect to 127.0.0.1:proxy.port ...

or from a shell: ``python -m linkguard.simulations.chaosproxy --broker 127.0.0.1:1883
--listen 127.0.0.1:1884 --seed 7 --rule drop:down:linkguard/v1/plans/#:0.1``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ACTIONS",
    "REORDER_MAX_S",
    "Action",
    "ChaosProxy",
    "Direction",
    "Packet",
    "Rule",
    "main",
    "matches",
    "parse_rule",
    "publish_payload",
    "read_packet",
]

Action = Literal["drop", "delay", "duplicate", "reorder", "cut"]
Direction = Literal["up", "down", "both"]
ACTIONS: tuple[str, ...] = ("drop", "delay", "duplicate", "reorder", "cut")
#: the longest a reordered packet waits for a later one in its direction (s)
REORDER_MAX_S = 0.5
#: MQTT control packet type of PUBLISH (the fixed header's high nibble)
PUBLISH = 3
#: the remaining length's largest value (4 bytes of 7 bits, MQTT 3.1.1 section 2.2.3)
MAX_REMAINING = 268_435_455


@dataclass(frozen=True)
class Rule:
    """What to do to a PUBLISH: ``action`` in ``direction`` on topics matching ``topic`` (an
    MQTT filter, ``+`` and ``#`` wildcards), with ``probability`` (0..1) per matching packet,
    at most ``count`` times in all (None: no limit), after letting the first ``skip``
    matching packets through. ``delay_s``: the delay (``delay``) or the longest hold
    (``reorder``), s."""

    action: Action
    direction: Direction = "both"
    topic: str = "#"
    probability: float = 1.0
    count: int | None = None
    skip: int = 0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"rule action {self.action!r}: one of {', '.join(ACTIONS)}")
        if self.direction not in ("up", "down", "both"):
            raise ValueError(f"rule direction {self.direction!r}: up, down or both")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"rule probability {self.probability}: between 0 and 1")
        if self.delay_s < 0 or self.skip < 0 or (self.count is not None and self.count < 0):
            raise ValueError("rule delay_s, skip and count cannot be negative")


@dataclass(frozen=True)
class Packet:
    """One MQTT control packet as read: its bytes (fixed header included), its type and,
    for a PUBLISH, its topic and QoS."""

    raw: bytes
    kind: int
    topic: str | None = None
    qos: int = 0


def matches(topic_filter: str, topic: str) -> bool:
    """True when ``topic`` matches the MQTT ``topic_filter`` (``+``: one level, ``#``: the
    rest, MQTT 3.1.1 section 4.7)."""
    fparts, tparts = topic_filter.split("/"), topic.split("/")
    for i, f in enumerate(fparts):
        if f == "#":
            return True
        if i >= len(tparts) or (f != "+" and f != tparts[i]):
            return False
    return len(fparts) == len(tparts)


async def read_packet(reader: asyncio.StreamReader) -> Packet | None:
    """The next MQTT packet from ``reader``; None at the end of the stream. Raises ValueError
    for a remaining length longer than 4 bytes (not MQTT)."""
    try:
        first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return None
    length, shift, header = 0, 0, bytearray(first)
    for _ in range(4):
        b = (await reader.readexactly(1))[0]
        header.append(b)
        length += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    else:
        raise ValueError("MQTT remaining length longer than 4 bytes")
    body = await reader.readexactly(length)
    kind = first[0] >> 4
    if kind != PUBLISH or len(body) < 2:
        return Packet(bytes(header) + body, kind)
    n = int.from_bytes(body[:2], "big")
    topic = body[2 : 2 + n].decode("utf-8", errors="replace")
    return Packet(bytes(header) + body, kind, topic, (first[0] >> 1) & 3)


def publish_payload(packet: Packet) -> bytes:
    """The application message of a PUBLISH ``packet`` (MQTT 3.1.1 section 3.3.3: after the
    topic and, at QoS 1 and 2, the 2-byte packet identifier); b"" for any other packet."""
    if packet.kind != PUBLISH:
        return b""
    i = 1
    while packet.raw[i] & 0x80:  # the remaining length's continuation bytes
        i += 1
    body = packet.raw[i + 1 :]
    start = 2 + int.from_bytes(body[:2], "big") + (2 if packet.qos else 0)
    return body[start:]


class _Pipe:
    """One direction of one connection: its writer, generator and held (reordered) packet."""

    def __init__(self, direction: str, writer: asyncio.StreamWriter, rng: random.Random) -> None:
        self.direction = direction
        self.writer = writer
        self.rng = rng
        self.held: list[bytes] = []
        self.release: asyncio.TimerHandle | None = None

    def write(self, raw: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(raw)

    def flush_held(self) -> None:
        if self.release is not None:
            self.release.cancel()
            self.release = None
        for raw in self.held:
            self.write(raw)
        self.held = []


class ChaosProxy:
    """See the module. ``listen_port`` 0: a free port (read :attr:`port` after
    :meth:`start`)."""

    def __init__(
        self,
        broker_host: str,
        broker_port: int,
        rules: list[Rule] | tuple[Rule, ...] = (),
        *,
        seed: int = 0,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.broker = (broker_host, broker_port)
        self.rules = list(rules)
        self.seed = seed
        self.listen = (listen_host, listen_port)
        self.port = 0
        #: packets by (direction, what happened: forwarded, drop, delay, ...), PUBLISH only
        #: for the actions; ``connections`` counts accepted client connections
        self.stats: Counter[tuple[str, str]] = Counter()
        #: (direction, action, topic) of every rule applied, in order
        self.actions: list[tuple[str, str, str]] = []
        #: called with (direction, packet) for every PUBLISH as it arrives, before any rule
        #: (what the clients sent, dropped or not; e.g. the lab chaos run's event audit)
        self.tap: Callable[[str, Packet], None] | None = None
        self._matched: Counter[int] = Counter()  # per rule index: matching packets seen
        self._applied: Counter[int] = Counter()  # per rule index: times applied
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._serving: set[asyncio.Task[None]] = set()  # the connections' handlers, running
        self._accepted = 0

    async def start(self) -> int:
        """Listen; returns the port."""
        self._server = await asyncio.start_server(self._serve, *self.listen)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop listening, cut every connection and wait (at most 2 s) for their handlers to
        end: a handler left running is cancelled when the loop closes, and asyncio logs it."""
        if self._server is not None:
            self._server.close()
        self.cut()
        if self._serving:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await asyncio.gather(*self._serving, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    async def __aenter__(self) -> ChaosProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def cut(self) -> int:
        """Close every connection on both sides now (no DISCONNECT: the broker sends the
        clients' last wills). Returns how many were open."""
        conns = list(self._conns)
        for client, broker in conns:
            for w in (client, broker):
                with contextlib.suppress(Exception):
                    w.transport.abort()
        self._conns.clear()
        self.stats[("both", "cut_all")] += len(conns)
        return len(conns)

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._conns)

    # -- one connection -------------------------------------------------------------------

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        index = self._accepted
        self._accepted += 1
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
        self.stats[("both", "connections")] += 1
        try:
            breader, bwriter = await asyncio.open_connection(*self.broker)
        except OSError:
            cwriter.transport.abort()
            return
        pair = (cwriter, bwriter)
        self._conns.add(pair)
        up = _Pipe("up", bwriter, random.Random(f"{self.seed}/{index}/up"))
        down = _Pipe("down", cwriter, random.Random(f"{self.seed}/{index}/down"))
        try:
            await asyncio.gather(
                self._pump(creader, up, pair),
                self._pump(breader, down, pair),
                return_exceptions=True,
            )
        finally:
            self._conns.discard(pair)
            for w in pair:
                with contextlib.suppress(Exception):
                    w.transport.abort()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        pipe: _Pipe,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while (packet := await read_packet(reader)) is not None:
                if not self._forward(packet, pipe, pair):
                    break
                await pipe.writer.drain()
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:  # one side ended: end the other one too (as a TCP proxy does)
            pipe.flush_held()
            for w in pair:
                with contextlib.suppress(Exception):
                    w.transport.abort()

    def _rule_for(self, packet: Packet, pipe: _Pipe) -> Rule | None:
        assert packet.topic is not None
        for i, rule in enumerate(self.rules):
            if rule.direction not in ("both", pipe.direction):
                continue
            if not matches(rule.topic, packet.topic):
                continue
            self._matched[i] += 1
            if self._matched[i] <= rule.skip:
                continue
            if rule.count is not None and self._applied[i] >= rule.count:
                continue
            if rule.probability < 1.0 and pipe.rng.random() >= rule.probability:
                continue
            self._applied[i] += 1
            return rule
        return None

    def _forward(
        self, packet: Packet, pipe: _Pipe, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]
    ) -> bool:
        """Pass ``packet`` on as the rules say; False when the connection was cut."""
        if packet.kind == PUBLISH and self.tap is not None:
            self.tap(pipe.direction, packet)
        rule = self._rule_for(packet, pipe) if packet.kind == PUBLISH else None
        if rule is None:
            self.stats[(pipe.direction, "forwarded")] += 1
            pipe.write(packet.raw)
            pipe.flush_held()
            return True
        self.stats[(pipe.direction, rule.action)] += 1
        self.actions.append((pipe.direction, rule.action, packet.topic or ""))
        if rule.action == "drop":
            return True
        if rule.action == "cut":
            self._conns.discard(pair)
            return False
        if rule.action == "duplicate":
            pipe.write(packet.raw)
            pipe.write(_with_dup(packet))
        elif rule.action == "delay":
            loop = asyncio.get_running_loop()
            loop.call_later(rule.delay_s, pipe.write, packet.raw)
        else:  # reorder: after the next packet in this direction, or at the hold's end
            pipe.held.append(packet.raw)
            if pipe.release is None:
                loop = asyncio.get_running_loop()
                pipe.release = loop.call_later(rule.delay_s or REORDER_MAX_S, pipe.flush_held)
        return True


def _with_dup(packet: Packet) -> bytes:
    """``packet`` with the DUP flag set when its QoS is above 0 (MQTT 3.1.1 section 3.3.1.1)."""
    if packet.qos == 0:
        return packet.raw
    return bytes([packet.raw[0] | 0x08]) + packet.raw[1:]


def parse_rule(text: str) -> Rule:
    """A rule from ``action:direction:topic[:probability[:count[:delay_s]]]``, e.g.
    ``drop:down:linkguard/v1/plans/#:0.1``. Raises ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) < 3 or len(parts) > 6:
        raise ValueError(
            f"rule {text!r}: expected action:direction:topic[:probability[:count[:delay_s]]]"
        )
    action, direction, topic, *rest = parts
    prob = float(rest[0]) if len(rest) > 0 and rest[0] else 1.0
    count = int(rest[1]) if len(rest) > 1 and rest[1] else None
    delay = float(rest[2]) if len(rest) > 2 and rest[2] else 0.0
    return Rule(action, direction, topic, prob, count, 0, delay)  # type: ignore[arg-type]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected host:port")
    return host, int(port)


async def _run(args: argparse.Namespace) -> None:
    broker_host, broker_port = args.broker
    proxy = ChaosProxy(
        broker_host,
        broker_port,
        [parse_rule(r) for r in args.rule],
        seed=args.seed,
        listen_host=args.listen[0],
        listen_port=args.listen[1],
    )
    async with proxy:
        print(f"chaos proxy on {args.listen[0]}:{proxy.port} -> {args.broker[0]}:{args.broker[1]}")
        try:
            await asyncio.Event().wait()
        finally:
            for (direction, what), n in sorted(proxy.stats.items()):
                print(f"{direction} {what} {n}")


def main(argv: list[str] | None = None) -> int:
    """The CLI: run a proxy until interrupted, then print its counts."""
    p = argparse.ArgumentParser(prog="chaosproxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--broker", type=_address, required=True, help="host:port of the broker")
    p.add_argument("--listen", type=_address, default=("127.0.0.1", 0), help="host:port")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rule",
        action="append",
        default=[],
        help="action:direction:topic[:probability[:count[:delay_s]]] (repeatable)",
    )
    args = p.parse_args(argv)
    try:
        for r in args.rule:
            parse_rule(r)
    except ValueError as exc:
        print(f"chaosproxy: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
