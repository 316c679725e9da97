"""The topology service's HTTP API over real HTTP: a simulated fleet (real agents and service
on a private Mosquitto) whose service serves the API with uvicorn on a free loopback port,
queried with httpx. Every endpoint: shapes and values, bad parameters (4xx, never a 500), the
token of the one state-changing call, the change stream (live, resumed, left) and how the
server starts and stops with the service."""

import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from linkguard.agent.monitor import DampingPolicy
from linkguard.config import ApiSettings, BusSettings, LedgerSettings, ServiceSettings
from linkguard.membus import MemoryBroker
from linkguard.models import PortEvent, PortStatus
from linkguard.simulations.fleet import SimulatedFleet
from linkguard.topology import api as api_module
from linkguard.topology import apistream
from linkguard.topology.api import DASHBOARD, ApiServer
from linkguard.topology.apishapes import (
    EventsPage,
    FabricDoc,
    HostDoc,
    PlansPage,
    PortsPage,
    SummaryDoc,
)
from linkguard.topology.fabric import dump_fabric, generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.conftest import start_mosquitto
from tests.support import until

pytestmark = [pytest.mark.real, pytest.mark.asyncio(loop_scope="module")]

TOKEN = "api-test-token-0123456789abcdef"
#: 8 hosts x 4 rails in 2 SUs of 4 hosts
FABRIC = generate_rail_optimized(hosts=8, rails=4, hosts_per_su=4)
VICTIM, RAIL = "gpu005", 1  # SU 1


class Live:
    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.service = fleet.service
        assert self.service.api_port is not None
        self.url = f"http://127.0.0.1:{self.service.api_port}"

    def client(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10, **kw)

    async def get(self, path: str, **kw: Any) -> httpx.Response:
        async with self.client() as c:
            return await c.get(path, **kw)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def live(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Live]:
    tmp = tmp_path_factory.mktemp("api")
    broker = start_mosquitto(tmp / "broker")
    try:
        async with SimulatedFleet(
            FABRIC,
            bus=BusSettings(port=broker.port, reconnect_min_s=0.05),
            workdir=tmp / "fleet",
            damping=DampingPolicy(hold_down_initial_s=0.2, hold_down_max_s=0.2),
            debounce_ms=20,
            api=ApiSettings(port=0, token=TOKEN),
        ) as fleet:
            await fleet.wait_all_acked()
            svc = fleet.service
            await until(lambda: len(svc.state.ports) == 32, "every port's state", 20)
            await until(lambda: svc.audit_json is not None, "the first audit", 20)
            yield Live(fleet)
            assert svc.api is not None and svc.api.app.state.internal_errors == 0
        assert fleet.service.api is None and fleet.service.changes.listeners == 0
    finally:
        broker.handle.stop()


async def _link(live: Live, *, down: bool) -> None:
    """Take VICTIM's rail RAIL down (or bring it back) and wait until the service re-planned
    and every host applied it."""
    svc = live.service
    epoch = svc.state.epoch
    (live.fleet.link_down if down else live.fleet.link_up)(VICTIM, RAIL)
    want = "down" if down else "up"
    key = (VICTIM, f"mlx5_{RAIL}/1")
    await until(lambda: svc.state.ports[key].status.value == want, f"port {want}", 10)
    await until(lambda: svc.state.epoch > epoch, "a new epoch", 10)
    await live.fleet.wait_all_acked(epoch + 1)


# -- the fabric and its states ---------------------------------------------------------------


async def test_fabric(live: Live) -> None:
    r = await live.get("/api/v1/fabric")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    FabricDoc.model_validate(doc)
    assert doc["name"] == FABRIC.name and doc["hosts_count"] == 8
    assert doc["rails"] == [0, 1, 2, 3] and doc["sus"] == [0, 1]
    assert {(x["name"], x["rail"], x["su"]) for x in doc["leaves"]} == {
        (f"su{s}-leaf{r}", r, s) for s in (0, 1) for r in range(4)
    }
    assert doc["spines"] and {s["su"] for s in doc["spines"]} <= {0, 1, None}
    victim = next(h for h in doc["hosts"] if h["host"] == VICTIM)
    assert victim["su"] == 1
    assert victim["hcas"][RAIL] == {
        "hca": f"mlx5_{RAIL}",
        "port": 1,
        "rail": RAIL,
        "leaf": f"su1-leaf{RAIL}",
        "netdev": f"rail{RAIL}",
    }


async def test_ports_hosts_summary_and_plans_follow_a_link_down(live: Live) -> None:
    before = (await live.get(f"/api/v1/plans/{VICTIM}")).json()
    summary = (await live.get("/api/v1/summary")).json()
    assert sum(c["counts"]["up"] for c in summary["cells"]) == 32
    await _link(live, down=True)
    try:
        # /ports, filtered to the one port
        r = await live.get("/api/v1/ports", params={"host": VICTIM, "rail": RAIL})
        page = r.json()
        PortsPage.model_validate(page)
        assert page["total"] == 1
        (port,) = page["ports"]
        assert (port["host"], port["hca"], port["rail"]) == (VICTIM, f"mlx5_{RAIL}", RAIL)
        assert (port["status"], port["usable"], port["shown"]) == ("down", False, "down")
        assert (port["su"], port["leaf"]) == (1, f"su1-leaf{RAIL}")
        down = (await live.get("/api/v1/ports", params={"shown": "down"})).json()
        assert [(p["host"], p["rail"]) for p in down["ports"]] == [(VICTIM, RAIL)]
        # /hosts/{host}
        host = (await live.get(f"/api/v1/hosts/{VICTIM}")).json()
        HostDoc.model_validate(host)
        assert host["host"] == VICTIM and host["su"] == 1 and host["online"] is True
        assert [h["shown"] for h in host["hcas"]] == ["up", "down", "up", "up"]
        assert host["hcas"][RAIL]["state"]["status"] == "down"
        svc = live.service
        assert host["plan_epoch"] == svc.state.acked_epoch(VICTIM) == host["plan"]["epoch"]
        assert host["acked_epoch"] == host["plan_epoch"] and host["ack"]["result"] == "applied"
        moved = [a for a in host["rail_map"] if a["home_rail"] == RAIL]
        assert moved and all(a["rail"] != RAIL for a in moved)
        assert len(host["rail_map"]) == 4
        # /summary: one port down, in its cell
        summary = (await live.get("/api/v1/summary")).json()
        SummaryDoc.model_validate(summary)
        assert summary["hosts"] == 8 and summary["online"] == 8
        assert summary["epoch"] == svc.state.epoch
        downs = [(c["su"], c["rail"], c["leaf"]) for c in summary["cells"] if c["counts"]["down"]]
        assert downs == [(1, RAIL, f"su1-leaf{RAIL}")]
        assert sum(c["counts"]["down"] for c in summary["cells"]) == 1
        assert sum(c["counts"]["up"] for c in summary["cells"]) == 31
        assert all(c["hosts"] == 4 for c in summary["cells"]) and len(summary["cells"]) == 8
        # /plans/{host}: a new plan whose epoch grew
        after = (await live.get(f"/api/v1/plans/{VICTIM}")).json()
        assert after["epoch"] > before["epoch"] and after["host"] == VICTIM
        assert after["epoch"] == host["plan_epoch"]
    finally:
        await _link(live, down=False)
    port = (await live.get("/api/v1/ports", params={"host": VICTIM, "rail": RAIL})).json()
    assert port["ports"][0]["shown"] == "up"


async def test_ports_paging_and_filters(live: Live) -> None:
    everything = (await live.get("/api/v1/ports", params={"limit": 1000})).json()
    assert everything["total"] == 32 and len(everything["ports"]) == 32
    keys = [(p["host"], p["hca"]) for p in everything["ports"]]
    assert keys == [(h.host, c.hca) for h in FABRIC.hosts for c in h.hcas]  # fabric order
    page = (await live.get("/api/v1/ports", params={"limit": 5, "offset": 30})).json()
    assert page["total"] == 32 and [(p["host"], p["hca"]) for p in page["ports"]] == keys[30:]
    su1 = (await live.get("/api/v1/ports", params={"su": 1, "rail": 2})).json()
    assert [p["host"] for p in su1["ports"]] == ["gpu004", "gpu005", "gpu006", "gpu007"]
    assert (await live.get("/api/v1/ports", params={"shown": "held_down"})).json() == {
        "total": 0,
        "ports": [],
    }


async def test_plans_list(live: Live) -> None:
    page = (await live.get("/api/v1/plans")).json()
    PlansPage.model_validate(page)
    svc = live.service
    assert page["epoch"] == svc.state.epoch and page["total"] == 8
    assert [p["host"] for p in page["plans"]] == FABRIC.host_names
    for row in page["plans"]:
        assert row["epoch"] == svc.state.acked_epoch(row["host"])
        assert row["acked_epoch"] == row["epoch"]  # all applied
        assert row["compact"] == (svc.state.published[row["host"]].shared is not None)
        assert row["routes"] == len(svc.state.plans[row["host"]].routes)
    two = (await live.get("/api/v1/plans", params={"limit": 2, "offset": 7})).json()
    assert two["total"] == 8 and [p["host"] for p in two["plans"]] == ["gpu007"]


async def test_events_from_the_change_feed(live: Live) -> None:
    if getattr(live.service, "ledger", None) is not None:
        pytest.skip("the service has a ledger: tests/test_ledger covers its events")
    t0 = time.time()
    await _link(live, down=True)
    await _link(live, down=False)
    r = await live.get("/api/v1/events", params={"host": VICTIM, "kind": "port_event", "since": t0})
    page = r.json()
    EventsPage.model_validate(page)
    transitions = [(e["data"]["previous"], e["data"]["current"]) for e in page["events"]]
    # newest first: down, held down, then up
    assert transitions[-1] == ("up", "down") and transitions[0][1] == "up"
    assert page["total"] == len(page["events"]) >= 2
    first = page["events"][-1]
    assert (first["host"], first["hca"], first["port"], first["rail"]) == (
        VICTIM,
        f"mlx5_{RAIL}",
        1,
        RAIL,
    )
    assert first["at"] >= t0 and first["seq"] > 0
    seqs = [e["seq"] for e in page["events"]]
    assert seqs == sorted(seqs, reverse=True)
    # rail filter, ISO 8601 times, until, paging
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 - 1)) + "Z"
    by_rail = (await live.get("/api/v1/events", params={"rail": RAIL, "since": iso})).json()
    assert {e["rail"] for e in by_rail["events"]} == {RAIL} and by_rail["total"] >= 2
    old = (await live.get("/api/v1/events", params={"until": t0, "kind": "port_event"})).json()
    assert all(e["at"] < t0 for e in old["events"])
    one = (
        await live.get(
            "/api/v1/events",
            params={"host": VICTIM, "kind": "port_event", "since": t0, "limit": 1, "offset": 1},
        )
    ).json()
    assert one["total"] == page["total"] and one["events"] == page["events"][1:2]
    # a host the fabric does not list: 404, as for /ports and /hosts
    r = await live.get("/api/v1/events", params={"host": "nohost"})
    assert r.status_code == 404 and "nohost" in r.json()["detail"]


async def test_audit_health_and_report(live: Live) -> None:
    svc = live.service
    audit = await live.get("/api/v1/audit")
    assert audit.status_code == 200 and audit.json() == json.loads(svc.audit_json or "{}")
    assert "findings" in audit.json()
    health = (await live.get("/api/v1/health")).json()
    assert health == json.loads(json.dumps(svc.health_doc))
    assert health["leaves_down"] == [] and health["bisection_gbps"] > 0
    report = await live.get("/api/v1/report", params={"price_per_gpu_hour": 3})
    if getattr(svc, "ledger", None) is None:
        assert report.status_code == 503
        assert report.json() == {"detail": "no ledger configured"}
    else:
        assert report.status_code == 200 and isinstance(report.json(), dict)


# -- the one state-changing call ---------------------------------------------------------------


async def test_put_faults_needs_the_token(live: Live) -> None:
    svc = live.service
    body = {"switches_down": ["su1-leaf2"], "cables_down": [], "reason": "api test", "at": 1.0}
    async with live.client() as c:
        r = await c.put("/api/v1/faults", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "missing bearer token" in r.json()["detail"]
        r = await c.put("/api/v1/faults", json=body, headers={"Authorization": "Bearer nope"})
        assert (r.status_code, r.json()) == (401, {"detail": "wrong token"})
        r = await c.put("/api/v1/faults", json=body, headers={"Authorization": f"Basic {TOKEN}"})
        assert r.status_code == 401
        # the token before the body: a malformed body tells a stranger nothing
        r = await c.put("/api/v1/faults", content=b"{oops", headers={"Authorization": "Bearer x"})
        assert (r.status_code, r.json()) == (401, {"detail": "wrong token"})
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for bad in (
            {"switches_down": "su1-leaf2", "at": 1.0},  # not a list
            {"switches_down": []},  # no at
            {"switches_down": [], "at": -1},
            {"switches_down": [], "at": 1.0, "extra": 1},
        ):
            r = await c.put("/api/v1/faults", json=bad, headers=auth)
            assert r.status_code == 422, bad
        r = await c.put("/api/v1/faults", content=b"{not json", headers=auth)
        assert r.status_code == 422
        # a switch the fabric does not have: 422, nothing published
        r = await c.put(
            "/api/v1/faults", json={**body, "switches_down": ["su9-leaf0"]}, headers=auth
        )
        assert r.status_code == 422 and "su9-leaf0" in r.json()["detail"]
        assert svc.faults is None
        # the real thing: published retained, taken by the service, in the health document
        r = await c.put("/api/v1/faults", json=body, headers=auth)
        assert (r.status_code, r.json()) == (202, {"published": True})
        await until(lambda: svc.faults is not None, "the service to take the faults")
        assert svc.faults is not None and svc.faults.switches_down == ["su1-leaf2"]
        health = (await c.get("/api/v1/health")).json()
        assert health["leaves_down"] == ["su1-leaf2"] and health["faults"]["reason"] == "api test"
        # and back to nominal
        r = await c.put("/api/v1/faults", json={"at": 2.0}, headers=auth)
        assert r.status_code == 202
        await until(lambda: svc.faults is not None and not svc.faults.switches_down, "nominal")
        await until(lambda: (svc.health_doc or {}).get("leaves_down") == [], "nominal health")


# -- bad input: clear 4xx, never a 500 ---------------------------------------------------------


BAD = [
    ("/api/v1/ports?rail=99", 422, "rail"),
    ("/api/v1/ports?rail=x", 422, "rail"),
    ("/api/v1/ports?rail=-1", 422, "rail"),
    ("/api/v1/ports?su=-1", 422, "su"),
    ("/api/v1/ports?limit=0", 422, "limit"),
    ("/api/v1/ports?limit=5000", 422, "limit"),
    ("/api/v1/ports?limit=-1", 422, "limit"),
    ("/api/v1/ports?offset=-1", 422, "offset"),
    ("/api/v1/ports?offset=99999999999999999999999", 422, "offset"),
    ("/api/v1/ports?shown=purple", 422, "shown"),
    ("/api/v1/ports?host=nope", 404, None),
    ("/api/v1/hosts/nope", 404, None),
    ("/api/v1/plans/nope", 404, None),
    ("/api/v1/plans?limit=0", 422, "limit"),
    ("/api/v1/plans?offset=-1", 422, "offset"),
    ("/api/v1/events?since=garbage", 422, "since"),
    ("/api/v1/events?until=2025-13-45", 422, "until"),
    ("/api/v1/events?since=nan", 422, "since"),
    ("/api/v1/events?since=inf", 422, "since"),
    ("/api/v1/events?since=-5", 422, "since"),
    ("/api/v1/events?rail=99", 422, "rail"),
    ("/api/v1/events?kind=DROP%20TABLE", 422, "kind"),
    ("/api/v1/events?limit=1001", 422, "limit"),
    ("/api/v1/events?since=2000000000&until=1000000000", 422, None),
    ("/api/v1/report?price_per_gpu_hour=-1", 422, "price_per_gpu_hour"),
    ("/api/v1/report?price_per_gpu_hour=nan", 422, "price_per_gpu_hour"),
    ("/api/v1/report?since=yesterday", 422, "since"),
    ("/api/v1/report?since=1e20", 422, "since"),
    ("/api/v1/report?until=1e15", 422, "until"),
    ("/api/v1/report?until=20231120", 422, "until"),
    ("/api/v1/nothing", 404, None),
]


@pytest.mark.parametrize(("path", "status", "param"), BAD)
async def test_bad_parameters_get_a_clear_4xx(
    live: Live, path: str, status: int, param: str | None
) -> None:
    r = await live.get(path)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    if param is not None:  # FastAPI's detail names the parameter
        assert [d["loc"] for d in detail] == [["query", param]], detail
        assert all(d["msg"] for d in detail)
    else:
        assert isinstance(detail, str) and detail
    if status == 404 and "nope" in path:
        assert "unknown host 'nope'" in detail


async def test_odd_values_in_every_parameter_never_reach_the_error_handler(live: Live) -> None:
    odd = ["", " ", "1e999", "0x10", "\uff11", "9" * 40, "%00", "' OR 1=1 --", "[]", "true", "-0"]
    params = {
        "/api/v1/ports": ["host", "rail", "su", "shown", "limit", "offset"],
        "/api/v1/plans": ["limit", "offset"],
        "/api/v1/events": ["host", "rail", "kind", "since", "until", "limit", "offset"],
        "/api/v1/report": ["price_per_gpu_hour", "since", "until"],
    }
    errors0 = live.service.api.app.state.internal_errors  # type: ignore[union-attr]
    seen: set[int] = set()
    async with live.client() as c:
        for path, names in params.items():
            for name in names:
                for value in odd:
                    r = await c.get(path, params={name: value})
                    seen.add(r.status_code)
                    assert r.status_code in (200, 404, 422, 503), (path, name, value, r.text)
        for host in ["%2e%2e", "a" * 300, "gpu000%00", "é"]:
            for path in ("/api/v1/hosts/", "/api/v1/plans/"):
                r = await c.get(path + host)
                assert r.status_code == 404, (path, host)
    assert 422 in seen and 200 in seen
    assert live.service.api.app.state.internal_errors == errors0  # type: ignore[union-attr]


# -- the stream ----------------------------------------------------------------------------------


class Sse:
    """Server-sent events read from an httpx streaming response."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, timeout: float = 10) -> dict[str, Any]:
        """The next event (its fields) or comment block (``comments``); EOFError at the end."""
        block: dict[str, Any] = {}
        async with asyncio.timeout(timeout):
            async for line in self._lines:
                if not line:
                    if block:
                        return block
                    continue
                if line.startswith(":"):
                    block.setdefault("comments", []).append(line[1:].strip())
                    continue
                name, _, value = line.partition(":")
                block[name] = value.removeprefix(" ")
        raise EOFError("the stream ended")

    async def until(self, pred: Any, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            ev = await self.next(max(0.01, deadline - time.monotonic()))
            if "event" in ev and pred(ev):
                return ev


def _port_down(ev: dict[str, Any]) -> bool:
    if ev["event"] != "port":
        return False
    d = json.loads(ev["data"])["data"]
    return (d["host"], d["rail"], d["status"]) == (VICTIM, RAIL, "down")


async def test_stream_delivers_a_link_down_resumes_and_lets_go(live: Live) -> None:
    feed = live.service.changes
    assert feed.listeners == 0
    async with live.client() as c:
        async with c.stream("GET", "/api/v1/stream") as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            sse = Sse(r)
            hello = await sse.next()
            assert hello["retry"] == "1000" and hello["comments"][0].startswith("linkguard")
            assert feed.listeners == 1
            await _link(live, down=True)
            ev = await sse.until(_port_down)
            body = json.loads(ev["data"])
            assert set(body) == {"seq", "kind", "at", "data"} and ev["id"] == str(body["seq"])
            assert body["data"]["usable"] is False and body["data"]["hca"] == f"mlx5_{RAIL}"
            down_seq = body["seq"]
            plans = await sse.until(lambda e: e["event"] == "plans")
            assert VICTIM in json.loads(plans["data"])["data"]["hosts"]
        await until(lambda: feed.listeners == 0, "the stream's queue to go")
        try:
            # resume after the port change: the backlog replays exactly what followed it
            missed = [ch for ch in feed.since(down_seq) or [] if ch.seq <= feed.seq]
            assert missed
            headers = {"Last-Event-ID": str(down_seq)}
            async with c.stream("GET", "/api/v1/stream", headers=headers) as r:
                sse = Sse(r)
                await sse.next()  # the preamble
                got = [await sse.next() for _ in missed]
                assert [int(e["id"]) for e in got] == [ch.seq for ch in missed]
                assert [e["event"] for e in got] == [ch.kind for ch in missed]
            # an id this run never gave (or none at all that parses): resync first
            for stale in (str(feed.seq + 1000), "not-a-number", b"\xb2", "9" * 40):
                headers = {"Last-Event-ID": stale}
                async with c.stream("GET", "/api/v1/stream", headers=headers) as r:
                    sse = Sse(r)
                    await sse.next()
                    first = await sse.next()
                    assert first["event"] == "resync" and int(first["id"]) <= feed.seq
                    assert json.loads(first["data"])["kind"] == "resync"
        finally:
            await _link(live, down=False)
    await until(lambda: feed.listeners == 0, "every stream's queue to go")


async def test_stream_keepalive(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apistream, "KEEPALIVE_S", 0.05)
    async with live.client() as c, c.stream("GET", "/api/v1/stream") as r:
        sse = Sse(r)
        await sse.next()
        while True:  # changes may come first; a keepalive comes when it is quiet
            block = await sse.next(5)
            if block.get("comments") == ["keepalive"]:
                break
    await until(lambda: live.service.changes.listeners == 0, "the stream's queue to go")


# -- the rest: docs, metrics, dashboard ----------------------------------------------------------


async def test_openapi_and_docs(live: Live) -> None:
    spec = (await live.get("/openapi.json")).json()
    assert spec["info"]["title"] == "linkguard topology service"
    paths = set(spec["paths"])
    for p in (
        "/api/v1/fabric",
        "/api/v1/summary",
        "/api/v1/ports",
        "/api/v1/hosts/{host}",
        "/api/v1/plans",
        "/api/v1/plans/{host}",
        "/api/v1/events",
        "/api/v1/audit",
        "/api/v1/health",
        "/api/v1/report",
        "/api/v1/stream",
        "/api/v1/faults",
        "/metrics",
    ):
        assert p in paths, p
    assert "put" in spec["paths"]["/api/v1/faults"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    docs = await live.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


async def test_every_reference_in_the_openapi_document_resolves(live: Live) -> None:
    """ReDoc (and client generators) refuse a document with a ``$ref`` it cannot resolve: the
    faults body's schema, put in by hand, once said ``#/$defs/CableRef`` (no such root key)."""
    spec = (await live.get("/openapi.json")).json()
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(spec)
    assert len(refs) > 10
    for ref in refs:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in spec["components"]["schemas"], ref
    body = spec["paths"]["/api/v1/faults"]["put"]["requestBody"]["content"]["application/json"]
    cable = body["schema"]["properties"]["cables_down"]["items"]
    assert set(cable["properties"]) >= {"a", "b"}, cable  # CableRef, written in place


async def test_docs_pages_load_nothing_from_another_host(live: Live) -> None:
    """/docs (Swagger UI) and /redoc work on an air-gapped management network: their pages name
    no other host (no CDN, no web font), and every script, stylesheet and icon they reference is
    served by the service itself."""
    wanted = {
        "/docs": {"swagger-ui-bundle.js": "javascript", "swagger-ui.css": "text/css"},
        "/redoc": {"redoc.standalone.js": "javascript"},
    }
    for page, assets in wanted.items():
        r = await live.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
        assert re.findall(r"\w+://|//[\w.-]+\.\w", r.text) == [], page  # no absolute URL at all
        refs = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert {ref.rsplit("/", 1)[1] for ref in refs} >= set(assets), (page, refs)
        for ref in refs:
            assert ref.startswith(f"{api_module.DOCS_ASSETS}/"), (page, ref)
            got = await live.get(ref)
            assert got.status_code == 200 and len(got.content) > 1000, ref
            kind = assets.get(ref.rsplit("/", 1)[1], "image/")
            assert kind in got.headers["content-type"], (ref, got.headers["content-type"])
    redirect = await live.get("/docs/oauth2-redirect")  # Swagger UI's OAuth2 helper page
    assert redirect.status_code == 200 and "://" not in redirect.text


async def test_metrics_without_redirect(live: Live) -> None:
    if live.service.api.app.state.metrics is None:  # type: ignore[union-attr]
        pytest.skip("linkguard.metrics is not in this build (the metrics helper adds it)")
    async with live.client(follow_redirects=False) as c:
        for path in ("/metrics", "/metrics/"):
            r = await c.get(path)
            assert r.status_code == 200, path
            assert r.headers["content-type"].startswith("text/plain")
            assert "linkguard_" in r.text


async def test_dashboard_files(live: Live) -> None:
    r = await live.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.text == (DASHBOARD / "index.html").read_text()
    for f in sorted(DASHBOARD.iterdir()):
        if f.is_file():
            got = await live.get(f"/dashboard/{f.name}")
            assert got.status_code == 200 and got.content == f.read_bytes(), f.name
    assert (await live.get("/dashboard/absent.js")).status_code == 404
    assert (await live.get("/dashboard/%2e%2e/api.py")).status_code == 404


# -- serving: token unset, stop with open streams, port in use, the CLI's default --------------


async def test_server_without_token_and_stopping_with_an_open_stream(tmp_path: Path) -> None:
    """An ApiServer alone (the service not running): 403 without a configured token; a
    stop ends open streams at once and lets go of the port."""
    broker = MemoryBroker()
    settings = ServiceSettings(api=ApiSettings(port=0))
    service = TopologyService(settings, fabric=FABRIC, bus_factory=broker.bus_factory)
    server = ApiServer(service, settings.api)
    port = server.bind()
    task = asyncio.create_task(server.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            r = await c.put(
                "/api/v1/faults",
                json={"at": 1.0},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert r.status_code == 403
            assert r.json()["detail"].startswith("no token configured")
            assert (await c.get("/api/v1/health")).json() == {}  # before any health
            assert (await c.get("/api/v1/audit")).json() == {}
            plans = (await c.get("/api/v1/plans")).json()
            assert plans == {"epoch": service.state.epoch, "total": 0, "plans": []}
            host = (await c.get("/api/v1/hosts/gpu000")).json()
            assert host["plan"] is None and host["online"] is None and host["rail_map"] == []
            assert {h["shown"] for h in host["hcas"]} == {"unknown"}
            r = await c.get("/api/v1/plans/gpu000")
            assert (r.status_code, r.json()) == (404, {"detail": "host 'gpu000' has no plan yet"})
            async with c.stream("GET", "/api/v1/stream") as r:
                sse = Sse(r)
                await sse.next()
                assert service.changes.listeners == 1
                t0 = time.monotonic()
                stopping = asyncio.create_task(server.shutdown(task))
                with pytest.raises(EOFError):
                    await sse.next()
                await stopping
                assert time.monotonic() - t0 < api_module.GRACE_S  # ended, not cut
        assert task.done() and not task.cancelled() and task.exception() is None
        assert service.changes.listeners == 0
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
    finally:
        server.stop()
        await asyncio.wait([task], timeout=10)


async def test_a_stream_that_falls_behind_gets_resync_then_resumes(tmp_path: Path) -> None:
    """More changes at once than a stream's queue holds (1,024): the queued ones, one
    ``resync`` without an id, and a reconnect with the last id replays the lost ones."""
    settings = ServiceSettings(api=ApiSettings(port=0))
    service = TopologyService(settings, fabric=FABRIC, bus_factory=MemoryBroker().bus_factory)
    server = ApiServer(service, settings.api)
    port = server.bind()
    task = asyncio.create_task(server.serve())
    feed = service.changes
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            async with c.stream("GET", "/api/v1/stream") as r:
                sse = Sse(r)
                await sse.next()
                first = feed.seq + 1
                for i in range(1100):  # no await in between: the stream cannot keep up
                    feed.emit("health", {"i": i})
                got = [await sse.next() for _ in range(1024)]
            ids = [int(e["id"]) for e in got[:-1]]
            assert ids == list(range(first, first + 1023))
            resync = got[-1]
            assert resync["event"] == "resync" and "id" not in resync
            assert json.loads(resync["data"])["data"] == {"lost_from": first + 1023}
            headers = {"Last-Event-ID": str(ids[-1])}
            async with c.stream("GET", "/api/v1/stream", headers=headers) as r:
                sse = Sse(r)
                await sse.next()
                rest = [await sse.next() for _ in range(1100 - 1023)]
            assert [int(e["id"]) for e in rest] == list(range(first + 1023, first + 1100))
            assert json.loads(rest[-1]["data"])["data"] == {"i": 1099}
        await until(lambda: feed.listeners == 0, "the streams' queues to go")
        # /events without a ledger: what the feed's backlog (4,096 changes) still holds
        for i in range(4000):
            feed.emit("health", {"i": 1100 + i})
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            page = (await c.get("/api/v1/events", params={"limit": 2, "offset": 1})).json()
        assert page["total"] == 4096
        assert [e["seq"] for e in page["events"]] == [feed.seq - 1, feed.seq - 2]
    finally:
        await server.shutdown(task)


async def test_events_and_report_from_the_ledger(tmp_path: Path) -> None:
    """With a ledger (``ledger.path``) /events and /report answer from it."""
    settings = ServiceSettings(
        api=ApiSettings(port=0), ledger=LedgerSettings(path=tmp_path / "ledger.sqlite3")
    )
    service = TopologyService(settings, fabric=FABRIC, bus_factory=MemoryBroker().bus_factory)
    ledger = service.ledger
    assert ledger is not None
    server = ApiServer(service, settings.api)
    task = asyncio.create_task(server.serve())
    try:
        t0 = time.time()
        for i, (prev, cur) in enumerate(
            [("up", "down"), ("down", "held_down"), ("held_down", "up")]
        ):
            ev = PortEvent(
                host=VICTIM,
                hca=f"mlx5_{RAIL}",
                port=1,
                rail=RAIL,
                previous=PortStatus(prev),
                current=PortStatus(cur),
                at=t0 + i,
            )
            service.changes.emit("port_event", ev.model_dump(mode="json"), at=t0 + i)
        assert await asyncio.to_thread(ledger.flush)
        await until(lambda: server.port is not None, "the server's port")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
            page = (await c.get("/api/v1/events", params={"kind": "port_event"})).json()
            EventsPage.model_validate(page)
            assert page["total"] == 3
            assert [e["data"]["current"] for e in page["events"]] == ["up", "held_down", "down"]
            first = page["events"][-1]
            assert first["id"] is not None and first["seq"] is not None
            assert (first["host"], first["rail"], first["leaf"], first["su"]) == (
                VICTIM,
                RAIL,
                f"su1-leaf{RAIL}",
                1,
            )
            window = {"since": t0 + 1, "until": t0 + 2}
            assert (await c.get("/api/v1/events", params=window)).json()["total"] == 1
            bad = await c.get("/api/v1/events", params={"since": t0 + 2, "until": t0 + 1})
            assert bad.status_code == 422
            report = await c.get("/api/v1/report", params={"price_per_gpu_hour": 3.5})
            assert report.status_code == 200, report.text
            doc = report.json()
            assert doc == _finite_doc(doc) and doc["price_per_gpu_hour"] == 3.5
            direct = ledger.report(price_per_gpu_hour=3.5).to_dict()
            assert (
                doc["fabric"]
                == direct["fabric"]
                == {
                    "name": FABRIC.name,
                    "hosts": 8,
                    "rails": 4,
                    "gpus": 32,
                }
            )
            assert doc["port_downs"] == direct["port_downs"]
            assert doc["schema"] == direct["schema"] and doc["runs"] == 1
            old = await c.get("/api/v1/report", params={"since": 1.0, "until": 2.0})
            assert old.status_code == 404 and "no run" in old.json()["detail"]
            same = await c.get("/api/v1/report", params={"since": t0, "until": t0})
            assert same.status_code == 422
            # times past year 9999 or ambiguous: 422 naming the parameter, never a 500
            for params in ({"since": "1e20"}, {"until": 1e15}, {"since": "20231120"}):
                far = await c.get("/api/v1/report", params=params)
                assert far.status_code == 422, far.text
                assert [d["loc"] for d in far.json()["detail"]] == [["query", *params]]
            # the window is clamped to the run, which is still recording: it ends now
            wide = await c.get("/api/v1/report", params={"since": 0.0, "until": "2100-01-01"})
            window = wide.json()["window"]
            assert window["clamped"] and window["live"] and window["since"] > t0 - 60
            assert window["until"] == pytest.approx(time.time(), abs=5)
            assert window["requested"] == {"since": 0.0, "until": 4_102_444_800.0}
            # corrupted runs: 503 naming the row and field
            path = settings.ledger.path
            assert path is not None
            conn = sqlite3.connect(path)
            conn.execute("UPDATE runs SET gpus = 0")
            conn.commit()
            bad = await c.get("/api/v1/report")
            assert bad.status_code == 503 and "gpus is 0" in bad.json()["detail"], bad.text
            conn.execute("UPDATE runs SET gpus = 32")
            conn.commit()
            conn.close()
            # deleted under the service: 503, and no file appears at the path
            for f in tmp_path.glob("ledger.sqlite3*"):
                f.unlink()
            gone = await c.get("/api/v1/report")
            assert gone.status_code == 503 and "deleted or moved" in gone.json()["detail"]
            assert not path.exists()
        assert server.app.state.internal_errors == 0
    finally:
        await server.shutdown(task)
        ledger.close()


def _finite_doc(doc: Any) -> Any:
    return json.loads(json.dumps(doc, allow_nan=False))


def _fabric_file(tmp_path: Path) -> Path:
    f = tmp_path / "fabric.yaml"
    f.write_text(dump_fabric(generate_rail_optimized(hosts=2, rails=2), "yaml"))
    return f


def _env(**api: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_API__")}
    env.update({f"LINKGUARD_API__{k.upper()}": v for k, v in api.items()})
    return env


async def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "linkguard.cli", "topology", "serve"],
            *["--fabric", str(_fabric_file(tmp_path)), "--broker", "127.0.0.1:9"],
            env=_env(enabled="true", port=str(port)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, (out, err)
    text = err.decode()
    assert f"cannot serve the HTTP API on 127.0.0.1:{port}" in text
    assert "the port is in use" in text and "LINKGUARD_API__PORT" in text
    assert "Traceback" not in text


async def test_serve_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    """``linkguard topology serve`` serves the API (on by default; here on a free port), and
    SIGTERM still reaches the service (uvicorn installs no handlers): a clean exit 0."""
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "linkguard.cli", "topology", "serve"],
        *["--fabric", str(_fabric_file(tmp_path)), "--broker", "127.0.0.1:9"],
        env=_env(port="0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        url = None
        async with asyncio.timeout(60):
            while url is None:
                line = (await proc.stdout.readline()).decode()
                assert line, "the service ended: " + "".join(lines)
                lines.append(line)
                if '"api_listening"' in line:
                    url = json.loads(line)["url"]
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            doc = (await c.get("api/v1/fabric")).json()
            assert doc["hosts_count"] == 2
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log = "".join(lines) + rest.decode()
    assert proc.returncode == 0, log
    assert '"topology_stopped"' in log and "Traceback" not in log


async def test_the_default_is_on_at_127_0_0_1_8470(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LINKGUARD_API__ENABLED")
    api = ServiceSettings().api
    assert (api.enabled, api.host, api.port, api.token) == (True, "127.0.0.1", 8470, None)
    monkeypatch.setenv("LINKGUARD_API__TOKEN", TOKEN)
    token = ServiceSettings().api.token
    assert token is not None and token.get_secret_value() == TOKEN and TOKEN not in repr(token)
    with pytest.raises(ValueError, match="at least 16 characters"):
        ApiSettings(token="short")
