"""A tiny UDP flow for the data-plane tests, run inside a host namespace.

  python udpflow.py send SRC DST PORT INTERVAL_MS   sequence-numbered datagrams until killed
  python udpflow.py recv ADDR PORT OUTFILE          one line "seq monotonic_s" per datagram

CLOCK_MONOTONIC is system-wide, so receive times compare with the test's own time.monotonic().
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import time


def send(src: str, dst: str, port: int, interval_ms: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    seq = 0
    while True:
        # no route yet / link down: the datagram is lost, like on a real fabric
        with contextlib.suppress(OSError):
            s.sendto(struct.pack("!Qd", seq, time.monotonic()), (dst, port))
        seq += 1
        time.sleep(interval_ms / 1000)


def recv(addr: str, port: int, out: str) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    with open(out, "w", buffering=1) as f:
        while True:
            data = s.recv(64)
            seq, _ = struct.unpack("!Qd", data[:16])
            f.write(f"{seq} {time.monotonic():.6f}\n")


if __name__ == "__main__":
    if sys.argv[1] == "send":
        send(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        recv(sys.argv[2], int(sys.argv[3]), sys.argv[4])
