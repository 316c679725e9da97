"""Fabric discovery at fleet scale: ``discover_fabric`` on synthetic discovery documents and an
ibnetdiscover-style switch graph, against loading the same fabric from its file form.

Usage: ``python benchmarks/discover.py [--hosts 2048] [--rails 8] [--runs 3]``.

Inputs: ``--hosts`` hosts of ``--rails`` IB HCAs each (node and port GUIDs, an IPoIB netdev with
its rail address, the agent's inventory with 8 GPU endpoints), 32 hosts per SU, each HCA cabled
by port GUID to its SU's rail leaf. Prints the median of ``--runs`` of:

- ``discover``: :func:`~linkguard.topology.discover.discover_fabric` (matching, rails, addresses,
  switches, the validated Fabric);
- ``baseline``: ``Fabric.model_validate`` of the same fabric's JSON form (what the service does
  with a fabric file), in the same run;

and their ratio next to the target (discover < 10 s at 2,048 x 8, within 5x of the baseline:
discovery is a one-off per onboarding, not on the failure path). No I/O besides stdout.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import median_s

from linkguard.models import HCAInfo, HostInventory, LinkLayer
from linkguard.models.discovery import HostDiscovery, NetdevFacts, RdmaPortFacts
from linkguard.topology.discover import discover_fabric
from linkguard.topology.fabric import Fabric
from linkguard.topology.switchgraph import HostCable, SwitchGraph, SwitchInfo

TARGET_S = 10.0
TARGET_RATIO = 5.0


def inputs(hosts: int, rails: int) -> tuple[list[HostDiscovery], SwitchGraph]:
    rail_base = int(ipaddress.IPv4Address("10.100.0.0"))
    ep_base = int(ipaddress.IPv4Address("10.200.0.0"))
    size = max(256, 1 << (hosts + 2 - 1).bit_length())
    plen = 32 - (size.bit_length() - 1)
    docs, cables, switches = [], [], {}
    for h in range(hosts):
        ports, nets = [], []
        for r in range(rails):
            guid = f"{h + 0x100:08x}{r:08x}"
            ports.append(
                RdmaPortFacts(
                    hca=f"mlx5_{r}",
                    link_layer=LinkLayer.INFINIBAND,
                    netdev=f"ib{r}",
                    node_guid=guid,
                    port_guid=guid,
                )
            )
            addr = ipaddress.IPv4Interface((rail_base + r * size + h + 1, plen))
            nets.append(NetdevFacts(name=f"ib{r}", kind="ipoib", ipv4=[addr]))
            leaf = f"su{h // 32}-leaf{r}"
            switches[leaf] = SwitchInfo(leaf)
            cables.append(
                HostCable(switch=leaf, switch_port=h % 32 + 1, source="bench", port_guid=guid)
            )
        inv = HostInventory(
            host=f"gpu{h:05d}",
            hcas=[HCAInfo(hca=f"mlx5_{r}", rail=r, netdev=f"ib{r}") for r in range(rails)],
            endpoints=[ipaddress.IPv4Address(ep_base + h * 8 + g) for g in range(8)],
        )
        docs.append(HostDiscovery(host=inv.host, inventory=inv, ports=ports, netdevs=nets))
    return docs, SwitchGraph(source="bench", switches=switches, cables=cables)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2048)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    docs, graph = inputs(args.hosts, args.rails)
    result = discover_fabric(docs, graph)
    assert result.fabric is not None and not result.unknowns, result.unknowns[:3]
    data = result.fabric.model_dump(mode="json")
    t_disc = median_s(lambda: discover_fabric(docs, graph), args.runs)
    t_base = median_s(lambda: Fabric.model_validate(data), args.runs)
    ratio = t_disc / t_base
    print(f"fabric discover, {args.hosts} hosts x {args.rails} rails, median of {args.runs}:")
    print(f"  discover      {t_disc:8.2f} s   (target < {TARGET_S:g} s at 2,048 x 8)")
    print(f"  baseline      {t_base:8.2f} s   (Fabric.model_validate of the same fabric)")
    print(f"  ratio         {ratio:8.1f} x   (target < {TARGET_RATIO:g} x)")
    print(f"  placed        {len(result.fabric.hosts)} hosts, {len(result.fabric.links)} links")
    ok = ratio < TARGET_RATIO and (args.hosts != 2048 or t_disc < TARGET_S)
    print("  targets met" if ok else "  TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
