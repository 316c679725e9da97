"""``linkguard quickstart``: the whole flow in one process, on embedded defaults.

Runs the embedded MQTT broker (127.0.0.1, a free port), the topology service and one simulated
agent per host of a small generated rail-optimized fabric, takes one host's rail link down and
back, and prints what moved where and how long each step took. Needs no root and no hardware:
drivers are simulated, route tables are in memory.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TextIO

from linkguard.agent.monitor import DampingPolicy
from linkguard.broker import embedded_broker
from linkguard.config import BusSettings
from linkguard.models import Plan, PortStatus
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.fabric import Fabric, generate_rail_optimized, home_rails
from linkguard.topology.solver import PlanLookup, nic_load

__all__ = ["QuickstartResult", "run_quickstart"]


class QuickstartResult(dict):
    """Measured figures (ms unless named otherwise)."""


async def run_quickstart(
    *,
    hosts: int = 4,
    rails: int = 4,
    hold_down_s: float = 2.0,
    victim: str | None = None,
    victim_rail: int = 1,
    out: TextIO,
) -> QuickstartResult:
    """Run the scenario; returns the measured figures. Raises TimeoutError if a step stalls."""

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    fabric = generate_rail_optimized(hosts=hosts, rails=rails)
    victim = victim or fabric.hosts[0].host
    vinv = fabric.host(victim)
    vhca = next(h for h in vinv.hcas if h.rail == victim_rail)
    damping = DampingPolicy(
        hold_down_initial_s=hold_down_s, hold_down_max_s=max(hold_down_s * 8, 30.0)
    )
    res = QuickstartResult()
    with tempfile.TemporaryDirectory(prefix="linkguard-quickstart-") as tmp:
        workdir = Path(tmp)
        async with embedded_broker(port=0) as port:
            bus = BusSettings(port=port, reconnect_min_s=0.05)
            say(
                f"linkguard quickstart: embedded broker on 127.0.0.1:{port}, fabric "
                f"{len(fabric.hosts)} hosts x {len(fabric.rails)} rails, hold-down {hold_down_s} s"
            )
            fleet = SimulatedFleet(fabric, bus=bus, workdir=workdir, damping=damping)
            service, sources, tables, agents = (
                fleet.service,
                fleet.sources,
                fleet.tables,
                (fleet.agents),
            )
            async with fleet:
                t0 = time.monotonic()
                t = await fleet.wait_all_acked(timeout=20)
                res["startup_ms"] = (t - t0) * 1000
                say(
                    f"[{res['startup_ms']:7.1f} ms] every host applied its first plan "
                    f"(epoch {service.state.epoch})"
                )
                before = {h: dict(tb.routes) for h, tb in tables.items()}
                plans0 = {h: a.applier.plan for h, a in agents.items()}
                rail_of = {
                    h: {a.gpu: a.rail for a in _acked(agents[h].applier.plan).rail_assignments}
                    for h in agents
                }
                epoch0 = service.state.epoch

                # -- link down --------------------------------------------------------------
                say()
                say(f"taking {victim} {vhca.hca}/{vhca.port} (rail {victim_rail}) DOWN")
                t_down = time.monotonic()
                sources[victim].link_down(vhca.hca, vhca.port)
                va = agents[victim]
                await wait_until(lambda: va.stats.fast_paths >= 1, 10, "local fast path")
                res["fast_path_ms"] = (time.monotonic() - t_down) * 1000
                say(
                    f"[{res['fast_path_ms']:7.1f} ms] {victim}: local fast path moved its "
                    f"rail-{victim_rail} routes to the precomputed backups"
                )
                t = await wait_until(
                    lambda: service.state.epoch > epoch0 and fleet.all_acked(epoch0 + 1),
                    10,
                    "every host to ack the reroute plan",
                )
                res["reroute_all_acked_ms"] = (t - t_down) * 1000
                say(
                    f"[{res['reroute_all_acked_ms']:7.1f} ms] service re-planned (epoch "
                    f"{service.state.epoch}); every host acked"
                )
                plans1 = {h: a.applier.plan for h, a in agents.items()}
                moved = _moved(fabric, plans0, plans1)
                for h in agents:
                    spread = Counter("+".join(map(str, rails)) for _, rails in moved[h])
                    if spread:
                        to = ", ".join(
                            f"{n} via rail {r}" if "+" not in r else f"{n} multipath {r}"
                            for r, n in sorted(spread.items())
                        )
                        say(
                            f"    {h}: {len(moved[h])} peer "
                            f"endpoint{'s' if len(moved[h]) != 1 else ''} moved off rail "
                            f"{victim_rail}: {to}"
                        )
                new_rail = {a.gpu: a.rail for a in _acked(va.applier.plan).rail_assignments}
                for g, r in sorted(new_rail.items()):
                    if rail_of[victim][g] != r:
                        say(
                            f"    {victim}: rail map GPU {g}: rail {rail_of[victim][g]} -> rail {r}"
                        )
                res["routes_moved"] = sum(len(m) for m in moved.values())
                others = _endpoints_per_rail(fabric, victim)
                busiest = max(nic_load(_acked(plans1[victim]), others).values())
                normal = max(nic_load(_acked(plans0[victim]), others).values())
                res["victim_busiest_nic_load"] = busiest / normal
                say(
                    f"    {victim}: busiest NIC now carries {busiest:g} peer endpoints vs "
                    f"{normal:g} before ({busiest / normal:.2f}x; one fixed backup NIC would be "
                    "2.00x)"
                )

                # -- link up ----------------------------------------------------------------
                say()
                epoch1 = service.state.epoch
                say(f"bringing {victim} {vhca.hca}/{vhca.port} back UP")
                t_up = time.monotonic()
                sources[victim].link_up(vhca.hca, vhca.port)
                key = f"{vhca.hca}/{vhca.port}"
                await wait_until(
                    lambda: (
                        (st := va.monitor.state(key)) is not None
                        and st.status == PortStatus.HELD_DOWN
                    ),
                    5,
                    "hold-down",
                )
                say(
                    f"[{(time.monotonic() - t_up) * 1000:7.1f} ms] {victim} {key} is back but "
                    f"HELD DOWN for {hold_down_s} s before reuse"
                )
                t = await wait_until(
                    lambda: service.state.epoch > epoch1 and fleet.all_acked(epoch1 + 1),
                    hold_down_s + 10,
                    "re-admission plan acked",
                )
                res["readmit_ms"] = (t - t_up) * 1000
                back = all(tables[h].routes == before[h] for h in agents)
                say(
                    f"[{res['readmit_ms']:7.1f} ms] re-admitted after hold-down; every host "
                    f"acked epoch {service.state.epoch}; routes back as before: {back}"
                )
                res["routes_restored"] = back
    say()
    say(
        "summary: "
        + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items())
    )
    return res


def _acked(plan: Plan | None) -> Plan:
    """``plan``: an agent's applied plan, asked for only after every host acked one."""
    assert plan is not None, "an agent without a plan after every host acked"
    return plan


def _moved(
    fabric: Fabric, before: dict[str, Plan | None], after: dict[str, Plan | None]
) -> dict[str, list[tuple[object, tuple[int, ...]]]]:
    """Per host: (peer endpoint, new egress rails) of every endpoint whose egress changed."""
    out: dict[str, list[tuple[object, tuple[int, ...]]]] = {}
    for h, plan in after.items():
        old = before.get(h)
        out[h] = []
        if plan is None or old is None:
            continue
        now_look, old_look = PlanLookup(plan), PlanLookup(old)
        for p in fabric.hosts:
            if p.host == h:
                continue
            for ep in p.endpoints:
                now = now_look.egress(ep)
                if now != old_look.egress(ep):
                    out[h].append((ep, now))
    return out


def _endpoints_per_rail(fabric: Fabric, host: str) -> dict[int, int]:
    """Endpoints homed on each rail, the host's own left out."""
    out: Counter[int] = Counter()
    for h in fabric.hosts:
        if h.host != host:
            out.update(home_rails(h))
    return dict(out)
