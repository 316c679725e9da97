"""The per-transport job model (linkguard.failuremodel, linkguard.jobcost) on hand-made
outages: timers computed from their parameters, a restart that leaves a held-down flapper out,
a port still down when the job restarts, restarts for other causes re-fusing a pair, TCP and the
collective timeout, the benchmark's JSON, fused pairs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from linkguard.failuremodel import IP_STALL_S, FailureModel, ip_stall_from_json
from linkguard.jobcost import Link, Outage, fused_rails, generated_fused_rails, needless
from linkguard.topology.generator import generate_rail_optimized
from linkguard.transportcost import price, price_transports

T = 4.096e-6 * 2**20  # 4.294967296 s: one RC retransmit timeout at NCCL_IB_TIMEOUT=20
B = 7 * T  # 30.064771072 s: NCCL's budget at NCCL_IB_RETRY_CNT=7


def test_timers_come_from_their_parameters() -> None:
    m = FailureModel()
    assert (m.retransmit_timeout_s, m.nccl_budget_s) == (pytest.approx(T), pytest.approx(B))
    short = FailureModel(nccl_ib_timeout=18, nccl_ib_retry_cnt=5)
    assert short.nccl_budget_s == pytest.approx(5 * 4.096e-6 * 2**18)  # 5.36870912 s
    assert short.grace_s == pytest.approx(4.096e-6 * 2**18)  # fail fast after one timeout
    # RC: the QP resumes at its first retransmission after the link's return, <= the budget
    assert [m.rc_stall_s(x) for x in (0.5, 1, 4.3, 30)] == pytest.approx([T, T, 2 * T, 7 * T])
    # TCP: RTO 200 ms doubling to 120 s, 15 retransmissions, then the connection times out
    assert m.tcp_retransmissions_s == (
        0.2, 0.6, 1.4, 3.0, 6.2, 12.6, 25.4, 51.0, 102.2, 204.6, 324.6, 444.6, 564.6, 684.6,
        804.6,
    )  # fmt: skip
    assert (m.tcp_give_up_s, m.ip_fail_s) == (924.6, 924.6)
    # the lab measured 5.1 s for a 5 s outage and 54.5 s for 40 s
    assert [m.tcp_stall_s(x) for x in (0.05, 5, 40, 300, 804.6)] == [0.2, 6.2, 51.0, 324.6, 804.6]
    assert m.tcp_stall_s(805) is None
    few = FailureModel(tcp_retries2=8)  # 8 retransmissions: the 8th at 51.0, then +51.2 s
    assert (few.tcp_retransmissions_s[-1], few.tcp_give_up_s) == (51.0, 102.2)
    nccl_pg = FailureModel(collective_timeout_s=600)  # ProcessGroupNCCL's 10 min
    assert (nccl_pg.tcp_stall_s(500), nccl_pg.tcp_stall_s(590), nccl_pg.ip_fail_s) == (
        564.6,
        None,
        600,
    )
    # restarts for other causes: Llama 3's 377 other interruptions in 54 days on 16,384 GPUs
    assert m.other_restart_interval_s(16384) == pytest.approx(54 * 86400 / 377)
    assert FailureModel(other_restarts=False).other_restart_interval_s(16384) is None
    for bad in (
        {"nccl_ib_retry_cnt": 8},
        {"nccl_ib_timeout": 0},
        {"tcp_retries2": True},
        {"collective_timeout_s": 0},
        {"ip_stall_s": -0.1},
        {"ip_stall_s": math.nan},
        {"fail_fast_grace_s": -1},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FailureModel(**bad)


def _flap(out_s: list[float | None]) -> list[Outage]:
    """Three 5 s downs of one port at 0, 10 and 20 s; ``out_s``: when linkguard used it
    again after each (s from that down)."""
    return [
        Outage(i, "flap", at, 5.0, 1, reroute_ms=0.0, links=(Link("h", 0, 5.0, out),))
        for i, (at, out) in enumerate(zip((0.0, 10.0, 20.0), out_s, strict=True))
    ]


def test_a_restart_leaves_a_held_down_flapper_out() -> None:
    """A flap of 5 s downs, each longer than the fail-fast wait (4.29 s), with a restart of 1 s
    and no checkpoint loss, so the restarted job is running when the flap goes on."""
    m = FailureModel(restart_s=1, checkpoint_interval_s=0)
    kw = {"transport": "nccl-ib", "gpus": 8, "duration_s": 1000.0}
    held = _flap([100.0, 90.0, 80.0])  # linkguard holds the port out until 100 s
    w, charged = price(held, m, linkguard=True, **kw)
    # fail-fast at 4.29 + 0.1 s, new processes 1 s later, at 5.39 s, while the port is held
    # down: nccl.env leaves it out, so the downs at 10 and 20 s do not touch the job
    assert (w.interruptions, w.stalls, w.idle_s) == (1, 0, pytest.approx(T + 0.1 + 1))
    assert charged == pytest.approx([T + 0.1 + 1, 0, 0])
    # without the hold-down (linkguard using the port as soon as it is up) every down restarts
    eager = _flap([None, None, None])
    w2, _ = price(eager, m, linkguard=True, **kw)
    assert (w2.interruptions, w2.idle_s) == (3, pytest.approx(3 * (T + 0.1 + 1)))
    # without linkguard each 5 s down is ridden out: until the 2nd RC retransmission, 2 T
    wo, _ = price(held, m, linkguard=False, **kw)
    assert (wo.interruptions, wo.stalls, wo.idle_s) == (0, 3, pytest.approx(3 * 2 * T))


def test_a_port_down_when_the_job_restarts_stays_out_of_that_job() -> None:
    """A port down 100 s fails the job; NCCL skips it when the new processes start (still
    down): its next down, after it came back, does not touch that job."""
    m = FailureModel(restart_s=1, checkpoint_interval_s=0)
    found = [
        Outage(0, "link_down", 0.0, 100.0, 1, reroute_ms=0.0, links=(Link("h", 0, 100.0, 110.0),)),
        Outage(1, "link_down", 200.0, 60.0, 1, reroute_ms=0.0, links=(Link("h", 0, 60.0, 70.0),)),
    ]
    kw = {"transport": "nccl-ib", "gpus": 8, "duration_s": 1000.0}
    wo, charged = price(found, m, linkguard=False, **kw)
    assert (wo.interruptions, wo.stalls, wo.idle_s) == (1, 0, pytest.approx(B + 1))
    assert charged == pytest.approx([B + 1, 0.0])
    w, _ = price(found, m, linkguard=True, **kw)  # failed fast instead: 4.39 s after the down
    assert (w.interruptions, w.idle_s) == (1, pytest.approx(T + 0.1 + 1))


def test_restarts_for_other_causes_give_a_fused_pair_back() -> None:
    """Pair 0-1 of one host: rail 0 lost for an hour at 0 s (fails over after the budget),
    rail 1 for an hour at 13,000 s. On 16,384 GPUs the job restarts for other causes every
    12,375.6 s (not charged): the new processes fuse the pair again, so rail 1 fails over too.
    A job that never restarts has no working member left: a restart."""
    found = [
        Outage(0, "link_down", 0.0, 3600.0, 1, reroute_ms=0.0, links=(Link("h", 0, 3600.0),)),
        Outage(1, "link_down", 13000.0, 3600.0, 1, reroute_ms=0.0, links=(Link("h", 1, 3600.0),)),
    ]
    kw = {"transport": "nccl-ib-failover", "gpus": 16384, "duration_s": 20000.0}
    c, _ = price(found, FailureModel(), linkguard=False, **kw)
    assert (c.interruptions, c.stalls, c.idle_s) == (0, 2, pytest.approx(2 * B))
    never = FailureModel(other_restarts=False)
    c2, _ = price(found, never, linkguard=False, **kw)
    assert (c2.interruptions, c2.stalls) == (1, 1)
    assert c2.idle_s == pytest.approx(B + (B + 750 + 900))
    # with linkguard the doomed loss fails at once after the fail-fast wait
    c3, _ = price(found, never, linkguard=True, **kw)
    assert c3.idle_s == pytest.approx(B + (T + 0.1 + 750 + 900))


def test_ip_prices_tcp_the_reroute_and_the_collective_timeout() -> None:
    kw = {"transport": "ip", "gpus": 8, "duration_s": 10_000.0}
    long_ = [Outage(0, "link_down", 0.0, 590.0, 1, reroute_ms=0.0)]
    # 590 s: TCP's 14th retransmission at 684.6 s; with a 600 s collective timeout the job
    # fails at 600 s instead: 600 + 750 + 900 idle
    c, _ = price(long_, FailureModel(), linkguard=False, **kw)
    assert (c.interruptions, c.stalls, c.idle_s) == (0, 1, 684.6)
    c, _ = price(long_, FailureModel(collective_timeout_s=600), linkguard=False, **kw)
    assert (c.interruptions, c.idle_s) == (1, 2250.0)
    c, _ = price(long_, FailureModel(), linkguard=True, **kw)  # rerouted: the measured stall
    assert (c.stalls, c.idle_s) == (1, IP_STALL_S) == (1, 0.2534)
    c, _ = price(long_, FailureModel(ip_stall_s=0.35), linkguard=True, **kw)  # measured
    assert c.idle_s == 0.35
    # a rerouted stall past the collective timeout fails the job with linkguard too
    over = FailureModel(ip_stall_s=700, collective_timeout_s=600)
    c, _ = price(long_, over, linkguard=True, **kw)
    assert (c.interruptions, c.stalls, c.idle_s) == (1, 0, 2250.0)
    # a reroute that took 2 s: broken 2 s, TCP resumes at 3.0 s; one that took 5 s on a 3 s
    # outage landed after the link was back: as without (3.0 s), and needless
    slow = Outage(0, "link_down", 0.0, 10.0, 1, reroute_ms=2000.0)
    late = Outage(1, "link_down", 100.0, 3.0, 1, reroute_ms=5000.0)
    c, charged = price([slow, late], FailureModel(), linkguard=True, **kw)
    assert charged == [3.0, 3.0]
    assert [needless(o, FailureModel()) for o in (slow, late)] == [False, True]
    held = Outage(0, "flap", 0.0, 1.0, 1, reroute_ms=None)  # traffic already elsewhere
    alone = Outage(1, "link_down", 10.0, 1.0, 1, isolated=True, reroute_ms=0.0)
    c, charged = price([held, alone], FailureModel(), linkguard=True, **kw)
    assert charged == [0.0, 1.4]  # the host with no rail left stalls as without


def test_unknown_transports_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown transport 'rdma'"):
        price([], FailureModel(), transport="rdma", linkguard=True, gpus=8, duration_s=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown transport 'tcp'"):
        price_transports([], FailureModel(), gpus=8, duration_s=1, transports=["ip", "tcp"])


def test_the_benchmark_json_gives_the_ip_stall() -> None:
    doc = '{"with_linkguard": {"stall_ms": {"p50": 120, "p99": 312.5}}, "lab": "4x4"}'
    seconds, note = ip_stall_from_json(doc, source="stall.json")
    assert seconds == 0.3125
    assert note == "p99 job stall 312.5 ms, with_linkguard.stall_ms.p99 of stall.json"
    for text, msg in (
        ("{", "stall.json: not JSON"),
        ("[]", "no with_linkguard.stall_ms.p99"),
        ('{"with_linkguard": {"stall_ms": {"p50": 1}}}', "no with_linkguard.stall_ms.p99"),
        ('{"with_linkguard": {"stall_ms": {"p99": "fast"}}}', "is 'fast', not a number of ms"),
        ('{"with_linkguard": {"stall_ms": {"p99": true}}}', "is True, not a number of ms"),
        ('{"with_linkguard": {"stall_ms": {"p99": -3}}}', r"is -3, must be 0\.\.3600000 ms"),
        ('{"with_linkguard": {"stall_ms": {"p99": NaN}}}', r"is nan, must be 0\.\.3600000 ms"),
        # as --ip-stall-ms: at most an hour
        ('{"with_linkguard": {"stall_ms": {"p99": 5e9}}}', r"is 5000000000\.0, must be 0\.\."),
    ):
        with pytest.raises(ValueError, match=msg):
            ip_stall_from_json(text, source="stall.json")


def test_fused_pairs_are_nccl_envs() -> None:
    assert generated_fused_rails(8) == {r: (r - r % 2, r - r % 2 + 1) for r in range(8)}
    # 6 rails: 0-2 on NUMA node 0, 3-5 on node 1: 0-1 and 3-4, then 2 and 5 in rail order
    six = generated_fused_rails(6)
    assert (six[0], six[3], six[2], six[5]) == ((0, 1), (3, 4), (2, 5), (2, 5))
    fabric = generate_rail_optimized(hosts=2, rails=8)
    assert fused_rails(fabric.hosts[0]) == generated_fused_rails(8)


def test_the_ip_stall_constant_is_the_benchmark_result_it_cites() -> None:
    """IP_STALL_S names benchmarks/results/job_stall.json as its source: they agree."""
    result = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "job_stall.json"
    seconds, note = ip_stall_from_json(result.read_text(), source=str(result))
    assert seconds == pytest.approx(IP_STALL_S)
    assert str(result) in note
