"""The topology service's start-up warning about agents online whose port states are missing."""

from __future__ import annotations

from structlog.testing import capture_logs

from linkguard.config import ServiceSettings
from linkguard.models import HostStatus, PortState, PortStatus
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.service import TopologyService


async def test_online_hosts_without_port_states_are_named_after_the_settle() -> None:
    fabric = generate_rail_optimized(hosts=3, rails=2)
    svc = TopologyService(ServiceSettings(), fabric=fabric)
    for h in ("gpu000", "gpu001", "gpu002"):
        svc.state.on_host_status(HostStatus(host=h, online=h != "gpu002", at=1.0))
    svc.state.on_port_state(
        PortState(
            host="gpu000",
            hca="mlx5_0",
            port=1,
            rail=0,
            status=PortStatus.UP,
            usable=True,
            observed_at=1.0,
        )
    )
    with capture_logs() as logs:
        svc._warn_unknown_ports()
    warned = [e for e in logs if e["event"] == "port_states_missing"]
    # gpu001 is online without states; gpu002 is offline; gpu000 reported
    assert [(e["hosts"], e["first"]) for e in warned] == [(1, ["gpu001"])]
    svc.state.on_port_state(
        PortState(
            host="gpu001",
            hca="mlx5_0",
            port=1,
            rail=0,
            status=PortStatus.UP,
            usable=True,
            observed_at=1.0,
        )
    )
    with capture_logs() as logs:
        svc._warn_unknown_ports()
    assert not [e for e in logs if e["event"] == "port_states_missing"]


def test_device_problems_of_a_host_are_logged_once_and_kept_for_the_api() -> None:
    """An agent's status naming a LAG misconfiguration (HostStatus.device_problems): the
    service logs ``host_device_problems`` once (again only when they change), keeps them for
    the host view, and clears them with a status that has none (or an older agent's)."""
    from linkguard.presence import Me
    from linkguard.topology.core import ServiceCore
    from linkguard.topology.effects import Log

    fabric = generate_rail_optimized(hosts=2, rails=2)
    me = Me(instance="ff", started_at=1.0)
    core = ServiceCore(
        ServiceSettings(), fabric, verifier=None, me=me, elected=False, epoch_start=1
    )
    problem = (
        "mlx5_5/1: netdev ens5np0 is a member of bond1, but mlx5_5 is no bond device "
        "(RoCE LAG not active): not a rail"
    )
    status = HostStatus(host="gpu001", online=True, at=1.0, device_problems=[problem])

    def logged(effects) -> list[dict]:
        return [
            e.fields for e in effects if isinstance(e, Log) and e.event == "host_device_problems"
        ]

    first = logged(core.on_host_status(status, 1.0))
    assert [(f["host"], f["problems"]) for f in first] == [("gpu001", [problem])]
    assert logged(core.on_host_status(status, 2.0)) == []  # the same again: once
    assert core.state.device_problems["gpu001"] == [problem]
    older = HostStatus.model_validate_json(b'{"host": "gpu001", "online": true}')
    assert logged(core.on_host_status(older, 3.0)) == []
    assert core.state.device_problems["gpu001"] == []
