"""Fail fast instead of hanging: how soon a job learns that a rail it uses is lost, and how soon
its workers train again, against NCCL's own retry budget (4.096 us x 2^20 x 7 = 30.1 s at
NCCL_IB_TIMEOUT=20, NCCL_IB_RETRY_CNT=7: when a job without linkguard would only start to fail).

    python benchmarks/failfast.py [--reps 200] [--restarts 8] [--torch-restarts 4]
                                  [--skip-torchrun]

What runs (real code throughout; simulated ports, in-memory bus, no root):
- exec start-up: ``linkguard exec --dir D -- true`` against ``true`` itself and a bare
  ``python -c pass``, bytecode cached (a private PYTHONPYCACHEPREFIX), median of 30.
- callback latency: a watcher process (``linkguard.jobwatch.RailWatch`` in its own interpreter,
  as in a job) whose callback writes ``time.perf_counter()`` (CLOCK_MONOTONIC, one clock for
  every process of the host) to a pipe. (a) "socket": the agent's RailMapServer publishes a
  rail-change document; (b) "agent": a real agent's simulated port goes down (monitor, fast
  path, nccl.env, rail change, socket). Each with the watcher's main thread idle (asleep, as
  in a collective) and busy (a pure-Python loop holding the GIL between checks). Losses rotate
  over 4 ports (each back up before its next turn), ``--reps`` per case.
- torchrun: ``torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=N --no-python linkguard exec
  -- python worker.py`` on 127.0.0.1; each worker watches the agent's rails socket and calls
  ``check()`` every step. One restart per rep: a port the workers use goes down, a worker
  raises RailLost (the other too, or its collective fails on the closed peer), torchrun
  restarts both through ``linkguard exec`` (on the usable rails), and the
  time until every new worker reports training is taken. "plain": workers without torch (what
  linkguard and torchrun add); "torch": each worker imports torch, joins a gloo process group
  and completes an all-reduce before it counts as training (a CPU stand-in for NCCL's
  start-up, without a model or checkpoint to load).

Prints percentiles (nearest rank) next to the targets; asserts nothing. The machine is noisy
(a 2-core CI box shared with other jobs): run it when little else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.localsub import RailMapServer
from linkguard.agent.monitor import DampingPolicy
from linkguard.agent.railmap import RailView, document
from linkguard.broker import free_port
from linkguard.config import BusSettings, RailsSocketSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.jobenv import read_host_nccl
from linkguard.jobwatch import nccl_retry_budget_s
from linkguard.logs import configure_logging
from linkguard.membus import MemoryBroker
from linkguard.models import encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import Solver

HOST = "gpu000"
RAILS = 4
FABRIC = generate_rail_optimized(hosts=2, rails=RAILS)
PORTS = [f"mlx5_{r}" for r in range(RAILS)]
BIN = Path(sys.executable).parent
#: targets (this issue's): a callback far inside NCCL's budget; workers back within seconds
TARGET_CALLBACK_P99_MS = 10.0
TARGET_EXEC_MS = 100.0
TARGET_RESTART_PLAIN_S = 5.0

WATCHER = """
import os, sys, time
from linkguard.jobwatch import RailWatch

out = os.fdopen(1, "w", buffering=1)
busy = sys.argv[2] == "busy"
watch = RailWatch(sys.argv[1], environ={}, grace_s=0, on_lost=lambda e: out.write(
    f"{time.perf_counter()!r} {e.ports[0]}\\n"))
watch.start()
watch.wait_ready(30)
out.write("ready\\n")
while True:  # a training loop: Python work holding the GIL, or asleep in a collective
    if busy:
        sum(i * i for i in range(20000))
    else:
        time.sleep(3600)
"""

WORKER = """
import json, os, sys, time
from pathlib import Path
from linkguard.jobwatch import RailLost, RailWatch

out, sock, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.environ["RANK"]


def record(name, doc):
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps({**doc, "time": time.time(), "pid": os.getpid()}))
    tmp.rename(out / name)


watch = RailWatch(sock, grace_s=0).start()  # before the process group, as the module says
watch.wait_ready(30)
if mode == "torch":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.ones(1)
    dist.all_reduce(x)
record(f"training-{attempt}-{rank}.json", {"NCCL_IB_HCA": os.environ.get("NCCL_IB_HCA")})
try:
    while not (out / "stop").exists():
        watch.check()
        if mode == "torch":
            dist.all_reduce(x)
        time.sleep(0.01)  # a training step
except RailLost as exc:
    record(f"lost-{attempt}-{rank}.json", {"ports": list(exc.ports), "delay_ms": exc.delay_ms})
    raise
"""


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))]


def summary(values: list[float], unit: str, scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    return (
        f"n={len(v)} p50 {pct(v, 50):.2f} p90 {pct(v, 90):.2f} p99 {pct(v, 99):.2f} "
        f"max {max(v):.2f} {unit}"
    )


# -- the agent -----------------------------------------------------------------------------------


@dataclass
class Rig:
    agent: Agent
    source: SimulatedPortSource
    run: Path
    socket: Path


@contextlib.asynccontextmanager
async def agent(workdir: Path) -> AsyncIterator[Rig]:
    """HOST's real agent (simulated ports, in-memory bus and routes, hold-down 0.3 s so a lost
    port is back for the next rep) with its rails socket, plan 1 applied."""
    broker = MemoryBroker()
    sock = Path(tempfile.mkdtemp(prefix="lg-ff-", dir="/tmp")) / "rails.sock"
    damping = DampingPolicy(hold_down_initial_s=0.3, hold_down_max_s=1.0, quiet_period_s=2.0)
    settings = agent_settings_for(
        FABRIC, HOST, bus=BusSettings(), workdir=workdir, damping=damping
    ).model_copy(update={"rails_socket": RailsSocketSettings(path=sock)})
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(HOST).hcas])
    a = Agent(
        settings,
        source=source,
        table=MemoryRouteTable(),
        discovered=[],
        bus_factory=broker.bus_factory,
    )
    sender = broker.bus_factory(client_id="bench-service", subscriptions=[])
    task = asyncio.create_task(a.run())
    try:
        async with sender:
            await sender.wait_connected(10)
            await a.bus.wait_connected(10)
            solver = Solver(FABRIC)
            solver.update({HOST: set()})
            await sender.publish(
                topics.plan(HOST), encode(solver.plan(HOST, epoch=1, now=1.0)), retain=True
            )
            run = settings.rail_map_path.parent
            await until(lambda: all_rails(run), "nccl.env with every rail", 10)
            yield Rig(a, source, run, sock)
    finally:
        a.stop()
        await asyncio.wait_for(task, 10)
        shutil.rmtree(sock.parent, ignore_errors=True)


def all_rails(run: Path) -> bool:
    try:
        return read_host_nccl(run).env.get("NCCL_IB_HCA") == "=" + ",".join(f"{p}:1" for p in PORTS)
    except Exception:
        return False


async def until(cond: Callable[[], object], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.002)


# -- exec start-up --------------------------------------------------------------------------------


def exec_startup(run: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="lg-ff-pyc-") as pyc:
        env["PYTHONPYCACHEPREFIX"] = pyc
        return _startup(run, env)


def _startup(run: Path, env: dict[str, str]) -> dict[str, float]:
    lg = str(BIN / "linkguard")
    cases = {
        "true": ["true"],
        "python -c pass": [sys.executable, "-c", "pass"],
        "linkguard exec -- true": [lg, "exec", "-q", "--dir", str(run), "--", "true"],
    }
    out = {}
    for name, cmd in cases.items():
        subprocess.run(cmd, check=True, env=env)  # warm: bytecode written
        times = []
        for _ in range(30):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, env=env)
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times) * 1000
    return out


# -- callback latency -----------------------------------------------------------------------------


class Watcher:
    """The watcher process; :meth:`next_fire` reads its next callback stamp."""

    def __init__(self, sock: Path, busy: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WATCHER), str(sock), "busy" if busy else "idle"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        assert self.proc.stdout is not None
        loop.add_reader(self.proc.stdout.fileno(), self._readable)

    def _readable(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line:
            self.lines.put_nowait(line.strip())

    async def next_line(self, timeout: float = 10) -> str:
        return await asyncio.wait_for(self.lines.get(), timeout)

    def close(self) -> None:
        assert self.proc.stdout is not None
        asyncio.get_running_loop().remove_reader(self.proc.stdout.fileno())
        self.proc.kill()
        self.proc.wait()


async def socket_latency(reps: int, busy: bool) -> list[float]:
    """(a): the agent's server publishes a loss -> the watcher's callback, in s."""
    sock = Path(tempfile.mkdtemp(prefix="lg-ff-", dir="/tmp")) / "rails.sock"
    seq = 1
    down: set[str] = set()

    def doc() -> dict:
        view = RailView(
            epoch=1,
            gpus={str(r): f"{p}:1" for r, p in enumerate(PORTS)},
            rails=tuple(range(RAILS)),
            lost=tuple(sorted(int(k[5]) for k in down)),
            down=tuple(sorted(down)),
        )
        return document(HOST, view, seq=seq, now=time.time(), reason="port_event", before=None)

    current = doc()
    server = RailMapServer(sock, current=lambda: current)
    task = asyncio.create_task(server.serve())
    await asyncio.wait_for(server.ready.wait(), 5)
    watcher = Watcher(sock, busy)
    out = []
    try:
        assert await watcher.next_line(30) == "ready"
        for i in range(reps):
            port = f"{PORTS[i % RAILS]}/1"
            seq += 1
            down.add(port)
            current = doc()
            t0 = time.perf_counter()
            server.publish(current)
            stamp, fired = (await watcher.next_line()).split()
            assert fired == port, (fired, port)
            out.append(float(stamp) - t0)
            seq += 1
            down.discard(port)
            current = doc()
            server.publish(current)
    finally:
        watcher.close()
        await until(lambda: server.subscribers == 0, "the watcher gone", 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        shutil.rmtree(sock.parent, ignore_errors=True)
    return out


async def agent_latency(workdir: Path, reps: int, busy: bool) -> list[float]:
    """(b): a real agent's port goes down -> the watcher's callback, in s."""
    out = []
    async with agent(workdir) as rig:
        watcher = Watcher(rig.socket, busy)
        try:
            assert await watcher.next_line(30) == "ready"
            for i in range(reps):
                hca = PORTS[i % RAILS]
                t0 = time.perf_counter()
                rig.source.link_down(hca, 1)
                stamp, fired = (await watcher.next_line()).split()
                assert fired == f"{hca}/1", (fired, hca)
                out.append(float(stamp) - t0)
                rig.source.link_up(hca, 1)
        finally:
            watcher.close()
            served = rig.agent.rails_socket
            await until(lambda: served is None or served.subscribers == 0, "watcher gone", 10)
    return out


# -- torchrun -------------------------------------------------------------------------------------


async def torchrun_restarts(workdir: Path, restarts: int, mode: str) -> list[dict[str, float]]:
    """One torchrun of 2 workers, ``restarts`` losses; per loss: s from the port going down to
    each worker raising, and to every new worker training."""
    out_dir = workdir / f"torchrun-{mode}"
    out_dir.mkdir(parents=True)
    script = out_dir / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    results = []
    async with agent(workdir / f"agent-{mode}") as rig:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LINKGUARD_"))}
        env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
        # torch shares the rendezvous TCPStore with the workers' process group by default, and
        # a restarted group can then read the previous attempt's keys: its gloo connect was
        # refused or hung in 4 of 4 runs here (pytorch#135712, #167288); this opts out
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        log = (out_dir / "torchrun.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            str(BIN / "torchrun"),
            "--nnodes=1",
            "--nproc-per-node=2",
            f"--max-restarts={restarts}",
            "--monitor-interval=0.1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--no-python",
            str(BIN / "linkguard"),
            "exec",
            "-q",
            "--dir",
            str(rig.run),
            "--",
            sys.executable,
            str(script),
            str(out_dir),
            str(rig.socket),
            mode,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:

            def training(attempt: int) -> bool:
                if proc.returncode is not None:
                    raise RuntimeError(f"torchrun exited {proc.returncode} (its log follows)")
                return all((out_dir / f"training-{attempt}-{r}.json").exists() for r in (0, 1))

            await until(lambda: training(0), "the first workers training", 180)
            for attempt in range(restarts):
                await until(lambda: all_rails(rig.run), "every rail usable again", 30)
                # a port these workers use: the one lost last time is not theirs
                used = read_json(out_dir / f"training-{attempt}-0.json")["NCCL_IB_HCA"]
                hca = next(p for p in PORTS[attempt % RAILS :] + PORTS if f"{p}:1" in used)
                t0 = time.time()
                rig.source.link_down(hca, 1)
                nxt = attempt + 1
                await until(lambda n=nxt: training(n), f"the workers of attempt {nxt}", 180)
                # the first worker to raise ends the group: the other raises too, or its
                # collective fails on the closed peer first (no record then)
                lost = [
                    read_json(f)
                    for r in (0, 1)
                    if (f := out_dir / f"lost-{attempt}-{r}.json").exists()
                ]
                again = [read_json(out_dir / f"training-{nxt}-{r}.json") for r in (0, 1)]
                assert lost and all(f"{hca}:1" not in a["NCCL_IB_HCA"] for a in again), again
                results.append(
                    {
                        "raised_s": min(x["time"] for x in lost) - t0,
                        "training_s": max(a["time"] for a in again) - t0,
                    }
                )
                rig.source.link_up(hca, 1)
            (out_dir / "stop").touch()
            await asyncio.wait_for(proc.wait(), 60)
        except BaseException:
            tail = (out_dir / "torchrun.log").read_text(errors="replace")[-3000:]
            print(f"torchrun's log, last 3000 characters:\n{tail}", file=sys.stderr)
            raise
        finally:
            await stop_torchrun(proc, out_dir, script)
            log.close()
            served = rig.agent.rails_socket  # the workers' connections gone before it stops
            with contextlib.suppress(TimeoutError):
                await until(lambda: served is None or served.subscribers == 0, "workers gone", 5)
    return results


async def stop_torchrun(proc: asyncio.subprocess.Process, out: Path, script: Path) -> None:
    """End a torchrun still running: SIGTERM (it stops its workers), SIGKILL after 30 s;
    then any worker it left behind (workers run in their own sessions), by the pids they
    recorded, if still running ``script``."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    kill_leftover_workers(out, script)


def kill_leftover_workers(out: Path, script: Path) -> None:
    for record in out.glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            pid = read_json(record)["pid"]
            if str(script) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


async def bench_exec(work: Path) -> None:
    async with agent(work / "exec") as rig:
        started = exec_startup(rig.run)
    print("\nexec start-up (median of 30, bytecode cached):")
    for name, ms in started.items():
        print(f"  {name:28s} {ms:7.1f} ms")
    overhead = started["linkguard exec -- true"] - started["true"]
    print(f"  linkguard exec adds {overhead:.1f} ms (target < {TARGET_EXEC_MS:.0f} ms)")


async def bench_callbacks(work: Path, reps: int, budget: float) -> None:
    print(f"\nrail loss -> callback in the job's process (target p99 < "
          f"{TARGET_CALLBACK_P99_MS:.0f} ms; NCCL: {budget:.1f} s):")  # fmt: skip
    for busy in (False, True):
        main_thread = "busy" if busy else "idle"
        s = await socket_latency(reps, busy)
        print(f"  socket publish -> callback, main thread {main_thread}: {summary(s, 'ms', 1e3)}")
        a = await agent_latency(work / f"lat-{main_thread}", reps, busy)
        print(f"  agent port down -> callback, main thread {main_thread}: {summary(a, 'ms', 1e3)}")


async def bench_torchrun(work: Path, runs: dict[str, int], budget: float) -> None:
    print("\ntorchrun, 2 workers, rail loss -> (a worker raised RailLost) -> (every "
          "restarted worker training):")  # fmt: skip
    for mode, n in runs.items():
        if n <= 0:
            continue
        rs = await torchrun_restarts(work, n, mode)
        raised = [r["raised_s"] for r in rs]
        again = [r["training_s"] for r in rs]
        target = f" (target < {TARGET_RESTART_PLAIN_S:.0f} s)" if mode == "plain" else ""
        print(f"  {mode:5s} raised:          {summary(raised, 'ms', 1e3)}")
        print(f"  {mode:5s} training again:  {summary(again, 's')}{target}")
        print(
            f"  {mode:5s} without linkguard: the workers would hang {budget:.0f} s, then "
            f"restart: ~{budget + statistics.median(again):.0f} s to training again"
        )


def tmpfs() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="losses per callback case")
    ap.add_argument("--restarts", type=int, default=8, help="torchrun restarts, plain workers")
    ap.add_argument("--torch-restarts", type=int, default=4, help="torchrun restarts, torch")
    ap.add_argument("--skip-torchrun", action="store_true")
    ap.add_argument("--only-torchrun", action="store_true", help="skip exec and callbacks")
    args = ap.parse_args()
    configure_logging("console", "error")
    budget = nccl_retry_budget_s({})
    print(f"NCCL retry budget at NCCL_IB_TIMEOUT=20, NCCL_IB_RETRY_CNT=7: {budget:.1f} s")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    # the agent's files on tmpfs, as /run/linkguard is (its atomic writes fsync)
    shm = tmpfs()
    with tempfile.TemporaryDirectory(prefix="lg-ff-", dir=shm) as tmp:
        work = Path(tmp)
        print(f"agent files in {work} ({'tmpfs' if shm else 'the default temp dir'})")
        if not args.only_torchrun:
            await bench_exec(work)
            await bench_callbacks(work, args.reps, budget)
        if not args.skip_torchrun:
            runs = {"plain": args.restarts, "torch": args.torch_restarts}
            await bench_torchrun(work, runs, budget)


if __name__ == "__main__":
    asyncio.run(main())
