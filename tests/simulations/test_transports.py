"""The fleet simulator prices one timeline per transport (linkguard.jobcost through
linkguard.simulations.fleetreport): a link down shorter and one longer than NCCL's budget, a
flap under hold-down, a leaf reboot, a second loss in a fused pair and a down to the end, each
with hand-computed numbers (tests/transport_cases.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.transport_cases import COSTLIER, EXPECTED, OUTAGES, hand_report

SIDES = {
    "without": "without_linkguard",
    "with": "with_linkguard",
    "at_once": "with_linkguard_at_once",
}


def test_outages_carry_each_port_and_when_linkguard_used_it_again(tmp_path: Path) -> None:
    _, rep = hand_report(tmp_path)
    got = [(o.at_s, o.down_s, [x.out_s for x in o.links]) for o in rep.outages]
    assert got == OUTAGES
    # the flap's 2nd and 3rd downs come while the port is held down: no reroute needed
    assert [o.reroute_ms for o in rep.outages] == [0.0, 0.0, 0.0, None, None, 0.0, 0.0, 0.0, 0.0]
    leaf = rep.outages[5]
    assert [(x.host, x.rail) for x in leaf.links] == [(f"gpu00{i}", 3) for i in range(4)]


@pytest.mark.parametrize("transport", ["ip", "nccl-ib", "nccl-ib-failover"])
def test_each_transport_prices_the_same_outages(tmp_path: Path, transport: str) -> None:
    _, rep = hand_report(tmp_path)
    tc = rep.transports[transport]
    for side, (interruptions, stalls, idle) in EXPECTED[transport].items():
        cost = getattr(tc, SIDES[side])
        assert (cost.interruptions, cost.stalls) == (interruptions, stalls), side
        assert cost.idle_s == pytest.approx(idle, abs=1e-5), side
        assert cost.idle_gpu_hours == pytest.approx(idle * 16 / 3600, abs=1e-5)
        assert cost.goodput == pytest.approx(1 - idle / 10_000)
    assert (tc.with_linkguard_at_once is None) == (transport == "ip")
    assert (tc.costlier, tc.costlier_at_once) == COSTLIER[transport]


def test_the_report_shows_every_table_with_its_assumptions(tmp_path: Path) -> None:
    _, rep = hand_report(tmp_path)
    text = rep.text()
    blocks = text.split("\ntransport ")[1:]
    assert [b.split()[0] for b in blocks] == ["ip", "nccl-ib", "nccl-ib-failover"]
    ip, ib, fo = (" ".join(b.split()) for b in blocks)  # the text as one line each
    assert (
        "TCP resumes at its first retransmission" in ip
        and "0.2534 s (measured: p99 of a PyTorch DDP job's stalls" in ip
    )
    assert "with linkguard without interruptions" in ip
    assert "with linkguard fail fast at once without interruptions" in ib
    assert "NCCL's budget 7 x 4.29 s = 30.1 s" in ib and "down 4.29 s (+0.1 s" in ib
    assert (
        "outages charged more with linkguard than without: 1 (entry 0); failing fast at once: 2"
        in ib
    )
    assert "fused pairs as `nccl env --profile failover` forms them" in fo
    # the reroute lines say which clock and what a needless reroute is
    flat = " ".join(text.split())
    assert "simulated clock: the service's solve back-off" in flat
    assert "needless reroutes: 0 (traffic moved off a link only once it was back" in flat
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["transports"]["nccl-ib"]["costlier_with_linkguard"] == [0]
    assert d["transports"]["nccl-ib"]["costlier_with_linkguard_at_once"] == [0, 4]
    assert d["model"]["tcp_give_up_s"] == 924.6 and d["model"]["fail_fast_after_s"] == 4.294967296
