"""``linkguard report`` (linkguard.ledgerreport) on ledgers: a fleet simulation's ledger
(`sim fleet --ledger`) reports the simulator's own numbers; text and CSV outputs parse; bad
ledgers and arguments exit 2 with a clear message; a live ledger's window, unconfirmed
reroutes and tables."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from linkguard.cli import main
from linkguard.ledger import Ledger
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
    assert rep["schema"] == "linkguard.ledger-report/v1" and rep["sources"] == ["simulation"]
    assert sim["faults"]["outages"] == len(rep["outages"]) == 5
    assert rep["outage_counts"]["by_kind"] == dict(
        sorted(Counter(o["kind"] for o in sim["outages"]).items())
    )
    for key in ("with_linkguard", "without_linkguard"):
        assert rep[key] == sim[key]  # interruptions, per 1,000 GPU-days, idle, goodput
    assert rep["without_linkguard"]["interruptions"] == 5
    assert rep["with_linkguard"]["interruptions"] == 0
    assert rep["interruptions_avoided"] == 5
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
    assert row.split()[-2:] == ["0", "5"]
    assert any(
        "Meta, Llama 3 (419 in 54 days on 16,384 GPUs): 0.4736 interruptions" in x for x in lines
    )
    assert any("at $3.50 per GPU-hour" in x for x in lines)
    for header in ("worst links (most flaps):", "per rail:", "per leaf:"):
        assert header in lines
    rows = list(csv.DictReader(io.StringIO(report(ledger, "--format", "csv", out=d / "r.csv"))))
    assert set(rows[0]) == {"section", "item", "metric", "value"}
    value = {(r["section"], r["item"], r["metric"]): r["value"] for r in rows}
    assert int(value[("without_linkguard", "", "interruptions")]) == 5
    assert float(value[("without_linkguard", "", "idle_gpu_hours")]) == pytest.approx(
        sim["without_linkguard"]["idle_gpu_hours"]
    )
    assert float(value[("summary", "", "gpu_days")]) == 256 * 8 * 30
    assert {r["section"] for r in rows} == {
        "summary",
        "with_linkguard",
        "without_linkguard",
        "link",
        "rail",
        "leaf",
    }


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
    conn.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    assert main(["report", "--ledger", str(newer)]) == 2
    assert "schema version 2, newer" in capsys.readouterr().err
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
    """A service ledger built from a feed: one rerouted link down past NCCL's budget (no
    restart with linkguard), one whose new plan was never acked (a restart either way)."""
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
        assert rep.without_linkguard.interruptions == 2
        assert rep.with_linkguard.interruptions == 1  # the unconfirmed one
        assert rep.interruptions_avoided == 1 and rep.unconfirmed_reroutes == 1
        assert rep.time_to_reroute_ms["max"] == pytest.approx(30.0)
        model = FailureModel()
        saved = (model.restart_cost_s - model.reroute_floor_s) * 8 / 3600
        assert rep.gpu_hours_saved == pytest.approx(saved, abs=1e-5)
        assert rep.dollars_saved == round(rep.gpu_hours_saved, 2)
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
