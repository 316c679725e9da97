"""A TCP ping-pong between two GPU endpoints, run inside lab host namespaces: what a collective
sees of the network, measured without a framework.

A standalone script (standard library only, started by path with ``ip netns exec NS python
tcpflow.py ...``, like :mod:`linkguard.simulations.udpflow`)::

  tcpflow.py echo ADDR PORT
      listens on ADDR:PORT, prints "ready"; echoes every 16-byte record of each connection
      back on it, until killed
  tcpflow.py ping SRC DST PORT INTERVAL_MS OUTFILE
      connects to DST:PORT (bound to SRC first, unless SRC is "-": then the kernel picks the
      source from the route, as an unbound client does), writes "local ADDR" to OUTFILE, then
      every INTERVAL_MS sends one record (seq: 8 bytes, send time: 8 bytes) and waits for its
      echo before the next: one line "seq monotonic_s" per completed round trip. A round trip
      crosses the network both ways, so a rail lost in either direction stops the loop, as it
      stops a collective. Exits 3 when the connection fails (the error goes to OUTFILE as
      "error ...").
  tcpflow.py sink ADDR PORT OUTFILE
      listens on ADDR:PORT, prints "ready", takes one connection and writes one line
      "seq monotonic_s" per record received into OUTFILE
  tcpflow.py stream SRC DST PORT INTERVAL_MS OUTFILE
      connects as ``ping`` does, then sends one record every INTERVAL_MS without waiting for
      anything (a send blocks only on a full send buffer): a stream always has segments on the
      way, so a path lost under it always catches one (the sink's gap is the stall)

The stall of a fault is the longest gap between completed round trips around it
(:func:`stall_ms`). CLOCK_MONOTONIC is system-wide, so the times compare with the caller's
``time.monotonic()``. TCP_NODELAY is set on both ends: a record is never held back by Nagle.
"""

from __future__ import annotations

import itertools
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

__all__ = ["read_rounds", "stall_ms"]

RECORD = struct.Struct("!Qd")


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _echo_one(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (data := _recv_exact(conn, RECORD.size)) is not None:
            conn.sendall(data)


def _listen(addr: str, port: int, backlog: int) -> socket.socket:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(backlog)
    print("ready", flush=True)
    return srv


def echo(addr: str, port: int) -> None:
    srv = _listen(addr, port, 16)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_echo_one, args=(conn,), daemon=True).start()


def sink(addr: str, port: int, out_path: str) -> None:
    conn, _ = _listen(addr, port, 1).accept()
    with open(out_path, "w", buffering=1) as out:
        while (data := _recv_exact(conn, RECORD.size)) is not None:
            seq, _ = RECORD.unpack(data)
            out.write(f"{seq} {time.monotonic():.6f}\n")


def _connect(src: str, dst: str, port: int, out: TextIO) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if src != "-":
            s.bind((src, 0))
        s.settimeout(10)
        s.connect((dst, port))
        s.settimeout(None)
    except OSError as exc:
        out.write(f"error {exc}\n")
        return None
    out.write(f"local {s.getsockname()[0]}\n")
    return s


def send(
    src: str, dst: str, port: int, interval_ms: float, out_path: str, *, wait_echo: bool
) -> int:
    """``ping`` (``wait_echo``: each record's echo before the next, one line per round trip)
    or ``stream`` (records back to back, nothing logged past the connect)."""
    with open(out_path, "w", buffering=1) as out:
        s = _connect(src, dst, port, out)
        if s is None:
            return 3
        interval = interval_ms / 1000
        next_at = time.monotonic()
        for seq in itertools.count():
            try:
                s.sendall(RECORD.pack(seq, time.monotonic()))
                if wait_echo and _recv_exact(s, RECORD.size) is None:
                    out.write("error connection closed\n")
                    return 3
            except OSError as exc:
                out.write(f"error {exc}\n")
                return 3
            if wait_echo:
                out.write(f"{seq} {time.monotonic():.6f}\n")
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:  # late (a stall): no burst to catch up
                next_at = time.monotonic()
    return 0


def read_rounds(text: str) -> tuple[str | None, list[float], str | None]:
    """Parse a ``ping``, ``stream`` or ``sink`` OUTFILE: (local address or None, completion or
    arrival times in s, error or None). A line still being written (no newline) is left out."""
    local = error = None
    times: list[float] = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "local" and len(parts) == 2:
            local = parts[1]
        elif parts[0] == "error":
            error = line[len("error ") :].strip()
        elif len(parts) == 2:
            times.append(float(parts[1]))
    return local, times, error


def stall_ms(times: Sequence[float], t_from: float, t_to: float) -> float:
    """Longest gap (ms) between consecutive round trips that covers part of
    [``t_from``, ``t_to``] (monotonic s): the gap that starts at the last completion before
    ``t_from``, and every later one up to the first completion after ``t_to``. When no
    round trip completed after ``t_from``, the gap runs to ``t_to`` (the connection never
    came back in the window). ``nan`` without a completion before ``t_from``."""
    before = [t for t in times if t <= t_from]
    if not before:
        return float("nan")
    inside = [t for t in times if t > t_from]
    after = [t for t in inside if t >= t_to][:1]
    series = [before[-1], *(t for t in inside if t < t_to), *after]
    if len(series) == 1:
        return (t_to - series[0]) * 1000
    return max(b - a for a, b in itertools.pairwise(series)) * 1000


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "echo":
        echo(argv[1], int(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "sink":
        sink(argv[1], int(argv[2]), argv[3])
        return 0
    if len(argv) == 6 and argv[0] in ("ping", "stream"):
        return send(
            argv[1], argv[2], int(argv[3]), float(argv[4]), argv[5], wait_echo=argv[0] == "ping"
        )
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
