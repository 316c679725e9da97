"""Fleet runs: the failure model's timelines and the with/without-linkguard report."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from linkguard.cli import main
from linkguard.failuremodel import IP_STALL_S
from linkguard.simulations.engine import run
from linkguard.simulations.failures import (
    FailureModel,
    FleetTimeline,
    expected_counts,
    fleet_scenario,
)
from linkguard.simulations.fleetreport import REPORT_SCHEMA, fleet_report, plot, simulate
from linkguard.simulations.scenario import SCHEMA, GenerateSpec, dump_scenario, load_scenario

DAY = 86400.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# NCCL's budget at NCCL_IB_TIMEOUT=20, NCCL_IB_RETRY_CNT=7 and the restart cost on top of it
BUDGET = 7 * 4.096e-6 * 2**20  # 30.064771072 s
RESTART = BUDGET + 750 + 1800 / 2  # 1680.064771072 s


def small() -> GenerateSpec:
    """64 hosts x 8 rails: about 9 faults in 366 days."""
    return GenerateSpec(hosts=64, rails=8, hosts_per_su=16, spines_per_su=2)


def test_model_derived_numbers() -> None:
    m = FailureModel()
    assert m.retransmit_timeout_s == pytest.approx(4.294967296)
    assert m.nccl_budget_s == pytest.approx(BUDGET)
    assert m.restart_cost_s == pytest.approx(RESTART)
    # Llama 3: 35 switch/cable interruptions; HPN predicts 16384 * 0.00057 * 54/30 = 16.81 of
    # them are cables; the rest are switches
    switches = 35 - 16384 * 0.00057 * 54 / 30
    assert m.leaf_reboot_rate * 16384 * 54 * DAY == pytest.approx(switches)
    assert m.nic_loss_rate * 16384 * 54 * DAY == pytest.approx(7)
    with pytest.raises(ValueError, match="flap_fraction"):
        FailureModel(flap_fraction=1.5)
    with pytest.raises(ValueError, match="repair_median_s"):
        FailureModel(repair_median_s=0)


def test_same_seed_same_timeline_other_seed_other_timeline() -> None:
    spec = GenerateSpec(hosts=256, rails=8)
    a = fleet_scenario(spec, duration_s=120 * DAY, seed=5)
    b = fleet_scenario(spec, duration_s=120 * DAY, seed=5)
    c = fleet_scenario(spec, duration_s=120 * DAY, seed=6)
    assert a.loaded.scenario.timeline  # ~8 faults expected at these rates
    assert dump_scenario(a.loaded.scenario) == dump_scenario(b.loaded.scenario)
    assert a.counts == b.counts
    assert a.loaded.scenario.timeline != c.loaded.scenario.timeline


def test_rates_give_the_expected_counts() -> None:
    """366 days of 2,048 hosts x 8 rails: about 114 host link faults, 47 NIC losses and 123
    leaf reboots. Each class is a Poisson count, so it must land within 4 standard deviations
    (sqrt of the mean) of its mean: a correct generator fails that with probability < 1e-4
    per class whatever the seed; a wrong rate (e.g. per day instead of per month, or the
    flap fraction inverted) is off by far more. Overlapping faults are dropped; at these
    densities at most a handful."""
    spec = GenerateSpec(hosts=2048, rails=8)
    ft = fleet_scenario(spec, duration_s=366 * DAY, seed=11)
    want = expected_counts(ft.model, ft.loaded.fabric, 366 * DAY)
    assert want["link_downs"] + want["flaps"] == pytest.approx(16384 * 0.00057 * 366 / 30)
    assert want["nic_losses"] == pytest.approx(7 / (16384 * 54) * 16384 * 366)
    assert ft.dropped <= 5
    for k, mean in want.items():
        assert abs(ft.counts[k] - mean) <= 4 * math.sqrt(mean), (k, ft.counts[k], mean)
    # and the timeline holds them: one link_down per link fault or NIC loss, one flap each,
    # one leaf_reboot each
    kinds = [e.kind for e in ft.loaded.scenario.timeline]
    assert kinds.count("flap") == ft.counts["flaps"]
    assert kinds.count("leaf_reboot") == ft.counts["leaf_reboots"]
    assert kinds.count("link_down") == ft.counts["link_downs"] + ft.counts["nic_losses"]


def test_generated_scenario_round_trips_through_a_file(tmp_path: Path) -> None:
    ft = fleet_scenario(small(), duration_s=366 * DAY, seed=5)
    path = tmp_path / "fleet.yaml"
    path.write_text(dump_scenario(ft.loaded.scenario))
    again = load_scenario(path)
    assert again.scenario == ft.loaded.scenario
    assert run(again).passed


def _hand_made(tmp_path: Path, rails: int, timeline: list[dict], duration_s: float):
    doc = {
        "schema": SCHEMA,
        "name": "hand-made",
        "description": "Exact with/without arithmetic.",
        "fabric": {"generate": {"hosts": 4, "rails": rails, "hosts_per_su": 4, "spines_per_su": 2}},
        "duration_s": duration_s,
        "debounce_ms": 100,
        "timeline": timeline,
    }
    path = tmp_path / "hand.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_scenario(path)
    ft = FleetTimeline(loaded=loaded, model=FailureModel(), counts={}, dropped=0)
    report = run(loaded)
    assert report.passed, report.failures
    return fleet_report(ft, report)


def test_with_and_without_arithmetic(tmp_path: Path) -> None:
    rep = _hand_made(
        tmp_path,
        4,
        [
            # 60 s down: past NCCL's budget, a restart without linkguard
            {"at_s": 100, "kind": "link_down", "host": "gpu001", "rail": 1},
            {"at_s": 160, "kind": "link_up", "host": "gpu001", "rail": 1},
            # a 10 s blip while the job restarts anyway: absorbed without, rerouted with
            {"at_s": 200, "kind": "link_down", "host": "gpu003", "rail": 0},
            {"at_s": 210, "kind": "link_up", "host": "gpu003", "rail": 0},
            # three 1 s downs: three stalls without; with, one reroute (the others come while
            # the port is held down) and it is needless (1 s < one retransmit timeout)
            {"at_s": 2000, "kind": "flap", "host": "gpu002", "rail": 2, "period_s": 2,
             "duration_s": 6},
            # 300 s leaf reboot: one restart without, one reroute with
            {"at_s": 5000, "kind": "leaf_reboot", "leaf": "su0-leaf3", "down_s": 300},
            # down for the last 500 s: a restart clipped at the end of the run
            {"at_s": 9500, "kind": "link_down", "host": "gpu000", "rail": 0},
        ],
        10_000,
    )  # fmt: skip
    assert [(o.at_s, o.down_s, o.reroute_ms, o.isolated) for o in rep.outages] == [
        (100.0, 60.0, 0.0, False),
        (200.0, 10.0, 0.0, False),
        (2000.0, 1.0, 0.0, False),
        (2002.0, 1.0, None, False),
        (2004.0, 1.0, None, False),
        (5000.0, 300.0, 0.0, False),
        (9500.0, 500.0, 0.0, False),
    ]
    assert rep.outages[-1].open and rep.outages[-2].ports == 4
    gpus = 16
    # the top-level costs are the ip transport's (every transport: test_transports.py)
    assert rep.transport == "ip" and list(rep.transports) == ["ip", "nccl-ib", "nccl-ib-failover"]
    wo = rep.without_linkguard
    # TCP resumes at its first retransmission (0.2, 0.6, 1.4, ... 102.2, 204.6, 324.6, 444.6,
    # 564.6 s) at or after the link's return: 60 s -> 102.2 (100..202.2), 10 s -> 12.6
    # (200..212.6, overlapping: 112.6 together), three 1 s flap downs -> 1.4 each, the 300 s
    # leaf reboot -> 324.6, the last 500 s (still down) -> 564.6, clipped at the end: 500
    assert (wo.interruptions, wo.stalls) == (0, 7)
    idle = 112.6 + 3 * 1.4 + 324.6 + 500.0
    assert wo.idle_s == pytest.approx(idle, abs=1e-6)
    assert wo.idle_gpu_hours == pytest.approx(idle * gpus / 3600, abs=1e-5)
    assert wo.goodput == pytest.approx(1 - idle / 10_000)
    assert wo.interruptions_per_1000_gpu_days == 0
    w = rep.with_linkguard
    # each reroute solved at once (RFC 8405 back-off after a quiet period): the path is back
    # after the lab's 50 ms data-plane gap, and one retransmission ends the stall: IP_STALL_S
    # (0.2534 s, measured on a Gloo job by benchmarks/job_stall.py; pinned in test_jobcost.py);
    # the two flap downs on a held-down port cost nothing
    assert (w.interruptions, w.stalls) == (0, 5)
    assert IP_STALL_S == 0.2534 and w.idle_s == pytest.approx(5 * 0.2534, abs=1e-6)
    assert w.goodput == pytest.approx(1 - 1.267 / 10_000)
    # NCCL's IB transport: 60 s > the 30.06 s budget fails the job at 130.06 (1,680.06 s idle,
    # its processes back at 880.06: the 10 s blip at 200 comes while it restarts); the flap
    # downs stall until the next RC retransmission, 4.29 s each (2000..2004 + 4.29 together), the
    # leaf reboot and the last down fail it again (the last clipped at the end: 500 s)
    ib = rep.transports["nccl-ib"].without_linkguard
    assert (ib.interruptions, ib.stalls) == (3, 3)
    assert ib.idle_s == pytest.approx(RESTART + (4 + 4.294967296) + RESTART + 500)
    # none of these reroutes landed after its link was back
    assert rep.needless_reroutes == 0
    assert rep.time_to_reroute_ms == {
        "count": 5, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0
    }  # fmt: skip
    # the worst moment: one of 4 rails down on a host; its busiest NIC carries 4/3 of its
    # load (3 peers x 4 GPUs = 12 endpoints over 3 rails instead of 4)
    n = rep.worst_nic_load
    assert n is not None
    assert (n["max_load"], n["baseline_max"], n["ratio"]) == (4.0, 3.0, pytest.approx(4 / 3, 1e-3))
    assert "vs 3 with all rails up (1.3333x)\n" in rep.text()
    # no load with all rails up to compare against (a host without peers): no ratio printed
    alone = dataclasses.replace(rep, worst_nic_load={**n, "baseline_max": 0.0, "ratio": None})
    assert "vs 0 with all rails up\n" in alone.text()


def test_a_host_with_no_rail_left_costs_as_without_linkguard(tmp_path: Path) -> None:
    rep = _hand_made(
        tmp_path,
        2,
        [
            {"at_s": 10, "kind": "link_down", "host": "gpu000", "rail": 0},
            {"at_s": 20, "kind": "link_down", "host": "gpu000", "rail": 1},
            {"at_s": 100, "kind": "link_up", "host": "gpu000", "rail": 1},
            {"at_s": 1000, "kind": "link_up", "host": "gpu000", "rail": 0},
        ],
        5000,
    )
    assert [(o.at_s, o.down_s, o.isolated) for o in rep.outages] == [
        (10.0, 990.0, False),
        (20.0, 80.0, True),
    ]
    w, wo = rep.with_linkguard, rep.without_linkguard  # the ip transport
    # without: 990 s is past TCP's last retransmission (804.6 s): the connection times out at
    # 10 + 924.6 s and the job restarts (924.6 + 750 + 900 s idle, its processes back at
    # 1684.6); the second down comes while it is stalled
    assert (wo.interruptions, wo.stalls) == (1, 0)
    assert wo.idle_s == pytest.approx(924.6 + 750 + 900)
    # with: the first is rerouted (0.2534 s), the second leaves gpu000 no rail: TCP's own
    # 80 s -> 102.2 s stall (20..122.2)
    assert (w.interruptions, w.stalls) == (0, 2)
    assert w.idle_s == pytest.approx(0.2534 + 102.2)


def test_goodput_shows_enough_places_to_differ_from_100() -> None:
    from linkguard.costreport import percent

    assert percent(1 - 0.8 / (30 * DAY)) == "99.99997 %"
    assert (percent(0.989629), percent(1.0)) == ("98.9629 %", "100.0000 %")


def test_report_json_schema_and_plot(tmp_path: Path) -> None:
    _, rep = simulate(small(), duration_s=366 * DAY, seed=3, oracle=True)
    assert len(rep.outages) >= 5
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["schema"] == REPORT_SCHEMA
    assert d["schema"] == "linkguard.fleet-report/v2"
    assert set(d) == {
        "schema", "fabric", "duration_s", "days", "seed", "model", "faults", "transport",
        "with_linkguard", "without_linkguard", "transports", "assumes", "reroutes", "solves",
        "time_to_reroute_ms", "needless_reroutes", "worst_nic_load", "oracle", "wall_s",
        "outages",
    }  # fmt: skip
    # v1's top-level costs are still there: the ip transport's when all are priced
    assert d["transport"] == "ip" and d["with_linkguard"] == d["transports"]["ip"]["with_linkguard"]
    assert list(d["transports"]) == ["ip", "nccl-ib", "nccl-ib-failover"]
    for t, tc in d["transports"].items():
        assert set(tc) == {
            "title", "with_linkguard", "without_linkguard", "with_linkguard_at_once",
            "interruptions_avoided", "gpu_hours_saved", "costlier_with_linkguard",
            "costlier_with_linkguard_at_once", "assumes",
        }, t  # fmt: skip
        assert (tc["with_linkguard_at_once"] is None) == (t == "ip")
    cost_keys = {
        "interruptions", "stalls", "idle_s", "idle_gpu_hours", "goodput",
        "interruptions_per_1000_gpu_days",
    }  # fmt: skip
    for side in ("with_linkguard", "without_linkguard"):
        assert set(d[side]) == cost_keys
        assert 0 <= d[side]["goodput"] <= 1
    assert d["fabric"] == {"hosts": 64, "rails": 8, "gpus": 512}
    assert d["model"]["nccl_budget_s"] == pytest.approx(BUDGET)
    assert set(d["faults"]["counts"]) == {"link_downs", "flaps", "nic_losses", "leaf_reboots"}
    assert set(d["time_to_reroute_ms"]) == {"count", "p50", "p90", "p99", "max"}
    assert set(d["worst_nic_load"]) == {
        "host", "at_s", "rails_down", "load", "max_load", "baseline_max", "ratio"
    }  # fmt: skip
    assert d["oracle"]["run"] is True and d["oracle"]["mismatches"] == 0
    assert set(d["outages"][0]) == {
        "entry", "kind", "at_s", "down_s", "ports", "open", "isolated", "reroute_ms"
    }  # fmt: skip
    assert "one synchronous job on every GPU" in d["assumes"]
    assert "TCP" in d["transports"]["ip"]["assumes"]
    assert "NCCL_IB_TIMEOUT=20" in d["transports"]["nccl-ib"]["assumes"]
    # for ip, with linkguard never costs more than without
    assert d["with_linkguard"]["idle_s"] <= d["without_linkguard"]["idle_s"]
    assert d["transports"]["ip"]["costlier_with_linkguard"] == []
    # deterministic apart from the wall time
    _, again = simulate(small(), duration_s=366 * DAY, seed=3, oracle=True)
    d2 = again.to_dict()
    d.pop("wall_s"), d2.pop("wall_s")
    assert json.loads(json.dumps(d2)) == d

    png = tmp_path / "fleet.png"
    plot(rep, png)
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    text = rep.text()
    assert "with linkguard" in text and "goodput" in text and "needless reroutes" in text
    for t in ("ip", "nccl-ib", "nccl-ib-failover"):
        assert f"transport {t} (" in text


def test_cli_sim_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    js, png, sc = tmp_path / "f.json", tmp_path / "f.png", tmp_path / "f.yaml"
    args = ["sim", "fleet", "--hosts", "64", "--rails", "8", "--days", "366", "--seed", "2"]
    assert main([*args, "--json", str(js), "--plot", str(png), "--scenario-out", str(sc)]) == 0
    out, err = capsys.readouterr()
    assert "64 hosts x 8 rails (512 GPUs), 366 days, seed 2" in out
    assert err == ""  # no progress unless asked (or a terminal)
    assert json.loads(js.read_text())["seed"] == 2
    assert png.read_bytes().startswith(PNG_MAGIC)
    # the written scenario replays with the oracle on, though this run did not check
    assert load_scenario(sc).scenario.expect.reachability is True
    assert main(["sim", "run", str(sc)]) == 0
    assert "0 mismatches" in capsys.readouterr().out

    assert main([*args, "--progress"]) == 0
    err = capsys.readouterr().err
    assert "fleet: replaying" in err

    # an output that cannot be written: refused before the run, exit 1
    assert main([*args, "--json", str(tmp_path / "no" / "f.json")]) == 1
    out, err = capsys.readouterr()
    assert f"cannot write {tmp_path / 'no' / 'f.json'}: {tmp_path / 'no'} is not a directory" in err
    assert out == ""  # nothing was run
    # too big a fabric, bad numbers: exit 2
    assert main(["sim", "fleet", "--hosts", "16384", "--rails", "9"]) == 2
    assert "above 131,072 host ports" in capsys.readouterr().err
    for bad in (["--days", "0"], ["--hosts", "0"], ["--hosts", "1"], ["--seed", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(["sim", "fleet", *bad])
        assert e.value.code == 2
