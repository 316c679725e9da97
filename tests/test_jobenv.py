"""``linkguard exec`` (linkguard.jobenv): the agent's files, written by the real NcclFiles from
the real monitor's states and the real solver's plans, merged into a command's environment;
the refusals and their exit codes; the command replacing the process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from linkguard.cli import build_parser
from linkguard.jobenv import (
    AGENT_LOCK,
    EXIT_NO_PLAN,
    EXIT_NO_USABLE_RAIL,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    FUSION_KEYS,
    AgentLock,
    agent_running,
    merge,
    parse_env_file,
    read_host_nccl,
)
from linkguard.nccl import NcclFiles
from tests.test_nccl import ALL8, FABRIC, HOST, Host

WITHOUT_3 = "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"
#: prints the NCCL variables of the environment it runs in, as JSON
SHOW = [sys.executable, "-c", "import json, os; print(json.dumps({k: v for k, v in "
        "os.environ.items() if k.startswith('NCCL_')}, sort_keys=True))"]  # fmt: skip


@pytest.fixture
def host() -> Host:
    return Host(FABRIC.host(HOST))


@pytest.fixture
def run(tmp_path: Path):
    """The agent's directory with its lock held, as a running agent holds it."""
    d = tmp_path / "run"
    lock = AgentLock(d)
    try:
        yield d
    finally:
        lock.release()


def lg_exec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``linkguard exec ARGS`` in a subprocess (the way torchrun and srun start it), with the
    test's environment minus LINKGUARD_* plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LINKGUARD_", "NCCL_"))}
    return subprocess.run(
        [sys.executable, "-m", "linkguard.cli", "exec", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
    )


def shown(out: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# -- the files and the merge, in process ---------------------------------------------------------


def test_reads_what_the_agent_wrote(host: Host, run: Path) -> None:
    host.down(3)
    host.up(3)  # back, held down: usable for NCCL (ACTIVE), but linkguard leaves it out
    plan = host.plan()
    NcclFiles(run).update(host.inv, host.states(), plan)
    doc = read_host_nccl(run)
    assert (doc.host, doc.epoch, doc.usable) == (HOST, plan.epoch, True)
    assert doc.env == {"NCCL_IB_HCA": WITHOUT_3}
    assert doc.left_out == ("mlx5_3:1 rail 3 (held_down)",)
    failover = read_host_nccl(run, "failover")
    assert failover.env["NCCL_NET_FORCE_MERGE"] == "mlx5_0:1,mlx5_1:1;mlx5_4:1,mlx5_5:1;" + (
        "mlx5_6:1,mlx5_7:1"
    )
    assert failover.warnings[0].startswith("fused NIC mlx5_2+mlx5_3 lost mlx5_3:1 (held_down)")


def test_linkguard_wins_unless_keep_env() -> None:
    job = {"PATH": "/bin", "NCCL_IB_HCA": ALL8, "NCCL_DEBUG": "INFO"}
    ours = {"NCCL_IB_HCA": WITHOUT_3}
    m = merge(job, ours)
    assert m.env == {"PATH": "/bin", "NCCL_IB_HCA": WITHOUT_3, "NCCL_DEBUG": "INFO"}
    assert m.replaced == [("NCCL_IB_HCA", ALL8, WITHOUT_3)] and m.kept == []
    kept = merge(job, ours, keep_env=True)
    assert kept.env == job and kept.kept == [("NCCL_IB_HCA", ALL8, WITHOUT_3)]
    # a value the job does not set is linkguard's either way; an equal one is no news
    assert merge({"PATH": "/bin"}, ours, keep_env=True).env["NCCL_IB_HCA"] == WITHOUT_3
    assert merge({"NCCL_IB_HCA": WITHOUT_3}, ours).replaced == []


def test_failover_file_owns_the_fusion_variables() -> None:
    job = {"NCCL_NET_FORCE_MERGE": "mlx5_2:1,mlx5_3:1", "NCCL_IB_MERGE_NICS": "1", "X": "y"}
    m = merge(job, {"NCCL_IB_HCA": WITHOUT_3}, profile="failover")
    assert m.env == {"NCCL_IB_HCA": WITHOUT_3, "X": "y"}
    assert m.removed == ["NCCL_IB_MERGE_NICS", "NCCL_NET_FORCE_MERGE"]
    assert set(m.removed) <= set(FUSION_KEYS)
    plain = merge(job, {"NCCL_IB_HCA": WITHOUT_3})  # the plain profile leaves them alone
    assert plain.env["NCCL_NET_FORCE_MERGE"] == "mlx5_2:1,mlx5_3:1"
    # --keep-env keeps the job's fusion, and says so (linkguard's value: unset)
    kept = merge(job, {"NCCL_IB_HCA": WITHOUT_3}, profile="failover", keep_env=True)
    assert kept.env == {**job, "NCCL_IB_HCA": WITHOUT_3} and kept.removed == []
    assert kept.kept == [
        ("NCCL_IB_MERGE_NICS", "1", ""),
        ("NCCL_NET_FORCE_MERGE", job["NCCL_NET_FORCE_MERGE"], ""),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "line 1 is not the agent's header"),
        ("NCCL_IB_HCA==mlx5_0:1\n", "line 1 is not the agent's header"),
        ("# linkguard NCCL settings for h, plan epoch x1\nNCCL_IB_HCA=a\n", "'x1' is not a num"),
        ("# linkguard NCCL settings for h, plan epoch 3\n", "no NCCL_* setting in it"),
        ("# linkguard NCCL settings for h, plan epoch 3\nLD_PRELOAD=/x.so\n", "not an NCCL_*"),
        ("# linkguard NCCL settings for h, plan epoch 3\nNCCL_A='open\n", "line 2: No closing"),
        ("# linkguard NCCL settings for h, plan epoch 3\nNCCL_A=1 NCCL_B=2\n", "KEY=VALUE"),
        ("# linkguard NCCL settings for h, plan epoch 3\njunk\n", "expected KEY=VALUE"),
    ],
)
def test_malformed_files_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_env_file(text, "/run/linkguard/nccl.env")


def test_agent_lock_tells_a_running_agent(tmp_path: Path) -> None:
    d = tmp_path / "run"
    assert agent_running(d) is False  # no lock file: no agent has run here
    lock = AgentLock(d)
    assert agent_running(d) is True
    assert (d / AGENT_LOCK).stat().st_mode & 0o777 == 0o644
    lock.release()
    assert agent_running(d) is False  # the file stays, nobody holds it
    (d / AGENT_LOCK).chmod(0o000)
    if os.geteuid() != 0:  # root reads it anyway
        assert agent_running(d) is None


# -- the command ----------------------------------------------------------------------------------


def test_exec_gives_the_command_the_usable_rails(host: Host, run: Path) -> None:
    host.down(3)
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    out = lg_exec("--dir", str(run), "--", *SHOW, env={"NCCL_IB_HCA": ALL8, "NCCL_DEBUG": "WARN"})
    assert shown(out) == {"NCCL_IB_HCA": WITHOUT_3, "NCCL_DEBUG": "WARN"}
    assert f"linkguard exec: NCCL_IB_HCA={ALL8} replaced by {WITHOUT_3}" in out.stderr
    assert "left out mlx5_3:1 rail 3 (down)" in out.stderr
    out = lg_exec("--dir", str(run), "--keep-env", "--", *SHOW, env={"NCCL_IB_HCA": "=mlx5_9"})
    assert shown(out) == {"NCCL_IB_HCA": "=mlx5_9"}
    assert f"NCCL_IB_HCA==mlx5_9 kept (--keep-env), linkguard's is {WITHOUT_3}" in out.stderr
    quiet = lg_exec("-q", "--dir", str(run), "--", *SHOW)
    assert shown(quiet) == {"NCCL_IB_HCA": WITHOUT_3} and quiet.stderr == ""
    # the command replaces the process: its exit code and pid are exec's
    out = lg_exec("--dir", str(run), "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert out.returncode == 7


def test_exec_failover_profile(host: Host, run: Path) -> None:
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    out = lg_exec("--dir", str(run), "--profile", "failover", "--", *SHOW)
    assert shown(out) == {
        "NCCL_IB_HCA": ALL8,
        "NCCL_IB_MERGE_NICS": "1",
        "NCCL_IB_RESILIENCY_PORT_FAILOVER": "1",
        "NCCL_NET_FORCE_MERGE": "mlx5_0:1,mlx5_1:1;mlx5_2:1,mlx5_3:1;"
        "mlx5_4:1,mlx5_5:1;mlx5_6:1,mlx5_7:1",
        "NCCL_NET_MERGE_LEVEL": "LOC",
    }
    assert shown(lg_exec("--dir", str(run), "--profile", "default", "--", *SHOW)) == {
        "NCCL_IB_HCA": ALL8
    }
    # a port of mlx5_2+mlx5_3 lost: the file fuses that pair no more; the job's own fusion of
    # it is removed, or with --keep-env kept and said
    host.down(3)
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    stale = {"NCCL_NET_FORCE_MERGE": "mlx5_2:1,mlx5_3:1"}
    args = ("--dir", str(run), "--profile", "failover")
    out = lg_exec(*args, "--", *SHOW, env={"NCCL_IB_MERGE_NICS": "1", **stale})
    assert shown(out)["NCCL_NET_FORCE_MERGE"] == "mlx5_0:1,mlx5_1:1;mlx5_4:1,mlx5_5:1;" + (
        "mlx5_6:1,mlx5_7:1"
    )
    out = lg_exec(*args, "--keep-env", "--", *SHOW, env=stale)
    assert shown(out)["NCCL_NET_FORCE_MERGE"] == "mlx5_2:1,mlx5_3:1"
    assert (
        "NCCL_NET_FORCE_MERGE=mlx5_2:1,mlx5_3:1 kept (--keep-env), linkguard's is "
        "mlx5_0:1,mlx5_1:1;mlx5_4:1,mlx5_5:1;mlx5_6:1,mlx5_7:1"
    ) in out.stderr
    for rail in (0, 4, 6):  # every pair lost a port: the file fuses nothing
        host.down(rail)
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    out = lg_exec(*args, "--keep-env", "--", *SHOW, env=stale)
    assert shown(out)["NCCL_NET_FORCE_MERGE"] == "mlx5_2:1,mlx5_3:1"
    assert (
        "NCCL_NET_FORCE_MERGE=mlx5_2:1,mlx5_3:1 kept (--keep-env), though nccl-failover.env "
        "does not set it: a fusion of a pair that lost a port is fatal at its next loss"
    ) in out.stderr
    assert "NCCL_NET_FORCE_MERGE" not in shown(lg_exec(*args, "--", *SHOW, env=stale))


def test_no_current_plan_exits_75(host: Host, tmp_path: Path) -> None:
    d = tmp_path / "run"
    out = lg_exec("--dir", str(d), "--", "true")
    assert out.returncode == EXIT_NO_PLAN
    assert f"no current plan: {d}/nccl.env does not exist" in out.stderr
    NcclFiles(d).update(host.inv, host.states(), host.plan())  # files, but no agent running
    out = lg_exec("--dir", str(d), "--", "true")
    assert out.returncode == EXIT_NO_PLAN
    assert f"no agent holds {d}/agent.lock (the agent is not running)" in out.stderr
    allowed = lg_exec("--dir", str(d), "--allow-no-plan", "--", *SHOW, env={"NCCL_IB_HCA": "x"})
    assert shown(allowed) == {"NCCL_IB_HCA": "x"}  # the job's environment unchanged
    assert "running without linkguard's settings (--allow-no-plan)" in allowed.stderr
    lock = AgentLock(d)
    try:  # a malformed file is no plan either, and names what is wrong
        (d / "nccl.env").write_text("# linkguard NCCL settings for gpu000, plan epoch 4\nrm -rf\n")
        out = lg_exec("--dir", str(d), "--", "true")
        assert out.returncode == EXIT_NO_PLAN
        assert "malformed file: " in out.stderr and "line 2: expected KEY=VALUE" in out.stderr
        (d / "nccl.env").write_bytes(b"\xff\xfe")
        assert lg_exec("--dir", str(d), "--", "true").returncode == EXIT_NO_PLAN
    finally:
        lock.release()


def test_no_usable_rail_exits_69(host: Host, run: Path) -> None:
    for rail in range(8):
        host.down(rail)
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    assert (run / "nccl.env").read_text().endswith("NCCL_IB_DISABLE=1\n")
    out = lg_exec("--dir", str(run), "--", "true", env={"NCCL_IB_HCA": ALL8})
    assert out.returncode == EXIT_NO_USABLE_RAIL
    assert "no usable rail on gpu000" in out.stderr and "mlx5_7:1 rail 7 (down)" in out.stderr
    allowed = lg_exec("--dir", str(run), "--allow-no-usable-rail", "--", *SHOW)
    assert shown(allowed) == {"NCCL_IB_DISABLE": "1"}


def test_command_errors(host: Host, run: Path, tmp_path: Path) -> None:
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    out = lg_exec("--dir", str(run), "--", "no-such-command-lg")
    assert (
        out.returncode == EXIT_NOT_FOUND and "no-such-command-lg: command not found" in out.stderr
    )
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\n")
    out = lg_exec("--dir", str(run), "--", str(script))
    assert out.returncode == EXIT_NOT_EXECUTABLE and "Permission denied" in out.stderr
    out = lg_exec("--dir", str(run))
    assert out.returncode == 2 and "no command" in out.stderr
    out = lg_exec("--dir", str(run), "--profile", "fast", "--", "true")
    assert out.returncode == 2 and "choose plain (alias default) or failover" in out.stderr
    out = lg_exec("--dir", str(run), "-c", "x.yaml", "--", "true")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr


def test_directory_from_the_config_or_the_environment(host: Host, run: Path) -> None:
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    cfg = run.parent / "agent.yaml"
    cfg.write_text(yaml.safe_dump({"host": HOST, "rail_map_path": str(run / "rail-map.json")}))
    assert shown(lg_exec("-c", str(cfg), "--", *SHOW)) == {"NCCL_IB_HCA": ALL8}
    env = {"LINKGUARD_RAIL_MAP_PATH": str(run / "rail-map.json")}
    assert shown(lg_exec("--", *SHOW, env=env)) == {"NCCL_IB_HCA": ALL8}
    cfg.write_text("rail_map_path: [1, 2]\n")
    out = lg_exec("-c", str(cfg), "--", "true")
    assert out.returncode == 2 and "rail_map_path" in out.stderr


def test_exec_imports_no_heavy_module(host: Host, run: Path) -> None:
    """The path every worker start takes: the CLI entry point loads neither asyncio nor
    pydantic nor the other commands' modules (seen by an audit hook at the moment of exec)."""
    NcclFiles(run).update(host.inv, host.states(), host.plan())
    probe = (
        "import os, sys\n"
        "seen = []\n"
        "def hook(event, args):\n"
        "    if event == 'os.exec' and not seen:  # execvpe tries each PATH entry\n"
        "        seen.append(event)\n"
        "        heavy = sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "            ('asyncio', 'pydantic', 'structlog', 'yaml', 'defusedxml')\n"
        "            or m in ('linkguard.config', 'linkguard.nccl', 'linkguard.models'))\n"
        "        os.write(1, repr(heavy).encode())\n"
        "sys.addaudithook(hook)\n"
        "from linkguard.cli import main\n"
        f"main(['exec', '--dir', {str(run)!r}, '--', 'true'])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[]"


def test_readme_commands_table_lists_every_command() -> None:
    """The commands table (docs/commands.md, once the README's) lists every command, and the
    Jobs section (docs/jobs.md) every exit code of `linkguard exec`."""
    docs = Path(__file__).parents[1] / "docs"
    readme = (docs / "commands.md").read_text()
    table = readme.split("# Commands\n", 1)[1].strip().split("\n\n", 1)[0]
    listed = set(re.findall(r"^\| `linkguard ([a-z]+)", table, re.M))
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert listed == set(sub.choices)  # type: ignore[attr-defined]
    readme = (docs / "jobs.md").read_text()
    jobs = readme.split("\n## Jobs\n", 1)[1].split("\n## ", 1)[0]
    for code in (EXIT_NO_USABLE_RAIL, EXIT_NO_PLAN, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND):
        assert f"`{code}`" in jobs
