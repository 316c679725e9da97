"""Data-plane gap of one host link failure on the namespace lab, with real agents, the real
topology service and a real Mosquitto. Needs root.

    python benchmarks/lab_gap.py [--faults 50] [--interval-ms 2] [--tcp-wait-s 5] [--workdir D]
                                 [--service KEY=VALUE ...] [--agent-set KEY=VALUE ...]

A 4-host x 4-rail lab (the golden scenarios' fabric), UDP flows every ``--interval-ms`` into
gpu001's rail-1 endpoint (from gpu002), out of it (to gpu002) and between two other hosts
(control), and beside them a TCP flow each way between the same endpoints (one 64-byte record
per interval on one connection, its source bound to the endpoint; the receiver logs each
record's arrival, so its gap reads like the UDP one; TCP loses nothing, it delays).
``--faults`` times: gpu001's rail-1 link goes down (the fabric end of its veth); wait until
every host acked the resulting plans and both UDP flows deliver again, and (up to
``--tcp-wait-s``) both TCP flows; the link comes back; wait for its re-admission (hold-down
0.5 s) to be acked and the TCP flows to deliver; then let the bus stay quiet for the service's
solve.holddown_ms, so every fault meets the service's back-off in QUIET, as a first failure
after a stable period does.

Prints p50/p99/max over the faults of: the gap (ms) and datagrams lost in the flow into the
failed rail and out of it, link down -> last ack (ms), and where the time goes: link down ->
the agent's port state on the bus (detection and publish), -> the fast-path ack, -> the first
new plan on the bus (the service's initial delay, solve, publish), -> the last ack (apply on
every host), and the TCP gaps each way with how many faults saw both TCP flows deliver again
before the link came back (a TCP gap of seconds, TCP's retransmission back-off, means the
segment sent just before the reroute waited on the dead rail's unresolved ARP entry: the
agents' ``routes.neighbour_flush`` deletes it). The target is p99 < 50 ms
for the UDP gap; whether it is met is printed next to it. ``--service
solve.initial_ms=0`` (repeatable) runs the service with other settings, ``--agent-set
routes.rto_min_ms=20`` the agents (a setting this linkguard's agent must know), to see what a
setting buys. Progress on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import MosquittoProcess
from linkguard.config import ServiceSettings
from linkguard.logs import configure_logging
from linkguard.simulations.engine import percentile
from linkguard.simulations.lab import Lab
from linkguard.simulations.labprocs import (
    Flow,
    FlowSpec,
    Observer,
    Procs,
    agent_overrides,
    observer_bus,
    roce_fabric,
    start_all,
    start_flows,
    until,
    write_configs,
)
from linkguard.topology.generator import generate_rail_optimized

TARGET_P99_MS = 50.0
VICTIM, PEER, RAIL = "gpu001", "gpu002", 1
#: The agents' hold-down: short and constant (no back-off growth over 50 repeats).
DAMPING = DampingPolicy(hold_down_initial_s=0.5, hold_down_max_s=0.5)


@dataclass
class Sample:
    cmd_ms: float
    gap_in_ms: float
    lost_in: int
    gap_out_ms: float
    lost_out: int
    last_ack_ms: float
    state_ms: float
    fast_ack_ms: float
    first_plan_ms: float
    peer_ack_ms: float
    tcp_in_ms: float = math.nan
    tcp_out_ms: float = math.nan
    tcp_before_up: bool = False  # both TCP flows delivered again before the link came back


@dataclass
class Bench:
    lab: Lab
    obs: Observer
    procs: Procs
    flows: dict[str, Flow]
    names: list[str]
    samples: list[Sample] = field(default_factory=list)


def pct(xs: list[float], p: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    v = percentile(xs, p)
    assert v is not None
    return v


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def quiet(b: Bench, seconds: float) -> None:
    """Until nothing (plan or port state) arrived on the bus for ``seconds``."""

    def done() -> bool:
        last = max(b.obs.last_plan_at, max((t for t, _ in b.obs.states), default=0.0))
        return time.monotonic() - last >= seconds

    await until(done, seconds + 30, "a quiet bus", b.procs)


def all_acked_after(b: Bench, epoch: int) -> float | None:
    """Arrival of the last ack, once every host acked a plan newer than ``epoch``."""
    times = []
    for h in b.names:
        plans = [p for _, p in b.obs.plans.get(h, []) if p.epoch > epoch]
        if not plans:
            return None
        t = b.obs.acked(h, max(p.epoch for p in plans))
        if t is None:
            return None
        times.append(t)
    return max(times)


async def delivered_after(flows: list[Flow], t: float, timeout: float, procs: Procs) -> bool:
    """Whether every flow delivered more than 5 records after ``t`` within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(f.received_after(t) > 5 for f in flows):
            return True
        procs.check_alive()
        await asyncio.sleep(0.01)
    return False


async def one_fault(b: Bench, holddown_s: float, tcp_wait_s: float) -> Sample:
    e0 = b.obs.max_epoch()
    n_states = len(b.obs.states)
    t_down = time.monotonic()
    await asyncio.to_thread(b.lab.link_down, VICTIM, RAIL)
    t_cmd = time.monotonic()
    t_ack = await until(lambda: all_acked_after(b, e0), 15, "the reroute acked", b.procs)
    fin, fout = b.flows["in"], b.flows["out"]
    await until(
        lambda: fin.received_after(t_ack) > 5 and fout.received_after(t_ack) > 5,
        10,
        "both flows to deliver again",
        b.procs,
    )
    t_end = time.monotonic()
    gap_in, lost_in = fin.outage(t_down - 0.2, t_end)
    gap_out, lost_out = fout.outage(t_down - 0.2, t_end)
    state = next(
        t
        for t, st in b.obs.states[n_states:]
        if st.host == VICTIM and st.rail == RAIL and not st.usable
    )
    fast = next((t for t, a in b.obs.acks.get(VICTIM, []) if a.fast_path and t >= t_down), math.nan)
    first_plan = min(t for h in b.names for t, p in b.obs.plans.get(h, []) if p.epoch > e0)
    peer_ack = b.obs.acked(PEER, e0 + 1) or math.nan
    sample = Sample(
        (t_cmd - t_down) * 1000,
        gap_in,
        lost_in,
        gap_out,
        lost_out,
        (t_ack - t_down) * 1000,
        (state - t_down) * 1000,
        (fast - t_down) * 1000,
        (first_plan - t_down) * 1000,
        (peer_ack - t_down) * 1000,
    )
    tcp = [b.flows["tcp-in"], b.flows["tcp-out"]]
    sample.tcp_before_up = await delivered_after(tcp, t_ack, tcp_wait_s, b.procs)
    # repair, wait for the re-admission to be acked, then a quiet bus (the back-off's QUIET)
    e1 = b.obs.max_epoch()
    await asyncio.sleep(0.2)
    await asyncio.to_thread(b.lab.link_up, VICTIM, RAIL)
    t_up = time.monotonic()
    await until(lambda: all_acked_after(b, e1), 15, "the re-admission acked", b.procs)
    await until(lambda: all(f.received_after(t_up) > 5 for f in tcp), 30, "TCP", b.procs)
    await quiet(b, holddown_s + 0.2)
    now = time.monotonic()
    sample.tcp_in_ms = tcp[0].outage(t_down - 0.2, now)[0]
    sample.tcp_out_ms = tcp[1].outage(t_down - 0.2, now)[0]
    return sample


def table(samples: list[Sample]) -> str:
    rows = [
        ("gap into the failed rail (ms)", [s.gap_in_ms for s in samples], True),
        ("  datagrams lost", [float(s.lost_in) for s in samples], False),
        ("gap out of the failed rail (ms)", [s.gap_out_ms for s in samples], True),
        ("  datagrams lost", [float(s.lost_out) for s in samples], False),
        ("link down -> last ack (ms)", [s.last_ack_ms for s in samples], False),
        ("where the time goes, from link down (ms):", [], False),
        ("  `ip link set ... down` returned", [s.cmd_ms for s in samples], False),
        ("  port state on the bus", [s.state_ms for s in samples], False),
        ("  fast-path ack on the bus", [s.fast_ack_ms for s in samples], False),
        ("  first new plan on the bus", [s.first_plan_ms for s in samples], False),
        (f"  {PEER} (the sender into it) acked", [s.peer_ack_ms for s in samples], False),
        ("TCP gap into the failed rail (ms)", [s.tcp_in_ms for s in samples], False),
        ("TCP gap out of the failed rail (ms)", [s.tcp_out_ms for s in samples], False),
    ]
    out = [f"{'':42} {'p50':>8} {'p99':>8} {'max':>8}"]
    for name, xs, target in rows:
        xs = [x for x in xs if not math.isnan(x)]
        if not xs:
            out.append(name)
            continue
        line = f"{name:42} {statistics.median(xs):8.1f} {pct(xs, 99):8.1f} {max(xs):8.1f}"
        if target:
            p99 = pct(xs, 99)
            met = "met" if p99 < TARGET_P99_MS else "NOT met"
            line += f"   target p99 < {TARGET_P99_MS:g} ms: {met}"
        out.append(line)
    early = sum(s.tcp_before_up for s in samples)
    out.append(
        f"TCP flows delivering again before the link came back: {early} of {len(samples)} "
        "faults (else the TCP gap lasted until the link returned)"
    )
    return "\n".join(out)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=50)
    ap.add_argument("--interval-ms", type=float, default=2.0)
    ap.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topology service setting for this run (dotted keys enter sections, e.g. "
        "solve.initial_ms=0; VALUE is YAML)",
    )
    ap.add_argument(
        "--agent-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an agent setting for this run (dotted keys enter sections; VALUE is YAML)",
    )
    ap.add_argument(
        "--tcp-wait-s",
        type=float,
        default=5.0,
        help="how long the link stays down waiting for the TCP flows to resume (s)",
    )
    ap.add_argument("--workdir", type=Path, help="keep configs, logs and flow records here")
    args = ap.parse_args()
    fabric = generate_rail_optimized(hosts=4, rails=4, hosts_per_su=4, spines_per_su=2)
    wd = args.workdir or Path(tempfile.mkdtemp(prefix="lab-gap-"))
    wd.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {}
    for k, v in (a.split("=", 1) for a in args.service):
        *sections, key = k.split(".")
        node = extra
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = yaml.safe_load(v)
    agent_extra = agent_overrides(
        {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in args.agent_set)}
    )
    svc = ServiceSettings(**extra)
    holddown_s = svc.solve.holddown_ms / 1000
    say(
        f"lab_gap: 4 hosts x 4 rails, {args.faults} faults of {VICTIM} rail {RAIL}, flows every "
        f"{args.interval_ms:g} ms; service debounce {svc.solve.short_ms:g} ms, initial delay "
        f"{svc.solve.initial_ms:g} ms, holddown {holddown_s:g} s; workdir {wd}"
    )
    configure_logging("console", "warning")
    broker = MosquittoProcess(wd / "broker").start()
    lab = Lab.from_fabric(fabric)
    procs = Procs(wd)
    obs = Observer()
    try:
        cfgs = write_configs(
            wd,
            lab,
            roce_fabric(fabric),
            broker.port,
            damping=DAMPING,
            debounce_ms=None,
            service_extra=extra,
            agent_extra=agent_extra,
        )
        async with observer_bus(broker.port, obs) as bus:
            await bus.wait_connected(10)
            names = fabric.host_names
            await start_all(procs, obs, cfgs, names)
            v, p, c0, c1 = (lab.host(n) for n in (VICTIM, PEER, "gpu000", "gpu003"))
            specs = {
                "in": FlowSpec(PEER, p.endpoints[RAIL], VICTIM, v.endpoints[RAIL], 46000),
                "out": FlowSpec(VICTIM, v.endpoints[RAIL], PEER, p.endpoints[RAIL], 46001),
                "control": FlowSpec("gpu000", c0.endpoints[0], "gpu003", c1.endpoints[0], 46002),
                "tcp-in": FlowSpec(
                    PEER, p.endpoints[RAIL], VICTIM, v.endpoints[RAIL], 46010, proto="tcp"
                ),
                "tcp-out": FlowSpec(
                    VICTIM, v.endpoints[RAIL], PEER, p.endpoints[RAIL], 46011, proto="tcp"
                ),
            }
            flows = start_flows(lab, wd, list(specs.values()), interval_ms=args.interval_ms)
            b = Bench(lab, obs, procs, dict(zip(specs, flows, strict=True)), names)
            await until(lambda: all(f.arrivals() for f in flows), 10, "flows", procs)
            await quiet(b, holddown_s + 0.2)
            started = time.monotonic()
            for i in range(args.faults):
                s = await one_fault(b, holddown_s, args.tcp_wait_s)
                b.samples.append(s)
                say(
                    f"[{time.monotonic() - started:6.1f} s] fault {i + 1}/{args.faults}: gap in "
                    f"{s.gap_in_ms:.1f} ms, out {s.gap_out_ms:.1f} ms, last ack "
                    f"{s.last_ack_ms:.1f} ms; TCP in {s.tcp_in_ms:.0f} ms, out "
                    f"{s.tcp_out_ms:.0f} ms"
                )
        print(
            f"lab_gap: {len(b.samples)} link-down faults ({VICTIM} rail {RAIL}) on a 4x4 lab, "
            f"real agents/service/Mosquitto, flows every {args.interval_ms:g} ms"
        )
        print(table(b.samples))
    finally:
        codes = procs.stop()
        broker.stop()
        lab.destroy()
    bad = {n: c for n, c in codes.items() if c}
    if bad:
        say(f"unclean exits: {bad}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
