"""``linkguard report`` (linkguard.ledgerreport) on ledgers: a fleet simulation's ledger
(`sim fleet --ledger`) reports the simulator's own numbers; text and CSV outputs parse; bad
ledgers and arguments exit 2 with a clear message; a live ledger's window, unconfirmed
reroutes and tables."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from linkguard.cli import main
from linkguard.failuremodel import IP_STALL_S
from linkguard.ledger import Ledger, LedgerError
from linkguard.simulations.engine import WALL0
from linkguard.simulations.failures import FailureModel
from linkguard.simulations.fleetreport import simulate
from linkguard.simulations.scenario import GenerateSpec, expand
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.generator import generate_rail_optimized

#: a seeded fleet run with link downs and leaf reboots (5 outages) in about a second
FLEET = ["--hosts", "256", "--days", "30", "--seed", "8"]


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    """``sim fleet --json --ledger``: (ledger, the simulator's JSON report, directory)."""
    d = tmp_path_factory.mktemp("fleet")
    ledger, out = d / "fleet.sqlite3", d / "fleet.json"
    assert main(["sim", "fleet", *FLEET, "--json", str(out), "--ledger", str(ledger)]) == 0
    return ledger, json.loads(out.read_text()), d


def report(ledger: Path, *args: str, out: Path) -> str:
    assert main(["report", "--ledger", str(ledger), "--out", str(out), *args]) == 0
    return out.read_text()


def test_report_of_a_simulation_ledger_matches_the_simulator(sim_run) -> None:
    ledger, sim, d = sim_run
    rep = json.loads(report(ledger, "--format", "json", out=d / "r.json"))
    assert rep["schema"] == "linkguard.ledger-report/v2" and rep["sources"] == ["simulation"]
    assert sim["faults"]["outages"] == len(rep["outages"]) == 5
    assert rep["outage_counts"]["by_kind"] == dict(
        sorted(Counter(o["kind"] for o in sim["outages"]).items())
    )
    for key in ("with_linkguard", "without_linkguard"):
        assert rep[key] == sim[key]  # interruptions, per 1,000 GPU-days, idle, goodput
    for t in ("ip", "nccl-ib", "nccl-ib-failover"):  # every transport, every side
        for key in ("with_linkguard", "with_linkguard_at_once", "without_linkguard"):
            assert rep["transports"][t][key] == sim["transports"][t][key], (t, key)
    # 3 link downs (minutes to hours) and 2 leaf reboots (300 s): IP jobs stall through the
    # reboots (324.6 s) but lose their connections on the long downs, NCCL IB jobs restart on
    # all 5 with or without linkguard (it only fails them sooner)
    assert rep["transport"] == "ip"
    assert rep["without_linkguard"]["interruptions"] == 1
    assert rep["with_linkguard"]["interruptions"] == 0
    assert rep["interruptions_avoided"] == 1
    ib = rep["transports"]["nccl-ib"]
    assert ib["without_linkguard"]["interruptions"] == ib["with_linkguard"]["interruptions"] == 5
    assert ib["interruptions_avoided"] == 0 and ib["gpu_hours_saved"] > 0
    for key in ("reroutes", "solves", "time_to_reroute_ms", "needless_reroutes"):
        assert rep[key] == sim[key], key
    assert rep["fabric"] == {"name": "rail-optimized-256x8", **sim["fabric"]}
    assert rep["window"]["duration_s"] == sim["duration_s"] and rep["window"]["since"] == WALL0
    assert rep["gpu_hours_saved"] == pytest.approx(
        sim["without_linkguard"]["idle_gpu_hours"] - sim["with_linkguard"]["idle_gpu_hours"]
    )
    assert rep["dollars_saved"] == round(rep["gpu_hours_saved"] * 2.0, 2)
    assert [(o["at_s"], o["down_s"], o["reroute_ms"]) for o in rep["outages"]] == [
        (o["at_s"], o["down_s"], o["reroute_ms"]) for o in sim["outages"]
    ]
    ref = rep["reference"]
    assert (ref["interruptions"], ref["gpus"], ref["days"]) == (419, 16384, 54)
    assert ref["gpu_days_per_interruption"] == pytest.approx(2111.5, abs=0.1)
    assert ref["per_1000_gpu_days"] == pytest.approx(0.4736, abs=1e-4)


def test_worst_links_and_tables_follow_the_timeline(sim_run) -> None:
    """The simulator has no per-link table: count the port downs of the same seeded timeline."""
    ledger, sim, d = sim_run
    rep = json.loads(report(ledger, "--format", "json", out=d / "r.json"))
    ft, _ = simulate(GenerateSpec(hosts=256, rails=8), duration_s=30 * 86400, seed=8)
    downs: Counter[tuple[str, int]] = Counter()
    down: set[tuple[str, int]] = set()
    for e in expand(ft.loaded):
        if e.kind == "port_down" and (e.host, e.rail) not in down:
            down.add((e.host, e.rail))
            downs[(e.host, e.rail)] += 1
        elif e.kind == "port_up":
            down.discard((e.host, e.rail))
    assert rep["port_downs"] == sum(downs.values())
    top = max(downs.values())
    assert rep["worst_links"][0]["flaps"] == top
    assert len(rep["worst_links"]) == min(10, len(downs))
    per_rail = {r["rail"]: r for r in rep["per_rail"]}
    assert sorted(per_rail) == list(range(8))
    for rail in range(8):
        assert per_rail[rail]["flaps"] == sum(n for (_, r), n in downs.items() if r == rail)
    assert sum(r["outages"] for r in rep["per_rail"]) == 5  # each outage is on one rail
    leaf_reboots = [o for o in sim["outages"] if o["kind"] == "leaf_reboot"]
    big = [x for x in rep["per_leaf"] if x["flaps"] == 32]
    assert len(big) == len(leaf_reboots) and all(x["outages"] == 1 for x in big)
    for x in big:  # 32 ports x the model's 300 s reboot
        assert x["down_s"] == pytest.approx(32 * FailureModel().leaf_reboot_down_s)


def test_text_and_csv_outputs_parse(sim_run) -> None:
    ledger, sim, d = sim_run
    text = report(ledger, "--price-per-gpu-hour", "3.5", out=d / "r.txt")
    lines = text.splitlines()
    assert lines[0].startswith(f"ledger {ledger} (simulation; 1 run(s)): rail-optimized-256x8")
    row = next(x for x in lines if x.strip().startswith("interruptions (job restarts)"))
    assert row.split()[-2:] == ["0", "1"]  # the ip table comes first
    heads = [x for x in lines if x.startswith("transport ")]
    assert [h.split()[1] for h in heads] == ["ip", "nccl-ib", "nccl-ib-failover"]
    assert any(
        "Meta, Llama 3 (419 in 54 days on 16,384 GPUs): 0.4736 interruptions" in x for x in lines
    )
    assert any("at $3.50 per GPU-hour" in x for x in lines)
    for header in ("worst links (most flaps):", "per rail:", "per leaf:"):
        assert header in lines
    rows = list(csv.DictReader(io.StringIO(report(ledger, "--format", "csv", out=d / "r.csv"))))
    assert set(rows[0]) == {"section", "item", "metric", "value"}
    value = {(r["section"], r["item"], r["metric"]): r["value"] for r in rows}
    assert int(value[("without_linkguard", "nccl-ib", "interruptions")]) == 5
    assert int(value[("without_linkguard", "ip", "interruptions")]) == 1
    for t, tc in sim["transports"].items():
        assert float(value[("without_linkguard", t, "idle_gpu_hours")]) == pytest.approx(
            tc["without_linkguard"]["idle_gpu_hours"]
        )
    assert ("with_linkguard_at_once", "ip", "idle_s") not in value
    assert float(value[("with_linkguard_at_once", "nccl-ib", "idle_s")]) == pytest.approx(
        sim["transports"]["nccl-ib"]["with_linkguard_at_once"]["idle_s"]
    )
    assert int(value[("transport", "ip", "interruptions_avoided")]) == 1
    assert value[("summary", "", "transport")] == "ip"
    assert float(value[("summary", "", "gpu_days")]) == 256 * 8 * 30
    assert {r["section"] for r in rows} == {
        "summary",
        "time_to_reroute_ms",
        "outage_counts",
        "with_linkguard",
        "with_linkguard_at_once",
        "without_linkguard",
        "transport",
        "link",
        "rail",
        "leaf",
    }
    # the CSV carries the numbers the text and JSON show, time to reroute and counts included
    doc = json.loads(report(ledger, "--format", "json", out=d / "r.json"))
    for metric in ("count", "p50", "p90", "p99", "max"):
        assert float(value[("time_to_reroute_ms", "", metric)]) == pytest.approx(
            doc["time_to_reroute_ms"][metric]
        ), metric
    assert int(value[("summary", "", "solves")]) == doc["solves"] == sim["solves"]
    counts = doc["outage_counts"]
    for metric in ("outages", "open", "isolated"):
        assert int(value[("outage_counts", "", metric)]) == counts[metric]
    for kind, n in counts["by_kind"].items():
        assert int(value[("outage_counts", kind, "outages")]) == n
    assert value[("summary", "", "clamped")] == "False"
    assert value[("summary", "", "requested_since")] == ""


def test_a_window_reports_only_what_is_in_it(sim_run) -> None:
    ledger, sim, d = sim_run
    first = min(o["at_s"] for o in sim["outages"])
    since = str(WALL0 + first + 1)
    rep = json.loads(report(ledger, "--format", "json", "--since", since, out=d / "w.json"))
    assert len(rep["outages"]) == len(sim["outages"]) - 1
    assert rep["window"]["since"] == WALL0 + first + 1
    assert rep["window"]["duration_s"] == pytest.approx(sim["duration_s"] - first - 1, abs=1e-5)
    iso = json.loads(
        report(ledger, "--format", "json", "--until", "2023-11-15T00:00:00Z", out=d / "i.json")
    )
    assert iso["window"]["until_iso"] == "2023-11-15T00:00:00Z"


def test_bad_ledgers_and_arguments_exit_2(
    tmp_path: Path, sim_run, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, _, _ = sim_run
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"\x00garbage" * 500)
    cases = [
        (["--ledger", str(tmp_path)], "is a directory"),
        (["--ledger", str(tmp_path / "nope.sqlite3")], "no ledger at"),
        (["--ledger", str(junk)], "file is not a database"),
        (["--ledger", str(ledger), "--since", "2024-01-01"], "nothing to report"),
        (["--ledger", str(ledger), "--since", "1800000000", "--until", "1700000000"], "before"),
    ]
    for args, msg in cases:
        assert main(["report", *args]) == 2, args
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
    newer = tmp_path / "newer.sqlite3"
    Ledger(newer).close()
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    assert main(["report", "--ledger", str(newer)]) == 2
    assert "schema version 3, newer" in capsys.readouterr().err
    empty = tmp_path / "empty.sqlite3"
    Ledger(empty).close()
    assert main(["report", "--ledger", str(empty)]) == 2
    assert "has no runs" in capsys.readouterr().err
    for args, msg in (
        (["--since", "yesterday"], "argument --since: not a time: 'yesterday'"),
        (["--price-per-gpu-hour", "-1"], "must be between 0 and"),
        (["--format", "xml"], "invalid choice"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(["report", "--ledger", str(ledger), *args])
        assert exc.value.code == 2 and msg in capsys.readouterr().err
    assert main(["report", "--ledger", str(ledger), "--out", str(tmp_path / "no" / "r")]) == 1
    # a simulation writes a new ledger, never into an existing file
    assert main(["sim", "fleet", "--hosts", "4", "--days", "1", "--ledger", str(ledger)]) == 2
    assert "exists" in capsys.readouterr().err


def test_live_ledger_report_charges_unconfirmed_reroutes_as_without(tmp_path: Path) -> None:
    """A service ledger built from a feed: two 60 s link downs (past NCCL's budget), one
    rerouted, one whose new plan was never acked: for the ip transport that one costs as
    without linkguard; NCCL IB jobs restart on both either way."""
    fabric = generate_rail_optimized(hosts=4, rails=2)
    t0 = 1_750_000_000.0

    def port(host: str, rail: int, status: str) -> dict:
        c = next(c for c in fabric.host(host).hcas if c.rail == rail)
        return {"host": host, "hca": c.hca, "port": c.port, "rail": rail, "status": status}

    def moved(host: str, rail: int, previous: str, current: str, at: float) -> None:
        feed.emit("port", port(host, rail, current), at=at)
        feed.emit(
            "port_event",
            {**port(host, rail, current), "previous": previous, "current": current, "at": at},
            at=at,
        )

    with Ledger(tmp_path / "l.sqlite3", retention_days=None) as led:
        led.start_run(fabric, window_start=t0)
        feed = ChangeFeed()
        feed.subscribe(led.consumer())
        for h in fabric.hosts:
            for c in h.hcas:
                feed.emit("port", port(h.host, c.rail, "up"), at=t0)
        moved("gpu001", 0, "up", "down", t0 + 100)
        feed.emit("plans", {"epoch": 7, "hosts": ["gpu001"], "peer_routes": []}, at=t0 + 100.02)
        feed.emit("ack", {"host": "gpu001", "epoch": 7, "result": "applied"}, at=t0 + 100.03)
        moved("gpu001", 0, "down", "held_down", t0 + 160)  # 60 s down
        moved("gpu002", 1, "up", "down", t0 + 5000)
        feed.emit("plans", {"epoch": 8, "hosts": ["gpu002"], "peer_routes": []}, at=t0 + 5000.02)
        moved("gpu002", 1, "down", "up", t0 + 5060)  # never acked
        assert led.flush()
        rep = led.report(price_per_gpu_hour=1.0, until=t0 + 86400)  # one day of it
        assert rep.duration_s == 86400 and rep.gpus == 8
        # ip without: TCP resumes at its first retransmission after 60 s, 102.2 s, twice; with:
        # the acked reroute (30 ms) costs the lab job's measured stall (IP_STALL_S, 0.2534 s),
        # the unconfirmed one stalls 102.2 s as without
        assert (rep.without_linkguard.stalls, rep.without_linkguard.idle_s) == (2, 204.4)
        assert (rep.with_linkguard.stalls, rep.with_linkguard.idle_s) == (2, 102.2 + IP_STALL_S)
        assert rep.interruptions_avoided == 0 and rep.unconfirmed_reroutes == 1
        assert rep.time_to_reroute_ms["max"] == pytest.approx(30.0)
        saved = (204.4 - 102.2 - IP_STALL_S) * 8 / 3600
        assert rep.gpu_hours_saved == pytest.approx(saved, abs=1e-5)
        assert rep.dollars_saved == round(rep.gpu_hours_saved, 2)
        # NCCL IB: 60 s > the 30.06 s budget: a restart each (1,680.06 s); fail-fast restarts
        # them 4.39 s after the down instead (1,654.39 s), unconfirmed or not
        ib = rep.transports["nccl-ib"]
        model = FailureModel()
        assert ib.without_linkguard.interruptions == ib.with_linkguard.interruptions == 2
        assert ib.without_linkguard.idle_s == pytest.approx(2 * model.restart_cost_s, abs=1e-5)
        fast = model.retransmit_timeout_s + 0.1 + 750 + 900
        assert ib.with_linkguard.idle_s == pytest.approx(2 * fast, abs=1e-5)
        assert [(x["host"], x["flaps"], x["down_s"]) for x in rep.worst_links] == [
            ("gpu001", 1, 60.0),
            ("gpu002", 1, 60.0),
        ]
        assert [(x["rail"], x["outages"], x["flaps"]) for x in rep.per_rail] == [
            (0, 1, 1),
            (1, 1, 1),
        ]
        # a window with only the first outage
        part = led.report(since=t0, until=t0 + 150)
        assert len(part.outages) == 1 and part.outages[0]["open"] is False
        with pytest.raises(ValueError, match="price_per_gpu_hour"):
            led.report(price_per_gpu_hour=float("nan"))


# -- times, windows, files and contents a new user tried ------------------------------------------


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--since", "1e20"], "argument --since: not a time: '1e20' (must be between 1970-01-01"),
        (["--until", "1e15"], "argument --until: not a time: '1e15' (must be between"),
        (["--since", "10000-01-01"], "argument --since: not a time"),
        (["--until", "9999-12-31T23:00:00-05:00"], "argument --until: not a time"),
        (["--since", "20231120"], "argument --since: not a time: '20231120' is ambiguous"),
        (["--since", "0"], "is ambiguous"),
    ],
)
def test_times_out_of_range_or_ambiguous_exit_2_naming_the_option(
    sim_run, args: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, _, _ = sim_run
    with pytest.raises(SystemExit) as exc:
        main(["report", "--ledger", str(ledger), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and msg in err and "Traceback" not in err
    if "ambiguous" in msg:  # says how to write a date instead
        assert "2023-11-20" in err and "at least 9 digits or a decimal point" in err


def test_the_window_is_clamped_to_what_the_ledger_recorded(sim_run) -> None:
    """Years nobody recorded do not dilute the rates: --since 0.0 / --until 2030 report the
    recorded 30 days, and the report says what was asked and used."""
    ledger, sim, d = sim_run
    plain = json.loads(report(ledger, "--format", "json", out=d / "p.json"))
    wide = json.loads(
        report(
            ledger,
            "--format",
            "json",
            "--since",
            "0.0",
            "--until",
            "2030-01-01",
            out=d / "w.json",
        )
    )
    assert wide["window"]["since"] == WALL0 == plain["window"]["since"]
    assert wide["window"]["until"] == WALL0 + sim["duration_s"] == plain["window"]["until"]
    assert wide["window"]["duration_s"] == sim["duration_s"]
    assert wide["window"]["requested"] == {"since": 0.0, "until": 1_893_456_000.0}
    assert wide["window"]["clamped"] is True and plain["window"]["clamped"] is False
    assert wide["window"]["live"] is False
    for key in ("with_linkguard", "without_linkguard"):
        assert wide[key] == plain[key] == sim[key]  # per 1,000 GPU-days and goodput alike
    text = report(ledger, "--until", "2030-01-01", out=d / "w.txt")
    assert "(asked - .. 2030-01-01T00:00:00Z: clamped to what the ledger recorded)" in text
    assert "30.00 days" in text


def test_a_window_before_the_ledger_names_the_asked_until(
    sim_run, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, _, _ = sim_run
    assert main(["report", "--ledger", str(ledger), "--until", "1970-01-01"]) == 2
    err = capsys.readouterr().err
    assert "no run in ledger" in err and "overlaps the start .. 1970-01-01T00:00:00Z" in err
    assert "it recorded 2023-11-14T22:13:20Z .. 2023-12-14T22:13:20Z" in err
    assert "the ledger ends at" not in err


def _listing(d: Path) -> dict[str, tuple[int, int, bytes]]:
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns, f.read_bytes()) for f in d.iterdir()}


def test_the_report_creates_and_changes_no_file(
    tmp_path: Path, sim_run, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger, _, _ = sim_run
    d = tmp_path / "ledgers"
    d.mkdir()
    (d / "fleet.sqlite3").write_bytes(ledger.read_bytes())
    (d / "empty.sqlite3").write_bytes(b"")
    before = _listing(d)
    assert main(["report", "--ledger", str(d / "fleet.sqlite3"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["outages"]
    assert main(["report", "--ledger", str(d / "empty.sqlite3")]) == 2
    assert "empty.sqlite3 is not a linkguard ledger (an empty database)" in capsys.readouterr().err
    assert main(["report", "--ledger", str(d / "gone.sqlite3")]) == 2
    assert "no ledger at" in capsys.readouterr().err
    assert _listing(d) == before  # same files, sizes, times and bytes: no -wal/-shm either


@pytest.mark.parametrize(
    ("table", "column", "value", "msg"),
    [
        ("runs", "stats", "[1]", "runs row id=1: stats is '[1]', expected a JSON object"),
        ("runs", "gpus", 0, "runs row id=1: gpus is 0, expected an integer >= 1"),
        ("runs", "duration_s", 0, "runs row id=1: duration_s is 0.0, expected NULL or a number"),
        ("runs", "window_start", "soon", "runs row id=1: window_start is 'soon', expected Unix"),
        ("runs", "window_end", 1e20, "runs row id=1: window_end is 1e+20, expected Unix"),
        ("runs", "rails", 10**12, "runs row id=1: rails is 1000000000000, expected an integer"),
        ("runs", "model", "[1]", "runs row id=1: model is '[1]', expected a JSON object"),
        ("runs", "stats", '{"reroutes": "x"}', "runs row id=1: stats.reroutes is 'x'"),
        ("outages", "down_s", "long", "unreadable contents (ValueError"),
    ],
)
def test_corrupted_contents_exit_2_naming_row_and_field(
    tmp_path: Path,
    sim_run,
    table: str,
    column: str,
    value: object,
    msg: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ledger, _, _ = sim_run
    bad = tmp_path / "bad.sqlite3"
    bad.write_bytes(ledger.read_bytes())
    conn = sqlite3.connect(bad)
    conn.execute(f"UPDATE {table} SET {column} = ?", (value,))
    conn.commit()
    conn.close()
    assert main(["report", "--ledger", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"report: ledger {bad}: " in err and msg in err and "Traceback" not in err
    with Ledger(bad, read_only=True) as led, pytest.raises(LedgerError, match="ledger"):
        led.report()


def test_a_live_service_run_reports_up_to_now(tmp_path: Path) -> None:
    """A service run still recording: its window ends now (not at its last write), an outage
    still open is not a needless reroute, and the initial plan build is not a reroute."""
    fabric = generate_rail_optimized(hosts=4, rails=2)
    t0 = time.time() - 3600
    c = next(c for c in fabric.host("gpu001").hcas if c.rail == 0)
    where = {"host": "gpu001", "hca": c.hca, "port": c.port, "rail": 0}
    feed, got = ChangeFeed(), []
    feed.subscribe(got.append)

    def emit(kind: str, data: dict, at: float) -> None:
        feed.emit(kind, data, at=at)

    with Ledger(tmp_path / "live.sqlite3") as led:
        led.start_run(fabric, window_start=t0)
        for h in fabric.hosts:
            for x in h.hcas:
                emit(
                    "port",
                    {"host": h.host, "hca": x.hca, "port": x.port, "rail": x.rail, "status": "up"},
                    t0,
                )
        hosts = [h.host for h in fabric.hosts]
        emit("plans", {"epoch": 1, "hosts": hosts, "peer_routes": hosts}, t0 + 1)  # the start
        led.write(got, now=t0 + 1)
        got.clear()
        rep = led.report(now=t0 + 61)  # the writer's heartbeat comes every 30 s
        assert (rep.reroutes, rep.solves, len(rep.outages)) == (0, 0, 0)
        assert rep.until == t0 + 61 and rep.duration_s == pytest.approx(61)  # now, not t0 + 1
        assert rep.live and "(now: a service run is still recording)" in rep.text()
        # a link goes down 0.1 s before "now" and is rerouted: still open, so not needless
        emit("port", {**where, "status": "down"}, t0 + 200)
        emit("port_event", {**where, "previous": "up", "current": "down", "at": t0 + 200}, t0 + 200)
        emit("plans", {"epoch": 2, "hosts": ["gpu001"], "peer_routes": []}, t0 + 200.02)
        emit("ack", {"host": "gpu001", "epoch": 2, "result": "applied"}, t0 + 200.05)
        led.write(got, now=t0 + 200.05)
        rep = led.report(now=t0 + 200.1)
        (o,) = rep.outages
        assert o["open"] and o["reroute"] == "done" and o["reroute_ms"] == pytest.approx(50)
        assert o["down_s"] == pytest.approx(0.1) and o["down_s"] < FailureModel().ride_out_s
        assert rep.needless_reroutes == 0
        assert (rep.reroutes, rep.solves) == (1, 1)  # epoch 2 only
        # a run that stopped writing long ago without closing (killed) ends at its last write
        stale = led.report(now=t0 + 200.05 + 3600)
        assert not stale.live and stale.until == t0 + 200.05
