"""The lab's training job: stall arithmetic on hand-made step series, the rank script's
arguments, agent settings passed through, the torch check, and one real job through a link
failure on a 2x2 lab (root, mosquitto and torch; skipped saying why without them, failing
under LINKGUARD_REQUIRE_REAL=1).

Steps in these series are 100 ms apart unless said; times are monotonic seconds."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from linkguard.cli import main
from linkguard.simulations import jobtrain, labjob
from linkguard.simulations.engine import ExpectResult
from linkguard.simulations.lab import Lab
from linkguard.simulations.labjob import (
    LabJob,
    RankLog,
    Stall,
    job_expectations,
    median_step_ms,
    stalls,
    steps_between,
    torch_problem,
)
from linkguard.simulations.labprocs import agent_overrides, write_configs
from linkguard.simulations.labreport import (
    FaultResult,
    JobFault,
    JobSummary,
    LabPair,
    LabReport,
)
from linkguard.simulations.labrun import LabRunError, check_lab_scenario, run_lab
from linkguard.simulations.scenario import SCENARIOS_DIR, Expect, load_scenario
from tests.support import missing, require_binary, require_root


def every(start: float, stop: float, step: float = 0.1) -> list[float]:
    """Step ends from ``start`` to ``stop`` (inclusive), ``step`` apart."""
    n = round((stop - start) / step)
    return [round(start + k * step, 6) for k in range(n + 1)]


# --------------------------------------------------------------------------------------------
# Median and stall (pure)


def test_median_step_leaves_out_the_warm_up_and_what_follows_the_first_fault() -> None:
    # steps 1-3 are slow (DDP's first iterations), then 100 ms, then 50 ms from 10.0 to 20.0 s
    ends = [0.0, 0.5, 1.0, 1.5, *every(1.6, 10.0), *every(10.05, 20.0, 0.05)]
    assert median_step_ms(ends, before=10.0) == pytest.approx(100.0)
    assert median_step_ms(ends, before=None) == pytest.approx(50.0)  # most steps are 50 ms
    # fewer than 3 steps before the cut-off: the whole run after the warm-up
    assert median_step_ms(ends, before=1.55) == pytest.approx(50.0)
    assert median_step_ms([0.0, 0.1, 0.2, 0.3], before=None) is None


def test_one_fault_owns_the_step_it_hit() -> None:
    # 100 ms steps, a fault at 5.03 s, the step in flight ends 2 s after it started
    ends = [*every(0.0, 5.0), *every(7.0, 9.0)]
    (s,) = stalls(ends, [5.03], None, median_ms=100.0)
    assert s == Stall(stall_ms=1900.0, longest_ms=2000.0, resumed=True)
    assert steps_between(ends, 5.03, 9.5) == 21


def test_a_fault_with_no_effect_shows_the_step_jitter() -> None:
    ends = [*every(0.0, 5.0), 5.13, *every(5.23, 8.03)]  # one 130 ms step
    assert stalls(ends, [5.03], None, median_ms=100.0) == [Stall(30.0, 130.0, True)]


def test_flaps_during_one_stall_count_it_once() -> None:
    # faults at 2.0, 4.0, 6.0 and 8.0 s; a step stalled from 1.95 to 6.3 s (hit by the first
    # three), then normal steps, then a 1 s step hit by the fourth
    ends = [*every(0.0, 1.9), 1.95, *every(6.3, 7.9), 8.9, *every(9.0, 10.0)]
    got = stalls(ends, [2.0, 4.0, 6.0, 8.0], None, median_ms=100.0)
    assert got[0] == Stall(4250.0, 4350.0, True)
    assert got[1] is None  # no step of its own: it came during the first one's stall
    assert got[2] == Stall(0.0, 100.0, True)  # owns the normal steps after it (from 6.3 s)
    assert got[3] == Stall(900.0, 1000.0, True)


def test_a_step_in_flight_at_the_next_fault_belongs_to_it() -> None:
    # fault 1 at 2.0 s costs nothing; fault 2 at 4.02 s hits the step that began at 4.0 s
    ends = [*every(0.0, 4.0), 4.8, *every(4.9, 6.0)]
    first, second = stalls(ends, [2.0, 4.02], None, median_ms=100.0)
    assert first is not None and first.longest_ms == pytest.approx(100.0)
    assert second == Stall(700.0, 800.0, True)


def test_a_rank_that_failed_stalls_until_its_failure() -> None:
    ends = every(0.0, 3.0)  # the last step ended at 3.0 s; its collective timed out at 13.0 s
    (s,) = stalls(ends, [3.05], 13.0, median_ms=100.0)
    assert s == Stall(9900.0, 10000.0, False)
    # before the first fault nothing is owned; no fault, no stall
    assert stalls(ends, [], 13.0, median_ms=100.0) == []
    assert stalls([], [1.0], None, median_ms=100.0) == [None]


def _job_with(ranks: list[RankLog], stopped_at: float) -> LabJob:
    job = LabJob.__new__(LabJob)  # the measuring half only: no lab, no processes
    job.ranks, job.stopped_at = ranks, stopped_at
    return job


def test_job_faults_take_the_worst_rank_and_count_failures_per_window(tmp_path: Path) -> None:
    a = RankLog(0, "gpu000", tmp_path / "a", ends=[*every(0.0, 5.0), *every(6.5, 20.0)])
    a.exit_code, a.done_at = 0, 20.0
    b = RankLog(1, "gpu001", tmp_path / "b", ends=[*every(0.0, 5.0), *every(7.0, 12.0)])
    b.exit_code, b.error = 1, (19.0, 110, "RuntimeError: Timed out waiting 10000ms for recv")
    job = _job_with([a, b], stopped_at=20.0)
    first, second = job.faults([5.05, 12.05], median_ms=100.0)
    assert first == JobFault(1900.0, 2000.0, 51, 0, True)  # rank 1's 2 s step is the worst
    assert second == JobFault(6900.0, 7000.0, 0, 1, False)  # rank 1 silent 12.0 -> 19.0 s
    third_job = _job_with([a, b], stopped_at=20.0)
    *_, late = third_job.faults([5.05, 12.05, 19.5], median_ms=100.0)
    assert late.note == "the job had failed" and late.stall_ms is None
    assert "job had failed" in late.text() and "FAILED" in second.text()


def test_rank_log_reads_what_the_rank_wrote(tmp_path: Path) -> None:
    out = tmp_path / "rank.txt"
    out.write_text(
        "start 10.0 pid 7 torch 2.13.0+cpu devices 4\nready 12.5 params 526336\n"
        "step 1 12.6 100.0\nstep 2 12.7 100.0\nbuckets 8\nstep 3 12.8 100.0\nstep 4 1"
    )
    r = RankLog(0, "gpu000", out)
    r.read()
    assert (r.ready_at, r.buckets, r.ends) == (12.5, 8, [12.6, 12.7, 12.8])
    with out.open("a") as f:  # the torn line is completed, then the rank fails
        f.write("2.9 100.0\nerror 23.0 4 RuntimeError: Connection closed by peer\n")
    r.read()
    assert r.ends == [12.6, 12.7, 12.8, 12.9]
    assert r.error == (23.0, 4, "RuntimeError: Connection closed by peer")
    assert r.failed and r.failed_at(99.0) == 23.0


def test_job_expectations_fail_on_a_rank_failure_and_a_long_stall() -> None:
    report = LabReport("s", "s.yaml", True, 4, 4, 1, 10.0, None)
    report.faults = [FaultResult(2.0, "link_down", "link_down gpu001 rail 1", [0])]
    report.faults[0].job = JobFault(2034.0, 2134.0, 5, 1, True)
    report.job = SimpleNamespace(rank_failures=1, failures=["rank 1 (gpu001) at 9.0 s: x"])  # type: ignore[assignment]
    held = job_expectations(report, Expect(job_max_stall_ms=300))
    assert held == [
        ExpectResult(
            "job_rank_failures", 0, 1, False, "1 rank(s) failed, limit 0; first: rank 1 "
            "(gpu001) at 9.0 s: x"
        ),
        ExpectResult(
            "job_max_stall_ms", 300.0, 2034.0, False,
            "worst job stall 2034 ms (link_down gpu001 rail 1 at 2 s), limit 300 ms",
        ),
    ]  # fmt: skip
    assert [e.held for e in job_expectations(report, Expect(job_rank_failures=1))] == [True]


def test_the_pair_report_puts_both_halves_side_by_side() -> None:
    def half(linkguard: bool, stall: float, step: float) -> LabReport:
        r = LabReport("job-link-down", "j.yaml", linkguard, 4, 4, 1, 12.0, None, passed=True)
        f = FaultResult(2.0, "link_down", "link_down gpu001 rail 1", [0])
        f.job = JobFault(stall, stall + step, 3, 0, True)
        r.faults = [f]
        r.job = JobSummary(
            "torch-gloo", 4, 4, 8, 8, 10.0, step, step * 1.2, 90, 0, [], 8.0, {0: 12.0}
        )
        return r

    pair = LabPair(half(True, 6463.0, 105.1), half(False, 6461.0, 101.9))
    text = pair.text()
    assert "stall 6463 ms, 3 steps" in text and "stall 6461 ms, 3 steps" in text
    assert "steady-state step: 105.1 ms with linkguard, 101.9 ms without (ratio 1.03)" in text
    assert text.rstrip().endswith("job-link-down: PASSED (judged on the with-linkguard half)")
    d = pair.to_dict()
    assert d["with_linkguard"]["faults"][0]["job"]["stall_ms"] == 6463.0  # type: ignore[index]
    assert json.dumps(d)


# --------------------------------------------------------------------------------------------
# The rank script's arguments (no torch needed)


def test_rank_arguments() -> None:
    a = jobtrain.parse_args(
        ["--rank", "1", "--world", "4", "--store", "10.99.0.1:29500", "--devices",
         "10.200.0.2,10.200.1.2", "--out", "/tmp/r1.txt", "--stop-file", "/tmp/stop"]
    )  # fmt: skip
    assert (a.rank, a.world, a.store_host, a.store_port) == (1, 4, "10.99.0.1", 29500)
    assert a.devices == ("10.200.0.2", "10.200.1.2")
    assert (a.compute_ms, a.width, a.layers, a.timeout_s, a.max_steps) == (50.0, 256, 8, 10.0, None)
    assert a.bucket_cap_mb == 0.25  # one 256 x 256 float32 layer: one DDP bucket per layer


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--rank": "4"}, "--rank 4 must be below --world 4"),
        ({"--store": "10.99.0.1"}, "expected ADDR:PORT, got '10.99.0.1'"),
        ({"--store": "host:29500"}, "expected an IPv4 ADDR:PORT, got 'host:29500'"),
        ({"--store": "10.99.0.1:70000"}, "port 70000 is not 1..65535"),
        ({"--devices": "10.200.0.2,gpu"}, "'gpu' is not an IPv4 address"),
        ({"--devices": "10.200.0.2,10.200.0.2"}, "an endpoint appears twice"),
        ({"--devices": ","}, "at least one endpoint address"),
        ({"--timeout-s": "0"}, "0.0 is not within 0.1..3600"),
        ({"--layers": "many"}, "'many' is not a int"),
        ({"--stop-file": None}, "give --stop-file or --max-steps"),
    ],
)
def test_bad_rank_arguments_exit_2(change: dict, message: str, capsys) -> None:
    args = {
        "--rank": "1",
        "--world": "4",
        "--store": "10.99.0.1:29500",
        "--devices": "10.200.0.2",
        "--out": "/tmp/r.txt",
        "--stop-file": "/tmp/stop",
    }
    args.update(change)
    argv = list(itertools.chain.from_iterable((k, v) for k, v in args.items() if v is not None))
    with pytest.raises(SystemExit) as info:
        jobtrain.parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Agent settings, torch


def test_agent_settings_become_nested_config_checked_by_the_agent(tmp_path: Path) -> None:
    assert agent_overrides({"log_level": "debug", "probes.rate_pps": 2}) == {
        "log_level": "debug",
        "probes": {"rate_pps": 2},
    }
    with pytest.raises(ValueError, match="the lab sets route_table itself"):
        agent_overrides({"route_table": 7})
    with pytest.raises(ValueError, match=r"the lab sets routes\.table itself"):
        agent_overrides({"routes.table": 7})
    assert agent_overrides({"routes.rto_min_ms": 20}) == {"routes": {"rto_min_ms": 20}}
    with pytest.raises(ValueError, match=r"this agent refuses them: turbo: Extra inputs"):
        agent_overrides({"turbo.mode": 1})  # not a setting of the agent: refused up front
    with pytest.raises(ValueError, match=r"routes.rto_min_ms: Input should be greater than or"):
        agent_overrides({"routes.rto_min_ms": 0})  # out of range: refused up front
    with pytest.raises(ValueError, match="probes is given a value and a section"):
        agent_overrides({"probes": 1, "probes.rate_pps": 2})
    lab = SimpleNamespace(hosts=[SimpleNamespace(netns="lgx h0"), SimpleNamespace(netns="h1")])
    fabric = load_scenario(SCENARIOS_DIR / "job-link-down.yaml").fabric
    fabric = fabric.model_copy(update={"hosts": fabric.hosts[:2]})
    cfgs = write_configs(
        tmp_path, lab, fabric, 1883, agent_extra={"probes": {"rate_pps": 2}, "log_level": "debug"}
    )  # type: ignore[arg-type]
    cfg = yaml.safe_load(cfgs["gpu001"].read_text())
    assert cfg["log_level"] == "debug" and cfg["probes"] == {"rate_pps": 2}
    assert cfg["routes"] == {"table": 4242} and cfg["netns"] == "h1"


def test_cli_agent_set_is_checked_before_anything_is_built(capsys) -> None:
    path = str(SCENARIOS_DIR / "job-link-down.yaml")
    assert main(["sim", "lab", path, "--agent-set", "routes.rto_min_ms=0"]) == 2
    err = capsys.readouterr().err
    assert "agent settings routes.rto_min_ms=0: this agent refuses them: routes.rto_min_ms:" in err
    with pytest.raises(SystemExit) as info:
        main(["sim", "lab", path, "--agent-set", "no-equals-sign"])
    assert info.value.code == 2
    assert "expected KEY=VALUE, got 'no-equals-sign'" in capsys.readouterr().err


def test_a_job_without_torch_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        labjob.importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a)
    )
    problem = torch_problem()
    assert problem is not None and "pip install torch==2.13.0" in problem
    require_root()
    require_binary("mosquitto")
    loaded = load_scenario(SCENARIOS_DIR / "job-link-down.yaml")
    with pytest.raises(LabRunError, match=r"job-link-down.yaml: this scenario's job needs Py"):
        check_lab_scenario(loaded)
    check_lab_scenario(load_scenario(SCENARIOS_DIR / "single-link-down.yaml"))  # no job: fine


# --------------------------------------------------------------------------------------------
# On the kernel


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_the_management_network_is_beside_the_rails() -> None:
    require_root()
    fabric = load_scenario(SCENARIOS_DIR / "job-link-down.yaml").fabric
    with Lab.from_fabric(fabric, management=True) as lab:
        for i, lh in enumerate(lab.hosts):
            assert str(lab.management_address(lh.name)) == f"10.99.0.{i + 1}"
            out = subprocess.run(
                ["ip", "-n", lh.netns, "-j", "addr", "show", "dev", "mgmt0"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            (link,) = json.loads(out)
            assert link["ifindex"] == 9 and "LOWER_UP" in link["flags"]
            inet = [a["local"] for a in link["addr_info"] if a["family"] == "inet"]
            assert inet == [f"10.99.0.{i + 1}"]
        out = subprocess.run(
            ["ip", "-n", lab.fabric_netns, "-j", "link", "show", "master", "mgmt"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert sorted(x["ifname"] for x in json.loads(out)) == ["m0", "m1", "m2", "m3"]
    assert lab.prefix not in "".join(netns_names())
    with Lab.from_fabric(fabric) as plain:  # without a job: no management network
        assert plain.management == {}


@pytest.mark.real
async def test_a_job_survives_one_host_link_down_with_linkguard(tmp_path: Path) -> None:
    require_root()
    require_binary("mosquitto")
    if torch_problem():
        missing(f"needs torch: {torch_problem()}")
    doc = {
        "schema": "linkguard.scenario/v1",
        "name": "job-2x2",
        "description": "A 2-rank job through one host link down.",
        "fabric": {"generate": {"hosts": 2, "rails": 2, "hosts_per_su": 2, "spines_per_su": 1}},
        "duration_s": 6,
        "damping": {"hold_down_initial_s": 0.5},
        "timeline": [
            {"at_s": 1, "kind": "link_down", "host": "gpu001", "rail": 1},
            {"at_s": 2, "kind": "link_up", "host": "gpu001", "rail": 1},
        ],
        "job": {"kind": "torch-gloo", "compute_ms": 20, "layers": 2, "warmup_steps": 10},
        "expect": {"job_rank_failures": 0},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    report = await run_lab(load_scenario(tmp_path / "job.yaml"), workdir=tmp_path / "run")
    text = report.text()
    assert report.passed, text
    (fault,) = report.faults
    assert fault.job is not None and fault.job.stall_ms is not None
    assert fault.job.rank_failures == 0 and fault.job.resumed, text
    assert fault.job.steps >= 5, text  # it stepped on after the fault, to the end (6 s)
    assert report.job is not None and report.job.rank_failures == 0
    assert report.job.buckets == 2 and report.job.devices == 2
    assert all(mb > 0.1 for mb in report.job.rail_mb.values()) and len(report.job.rail_mb) == 2
    assert f"job     stall {fault.job.stall_ms:.0f} ms" in text
    assert ("job_rank_failures", True) in [(e.name, e.held) for e in report.expectations]
    # all torn down: every namespace of this lab (others' labs may run meanwhile)
    assert report.netns_prefix is not None and report.netns_prefix.startswith("lg")
    assert not any(n.startswith(report.netns_prefix) for n in netns_names()), netns_names()
    print("\n" + text)
