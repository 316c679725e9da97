"""Fast path cost on the real kernel: moving one rail's routes with RouteTable.update (the fast
path) against a full RouteTable.reconcile of the same change (the baseline), for tables of
256 to 16,384 /32 routes (32 to 2,048 peers x 8 GPUs). Needs root (a 2-host namespace lab).

    python benchmarks/fastpath_bench.py [--sizes 256,4096,16384] [--repeat 3]

Prints, per size: ms for the update, ms for the reconcile, and their ratio; then what the
neighbour flush that follows a change costs (``routes.neighbour_flush``; the applier's
:func:`~linkguard.agent.applier.lost_netdevs` and
:func:`~linkguard.agent.applier.stale_neighbours` between the two tables): one neighbour entry
per destination (on-link), resolved, but every 16th of the moved rail's unresolved (a host
that sent into the lost rail to some peers in the moment before the reroute); ms to list the
lost rail's entries, decide and delete the unresolved ones, against the update alone.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from ipaddress import IPv4Address, IPv4Network

from linkguard.agent.applier import lost_netdevs, stale_neighbours
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


def onlink(n: int, moved_rail: int | None) -> list[KernelRoute]:
    """n /32 destinations on-link (as prefix routes resolve them: one neighbour entry per
    destination), homed as in :func:`routes`."""
    out = []
    for r in routes(n, moved_rail):
        out.append(KernelRoute(r.destination, netdev=r.netdev))
    return out


async def measure_flush(lab: Lab, n: int, repeat: int) -> tuple[float, float, int]:
    """(median ms of the update, median ms of list + decide + delete, entries deleted)."""
    ns = lab.hosts[0].netns
    base, moved = onlink(n, None), onlink(n, 0)
    changed = [r for r, b in zip(moved, base, strict=True) if r != b]
    before, after = {r.destination: r for r in base}, {r.destination: r for r in moved}
    script = "".join(
        f"neigh replace {r.destination} dev {r.netdev} nud incomplete\n"
        if r.netdev == "rail0" and i % 32 == 0
        else f"neigh replace {r.destination} lladdr 02:00:00:00:{i >> 8 & 255:02x}:"
        f"{i & 255:02x} dev {r.netdev} nud reachable\n"
        for i, r in enumerate(base)
    )
    up, flush, deleted = [], [], 0
    async with RouteTable(table=TABLE, netns=ns, prefixes=[IPv4Network("10.200.0.0/16")]) as rt:
        for _ in range(repeat):
            await rt.reconcile(base)
            await asyncio.to_thread(
                subprocess.run, ["ip", "-n", ns, "-batch", "-"], input=script, text=True, check=True
            )
            t = time.perf_counter()
            await rt.update(changed)
            t1 = time.perf_counter()
            entries = await rt.neighbours(lost_netdevs(before, after))
            deleted = await rt.delete_neighbours(stale_neighbours(before, after, entries))
            t2 = time.perf_counter()
            up.append((t1 - t) * 1000)
            flush.append((t2 - t1) * 1000)
        await rt.flush()
    return statistics.median(up), statistics.median(flush), deleted


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
        # the kernel's one ARP table for all namespaces must hold the entries (Lab restores it)
        lab._raise_neigh_limit(2 * max(int(x) for x in args.sizes.split(",")))
        print(f"\n{'entries':>8} {'stale':>7} {'update ms':>10} {'+ flush ms':>11} {'ratio':>7}")
        for n in (int(x) for x in args.sizes.split(",")):
            up, fl, deleted = await measure_flush(lab, n, args.repeat)
            print(f"{n:>8} {deleted:>7} {up:>10.1f} {fl:>11.1f} {fl / up:>6.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
