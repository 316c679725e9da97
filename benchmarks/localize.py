"""Probe localiser at fleet scale: ``Localizer.update`` per report window vs. one pass over it.

Usage: ``python benchmarks/localize.py [--hosts 2048] [--rails 8] [--fan-out 4] [--cross-su 2]
[--windows 10] [--seed 0]``.

Builds a generated rail-optimized fabric (DGX SuperPOD layout, as ``linkguard fabric generate``)
and its real probe plan (:func:`~linkguard.topology.probeplan.plan_probes`, default fan-out 4:
2,048 hosts x 8 rails = 65,536 (prober port, target port) pairs). Per window it synthesises one
:class:`~linkguard.topology.localize.PairResult` per pair the way the service keeps them: fresh
:class:`~linkguard.topology.probeplan.PortId` objects per result (the service builds them from
each report), ``window_end`` spread over the window (reports arrive as each host's window ends),
``sent`` = window x rate = 10, and background noise (a seeded 1% of pairs lose 1 of 10, below
``loss_bad``). Scenarios, each on a fresh :class:`~linkguard.topology.localize.Localizer` with the
default settings, ``--windows`` consecutive windows 10 s apart:

- healthy: noise only;
- bad port: one host port loses everything, as prober and as target;
- bad leaf: every pair with an end behind one leaf loses everything;
- leaf recovery: the bad-leaf localiser (verdict raised) fed healthy windows: the hysteresis
  path that sums each raised subject's loss, clearing after ``clear_after_s`` (60 s).

Prints per scenario the median and max wall time of ``update`` over the windows (ms), the peak
Python memory of one ``update`` (tracemalloc, a separate pass: tracing slows the code down), and
the baseline measured in the same run on the same window: building the window's PairResult list
and one pass over it (summing ``lost``), with the ratios. A check line per scenario says whether
the verdicts are the expected ones. Results are built before timing; ``gc.collect()`` runs
between windows, outside the timed region. No I/O besides stdout; numbers move with the load.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from copy import deepcopy

from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.localize import Localizer, PairResult, Verdict
from linkguard.topology.probeplan import PortId, ProbePlan, ProbeSettings, plan_probes

WINDOW_S = 10.0
RATE_PPS = 1.0
NOISE = 0.01  # share of pairs losing one probe per window (below loss_bad)

Lossy = Callable[[PortId, PortId], bool]


def _window(
    pairs: list[tuple[PortId, PortId]],
    offset: dict[str, float],
    lossy: Lossy,
    now: float,
    rng: random.Random,
) -> list[PairResult]:
    """One window's results, built as the service builds them (fresh PortIds per result)."""
    sent = int(WINDOW_S * RATE_PPS)
    out = []
    for p, t in pairs:
        noise = 1 if rng.random() < NOISE else 0
        lost = sent if lossy(p, t) else noise
        out.append(
            PairResult(
                PortId(p.host, p.rail),
                PortId(t.host, t.rail),
                sent,
                lost,
                window_end=now - offset[p.host],
                window_s=WINDOW_S,
                rtt_p50_us=None if lost == sent else 4.0,
                rtt_p99_us=None if lost == sent else 9.0,
            )
        )
    return out


def _peak_mib(fn: Callable[[], object]) -> float:
    gc.collect()
    tracemalloc.start()
    keep = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del keep
    return peak / 2**20


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def _one_pass(results: list[PairResult]) -> int:
    total = 0
    for r in results:
        total += r.lost
    return total


def _run(
    loc: Localizer, make: Callable[[float], list[PairResult]], nows: list[float]
) -> tuple[list[float], list[list[Verdict]]]:
    """Per window: build its results (untimed), then time ``loc.update`` on them."""
    times, verdicts = [], []
    for now in nows:
        results = make(now)
        gc.collect()
        ms, vs = _timed(lambda results=results, now=now: loc.update(results, now))
        times.append(ms)
        verdicts.append(vs)
    return times, verdicts


def _states(verdicts: list[list[Verdict]]) -> list[set[tuple[str, str, str]]]:
    return [{(v.kind, str(v.subject), v.state) for v in vs} for vs in verdicts]


def _check(name: str, got: list[set[tuple[str, str, str]]], want: list[set]) -> bool:
    ok = got == want
    detail = "" if ok else f": got {got}, expected {want}"
    print(f"check {name}: {'expected verdicts' if ok else 'UNEXPECTED verdicts'}{detail}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2048)
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--fan-out", type=int, default=4)
    ap.add_argument("--cross-su", type=int, default=2)
    ap.add_argument("--windows", type=int, default=10, help="windows per scenario (10 s apart)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    gen_ms, fabric = _timed(lambda: generate_rail_optimized(hosts=args.hosts, rails=args.rails))
    settings = ProbeSettings(fan_out=args.fan_out, cross_su=args.cross_su, rate_pps=RATE_PPS)
    plan_ms, plan = _timed(lambda: plan_probes(fabric, settings, seed=args.seed))
    assert isinstance(plan, ProbePlan)
    pairs = [(p, t) for p, ts in plan.targets.items() for t in ts]
    leaves = set(plan.leaf.values())
    print(
        f"fabric: {len(fabric.hosts)} hosts x {args.rails} rails, {len(leaves)} leaves "
        f"(generated in {gen_ms:.0f} ms); probe plan fan-out {args.fan_out} "
        f"(cross-SU {args.cross_su}): {len(plan.targets)} ports, {len(pairs)} pairs per window "
        f"(planned in {plan_ms:.0f} ms)"
    )

    rng = random.Random(args.seed)
    offset = {h.host: rng.uniform(0, WINDOW_S) for h in fabric.hosts}
    ports = sorted(plan.targets)
    victim = ports[len(ports) // 2 + 3]
    bad_leaf = plan.leaf[ports[len(ports) // 3]]
    behind = sum(1 for lf in plan.leaf.values() if lf == bad_leaf)
    n = args.windows
    t0 = 1_000.0
    nows = [t0 + WINDOW_S * w for w in range(n)]
    later = [t0 + WINDOW_S * (n + w) for w in range(n)]

    healthy: Lossy = lambda p, t: False  # noqa: E731
    port_bad: Lossy = lambda p, t: victim in (p, t)  # noqa: E731
    leaf_bad: Lossy = lambda p, t: bad_leaf in (plan.leaf[p], plan.leaf[t])  # noqa: E731

    def maker(lossy: Lossy) -> Callable[[float], list[PairResult]]:
        return lambda now: _window(pairs, offset, lossy, now, rng)

    builds, passes = [], []
    for now in nows[:3]:
        ms, window = _timed(lambda now=now: maker(healthy)(now))
        builds.append(ms)
        passes.append(_timed(lambda window=window: _one_pass(window))[0])
    build_ms, pass_ms = statistics.median(builds), statistics.median(passes)
    scenarios = {
        "healthy": healthy,
        f"bad port ({victim})": port_bad,
        f"bad leaf ({bad_leaf}, {behind} ports)": leaf_bad,
    }

    print(
        f"\nbaseline per window: build the {len(pairs)} PairResults {build_ms:.0f} ms, "
        f"one pass over them {pass_ms:.1f} ms"
    )
    print(
        f"\n{'scenario (' + str(n) + ' windows)':<44} {'median':>9} {'max':>9} {'peak':>9} "
        f"{'/build':>7} {'/pass':>7}"
    )
    outcomes: dict[str, list[list[Verdict]]] = {}
    rows: list[tuple[str, list[float], float]] = []
    for name, lossy in scenarios.items():
        loc = Localizer(plan.leaf)
        first = maker(lossy)(nows[0])
        peak = _peak_mib(lambda first=first: Localizer(plan.leaf).update(first, nows[0]))
        del first
        times, verdicts = _run(loc, maker(lossy), nows)
        outcomes[name] = verdicts
        rows.append((name, times, peak))
        if lossy is leaf_bad:
            first = maker(healthy)(later[0])
            peak = _peak_mib(lambda loc=loc, first=first: _copy(loc).update(first, later[0]))
            del first
            times, verdicts = _run(loc, maker(healthy), later)
            outcomes["leaf recovery"] = verdicts
            rows.append(("leaf recovery (healthy windows after)", times, peak))
    worst = 0.0
    for name, times, peak in rows:
        med, mx = statistics.median(times), max(times)
        worst = max(worst, mx)
        print(
            f"{name:<44} {med:>6.0f} ms {mx:>6.0f} ms {peak:>5.1f} MiB {med / build_ms:>6.1f}x "
            f"{med / pass_ms:>6.0f}x"
        )

    print()
    names = list(outcomes)
    port_v = {("port", str(victim), "raised")}
    leaf_v = {("leaf", bad_leaf, "raised")}
    held = lambda vs: {(k, s, "held") for k, s, _ in vs}  # noqa: E731
    # clear_after_s (60) of low loss from the first healthy window, then "cleared" once
    clear_at = next((w for w, now in enumerate(later) if now - later[0] >= 60.0), None)
    recover_want = [
        {("leaf", bad_leaf, "cleared")}
        if w == clear_at
        else (held(leaf_v) if clear_at is None or w < clear_at else set())
        for w in range(n)
    ]
    ok = [
        _check(names[0], _states(outcomes[names[0]]), [set()] * n),
        _check(names[1], _states(outcomes[names[1]]), [port_v] + [held(port_v)] * (n - 1)),
        _check(names[2], _states(outcomes[names[2]]), [leaf_v] + [held(leaf_v)] * (n - 1)),
        _check("leaf recovery", _states(outcomes["leaf recovery"]), recover_want),
    ]
    seen = [v.seen_as for v in outcomes[names[1]][0]]
    print(f"check bad port seen as: {seen} (expected [('target', 'prober')])")
    print(
        f"\nverdicts {'as expected' if all(ok) else 'NOT as expected'}; slowest update "
        f"{worst:.0f} ms per window of {len(pairs)} pairs (target < 1,000 ms): "
        f"{'met' if worst < 1000 else 'NOT met'}"
    )


def _copy(loc: Localizer) -> Localizer:
    """A localiser with the same raised verdicts (so the recovery pass measures the same work)."""
    return Localizer(loc.leaf_of, loc.settings, deepcopy(loc.active))


if __name__ == "__main__":
    main()
