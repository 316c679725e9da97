"""Down -> last ack over the real bus: a single host link fails in a fleet of simulated agents.

Usage: ``python benchmarks/ack_bench.py [--hosts 256] [--rails 8] [--faults 50]
[--bus mosquitto|memory] [--procs 0|N] [--hold-down 0.5] [--workdir DIR] [--seed 1]
[--no-baseline] [--profile F]``. Needs the ``mosquitto`` binary for ``--bus mosquitto`` (a
private one on a free loopback port, stopped at the end).

The real topology service and one real agent per host (simulated ports, in-memory route
tables), the service's default solve back-off. ``--procs 0`` (default): everything in this one
process (:class:`~linkguard.simulations.fleet.SimulatedFleet`), as the simulations run it.
``--procs N`` (Mosquitto only): the service here, the agents spread over N worker processes,
closer to a fleet of separate hosts (the machine has 2 cores). Each fault: one random host
port goes down; the fleet re-plans; the port comes back and is re-admitted after the
hold-down; then the bench waits the service's ``solve.holddown_ms`` so that the next fault
meets a quiet back-off (RFC 8405: a change within that time of the last is batched for
``solve.long_ms``).

Per fault, from ``link_down`` (t0, monotonic, shared by the processes): the agent's fast path
(its ack's ``applied_at``), the first and the last ``applied`` ack of the plan epoch that
followed as the service received them (its ``FabricState.on_ack``, wrapped here), and how many
plans that epoch had. The breakdown: the port state reaching the service, the back-off wait
until the solve starts, the service's solve / encode / publish split (its ``plans_published``
log line), the fan-out until the last ack, and the agents' apply time (their acks'
``apply_ms``). First a baseline run, the same faults on a fresh fleet and broker whose
agents ack each peer routes message on arrival and do nothing else (:func:`_ack_only`): what
the broker, the MQTT clients and the event loops cost on this machine, the floor under the
real run; the report gives both and their ratio (``--no-baseline`` skips it).
``--profile F``: cProfile of this process from each down to its last ack. The
agents' state dirs default to a tmpfs (/dev/shm): every plan apply writes and fsyncs two files
per host, which a fleet does on as many disks in parallel; ``--workdir /tmp/x`` shows the cost
on this machine's one disk.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import logging
import multiprocessing
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import structlog

from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess
from linkguard.bus import Bus, BusMessage
from linkguard.config import ApiSettings, BusSettings, ServiceSettings, SolveSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import Ack, AckResult, PortState, PortStatus
from linkguard.simulations.fleet import SimulatedFleet, agent_settings_for, wait_until
from linkguard.simulations.live import percentile
from linkguard.topology.fabric import Fabric
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.service import TopologyService

TARGET_P99_MS = 100.0


@dataclass
class Fault:
    host: str
    rail: int
    epoch_before: int
    t0: float = 0.0
    wall0: float = 0.0
    state_at: float | None = None  # the service got the port's down state
    solve_at: float | None = None  # the solve that took it started
    split: dict[str, float] = field(default_factory=dict)  # solve/encode/publish ms
    logged_at: float | None = None  # plans_published (after the publish)
    epoch: int | None = None
    plans: int = 0
    messages: tuple[int | None, int | None] = (None, None)  # published: all, peer routes
    acks: dict[str, float] = field(default_factory=dict)  # host -> when the service got it
    apply_ms: list[float] = field(default_factory=list)
    fast_path_at: float | None = None  # the agent's fast-path ack: applied_at (wall)
    cpu_ms: list[float] = field(default_factory=list)  # this process, then each worker

    @property
    def fast_path_ms(self) -> float | None:
        return None if self.fast_path_at is None else (self.fast_path_at - self.wall0) * 1000

    def ms(self, t: float | None) -> float | None:
        return None if t is None else (t - self.t0) * 1000


class Probe:
    """Timestamps what the service receives and does (wraps three methods of its state and
    reads its ``plans_published`` log line) for the fault being measured, :attr:`current`."""

    def __init__(self) -> None:
        self.current: Fault | None = None

    def attach(self, service: TopologyService) -> None:
        state = service.state
        on_ack, on_port_state, prepare = state.on_ack, state.on_port_state, state.prepare

        def ack(a: Ack) -> None:
            f = self.current
            if f is not None and a.fast_path and a.host == f.host and f.fast_path_at is None:
                f.fast_path_at = a.applied_at
            elif (
                f is not None
                and f.epoch is not None
                and a.result == AckResult.APPLIED
                and a.epoch >= f.epoch
                and a.host not in f.acks
            ):
                f.acks[a.host] = time.monotonic()
                if a.apply_ms is not None:
                    f.apply_ms.append(a.apply_ms)
            on_ack(a)

        def port_state(st: PortState) -> bool:
            f = self.current
            down = st.status == PortStatus.DOWN
            if f is not None and f.state_at is None and st.host == f.host and down:
                f.state_at = time.monotonic()
            return on_port_state(st)

        def prep() -> dict:
            f = self.current
            if f is not None and f.state_at is not None and f.solve_at is None:
                f.solve_at = time.monotonic()
            return prepare()

        state.on_ack, state.on_port_state, state.prepare = ack, port_state, prep  # type: ignore[method-assign]

    def log_processor(self, _logger: object, method: str, event: dict) -> dict:
        f = self.current
        published = event.get("event") == "plans_published"
        if published and f is not None and f.solve_at and not f.split:
            f.split = {k: event[k] for k in ("solve_ms", "encode_ms", "publish_ms")}
            f.messages = (event.get("messages"), event.get("peer_routes"))
            f.logged_at = time.monotonic()
        if method in ("debug", "info"):
            raise structlog.DropEvent
        return event


def _freeze_heap() -> bool:
    """Move everything allocated so far out of the garbage collector's sight (``gc.freeze``).
    One process here holds the heaps of 128-256 agents (and the service's), and each full
    collection walks all of them: a cost that grows with the agents per process, which a host
    running its one agent does not pay. Measured: it was most of the agents' CPU per fault."""
    gc.collect()
    gc.freeze()
    return True


@contextlib.contextmanager
def _ack_only(enabled: bool) -> Iterator[None]:
    """The baseline (``enabled``): every agent acks a peer routes message as soon as it
    arrives, with the epoch it names, and does nothing else (no validation, scope check,
    expansion, apply or state file). What is left is what the broker, the MQTT clients and the
    event loops cost on this machine for the same faults: the floor under the real run."""
    if not enabled:
        yield
        return
    real = Agent._on_peer_routes

    async def ack_only(self: Agent, msg: BusMessage, peer: str) -> None:
        have = self.plan_received
        if not msg.payload or have is None:
            await real(self, msg, peer)
            return
        epoch = max(json.loads(msg.payload)["epoch"], have.epoch)
        ack = Ack(host=self.host, epoch=epoch, result=AckResult.APPLIED, applied_at=time.time())
        await self._send_ack(ack)

    Agent._on_peer_routes = ack_only  # type: ignore[method-assign]
    try:
        yield
    finally:
        Agent._on_peer_routes = real  # type: ignore[method-assign]


def _quiet_logs(processor: Callable | None = None) -> None:
    """Warnings and errors to stderr; info and debug only through ``processor``."""
    structlog.configure(
        processors=[
            *([processor] if processor else []),
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.INFO if processor else logging.WARNING
        ),
    )
    logging.getLogger().setLevel(logging.WARNING)


def _all_acked(service: TopologyService, n: int, floor: int) -> bool:
    state = service.state
    acks = state.acks
    return len(state.published) == n and all(
        (a := acks.get(h)) is not None
        and a.result == AckResult.APPLIED
        and a.epoch == state.acked_epoch(h)
        and a.epoch >= floor
        for h in state.published
    )


# -- the fleet: in this process, or agents in worker processes -------------------------------


class _InProcess:
    """:class:`SimulatedFleet`: service and agents in this process's event loop."""

    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.service = fleet.service

    async def __aenter__(self) -> _InProcess:
        await self.fleet.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.fleet.__aexit__(*exc)

    async def link(self, host: str, rail: int, *, up: bool) -> tuple[float, float]:
        t0, wall0 = time.monotonic(), time.time()
        (self.fleet.link_up if up else self.fleet.link_down)(host, rail)
        return t0, wall0

    async def cpu(self) -> list[float]:
        return []  # no workers


def _agents_main(conn: Connection, spec: dict) -> None:
    """A worker process: the agents of ``spec["hosts"]`` in one event loop; commands from
    ``conn``: ("down"|"up", host, rail) -> (monotonic, wall) when the port changed; "stop"."""
    _quiet_logs()
    with _ack_only(spec["baseline"]):
        asyncio.run(_agents(conn, spec))


async def _agents(conn: Connection, spec: dict) -> None:
    fabric = generate_rail_optimized(hosts=spec["n"], rails=spec["rails"])
    bus = BusSettings.model_validate(spec["bus"])
    damping = DampingPolicy.model_validate(spec["damping"])
    sources: dict[str, SimulatedPortSource] = {}
    agents = []
    for host in spec["hosts"]:
        inv = fabric.host(host)
        sources[host] = SimulatedPortSource(
            [active_port(h.hca, h.port, link_layer=h.link_layer) for h in inv.hcas]
        )
        settings = agent_settings_for(
            fabric, host, bus=bus, workdir=Path(spec["workdir"]), damping=damping
        )
        agents.append(
            Agent(settings, source=sources[host], table=MemoryRouteTable(), discovered=[])
        )
    tasks = [asyncio.create_task(a.run(), name=f"agent:{a.host}") for a in agents]
    commands: asyncio.Queue[object] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), lambda: commands.put_nowait(conn.recv()))
    conn.send("ready")
    cpu0 = time.process_time()
    profiler = cProfile.Profile() if spec.get("profile") else None
    frozen = not spec.get("gc_freeze", True)
    while (cmd := await commands.get()) != "stop":
        what, host, rail = cmd  # type: ignore[misc]
        if what == "down" and not frozen:
            frozen = _freeze_heap()
        if profiler is not None and what == "down":
            profiler.enable()  # from the first fault to the end of the run
        if what == "cpu":  # CPU s this process used since the last ask
            cpu, cpu0 = time.process_time() - cpu0, time.process_time()
            conn.send(cpu)
            continue
        hca = next(h for h in fabric.host(host).hcas if h.rail == rail)
        t0, wall0 = time.monotonic(), time.time()
        src = sources[host]
        (src.link_up if what == "up" else src.link_down)(hca.hca, hca.port)
        conn.send((t0, wall0))
    loop.remove_reader(conn.fileno())
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(spec["profile"])
    for a in agents:
        a.stop()
    await asyncio.gather(*tasks, return_exceptions=True)


class _Workers:
    """The service in this process, the agents in ``procs`` worker processes."""

    def __init__(
        self,
        fabric: Fabric,
        *,
        procs: int,
        bus: BusSettings,
        workdir: Path,
        damping: DampingPolicy,
        settings: ServiceSettings,
        profile: str | None = None,
        gc_freeze: bool = True,
        baseline: bool = False,
    ) -> None:
        self.service = TopologyService(settings, fabric=fabric)
        names = fabric.host_names
        ctx = multiprocessing.get_context("spawn")
        self.conns: dict[str, Connection] = {}
        self.procs = []
        self._pipes = []
        for i in range(procs):
            mine = names[i::procs]
            parent, child = ctx.Pipe()
            spec = {
                "n": len(names),
                "rails": len(fabric.rails),
                "hosts": mine,
                "bus": bus.model_dump(mode="json"),
                "damping": damping.model_dump(mode="json"),
                "workdir": str(workdir / "fleet"),
                "profile": f"{profile}.worker{i + 1}" if profile else None,
                "gc_freeze": gc_freeze,
                "baseline": baseline,
            }
            self.procs.append(ctx.Process(target=_agents_main, args=(child, spec), daemon=True))
            self._pipes.append(parent)
            for h in mine:
                self.conns[h] = parent

    async def __aenter__(self) -> _Workers:
        self._task = asyncio.create_task(self.service.run(), name="service")
        for p in self.procs:
            p.start()
        for c in self._pipes:
            if await asyncio.to_thread(c.recv) != "ready":
                raise RuntimeError("a worker did not start")
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in self._pipes:
            c.send("stop")
        for p in self.procs:
            await asyncio.to_thread(p.join, 30)
        self.service.stop()
        await asyncio.gather(self._task, return_exceptions=True)

    async def link(self, host: str, rail: int, *, up: bool) -> tuple[float, float]:
        conn = self.conns[host]
        conn.send(("up" if up else "down", host, rail))
        return await asyncio.to_thread(conn.recv)

    async def cpu(self) -> list[float]:
        """CPU s each worker used since the last call."""
        out = []
        for c in self._pipes:
            c.send(("cpu", "", 0))
            out.append(await asyncio.to_thread(c.recv))
        return out


# -- the run ------------------------------------------------------------------------------------


async def _bench(args: argparse.Namespace, workdir: Path) -> None:
    probe = Probe()
    _quiet_logs(probe.log_processor)
    runs: dict[str, tuple[list[Fault], float]] = {}
    for name in (["baseline"] if args.baseline else []) + ["linkguard"]:
        print(f"-- {name}: " + _RUNS[name])
        runs[name] = await _run(args, workdir / name, probe, baseline=name == "baseline")
    faults, wall_s = runs["linkguard"]
    _print(faults, wall_s, baseline=runs.get("baseline", (None,))[0])


_RUNS = {
    "baseline": "agents ack each peer routes message on arrival and do nothing else",
    "linkguard": "the real agents",
}


async def _run(
    args: argparse.Namespace, workdir: Path, probe: Probe, *, baseline: bool
) -> tuple[list[Fault], float]:
    """One run of ``args.faults`` faults on a fresh fleet and broker: the faults and the wall s."""
    fabric = generate_rail_optimized(hosts=args.hosts, rails=args.rails)
    n = len(fabric.hosts)
    broker = None
    bus_factory = Bus
    bus = BusSettings(reconnect_min_s=0.05, reconnect_max_s=1.0)
    if args.bus == "mosquitto":
        broker = MosquittoProcess(workdir / "broker").start()
        bus = bus.model_copy(update={"port": broker.port})
    else:
        from linkguard.membus import MemoryBroker

        bus_factory = MemoryBroker().bus_factory  # type: ignore[assignment]
    damping = DampingPolicy(hold_down_initial_s=args.hold_down, hold_down_max_s=args.hold_down)
    debounce_ms = SolveSettings.model_fields["short_ms"].default
    rng = random.Random(args.seed)
    try:
        t_start = time.monotonic()
        if args.procs:
            fleet: _InProcess | _Workers = _Workers(
                fabric,
                procs=args.procs,
                bus=bus,
                workdir=workdir,
                damping=damping,
                settings=ServiceSettings(
                    bus=bus,
                    solve=SolveSettings(short_ms=debounce_ms),
                    startup_settle_s=0.2,
                    api=ApiSettings(enabled=False),
                ),
                profile=args.profile,
                gc_freeze=args.gc_freeze,
                baseline=baseline,
            )
            where = f"the service here, the agents in {args.procs} worker processes"
        else:
            fleet = _InProcess(
                SimulatedFleet(
                    fabric,
                    bus=bus,
                    workdir=workdir / "fleet",
                    damping=damping,
                    debounce_ms=debounce_ms,
                    bus_factory=bus_factory,
                )
            )
            where = "service and agents in one process"
        service = fleet.service
        svc = service.settings
        holddown_s = svc.solve.holddown_ms / 1000
        delays = [svc.solve.initial_ms, svc.solve.short_ms, svc.solve.long_ms]
        probe.attach(service)

        async def acked(floor: int) -> None:
            await wait_until(lambda: _all_acked(service, n, floor), 300, f"acks of {floor}")

        with _ack_only(baseline and not args.procs):
            async with fleet:
                await acked(0)
                ports = n * args.rails
                await wait_until(lambda: len(service.state.ports) >= ports, 300, "port states")
                await asyncio.sleep(holddown_s)
                if args.gc_freeze:
                    _freeze_heap()
                print(
                    f"{n} agents x {args.rails} rails, {where} ({args.bus} bus), up and quiet "
                    f"in {time.monotonic() - t_start:.1f} s; solve back-off "
                    f"{'/'.join(f'{d:g}' for d in delays)} ms, hold-down {args.hold_down:g} s, "
                    f"state dirs in {workdir}"
                )
                faults = await _faults(args, fabric, fleet, probe, rng, acked, holddown_s)
        return faults, time.monotonic() - t_start
    finally:
        if broker is not None:
            broker.stop()


async def _faults(
    args: argparse.Namespace,
    fabric: Fabric,
    fleet: _InProcess | _Workers,
    probe: Probe,
    rng: random.Random,
    acked: Callable[[int], Awaitable[None]],
    holddown_s: float,
) -> list[Fault]:
    service = fleet.service
    n = len(fabric.hosts)
    faults: list[Fault] = []
    profiler = cProfile.Profile() if args.profile else None
    for i in range(args.faults):
        host = fabric.hosts[rng.randrange(n)].host
        rail = rng.randrange(args.rails)
        f = Fault(host, rail, service.state.epoch)
        probe.current = f
        await fleet.cpu()
        cpu0 = time.process_time()
        if profiler is not None:
            profiler.enable()
        f.t0, f.wall0 = await fleet.link(host, rail, up=False)
        await wait_until(lambda f=f: service.state.epoch > f.epoch_before, 30, "the new epoch")
        # the solve's first epoch: its peer routes'; its plans take the next one
        f.epoch = f.epoch_before + 1
        await acked(f.epoch)
        if profiler is not None:
            profiler.disable()
        f.cpu_ms = [(time.process_time() - cpu0) * 1000]
        f.cpu_ms += [c * 1000 for c in await fleet.cpu()]
        st = service.state
        f.plans = sum(1 for h in st.published if (st.acked_epoch(h) or 0) >= f.epoch)
        probe.current = None
        faults.append(f)
        epoch1 = service.state.epoch
        await fleet.link(host, rail, up=True)
        await wait_until(lambda e=epoch1: service.state.epoch > e, 30, "re-admission")
        await acked(epoch1 + 1)
        await asyncio.sleep(holddown_s)  # the next fault meets a quiet back-off
        if args.progress:
            last = f.ms(max(f.acks.values(), default=None))
            print(f"  fault {i + 1}: {host} rail {rail}: last ack {last:.1f} ms")
    if profiler is not None:
        profiler.dump_stats(args.profile)
        print(f"\nprofile of this process, each down -> its last ack: {args.profile}")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile_top)
    return faults


def _figures(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"p50 {percentile(xs, 50):7.1f}  p99 {percentile(xs, 99):7.1f}  max {max(xs):7.1f} ms"


def _last_acks(faults: list[Fault]) -> list[float]:
    """down -> last ack (ms) of each fault whose acks the probe saw all of."""
    return [f.ms(max(f.acks.values())) for f in faults if f.acks and len(f.acks) == f.plans]


def _print(faults: list[Fault], wall_s: float, *, baseline: list[Fault] | None = None) -> None:
    done = [f for f in faults if f.acks and len(f.acks) == f.plans]
    last = _last_acks(faults)
    first = [f.ms(min(f.acks.values())) for f in faults if f.acks]
    fast = [f.fast_path_ms for f in faults if f.fast_path_ms is not None]
    met = bool(last) and percentile(last, 99) < TARGET_P99_MS  # type: ignore[operator]
    print(f"\n{len(faults)} single host link faults, {wall_s:.0f} s wall")
    print(
        f"  down -> last ack   {_figures(last)}   target p99 < {TARGET_P99_MS:g} ms: "
        + ("met" if met else "MISSED")
    )
    if baseline is not None:
        floor = _last_acks(baseline)
        print(f"    baseline         {_figures(floor)}   (agents that only ack: the floor here)")
        if floor and last:
            ratio = "  ".join(
                f"p{q} {percentile(last, q) / percentile(floor, q):.2f}x" for q in (50, 99)
            )
            print(f"    linkguard / baseline   {ratio}")
    print(f"  down -> first ack  {_figures(first)}")
    print(f"  down -> fast path  {_figures(fast)}  (the host's own backup, no bus)")
    plans = ", ".join(str(p) for p in sorted({f.plans for f in faults}))
    msgs = ", ".join(f"{m} ({r} peer routes)" for m, r in sorted({f.messages for f in faults}))
    print(f"  hosts re-planned   {plans} per fault (every peer needs a /32 for the endpoint)")
    print(f"  messages published {msgs} per fault (compact plans + shared peer routes)")
    if len(done) != len(faults):
        print(f"  {len(faults) - len(done)} fault(s) with acks the probe missed (left out)")
    steps = {
        "agent -> service (port state)": [f.ms(f.state_at) for f in faults],
        "back-off wait": [
            (f.solve_at - f.state_at) * 1000 for f in faults if f.solve_at and f.state_at
        ],
        "solve (thread)": [f.split.get("solve_ms") for f in faults],
        "encode (thread)": [f.split.get("encode_ms") for f in faults],
        "publish (QoS 1)": [f.split.get("publish_ms") for f in faults],
        "published -> last ack": [
            (max(f.acks.values()) - f.logged_at) * 1000 for f in done if f.logged_at
        ],
        "agents' apply, summed": [sum(f.apply_ms) for f in faults],
        "agents' apply, slowest": [max(f.apply_ms, default=0.0) for f in faults],
    }
    cpu = [f.cpu_ms for f in faults if f.cpu_ms]
    if cpu:
        names = ["this process"] + [f"worker {i}" for i in range(1, len(cpu[0]))]
        per = ", ".join(
            f"{name} {statistics.median(c[i] for c in cpu):.0f}" for i, name in enumerate(names)
        )
        print(f"  CPU per fault, down -> last ack (median ms): {per}")
    print("  where the time goes (median, max; the agents start while the publish runs)")
    for name, xs in steps.items():
        vals = [x for x in xs if x is not None]
        if vals:
            print(f"    {name:<32} {statistics.median(vals):8.1f} ms  (max {max(vals):.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--faults", type=int, default=50)
    ap.add_argument("--bus", choices=["mosquitto", "memory"], default="mosquitto")
    ap.add_argument(
        "--procs", type=int, default=0, help="agents in N worker processes (0: in this one)"
    )
    ap.add_argument("--hold-down", type=float, default=0.5, help="s before re-admission")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path, help="agents' state dirs (default: a tmpfs dir)")
    ap.add_argument("--progress", action="store_true", help="a line per fault")
    ap.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave the start-up heaps to the garbage collector (see _freeze_heap)",
    )
    ap.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip the baseline run (agents that only ack; see _ack_only)",
    )
    ap.add_argument("--profile", type=Path, help="cProfile this process, each down -> last ack")
    ap.add_argument("--profile-top", type=int, default=25, help="functions to list")
    args = ap.parse_args()
    if args.procs and args.bus != "mosquitto":
        ap.error("--procs needs --bus mosquitto (the memory bus lives in one process)")
    with contextlib.ExitStack() as stack:
        workdir = args.workdir
        if workdir is None:
            shm = Path("/dev/shm")
            base = str(shm) if shm.is_dir() else None
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=base)))
        asyncio.run(_bench(args, workdir))


if __name__ == "__main__":
    main()
