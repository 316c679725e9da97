"""Probes over real sockets between two network namespaces joined by a bridge (a "leaf").

A prober namespace and a responder namespace, each with one veth into a bridge in a fabric
namespace. Probes flow with no loss and a measured RTT; then the responder's bridge port is set
to the disabled state (``bridge link set dev X state 0``): a silent drop, carrier stays up on
both veth ends, and the measured loss reaches 100% within the sender's window plus its timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from pyroute2 import netns as pr_netns

from linkguard.agent.probe import DEFAULT_UDP_PORT, ROCE_UDP_PORT, ProbeResponder, ProbeSender
from tests.support import require_binary, require_root, until

PROBER, RESPONDER = "10.251.0.1", "10.251.0.2"


def _ip(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc.stdout


@pytest.fixture
def lab() -> Iterator[dict[str, str]]:
    require_root()
    require_binary("bridge")
    tag = f"lgp{os.getpid() % 100000}"
    ns = {"a": f"{tag}a", "r": f"{tag}r", "f": f"{tag}f"}
    made: list[str] = []
    try:
        for n in ns.values():
            _ip("ip", "netns", "add", n)
            made.append(n)
        f = ns["f"]
        _ip("ip", "-n", f, "link", "add", "br0", "type", "bridge")
        _ip("ip", "-n", f, "link", "set", "br0", "up")
        for i, (side, addr) in enumerate((("a", PROBER), ("r", RESPONDER))):
            # distinct ifindexes on the two veth ends (DESIGN.md: else carrier events lag)
            _ip(
                "ip", "-n", ns[side], "link", "add", "rail0", "index", str(300 + i),
                "type", "veth", "peer", "name", f"f{side}", "netns", f, "index", str(400 + i),
            )  # fmt: skip
            _ip("ip", "-n", f, "link", "set", f"f{side}", "master", "br0", "up")
            _ip("ip", "-n", ns[side], "addr", "add", f"{addr}/24", "dev", "rail0")
            _ip("ip", "-n", ns[side], "link", "set", "rail0", "up")
            _ip("ip", "-n", ns[side], "link", "set", "lo", "up")
        yield ns
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=10)


def bound_socket(netns: str, address: str, port: int) -> socket.socket:
    """A UDP socket made and bound inside ``netns``. setns(2) moves only the calling thread,
    so a throwaway thread enters the namespace; the socket stays in it for its life."""
    out: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            pr_netns.setns(netns, flags=0)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((address, port))
            s.setblocking(False)
            out.append(s)
        except BaseException as e:  # re-raised in the test's thread
            out.append(e)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def carrier_up(netns: str, dev: str) -> bool:
    (link,) = json.loads(_ip("ip", "-n", netns, "-j", "link", "show", dev))
    return "LOWER_UP" in link["flags"] and link["operstate"] == "UP"


@pytest.mark.parametrize(("mode", "port"), [("udp", DEFAULT_UDP_PORT), ("roce", ROCE_UDP_PORT)])
async def test_probes_measure_rtt_then_see_a_silent_drop(
    lab: dict[str, str], mode: str, port: int
) -> None:
    window, timeout = 1.0, 0.2
    async with (
        ProbeResponder(
            address=RESPONDER, port=port, mode=mode, sock=bound_socket(lab["r"], RESPONDER, port)
        ) as responder,  # type: ignore[arg-type]
        ProbeSender(
            address=PROBER,
            peers=[RESPONDER],
            port=port,
            mode=mode,  # type: ignore[arg-type]
            rate_pps=16,
            timeout_s=timeout,
            window_s=window,
            prober_id=42,
            sock=bound_socket(lab["a"], PROBER, 0),
        ) as sender,
    ):
        # a full window of answered probes
        await until(lambda: sender.stats(RESPONDER).sent >= 14, "a window of probes", timeout=10)
        st = sender.stats(RESPONDER)
        assert st.lost == 0, st
        assert st.rtt_p50_us is not None and st.rtt_p99_us is not None
        assert 0 < st.rtt_p50_us <= st.rtt_p99_us < 20_000  # veth + bridge: tens of µs
        print(f"\n{mode}: {st.sent} probes, loss 0, RTT p50 {st.rtt_p50_us:.0f} µs "
              f"p99 {st.rtt_p99_us:.0f} µs")  # fmt: skip
        assert responder.answered >= st.sent and not responder.bad and not sender.bad

        # silent drop: the responder's bridge port disabled, carrier up on both veth ends
        _ip("bridge", "-n", lab["f"], "link", "set", "dev", "fr", "state", "0")
        t0 = time.monotonic()

        def all_lost() -> bool:
            s = sender.stats(RESPONDER)
            return s.sent >= 10 and s.lost == s.sent

        await until(all_lost, "100% loss", timeout=window + timeout + 2)
        took = time.monotonic() - t0
        assert took <= window + timeout + 1.0, took  # window + timeout, + 1 s scheduling slack
        assert carrier_up(lab["r"], "rail0") and carrier_up(lab["a"], "rail0")
        assert carrier_up(lab["f"], "fr")
        print(f"{mode}: loss 100% {took:.2f} s after the drop (window {window} s + timeout "
              f"{timeout} s), carrier up")  # fmt: skip

        # port forwarding again: the window fills with answered probes
        _ip("bridge", "-n", lab["f"], "link", "set", "dev", "fr", "state", "3")
        await until(lambda: sender.stats(RESPONDER).lost == 0, "loss back to 0", timeout=window + 3)
    assert not responder.bad and not sender.bad
