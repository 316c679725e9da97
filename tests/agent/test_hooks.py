"""Job-facing hooks with real scripts and real processes: the change arrives on stdin exactly as
the agent built it, a hanging hook is killed with its process group at its timeout, failures are
retried with growing backoff, a newer change replaces a pending retry, the drain/resume
conditions fire on crossings only, and the agent applies and acks plans while a hook hangs.
The shipped examples (deploy/hooks/) run here too."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from linkguard.agent.hooks import HookRunner, backoff_delay, triggers
from linkguard.agent.railmap import RailChanges, rail_view
from linkguard.config import AgentSettings, ConfigError, HookSettings
from linkguard.models import PortState, PortStatus
from tests.agent.rail_rig import HOST, alive, rail_map, running_agent, script
from tests.support import until

ROOT = Path(__file__).resolve().parents[2]
SLURM_DRAIN = ROOT / "deploy" / "hooks" / "slurm-drain"
NOTIFY = ROOT / "deploy" / "hooks" / "notify-training"

RECORD = """
import json, os, pathlib, sys
data = sys.stdin.buffer.read()
doc = json.loads(data)
out = pathlib.Path(os.environ["OUT_DIR"])
(out / f"{doc['seq']:04d}-{os.environ['LINKGUARD_HOOK_ATTEMPT']}.json").write_bytes(data)
"""


def change(seq: int, lost: list[int], gpus: dict[str, str] | None = None) -> dict[str, Any]:
    """A change document as :class:`RailChanges` makes them (4 rails, GPU g on mlx5_g)."""
    changes = RailChanges(HOST)
    changes.seq = seq - 1
    gpus = gpus or {str(g): f"mlx5_{g}:1" for g in range(4)}
    states = [
        PortState(
            host=HOST,
            hca=f"mlx5_{r}",
            port=1,
            rail=r,
            status=PortStatus.DOWN if r in lost else PortStatus.UP,
            usable=r not in lost,
            observed_at=1.0,
        )
        for r in range(4)
    ]
    view = rail_view(plan=None, rails={f"mlx5_{r}/1": r for r in range(4)}, states=states)
    doc = changes.observe(view, now=1000.0 + seq, reason="plan")
    assert doc is not None
    return {**doc, "rail_map_after": gpus, "rail_map_before": {}}


def hook(name: str, path: Path, **kw: Any) -> HookSettings:
    return HookSettings(name=name, argv=[str(path)], **kw)


async def started(runner: HookRunner) -> asyncio.Task[None]:
    return asyncio.create_task(runner.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# -- settings ---------------------------------------------------------------------------------


def test_argv_is_a_list_with_a_command_that_exists(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a shell string"):
        HookSettings(name="x", argv="scontrol update NodeName=a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not found on PATH"):
        HookSettings(name="x", argv=["scontrol update NodeName=a"])
    with pytest.raises(ValueError, match="absolute path"):
        HookSettings(name="x", argv=["./hook"])
    plain = tmp_path / "plain"
    plain.write_text("not executable")
    with pytest.raises(ValueError, match="not an executable"):
        HookSettings(name="x", argv=[str(plain)])
    with pytest.raises(ValueError, match="at least 1"):
        HookSettings(name="x", argv=[])
    ok = HookSettings(name="x", argv=["true", "a b"], when="whole_again")
    assert ok.when == ["whole_again"]
    with pytest.raises(ValueError, match="unique"):
        AgentSettings(host="h", hooks=[ok, ok])
    gone = script(tmp_path, "gone", "")
    settings = hook("gone", gone)
    gone.unlink()
    with pytest.raises(ConfigError, match=r"hooks\[gone\]\.argv"):
        HookRunner([settings])


def test_conditions_fire_on_crossings() -> None:
    drain = HookSettings(name="d", argv=["true"], when=["lost_above", "whole_again"], lost_above=1)
    lost = [0, 1, 2, 3, 1, 2, 0, 0, 2]
    fired, before = [], None
    for n in lost:
        fired.append(triggers(drain, before, n))
        before = n
    assert fired == [
        ["whole_again"],  # the first change after a start: resume (the script checks why)
        [],
        ["lost_above"],
        [],
        [],
        ["lost_above"],  # above N again after dropping to N: said again (DRAIN is idempotent)
        ["whole_again"],
        [],
        ["lost_above"],
    ]
    every = HookSettings(name="e", argv=["true"])
    assert all(triggers(every, b, a) == ["change"] for b, a in [(None, 0), (0, 0), (3, 1)])
    slow = HookSettings(name="s", argv=["true"], backoff_s=0.5, backoff_max_s=3)
    assert [backoff_delay(slow, n) for n in (1, 2, 3, 4, 5)] == [0.5, 1, 2, 3, 3]


# -- runs -------------------------------------------------------------------------------------


async def test_hook_gets_the_change_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LINKGUARD_BUS__PASSWORD", "s3cret")  # the agent's, not the hook's
    rec = script(
        tmp_path,
        "record",
        RECORD + "(out / 'env.json').write_text(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith(('LINKGUARD', 'SITE'))}))\n",
    )
    runner = HookRunner([hook("record", rec, env={"OUT_DIR": str(tmp_path), "SITE": "a"})])
    task = await started(runner)
    try:
        doc = change(1, [2])
        runner.submit(doc)
        out = tmp_path / "0001-1.json"
        await until(lambda: runner.stats["record"].succeeded == 1, "the hook ran")
        assert json.loads(out.read_bytes()) == {**doc, "trigger": ["change"]}
        assert out.read_bytes().endswith(b"\n") and out.read_bytes().count(b"\n") == 1
        assert runner.stats["record"].last_seq == 1
        assert runner.stats["record"].failed == {}
        assert json.loads((tmp_path / "env.json").read_text()) == {
            "LINKGUARD_HOOK": "record",
            "LINKGUARD_HOOK_ATTEMPT": "1",
            "SITE": "a",
        }
    finally:
        await stop(task)


async def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    hang = script(
        tmp_path,
        "hang",
        f"""
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])  # in the hook's process group
open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
sys.stderr.write("waiting for the scheduler\\n"); sys.stderr.flush()
time.sleep(300)
""",
    )
    runner = HookRunner([hook("hang", hang, timeout_s=0.5, retries=0)], kill_grace_s=0.2)
    task = await started(runner)
    try:
        with capture_logs() as logs:
            t0 = time.monotonic()
            runner.submit(change(1, [1, 2]))
            await until(lambda: runner.stats["hang"].failed["timeout"] == 1, "the timeout")
            took = time.monotonic() - t0
            await until(lambda: runner.stats["hang"].gave_up == 1, "given up (no retries)")
        hook_pid, child_pid = map(int, pids.read_text().split())
        await until(lambda: not alive(hook_pid) and not alive(child_pid), "both killed", 5)
        assert 0.5 <= took < 3, took
        failed = next(e for e in logs if e["event"] == "hook_failed")
        assert failed["hook"] == "hang" and failed["kind"] == "timeout"
        assert failed["stderr_tail"] == "waiting for the scheduler"
    finally:
        await stop(task)


async def test_failure_is_retried_with_backoff_then_succeeds(tmp_path: Path) -> None:
    tries = tmp_path / "tries"
    flaky = script(
        tmp_path,
        "flaky",
        f"""
import sys, time
sys.stdin.read()
with open({str(tries)!r}, "a") as f:
    f.write(f"{{time.monotonic()}}\\n")
n = len(open({str(tries)!r}).read().split())
if n < 3:
    sys.stderr.write(f"slurmctld not responding (try {{n}})\\n")
    sys.exit(3)
""",
    )
    runner = HookRunner([hook("flaky", flaky, retries=4, backoff_s=0.3)])
    task = await started(runner)
    try:
        with capture_logs() as logs:
            runner.submit(change(1, [0]))
            await until(lambda: runner.stats["flaky"].succeeded == 1, "third attempt ok")
        at = [float(t) for t in tries.read_text().split()]
        assert len(at) == 3
        gaps = [b - a for a, b in itertools.pairwise(at)]
        assert 0.3 <= gaps[0] < 0.3 + 1.0 and 0.6 <= gaps[1] < 0.6 + 1.0, gaps  # doubling
        st = runner.stats["flaky"]
        assert (st.attempts, st.failed["exit"], st.retried, st.gave_up) == (3, 2, 2, 0)
        failed = [e for e in logs if e["event"] == "hook_failed"]
        assert [e["stderr_tail"] for e in failed] == [
            "slurmctld not responding (try 1)",
            "slurmctld not responding (try 2)",
        ]
        assert [e["detail"] for e in failed] == ["exit status 3"] * 2
        assert [e["retry_in_s"] for e in failed] == [0.3, 0.6]
    finally:
        await stop(task)


async def test_gives_up_after_the_last_retry(tmp_path: Path) -> None:
    broken = script(tmp_path, "broken", "import sys; sys.exit(1)\n")
    runner = HookRunner([hook("broken", broken, retries=2, backoff_s=0.05)])
    task = await started(runner)
    try:
        runner.submit(change(1, [0]))
        await until(lambda: runner.stats["broken"].gave_up == 1, "given up")
        st = runner.stats["broken"]
        assert (st.attempts, st.failed["exit"], st.succeeded) == (3, 3, 0)
    finally:
        await stop(task)


async def test_spawn_failure_is_counted_and_retried(tmp_path: Path) -> None:
    bad = tmp_path / "bad-interpreter"
    bad.write_text("#!/nonexistent/interpreter\n")
    bad.chmod(0o755)
    runner = HookRunner([hook("bad", bad, retries=1, backoff_s=0.05)])
    task = await started(runner)
    try:
        runner.submit(change(1, []))
        await until(lambda: runner.stats["bad"].gave_up == 1, "given up")
        assert runner.stats["bad"].failed["spawn"] == 2
        assert "No such file" in (runner.stats["bad"].last_error or "")
    finally:
        await stop(task)


async def test_a_newer_change_supersedes_a_pending_retry(tmp_path: Path) -> None:
    picky = script(
        tmp_path,
        "picky",
        RECORD + "sys.exit(1 if doc['seq'] == 1 else 0)\n",
    )
    # a retry of change 1 would wait 30 s: change 2 must run at once instead
    runner = HookRunner(
        [hook("picky", picky, retries=5, backoff_s=30, env={"OUT_DIR": str(tmp_path)})]
    )
    task = await started(runner)
    try:
        first = {**change(1, [0]), "rail_map_before": {"0": "mlx5_0:1"}}
        runner.submit(first)
        await until(lambda: runner.stats["picky"].failed["exit"] == 1, "change 1 failed")
        t0 = time.monotonic()
        second = change(2, [0, 1])
        runner.submit(second)
        await until(lambda: runner.stats["picky"].succeeded == 1, "change 2 ran")
        assert time.monotonic() - t0 < 5
        assert sorted(p.name for p in tmp_path.glob("0*.json")) == ["0001-1.json", "0002-1.json"]
        got = json.loads((tmp_path / "0002-1.json").read_text())
        # the latest state, with the map from before the change the hook never took
        assert got == {**second, "rail_map_before": {"0": "mlx5_0:1"}, "trigger": ["change"]}
        assert runner.stats["picky"].superseded == 1
        assert runner.stats["picky"].gave_up == 0
    finally:
        await stop(task)


async def test_changes_while_a_hook_runs_coalesce_to_the_latest(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    slow = script(
        tmp_path,
        "slow",
        RECORD + f"import time\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.01)\n",
    )
    runner = HookRunner([hook("slow", slow, env={"OUT_DIR": str(tmp_path)})])
    task = await started(runner)
    try:
        runner.submit(change(1, []))
        await until(lambda: (tmp_path / "0001-1.json").exists(), "change 1 running")
        for seq in range(2, 12):
            runner.submit(change(seq, [seq % 4]))
        gate.touch()
        await until(lambda: runner.stats["slow"].succeeded == 2, "the latest ran")
        assert sorted(p.name for p in tmp_path.glob("0*.json")) == ["0001-1.json", "0011-1.json"]
        assert runner.stats["slow"].superseded == 9
    finally:
        await stop(task)


# -- the shipped examples ---------------------------------------------------------------------


def _run(path: Path, doc: dict[str, Any], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(path)],
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=30,
        check=False,
    )


def test_slurm_drain_dry_run() -> None:
    drain = _run(SLURM_DRAIN, change(1, [1, 3]), DRY_RUN="1", MAX_LOST_RAILS="1")
    assert drain.returncode == 0, drain.stderr
    assert drain.stdout == (
        f'scontrol update NodeName={HOST} State=DRAIN Reason="linkguard: 2 rails down"\n'
    )
    one = _run(SLURM_DRAIN, change(2, [3]), DRY_RUN="1", MAX_LOST_RAILS="1")
    assert one.returncode == 0 and "nothing to do" in one.stdout and "scontrol" not in one.stdout
    whole = _run(SLURM_DRAIN, change(3, []), DRY_RUN="1", SLURM_NODE_NAME="node17")
    assert whole.returncode == 0
    assert whole.stdout == "scontrol update NodeName=node17 State=RESUME\n"
    bad = _run(SLURM_DRAIN, {"nope": 1}, DRY_RUN="1")
    assert bad.returncode == 2 and "bad input" in bad.stderr


def test_slurm_drain_resumes_only_its_own_drain(tmp_path: Path) -> None:
    """Against a stand-in scontrol (Slurm is not installed here) that logs its arguments."""
    calls = tmp_path / "calls"
    reason = tmp_path / "reason"
    fake = script(
        tmp_path,
        "scontrol",
        f"""
import sys
open({str(calls)!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "show":
    print(f"NodeName={{sys.argv[-1]}} State=IDLE+DRAIN Reason={{open({str(reason)!r}).read()}}")
""",
    )
    reason.write_text("maintenance [root@2026-12-01T00:00:00]")
    kept = _run(SLURM_DRAIN, change(1, []), SCONTROL=str(fake))
    assert kept.returncode == 0 and "not drained by linkguard" in kept.stdout
    drain = _run(SLURM_DRAIN, change(2, [0, 1, 2]), SCONTROL=str(fake))
    assert drain.returncode == 0
    reason.write_text("linkguard: 3 rails down [linkguard@2026-12-01T00:00:01]")
    resumed = _run(SLURM_DRAIN, change(3, []), SCONTROL=str(fake))
    assert resumed.returncode == 0
    assert calls.read_text().splitlines() == [
        f"show node -o {HOST}",
        f"update NodeName={HOST} State=DRAIN Reason=linkguard: 3 rails down",
        f"show node -o {HOST}",
        f"update NodeName={HOST} State=RESUME",
    ]
    failing = script(tmp_path, "scontrol-down", "import sys; sys.exit(1)\n")
    assert _run(SLURM_DRAIN, change(4, [0, 1]), SCONTROL=str(failing)).returncode == 1


async def test_slurm_drain_as_a_hook_drains_past_n_and_resumes_when_whole() -> None:
    runner = HookRunner(
        [
            HookSettings(
                name="slurm-drain",
                argv=[str(SLURM_DRAIN)],
                when=["lost_above", "whole_again"],
                lost_above=1,
                env={"DRY_RUN": "1", "MAX_LOST_RAILS": "1"},
            )
        ]
    )
    task = await started(runner)
    try:
        with capture_logs() as logs:
            for seq, lost in enumerate(([], [2], [1, 2], [0, 1, 2], [1], []), start=1):
                runner.submit(change(seq, lost))
                await until(runner.idle, f"change {seq} handled")
        ran = [(e["seq"], e["trigger"], e["stdout_tail"]) for e in logs if e["event"] == "hook_ran"]
        assert ran == [
            (1, ["whole_again"], f"scontrol update NodeName={HOST} State=RESUME"),
            (
                3,
                ["lost_above"],
                f'scontrol update NodeName={HOST} State=DRAIN Reason="linkguard: 2 rails down"',
            ),
            (6, ["whole_again"], f"scontrol update NodeName={HOST} State=RESUME"),
        ]
    finally:
        await stop(task)


async def test_notify_training_writes_the_file_and_signals_the_job(tmp_path: Path) -> None:
    got = tmp_path / "got-signal"
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import pathlib, signal, sys, time\n"
            f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path({str(got)!r}).touch())\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert job.stdout is not None and job.stdout.readline() == b"ready\n"
        pid_file = tmp_path / "trainer.pid"
        pid_file.write_text(f"{job.pid}\n")
        target = tmp_path / "run" / "rail-change.json"
        doc = change(5, [2])
        done = _run(NOTIFY, doc, RAIL_CHANGE_FILE=str(target), PID_FILE=str(pid_file))
        assert done.returncode == 0, done.stderr
        assert json.loads(target.read_text()) == doc
        assert target.stat().st_mode & 0o777 == 0o644
        await until(got.exists, "the job's SIGUSR1 handler ran")
    finally:
        job.kill()
        job.wait()
    # the job is gone: nothing to tell, not a failure
    gone = _run(NOTIFY, change(6, []), RAIL_CHANGE_FILE=str(target), PID_FILE=str(pid_file))
    assert gone.returncode == 0 and "gone" in gone.stdout


# -- in the agent -----------------------------------------------------------------------------


async def test_agent_runs_hooks_with_its_rail_map(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    rec = script(tmp_path, "record", RECORD)
    hooks = [hook("record", rec, env={"OUT_DIR": str(out)})]
    async with running_agent(tmp_path, hooks=hooks) as rig:
        whole = await rig.plan(10)
        await until(lambda: rig.acked(10), "plan 10 acked")
        lost = await rig.plan(11, {1})
        await until(lambda: rig.acked(11), "plan 11 acked")
        await until(
            lambda: any(json.loads(p.read_text())["epoch"] == 11 for p in out.glob("*.json")),
            "the hook saw epoch 11",
        )
        docs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
        last = docs[-1]
        # exactly the document the agent built, as it built it
        assert last == {**rig.agent.rail_changes.last, "trigger": ["change"]}
        assert last["host"] == HOST and last["reason"] == "plan"
        assert last["rails_lost"] == [1] and last["rails_usable"] == [0, 2, 3]
        assert last["rails_total"] == 4
        assert last["rail_map_before"] == rail_map(whole)
        assert last["rail_map_after"] == rail_map(lost) != rail_map(whole)
        assert last["ports_down"] == last["ports_held_down"] == last["ports_suppressed"] == []
        assert docs[-2]["epoch"] == 10 and docs[-2]["rails_lost"] == []
        assert [d["seq"] for d in docs] == list(range(1, len(docs) + 1))


async def test_agent_applies_and_acks_while_a_hook_hangs(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    hang = script(
        tmp_path,
        "hang",
        f"import os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}} ')\ntime.sleep(300)\n",
    )
    hooks = [hook("hang", hang, timeout_s=120, retries=0)]
    async with running_agent(tmp_path, hooks=hooks) as rig:
        await until(pids.exists, "the hook is running")
        t0 = time.monotonic()
        for epoch in range(20, 26):
            plan = await rig.plan(epoch, {epoch % 4})
            await until(lambda e=epoch: rig.acked(e), f"plan {epoch} acked", 5)
            assert rig.agent.applier.plan is not None
            assert rig.agent.applier.plan.same_assignments(plan)
        took = time.monotonic() - t0
        # a local fast path too: the backup is applied while the hook still hangs
        rig.agent.source.link_down("mlx5_0")
        await until(lambda: rig.agent.stats.fast_paths == 1, "the fast path")
        runner = rig.agent.hooks
        assert runner.stats["hang"].attempts == 1 and runner._hooks[0].running is not None
        assert runner._hooks[0].pending is not None  # the latest change waits its turn
        assert took < 5, took
        pid = int(pids.read_text().split()[0])
        assert alive(pid)
    # the agent stopped: the hook it was running is gone with it
    await until(lambda: not alive(pid), "the hook killed at stop", 5)


def test_hook_examples_are_executable() -> None:
    for path in (SLURM_DRAIN, NOTIFY):
        assert os.access(path, os.X_OK), path
        assert path.read_text().startswith("#!/usr/bin/env python3\n")
    assert signal.SIGUSR1  # the default signal of notify-training exists here
