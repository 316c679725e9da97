"""Agent footprint: resident memory, idle CPU and start-up of one real `linkguard agent` process
polling 8 InfiniBand ports, against issue 23's targets (RSS < 40 MiB, idle CPU < 0.5 % of one
core at a 100 ms poll, start to first port state on the bus < 0.5 s).

    python benchmarks/agent.py [--runs 5] [--seconds 20] [--poll-ms 100] [--python PATH]

The agent is installed as a GPU host installs it: by default the script builds a fresh venv in
its temporary directory with ``pip install`` of this checkout without extras (the base
install, issue 23: no service, broker, simulator or probe packages; ~15 s with this machine's
pip configuration), and runs that venv's `linkguard agent --config ...`. ``--python`` runs the
agent and the baselines with another interpreter instead (it must have linkguard installed:
``--python .venv/bin/python`` measures the development venv, every extra and the test tools
installed, where structlog also loads rich).

The agent reads a copy of a real H100 node's /sys/class/infiniband
(../shared/fixtures/real/leptonai-gpud: mlx5_0, 1, 4-9, InfiniBand NDR; the RoCE bond is left
out) through the sysfs driver: state and phys_state of each port every ``--poll-ms`` (default:
the agent's, 100 ms), rate, link layer and counters every second. It verifies signed plans
(``service_public_key``, a key pair generated for the run: production's configuration, which
loads cryptography), talks to a private Mosquitto on a free loopback port, keeps its routes in
memory (routes.apply: false: no root, the host's routing is left alone) and runs its Prometheus
exporter on a free loopback port, as in production.

Each of ``--runs`` repetitions starts, with the same interpreter, each a separate process:
- the agent; "start to first state" is from just before its Popen to its first port state
  arriving at a client subscribed on the broker, split by the agent's own log lines
  (``agent_starting``: imports, settings, construction; ``bus_connected``; then the presence
  check, :data:`linkguard.agent.daemon.PRESENCE_SETTLE_S`, before the first state);
- baseline "bare python": the interpreter importing nothing (``-I -S``), asleep;
- baseline "imports only": the agent's modules imported, nothing running;
- baseline "poll loop, no bus": the agent's sysfs driver (SysfsIBSource) polling the same tree
  at the same interval, with no monitor, bus, exporter or applier;
- baseline "bare aiomqtt client": imports aiomqtt, connects, publishes one retained message
  (its Popen -> arrival is the start-up baseline), then idles connected.
Once the agent's 8 states are on the broker and 3 s have passed, every process is read over the
same ``--seconds`` window from outside: CPU as the sum over its threads of
/proc/<pid>/task/*/schedstat run time (ns), memory from /proc/<pid>/status (VmRSS = RssAnon, the
process's own, + RssFile + RssShmem, pages of shared libraries and modules mapped from files,
shared with every process mapping them). Then a port's state file set to DOWN must reach the
bus (the agent was live), and SIGTERM must stop the agent with exit code 0 (timed). Prints
p50 / p90 / max over the runs next to each target; asserts nothing.

Raises FileNotFoundError when no ``mosquitto`` binary is found (Debian package `mosquitto`) or
the fixture tree is missing (set LINKGUARD_FIXTURES to ../shared/fixtures/real), and
CalledProcessError when the venv cannot be built.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

from linkguard import topics
from linkguard.broker import MosquittoProcess, free_port
from linkguard.bus import Bus, BusMessage
from linkguard.config import AgentSettings
from linkguard.logs import configure_logging
from linkguard.signing import generate_keys

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("LINKGUARD_FIXTURES", REPO.parent / "shared/fixtures/real"))
TREE = "leptonai-gpud/tree/sys-class-infiniband-h100.0"
#: the 8 InfiniBand HCAs of that node, one rail each (mlx5_bond_0 is its Ethernet storage bond)
HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
HOST = "bench-gpu001"
#: issue 23's targets
TARGET_RSS_MIB = 40.0
TARGET_CPU_PCT = 0.5
TARGET_START_S = 0.5
#: what a wheel is built from (pyproject.toml's package-dir and readme)
SOURCE = ["pyproject.toml", "README.md", "linkguard", "drivers", "topology", "simulations"]

POLL_ONLY = """
import asyncio, sys
from pathlib import Path
from linkguard.drivers.sysfs_ib import SysfsIBSource

async def main():
    src = SysfsIBSource(root=Path(sys.argv[1]), interval_s=float(sys.argv[2]),
                        ports=set(sys.argv[3].split(",")))
    async for _ in src.watch():
        pass

asyncio.run(main())
"""
IMPORTS_ONLY = """
import time
import linkguard.cli.daemon, linkguard.agent.daemon, linkguard.drivers.sysfs_ib
while True:
    time.sleep(3600)
"""
BARE = "import time\nwhile True:\n    time.sleep(3600)\n"
BARE_MQTT = """
import asyncio, sys
import aiomqtt

async def main():
    async with aiomqtt.Client("127.0.0.1", int(sys.argv[1]), identifier="bench-bare") as c:
        await c.publish(sys.argv[2], b'{"status": "up"}', qos=1, retain=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""
AGENT = "agent (linkguard agent)"
BASELINES = [
    "baseline: bare python",
    "baseline: imports only",
    "baseline: poll loop, no bus",
    "baseline: bare aiomqtt client",
]


@dataclass
class Sample:
    """One reading of a process: CPU time used so far by all its threads (s), memory (MiB)."""

    cpu_s: float
    rss_mib: float
    anon_mib: float
    file_mib: float
    threads: int


def sample(pid: int) -> Sample:
    """/proc/<pid>/task/*/schedstat (first field: ns on a CPU), /proc/<pid>/status VmRSS,
    RssAnon, RssFile + RssShmem (kB), Threads. ProcessLookupError when the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cpu_ns = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread ended
                cpu_ns += int((task / "schedstat").read_text().split()[0])
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} exited") from None
    kv = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    mib = lambda k: int(kv[k].split()[0]) / 1024  # noqa: E731
    return Sample(
        cpu_ns / 1e9,
        mib("VmRSS"),
        mib("RssAnon"),
        mib("RssFile") + mib("RssShmem"),
        int(kv["Threads"]),
    )


def clean_env() -> dict[str, str]:
    """This environment without the running venv's paths (a fresh venv must see only itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)
    )
    return env


def base_install_venv(work: Path, *, timeout_s: float = 170) -> Path:
    """A fresh venv ``work/agent-venv`` with this checkout installed without extras (the base
    install, what a GPU host gets from ``pip install linkguard``), built from a copy of the
    source in ``work/src`` (nothing is left in the checkout), with pip's own configuration
    (find-links / index: offline on these machines); the venv's directory. Also
    ``tests/test_lean_agent.py``'s. RuntimeError with pip's output when venv or pip fails."""
    src = work / "src"
    src.mkdir()
    for name in SOURCE:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    venv = work / "agent-venv"
    for cmd in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin/pip"), "install", "-q", str(src)],
    ):
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=work,
            env=clean_env(),
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{done.stderr[-3000:]}")
    return venv


def write_config(work: Path, tree: Path, broker_port: int, poll_ms: float | None) -> Path:
    """An agent config for the bench (validated by AgentSettings before it is used)."""
    _, pub = generate_keys(work / "keys", force=True)
    doc = {
        "host": HOST,
        "driver": "sysfs",
        "sysfs_root": str(tree),
        "bus": {"host": "127.0.0.1", "port": broker_port},
        "ports": [{"hca": h, "port": 1, "rail": r} for r, h in enumerate(HCAS)],
        "routes": {"apply": False},
        "service_public_key": str(pub),
        "state_dir": str(work / "state"),
        "rail_map_path": str(work / "run/rail-map.json"),
        "metrics_listen": f"127.0.0.1:{free_port()}",
        "log_format": "json",
    }
    if poll_ms is not None:
        doc["poll_interval_ms"] = poll_ms
    AgentSettings(**doc)  # a bad bench config fails here, not in the child
    path = work / "agent.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Watcher:
    """A bus client that keeps the arrival time (monotonic s) and last payload of each topic
    under the agent's port states and the bare client's topic."""

    def __init__(self, port: int, bare_topics: str) -> None:
        self.states: dict[str, bytes] = {}
        self.first_at: dict[str, float] = {}
        self.bus = Bus(
            host="127.0.0.1",
            port=port,
            client_id="bench-watcher",
            subscriptions=[f"{topics.PREFIX}/hosts/{HOST}/ports/#", bare_topics],
            handler=self._on,
        )

    async def _on(self, m: BusMessage) -> None:
        self.first_at.setdefault(m.topic, time.monotonic())
        self.states[m.topic] = m.payload

    def forget(self) -> None:
        self.states.clear()
        self.first_at.clear()

    def first(self, prefix: str) -> float | None:
        times = [t for topic, t in self.first_at.items() if topic.startswith(prefix)]
        return min(times) if times else None

    def status(self, topic: str) -> str | None:
        """The ``status`` of the last port state on ``topic`` (None: none yet)."""
        payload = self.states.get(topic)
        return json.loads(payload).get("status") if payload else None

    async def until(self, cond, what: str, timeout: float) -> float:
        """Wait for ``cond()``; the seconds it took. TimeoutError naming ``what``."""
        t0 = time.monotonic()
        while not cond():
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"no {what} within {timeout} s")
            await asyncio.sleep(0.002)
        return time.monotonic() - t0


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)


def stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM, then SIGKILL after 15 s; the seconds to exit."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return time.monotonic() - t0


def log_times(log: Path, events: tuple[str, ...]) -> dict[str, float]:
    """Wall-clock time (s since the epoch) of the first of each of ``events`` in a JSON log."""
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") in events:
            stamp = datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00"))
            out.setdefault(doc["event"], stamp.timestamp())
    return out


@dataclass
class Run:
    """One repetition's figures (CPU % of one core over the window, memory in MiB, times s)."""

    cpu_pct: dict[str, float]
    mem: dict[str, Sample]
    start_s: float
    stages_s: dict[str, float]
    bare_start_s: float
    down_ms: float
    stop_s: float


async def one_run(
    n: int,
    python: str,
    watcher: Watcher,
    cfg: Path,
    tree: Path,
    broker_port: int,
    interval_ms: float,
    seconds: float,
    work: Path,
) -> Run:
    for hca in HCAS:  # the previous run's liveness check set one DOWN
        (tree / hca / "ports/1/state").write_text("4: ACTIVE\n")
        (tree / hca / "ports/1/phys_state").write_text("5: LinkUp\n")
    shutil.rmtree(work / "state", ignore_errors=True)
    watcher.forget()
    keys = ",".join(f"{h}/1" for h in HCAS)
    bare_topic = f"{topics.PREFIX}/bench/bare/{n}"
    logs = work / f"run{n}"
    logs.mkdir()
    wall0, t0 = time.time(), time.monotonic()
    script = Path(python).with_name("linkguard")  # the console script, as systemd starts it
    cli = [str(script)] if script.exists() else [python, "-m", "linkguard.cli"]
    procs = {AGENT: start([*cli, "agent", "--config", str(cfg)], logs / "agent.log")}
    agent = procs[AGENT]
    up = await watcher.until(
        lambda: len(watcher.first_at) >= len(HCAS) or agent.poll() is not None,
        "port states from the agent",
        60,
    )
    if agent.poll() is not None:
        raise RuntimeError(f"the agent exited ({agent.returncode}): {logs / 'agent.log'}")
    first = watcher.first(f"{topics.PREFIX}/hosts/{HOST}/ports/")
    assert first is not None, up
    start_s = first - t0
    marks = log_times(logs / "agent.log", ("agent_starting", "bus_connected"))
    stages = {
        "process start -> agent_starting (imports, settings, setup)": marks["agent_starting"]
        - wall0,
        "agent_starting -> bus_connected": marks["bus_connected"] - marks["agent_starting"],
        "bus_connected -> first state (presence check, first poll)": start_s
        - (marks["bus_connected"] - wall0),
    }
    b0 = time.monotonic()
    procs[BASELINES[3]] = start(
        [python, "-c", BARE_MQTT, str(broker_port), bare_topic], logs / "bare-mqtt.log"
    )
    await watcher.until(lambda: bare_topic in watcher.first_at, "the bare client's message", 30)
    bare_start_s = watcher.first_at[bare_topic] - b0
    procs[BASELINES[0]] = start([python, "-I", "-S", "-c", BARE], logs / "bare.log")
    procs[BASELINES[1]] = start([python, "-c", IMPORTS_ONLY], logs / "imports.log")
    procs[BASELINES[2]] = start(
        [python, "-c", POLL_ONLY, str(tree), str(interval_ms / 1000), keys], logs / "poll.log"
    )
    try:
        await asyncio.sleep(3.0)  # start-up work (imports, first publishes) settles
        w0, s0 = time.monotonic(), {k: sample(p.pid) for k, p in procs.items()}
        await asyncio.sleep(seconds)
        w1, s1 = time.monotonic(), {k: sample(p.pid) for k, p in procs.items()}
        # liveness: the agent still polls the files and publishes what changed
        down = tree / HCAS[2] / "ports/1"
        (down / "state").write_text("1: DOWN\n")
        (down / "phys_state").write_text("3: Disabled\n")
        topic = topics.port_state(HOST, HCAS[2], 1)
        down_s = await watcher.until(lambda: watcher.status(topic) == "down", "DOWN", 10)
    finally:
        stop_s = stop(agent)
        for p in procs.values():
            stop(p)
    if agent.returncode != 0:
        raise RuntimeError(f"the agent exited {agent.returncode} on SIGTERM: {logs}")
    cpu = {k: (s1[k].cpu_s - s0[k].cpu_s) / (w1 - w0) * 100 for k in procs}
    return Run(cpu, s1, start_s, stages, bare_start_s, down_s * 1000, stop_s)


def pct(values: list[float]) -> str:
    """``p50 / p90 / max`` of ``values`` (nearest rank)."""
    s = sorted(values)
    p90 = s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]
    return f"{statistics.median(s):7.2f} / {p90:7.2f} / {s[-1]:7.2f}"


def report(runs: list[Run], python: str, interval_ms: float, seconds: float) -> None:
    names = [AGENT, *BASELINES]
    print(
        f"agent bench: {len(HCAS)} IB ports ({TREE.split('/')[0]} H100 sysfs tree), poll "
        f"{interval_ms:g} ms, signed plans, {len(runs)} runs x {seconds:g} s window, Mosquitto "
        f"on 127.0.0.1, {os.cpu_count()} cores; interpreter {python}"
    )
    print("figures are p50 / p90 / max over the runs")
    print(f"{'process':<30} {'RSS MiB':>25} {'of which anon MiB':>25} {'CPU % of 1 core':>25}")
    for k in names:
        print(
            f"{k:<30} {pct([r.mem[k].rss_mib for r in runs]):>25} "
            f"{pct([r.mem[k].anon_mib for r in runs]):>25} "
            f"{pct([r.cpu_pct[k] for r in runs]):>25}"
        )
    rss = statistics.median(r.mem[AGENT].rss_mib for r in runs)
    cpu = statistics.median(r.cpu_pct[AGENT] for r in runs)
    start_s = statistics.median(r.start_s for r in runs)
    ok = lambda good: "within target" if good else "OVER target"  # noqa: E731
    bare = statistics.median(r.mem[BASELINES[0]].rss_mib for r in runs)
    mqtt = statistics.median(r.mem[BASELINES[3]].rss_mib for r in runs)
    poll_cpu = statistics.median(r.cpu_pct[BASELINES[2]] for r in runs)
    print(
        f"target RSS < {TARGET_RSS_MIB:g} MiB: p50 {rss:.1f} ({ok(rss < TARGET_RSS_MIB)}); "
        f"bare python {bare:.1f}, bare aiomqtt client {mqtt:.1f} (agent / client "
        f"{rss / mqtt:.2f}x)"
    )
    print(
        f"target idle CPU < {TARGET_CPU_PCT:g} % of one core: p50 {cpu:.2f} "
        f"({ok(cpu < TARGET_CPU_PCT)}); poll loop without the bus {poll_cpu:.2f} (agent / poll "
        "loop " + (f"{cpu / poll_cpu:.2f}x)" if poll_cpu > 0 else "n/a)")
    )
    bare_start = statistics.median(r.bare_start_s for r in runs)
    print(
        f"target start to first state on the bus < {TARGET_START_S:g} s: p50 / p90 / max "
        f"{pct([r.start_s for r in runs]).strip()} ({ok(start_s < TARGET_START_S)}); bare "
        f"aiomqtt client, start to its first message: {pct([r.bare_start_s for r in runs])} "
        f"(agent / client {start_s / bare_start:.1f}x)"
    )
    for stage in runs[0].stages_s:
        print(f"  {stage}: {pct([r.stages_s[stage] for r in runs]).strip()} s")
    print(
        "agent liveness: a port set DOWN in sysfs seen on the bus after "
        f"{pct([r.down_ms for r in runs]).strip()} ms; SIGTERM -> exit "
        f"{pct([r.stop_s for r in runs]).strip()} s (exit code 0)"
    )


async def run(args: argparse.Namespace, work: Path) -> None:
    src = FIXTURES / TREE
    if not src.is_dir():
        raise FileNotFoundError(f"fixture tree {src} not found (set LINKGUARD_FIXTURES)")
    python = args.python or str(base_install_venv(work) / "bin/python")
    tree = work / "sys-class-infiniband"
    shutil.copytree(src, tree)
    for p in tree.rglob("*"):  # the copy keeps sysfs's read-only modes; the liveness check writes
        p.chmod(p.stat().st_mode | 0o200)
    interval_ms = (
        args.poll_ms
        if args.poll_ms is not None
        else AgentSettings.model_fields["poll_interval_ms"].default
    )
    runs: list[Run] = []
    with MosquittoProcess(work / "broker") as broker:
        cfg = write_config(work, tree, broker.port, args.poll_ms)
        watcher = Watcher(broker.port, f"{topics.PREFIX}/bench/bare/#")
        async with watcher.bus:
            for n in range(args.runs):
                runs.append(
                    await one_run(
                        n,
                        python,
                        watcher,
                        cfg,
                        tree,
                        broker.port,
                        interval_ms,
                        args.seconds,
                        work,
                    )
                )
    report(runs, python, interval_ms, args.seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measurement window (s)")
    ap.add_argument(
        "--poll-ms", type=float, default=None, help="poll interval (ms); default: the agent's"
    )
    ap.add_argument(
        "--python",
        help="interpreter for the agent and the baselines (default: a fresh venv with the "
        "base install of this checkout)",
    )
    args = ap.parse_args()
    if args.python:  # absolute (the processes run elsewhere), not resolved: a venv's python is
        args.python = os.path.abspath(args.python)  # a symlink out of the venv
    configure_logging("console", "warning")  # the bench's own bus client: quiet
    with tempfile.TemporaryDirectory(prefix="linkguard-agent-bench-") as tmp:
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
