"""The interruption ledger (linkguard.ledger): the SQLite file (WAL, schema version, retention,
bad files), every kind of change recorded through a real ChangeFeed, incidents built from feed
sequences (a leaf reboot is one incident; reroute = last ack of the covering plans), and a real
service run (agents and service on the in-memory bus or a private Mosquitto) whose link
down/up lands in the ledger."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from linkguard.config import ApiSettings, BusSettings, LedgerSettings, ServiceSettings
from linkguard.ledger import MAX_TIME, Ledger, LedgerError, iso, parse_time, port_places
from linkguard.models import Ack, AckResult, DampingStatus, HostStatus, PortEvent, PortState
from linkguard.topology.audit import Finding, format_json
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.service import TopologyService
from tests.support import until

T0 = 1_750_000_000.0
FABRIC = generate_rail_optimized(hosts=4, rails=2)  # one SU: su0-leaf0, su0-leaf1


def _hca(host: str, rail: int):
    return next(c for c in FABRIC.host(host).hcas if c.rail == rail)


def port(host: str, rail: int, status: str, *, suppressed: bool = False, flaps: int = 0) -> dict:
    c = _hca(host, rail)
    st = PortState(
        host=host,
        hca=c.hca,
        port=c.port,
        rail=rail,
        status=status,
        usable=status == "up",
        damping=DampingStatus(
            flaps=flaps, penalty=1500.0 if suppressed else 0, suppressed=suppressed
        ),
        counters={"port_rcv_errors": 3},
        observed_at=T0,
    )
    return st.model_dump(mode="json")


def event(host: str, rail: int, previous: str, current: str, at: float) -> dict:
    c = _hca(host, rail)
    ev = PortEvent(
        host=host,
        hca=c.hca,
        port=c.port,
        rail=rail,
        previous=previous,
        current=current,
        reason="carrier_lost" if current == "down" else None,
        at=at,
    )
    return ev.model_dump(mode="json")


def ack(host: str, epoch: int, *, fast_path: bool = False, result: str = "applied") -> dict:
    a = Ack(
        host=host,
        epoch=epoch,
        result=AckResult(result),
        applied_at=T0,
        apply_ms=1.5,
        fast_path=fast_path,
    )
    return a.model_dump(mode="json")


def plans(epoch: int, hosts: list[str]) -> dict:
    return {"epoch": epoch, "hosts": hosts, "peer_routes": hosts, "messages": 2, "solve_ms": 1.2}


@pytest.fixture
def ledger(tmp_path: Path):
    led = Ledger(tmp_path / "ledger.sqlite3")
    led.start_run(FABRIC, source="service", window_start=T0)
    yield led
    led.close()


def feed_into(led: Ledger) -> ChangeFeed:
    feed = ChangeFeed()
    feed.subscribe(led.consumer())
    return feed


def all_up(feed: ChangeFeed, at: float) -> None:
    for h in FABRIC.hosts:
        for c in h.hcas:
            feed.emit("port", port(h.host, c.rail, "up"), at=at)


def outages(path: Path) -> list[dict]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM outages ORDER BY at, id")]
        for r in rows:
            r["ports_of"] = sorted(
                tuple(p)
                for p in conn.execute(
                    "SELECT host, hca, port, rail, leaf, su FROM outage_ports WHERE outage_id=?",
                    (r["id"],),
                )
            )
        return rows
    finally:
        conn.close()


# -- the file ----------------------------------------------------------------------------------
def test_wal_mode_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger(path) as led:
        assert led.journal_mode == "wal"
        assert led.schema_version == 2
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent
    conn.close()
    assert {
        "meta",
        "runs",
        "events",
        "port_events",
        "suppressions",
        "plans",
        "acks",
        "audit_findings",
        "outages",
        "outage_ports",
    } <= tables
    with Ledger(path, create=False) as again:  # reopens
        assert again.schema_version == 2


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    Ledger(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="schema version 7, newer than this linkguard's 2"):
        Ledger(path)


def test_bad_files_give_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="is a directory"):
        Ledger(tmp_path)
    with pytest.raises(LedgerError, match="is not a directory"):
        Ledger(tmp_path / "missing" / "l.sqlite3")
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger(tmp_path / "absent.sqlite3", create=False)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not SQLite at all " * 200)
    with pytest.raises(LedgerError, match="file is not a database"):
        Ledger(junk)
    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="not a linkguard ledger"):
        Ledger(other)
    assert junk.read_bytes().startswith(b"this is not SQLite")  # left untouched


def test_read_only_creates_and_changes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite3"
    empty.write_bytes(b"")
    with pytest.raises(LedgerError, match="not a linkguard ledger"):
        Ledger(empty, read_only=True)
    assert empty.stat().st_size == 0  # was turned into a 4 KiB SQLite file
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger(tmp_path / "absent.sqlite3", read_only=True)
    with pytest.raises(ValueError, match="read-only ledger cannot purge"):
        Ledger(empty, read_only=True, retention_days=1)
    path = tmp_path / "l.sqlite3"
    with Ledger(path) as led:
        led.start_run(FABRIC, window_start=T0)
    before = sorted(p.name for p in tmp_path.iterdir()), path.read_bytes()
    with Ledger(path, read_only=True) as ro:
        assert ro.schema_version == 2 and ro.count("runs") == 1
        with pytest.raises(LedgerError, match="open read-only"):
            ro.start_run(FABRIC)
    assert (sorted(p.name for p in tmp_path.iterdir()), path.read_bytes()) == before


def test_a_ledger_deleted_under_its_writer(tmp_path: Path) -> None:
    """Queries answer a clear error and create nothing at the path; the writer logs
    ledger_file_replaced once (at its next 30 s check)."""
    from structlog.testing import capture_logs

    path = tmp_path / "l.sqlite3"
    with Ledger(path) as led:
        led.start_run(FABRIC, window_start=T0)
        led.write([], now=T0 + 1)
        for f in tmp_path.iterdir():  # rm l.sqlite3*
            f.unlink()
        with pytest.raises(LedgerError, match=r"no ledger at .*\(deleted or moved since"):
            led.report()
        with pytest.raises(LedgerError, match="deleted or moved"):
            led.events()
        assert list(tmp_path.iterdir()) == []  # no 0-byte file at the path
        with capture_logs() as logs:
            led.write([], now=T0 + 2)  # not due yet
            assert logs == []
            for at in (T0 + 32, T0 + 70):
                led.write([], now=at)
        assert [e["event"] for e in logs] == ["ledger_file_replaced"]
        assert logs[0]["log_level"] == "error" and logs[0]["path"] == str(path)


def test_purge_leaves_a_recording_run_without_duration(tmp_path: Path) -> None:
    """A run still recording has no duration; the purge moving its start must not give it
    one (close() would keep that stale value)."""
    path = tmp_path / "l.sqlite3"
    now = time.time()
    with Ledger(path, retention_days=1) as led:
        led.start_run(FABRIC, window_start=now - 3 * 86400)
        led.purge(now=now)
        conn = sqlite3.connect(path)
        start, duration = conn.execute("SELECT window_start, duration_s FROM runs").fetchone()
        conn.close()
        assert start == pytest.approx(now - 86400) and duration is None
    conn = sqlite3.connect(path)
    start, end, duration = conn.execute(
        "SELECT window_start, window_end, duration_s FROM runs"
    ).fetchone()
    conn.close()
    assert duration == pytest.approx(end - start) and end >= now


def test_retention_deletes_old_rows_on_open(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    now = time.time()
    old, recent = now - 10 * 86400, now - 3600
    with Ledger(path) as led:
        led.start_run(FABRIC, window_start=old - 60)
        feed = feed_into(led)
        for at in (old, recent):
            all_up(feed, at)
            feed.emit("port_event", event("gpu001", 1, "up", "down", at), at=at + 0.01)
            feed.emit("port_event", event("gpu001", 1, "down", "up", at + 5), at=at + 5)
            feed.emit("plans", plans(1, ["gpu001"]), at=at + 0.02)
        assert led.flush()
        assert led.count("outages") == 2 and led.count("port_events") == 4
    with Ledger(path, retention_days=1) as led:  # deletes on open
        assert led.count("port_events") == 2
        assert led.count("outages") == 1 and led.count("outage_ports") == 1  # cascades
        assert led.count("plans") == 1
        total, rows = led.events()
        assert total == 3 + 8 and all(r["at"] >= now - 86400 for r in rows)
        assert led.count("runs") == 1
    conn = sqlite3.connect(path)
    start = conn.execute("SELECT window_start FROM runs").fetchone()[0]
    conn.close()
    assert start == pytest.approx(now - 86400, abs=60)  # the run now starts at the cutoff


# -- what is recorded --------------------------------------------------------------------------
def test_every_kind_of_change_is_recorded(ledger: Ledger) -> None:
    feed = feed_into(ledger)
    feed.emit("host", HostStatus(host="gpu002", online=True, at=T0).model_dump(mode="json"), at=T0)
    feed.emit("port", port("gpu002", 1, "up"), at=T0 + 1)
    feed.emit("port", port("gpu002", 1, "suppressed", suppressed=True, flaps=4), at=T0 + 2)
    feed.emit("port_event", event("gpu002", 1, "up", "down", T0 + 2), at=T0 + 2)
    feed.emit("plans", plans(5, ["gpu002"]), at=T0 + 3)
    feed.emit("ack", ack("gpu002", 5), at=T0 + 4)
    finding = Finding("wrong_rate", "error", "gpu002:mlx5_1/1", "400 Gb/s", "200 Gb/s", "slow")
    feed.emit("audit", json.loads(format_json([finding])), at=T0 + 5)
    feed.emit("health", {"degraded_rails": [], "switches_down": []}, at=T0 + 6)
    assert ledger.flush()
    total, rows = ledger.events(limit=100)
    assert total == 8
    assert [r["kind"] for r in rows] == [
        "health",
        "audit",
        "ack",
        "plans",
        "port_event",
        "port",
        "port",
        "host",
    ]
    pe = rows[4]
    assert (pe["host"], pe["hca"], pe["port"], pe["rail"], pe["leaf"], pe["su"]) == (
        "gpu002",
        "mlx5_1",
        1,
        1,
        "su0-leaf1",
        0,
    )
    assert pe["data"]["previous"] == "up" and pe["data"]["current"] == "down"
    assert pe["seq"] == 4 and isinstance(pe["id"], int)
    assert "counters" not in rows[5]["data"]  # port changes are kept without their counters
    assert rows[1]["data"]["findings_count"] == 1 and "findings" not in rows[1]["data"]
    conn = sqlite3.connect(ledger.path)
    q = conn.execute
    assert q(
        "SELECT host, hca, port, rail, leaf, su, previous, current, reason FROM port_events"
    ).fetchall() == [("gpu002", "mlx5_1", 1, 1, "su0-leaf1", 0, "up", "down", "carrier_lost")]
    assert q("SELECT suppressed, flaps, penalty, leaf FROM suppressions").fetchall() == [
        (1, 4, 1500.0, "su0-leaf1")
    ]
    assert q("SELECT epoch, at, hosts, peer_routes, messages, solve_ms FROM plans").fetchall() == [
        (5, T0 + 3, 1, 1, 2, 1.2)
    ]
    assert q("SELECT host, epoch, result, apply_ms, fast_path, at FROM acks").fetchall() == [
        ("gpu002", 5, "applied", 1.5, 0, T0 + 4)
    ]
    assert q(
        "SELECT kind, severity, subject, host, hca, port, expected FROM audit_findings"
    ).fetchall() == [("wrong_rate", "error", "gpu002:mlx5_1/1", "gpu002", "mlx5_1", 1, "400 Gb/s")]
    conn.close()


def test_events_query_filters_and_pages(ledger: Ledger) -> None:
    feed = feed_into(ledger)
    all_up(feed, T0)  # 8 port changes at T0
    for i, h in enumerate(["gpu000", "gpu001", "gpu002"]):
        feed.emit("port_event", event(h, 0, "up", "down", T0 + 10 + i), at=T0 + 10 + i)
    assert ledger.flush()
    total, page = ledger.events(limit=2)
    assert total == 11 and [r["host"] for r in page] == ["gpu002", "gpu001"]  # newest first
    total, page = ledger.events(limit=2, offset=2)
    assert [r["host"] for r in page] == ["gpu000", "gpu003"]
    assert ledger.events(host="gpu001")[0] == 3
    assert ledger.events(rail=0, kind="port_event")[0] == 3
    assert ledger.events(rail=1)[0] == 4
    assert ledger.events(since=T0 + 11)[0] == 2
    assert ledger.events(since=T0 + 10, until=T0 + 11)[0] == 1
    assert ledger.events(limit=0) == (11, [])
    for bad, msg in (
        ({"limit": -1}, "limit"),
        ({"offset": -5}, "offset"),
        ({"kind": "nope"}, "unknown event kind"),
        ({"since": T0 + 5, "until": T0}, "after until"),
    ):
        with pytest.raises(ValueError, match=msg):
            ledger.events(**bad)


def test_parse_time() -> None:
    assert parse_time("1700000000") == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0
    assert parse_time("2023-11-14T23:13:20+01:00") == 1_700_000_000.0
    assert parse_time("2023-11-14 22:13:20") == 1_700_000_000.0  # no zone: UTC
    for bad in ("yesterday", "", "nan", "-5", "2023-13-01", "10000-01-01"):
        with pytest.raises(ValueError, match="not a time"):
            parse_time(bad)
    # 1970 .. 9999 only: iso() and the report can show every accepted time
    assert parse_time("9999-12-31T23:59:59Z") == MAX_TIME == 253_402_300_799
    assert iso(MAX_TIME) == "9999-12-31T23:59:59Z"
    for bad in ("1e20", "1e15", 1e20, "0001-01-01", "9999-12-31T23:00:00-05:00"):
        with pytest.raises(ValueError, match=r"not a time: .* \(must be between 1970-01-01"):
            parse_time(bad)
    # a bare number of fewer than 9 digits may be a date: refused, saying how to write one
    for bad in ("20231120", "0", "12345678"):
        with pytest.raises(ValueError, match=r"is ambiguous.*2023-11-20.*at least 9 digits"):
            parse_time(bad)
    assert parse_time("0.0") == parse_time(0) == 0.0
    assert parse_time("123456789") == 123_456_789.0 and parse_time("2e9") == 2e9
    for t in (1e20, -1.0, float("nan"), float("inf")):  # never raises
        assert isinstance(iso(t), str)
    assert iso(1e20) == "1e+20 s"


def test_an_empty_ledger_path_means_no_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_LEDGER__PATH", "")
    settings = ServiceSettings(api=ApiSettings(enabled=False))
    assert settings.ledger.path is None
    assert TopologyService(settings, fabric=FABRIC).ledger is None
    assert LedgerSettings(path="  ").path is None
    assert LedgerSettings(path="/var/lib/l.sqlite3").path == Path("/var/lib/l.sqlite3")


def test_port_places_follow_the_fabric() -> None:
    places = port_places(generate_rail_optimized(hosts=40, rails=2))
    p = places[("gpu035", "mlx5_1", 1)]
    assert (p.rail, p.leaf, p.su) == (1, "su1-leaf1", 1)


# -- incidents ---------------------------------------------------------------------------------
def test_leaf_reboot_is_one_incident_rerouted_at_the_last_ack(ledger: Ledger) -> None:
    feed = feed_into(ledger)
    all_up(feed, T0)
    hosts = [h.host for h in FABRIC.hosts]
    t = T0 + 100
    # the leaf of rail 1 reboots: the agents report their ports within 0.4 s (state first,
    # then the event, as an agent publishes them)
    for i, h in enumerate(hosts):
        feed.emit("port", port(h, 1, "down"), at=t + 0.1 * i)
        feed.emit("port_event", event(h, 1, "up", "down", t + 0.1 * i), at=t + 0.1 * i + 0.001)
    feed.emit("ack", ack("gpu000", 3, fast_path=True), at=t + 0.005)  # fast path: not counted
    feed.emit("plans", plans(4, hosts[:2]), at=t + 0.15)  # the first solve saw two hosts
    feed.emit("plans", plans(5, hosts[2:]), at=t + 0.5)
    for i, h in enumerate(hosts):
        feed.emit("ack", ack(h, 4 if i < 2 else 5), at=t + 0.2 + 0.4 * i)  # last at t + 1.4
    # back after 300 s (held down), usable 10 s later; rail 0 never went down
    for i, h in enumerate(hosts):
        feed.emit("port", port(h, 1, "held_down"), at=t + 300 + 0.1 * i)
        feed.emit("port_event", event(h, 1, "down", "held_down", t + 300), at=t + 300 + 0.1 * i)
    for h in hosts:
        feed.emit("port", port(h, 1, "up"), at=t + 310)
    # a link 5 s after the leaf reboot is its own incident
    feed.emit("port_event", event("gpu002", 0, "up", "down", t + 5), at=t + 5)
    assert ledger.flush()
    found = outages(ledger.path)
    assert len(found) == 2
    leaf, link = found
    assert leaf["kind"] == "leaf" and leaf["ports"] == 4 and leaf["at"] == t
    assert leaf["ports_of"] == [(h, "mlx5_1", 1, 1, "su0-leaf1", 0) for h in hosts]
    assert leaf["down_s"] == pytest.approx(300.0, abs=1e-6)  # longest episode: gpu000's
    assert leaf["open"] == 0 and leaf["isolated"] == 0
    assert leaf["reroute"] == "done" and leaf["reroute_ms"] == pytest.approx(1400.0)
    assert leaf["at_s"] == pytest.approx(100.0) and leaf["cause"] == "carrier_lost"
    assert link["kind"] == "link" and link["open"] == 1 and link["down_s"] is None
    assert link["reroute"] == "none"  # no plans after it yet


def test_isolation_held_down_and_unconfirmed_reroutes(ledger: Ledger) -> None:
    feed = feed_into(ledger)
    # a first report of a port already down (an agent starting) opens nothing
    feed.emit("port_event", event("gpu000", 0, "unknown", "down", T0 - 5), at=T0 - 5)
    feed.emit("port", port("gpu000", 1, "down"), at=T0 - 5)
    all_up(feed, T0)
    t = T0 + 50
    # gpu001 loses both rails, 3 s apart: the second leaves it isolated
    feed.emit("port", port("gpu001", 0, "down"), at=t)
    feed.emit("port", port("gpu001", 1, "down"), at=t + 3)
    # gpu003 rail 0: down, back (held down), down again: that second down needs no reroute
    feed.emit("port", port("gpu003", 0, "down"), at=t + 10)
    feed.emit("plans", plans(2, ["gpu003"]), at=t + 10.05)
    feed.emit("ack", ack("gpu003", 2), at=t + 10.08)
    feed.emit("port", port("gpu003", 0, "held_down"), at=t + 12)
    feed.emit("port", port("gpu003", 0, "down"), at=t + 14)
    feed.emit("port", port("gpu003", 0, "held_down"), at=t + 15)
    feed.emit("port", port("gpu003", 0, "up"), at=t + 40)
    # gpu002 rail 1: re-planned but never acked before it was usable again
    feed.emit("port", port("gpu002", 1, "down"), at=t + 60)
    feed.emit("plans", plans(3, ["gpu002"]), at=t + 60.05)
    feed.emit("port", port("gpu002", 1, "up"), at=t + 61)
    assert ledger.flush()
    found = outages(ledger.path)
    assert [(o["kind"], o["isolated"], o["reroute"]) for o in found] == [
        ("link", 0, "none"),
        ("link", 1, "none"),
        ("link", 0, "done"),
        ("link", 0, "none"),
        ("link", 0, "unconfirmed"),
    ]
    assert found[2]["reroute_ms"] == pytest.approx(80.0) and found[2]["down_s"] == 2.0
    assert found[3]["down_s"] == 1.0
    rep = ledger.report(until=t + 100)
    assert rep.unconfirmed_reroutes == 1


# -- a real service ------------------------------------------------------------------------------
@pytest.fixture(params=[pytest.param("mosquitto", marks=pytest.mark.real), "memory"])
def bus_env(request: pytest.FixtureRequest):
    """(BusSettings, bus factory) of a private Mosquitto or the in-memory broker."""
    from linkguard.bus import Bus
    from linkguard.membus import MemoryBroker

    fast = {"reconnect_min_s": 0.05, "reconnect_max_s": 0.2}
    if request.param == "mosquitto":
        m = request.getfixturevalue("mosquitto")
        return BusSettings(host=m.host, port=m.port, **fast), Bus
    return BusSettings(**fast), MemoryBroker().bus_factory


async def test_service_records_a_link_down_and_up(tmp_path: Path, bus_env) -> None:
    from linkguard.agent.monitor import DampingPolicy
    from linkguard.simulations.fleet import SimulatedFleet

    bus, factory = bus_env
    fabric = generate_rail_optimized(hosts=4, rails=2)
    path = tmp_path / "ledger.sqlite3"
    fleet = SimulatedFleet(
        fabric,
        bus=bus,
        workdir=tmp_path,
        damping=DampingPolicy(hold_down_initial_s=0.3),
        bus_factory=factory,
    )
    # the same service, with its ledger configured as an operator would
    fleet.service = TopologyService(
        ServiceSettings(
            bus=bus,
            solve={"short_ms": 20},
            startup_settle_s=0.2,
            api=ApiSettings(enabled=False),
            ledger=LedgerSettings(path=path, retention_days=30),
        ),
        fabric=fabric,
        bus_factory=factory,
    )
    led = fleet.service.ledger
    assert led is not None
    async with fleet:
        await fleet.wait_all_acked()
        epoch0 = fleet.service.state.epoch
        assert led.flush()
        # the initial plan build is not a reroute, and a running service's window ends now
        start = led.report()
        assert (start.reroutes, start.outages, start.live) == (0, [], True)
        assert start.until == pytest.approx(time.time(), abs=5)
        fleet.link_down("gpu002", 1)
        await fleet.wait_all_acked(epoch0 + 1)

        def incident() -> list[dict]:
            led.flush()
            return outages(path)

        await until(lambda: [o["reroute"] for o in incident()] == ["done"], "reroute recorded")
        fleet.link_up("gpu002", 1)
        await until(lambda: incident()[0]["open"] == 0, "incident closed")
        epoch1 = fleet.service.state.epoch
        await fleet.wait_all_acked(epoch1 + 1)  # usable again after the hold-down
    inc = outages(path)
    assert len(inc) == 1
    o = inc[0]
    assert o["kind"] == "link" and o["ports"] == 1 and o["isolated"] == 0
    assert o["ports_of"] == [("gpu002", "mlx5_1", 1, 1, "su0-leaf1", 0)]
    assert 0 < o["reroute_ms"] < 5000 and 0 < o["down_s"] < 30
    with Ledger(path, create=False) as again:  # the service closed it: readable afterwards
        kinds = {r["kind"] for r in again.events(limit=1000)[1]}
        assert {"port", "port_event", "host", "plans", "ack", "health"} <= kinds
        _, evs = again.events(kind="port_event", host="gpu002")
        transitions = [(e["data"]["previous"], e["data"]["current"]) for e in reversed(evs)]
        # the agent's first event (its start: unknown -> up) reaches the ledger too, replayed
        # from its journal once the host is announced
        transitions = [t for t in transitions if t != ("unknown", "up")]
        assert transitions[:3] == [("up", "down"), ("down", "held_down"), ("held_down", "up")]
        rep = again.report()
        assert rep.sources == ["service"] and rep.gpus == 8
        assert len(rep.outages) == 1 and rep.reroutes >= 2
        assert rep.worst_links[0]["host"] == "gpu002" and rep.worst_links[0]["flaps"] == 1
        assert rep.time_to_reroute_ms["max"] == o["reroute_ms"]
    conn = sqlite3.connect(path)
    closed, source = conn.execute("SELECT closed, source FROM runs").fetchone()
    conn.close()
    assert (closed, source) == (1, "service")


def test_service_refuses_a_bad_ledger_path(tmp_path: Path) -> None:
    from linkguard.config import ConfigError

    with pytest.raises(ConfigError, match=r"ledger: ledger .* is a directory"):
        TopologyService(
            ServiceSettings(api=ApiSettings(enabled=False), ledger=LedgerSettings(path=tmp_path)),
            fabric=FABRIC,
        )
