"""UDP and TCP flows and reachability probes between GPU endpoints, in a lab host's namespace.

A standalone script (standard library only, started by path with ``ip netns exec NS python
udpflow.py ...``, so it starts fast and imports nothing from linkguard)::

  udpflow.py send INTERVAL_MS SRC DST PORT [SRC DST PORT ...]
      one socket per flow bound to SRC; every INTERVAL_MS each sends a datagram (seq: 8 bytes,
      send time: 8 bytes) to DST:PORT, until killed; a send that fails (no route, link down)
      or would block (send buffer full behind a dead link) is a lost datagram
  udpflow.py recv ADDR PORT OUTFILE [ADDR PORT OUTFILE ...]
      one line "seq monotonic_s" per datagram received on ADDR:PORT, into OUTFILE
  udpflow.py tcpsend INTERVAL_MS SRC DST PORT [SRC DST PORT ...]
      one TCP connection per flow from SRC (bound to it, TCP_NODELAY) to DST:PORT, connecting
      again until it succeeds; every INTERVAL_MS each writes one record (RECORD bytes: seq,
      send time, padding). Records the kernel cannot take yet (a send buffer full behind a dead
      path) wait in order in the sender and go as soon as it can: TCP loses nothing, it delays
  udpflow.py tcprecv ADDR PORT OUTFILE [ADDR PORT OUTFILE ...]
      listens on ADDR:PORT and writes one line "seq monotonic_s" per complete record received
      (from any connection), into OUTFILE: a TCP flow's gap reads like a UDP flow's
  udpflow.py probe PORT ADDR [ADDR ...]
      echoes every datagram that reaches ADDR:PORT back to its sender (from ADDR), and probes on
      command from stdin: "p ID SRC DST" queues a probe from SRC to DST:PORT (DST runs the same
      echo), "go TIMEOUT_MS" sends the queued probes (again every 50 ms until answered) and
      prints "r ID 1 RTT_MS" or "r ID 0" per probe, then "done". Prints "ready" once bound.

CLOCK_MONOTONIC is system-wide, so receive times compare with the caller's time.monotonic().
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import sys
import time

#: Probes not answered are sent again this often (s).
PROBE_RETRY_S = 0.05
#: Bytes of one TCP flow record: seq (8), send time (8), padding.
RECORD = 64


def send(interval_ms: float, flows: list[tuple[str, str, int]]) -> None:
    socks = []
    for src, dst, port in flows:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((src, 0))
        # never block: datagrams queued behind a dead link fill the send buffer, and a
        # blocked sender would stop numbering (the loss would not show)
        s.setblocking(False)
        socks.append((s, (dst, port)))
    seq = 0
    interval = interval_ms / 1000
    next_at = time.monotonic()
    while True:
        payload = struct.pack("!Qd", seq, time.monotonic())
        for s, to in socks:
            with contextlib.suppress(OSError):
                s.sendto(payload, to)
        seq += 1
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:  # late (a busy machine): do not send a burst to catch up
            next_at = time.monotonic()


def recv(flows: list[tuple[str, int, str]]) -> None:
    sel = selectors.DefaultSelector()
    for addr, port, out in flows:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((addr, port))
        sel.register(s, selectors.EVENT_READ, open(out, "w", buffering=1))  # noqa: SIM115
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)  # only sockets are registered
            data = sock.recv(64)
            if len(data) >= 16:
                seq, _ = struct.unpack("!Qd", data[:16])
                key.data.write(f"{seq} {time.monotonic():.6f}\n")


def _tcp_connect(src: str, dst: str, port: int) -> socket.socket:
    while True:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.bind((src, 0))
        try:
            s.connect((dst, port))
        except OSError:  # the receiver is not listening yet, or no route yet
            s.close()
            time.sleep(0.05)
            continue
        s.setblocking(False)
        return s


def tcpsend(interval_ms: float, flows: list[tuple[str, str, int]]) -> None:
    conns = [_tcp_connect(src, dst, port) for src, dst, port in flows]
    pending = [b""] * len(conns)  # per connection: records not sent yet
    seq = 0
    interval = interval_ms / 1000
    next_at = time.monotonic()
    while True:
        record = struct.pack("!Qd", seq, time.monotonic()).ljust(RECORD, b"\0")
        for i, c in enumerate(conns):
            pending[i] += record
            try:
                sent = c.send(pending[i])
                pending[i] = pending[i][sent:]
            except BlockingIOError:
                pass  # the kernel's buffer is full: the records wait here, in order
        seq += 1
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()


def tcprecv(flows: list[tuple[str, int, str]]) -> None:
    sel = selectors.DefaultSelector()
    for addr, port, out in flows:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addr, port))
        ls.listen(4)
        sel.register(ls, selectors.EVENT_READ, ("listen", open(out, "w", buffering=1)))  # noqa: SIM115
    bufs: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in sel.select():
            kind, f = key.data
            s = key.fileobj
            assert isinstance(s, socket.socket)  # only sockets are registered
            if kind == "listen":
                conn, _ = s.accept()
                bufs[conn] = b""
                sel.register(conn, selectors.EVENT_READ, ("conn", f))
                continue
            data = s.recv(65536)
            now = time.monotonic()
            if not data:
                sel.unregister(s)
                s.close()
                bufs.pop(s, None)
                continue
            buf = bufs[s] + data
            while len(buf) >= RECORD:
                seq, _ = struct.unpack("!Qd", buf[:16])
                f.write(f"{seq} {now:.6f}\n")
                buf = buf[RECORD:]
            bufs[s] = buf


class Prober:
    """The ``probe`` mode: echo sockets on this host's endpoints, probes on command."""

    def __init__(self, port: int, addrs: list[str]) -> None:
        self.port = port
        self.sel = selectors.DefaultSelector()
        for addr in addrs:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((addr, port))
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, "echo")
        self.stdin = sys.stdin.fileno()
        self.sel.register(self.stdin, selectors.EVENT_READ, "stdin")
        self.senders: dict[str, socket.socket] = {}
        self.buf = b""
        self.closed = False
        self.answers: dict[str, float] = {}

    def sender(self, src: str) -> socket.socket:
        if src not in self.senders:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((src, 0))
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, "reply")
            self.senders[src] = s
        return self.senders[src]

    def serve(self, timeout: float | None) -> None:
        """One select round: echo, note probe answers, read stdin into the buffer."""
        for key, _ in self.sel.select(timeout):
            if key.data == "stdin":
                chunk = os.read(self.stdin, 65536)
                self.closed |= not chunk
                self.buf += chunk
                continue
            s = key.fileobj
            assert isinstance(s, socket.socket)  # stdin is handled above: the rest are sockets
            while True:
                try:
                    data, peer = s.recvfrom(256)
                except OSError:  # BlockingIOError: drained
                    break
                if key.data == "echo":
                    with contextlib.suppress(OSError):
                        s.sendto(data, peer)
                elif data.startswith(b"P"):
                    self.answers.setdefault(data[1:].decode(errors="replace"), time.monotonic())

    def run(self) -> None:
        print("ready", flush=True)
        queued: list[tuple[str, str, str]] = []
        while not self.closed:
            self.serve(None)
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                parts = line.decode().split()
                if len(parts) == 4 and parts[0] == "p":
                    queued.append((parts[1], parts[2], parts[3]))
                elif len(parts) == 2 and parts[0] == "go":
                    self.probe(queued, float(parts[1]) / 1000)
                    queued = []

    def probe(self, queued: list[tuple[str, str, str]], timeout: float) -> None:
        self.answers = {}
        sent_at: dict[str, float] = {}
        start = time.monotonic()
        last_round = -PROBE_RETRY_S
        while True:
            now = time.monotonic()
            pending = [q for q in queued if q[0] not in self.answers]
            if not pending or now - start > timeout:
                break
            if now - last_round >= PROBE_RETRY_S:
                last_round = now
                for pid, src, dst in pending:
                    sent_at.setdefault(pid, now)
                    with contextlib.suppress(OSError):
                        self.sender(src).sendto(b"P" + pid.encode(), (dst, self.port))
            self.serve(PROBE_RETRY_S / 5)
        out = [
            f"r {pid} 1 {(self.answers[pid] - sent_at[pid]) * 1000:.3f}"
            if pid in self.answers
            else f"r {pid} 0"
            for pid, _, _ in queued
        ]
        sys.stdout.write("\n".join([*out, "done"]) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "send":
        rest = args[1:]
        send(
            float(args[0]),
            [(rest[i], rest[i + 1], int(rest[i + 2])) for i in range(0, len(rest), 3)],
        )
    elif mode == "recv":
        recv([(args[i], int(args[i + 1]), args[i + 2]) for i in range(0, len(args), 3)])
    elif mode == "tcpsend":
        rest = args[1:]
        tcpsend(
            float(args[0]),
            [(rest[i], rest[i + 1], int(rest[i + 2])) for i in range(0, len(rest), 3)],
        )
    elif mode == "tcprecv":
        tcprecv([(args[i], int(args[i + 1]), args[i + 2]) for i in range(0, len(args), 3)])
    elif mode == "probe":
        Prober(int(args[0]), args[1:]).run()
    else:
        raise SystemExit(f"unknown mode {mode!r} (send, recv, tcpsend, tcprecv, probe)")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        main(sys.argv[1:])
