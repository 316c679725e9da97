"""The ``job:`` block, the job expectations and ``agent_settings:`` of a scenario file."""

from __future__ import annotations

from pathlib import Path

import pytest

from linkguard.cli import main
from linkguard.simulations.jobspec import JobSpec, job_hosts
from linkguard.simulations.scenario import (
    SCENARIOS_DIR,
    dump_scenario,
    load_scenario,
)
from tests.simulations.test_scenario import base_doc, error, write


def job_doc(job: object = None, **over: object) -> dict:
    doc = base_doc(
        timeline=[
            {"at_s": 2, "kind": "link_down", "host": "gpu001", "rail": 1},
            {"at_s": 6, "kind": "link_up", "host": "gpu001", "rail": 1},
        ],
        job={"kind": "torch-gloo"} if job is None else job,
    )
    doc.update(over)
    return doc


def test_a_job_block_loads_with_its_defaults(tmp_path: Path) -> None:
    loaded = load_scenario(write(tmp_path, job_doc()))
    job = loaded.scenario.job
    assert job == JobSpec(kind="torch-gloo")
    assert (job.compute_ms, job.width, job.layers, job.batch, job.timeout_s) == (
        50.0,
        256,
        8,
        32,
        10.0,
    )
    assert job.warmup_steps == 20 and job.hosts is None
    assert job_hosts(job, loaded.fabric) == ["gpu000", "gpu001", "gpu002", "gpu003"]
    assert loaded.scenario.expect.job_rank_failures is None
    # a scenario without a job runs as before
    assert load_scenario(write(tmp_path, base_doc(), "plain.yaml")).scenario.job is None


def test_a_job_on_some_hosts_in_rank_order(tmp_path: Path) -> None:
    doc = job_doc({"kind": "torch-gloo", "hosts": ["gpu003", "gpu000"], "layers": 4})
    doc["expect"] = {"job_max_stall_ms": 300, "job_rank_failures": 0}
    loaded = load_scenario(write(tmp_path, doc))
    assert job_hosts(loaded.scenario.job, loaded.fabric) == ["gpu003", "gpu000"]
    assert loaded.scenario.expect.job_max_stall_ms == 300.0
    assert loaded.scenario.expect.job_rank_failures == 0
    again = load_scenario(write(tmp_path, dump_scenario(loaded.scenario), "again.yaml"))
    assert again.scenario == loaded.scenario


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"kind": "nccl"}, "job.kind: Input should be 'torch-gloo'"),
        ({}, "job.kind: Field required"),
        ({"kind": "torch-gloo", "compute_ms": -1}, "job.compute_ms: Input should be greater"),
        ({"kind": "torch-gloo", "timeout_s": 0}, "job.timeout_s: Input should be greater"),
        ({"kind": "torch-gloo", "layers": 0}, "job.layers: Input should be greater"),
        ({"kind": "torch-gloo", "warmup_steps": 2}, "job.warmup_steps: Input should be greater"),
        ({"kind": "torch-gloo", "width": "wide"}, "job.width: Input should be a valid integer"),
        ({"kind": "torch-gloo", "gpus": 4}, "job.gpus: Extra inputs are not permitted"),
        ({"kind": "torch-gloo", "compute_ms": ".nan"}, "job.compute_ms: Input should be"),
        ({"kind": "torch-gloo", "hosts": ["gpu000"]}, "job.hosts: List should have at least 2"),
        (
            {"kind": "torch-gloo", "hosts": ["gpu000", "gpu001", "gpu000"]},
            "job.hosts: a host runs one rank: gpu000 listed twice",
        ),
        ("torch-gloo", "job: Input should be a valid dictionary"),
    ],
)
def test_bad_job_values_name_the_field(tmp_path: Path, job: object, message: str) -> None:
    assert message in error(tmp_path, job_doc(job))


def test_job_checks_against_the_fabric(tmp_path: Path) -> None:
    assert error(tmp_path, job_doc({"kind": "torch-gloo", "hosts": ["gpu000", "gpu009"]})) == (
        "job: host 'gpu009' is not in the fabric"
    )
    assert error(tmp_path, job_doc({"kind": "torch-gloo", "layers": 3})) == (
        "job: layers 3 < the 4 GPU endpoints of gpu000: each layer is one DDP bucket (one "
        "all-reduce) per step, and the all-reduces rotate over the endpoints; give layers >= 4 "
        "so every rail carries traffic every step"
    )
    one_host = job_doc()
    one_host["fabric"] = {"generate": {"hosts": 1, "rails": 2, "hosts_per_su": 1}}
    one_host["timeline"] = []
    assert error(tmp_path, one_host) == (
        "job: needs at least 2 hosts (one rank each), the fabric has 1"
    )


def test_job_expectations_need_a_job(tmp_path: Path) -> None:
    for key, value in (("job_max_stall_ms", 300), ("job_rank_failures", 0)):
        doc = base_doc(expect={key: value})
        assert error(tmp_path, doc) == (
            f"expect.{key} needs a job: block (there is no job to measure)"
        )
    assert "expect.job_max_stall_ms: Input should be greater than 0" in error(
        tmp_path, job_doc(expect={"job_max_stall_ms": 0})
    )
    assert "expect.job_rank_failures: Input should be greater than or equal to 0" in error(
        tmp_path, job_doc(expect={"job_rank_failures": -1})
    )


def test_agent_settings_keys(tmp_path: Path) -> None:
    doc = base_doc(agent_settings={"routes.rto_min_ms": 20, "log_level": "debug"})
    loaded = load_scenario(write(tmp_path, doc))
    assert loaded.scenario.agent_settings == {"routes.rto_min_ms": 20, "log_level": "debug"}
    message = error(tmp_path, base_doc(agent_settings={"Routes.RTO": 20}))
    assert message.startswith("agent_settings.Routes.RTO.[key]: String should match pattern")
    assert "agent_settings: Input should be a valid dictionary" in error(
        tmp_path, base_doc(agent_settings=["log_level=debug"])
    )


def test_sim_check_refuses_agent_settings_the_agent_refuses(tmp_path: Path, capsys) -> None:
    """What ``sim lab`` would refuse before building a lab, ``sim check`` refuses too."""
    cases = {
        "nonsense": ({"nonsense": 1}, "nonsense"),
        "host": ({"host": "x"}, "agent setting host: the lab sets host itself"),
        "rto": ({"routes.rto_min_ms": "x"}, "routes.rto_min_ms"),
    }
    for name, (settings, message) in cases.items():
        (tmp_path / name).mkdir()
        path = write(tmp_path / name, base_doc(agent_settings=settings))
        assert main(["sim", "check", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert str(path) in err and message in err, err
    fine = write(tmp_path, base_doc(agent_settings={"routes.rto_min_ms": 20}))
    assert main(["sim", "check", str(fine)]) == 0


def test_sim_check_prints_the_job(capsys) -> None:
    assert main(["sim", "check", str(SCENARIOS_DIR / "job-link-down.yaml")]) == 0
    out = capsys.readouterr().out
    assert (
        "  job: torch-gloo, 4 ranks, 8 x Linear(256), compute 50 ms per step, collective "
        "timeout 10 s (sim lab only)\n"
    ) in out


def test_shipped_job_scenarios_check_for_no_rank_failure() -> None:
    for name in ("job-link-down", "job-flapping-link"):
        sc = load_scenario(SCENARIOS_DIR / f"{name}.yaml").scenario
        assert sc.job is not None and sc.job.kind == "torch-gloo"
        assert sc.expect.job_rank_failures == 0
        # the outages stay below the collective timeout: with linkguard no rank may fail
        assert sc.job.timeout_s == 10
