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
