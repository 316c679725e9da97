"""The discovered lab's parts: real lldpd in a lab's namespaces (each host sees its leaf on
every rail, named as the lab names it, and nothing behind the bridge), the switch graph that
makes, and the comparison of a discovered fabric with the lab's. The whole run
(``sim lab single-link-down --discover``) is a CI step."""

from __future__ import annotations

from pathlib import Path

from linkguard.drivers.lldp import run_lldpctl
from linkguard.models import HostDiscovery
from linkguard.simulations.lab import Lab
from linkguard.simulations.labdiscover import (
    LldpdSet,
    compare_discovered,
    discover_settings,
    discovered_from_docs,
)
from linkguard.simulations.labprocs import roce_fabric
from linkguard.topology.fabric import generate_rail_optimized
from tests.support import require_binary, require_root


def test_lldpd_in_a_lab_shows_each_host_its_leaves(tmp_path: Path) -> None:
    require_root()
    require_binary("lldpd")
    generated = generate_rail_optimized(hosts=2, rails=2, spines_per_su=0)
    with Lab.from_fabric(generated) as lab:
        lldp = LldpdSet.start(lab, tmp_path)
        try:
            lldp.wait_neighbours(lab)
            seen = {h.name: run_lldpctl(tuple(lldp.command(h.name))) for h in lab.hosts}
        finally:
            lldp.stop()
        assert all(p.poll() is not None for p in lldp.procs)
    for h in lab.hosts:
        got = sorted((n.netdev, n.system, n.port, n.switching) for n in seen[h.name])
        want = sorted((r.netdev, r.leaf, r.fabric_port, True) for r in lab.hosts[0].rails)
        # a leaf bridge's lldpd names its port (portidsubtype ifname) and says it bridges
        assert [(a, b, c.startswith("h"), d) for a, b, c, d in got] == [
            (a, b, True, d) for a, b, _, d in want
        ]
        assert {n.port for n in seen[h.name]} == {r.fabric_port for r in h.rails}
    fabric = roce_fabric(generated)
    docs = [
        HostDiscovery(host=h.name, inventory=fabric.host(h.name), lldp=seen[h.name])
        for h in lab.hosts
    ]
    # the inventories carry the addresses (no netdev facts here): the lab's fabric again
    found = discovered_from_docs(docs)
    assert found.unknowns == []
    assert compare_discovered(found.fabric, fabric) == []


def test_compare_names_each_difference() -> None:
    lab = generate_rail_optimized(hosts=2, rails=2, spines_per_su=0)
    assert compare_discovered(lab, lab) == []
    one = lab.model_copy(update={"hosts": lab.hosts[:1]})
    assert compare_discovered(one, lab) == ["host gpu001: not discovered"]
    assert compare_discovered(None, lab) == ["nothing discovered"]
    moved = lab.model_copy(update={"hosts": [lab.hosts[1], lab.hosts[0]]})
    assert compare_discovered(moved, lab) == []  # order is no difference


def test_the_settings_that_discover(tmp_path: Path) -> None:
    lldp = LldpdSet(workdir=tmp_path, sockets={"gpu000": tmp_path / "gpu000.sock"})
    service, agents = discover_settings(lldp, ["gpu000"], settle_s=2)
    assert service == {"fabric": {"discover": {"lldp": True, "settle_s": 2, "name": "lab"}}}
    assert agents["gpu000"]["discovery"]["lldp_command"] == [
        "lldpctl",
        "-u",
        str(tmp_path / "gpu000.sock"),
        "-f",
        "json",
    ]
