"""The network-namespace lab: shape, real forwarding between endpoints, complete teardown."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import subprocess
import sys
import time

import pytest

from linkguard.simulations.lab import Lab, LabError, endpoint_address, rail_address
from tests.support import require_root

LAB_LINK = re.compile(r"^(rail\d+|leaf\d+|h\d+r\d+)$")


def ip_json(*args: str) -> list[dict]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out or "[]")


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def root_lab_links() -> set[str]:
    return {link["ifname"] for link in ip_json("link", "show") if LAB_LINK.match(link["ifname"])}


@pytest.fixture
def lab():
    require_root()
    lab = Lab.create(hosts=3, rails=2)
    try:
        yield lab
    finally:
        lab.destroy()


def test_shape_rejects_bad_sizes():
    with pytest.raises(ValueError):
        Lab.create(hosts=0, rails=2)
    with pytest.raises(ValueError):
        Lab.create(hosts=2, rails=65)


def test_lab_shape(lab: Lab):
    assert {lab.fabric_netns, *(h.netns for h in lab.hosts)} <= netns_names()
    assert [h.name for h in lab.hosts] == ["host0", "host1", "host2"]
    fabric = {
        link["ifname"]: link for link in ip_json("-n", lab.fabric_netns, "-d", "link", "show")
    }
    assert fabric["leaf0"]["linkinfo"]["info_kind"] == "bridge"
    for h, host in enumerate(lab.hosts):
        assert host.endpoints == [endpoint_address(h, 0), endpoint_address(h, 1)]
        assert str(host.endpoints[1]) == f"10.200.{h}.2"
        addrs = {a["ifname"]: a for a in ip_json("-n", host.netns, "addr", "show")}
        lo = {
            (i["local"], i["prefixlen"]) for i in addrs["lo"]["addr_info"] if i["family"] == "inet"
        }
        assert lo == {("127.0.0.1", 8), (f"10.200.{h}.1", 32), (f"10.200.{h}.2", 32)}
        for r, rail in enumerate(host.rails):
            assert (rail.rail, rail.netdev, rail.fabric_port) == (r, f"rail{r}", f"h{h}r{r}")
            assert (
                rail.address == rail_address(h, r) == ipaddress.IPv4Address(f"10.100.{r}.{h + 1}")
            )
            link = addrs[rail.netdev]
            inet = [
                (i["local"], i["prefixlen"]) for i in link["addr_info"] if i["family"] == "inet"
            ]
            assert inet == [(str(rail.address), 24)]
            assert "LOWER_UP" in link["flags"]
            port = fabric[rail.fabric_port]
            assert port["master"] == f"leaf{r}"
            # the two ends of the veth: peers of each other, with distinct ifindexes
            assert link["link_index"] == port["ifindex"] and port["link_index"] == link["ifindex"]
            assert link["ifindex"] != port["ifindex"]
            assert lab.ifindex(host.netns, rail.netdev) == link["ifindex"]
        # main starts with the connected /24s only: endpoint routes are linkguard's job
        routes = ip_json("-n", host.netns, "route", "show", "table", "main")
        assert sorted(r["dst"] for r in routes) == ["10.100.0.0/24", "10.100.1.0/24"]
        for key in ("all", "default", "lo", "rail0", "rail1"):
            proc = lab.exec(
                h, ["cat", f"/proc/sys/net/ipv4/conf/{key}/rp_filter"], stdout=subprocess.PIPE
            )
            assert proc.communicate(timeout=10)[0].strip() == b"0", key


RECEIVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
s.settimeout(10)
print(s.getsockname()[1], flush=True)
data, peer = s.recvfrom(100)
print(data.decode(), peer[0], flush=True)
"""

SENDER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
s.sendto(b"hello-rail0", (sys.argv[2], int(sys.argv[3])))
"""


def test_udp_between_endpoints_over_a_rail(lab: Lab):
    src, dst = lab.hosts[0].endpoints[0], lab.hosts[1].endpoints[0]
    subprocess.run(
        [
            "ip",
            "-n",
            lab.hosts[0].netns,
            "route",
            "add",
            f"{dst}/32",
            "via",
            "10.100.0.2",
            "dev",
            "rail0",
        ],
        check=True,
    )
    rx = lab.exec(1, [sys.executable, "-c", RECEIVER, str(dst)], stdout=subprocess.PIPE, text=True)
    port = rx.stdout.readline().strip()  # printed once bound
    assert port.isdigit(), port
    tx = lab.exec(0, [sys.executable, "-c", SENDER, str(src), str(dst), port])
    assert tx.wait(timeout=10) == 0
    out, _ = rx.communicate(timeout=15)
    assert out.split() == ["hello-rail0", str(src)]
    # and it crossed the rail-0 leaf: host 1 received it on rail0
    stats = ip_json("-n", lab.hosts[1].netns, "-s", "link", "show", "rail0")[0]
    assert stats["stats64"]["rx"]["packets"] >= 1


def test_link_down_up_drops_and_restores_carrier(lab: Lab):
    def flags() -> list[str]:
        return ip_json("-n", lab.hosts[2].netns, "link", "show", "rail1")[0]["flags"]

    lab.link_down(2, 1)
    assert "LOWER_UP" not in flags() and "UP" in flags()  # carrier lost, admin state kept
    lab.link_up(2, 1)
    deadline = time.monotonic() + 5
    while "LOWER_UP" not in flags():
        assert time.monotonic() < deadline, "carrier did not return"
        time.sleep(0.01)


def test_destroy_leaves_nothing_behind():
    require_root()
    links_before = root_lab_links()
    lab = Lab.create(hosts=3, rails=2)
    names = {lab.fabric_netns, *(h.netns for h in lab.hosts)}
    proc = lab.exec(0, ["sleep", "60"])
    lab.destroy()
    assert proc.poll() is not None  # processes started in the lab are gone too
    assert not names & netns_names()
    assert not any(n.startswith(lab.prefix) for n in netns_names())
    assert root_lab_links() == links_before
    lab.destroy()  # twice is fine


def test_partial_create_is_cleaned_up():
    require_root()
    prefix = f"lgp{secrets.token_hex(3)}"
    taken = f"{prefix}h1"  # not ours: create must fail there and must not delete it
    subprocess.run(["ip", "netns", "add", taken], check=True)
    try:
        with pytest.raises(LabError, match="netns add"):
            Lab.create(hosts=2, rails=1, prefix=prefix)
        assert {n for n in netns_names() if n.startswith(prefix)} == {taken}
    finally:
        subprocess.run(["ip", "netns", "del", taken], check=False)
