"""The kernel forwards over the compact plan's routes: two namespaces joined by two veth pairs
(two rails), the destination a /32 on ``lo`` of the far one, no gateway anywhere. An on-link
prefix route ARPs for the destination itself on its rail, and the far host answers from
``lo`` (arp_ignore=0, rp_filter=0); a multipath on-link route spreads flows over both rails;
an ``unreachable`` /32 under it refuses to send."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

import pytest

from linkguard.drivers.routes import KernelRoute, RouteTable
from tests.support import require_root

TABLE = 1043
SRC, DST, PORT = "10.200.0.1", "10.200.1.1", 9000
FLOWS = 32

RECEIVER = f"""
import json, socket, sys
want = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{DST}", {PORT}))
s.settimeout(10)
print("ready", flush=True)
got = []
try:
    while len(got) < want:
        got.append(s.recvfrom(64)[1][1])
except TimeoutError:
    pass
print(json.dumps(sorted(got)), flush=True)
"""

SENDER = f"""
import json, socket, sys
errors = {{}}
for sport in range(40000, 40000 + int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("{SRC}", sport))
    try:
        s.sendto(b"x", ("{DST}", {PORT}))
    except OSError as exc:
        errors[sport] = exc.errno
    s.close()
print(json.dumps(errors))
"""


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


@dataclass
class Pair:
    near: str  # sends; rails ``a0``/``a1`` (10.100.r.1/24), endpoint 10.200.0.1/32 on lo
    far: str  # receives; rails ``b0``/``b1`` (10.100.r.2/24), endpoint 10.200.1.1/32 on lo

    def rx_packets(self, dev: str) -> int:
        (link,) = json.loads(sh("ip", "-n", self.far, "-j", "-s", "link", "show", "dev", dev))
        return int(link["stats64"]["rx"]["packets"])

    def send(self, flows: int) -> tuple[list[int], dict[str, int]]:
        """Send one datagram on each of ``flows`` UDP flows (source ports 40000...) from near
        to far; (source ports received, errno by source port of refused sends)."""
        recv = subprocess.Popen(
            ["ip", "netns", "exec", self.far, sys.executable, "-c", RECEIVER, str(flows)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert recv.stdout is not None and recv.stdout.readline() == "ready\n"
            out = sh("ip", "netns", "exec", self.near, sys.executable, "-c", SENDER, str(flows))
            errors = json.loads(out)
            if len(errors) == flows:  # nothing was sent: do not wait for the receiver's timeout
                recv.kill()
                return [], errors
            got = json.loads(recv.stdout.readline())
            return got, errors
        finally:
            if recv.poll() is None:
                recv.kill()
            recv.wait(timeout=5)


@pytest.fixture
def pair() -> Iterator[Pair]:
    require_root()
    tag = secrets.token_hex(3)
    p = Pair(near=f"lgfw{tag}a", far=f"lgfw{tag}b")
    made: list[str] = []
    try:
        for ns in (p.near, p.far):
            sh("ip", "netns", "add", ns)
            made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh(
                "ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.all.arp_ignore=0", "net.ipv4.conf.default.arp_ignore=0",
                "net.ipv4.fib_multipath_hash_policy=1",  # hash on ports: flows spread
                # no IPv6 chatter (DAD, router solicitations) in the packet counters
                "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
            )  # fmt: skip
        sh("ip", "-n", p.near, "addr", "add", f"{SRC}/32", "dev", "lo")
        sh("ip", "-n", p.far, "addr", "add", f"{DST}/32", "dev", "lo")
        for r in (0, 1):
            sh(
                "ip", "-n", p.near, "link", "add", f"a{r}", "index", str(10 + r),
                "type", "veth", "peer", "name", f"b{r}", "netns", p.far, "index", str(20 + r),
            )  # fmt: skip
            for ns, dev, host in ((p.near, f"a{r}", 1), (p.far, f"b{r}", 2)):
                sh("ip", "-n", ns, "addr", "add", f"10.100.{r}.{host}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
        yield p
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def prefix(*netdevs: str) -> KernelRoute:
    return KernelRoute(IPv4Network("10.200.1.0/24"), nexthops=netdevs)


async def test_on_link_prefix_routes_forward(pair: Pair) -> None:
    async with RouteTable(
        table=TABLE, netns=pair.near, prefixes=[IPv4Network("10.200.0.0/16")]
    ) as rt:
        await rt.ensure_rules()

        # one rail, no gateway: the far host answers ARP for its lo address on that rail
        assert (await rt.reconcile([prefix("a1")])).added == 1
        before = {dev: pair.rx_packets(dev) for dev in ("b0", "b1")}
        got, errors = pair.send(FLOWS)
        assert (got, errors) == (list(range(40000, 40000 + FLOWS)), {})
        grown = {dev: pair.rx_packets(dev) - before[dev] for dev in ("b0", "b1")}
        assert grown["b0"] == 0 and grown["b1"] >= FLOWS  # + the ARP exchange

        # both rails: every flow arrives, spread over both (hashed on the ports)
        assert (await rt.reconcile([prefix("a0", "a1")])).replaced == 1
        before = {dev: pair.rx_packets(dev) for dev in ("b0", "b1")}
        got, errors = pair.send(FLOWS)
        assert (got, errors) == (list(range(40000, 40000 + FLOWS)), {})
        grown = {dev: pair.rx_packets(dev) - before[dev] for dev in ("b0", "b1")}
        assert grown["b0"] > 0 and grown["b1"] > 0 and sum(grown.values()) >= FLOWS

        # an unreachable /32 under the prefix route: nothing leaves, the sender is told so
        unreachable = KernelRoute(IPv4Address(DST), kind="unreachable")
        assert (await rt.reconcile([prefix("a0", "a1"), unreachable])).added == 1
        before = {dev: pair.rx_packets(dev) for dev in ("b0", "b1")}
        got, errors = pair.send(4)
        assert got == [] and set(errors.values()) == {113}  # EHOSTUNREACH
        assert {dev: pair.rx_packets(dev) for dev in ("b0", "b1")} == before

        assert await rt.flush() == 2
