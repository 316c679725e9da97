"""The dashboard in a real browser: Debian's headless Chromium, driven by Playwright, on a
running topology service (its HTTP API on a free loopback port).

- 256 hosts x 8 rails, real agents and service on the in-memory bus: every host's port links
  are drawn; a link taken down on the simulated driver turns red on the page within 2 s
  (measured from the injection; the figure goes to the artifacts, with a screenshot);
- 320 hosts (above the 256-host detail limit), the service alone with port states published
  as agents publish them: one cell per leaf, a down port recolours its cell, a click drills
  down into the SU's links.

Artifacts go to ``$LINKGUARD_ARTIFACTS`` or ``tests/artifacts/`` (gitignored). The browser tests
skip when Playwright or ``/usr/bin/chromium`` (``$LINKGUARD_CHROMIUM``) is missing, and fail
instead under ``LINKGUARD_REQUIRE_REAL=1``. Playwright's own browser downloads are never used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

from linkguard import topics
from linkguard.config import ApiSettings, BusSettings, LedgerSettings, ServiceSettings
from linkguard.membus import MemoryBroker
from linkguard.models import PortEvent, PortState, PortStateName, PortStatus, encode
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.topology.fabric import Fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import missing, until

CHROMIUM = os.environ.get("LINKGUARD_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("LINKGUARD_ARTIFACTS") or Path(__file__).parent / "artifacts")
DASHBOARD = Path(__file__).resolve().parents[1] / "topology" / "dashboard"
#: the colours of style.css (computed style of an SVG stroke / fill)
RED = "rgb(214, 39, 40)"
GREEN = "rgb(46, 157, 74)"


def require_browser() -> None:
    """Skip (fail under LINKGUARD_REQUIRE_REAL=1) without Playwright or Debian's chromium."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        missing("needs playwright (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        missing(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[object]:
    """A headless Debian chromium (Playwright's ``Browser``), closed afterwards."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        # --no-sandbox: the suite runs as root in CI, where Chromium's sandbox refuses to start
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


async def api_url(service: TopologyService) -> str:
    """The service's dashboard URL once its API listens (``service.api_port``)."""
    await until(lambda: getattr(service, "api_port", None), "the API listening", timeout=20)
    return f"http://127.0.0.1:{service.api_port}/"


async def open_dashboard(browser, url: str):  # type: ignore[no-untyped-def]
    """A page on ``url`` after its first picture is drawn and its change stream is open;
    page errors are collected on ``page.errors``."""
    page = await browser.new_page(viewport={"width": 1600, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    await page.goto(url)
    await page.wait_for_function(
        "document.body.dataset.rendered && document.body.dataset.stream === 'open'",
        timeout=20_000,
    )
    return page


def save_artifact(name: str, data: dict[str, object]) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def test_dashboard_never_injects_html() -> None:
    """All API text reaches the page through textContent / setAttribute (no HTML parsing)."""
    src = (DASHBOARD / "app.js").read_text()
    code = re.sub(r"//[^\n]*", "", src)  # comments may name what the code avoids
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in code, sink


async def test_link_down_recolours_within_2s(tmp_path: Path) -> None:
    require_browser()
    fabric = generate_rail_optimized(hosts=256, rails=8)
    host, rail = "gpu037", 3
    hca = next(h for h in fabric.host(host).hcas if h.rail == rail)
    link = f"link-{host}-{hca.hca}-{hca.port}"
    broker = MemoryBroker()
    fleet = SimulatedFleet(
        fabric,
        bus=BusSettings(),
        workdir=tmp_path,
        bus_factory=broker.bus_factory,
        api=ApiSettings(port=0),
    )
    async with fleet, chromium() as browser:
        await fleet.wait_all_acked(timeout=60)
        url = await api_url(fleet.service)
        page = await open_dashboard(browser, url)
        assert await page.evaluate("document.body.dataset.mode") == "detail"
        assert await page.evaluate("document.querySelectorAll('line.link').length") == 256 * 8
        await page.wait_for_function(
            f"document.getElementById('{link}').dataset.shown === 'up'", timeout=5000
        )
        assert await page.eval_on_selector(f"#{link}", "e => getComputedStyle(e).stroke") == GREEN

        t0 = time.monotonic()
        fleet.link_down(host, rail)
        await page.wait_for_function(
            f"document.getElementById('{link}').dataset.shown === 'down'", timeout=2000
        )
        latency_ms = (time.monotonic() - t0) * 1000
        assert await page.eval_on_selector(f"#{link}", "e => getComputedStyle(e).stroke") == RED
        # the host end of the link, its leaf (worst link) and the legend follow
        port_cell = f"#port-{host}-{hca.hca}-{hca.port}"
        assert await page.eval_on_selector(port_cell, "e => getComputedStyle(e).fill") == RED
        leaf = next(ln.b for ln in fabric.links if ln.a == f"{host}:{hca.hca}/{hca.port}")
        assert await page.get_attribute(f"#leaf-{leaf}", "data-shown") == "down"
        await page.wait_for_function(
            "document.getElementById('count-down').textContent === '1'", timeout=2000
        )
        # the link's other ports stay green
        others = await page.evaluate(
            f"[...document.querySelectorAll('line.link[data-host=\"{host}\"]')]"
            ".map(e => e.dataset.shown)"
        )
        assert sorted(others) == ["down"] + ["up"] * 7

        # the host view: its HCAs with the down one, rail map and plan
        await page.click(port_cell)
        await page.wait_for_selector(f"#host-hcas tr[data-hca='{hca.hca}'][data-shown='down']")
        await page.wait_for_selector("#host-plan")
        # ... and, once the host's new plan is applied, its rail map shows the moved GPU
        await page.wait_for_selector("#host-view tr.moved", timeout=10_000)
        # the timeline got the port event live
        await page.wait_for_selector(f"#timeline li[data-kind='port_event'][data-host='{host}']")
        assert page.errors == []

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard-256-link-down.png"
        await page.screenshot(path=str(shot), full_page=True)
        render_ms = int(await page.evaluate("document.body.dataset.rendered"))
        save_artifact(
            "dashboard-256-link-down.json",
            {
                "hosts": 256,
                "rails": 8,
                "link": link,
                "colour_change_ms": round(latency_ms, 1),
                "first_render_ms": render_ms,
                "screenshot": shot.name,
            },
        )
        print(f"\ndashboard: {link} red after {latency_ms:.0f} ms; first render {render_ms} ms")
        assert latency_ms < 2000


def port_state(fabric: Fabric, host: str, rail: int, status: PortStatus, seq: int) -> PortState:
    """The port state an agent publishes for ``host``'s ``rail`` port."""
    hca = next(h for h in fabric.host(host).hcas if h.rail == rail)
    up = status == PortStatus.UP
    return PortState(
        host=host,
        hca=hca.hca,
        port=hca.port,
        rail=rail,
        link_layer=hca.link_layer,
        netdev=hca.netdev,
        state=PortStateName.ACTIVE if up else PortStateName.DOWN,
        rate_gbps=400.0,
        status=status,
        usable=up,
        observed_at=time.time(),
        seq=seq,
    )


async def test_aggregate_cells_and_drill_down(tmp_path: Path) -> None:
    """Above 256 hosts: one cell per leaf; a down port turns its cell red; drill down. With a
    ledger: the report numbers and the timeline come from it."""
    require_browser()
    fabric = generate_rail_optimized(hosts=320, rails=8)
    broker = MemoryBroker()
    settings = ServiceSettings(
        bus=BusSettings(),
        startup_settle_s=0.1,
        api=ApiSettings(port=0),
        ledger=LedgerSettings(path=tmp_path / "ledger.sqlite3"),
        log_format="console",
    )
    service = TopologyService(settings, fabric=fabric, bus_factory=broker.bus_factory)
    # plays the agents' side: publishes their retained port states
    agents = broker.bus_factory(**BusSettings().connection(), client_id="test-agents")
    tasks = [asyncio.create_task(service.run()), asyncio.create_task(agents.run())]
    try:
        await agents.wait_connected(5)
        for inv in fabric.hosts:
            for h in inv.hcas:
                st = port_state(fabric, inv.host, h.rail, PortStatus.UP, seq=1)
                await agents.publish(
                    topics.port_state(inv.host, h.hca, h.port), encode(st), retain=True
                )
        url = await api_url(service)
        async with chromium() as browser:
            page = await open_dashboard(browser, url)
            assert await page.evaluate("document.body.dataset.mode") == "aggregate"
            assert await page.evaluate("document.querySelectorAll('rect.cell').length") == 10 * 8
            assert await page.evaluate("document.querySelectorAll('line.link').length") == 0
            host, rail = "gpu070", 5  # SU 2
            cell = f"#cell-su2-r{rail}"
            await page.wait_for_function(
                f"document.querySelector('{cell}').dataset.up === '32'", timeout=5000
            )
            assert await page.get_attribute(cell, "data-shown") == "up"

            st = port_state(fabric, host, rail, PortStatus.DOWN, seq=2)
            await agents.publish(topics.port_state(host, st.hca, st.port), encode(st), retain=True)
            ev = PortEvent(
                host=host,
                hca=st.hca,
                port=st.port,
                rail=rail,
                previous=PortStatus.UP,
                current=PortStatus.DOWN,
                reason="<b>phys_polling</b>",  # shown as text, never as markup
                at=time.time(),
            )
            await agents.publish(topics.events(host), encode(ev))
            await page.wait_for_function(
                f"document.querySelector('{cell}').dataset.shown === 'down'", timeout=3000
            )
            assert await page.get_attribute(cell, "data-down") == "1"
            assert await page.eval_on_selector(cell, "e => getComputedStyle(e).fill") == RED

            await page.click(cell)
            link = f"#link-{host}-{st.hca}-{st.port}"
            await page.wait_for_selector(f"#drill-svg {link}[data-shown='down']")
            drawn = await page.evaluate("document.querySelectorAll('#drill-svg line.link').length")
            assert drawn == 32 * 8
            # the ledger's report and the port event in the timeline (live, then from the ledger)
            await page.wait_for_selector("#report-numbers")
            event = f"#timeline li[data-kind='port_event'][data-host='{host}']"
            await page.wait_for_selector(f"{event}.live")
            await page.reload()
            await page.wait_for_selector(f"{event}:not(.live)")
            text = await page.inner_text(f"{event} .d")
            assert text == "up → down (<b>phys_polling</b>)"
            await page.click(cell)
            await page.wait_for_selector(f"#drill-svg {link}[data-shown='down']")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "dashboard-320-aggregate.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert page.errors == []
    finally:
        service.stop()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


#: style.css --probe (a port drained by a probe verdict)
MAGENTA = "rgb(194, 24, 91)"


async def test_a_probe_drained_port_is_drawn_apart_and_back(tmp_path: Path) -> None:
    """8 hosts, probes on: a port that loses every probe is drained by a probe verdict; its
    link turns dashed magenta (its own state stays up) live, and again after a reload (from
    api/v1/ports); the legend counts it, the host view says so; once the verdict clears the
    link is plain green again."""
    require_browser()
    from tests.topology.test_probe_service import (
        FABRIC,
        PROBES,
        VICTIM,
        _publish_until,
        _running,
        _targets,
    )

    settings = ServiceSettings(
        startup_settle_s=0, api=ApiSettings(enabled=True, port=0), probes=PROBES
    )
    hca = next(h for h in FABRIC.host(VICTIM.host).hcas if h.rail == VICTIM.rail)
    link = f"link-{VICTIM.host}-{hca.hca}-{hca.port}"
    port_cell = f"port-{VICTIM.host}-{hca.hca}-{hca.port}"
    async with _running(settings) as (service, agents), chromium() as browser:
        for inv in FABRIC.hosts:
            for h in inv.hcas:
                st = port_state(FABRIC, inv.host, h.rail, PortStatus.UP, seq=1)
                await agents.publish(topics.port_state(inv.host, h.hca, h.port), encode(st))
        await until(lambda: len(_targets(agents)) == len(FABRIC.hosts), "probe targets")
        targets = _targets(agents)
        page = await open_dashboard(browser, await api_url(service))
        await page.wait_for_function(
            f"document.getElementById('{link}').dataset.shown === 'up'", timeout=5000
        )
        assert await page.get_attribute(f"#{link}", "data-drained") is None
        assert await page.inner_text("#count-probe-drained") == "0"

        await _publish_until(
            agents,
            targets,
            lambda a, b: VICTIM in (a, b),
            lambda: service.state.probe_suspect,
            "the probe verdict",
        )
        drained = f"document.getElementById('{link}').dataset.drained === 'probe'"
        await page.wait_for_function(drained, timeout=2000)
        assert await page.get_attribute(f"#{link}", "data-shown") == "up"
        style = "e => [getComputedStyle(e).stroke, getComputedStyle(e).strokeDasharray]"
        assert await page.eval_on_selector(f"#{link}", style) == [MAGENTA, "3px, 2px"]
        assert await page.eval_on_selector(f"#{port_cell}", "e => getComputedStyle(e).fill") == (
            MAGENTA
        )
        await page.wait_for_function(
            "document.getElementById('count-probe-drained').textContent === '1'", timeout=2000
        )
        await page.click(f"#{port_cell}")
        badge = f"#host-hcas tr[data-hca='{hca.hca}'][data-drained='probe'] .badge[data-drained]"
        assert await (await page.wait_for_selector(badge)).inner_text() == "drained by probes"
        await page.wait_for_selector("#timeline li[data-kind='health'][data-host='gpu003']")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "dashboard-probe-drained.png"), full_page=True)

        await page.reload()  # from api/v1/ports now
        await page.wait_for_function(
            "document.body.dataset.rendered && document.body.dataset.stream === 'open'",
            timeout=20_000,
        )
        await page.wait_for_function(drained, timeout=2000)
        assert await page.inner_text("#count-probe-drained") == "1"

        await _publish_until(
            agents,
            targets,
            lambda a, b: False,
            lambda: not service.state.probe_suspect,
            "the verdict to clear",
        )
        await page.wait_for_function(
            f"document.getElementById('{link}').dataset.drained === undefined", timeout=2000
        )
        assert await page.eval_on_selector(f"#{link}", style) == [GREEN, "none"]
        await page.wait_for_function(
            "document.getElementById('count-probe-drained').textContent === '0'", timeout=2000
        )
        assert page.errors == []


async def test_a_host_not_acking_is_shown_until_it_acks(tmp_path: Path) -> None:
    """Issue 21: an online host that does not ack its current epoch is named in the header and
    its host view (from the API's ``not_acking``) while the service re-sends its plan, and
    cleared once its ack arrives. The service on the in-memory bus; the test plays the
    agent's side (its status online, later its ack)."""
    from linkguard.config import ConvergenceSettings
    from linkguard.models import Ack, AckResult, HostStatus

    require_browser()
    fabric = generate_rail_optimized(hosts=4, rails=2)
    host = fabric.host_names[1]
    broker = MemoryBroker()
    settings = ServiceSettings(
        bus=BusSettings(),
        startup_settle_s=0,
        api=ApiSettings(port=0),
        convergence=ConvergenceSettings(resend_after_s=0.5, resend_max_s=1),
    )
    service = TopologyService(settings, fabric=fabric, bus_factory=broker.bus_factory)
    agent = broker.bus_factory(**BusSettings().connection(), client_id="test-agent")
    tasks = [asyncio.create_task(service.run()), asyncio.create_task(agent.run())]
    try:
        await agent.wait_connected(5)
        online = HostStatus(host=host, online=True, at=time.time())
        await agent.publish(topics.status(host), encode(online), retain=True)
        url = await api_url(service)
        async with chromium() as browser:
            page = await open_dashboard(browser, url)
            await page.wait_for_function(
                f"document.getElementById('not-acking').dataset.hosts === '{host}'",
                timeout=5000,
            )
            assert await page.is_visible("#not-acking")
            epoch = service.state.acked_epoch(host)
            assert f"{host} (epoch {epoch}," in await page.inner_text("#not-acking")
            assert await page.evaluate(
                f"document.querySelector('g.host[data-host=\"{host}\"]')"
                ".classList.contains('not-acking')"
            )
            hca = fabric.host(host).hcas[0]
            await page.click(f"#port-{host}-{hca.hca}-{hca.port}")
            await page.wait_for_selector(f"#host-not-acking[data-epoch='{epoch}']")
            assert service.convergence.resends >= 1

            ack = Ack(host=host, epoch=epoch, result=AckResult.APPLIED, applied_at=time.time())
            await agent.publish(topics.ack(host), encode(ack), retain=True)
            await page.wait_for_function(
                "document.getElementById('not-acking').dataset.count === '0'", timeout=5000
            )
            assert not await page.is_visible("#not-acking")
            await page.wait_for_selector("#host-not-acking", state="detached", timeout=5000)
            assert page.errors == []
    finally:
        service.stop()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
