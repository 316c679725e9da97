"""Compact (prefix-route) plans on the real kernel: 3 hosts x 3 rails in network namespaces with
rail-major endpoints (rail r's GPUs in 10.200.(128+r).0/24), a real Mosquitto, the topology
service and one agent process per host (netlink driver).

All up, every linkguard table holds one on-link route per rail subnet and nothing else. Take
host0's rail-0 link down: host0 routes the rail-0 subnet multipath over rails 1 and 2 (its own
fast path first), every peer adds one /32 for host0's rail-0 endpoint via host0's address on a
surviving rail, UDP flows to and from host0 GPU 0 flow again (the peers reach host0's endpoints
by ARP on whatever rail). Bring it back: after the hold-down every table is exactly as before.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from linkguard.simulations.lab import Lab
from tests.e2e.harness import (
    TABLE,
    Observer,
    Procs,
    kernel_table,
    lab_fabric,
    observer_bus,
    outages_after_reroute,
    start_all,
    start_flow,
    until,
    write_configs,
)
from tests.support import require_root

HOLD_DOWN_S = 2.0
RAILS = 3


def _all_up(lab: Lab) -> dict[str, tuple]:
    return {
        str(net): ("unicast", None, (f"rail{r}",))
        for r, net in sorted(lab.endpoint_subnets.items())
    }


@pytest.mark.real
async def test_prefix_plans_reroute_on_the_kernel(mosquitto, tmp_path: Path) -> None:
    require_root()
    with Lab.create(hosts=3, rails=RAILS, rail_major=True) as lab:
        fabric = lab_fabric(lab)
        cfgs = write_configs(
            tmp_path, lab, fabric, mosquitto.port, driver="netlink", hold_down_s=HOLD_DOWN_S
        )
        procs = Procs(tmp_path)
        obs = Observer()
        names = [h.name for h in lab.hosts]
        victim = lab.hosts[0]
        ep0 = str(victim.endpoints[0])  # host0 GPU 0, home rail 0: 10.200.128.1
        assert ep0 == "10.200.128.1"
        try:
            async with observer_bus(mosquitto.port, obs) as bus:
                await bus.wait_connected(10)
                epoch0 = await start_all(procs, obs, cfgs, names)
                initial = _all_up(lab)
                for lh in lab.hosts:
                    assert kernel_table(lh.netns) == initial, lh.name
                assert all(not obs.latest_plan(n).routes for n in names)

                inbound = start_flow(lab, tmp_path, 1, 0, 0, 0, port=5101)  # host1 -> host0
                outbound = start_flow(lab, tmp_path, 0, 0, 2, 0, port=5102)  # host0 -> host2
                await until(
                    lambda: inbound.arrivals() and outbound.arrivals(),
                    10,
                    "UDP flows before the fault",
                    procs,
                )

                t_down = time.monotonic()
                lab.link_down(0, 0)
                await until(
                    lambda: all(obs.acked(n, epoch0 + 1) for n in names),
                    15,
                    "every host to ack the reroute",
                    procs,
                )
                t_last_ack = max(obs.acked(n, epoch0 + 1) for n in names)
                mine = kernel_table(victim.netns)
                assert mine == {
                    **initial,
                    "10.200.128.0/24": ("unicast", None, ("rail1", "rail2")),
                }
                for lh in lab.hosts[1:]:
                    table = kernel_table(lh.netns)
                    extra = {d: v for d, v in table.items() if d not in initial}
                    assert list(extra) == [ep0], lh.name
                    _, gw, devs = extra[ep0]
                    rail = int(devs[0].removeprefix("rail"))
                    assert rail in (1, 2) and gw == f"10.100.{rail}.1", (lh.name, extra)
                    assert {d: v for d, v in table.items() if d in initial} == initial

                (gap_in, lost_in), (gap_out, lost_out) = await outages_after_reroute(
                    [inbound, outbound], t_down, t_last_ack, procs
                )
                print(
                    f"\n[prefix] link down -> last ack {(t_last_ack - t_down) * 1000:.1f} ms; "
                    f"gap inbound {gap_in:.1f} ms ({lost_in} lost), outbound {gap_out:.1f} ms "
                    f"({lost_out} lost)"
                )
                assert 0 < gap_in < 2_000 and 0 < gap_out < 2_000

                epoch1 = max(obs.latest_plan(n).epoch for n in names)
                t_up = time.monotonic()
                lab.link_up(0, 0)
                await until(
                    lambda: all(obs.acked(n, epoch1 + 1) for n in names),
                    HOLD_DOWN_S + 15,
                    "re-admission acked",
                    procs,
                )
                t_plan = min(t for n in names for t, p in obs.plans[n] if p.epoch > epoch1)
                assert t_plan - t_up >= HOLD_DOWN_S
                for lh in lab.hosts:
                    assert kernel_table(lh.netns) == initial, lh.name
        finally:
            codes = procs.stop()
        assert codes == dict.fromkeys(codes, 0), f"unclean exits {codes}\n{procs.tails()}"
        for lh in lab.hosts:
            assert kernel_table(lh.netns, TABLE) == {}
