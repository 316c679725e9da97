"""The dashboard's first render at fleet scale, in headless Chromium.

Usage: ``python benchmarks/dashboard_bench.py [--hosts 256 2048] [--rails 8] [--loads 10]
[--chromium /usr/bin/chromium]``. Needs Playwright (the test extra) and Debian's ``chromium``;
Playwright's own browser downloads are not used.

For each fabric size: a real :class:`~linkguard.topology.service.TopologyService` on a
generated rail-optimized fabric, its HTTP API and dashboard on a free loopback port, on the
in-memory bus (:mod:`linkguard.membus`). A bus client plays the agents: it publishes every
port's retained :class:`~linkguard.models.PortState` (all up, one port per SU down, so each SU
has a red cell) and the bench waits until ``/api/v1/summary`` counts them all. Then it loads
the page ``--loads`` times, each in a fresh browser context (empty cache), and reads
``document.body.dataset.rendered``: the ms from navigation start to the first complete fabric
picture (app.js sets it after fetching the fabric, the summary or every port state, and
drawing every link or cell). It checks that every element was drawn (256 hosts: every host's
port links; more: one cell per SU x rail) and prints p50 / max against the 2 s target.
Figures only: nothing here fails on time. The numbers move with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request
from pathlib import Path

from linkguard import topics
from linkguard.config import ApiSettings, BusSettings, ServiceSettings
from linkguard.logs import configure_logging
from linkguard.membus import MemoryBroker
from linkguard.models import PortState, PortStateName, PortStatus, encode
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService

TARGET_MS = 2000  # issue 5: a 2,048-host fabric renders in under 2 s


def _state(fabric: Fabric, host: str, rail: int, down: bool) -> PortState:
    hca = next(h for h in fabric.host(host).hcas if h.rail == rail)
    return PortState(
        host=host,
        hca=hca.hca,
        port=hca.port,
        rail=rail,
        link_layer=hca.link_layer,
        netdev=hca.netdev,
        state=PortStateName.DOWN if down else PortStateName.ACTIVE,
        rate_gbps=400.0,
        status=PortStatus.DOWN if down else PortStatus.UP,
        usable=not down,
        observed_at=time.time(),
        seq=1,
    )


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


async def _wait_counted(base: str, ports: int, timeout: float = 120) -> None:
    """Until the API's summary counts ``ports`` ports with a known state."""
    deadline = time.monotonic() + timeout
    while True:
        doc = json.loads(await asyncio.to_thread(_get, base + "api/v1/summary"))
        known = sum(sum(c["counts"].values()) - c["counts"]["unknown"] for c in doc["cells"])
        if known >= ports:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the service took in {known} of {ports} port states")
        await asyncio.sleep(0.1)


async def _bench(hosts: int, rails: int, loads: int, chromium: str) -> dict[str, object]:
    from playwright.async_api import async_playwright

    fabric = generate_rail_optimized(hosts=hosts, rails=rails)
    broker = MemoryBroker()
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(),
            startup_settle_s=0.2,
            api=ApiSettings(port=0),
            log_level="warning",
        ),
        fabric=fabric,
        bus_factory=broker.bus_factory,
    )
    agents = broker.bus_factory(**BusSettings().connection(), client_id="bench-agents")
    tasks = [asyncio.create_task(service.run()), asyncio.create_task(agents.run())]
    try:
        await agents.wait_connected(10)
        su_of = {s.name: s.su for s in fabric.switches}
        host_su = {ln.a.split(":")[0]: su_of[ln.b] for ln in fabric.links if ln.kind == "host-leaf"}
        leaves = sum(1 for s in fabric.switches if s.role == "leaf")
        first_in_su: set[int] = set()
        down = 0
        for inv in fabric.hosts:
            su = host_su[inv.host]
            for h in inv.hcas:
                is_down = su not in first_in_su and h.rail == su % rails
                if is_down:
                    first_in_su.add(su)
                    down += 1
                st = _state(fabric, inv.host, h.rail, is_down)
                await agents.publish(
                    topics.port_state(inv.host, h.hca, h.port), encode(st), retain=True
                )
        deadline = time.monotonic() + 30
        while getattr(service, "api_port", None) is None:
            if time.monotonic() > deadline:
                raise SystemExit("the API did not start listening")
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{service.api_port}/"
        ports = sum(len(inv.hcas) for inv in fabric.hosts)
        await _wait_counted(base, ports)
        fabric_kb = len(await asyncio.to_thread(_get, base + "api/v1/fabric")) / 1024

        times: list[int] = []
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                for _ in range(loads):
                    ctx = await browser.new_context(viewport={"width": 1600, "height": 1000})
                    page = await ctx.new_page()
                    await page.goto(base)
                    await page.wait_for_function("document.body.dataset.rendered", timeout=30_000)
                    times.append(int(await page.evaluate("document.body.dataset.rendered")))
                    mode = await page.evaluate("document.body.dataset.mode")
                    links = await page.evaluate("document.querySelectorAll('line.link').length")
                    cells = await page.evaluate("document.querySelectorAll('rect.cell').length")
                    red = await page.evaluate(
                        "document.querySelectorAll('[data-shown=\"down\"]').length"
                    )
                    await ctx.close()
                    want = ports if mode == "detail" else leaves
                    drawn = links if mode == "detail" else cells
                    if drawn != want or red == 0:
                        raise SystemExit(f"{hosts} hosts: drew {drawn} of {want} ({mode})")
            finally:
                await browser.close()
        return {
            "hosts": hosts,
            "rails": rails,
            "mode": mode,
            "elements": drawn,
            "down": down,
            "fabric_kb": round(fabric_kb),
            "times_ms": times,
        }
    finally:
        service.stop()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[256, 2048], help="fabric sizes")
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--loads", type=int, default=10, help="page loads per size")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium executable")
    args = ap.parse_args()
    configure_logging("console", "warning")
    if not Path(args.chromium).exists():
        raise SystemExit(f"no Chromium at {args.chromium} (apt-get install chromium)")
    print(f"first render, navigation start -> picture drawn; target < {TARGET_MS} ms")
    print(
        f"{'hosts':>6} {'rails':>5} {'mode':>9} {'drawn':>6} {'fabric':>7} "
        f"{'p50 ms':>7} {'max ms':>7}  target"
    )
    for hosts in args.hosts:
        r = asyncio.run(_bench(hosts, args.rails, args.loads, args.chromium))
        t = r["times_ms"]
        assert isinstance(t, list)
        p50, worst = statistics.median(t), max(t)
        print(
            f"{r['hosts']:>6} {r['rails']:>5} {r['mode']:>9} {r['elements']:>6} "
            f"{r['fabric_kb']:>5}KB {p50:>7.0f} {worst:>7}  "
            f"{'ok' if worst < TARGET_MS else 'OVER'} (loads: {', '.join(map(str, t))})"
        )


if __name__ == "__main__":
    main()
