"""Fast path cost on the real kernel: moving one rail's routes with RouteTable.update (the fast
path) against a full RouteTable.reconcile of the same change (the baseline), for tables of
256 to 16,384 /32 routes (32 to 2,048 peers x 8 GPUs). Needs root (a 2-host namespace lab).

    python benchmarks/fastpath_bench.py [--sizes 256,4096,16384] [--repeat 3]

Prints, per size: ms for the update, ms for the reconcile, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from ipaddress import IPv4Address, IPv4Network

from linkguard.drivers.routes import KernelRoute, RouteTable
from linkguard.simulations.lab import Lab

TABLE = 4242


def routes(n: int, moved_rail: int | None) -> list[KernelRoute]:
    """n destinations in 10.200.0.0/16, destination i homed on rail i % 2; the routes of
    ``moved_rail`` go over the other rail."""
    out = []
    for i in range(n):
        rail = i % 2
        if rail == moved_rail:
            rail = 1 - rail
        dest = IPv4Address(int(IPv4Address("10.200.0.1")) + i)
        out.append(KernelRoute(dest, IPv4Address(f"10.100.{rail}.2"), f"rail{rail}"))
    return out


async def measure(ns: str, n: int, repeat: int) -> tuple[float, float]:
    base, moved = routes(n, None), routes(n, 0)
    changed = [r for r, b in zip(moved, base, strict=True) if r != b]
    up, full = [], []
    async with RouteTable(table=TABLE, netns=ns, prefixes=[IPv4Network("10.200.0.0/16")]) as rt:
        for _ in range(repeat):
            await rt.reconcile(base)
            t = time.perf_counter()
            await rt.update(changed)
            up.append((time.perf_counter() - t) * 1000)
            await rt.reconcile(base)
            t = time.perf_counter()
            await rt.reconcile(moved)
            full.append((time.perf_counter() - t) * 1000)
        await rt.flush()
    return statistics.median(up), statistics.median(full)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,4096,16384")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with Lab.create(hosts=2, rails=2) as lab:
        print(f"{'routes':>8} {'moved':>7} {'update ms':>10} {'reconcile ms':>13} {'ratio':>7}")
        for n in (int(x) for x in args.sizes.split(",")):
            up, full = await measure(lab.hosts[0].netns, n, args.repeat)
            print(f"{n:>8} {n // 2:>7} {up:>10.1f} {full:>13.1f} {full / up:>6.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
