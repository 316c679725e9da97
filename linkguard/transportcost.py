"""The transport cost model: what outages cost a training job, per transport, with and without
linkguard.

Consumes: outages (:class:`~linkguard.jobcost.Outage`: when, how long, which ports, and how
linkguard rerouted them), a :class:`~linkguard.failuremodel.FailureModel` and, for fused NICs,
each port's fused pair. Produces: a :class:`~linkguard.jobcost.Cost` per transport and side
(:func:`price`, :func:`price_transports`) with the assumptions each price rests on
(:func:`assumptions`; :mod:`linkguard.costreport` prints them). Pure: no clock, no I/O.

One synchronous job runs on every GPU; an outage that stops one rank stops them all. Times in s.
What linkguard can do depends on how the job's traffic travels (README, "Jobs"):

``ip`` (Gloo, NCCL's socket transport, IPoIB): a reroute moves the traffic at once.
  Without linkguard the job stalls until TCP's first retransmission at or after the link's
  return (:meth:`~linkguard.failuremodel.FailureModel.tcp_stall_s`: Linux RTO 200 ms doubling
  to 120 s); a link back after the last retransmission (804.6 s) times the connection out
  (924.6 s), and a stall past ``collective_timeout_s`` fails the collective: either way the
  job restarts (failure time + ``restart_s`` + half a checkpoint interval). With linkguard a
  rerouted outage stalls it ``ip_stall_s`` (at least the TCP stall of the reroute time, and
  never more than without); a down of a port linkguard already kept traffic off costs nothing;
  an outage that left a host no usable rail (or whose reroute was never confirmed) costs as
  without.

``nccl-ib`` (NCCL's IB transport): each queue pair stays on the HCA port it connected on, and
  ``NCCL_IB_HCA`` is read once per process, so a reroute moves nothing. A port down no longer
  than NCCL's budget (``NCCL_IB_RETRY_CNT`` x 4.096 us x 2^``NCCL_IB_TIMEOUT``, 30.1 s at 7 /
  20) stalls the job until the next RC retransmission
  (:meth:`~linkguard.failuremodel.FailureModel.rc_stall_s`); a longer one errors the QP and
  fails the job at the budget. With linkguard the fail-fast helper fails it instead, once the
  port has stayed down :attr:`~linkguard.failuremodel.FailureModel.grace_s` (one retransmit
  timeout, 4.29 s) plus ``fail_fast_detect_s``: a blip the QP rides out is never turned into a
  restart (the default policy). "Fail fast at once" (``at_once``) fails on every loss, so
  every blip becomes a restart: priced too, as the honest trade-off. Either way the restarted
  job starts its processes ``restart_s`` after the failure and uses the ports usable then:
  without linkguard NCCL skips ports that are not ACTIVE; with linkguard ``nccl.env`` also
  leaves out ports held down or suppressed (a flapper is not picked again). A port left out
  stays out of that job until its next restart, whatever happens to it.

``nccl-ib-failover`` (NCCL >= 2.29.7, ``NCCL_IB_RESILIENCY_PORT_FAILOVER=1`` over fused NICs,
  :func:`linkguard.nccl.fused_layout`): when a member port's QPs error (after the budget) NCCL
  moves them to a member still working: a stall of the budget. A member that failed stays
  failed for that job (NCCL's per-device state, ``ncclIbResiliencyCheckErrorNotFatal`` in
  ``src/transport/net_ib/p2p_resiliency.cc``, is not reset without
  ``NCCL_IB_RESILIENCY_PORT_RECOVERY``, which linkguard's profile does not set): the loss of
  the last working member fails the job at the budget. With linkguard the fail-fast helper
  fails the job once such a doomed port has stayed down ``grace_s`` (or at once); a fused NIC
  with a member down or left out at a restart has no margin for that job.

The job also restarts for other causes (``FailureModel.other_restarts``: Llama 3's rate, every
3.4 h on 16,384 GPUs); such a restart is charged to neither side, it only ends the job's life as
the RDMA transports track it (the ports it left out, its failed fused members).

Costs: ``interruptions`` (restarts), ``stalls`` (outages that paused the job without a
restart), ``idle_s`` the union of the idle intervals clipped at the window's end. An outage
whose down starts while the job is between a failure and its processes' restart
(``restart_s``) costs nothing more. Reduced bandwidth while a rail is out is not charged.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from linkguard.failuremodel import FailureModel
from linkguard.jobcost import (
    TITLES,
    TRANSPORTS,
    Cost,
    Link,
    Outage,
    Port,
    Transport,
    reroute_s,
)

__all__ = [
    "PricedTransports",
    "TransportCost",
    "assumptions",
    "price",
    "price_transports",
]

_EPS = 1e-9


# -- pricing --------------------------------------------------------------------------------------
_Span = tuple[float, float, bool]  # (start, length, is_restart)


class _Tally:
    """Spans charged per outage, then summed into a :class:`Cost`."""

    def __init__(self, n: int) -> None:
        self.spans: list[list[_Span]] = [[] for _ in range(n)]

    def stall(self, i: int, start: float, length: float) -> None:
        if length > 0:
            self.spans[i].append((start, length, False))

    def restart(self, i: int, start: float, length: float) -> None:
        self.spans[i].append((start, length, True))

    def cost(self, gpus: int, duration_s: float) -> tuple[Cost, list[float]]:
        """The :class:`Cost`, and each outage's own charge (s, its spans' union, clipped)."""
        intervals: list[tuple[float, float]] = []
        interruptions = stalls = 0
        charged = []
        for spans in self.spans:
            ivs = [(a, min(a + n, duration_s)) for a, n, _ in spans if a < duration_s]
            ivs = [iv for iv in ivs if iv[1] > iv[0]]
            if any(r for *_, r in spans):
                interruptions += 1
            elif ivs:
                stalls += 1
            intervals += ivs
            charged.append(round(_union(ivs), 6))
        idle = round(_union(intervals), 6)
        cost = Cost(
            interruptions=interruptions,
            stalls=stalls,
            idle_s=idle,
            idle_gpu_hours=round(idle * gpus / 3600, 6),
            goodput=1 - idle / duration_s,
            interruptions_per_1000_gpu_days=interruptions / (gpus * duration_s / 86400) * 1000,
            intervals=sorted(intervals),
        )
        return cost, charged


def _union(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _restart_span(model: FailureModel, start: float, failed_at: float) -> float:
    """Idle from ``start`` to the failure, the restart, and half a checkpoint interval lost."""
    return failed_at - start + model.restart_s + model.checkpoint_interval_s / 2


def _price_ip(
    found: Sequence[Outage], model: FailureModel, *, linkguard: bool, duration_s: float
) -> _Tally:
    tally = _Tally(len(found))
    running_from = -math.inf  # the job's processes run from then (before: restarting)
    for i, o in enumerate(found):
        if o.at_s < running_from:
            continue  # the job is restarting anyway
        stall = model.tcp_stall_s(o.down_s)  # without linkguard; None: the job fails
        if linkguard and not o.isolated:
            moved = reroute_s(o, model)
            if moved is None:
                continue  # its ports were already out of use: traffic was elsewhere
            tail = model.tcp_stall_s(moved) if moved < o.down_s else None
            rerouted = None if tail is None else max(tail, model.ip_stall_s)
            # a stall past the collective timeout fails the job as without linkguard; the
            # link's own return ends the stall too: never longer than without
            if rerouted is not None and rerouted <= model.collective_timeout_s:
                stall = rerouted if stall is None else min(stall, rerouted)
        if stall is not None:
            tally.stall(i, o.at_s, stall)
            continue
        failed_at = o.at_s + model.ip_fail_s
        if failed_at > duration_s:
            tally.stall(i, o.at_s, duration_s - o.at_s)  # still stalled when the window ends
            continue
        tally.restart(i, o.at_s, _restart_span(model, o.at_s, failed_at))
        running_from = failed_at + model.restart_s
    return tally


def _price_rdma(
    found: Sequence[Outage],
    model: FailureModel,
    *,
    linkguard: bool,
    at_once: bool,
    group_of: Callable[[Port], tuple[Port, ...]],
    gpus: int,
    duration_s: float,
) -> _Tally:
    """The RDMA transports (module docstring): an event loop over port downs, QP errors (a
    port down past the budget), fail-fast firings and restarts for other causes, with the
    job's current life (the ports it does not use: left out at its start or failed over)."""
    tally = _Tally(len(found))
    budget, grace = model.nccl_budget_s, (0.0 if at_once else model.grace_s)
    down: dict[Port, list[tuple[float, float, float]]] = {}  # port -> (start, up, usable)
    events: list[tuple[float, int, int, int, Link, int]] = []
    seq = 0
    for i, o in enumerate(found):
        for link in o.port_links():
            p = (link.host, link.rail)
            out = link.out_s if linkguard and link.out_s is not None else link.down_s
            down.setdefault(p, []).append((o.at_s, o.at_s + link.down_s, o.at_s + out))
            events.append((o.at_s, 0, seq, i, link, 0))
            seq += 1
    every = model.other_restart_interval_s(gpus)
    if every is not None:  # kind 3: a restart for another cause (not charged)
        k = 1
        while k * every <= duration_s:
            events.append((k * every, 3, seq, -1, Link("", -1, 0.0), 0))
            seq, k = seq + 1, k + 1
    heapq.heapify(events)
    life, running_from, unused = 0, -math.inf, set[Port]()

    def start(t: float) -> None:
        """New processes at ``t``: they use the ports usable then (module docstring)."""
        nonlocal life, running_from, unused
        life += 1
        running_from = t
        unused = {p for p, eps in down.items() if any(a <= t < u for a, _, u in eps)}

    def is_down(p: Port, t: float) -> bool:
        return any(a <= t < b for a, b, _ in down.get(p, ()))

    def doomed(p: Port, t: float) -> bool:
        """Whether losing ``p``'s QPs leaves its fused NIC no working member."""
        return not any(q != p and q not in unused and not is_down(q, t) for q in group_of(p))

    def fail(i: int, t: float) -> None:
        tally.restart(i, found[i].at_s, _restart_span(model, found[i].at_s, t))
        start(t + model.restart_s)

    while events:
        t, kind, _, i, link, tag = heapq.heappop(events)
        if kind == 3:
            if t >= running_from:
                start(t)
            continue
        o, p = found[i], (link.host, link.rail)
        if t > duration_s:
            if kind and tag == life:  # a failure after the window: stalled until its end
                tally.stall(i, o.at_s, duration_s - o.at_s)
            continue
        if kind == 0:  # the port goes down
            if t < running_from or p in unused:
                continue  # the job is restarting, or this life does not use the port
            if linkguard and doomed(p, t) and link.down_s > grace + _EPS:
                fire = t + grace + model.fail_fast_detect_s
                heapq.heappush(events, (fire, 2, seq, i, link, life))
            elif link.down_s <= budget + _EPS:
                tally.stall(i, o.at_s, model.rc_stall_s(link.down_s))
            else:
                heapq.heappush(events, (t + budget, 1, seq, i, link, life))
            seq += 1
        elif tag != life:
            continue  # scheduled by a life that has ended
        elif kind == 2:  # fail-fast: still doomed once the grace is over?
            if doomed(p, t):
                fail(i, t)
            elif link.down_s <= budget + _EPS:
                tally.stall(i, o.at_s, model.rc_stall_s(link.down_s))
            else:
                heapq.heappush(events, (o.at_s + budget, 1, seq, i, link, life))
                seq += 1
        else:  # the QP errors: fail over, or fail
            unused.add(p)
            if all(q in unused for q in group_of(p)):
                fail(i, t)
            else:
                tally.stall(i, o.at_s, budget)
    return tally


def price(
    found: Sequence[Outage],
    model: FailureModel,
    *,
    transport: Transport,
    linkguard: bool,
    gpus: int,
    duration_s: float,
    at_once: bool = False,
    fused: Callable[[str, int], tuple[int, ...]] | None = None,
) -> tuple[Cost, list[float]]:
    """What ``found`` (in time order) costs the job on ``transport`` with or without linkguard
    (module docstring), and each outage's own charge (s). ``at_once``: the fail-fast helper
    fails the job on every loss instead of after ``grace_s``. ``fused``: (host, rail) -> the
    rails of its fused NIC (``nccl-ib-failover`` only; default adjacent rails, 0-1, 2-3, ...).
    ValueError for an unknown transport or a window <= 0 s."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    if transport == "ip":
        tally = _price_ip(found, model, linkguard=linkguard, duration_s=duration_s)
    elif transport in ("nccl-ib", "nccl-ib-failover"):
        if transport == "nccl-ib":

            def group_of(p: Port) -> tuple[Port, ...]:
                return (p,)
        else:
            pairs = fused or _default_fused

            def group_of(p: Port) -> tuple[Port, ...]:
                if p[1] < 0:
                    return (p,)
                return tuple((p[0], r) for r in pairs(*p))

        tally = _price_rdma(
            found,
            model,
            linkguard=linkguard,
            at_once=at_once,
            group_of=group_of,
            gpus=gpus,
            duration_s=duration_s,
        )
    else:
        raise ValueError(f"unknown transport {transport!r}; one of {', '.join(TRANSPORTS)}")
    return tally.cost(gpus, duration_s)


def _default_fused(host: str, rail: int) -> tuple[int, ...]:
    """Adjacent rails: 0-1, 2-3, ..."""
    return (rail - rail % 2, rail - rail % 2 + 1)


@dataclass(frozen=True)
class TransportCost:
    """One transport's costs: ``without_linkguard``, ``with_linkguard`` (the default fail-fast
    policy for the RDMA transports) and ``with_linkguard_at_once`` (fail fast on every loss;
    None for ``ip``), ``costlier``: the outages (``entry``) charged more with linkguard than
    without (``costlier_at_once``: with fail fast at once), and the ``assumes`` line."""

    transport: str
    without_linkguard: Cost
    with_linkguard: Cost
    with_linkguard_at_once: Cost | None
    costlier: tuple[int, ...]
    assumes: str
    costlier_at_once: tuple[int, ...] = ()

    @property
    def interruptions_avoided(self) -> int:
        return self.without_linkguard.interruptions - self.with_linkguard.interruptions

    @property
    def gpu_hours_saved(self) -> float:
        return round(self.without_linkguard.idle_gpu_hours - self.with_linkguard.idle_gpu_hours, 6)

    def to_dict(self) -> dict[str, object]:
        return {
            "title": TITLES[self.transport],
            "with_linkguard": self.with_linkguard.to_dict(),
            "without_linkguard": self.without_linkguard.to_dict(),
            "with_linkguard_at_once": (
                None
                if self.with_linkguard_at_once is None
                else self.with_linkguard_at_once.to_dict()
            ),
            "interruptions_avoided": self.interruptions_avoided,
            "gpu_hours_saved": self.gpu_hours_saved,
            "costlier_with_linkguard": list(self.costlier),
            "costlier_with_linkguard_at_once": (
                None if self.with_linkguard_at_once is None else list(self.costlier_at_once)
            ),
            "assumes": self.assumes,
        }


class PricedTransports:
    """For a report that prices its outages per transport (``transports``: transport -> its
    :class:`TransportCost`, in the order printed): the costs its top-level figures repeat."""

    transports: dict[str, TransportCost]

    @property
    def transport(self) -> str:
        """The transport the top-level figures repeat: the only one priced, else ``ip``."""
        return next(iter(self.transports)) if len(self.transports) == 1 else "ip"

    @property
    def with_linkguard(self) -> Cost:
        return self.transports[self.transport].with_linkguard

    @property
    def without_linkguard(self) -> Cost:
        return self.transports[self.transport].without_linkguard


class _PriceArgs(TypedDict):
    """:func:`price`'s arguments that are the same for every transport."""

    gpus: int
    duration_s: float
    fused: Callable[[str, int], tuple[int, ...]] | None


def price_transports(
    found: Sequence[Outage],
    model: FailureModel,
    *,
    gpus: int,
    duration_s: float,
    transports: Iterable[str] = TRANSPORTS,
    fused: Callable[[str, int], tuple[int, ...]] | None = None,
) -> dict[str, TransportCost]:
    """:func:`price` of ``found`` on each of ``transports``, both sides (and, for the RDMA
    transports, fail fast at once), keyed by transport in :data:`TRANSPORTS` order."""
    wanted = set(transports)
    unknown = wanted - set(TRANSPORTS)
    if unknown:
        raise ValueError(
            f"unknown transport {sorted(unknown)[0]!r}; one of {', '.join(TRANSPORTS)}"
        )
    out: dict[str, TransportCost] = {}
    kw = _PriceArgs(gpus=gpus, duration_s=duration_s, fused=fused)
    for t in (t for t in TRANSPORTS if t in wanted):
        wo, charge_wo = price(found, model, transport=t, linkguard=False, **kw)
        w, charge_w = price(found, model, transport=t, linkguard=True, **kw)
        at_once: Cost | None = None
        costlier_at_once: tuple[int, ...] = ()
        if t != "ip":
            at_once, charge_at_once = price(
                found, model, transport=t, linkguard=True, at_once=True, **kw
            )
            costlier_at_once = _dearer(found, charge_at_once, charge_wo)
        out[t] = TransportCost(
            t,
            wo,
            w,
            at_once,
            _dearer(found, charge_w, charge_wo),
            assumptions(t, model),
            costlier_at_once,
        )
    return out


def _dearer(found: Sequence[Outage], charged: list[float], base: list[float]) -> tuple[int, ...]:
    """The outages (``entry``) charged more than ``base`` charged them."""
    return tuple(o.entry for o, a, b in zip(found, charged, base, strict=True) if a > b + 1e-6)


def assumptions(transport: str, model: FailureModel) -> str:
    """The line or two a transport's table states its figures on, with the model's numbers."""
    m = model
    if transport == "ip":
        return (
            f"with linkguard a rerouted outage stalls the job {m.ip_stall_s:g} s "
            f"({m.ip_stall_source}); a port linkguard already held out costs nothing; a host left "
            "without a rail, or a reroute never confirmed, costs as without. Without, TCP "
            "resumes at its first retransmission after the link returns (Linux RTO 200 ms "
            "doubling to 120 s: 0.2, 0.6, 1.4, 3.0, ... s); a link back after the last "
            f"({m.tcp_retries2}th, {m.tcp_retransmissions_s[-1]:g} s) times the connection out at "
            f"{m.tcp_give_up_s:g} s, a stall past the {m.collective_timeout_s:g} s collective "
            "timeout fails the collective: a restart"
        )
    budget = (
        f"NCCL's budget {m.nccl_ib_retry_cnt} x {m.retransmit_timeout_s:.2f} s = "
        f"{m.nccl_budget_s:.1f} s (NCCL_IB_RETRY_CNT={m.nccl_ib_retry_cnt}, "
        f"NCCL_IB_TIMEOUT={m.nccl_ib_timeout})"
    )
    fail_fast = (
        f"with linkguard the fail-fast helper fails the job once the port has been down "
        f"{m.grace_s:.2f} s (+{m.fail_fast_detect_s:g} s to detect; 'fail fast at once': on "
        "every loss)"
    )
    restart = (
        "a restarted job uses the ports usable when its processes start (without: ACTIVE; "
        "with linkguard: not held down or suppressed either)"
    )
    if transport == "nccl-ib":
        return (
            "a reroute does not move a queue pair: a port down up to "
            f"{budget} stalls the job until the next RC retransmission, a longer one fails it "
            f"at the budget; {fail_fast}; {restart}"
        )
    return (
        "fused pairs as `nccl env --profile failover` forms them; a member's QPs fail over "
        f"to its pair after {budget} (a stall of the budget; a shorter down stalls until the "
        "next RC retransmission); a member that failed stays failed for that job, so the loss "
        f"of the last working member of a pair fails it at the budget; {fail_fast}, only for a "
        f"pair's last member; {restart}"
    )
