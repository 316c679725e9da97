"""Agent footprint: resident memory and idle CPU of one real `linkguard agent` process polling
8 InfiniBand ports, against the targets of issue 6 (< 80 MiB RSS, < 1 % of one core).

    python benchmarks/agent.py [--seconds 60] [--poll-ms 100]

The agent is the real CLI (`linkguard agent --config ...`) with the sysfs driver on a copy of a
real H100 node's /sys/class/infiniband (../shared/fixtures/real/leptonai-gpud: mlx5_0, 1, 4-9,
InfiniBand NDR; the RoCE bond is left out), so every poll reads real files: state, phys_state,
rate and link_layer of each port every ``--poll-ms`` (default: the agent's, 100 ms), its
counters every second. It talks to a private Mosquitto on a free loopback port and keeps its
routes in memory (routes.apply: false: no root, the host's routing is left alone); its Prometheus
exporter runs on a free loopback port, as in production.

Measured over the same window, started together (each a separate process, read from outside
through /proc/<pid>/status VmRSS and VmHWM, and /proc/<pid>/stat utime + stime over wall time):
- the agent, after its 8 port states reached the broker (start-up excluded);
- baseline "bare python": the same interpreter importing nothing (``-I -S``), asleep;
- baseline "imports only": the agent's modules imported, nothing running;
- baseline "poll loop, no bus": the agent's sysfs driver (SysfsIBSource) polling the same tree
  at the same interval, with no monitor, bus, exporter or applier.
Then it checks the agent was live (a port's state file set to DOWN reaches the bus) and times a
SIGTERM to exit. Prints figures and ratios; it asserts nothing.

Raises FileNotFoundError when no ``mosquitto`` binary is found (Debian package `mosquitto`) or
the fixture tree is missing (set LINKGUARD_FIXTURES to ../shared/fixtures/real).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from linkguard import topics
from linkguard.broker import MosquittoProcess, free_port
from linkguard.bus import Bus, BusMessage
from linkguard.config import AgentSettings
from linkguard.logs import configure_logging

FIXTURES = Path(
    os.environ.get(
        "LINKGUARD_FIXTURES", Path(__file__).resolve().parents[1].parent / "shared/fixtures/real"
    )
)
TREE = "leptonai-gpud/tree/sys-class-infiniband-h100.0"
#: the 8 InfiniBand HCAs of that node, one rail each (mlx5_bond_0 is its Ethernet storage bond)
HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
HOST = "bench-gpu001"
TARGET_RSS_MIB = 80.0
TARGET_CPU_PCT = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

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
import linkguard.agent.daemon, linkguard.bus, linkguard.drivers.sysfs_ib, linkguard.metrics
while True:
    time.sleep(3600)
"""
BARE = "import time\nwhile True:\n    time.sleep(3600)\n"


@dataclass
class Sample:
    """One reading of a process: CPU time used so far (s), RSS and peak RSS (MiB)."""

    cpu_s: float
    rss_mib: float
    hwm_mib: float
    threads: int


def sample(pid: int) -> Sample:
    """/proc/<pid>: utime + stime (stat fields 14, 15, clock ticks), VmRSS, VmHWM (kB),
    Threads. Raises ProcessLookupError when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} exited") from None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    kv = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kib = lambda k: int(kv[k].split()[0])  # noqa: E731
    return Sample(cpu, kib("VmRSS") / 1024, kib("VmHWM") / 1024, int(kv["Threads"]))


def linkguard_command() -> list[str]:
    """The `linkguard` console script of this interpreter's environment (the real CLI)."""
    script = Path(sys.executable).with_name("linkguard")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from linkguard.cli import main; sys.exit(main())"]


def write_config(work: Path, tree: Path, broker_port: int, poll_ms: float | None) -> Path:
    """An agent config for the bench (validated by AgentSettings before it is used)."""
    doc = {
        "host": HOST,
        "driver": "sysfs",
        "sysfs_root": str(tree),
        "bus": {"host": "127.0.0.1", "port": broker_port},
        "ports": [{"hca": h, "port": 1, "rail": r} for r, h in enumerate(HCAS)],
        "routes": {"apply": False},
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
    """A bus client that keeps the last payload of each of the agent's port-state topics."""

    def __init__(self, port: int) -> None:
        self.states: dict[str, bytes] = {}
        self.bus = Bus(
            host="127.0.0.1",
            port=port,
            client_id="bench-watcher",
            subscriptions=[f"{topics.PREFIX}/hosts/{HOST}/ports/#"],
            handler=self._on,
        )

    async def _on(self, m: BusMessage) -> None:
        self.states[m.topic] = m.payload

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
            await asyncio.sleep(0.005)
        return time.monotonic() - t0


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM, then SIGKILL after 15 s; the seconds to exit."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return time.monotonic() - t0


async def run(seconds: float, poll_ms: float | None, work: Path) -> None:
    src = FIXTURES / TREE
    if not src.is_dir():
        raise FileNotFoundError(f"fixture tree {src} not found (set LINKGUARD_FIXTURES)")
    tree = work / "sys-class-infiniband"
    shutil.copytree(src, tree)
    for p in tree.rglob("*"):  # the copy keeps sysfs's read-only modes; the liveness check writes
        p.chmod(p.stat().st_mode | 0o200)
    interval_ms = (
        poll_ms if poll_ms is not None else AgentSettings.model_fields["poll_interval_ms"].default
    )
    keys = ",".join(f"{h}/1" for h in HCAS)
    with MosquittoProcess(work / "broker") as broker:
        cfg = write_config(work, tree, broker.port, poll_ms)
        py = sys.executable
        procs = {
            "agent (linkguard agent)": start(
                [*linkguard_command(), "agent", "--config", str(cfg)], work / "agent.log"
            ),
            "baseline: bare python": start([py, "-I", "-S", "-c", BARE], work / "bare.log"),
            "baseline: imports only": start([py, "-c", IMPORTS_ONLY], work / "imports.log"),
            "baseline: poll loop, no bus": start(
                [py, "-c", POLL_ONLY, str(tree), str(interval_ms / 1000), keys],
                work / "poll.log",
            ),
        }
        agent = procs["agent (linkguard agent)"]
        try:
            watcher = Watcher(broker.port)
            async with watcher.bus:
                up_s = await watcher.until(
                    lambda: len(watcher.states) >= len(HCAS) or agent.poll() is not None,
                    "port states from the agent",
                    60,
                )
                if agent.poll() is not None:
                    raise RuntimeError(
                        f"the agent exited ({agent.returncode}): "
                        f"{(work / 'agent.log').read_text()[-2000:]}"
                    )
                await asyncio.sleep(1.0)  # let start-up work (imports, first publishes) settle
                t0, s0 = time.monotonic(), {n: sample(p.pid) for n, p in procs.items()}
                await asyncio.sleep(seconds)
                t1, s1 = time.monotonic(), {n: sample(p.pid) for n, p in procs.items()}
                # liveness: the agent still polls the files and publishes what changed
                down = tree / HCAS[2] / "ports/1"
                (down / "state").write_text("1: DOWN\n")
                (down / "phys_state").write_text("3: Disabled\n")
                topic = topics.port_state(HOST, HCAS[2], 1)
                seen_s = await watcher.until(
                    lambda: watcher.status(topic) == "down",
                    f"DOWN state on {topic}",
                    10,
                )
        finally:
            stop_s = stop(agent)
            for p in procs.values():
                stop(p)
    wall = t1 - t0
    print(
        f"agent bench: {len(HCAS)} IB ports ({TREE.split('/')[0]} H100 sysfs tree), poll "
        f"{interval_ms:g} ms, {wall:.1f} s window, Mosquitto on 127.0.0.1, {os.cpu_count()} cores"
    )
    print(f"{'process':<30} {'RSS MiB':>8} {'peak MiB':>9} {'CPU % of 1 core':>16} {'threads':>8}")
    cpu = {}
    for name in procs:
        a, b = s0[name], s1[name]
        cpu[name] = (b.cpu_s - a.cpu_s) / wall * 100
        print(f"{name:<30} {b.rss_mib:>8.1f} {b.hwm_mib:>9.1f} {cpu[name]:>16.2f} {b.threads:>8}")
    ag = s1["agent (linkguard agent)"]
    ag_cpu = cpu["agent (linkguard agent)"]
    verdict = lambda ok: "within target" if ok else "OVER target"  # noqa: E731
    print(f"target RSS < {TARGET_RSS_MIB:g} MiB: {ag.rss_mib:.1f} ({verdict(ag.rss_mib < 80)})")
    print(
        f"target idle CPU < {TARGET_CPU_PCT:g} % of one core: {ag_cpu:.2f} ({verdict(ag_cpu < 1)})"
    )
    bare, imp = s1["baseline: bare python"], s1["baseline: imports only"]
    poll_cpu = cpu["baseline: poll loop, no bus"]
    print(
        f"ratios: RSS agent / bare python {ag.rss_mib / bare.rss_mib:.1f}x, agent / imports only "
        f"{ag.rss_mib / imp.rss_mib:.2f}x; CPU agent / poll loop "
        + (f"{ag_cpu / poll_cpu:.1f}x" if poll_cpu > 0 else "n/a (poll loop used no tick)")
    )
    print(
        f"agent: port states on the bus {up_s:.2f} s after start; a port set DOWN in sysfs "
        f"seen on the bus after {seen_s * 1000:.0f} ms; SIGTERM -> exit {stop_s:.2f} s "
        f"(exit code {agent.returncode})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window (s)")
    ap.add_argument(
        "--poll-ms", type=float, default=None, help="poll interval (ms); default: the agent's"
    )
    args = ap.parse_args()
    configure_logging("console", "warning")  # the bench's own bus client: quiet
    with tempfile.TemporaryDirectory(prefix="linkguard-agent-bench-") as tmp:
        asyncio.run(run(args.seconds, args.poll_ms, Path(tmp)))


if __name__ == "__main__":
    main()
