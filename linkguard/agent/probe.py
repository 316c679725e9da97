"""Per-rail probe packets, a responder that answers them and a sender that measures loss and RTT.

Consumes: the rail addresses to probe from and to (the service's probe plan,
:mod:`linkguard.topology.probeplan`) and a rate. Produces: per (local port, peer) loss and RTT
over a window (:meth:`ProbeSender.stats`), for the bus and :mod:`linkguard.topology.localize`.

**Packet** (:func:`build_probe`, :func:`parse_probe`; built and parsed with scapy). The UDP
payload is a 40-byte header, network byte order: magic ``b"LGPR"``, version 1, kind (1 probe,
2 reply), total payload length (u16), prober id (u64), sequence number (u64), the prober's send
time and the responder's receive time (u64, ``time.monotonic_ns()`` of each end: only the
prober's two readings are compared, the responder's is informational).

- ``mode="udp"``: the payload is the header alone, on a configurable UDP port
  (:data:`DEFAULT_UDP_PORT`).
- ``mode="roce"``: UDP port 4791 and a RoCEv2 Base Transport Header in front
  (``scapy.contrib.roce.BTH``, IBA vol. 1 9.2 / RoCEv2 annex A17): opcode UD SEND-only (0x64),
  P_Key 0xFFFF, destination QP 0xFFFFFF, PSN = sequence mod 2^24, and a zero ICRC. Switches
  classify and hash it as RoCE traffic (same UDP port, same ECMP tuple shape), but no HCA acts
  on it: QP 0xFFFFFF is IBA's multicast QPN (never a unicast QP) and a zero ICRC
  fails the HCA's check. The other side of that choice: an RNIC with RoCE enabled on the
  destination address consumes UDP 4791 itself, so a software responder only sees RoCE-mode
  probes on addresses whose NIC does not run RoCE (the netns lab, plain Ethernet); on RoCE
  ports use ``udp`` mode (same path, different port) or a verbs UD responder.

**Sockets**: plain asyncio UDP sockets bound to the rail's address. scapy only makes and reads
the bytes: its ``send``/``sniff`` need raw sockets (root, ``CAP_NET_RAW``) and run at a few
thousand packets/s from Python with per-packet route lookups, while a bound UDP socket is cheap,
unprivileged, and leaves the rail by the rail's route like real traffic.

Every received datagram is checked (:func:`parse_probe`): short, wrong length, bad magic,
version, kind, opcode or QP are counted per reason in ``bad`` and dropped, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Literal, cast

from scapy.contrib.roce import BTH
from scapy.fields import ByteEnumField, ByteField, LongField, ShortField, StrFixedLenField
from scapy.packet import Packet

__all__ = [
    "DEFAULT_UDP_PORT",
    "ROCE_UDP_PORT",
    "PeerStats",
    "Probe",
    "ProbeError",
    "ProbeResponder",
    "ProbeSender",
    "build_probe",
    "parse_probe",
]

#: IANA-assigned RoCEv2 UDP destination port.
ROCE_UDP_PORT = 4791
#: Default port for plain-UDP probes (unassigned by IANA; configurable).
DEFAULT_UDP_PORT = 47_910
MAGIC = b"LGPR"
VERSION = 1
KIND_PROBE, KIND_REPLY = 1, 2
#: UD SEND-only (transport UD 0x60 + SEND_ONLY 0x04), scapy.contrib.roce's ``UD_SEND_ONLY``.
UD_SEND_ONLY = 0x64
#: IBA multicast QPN: never a unicast QP, so no HCA delivers a probe to a consumer.
PROBE_QPN = 0xFFFFFF
HEADER_BYTES = 40
BTH_BYTES = 12
ICRC_BYTES = 4
#: Upper bound on probes per second one sender sends (rate x peers), as
#: :data:`linkguard.topology.probeplan.MAX_PROBES_PER_PORT_PPS`.
MAX_SEND_PPS = 16.0

Mode = Literal["udp", "roce"]


class ProbeHeader(Packet):
    """The 40-byte probe header (module docstring)."""

    name = "LinkguardProbe"
    fields_desc = [
        StrFixedLenField("magic", MAGIC, 4),
        ByteField("version", VERSION),
        ByteEnumField("kind", KIND_PROBE, {KIND_PROBE: "probe", KIND_REPLY: "reply"}),
        ShortField("length", HEADER_BYTES),
        LongField("prober_id", 0),
        LongField("seq", 0),
        LongField("t_send_ns", 0),
        LongField("t_recv_ns", 0),
    ]


class ProbeError(ValueError):
    """A datagram that is not a valid probe; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Probe:
    """A parsed probe or reply (times: ``time.monotonic_ns()`` of the end that wrote them)."""

    kind: int
    prober_id: int
    seq: int
    t_send_ns: int
    t_recv_ns: int = 0


def payload_bytes(mode: Mode) -> int:
    """UDP payload length of a probe in ``mode`` (40 udp, 56 roce)."""
    return HEADER_BYTES + (BTH_BYTES + ICRC_BYTES if mode == "roce" else 0)


def build_probe(p: Probe, mode: Mode = "udp") -> bytes:
    """The UDP payload for ``p``. Raises ``ValueError`` for fields out of range (ids and times
    u64, kind 1 or 2)."""
    if p.kind not in (KIND_PROBE, KIND_REPLY):
        raise ValueError(f"kind {p.kind} is not 1 (probe) or 2 (reply)")
    for name in ("prober_id", "seq", "t_send_ns", "t_recv_ns"):
        v = getattr(p, name)
        if not 0 <= v < 2**64:
            raise ValueError(f"{name} {v} is not a u64")
    hdr = ProbeHeader(
        kind=p.kind,
        length=payload_bytes(mode),
        prober_id=p.prober_id,
        seq=p.seq,
        t_send_ns=p.t_send_ns,
        t_recv_ns=p.t_recv_ns,
    )
    if mode == "udp":
        return bytes(hdr)
    bth = BTH(opcode=UD_SEND_ONLY, pkey=0xFFFF, dqpn=PROBE_QPN, psn=p.seq & 0xFFFFFF, icrc=0)
    return bytes(bth / hdr)


def parse_probe(data: bytes, mode: Mode = "udp") -> Probe:
    """The probe in ``data`` (a UDP payload). Raises :class:`ProbeError` (reason ``short``,
    ``size``, ``bth``, ``magic``, ``version``, ``kind``, ``length``) for anything else."""
    want = payload_bytes(mode)
    if len(data) < want:
        raise ProbeError("short", f"{len(data)} < {want} bytes")
    if len(data) != want:
        raise ProbeError("size", f"{len(data)} != {want} bytes")
    if mode == "roce":
        bth = BTH(data)
        if bth.opcode != UD_SEND_ONLY or bth.dqpn != PROBE_QPN or bth.version != 0:
            raise ProbeError("bth", f"opcode {bth.opcode:#x} dqpn {bth.dqpn:#x}")
        body = data[BTH_BYTES : BTH_BYTES + HEADER_BYTES]
    else:
        body = data
    hdr = ProbeHeader(body)
    if hdr.magic != MAGIC:
        raise ProbeError("magic", repr(hdr.magic))
    if hdr.version != VERSION:
        raise ProbeError("version", str(hdr.version))
    if hdr.kind not in (KIND_PROBE, KIND_REPLY):
        raise ProbeError("kind", str(hdr.kind))
    if hdr.length != want:
        raise ProbeError("length", f"header says {hdr.length}, payload is {want}")
    return Probe(hdr.kind, hdr.prober_id, hdr.seq, hdr.t_send_ns, hdr.t_recv_ns)


class _Proto(asyncio.DatagramProtocol):
    def __init__(self, on_datagram) -> None:
        self.on_datagram = on_datagram
        self.transport: asyncio.DatagramTransport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a datagram endpoint's: asyncio's selector transport has DatagramTransport's methods
        # without deriving from it
        self.transport = cast(asyncio.DatagramTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def close(self) -> None:
        """Close the socket and wait until it is closed: asyncio closes it on a later loop
        turn, and a new endpoint on the same address before that fails (EADDRINUSE)."""
        if self.transport is not None:
            self.transport.close()
            await self.closed

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:  # ICMP errors: the probe stays lost
        pass


async def _endpoint(on, sock: socket.socket | None, local: tuple[str, int]) -> _Proto:
    """A datagram endpoint on ``sock`` (already bound, e.g. made in another network
    namespace or with ``SO_BINDTODEVICE``) or on a new socket bound to ``local``."""
    loop = asyncio.get_running_loop()
    if sock is not None:
        _, proto = await loop.create_datagram_endpoint(lambda: _Proto(on), sock=sock)
    else:
        _, proto = await loop.create_datagram_endpoint(lambda: _Proto(on), local_addr=local)
    return proto


@dataclass
class ProbeResponder:
    """Answers probes on ``(address, port)``: each valid probe goes back to its sender as a
    reply with this end's receive time. ``answered``: replies sent; ``bad``: dropped datagrams
    per :class:`ProbeError` reason (plus ``send_error``). ``sock``: an already bound UDP socket
    to use instead (``address``/``port`` then only name it). Use as ``async with``."""

    address: str
    port: int = DEFAULT_UDP_PORT
    mode: Mode = "udp"
    sock: socket.socket | None = None
    answered: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    _proto: _Proto | None = None

    async def __aenter__(self) -> ProbeResponder:
        self._proto = await _endpoint(self._on, self.sock, (self.address, self.port))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._proto is not None:
            await self._proto.close()

    def _on(self, data: bytes, addr: tuple[str, int]) -> None:
        t = time.monotonic_ns()
        try:
            p = parse_probe(data, self.mode)
        except ProbeError as e:
            self.bad[e.reason] += 1
            return
        if p.kind != KIND_PROBE:
            self.bad["kind"] += 1
            return
        reply = Probe(KIND_REPLY, p.prober_id, p.seq, p.t_send_ns, t)
        try:
            assert self._proto is not None and self._proto.transport is not None
            self._proto.transport.sendto(build_probe(reply, self.mode), addr)
            self.answered += 1
        except OSError:
            self.bad["send_error"] += 1


@dataclass(frozen=True)
class PeerStats:
    """Probes to one peer whose reply deadline passed in the last ``window_s``: ``sent``,
    ``lost`` (no valid reply by the deadline), RTT percentiles of the answered ones in
    microseconds (None if none)."""

    sent: int
    lost: int
    rtt_p50_us: float | None
    rtt_p99_us: float | None
    window_s: float


def _pct(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted, non-empty list."""
    i = max(0, min(len(sorted_vals) - 1, round(q * len(sorted_vals) + 0.5) - 1))
    return sorted_vals[i]


@dataclass
class ProbeSender:
    """Probes ``peers`` (addresses) from ``address`` at ``rate_pps`` each. A probe is lost when
    no valid reply came within ``timeout_s``; :meth:`stats` covers ``window_s``. Raises
    ``ValueError`` when ``rate_pps x len(peers)`` exceeds :data:`MAX_SEND_PPS`. ``sock``: an
    already bound UDP socket to send from instead of one bound to ``(address, 0)``. Use as
    ``async with`` (sending runs in a task until exit)."""

    address: str
    peers: list[str]
    port: int = DEFAULT_UDP_PORT
    mode: Mode = "udp"
    rate_pps: float = 1.0
    timeout_s: float = 1.0
    window_s: float = 10.0
    prober_id: int = 0
    sock: socket.socket | None = None
    bad: Counter[str] = field(default_factory=Counter)
    send_errors: int = 0
    _seq: int = 0
    _pending: dict[tuple[str, int], int] = field(default_factory=dict)  # (peer, seq) -> send ns
    _done: dict[str, deque[tuple[int, int | None]]] = field(default_factory=dict)
    _proto: _Proto | None = None
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        if not self.rate_pps > 0 or not self.timeout_s > 0 or not self.window_s > 0:
            raise ValueError("rate_pps, timeout_s and window_s must be > 0")
        if self.rate_pps * len(self.peers) > MAX_SEND_PPS:
            raise ValueError(
                f"{self.rate_pps:g} probes/s x {len(self.peers)} peers > {MAX_SEND_PPS:g}/s"
            )
        self._done = {p: deque() for p in self.peers}

    async def __aenter__(self) -> ProbeSender:
        self._proto = await _endpoint(self._on, self.sock, (self.address, 0))
        self._task = asyncio.create_task(self._run(), name=f"probe-sender-{self.address}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._proto is not None:
            await self._proto.close()

    async def _run(self) -> None:
        interval = 1.0 / self.rate_pps
        next_at = time.monotonic()
        while True:
            self._expire(time.monotonic_ns())
            for peer in self.peers:
                self._send(peer)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def _send(self, peer: str) -> None:
        self._seq += 1
        t = time.monotonic_ns()
        self._pending[(peer, self._seq)] = t
        data = build_probe(Probe(KIND_PROBE, self.prober_id, self._seq, t), self.mode)
        try:
            assert self._proto is not None and self._proto.transport is not None
            self._proto.transport.sendto(data, (peer, self.port))
        except OSError:
            self.send_errors += 1  # no route, blackhole: the probe stays pending and is lost

    def _expire(self, now_ns: int) -> None:
        limit = int(self.timeout_s * 1e9)
        for key, t in list(self._pending.items()):
            if now_ns - t >= limit:
                del self._pending[key]
                self._done[key[0]].append((t + limit, None))
        keep = int(self.window_s * 1e9)
        for d in self._done.values():
            while d and now_ns - d[0][0] > keep:
                d.popleft()

    def _on(self, data: bytes, addr: tuple[str, int]) -> None:
        now = time.monotonic_ns()
        try:
            p = parse_probe(data, self.mode)
        except ProbeError as e:
            self.bad[e.reason] += 1
            return
        t = self._pending.get((addr[0], p.seq))
        if p.kind != KIND_REPLY or p.prober_id != self.prober_id or t != p.t_send_ns:
            self.bad["unexpected"] += 1  # not ours, late (already lost) or forged
            return
        del self._pending[(addr[0], p.seq)]
        self._done[addr[0]].append((now, now - t))

    def stats(self, peer: str) -> PeerStats:
        """Loss and RTT to ``peer`` over the window. Raises ``KeyError`` for an unknown peer."""
        self._expire(time.monotonic_ns())
        done = self._done[peer]
        rtts = sorted(r / 1000 for _, r in done if r is not None)
        return PeerStats(
            sent=len(done),
            lost=sum(1 for _, r in done if r is None),
            rtt_p50_us=_pct(rtts, 0.5) if rtts else None,
            rtt_p99_us=_pct(rtts, 0.99) if rtts else None,
            window_s=self.window_s,
        )
