"""Localising probe loss: one target port, one prober port, a leaf, thin evidence, hysteresis.

Results come from a real probe plan of a generated 2-SU fabric (64 hosts, one rail), so every
port has the plan's 4 probers (2 in its leaf, 2 from the other SU)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.localize import Localizer, LocalizeSettings, PairResult, Verdict
from linkguard.topology.probeplan import PortId, ProbePlan, plan_probes

PLAN: ProbePlan = plan_probes(generate_rail_optimized(hosts=64, rails=1), seed=1)
X = PortId("gpu005", 0)
Y = PortId("gpu040", 0)


def results(
    lossy: Callable[[PortId, PortId], bool], *, at: float, sent: int = 10
) -> list[PairResult]:
    return [
        PairResult(p, t, sent, sent if lossy(p, t) else 0, window_end=at, rtt_p50_us=20.0)
        for p, ts in PLAN.targets.items()
        for t in ts
    ]


def raised(vs: list[Verdict]) -> dict[object, Verdict]:
    return {v.subject: v for v in vs if v.state == "raised"}


def test_a_dead_port_is_localised_to_that_port() -> None:
    loc = Localizer(PLAN.leaf)
    vs = loc.update(results(lambda p, t: X in (p, t), at=100), now=101)
    r = raised(vs)
    assert list(r) == [X]
    assert r[X].kind == "port" and r[X].seen_as == ("target", "prober")
    assert r[X].witnesses == 8 and r[X].lossy == 8  # 4 probers + 4 targets, all losing
    assert not [v for v in vs if v.kind == "leaf"]


def test_single_bad_target_and_single_bad_prober() -> None:
    vs = Localizer(PLAN.leaf).update(results(lambda p, t: t == X, at=100), now=100)
    assert {(v.subject, v.seen_as) for v in vs} == {(X, ("target",))}
    vs = Localizer(PLAN.leaf).update(results(lambda p, t: p == Y, at=100), now=100)
    assert {(v.subject, v.seen_as) for v in vs} == {(Y, ("prober",))}


def test_a_dead_leaf_is_the_leaf_not_32_ports() -> None:
    leaf = PLAN.leaf[X]
    vs = Localizer(PLAN.leaf).update(
        results(lambda p, t: leaf in (PLAN.leaf[p], PLAN.leaf[t]), at=100), now=100
    )
    r = raised(vs)
    assert list(r) == [leaf] and r[leaf].kind == "leaf"
    assert r[leaf].witnesses == 32 and r[leaf].lossy == 32
    assert [v for v in vs if v.kind != "leaf"] == []


def test_thin_evidence_is_inconclusive_and_never_a_verdict() -> None:
    probers = PLAN.probers()[X]
    # only two of X's four probers reported: below min_probers (3)
    some = [
        r for r in results(lambda p, t: t == X, at=100) if r.target != X or r.prober in probers[:2]
    ]
    vs = Localizer(PLAN.leaf).update(some, now=100)
    assert [(v.kind, v.subject, v.witnesses, v.lossy) for v in vs] == [
        ("inconclusive", X, 6, 2)  # 2 probers + its 4 targets, 2 losing
    ]
    assert "need 3 witnesses" in vs[0].reason
    # too few samples per pair (4 < min_samples 5): not evidence at all
    vs = Localizer(PLAN.leaf).update(results(lambda p, t: t == X, at=100, sent=4), now=100)
    assert vs == []
    # stale results (older than max_age_s 30) are ignored
    vs = Localizer(PLAN.leaf).update(results(lambda p, t: t == X, at=100), now=131)
    assert vs == []


def test_clearing_needs_low_loss_for_clear_after_s() -> None:
    s = LocalizeSettings(clear_after_s=60)
    loc = Localizer(PLAN.leaf, s)
    assert raised(loc.update(results(lambda p, t: X in (p, t), at=0), now=0))
    healthy = lambda p, t: False  # noqa: E731
    # recovered at 10 s: held (not yet 60 s of low loss)
    assert [(v.subject, v.state) for v in loc.update(results(healthy, at=10), now=10)] == [
        (X, "held")
    ]
    # no fresh evidence at all, even past 60 s after the first low reading: held
    assert [v.state for v in loc.update([], now=75)] == ["held"]
    # loss 30% (between loss_clear 5% and loss_bad 50%) at 80 s resets the low-loss clock
    partial = [
        PairResult(r.prober, r.target, 10, 3 if X in (r.prober, r.target) else 0, 80)
        for r in results(healthy, at=80)
    ]
    assert [v.state for v in loc.update(partial, now=80)] == ["held"]
    assert [v.state for v in loc.update(results(healthy, at=90), now=90)] == ["held"]
    assert [v.state for v in loc.update(results(healthy, at=140), now=140)] == ["held"]
    assert [(v.subject, v.state) for v in loc.update(results(healthy, at=150), now=150)] == [
        (X, "cleared")
    ]
    assert loc.update(results(healthy, at=160), now=160) == []


def test_ports_are_values_and_the_latest_window_of_a_pair_wins() -> None:
    """The service builds fresh PortIds per report: equal ports are one port, and a pair
    reported twice counts once, as its latest window, whatever order the results come in."""

    def fresh(rs: list[PairResult]) -> list[PairResult]:
        return [
            PairResult(
                PortId(r.prober.host, r.prober.rail),
                PortId(r.target.host, r.target.rail),
                r.sent,
                r.lost,
                r.window_end,
            )
            for r in rs
        ]

    dead = results(lambda p, t: t == X, at=90)
    alive = results(lambda p, t: False, at=100)
    assert Localizer(PLAN.leaf).update(fresh(alive + dead), now=100) == []
    dead = results(lambda p, t: t == X, at=100)
    alive = results(lambda p, t: False, at=90)
    vs = Localizer(PLAN.leaf).update(fresh(dead[::-1] + alive), now=100)
    assert vs == Localizer(PLAN.leaf).update(dead, now=100)
    assert [(v.subject, v.state, v.seen_as, v.witnesses, v.lossy) for v in vs] == [
        (X, "raised", ("target",), 8, 4)  # 4 probers losing + its 4 targets reached
    ]


def test_a_leaf_verdict_clears_after_clear_after_s_of_low_loss() -> None:
    leaf = PLAN.leaf[X]
    behind = lambda p, t: leaf in (PLAN.leaf[p], PLAN.leaf[t])  # noqa: E731
    loc = Localizer(PLAN.leaf, LocalizeSettings(clear_after_s=20))
    assert list(raised(loc.update(results(behind, at=0), now=0))) == [leaf]
    healthy = results(lambda p, t: False, at=10)
    assert [(v.subject, v.state) for v in loc.update(healthy, now=10)] == [(leaf, "held")]
    # 10% loss on the leaf's pairs (over loss_clear 5%, under loss_bad): the clock restarts
    partial = [
        PairResult(r.prober, r.target, 10, 1 if behind(r.prober, r.target) else 0, 20)
        for r in results(lambda p, t: False, at=20)
    ]
    assert [v.state for v in loc.update(partial, now=20)] == ["held"]
    assert [v.state for v in loc.update(results(lambda p, t: False, at=30), now=30)] == ["held"]
    assert [v.state for v in loc.update(results(lambda p, t: False, at=45), now=45)] == ["held"]
    assert [
        (v.subject, v.state) for v in loc.update(results(lambda p, t: False, at=50), now=50)
    ] == [(leaf, "cleared")]
    assert loc.active == {}


def test_one_host_is_one_witness_however_many_of_its_rails_lose() -> None:
    """8 hosts x 8 rails: gpu000's 8 rails all "lose" to gpu003/rail2 (pairs a plan never
    gives: one host, 8 prober ports) while its 4 real probers reach it. Counted per port that
    was 8 of 12 probers losing and a verdict; counted per host it is 1 of 5, not even
    inconclusive. With one real prober losing too: 2 of 5 hosts, inconclusive."""
    plan = plan_probes(generate_rail_optimized(hosts=8, rails=8))
    target = PortId("gpu003", 2)
    probers = sorted(p for p, ts in plan.targets.items() if target in ts)
    assert len(probers) == 4 and all(p.host != "gpu000" for p in probers)

    def window(lossy: Callable[[PortId, PortId], bool]) -> list[PairResult]:
        honest = [
            PairResult(p, t, 10, 10 if lossy(p, t) else 0, window_end=100)
            for p, ts in plan.targets.items()
            for t in ts
        ]
        liar = [PairResult(PortId("gpu000", r), target, 10, 10, window_end=100) for r in range(8)]
        return honest + liar

    assert Localizer(plan.leaf).update(window(lambda p, t: False), now=100) == []
    vs = Localizer(plan.leaf).update(window(lambda p, t: (p, t) == (probers[0], target)), now=100)
    assert [(v.kind, v.subject, v.witnesses, v.lossy) for v in vs] == [
        ("inconclusive", target, 9, 2)  # 5 prober hosts (2 losing) + 4 target hosts
    ]
    assert vs[0].reason.startswith("2 of 5 healthy probers and 0 of 4 reachable targets lose")


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match=r"lost 11 not in 0\.\.sent"):
        PairResult(X, Y, 10, 11, 0)
    with pytest.raises(ValidationError, match=r"loss_clear 0\.5 >= loss_bad 0\.5"):
        LocalizeSettings(loss_clear=0.5)


#: 64 hosts x 4 rails: every host has a port on each rail's plan
PLAN4: ProbePlan = plan_probes(generate_rail_optimized(hosts=64, rails=4), seed=1)


def _results4(lossy: Callable[[PortId, PortId], bool], *, at: float) -> list[PairResult]:
    return [
        PairResult(p, t, 10, 10 if lossy(p, t) else 0, window_end=at)
        for p, ts in PLAN4.targets.items()
        for t in ts
    ]


def test_every_rail_of_a_host_dark_is_the_host_not_its_links() -> None:
    """A frozen agent (its responder answers nothing, its sender sends nothing) darkens every
    rail of its host at once: inconclusive, never a port verdict; one rail of it dark alone
    is still that port."""
    host = "gpu005"
    loc = Localizer(PLAN4.leaf)
    vs = loc.update(_results4(lambda p, t: host in (p.host, t.host), at=100), now=100)
    assert raised(vs) == {} and loc.active == {}
    dark = sorted((v.subject for v in vs), key=str)
    assert dark == [PortId(host, r) for r in range(4)]
    assert {v.kind for v in vs} == {"inconclusive"}
    assert "every rail of gpu005 is dark at once (4 ports)" in vs[0].reason
    # three of its four rails dark: links (a cable bundle, a NIC port group), drained
    three = {PortId(host, r) for r in range(3)}
    vs = Localizer(PLAN4.leaf).update(_results4(lambda p, t: bool({p, t} & three), at=100), 100)
    assert set(raised(vs)) == three and {v.kind for v in raised(vs).values()} == {"port"}
