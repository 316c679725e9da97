"""A private one-node Slurm cluster on 127.0.0.1 (Debian ``slurm-wlm`` 22.05, ``munge``
0.5), for tests/test_jobs_srun.py: its own munge key and ``munged`` (its own socket), its own
``slurm.conf`` (free loopback ports, state and spool in a fresh temp directory), ``slurmctld
-D`` and ``slurmd -D``, polled until the node is idle. Clients (``srun``, ``sinfo``) find it
through ``SLURM_CONF`` (:attr:`SlurmCluster.env`). Nothing of the system's (``/etc/slurm``,
``/etc/munge``, ``/run/munge``) is read or touched.

On exit every process the cluster started is ended: job steps still running (``slurmstepd``
and the tasks it forked, when a test ended with one running: found by this cluster's
``SLURM_CONF`` in their environment), then the daemons (SIGTERM, then SIGKILL); then the temp
directory is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import free_ports, missing, require_binary

#: seconds for munged, slurmctld and slurmd to start and the node to register idle (about
#: 1 s measured here)
CLUSTER_START_S = 30
#: the binaries the cluster needs (a Debian system installs them with ``slurm-wlm``, which
#: depends on ``munge``)
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sinfo")


@dataclass
class SlurmCluster:
    directory: Path
    conf: Path
    node: str
    munge_socket: Path
    #: name -> path of each of :data:`BINARIES`
    binaries: dict[str, str]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The test's environment with ``SLURM_CONF`` pointing at this cluster (and no
        ``SLURM_*`` of an enclosing allocation)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure message."""
        out = []
        for name in ("munged", "slurmctld", "slurmd"):
            log = self.directory / f"{name}.log"
            if log.exists():
                out.append(f"--- {name}.log\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(out)

    def node_state(self) -> str | None:
        """The node's state as ``sinfo`` reports it (``idle``, ``unknown``, ``down*``...),
        or None while slurmctld does not answer."""
        try:
            out = subprocess.run(
                [
                    self.binaries["sinfo"],
                    "--noheader",
                    "--Node",
                    "--format=%T",
                    f"--nodes={self.node}",
                ],
                capture_output=True,
                text=True,
                timeout=10,
                env=self.env,
            )
        except subprocess.TimeoutExpired:
            return None
        if out.returncode != 0:
            return None
        return out.stdout.strip() or None


def _hardware(slurmd: str, node: str) -> str:
    """This machine's node line as ``slurmd -C`` reports it (CPUs, sockets, cores, threads,
    memory), so the configured node matches the hardware and registers idle."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=30, check=True)
    fields = out.stdout.splitlines()[0].split()
    assert fields[0].startswith("NodeName="), out.stdout
    return " ".join([f"NodeName={node}", "NodeAddr=127.0.0.1", *fields[1:]])


def _started_from(conf: Path, sessions: frozenset[int] = frozenset()) -> set[int]:
    """Pids of the processes with ``SLURM_CONF=conf`` in their environment, but not in
    ``sessions`` (zombies left out): the daemons, and what they and the tests' ``srun``
    started with it (``slurmstepd`` runs in a session of its own, its tasks in their own
    process groups, so neither session nor process group finds them). Not this process."""
    mark = f"SLURM_CONF={conf}".encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with suppress(OSError, IndexError, ValueError):
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                # after "(comm)": state ppid pgrp session ...
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] not in ("Z", "X") and int(stat[3]) not in sessions:
                    pids.add(int(entry.name))
    return pids


def _kill_all(pids: set[int], conf: Path) -> None:
    """SIGKILL ``pids``, then wait (10 s at most) until none started from ``conf`` runs."""
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pids & _started_from(conf) and time.monotonic() < deadline:
        time.sleep(0.01)


def _stop(cluster: SlurmCluster) -> None:
    """End every process of ``cluster``: job steps still running (``slurmstepd``, its tasks,
    a test's ``srun``) first, killed (not the daemons' own helpers: slurmctld waits 10 s for
    a killed ``slurmscriptd`` when it stops); then slurmd, slurmctld, munged in that order
    (SIGTERM, SIGKILL after 10 s); then anything still running with this ``SLURM_CONF``."""
    daemons = frozenset(p.pid for p in cluster.processes.values())  # each leads a session
    _kill_all(_started_from(cluster.conf, daemons), cluster.conf)
    for name in ("slurmd", "slurmctld", "munged"):
        proc = cluster.processes.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    _kill_all(_started_from(cluster.conf), cluster.conf)


@contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A one-node Slurm cluster (this host, 127.0.0.1) with its own munged, up and its node
    idle; stopped and removed on exit. Skips (fails under ``LINKGUARD_REQUIRE_REAL=1``) when
    a binary is missing or not run as root (``SlurmUser=root``); fails the test with the
    daemons' logs when the node is not idle within :data:`CLUSTER_START_S`."""
    if os.geteuid() != 0:
        missing("needs root (slurmctld and slurmd run as SlurmUser=root)")
    path = {name: require_binary(name) for name in BINARIES}
    node = socket.gethostname().split(".")[0]
    # a short path: the munge socket's path must fit a sockaddr_un (107 bytes)
    d = Path(tempfile.mkdtemp(prefix="lg-slurm-", dir="/tmp"))
    cluster = SlurmCluster(d, d / "slurm.conf", node, d / "munge.socket", path)
    try:
        d.chmod(0o755)  # munged wants its socket's directory executable for all
        (d / "state").mkdir()
        (d / "spool").mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ctld_port, slurmd_port = free_ports(2)
        cluster.conf.write_text(
            "\n".join(
                [
                    "ClusterName=linkguard-test",
                    f"SlurmctldHost={node}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={cluster.munge_socket}",
                    f"StateSaveLocation={d / 'state'}",
                    f"SlurmdSpoolDir={d / 'spool'}",
                    f"SlurmctldPidFile={d / 'slurmctld.pid'}",
                    f"SlurmdPidFile={d / 'slurmd.pid'}",
                    f"SlurmctldLogFile={d / 'slurmctld.log'}",
                    f"SlurmdLogFile={d / 'slurmd.log'}",
                    f"PlugStackConfig={d / 'plugstack.conf'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "SchedulerType=sched/builtin",
                    "MpiDefault=none",
                    "SwitchType=switch/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "ReturnToService=2",
                    "SlurmdParameters=config_overrides",
                    _hardware(path["slurmd"], node),
                    f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        (d / "plugstack.conf").write_text("")  # not the system's /etc/slurm/plugstack.conf
        env = cluster.env
        daemons = {
            "munged": [
                path["munged"],
                "--foreground",
                f"--socket={cluster.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            "slurmctld": [path["slurmctld"], "-D", "-i", "-f", str(cluster.conf)],
            "slurmd": [path["slurmd"], "-D", "-N", node, "-f", str(cluster.conf)],
        }
        deadline = time.monotonic() + CLUSTER_START_S
        for name, argv in daemons.items():
            with (d / f"{name}.out").open("wb") as out:
                cluster.processes[name] = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            if name == "munged":  # slurmctld and slurmd need it at once
                while not cluster.munge_socket.exists():
                    _check(cluster, deadline, "munged's socket")
                    time.sleep(0.01)
        while (state := cluster.node_state()) != "idle":
            _check(cluster, deadline, f"node {node} idle (sinfo says {state})")
            time.sleep(0.05)
        yield cluster
    finally:
        _stop(cluster)
        shutil.rmtree(d, ignore_errors=True)


def _check(cluster: SlurmCluster, deadline: float, what: str) -> None:
    """Fail the test (with the daemons' logs) when one of them exited or the deadline
    passed while waiting for ``what``."""
    dead = [n for n, p in cluster.processes.items() if p.poll() is not None]
    if dead or time.monotonic() > deadline:
        out = "\n".join(
            f"--- {n}.out\n{(cluster.directory / f'{n}.out').read_text(errors='replace')[-2000:]}"
            for n in cluster.processes
            if (cluster.directory / f"{n}.out").exists()
        )
        pytest.fail(
            f"Slurm cluster not up (exited: {dead}), waiting for {what}:\n{out}\n{cluster.logs()}"
        )
