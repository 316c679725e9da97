"""PortStatus.DEGRADED as every consumer reads it: the service (unusable), the API and
dashboard view, NCCL verdicts, the job-facing rail map, metrics' flap count, the settings."""

from __future__ import annotations

import pytest

from linkguard.agent.railmap import degraded_ports, rail_view
from linkguard.config import AgentSettings
from linkguard.metrics import UNUSABLE as METRICS_UNUSABLE
from linkguard.models import HCAInfo, HostInventory, PortState, PortStatus
from linkguard.nccl import ib_hca, port_verdicts
from linkguard.topology.api import shown
from linkguard.topology.state import UNUSABLE


def st(hca: str, status: PortStatus, rate: float = 400.0, reason: str | None = None) -> PortState:
    return PortState(
        host="gpu000",
        hca=hca,
        port=1,
        rail=int(hca[-1]),
        status=status,
        usable=status == PortStatus.UP,
        rate_gbps=rate,
        reason=reason,
        observed_at=1.0,
    )


STATES = [
    st("mlx5_0", PortStatus.UP),
    st("mlx5_1", PortStatus.DEGRADED, reason="symbol_error 120/60s"),
    st("mlx5_2", PortStatus.UP),
]


def test_degraded_is_unusable_for_the_service_and_metrics() -> None:
    assert PortStatus("degraded") is PortStatus.DEGRADED
    assert PortStatus.DEGRADED in UNUSABLE
    assert {s.value for s in UNUSABLE} == METRICS_UNUSABLE  # the metrics mirror the service's set


def test_api_and_nccl_and_railmap_call_it_degraded() -> None:
    assert shown(STATES[1], link_rate_gbps=400.0) == "degraded"
    inv = HostInventory(host="gpu000", hcas=[HCAInfo(hca=f"mlx5_{r}", rail=r) for r in range(3)])
    verdicts = port_verdicts(inv, STATES)
    assert [(v.key, v.usable, v.why) for v in verdicts] == [
        ("mlx5_0/1", True, None),
        ("mlx5_1/1", False, "degraded"),
        ("mlx5_2/1", True, None),
    ]
    assert ib_hca(verdicts) == "=mlx5_0:1,mlx5_2:1"
    assert degraded_ports(STATES) == ["mlx5_1/1"]
    view = rail_view(
        plan=None, rails={f"mlx5_{r}/1": r for r in range(3)}, states=STATES
    )  # a degraded rail is a lost rail for the job, as a down one
    assert view.lost == (1,) and view.degraded == ("mlx5_1/1",) and view.down == ()


def test_counter_health_settings() -> None:
    s = AgentSettings(host="gpu000")
    assert s.counter_health.window_s == 60.0
    assert s.counter_health.thresholds["symbol_error"].degrade == 100
    s = AgentSettings(
        host="gpu000",
        counter_health={
            "window_s": 30,
            "thresholds": {"symbol_error": {"degrade": 10, "clear": 2}},
        },
        ports=[{"hca": "mlx5_0", "expected_rate_gbps": 400}],
    )
    assert s.counter_health.thresholds["symbol_error"].degrade == 10
    assert s.counter_health.thresholds["port_rcv_errors"].degrade == 100  # default kept
    assert s.ports[0].expected_rate_gbps == 400.0
    with pytest.raises(ValueError, match="must be below degrade"):
        AgentSettings(
            host="gpu000",
            counter_health={"thresholds": {"link_downed": {"degrade": 1, "clear": 1}}},
        )
