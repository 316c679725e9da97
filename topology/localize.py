"""Localise a probe-detected fault: one port, one leaf, or not enough evidence to say.

Consumes: many agents' :class:`PairResult` (per prober port and target port: probes sent and
lost over a window, RTT percentiles; :mod:`linkguard.agent.probe` measures them), each port's
leaf (:attr:`linkguard.topology.probeplan.ProbePlan.leaf`) and ``now``. Produces: the
:class:`Verdict` list of :meth:`Localizer.update` (raised, held and cleared verdicts with their
evidence counts). Pure: no I/O, no clock.

The rules follow the Pingmesh / NetBouncer idea that a fault is where many independent paths
agree (Pingmesh, SIGCOMM 2015; NetBouncer, NSDI 2019):

1. **leaf**: at least ``min_leaf_ports`` ports behind one leaf have evidence, and a
   ``majority`` of them are *dark* (a ``majority`` of the pairs they are part of, either end,
   lose), and at least ``min_probers`` distinct probers outside the leaf lose to it;
2. **port as target**: among its probers that reach their other targets (a ``majority`` of those
   pairs are good), at least ``min_probers`` exist and a ``majority`` lose to it;
3. **port as prober**: among its targets that the target's other probers reach, at least
   ``min_probers`` exist and it loses to a ``majority`` of them.

Pairs touching a leaf judged bad are left out of rules 2 and 3. A pair counts only with
``sent >= min_samples`` and a window that ended at most ``max_age_s`` before ``now``; a pair is
*lossy* when ``lost / sent >= loss_bad``. A port or leaf with lossy pairs that meets no rule is
reported ``inconclusive`` (never drained). Hysteresis: a raised verdict stays until the subject's
loss ratio (lost / sent over its fresh pairs) has stayed below ``loss_clear`` for
``clear_after_s`` and is still low at the update that clears it; silence never clears.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from linkguard.topology.probeplan import PortId

__all__ = ["LocalizeSettings", "Localizer", "PairResult", "Verdict"]


class LocalizeSettings(BaseModel):
    """Evidence thresholds (ratios in 0..1, times in seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_samples: int = Field(5, ge=1, description="probes sent on a pair before it counts")
    min_probers: int = Field(3, ge=1, description="independent witnesses a verdict needs")
    min_leaf_ports: int = Field(2, ge=2, description="ports with evidence behind a bad leaf")
    loss_bad: float = Field(0.5, gt=0, le=1, description="a pair losing this share is lossy")
    loss_clear: float = Field(0.05, ge=0, lt=1, description="loss below which a verdict clears")
    majority: float = Field(0.6, gt=0.5, le=1, description="'most' in the rules")
    clear_after_s: float = Field(60.0, ge=0, description="loss must stay low this long")
    max_age_s: float = Field(30.0, gt=0, description="results older than this are ignored")

    @model_validator(mode="after")
    def _order(self) -> LocalizeSettings:
        if self.loss_clear >= self.loss_bad:
            raise ValueError(f"loss_clear {self.loss_clear} >= loss_bad {self.loss_bad}")
        return self


@dataclass(frozen=True)
class PairResult:
    """One window of probes from ``prober`` to ``target``: ``sent`` probes whose reply deadline
    passed in the window ending at ``window_end`` (seconds, the service's clock), ``lost`` of
    them unanswered; RTT percentiles in microseconds (None when nothing came back)."""

    prober: PortId
    target: PortId
    sent: int
    lost: int
    window_end: float
    window_s: float = 10.0
    rtt_p50_us: float | None = None
    rtt_p99_us: float | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.lost <= self.sent):
            raise ValueError(f"{self.prober}->{self.target}: lost {self.lost} not in 0..sent")


@dataclass(frozen=True)
class Verdict:
    """``kind``: ``port`` (``subject`` a :class:`PortId`), ``leaf`` (a leaf name) or
    ``inconclusive``; ``state``: ``raised`` (new at this update), ``held``, ``cleared`` (this
    update); ``witnesses``/``lossy``: pairs (or probers) that had evidence / that lost;
    ``seen_as``: for ports, the rules that matched (``target``, ``prober``)."""

    kind: Literal["port", "leaf", "inconclusive"]
    subject: PortId | str
    state: Literal["raised", "held", "cleared", "observed"]
    witnesses: int
    lossy: int
    seen_as: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class _Active:
    kind: Literal["port", "leaf"]
    since: float
    low_since: float | None = None
    seen_as: tuple[str, ...] = ()
    witnesses: int = 0
    lossy: int = 0


@dataclass
class Localizer:
    """Holds raised verdicts between updates (the hysteresis); everything else is recomputed
    from the results given to :meth:`update`."""

    leaf_of: Mapping[PortId, str]
    settings: LocalizeSettings = field(default_factory=LocalizeSettings)
    active: dict[PortId | str, _Active] = field(default_factory=dict)

    def update(self, results: Iterable[PairResult], now: float) -> list[Verdict]:
        """Verdicts at ``now`` (module docstring); ``results`` is the latest window per pair
        (a later result for the same pair replaces an earlier one)."""
        s = self.settings
        latest: dict[tuple[PortId, PortId], PairResult] = {}
        for r in results:
            if r.sent < s.min_samples or now - r.window_end > s.max_age_s or r.window_end > now:
                continue
            key = (r.prober, r.target)
            if key not in latest or latest[key].window_end < r.window_end:
                latest[key] = r
        pairs = list(latest.values())
        lossy = {k: r.lost / r.sent >= s.loss_bad for k, r in latest.items()}
        found: dict[PortId | str, Verdict] = {}
        bad_leaves = self._leaves(pairs, lossy, found)
        kept = [
            r
            for r in pairs
            if self._leaf(r.prober) not in bad_leaves and self._leaf(r.target) not in bad_leaves
        ]
        self._ports(kept, lossy, found)
        return self._hysteresis(pairs, found, now)

    def _leaf(self, p: PortId) -> str:
        return self.leaf_of.get(p, f"rail{p.rail}")

    def _leaves(
        self,
        pairs: list[PairResult],
        lossy: dict[tuple[PortId, PortId], bool],
        found: dict[PortId | str, Verdict],
    ) -> set[str]:
        s = self.settings
        involved: dict[PortId, list[bool]] = defaultdict(list)
        outside_lossy: dict[str, set[PortId]] = defaultdict(set)
        for r in pairs:
            bad = lossy[(r.prober, r.target)]
            involved[r.prober].append(bad)
            involved[r.target].append(bad)
            if bad and self._leaf(r.prober) != self._leaf(r.target):
                outside_lossy[self._leaf(r.target)].add(r.prober)
        ports_by_leaf: dict[str, list[PortId]] = defaultdict(list)
        for p in involved:
            ports_by_leaf[self._leaf(p)].append(p)
        bad_leaves: set[str] = set()
        for leaf, ports in ports_by_leaf.items():
            dark = [p for p in ports if sum(involved[p]) >= s.majority * len(involved[p])]
            if len(dark) < 2:
                continue
            witnesses = len(outside_lossy[leaf])
            if (
                len(ports) >= s.min_leaf_ports
                and len(dark) >= s.majority * len(ports)
                and witnesses >= s.min_probers
            ):
                bad_leaves.add(leaf)
                found[leaf] = Verdict("leaf", leaf, "observed", len(ports), len(dark))
            else:
                found[leaf] = Verdict(
                    "inconclusive",
                    leaf,
                    "observed",
                    len(ports),
                    len(dark),
                    reason=f"{len(dark)} of {len(ports)} ports dark, {witnesses} outside "
                    f"probers lose (need {s.min_leaf_ports} ports, {s.majority:.0%} dark, "
                    f"{s.min_probers} outside probers)",
                )
        return bad_leaves

    def _ports(
        self,
        pairs: list[PairResult],
        lossy: dict[tuple[PortId, PortId], bool],
        found: dict[PortId | str, Verdict],
    ) -> None:
        s = self.settings
        by_prober: dict[PortId, list[PairResult]] = defaultdict(list)
        by_target: dict[PortId, list[PairResult]] = defaultdict(list)
        for r in pairs:
            by_prober[r.prober].append(r)
            by_target[r.target].append(r)

        def mostly_good(rs: list[PairResult]) -> bool:
            good = sum(1 for r in rs if not lossy[(r.prober, r.target)])
            return bool(rs) and good >= s.majority * len(rs)

        suspects = {p for (a, b), bad in lossy.items() if bad for p in (a, b)}
        for p in sorted(suspects):
            if p not in by_prober and p not in by_target:
                continue  # only in pairs of a bad leaf
            # as target: probers that reach their other targets
            healthy = [
                r
                for r in by_target[p]
                if mostly_good([x for x in by_prober[r.prober] if x.target != p])
            ]
            t_lossy = sum(1 for r in healthy if lossy[(r.prober, p)])
            # as prober: targets that their other probers reach
            reached = [
                r
                for r in by_prober[p]
                if mostly_good([x for x in by_target[r.target] if x.prober != p])
            ]
            p_lossy = sum(1 for r in reached if lossy[(p, r.target)])
            seen: list[str] = []
            if len(healthy) >= s.min_probers and t_lossy >= s.majority * len(healthy):
                seen.append("target")
            if len(reached) >= s.min_probers and p_lossy >= s.majority * len(reached):
                seen.append("prober")
            if seen:
                found[p] = Verdict(
                    "port",
                    p,
                    "observed",
                    len(healthy) + len(reached),
                    t_lossy + p_lossy,
                    seen_as=tuple(seen),
                )
            elif t_lossy + p_lossy > 0 and (t_lossy >= 2 or p_lossy >= 2):
                found[p] = Verdict(
                    "inconclusive",
                    p,
                    "observed",
                    len(healthy) + len(reached),
                    t_lossy + p_lossy,
                    reason=f"{t_lossy} of {len(healthy)} healthy probers and {p_lossy} of "
                    f"{len(reached)} reachable targets lose (need {s.min_probers} witnesses, "
                    f"{s.majority:.0%} losing)",
                )

    def _loss(self, subject: PortId | str, pairs: list[PairResult]) -> float | None:
        sent = lost = 0
        for r in pairs:
            ends = (r.prober, r.target)
            hit = (
                subject in ends
                if isinstance(subject, PortId)
                else (subject in (self._leaf(r.prober), self._leaf(r.target)))
            )
            if hit:
                sent += r.sent
                lost += r.lost
        return lost / sent if sent else None

    def _hysteresis(
        self, pairs: list[PairResult], found: dict[PortId | str, Verdict], now: float
    ) -> list[Verdict]:
        s = self.settings
        out: list[Verdict] = []
        for subject, v in found.items():
            if v.kind == "inconclusive":
                if subject not in self.active:
                    out.append(v)
                continue
            a = self.active.get(subject)
            if a is None:
                self.active[subject] = _Active(v.kind, now, None, v.seen_as, v.witnesses, v.lossy)
                out.append(Verdict(v.kind, subject, "raised", v.witnesses, v.lossy, v.seen_as))
            else:
                a.low_since, a.witnesses, a.lossy = None, v.witnesses, v.lossy
                out.append(Verdict(v.kind, subject, "held", v.witnesses, v.lossy, a.seen_as))
        for subject, a in list(self.active.items()):
            if subject in found and found[subject].kind != "inconclusive":
                continue
            loss = self._loss(subject, pairs)
            if loss is not None and loss < s.loss_clear:
                a.low_since = now if a.low_since is None else a.low_since
            elif loss is not None:
                a.low_since = None
            low_now = loss is not None and loss < s.loss_clear  # silence never clears
            if low_now and a.low_since is not None and now - a.low_since >= s.clear_after_s:
                del self.active[subject]
                out.append(Verdict(a.kind, subject, "cleared", a.witnesses, a.lossy, a.seen_as))
            else:
                out.append(Verdict(a.kind, subject, "held", a.witnesses, a.lossy, a.seen_as))
        return out
