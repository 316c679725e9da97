"""The ``srun`` line of docs/jobs.md, for real: ``srun --ntasks=2 linkguard exec --dir DIR -- python
WORKER`` on a private one-node Slurm cluster on 127.0.0.1 (tests/slurmcluster.py: its own
munged, slurmctld and slurmd), with a real agent (simulated ports, in-memory bus) writing the
files ``exec`` reads:

* every task gets the usable rails, as Slurm starts it: rank (``SLURM_PROCID``) 0 and 1 both
  with both rails; after the agent loses rail 0, the tasks of the next ``srun`` without it;
* ``exec`` replaces the process slurmstepd started: the worker's pid is Slurm's
  ``SLURM_TASK_PID`` and its parent is ``slurmstepd`` (no process in between);
* a refusal reaches the job script as ``srun``'s own exit code: 69 with no usable rail, 75
  with no current plan (no files; files but no agent running), and the worker never starts.

The workers are plain Python: they record their environment and exit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from linkguard.jobenv import EXIT_NO_PLAN, EXIT_NO_USABLE_RAIL, read_host_nccl
from tests.agent.rail_rig import HOST, running_agent
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.support import until
from tests.test_jobs_torchrun import BOTH, FABRIC, agent_with_both_rails

pytestmark = pytest.mark.real

#: records what the task sees, as ``OUT/task-<SLURM_PROCID>.json``
WORKER = """
import json, os, sys
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ["SLURM_PROCID"]
parent = Path(f"/proc/{os.getppid()}/comm").read_text().strip()
doc = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "SLURM_"))}
doc.update(pid=os.getpid(), parent=parent)
tmp = out / f".task-{rank}.tmp"
tmp.write_text(json.dumps(doc))
tmp.rename(out / f"task-{rank}.json")
"""
SRUN_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    """One cluster for the module (about 1 s to start): every test's srun is its own job."""
    with slurm_cluster() as c:
        yield c


@dataclass
class Srun:
    returncode: int
    stderr: str
    #: SLURM_PROCID -> what that task recorded (none when exec refused to start it)
    tasks: dict[int, dict]


async def srun(cluster: SlurmCluster, run_dir: Path, out: Path) -> Srun:
    """``srun --ntasks=2 linkguard exec --dir RUN_DIR -- python WORKER OUT`` on ``cluster``,
    with the test's environment minus NCCL_* and LINKGUARD_* (srun passes it to the tasks);
    its own session, killed if still running after :data:`SRUN_TIMEOUT_S`."""
    out.mkdir()
    script = out.parent / f"{out.name}-worker.py"
    script.write_text(textwrap.dedent(WORKER))
    linkguard = Path(sys.executable).parent / "linkguard"
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("NCCL_", "LINKGUARD_"))}
    proc = await asyncio.create_subprocess_exec(
        cluster.binaries["srun"],
        "--ntasks=2",
        "--time=1",  # Slurm ends the job after a minute, should the test not
        f"--job-name={out.name}",
        str(linkguard),
        "exec",
        "--dir",
        str(run_dir),
        "--",
        sys.executable,
        str(script),
        str(out),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), SRUN_TIMEOUT_S)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    assert proc.returncode is not None
    tasks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("task-*")}
    return Srun(proc.returncode, err.decode(errors="replace"), tasks)


def assert_started_by_slurm(run: Srun) -> None:
    """Two tasks, ranks 0 and 1 of one job step, each the very process slurmstepd forked."""
    assert run.returncode == 0, run.stderr
    assert sorted(run.tasks) == [0, 1], run.stderr
    assert len({t["SLURM_JOB_ID"] for t in run.tasks.values()}) == 1
    for rank, task in run.tasks.items():
        assert task["SLURM_PROCID"] == str(rank)
        assert task["SLURM_NTASKS"] == "2"
        assert task["pid"] == int(task["SLURM_TASK_PID"])  # exec kept slurmstepd's child's pid
        assert task["parent"] == "slurmstepd"


async def test_srun_tasks_get_the_rails_usable_when_they_start(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    async with running_agent(tmp_path, fabric=FABRIC) as rig:
        run_dir = await agent_with_both_rails(rig)
        first = await srun(cluster, run_dir, tmp_path / "first")
        assert_started_by_slurm(first)
        assert {t["NCCL_IB_HCA"] for t in first.tasks.values()} == {BOTH}
        assert rig.source is not None
        rig.source.link_down("mlx5_0", 1)  # the agent loses rail 0 between the two jobs
        await until(
            lambda: read_host_nccl(run_dir).env == {"NCCL_IB_HCA": "=mlx5_1:1"},
            "nccl.env without rail 0",
        )
        second = await srun(cluster, run_dir, tmp_path / "second")
    assert_started_by_slurm(second)
    assert {t["NCCL_IB_HCA"] for t in second.tasks.values()} == {"=mlx5_1:1"}
    assert second.tasks[0]["SLURM_JOB_ID"] != first.tasks[0]["SLURM_JOB_ID"]


async def test_no_usable_rail_is_srun_exit_69(cluster: SlurmCluster, tmp_path: Path) -> None:
    async with running_agent(tmp_path, fabric=FABRIC) as rig:
        run_dir = await agent_with_both_rails(rig)
        assert rig.source is not None
        rig.source.link_down("mlx5_0", 1)
        rig.source.link_down("mlx5_1", 1)
        await until(lambda: not read_host_nccl(run_dir).usable, "nccl.env with no usable rail")
        assert read_host_nccl(run_dir).env == {"NCCL_IB_DISABLE": "1"}
        run = await srun(cluster, run_dir, tmp_path / "out")
    assert run.returncode == EXIT_NO_USABLE_RAIL, run.stderr
    assert run.tasks == {}  # the worker never started
    assert run.stderr.count(f"linkguard exec: no usable rail on {HOST}") == 2  # one per task
    assert f"tasks 0-1: Exited with exit code {EXIT_NO_USABLE_RAIL}" in run.stderr


async def test_no_current_plan_is_srun_exit_75(cluster: SlurmCluster, tmp_path: Path) -> None:
    empty = tmp_path / "empty"  # no agent ever wrote here
    empty.mkdir()
    run = await srun(cluster, empty, tmp_path / "no-files")
    assert run.returncode == EXIT_NO_PLAN, run.stderr
    assert run.tasks == {}
    assert run.stderr.count(f"no current plan: {empty}/nccl.env does not exist") == 2
    assert f"tasks 0-1: Exited with exit code {EXIT_NO_PLAN}" in run.stderr
    async with running_agent(tmp_path / "agent", fabric=FABRIC) as rig:
        run_dir = await agent_with_both_rails(rig)
    assert (run_dir / "nccl.env").exists()  # the files stay; the agent's lock went with it
    run = await srun(cluster, run_dir, tmp_path / "agent-gone")
    assert run.returncode == EXIT_NO_PLAN, run.stderr
    assert run.tasks == {}
    assert run.stderr.count(f"no agent holds {run_dir}/agent.lock") == 2
