"""The vertical slice on the real kernel: 3 hosts x 2 rails in network namespaces, a real
Mosquitto, the topology service and one agent process per host.

Take host0's rail-0 link down: every host's linkguard table routes host0's rail-0 endpoint (and
host0 routes everything) over rail 1, host0's rail map moves GPU 0 to rail 1, every host acks the
epoch, and UDP flows to and from host0 GPU 0 flow again. Bring it back: re-admitted only after
the hold-down. Runs on the netlink driver, on the sysfs driver (InfiniBand) and on the sysfs
driver with RoCE ports (netdev carrier merged in); see the test's docstring.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from linkguard.models import PortStatus
from linkguard.simulations.lab import Lab
from tests.e2e.harness import (
    TABLE,
    Observer,
    Procs,
    copy_tree,
    kernel_routes,
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
GPUD_TREE = "leptonai-gpud/tree/sys-class-infiniband-h100.0"


def _set_ib_state(root: Path, hca: str, state: str, phys: str) -> None:
    port = root / hca / "ports" / "1"
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text(phys + "\n")


@pytest.mark.real
@pytest.mark.parametrize("variant", ["netlink", "sysfs", "sysfs-roce"])
async def test_link_down_reroutes_every_host_and_returns_after_hold_down(
    variant: str, mosquitto, tmp_path: Path, fixtures_real: Path
) -> None:
    """netlink: the agent watches the rail netdevs' carrier. sysfs: the agent reads a copy of
    the gpud H100 tree whose mlx5_0 state files the test rewrites (InfiniBand). sysfs-roce: the
    same tree with mlx5_0/mlx5_1 made Ethernet (RoCE); the test changes no sysfs file, so the
    fault is seen only through the netdev carrier merged in from netlink."""
    require_root()
    driver = variant.split("-")[0]
    with Lab.create(hosts=3, rails=2) as lab:
        fabric = lab_fabric(lab)
        roots = None
        if driver == "sysfs":
            roots = {
                h.name: copy_tree(fixtures_real / GPUD_TREE, tmp_path / f"sysfs-{h.name}")
                for h in lab.hosts
            }
            if variant == "sysfs-roce":
                for root in roots.values():
                    for hca in ("mlx5_0", "mlx5_1"):
                        (root / hca / "ports" / "1" / "link_layer").write_text("Ethernet\n")
        cfgs = write_configs(
            tmp_path,
            lab,
            fabric,
            mosquitto.port,
            driver=driver,
            roce=variant != "sysfs",
            hold_down_s=HOLD_DOWN_S,
            sysfs_roots=roots,
        )
        procs = Procs(tmp_path)
        obs = Observer()
        names = [h.name for h in lab.hosts]
        victim = names[0]
        ep0 = str(lab.hosts[0].endpoints[0])  # host0 GPU 0, home rail 0
        try:
            async with observer_bus(mosquitto.port, obs) as bus:
                await bus.wait_connected(10)
                epoch0 = await start_all(procs, obs, cfgs, names)
                for n, lh in zip(names[1:], lab.hosts[1:], strict=True):
                    assert kernel_routes(lh.netns)[ep0] == ("10.100.0.1", "rail0"), n
                assert kernel_routes(lab.hosts[0].netns)["10.200.1.1"] == ("10.100.0.2", "rail0")

                inbound = start_flow(lab, tmp_path, 1, 0, 0, 0, port=5001)  # host1 -> host0
                outbound = start_flow(lab, tmp_path, 0, 0, 2, 0, port=5002)  # host0 -> host2
                await until(
                    lambda: inbound.arrivals() and outbound.arrivals(),
                    10,
                    "UDP flows before the fault",
                    procs,
                )

                # -- link down ----------------------------------------------------------------
                t_down = time.monotonic()
                lab.link_down(0, 0)
                if variant == "sysfs":
                    _set_ib_state(roots[victim], "mlx5_0", "1: DOWN", "2: Polling")

                def rerouted() -> bool:
                    return all(obs.acked(n, epoch0 + 1) for n in names)

                await until(rerouted, 15, "every host to ack the reroute", procs)
                t_last_ack = max(obs.acked(n, epoch0 + 1) for n in names)
                for lh in lab.hosts[1:]:
                    assert kernel_routes(lh.netns)[ep0] == ("10.100.1.1", "rail1"), lh.name
                    # endpoints on healthy rails stay where they were (no churn)
                    assert kernel_routes(lh.netns)[str(lab.hosts[0].endpoints[1])] == (
                        "10.100.1.1",
                        "rail1",
                    )
                    assert (
                        kernel_routes(lh.netns)[
                            str(lab.hosts[2 if lh is lab.hosts[1] else 1].endpoints[0])
                        ][1]
                        == "rail0"
                    )
                v_routes = kernel_routes(lab.hosts[0].netns)
                assert {dev for _, dev in v_routes.values()} == {"rail1"}
                rail_map = (tmp_path / victim / "rail-map.json").read_text()
                assert '"gpu": 0' in rail_map and '"nccl_ib_hca": "=mlx5_1:1"' in rail_map

                t_flow = time.monotonic()
                (gap_in, lost_in), (gap_out, lost_out) = await outages_after_reroute(
                    [inbound, outbound], t_down, t_last_ack, procs
                )
                fast = [a for _, a in obs.acks[victim] if a.fast_path]
                print(
                    f"\n[{variant}] link down -> last ack: {(t_last_ack - t_down) * 1000:.1f} ms;"
                    f" data-plane gap inbound (needs peers' plans) {gap_in:.1f} ms "
                    f"({lost_in} lost), outbound (local fast path) {gap_out:.1f} ms "
                    f"({lost_out} lost); fast path acks: {len(fast)}"
                )
                assert fast, "the victim applied its precomputed backup before the plan"
                # 2 ms between datagrams: a reroute that did not happen shows as a gap of
                # seconds (the flow only returns with the link, after the hold-down)
                assert 0 < gap_in < 2_000 and 0 < gap_out < 2_000
                assert t_flow - t_down < 15

                # -- link up: held down, then re-admitted ------------------------------------
                epoch1 = max(obs.latest_plan(n).epoch for n in names)
                t_up = time.monotonic()
                lab.link_up(0, 0)
                if variant == "sysfs":
                    _set_ib_state(roots[victim], "mlx5_0", "4: ACTIVE", "5: LinkUp")
                await until(
                    lambda: any(
                        s.host == victim
                        and s.hca == "mlx5_0"
                        and s.status == PortStatus.HELD_DOWN
                        and t > t_up
                        for t, s in obs.states
                    ),
                    10,
                    "hold-down state",
                    procs,
                )
                await until(
                    lambda: all(obs.acked(n, epoch1 + 1) for n in names),
                    HOLD_DOWN_S + 15,
                    "re-admission acked",
                    procs,
                )
                t_plan = min(t for n in names for t, p in obs.plans[n] if p.epoch > epoch1)
                readmit = t_plan - t_up
                print(
                    f"[{variant}] link up -> re-admission plan: {readmit * 1000:.1f} ms "
                    f"(hold-down {HOLD_DOWN_S} s)"
                )
                assert readmit >= HOLD_DOWN_S
                for lh in lab.hosts[1:]:
                    assert kernel_routes(lh.netns)[ep0] == ("10.100.0.1", "rail0")
                assert kernel_routes(lab.hosts[0].netns)["10.200.1.1"] == ("10.100.0.2", "rail0")
        finally:
            codes = procs.stop()
        assert codes == dict.fromkeys(codes, 0), f"unclean exits {codes}\n{procs.tails()}"
        # shutdown_policy withdraw: nothing of linkguard's is left in the namespaces
        for lh in lab.hosts:
            assert kernel_routes(lh.netns, TABLE) == {}
