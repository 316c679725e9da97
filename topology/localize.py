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
   lose), and at least ``min_probers`` distinct prober hosts outside the leaf lose to it;
2. **port as target**: among its probers that reach their other targets (a ``majority`` of those
   pairs are good), at least ``min_probers`` hosts exist and a ``majority`` lose to it;
3. **port as prober**: among its targets that the target's other probers reach, at least
   ``min_probers`` hosts exist and it loses to a ``majority`` of them.

A witness is a *host*, not a port: one host's reports are one agent's word, so several of its
rails probing (or probed by) the same port count once, as lossy when a ``majority`` of its
pairs there lose. A verdict therefore needs ``min_probers`` hosts that agree (the probe plan
gives a port at most one prober port per host, all on its rail, so this changes nothing for
honest reports).

4. **host**: when every port of a host (two or more) is suspect at once and one of them meets
   rule 2 or 3, it is the host or its agent (the probe responder runs in the agent: a frozen
   or restarting agent, or one with probes off, answers nothing), not its links: its port
   verdicts are reported ``inconclusive`` instead (never drained). Whether such a host is
   gone is the agent presence's to judge (the offline route-around's grace and cap).

Pairs touching a leaf judged bad are left out of rules 2 and 3. A pair counts only with
``sent >= min_samples`` and a window that ended at most ``max_age_s`` before ``now``; a pair is
*lossy* when ``lost / sent >= loss_bad``. A port or leaf with lossy pairs that meets no rule is
reported ``inconclusive`` (never drained). Hysteresis: a raised verdict stays until the subject's
loss ratio (lost / sent over its fresh pairs) has stayed below ``loss_clear`` for
``clear_after_s`` and is still low at the update that clears it; silence never clears.
"""

from __future__ import annotations

import copy
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
    update); ``witnesses``/``lossy``: distinct hosts that had evidence / that lost (for a leaf:
    its ports with evidence / dark ones);
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
class _Window:
    """One update's fresh results, latest per pair: ports numbered 0..n-1 in order of first
    appearance (``number`` by (host, rail), ``ports``, ``leaf``), and per pair (parallel lists,
    in order of first appearance) its ends' numbers, probes sent and lost, and whether lossy."""

    number: dict[tuple[str, int], int]
    ports: list[PortId]
    leaf: list[str]
    prober: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    lossy: list[bool] = field(default_factory=list)


@dataclass
class Localizer:
    """Holds raised verdicts between updates (the hysteresis); everything else is recomputed
    from the results given to :meth:`update`."""

    leaf_of: Mapping[PortId, str]
    settings: LocalizeSettings = field(default_factory=LocalizeSettings)
    active: dict[PortId | str, _Active] = field(default_factory=dict)
    _host_ports: dict[str, set[PortId]] | None = field(default=None, init=False, repr=False)

    def update(self, results: Iterable[PairResult], now: float) -> list[Verdict]:
        """Verdicts at ``now`` (module docstring); ``results`` is the latest window per pair
        (a later result for the same pair replaces an earlier one). Ports are told apart by
        value (host, rail), not by object. Cost: linear in the results (about 65,536 pairs per
        window at 2,048 hosts x 8 rails, fan-out 4; ``benchmarks/localize.py``)."""
        w = self._window(results, now)
        found: dict[PortId | str, Verdict] = {}
        bad_leaves = self._leaves(w, found)
        self._ports(w, bad_leaves, found)
        self._hosts(found)
        return self._hysteresis(w, found, now)

    def _hosts(self, found: dict[PortId | str, Verdict]) -> None:
        """Rule 4 (module docstring): a host of two or more ports, every one of them suspect
        at once (a ``port`` or ``inconclusive`` verdict), at least one a ``port`` verdict: the
        host or its agent, not its links. Its port verdicts become ``inconclusive``."""
        if self._host_ports is None:
            by_host: dict[str, set[PortId]] = defaultdict(set)
            for p in self.leaf_of:
                by_host[p.host].add(p)
            self._host_ports = dict(by_host)
        suspect: dict[str, list[PortId]] = defaultdict(list)
        for subject, v in found.items():
            if isinstance(subject, PortId) and v.kind in ("port", "inconclusive"):
                suspect[subject.host].append(subject)
        for host, ports in suspect.items():
            every = self._host_ports.get(host, set())
            if len(every) < 2 or set(ports) != every:
                continue
            if not any(found[p].kind == "port" for p in ports):
                continue
            for p in ports:
                v = found[p]
                found[p] = Verdict(
                    "inconclusive",
                    p,
                    "observed",
                    v.witnesses,
                    v.lossy,
                    seen_as=v.seen_as,
                    reason=f"every rail of {host} is dark at once ({len(every)} ports): the "
                    "host or its agent (frozen, restarting, not answering probes), not a link; "
                    "its agent's presence decides (offline route-around)",
                )

    def _leaf(self, p: PortId) -> str:
        return self.leaf_of.get(p, f"rail{p.rail}")

    def _window(self, results: Iterable[PairResult], now: float) -> _Window:
        """The fresh results, latest per pair, as parallel arrays over small port numbers.
        PortId's hash and == are Python-level calls; numbering each port once keeps them off
        the per-pair path (they were most of the time at fleet scale)."""
        s = self.settings
        number: dict[tuple[str, int], int] = {}
        ports: list[PortId] = []
        latest: dict[tuple[int, int], PairResult] = {}
        for r in results:
            if r.sent < s.min_samples or now - r.window_end > s.max_age_s or r.window_end > now:
                continue
            p, t = r.prober, r.target
            a = number.get((p.host, p.rail))
            if a is None:
                a = number[(p.host, p.rail)] = len(ports)
                ports.append(p)
            b = number.get((t.host, t.rail))
            if b is None:
                b = number[(t.host, t.rail)] = len(ports)
                ports.append(t)
            prev = latest.get((a, b))
            if prev is None or prev.window_end < r.window_end:
                latest[(a, b)] = r
        kept = list(latest.values())
        bad = s.loss_bad
        return _Window(
            number,
            ports,
            [self._leaf(p) for p in ports],
            prober=[a for a, _ in latest],
            target=[b for _, b in latest],
            sent=[r.sent for r in kept],
            lost=[r.lost for r in kept],
            lossy=[r.lost / r.sent >= bad for r in kept],
        )

    def _leaves(self, w: _Window, found: dict[PortId | str, Verdict]) -> set[str]:
        s = self.settings
        leaf = w.leaf
        n = len(w.ports)
        involved = [0] * n  # pairs a port is part of (either end)
        dark_pairs = [0] * n  # of those, lossy
        outside_lossy: dict[str, set[str]] = defaultdict(set)  # per leaf, prober hosts
        ports = w.ports
        for a, b, bad in zip(w.prober, w.target, w.lossy, strict=True):
            involved[a] += 1
            involved[b] += 1
            if bad:
                dark_pairs[a] += 1
                dark_pairs[b] += 1
                if leaf[a] != leaf[b]:
                    outside_lossy[leaf[b]].add(ports[a].host)
        ports_by_leaf: dict[str, list[int]] = defaultdict(list)
        for i in range(n):  # ports in order of first appearance
            ports_by_leaf[leaf[i]].append(i)
        bad_leaves: set[str] = set()
        for lf, behind in ports_by_leaf.items():
            dark = [i for i in behind if dark_pairs[i] >= s.majority * involved[i]]
            if len(dark) < 2:
                continue
            witnesses = len(outside_lossy[lf])
            if (
                len(behind) >= s.min_leaf_ports
                and len(dark) >= s.majority * len(behind)
                and witnesses >= s.min_probers
            ):
                bad_leaves.add(lf)
                found[lf] = Verdict("leaf", lf, "observed", len(behind), len(dark))
            else:
                found[lf] = Verdict(
                    "inconclusive",
                    lf,
                    "observed",
                    len(behind),
                    len(dark),
                    reason=f"{len(dark)} of {len(behind)} ports dark, {witnesses} outside "
                    f"probers lose (need {s.min_leaf_ports} ports, {s.majority:.0%} dark, "
                    f"{s.min_probers} outside probers)",
                )
        return bad_leaves

    def _ports(self, w: _Window, bad_leaves: set[str], found: dict[PortId | str, Verdict]) -> None:
        s = self.settings
        n = len(w.ports)
        pa, pb, lossy = w.prober, w.target, w.lossy
        suspects: set[int] = set()
        for a, b, bad in zip(pa, pb, lossy, strict=True):
            if bad:
                suspects.add(a)
                suspects.add(b)
        if not suspects:
            return
        gone = [lf in bad_leaves for lf in w.leaf]
        # over the pairs kept (no end behind a bad leaf): per port, pairs and good pairs as
        # prober and as target; the pairs of each suspect
        out_n, out_good, in_n, in_good = [0] * n, [0] * n, [0] * n, [0] * n
        as_prober: dict[int, list[int]] = defaultdict(list)
        as_target: dict[int, list[int]] = defaultdict(list)
        for j, (a, b, bad) in enumerate(zip(pa, pb, lossy, strict=True)):
            if gone[a] or gone[b]:
                continue
            out_n[a] += 1
            in_n[b] += 1
            if not bad:
                out_good[a] += 1
                in_good[b] += 1
            if a in suspects:
                as_prober[a].append(j)
            if b in suspects:
                as_target[b].append(j)

        def mostly_good(total: int, good: int, j: int) -> bool:
            """The side's pairs but pair j (one of them) are mostly good."""
            rest, rest_good = total - 1, good - (0 if lossy[j] else 1)
            return rest > 0 and rest_good >= s.majority * rest

        ports = w.ports

        def by_host(pairs: list[int], other: list[int]) -> tuple[int, int]:
            """Witness hosts among ``pairs`` (the host of each pair's ``other`` end) and how
            many of them lose: a host whose pairs there are a ``majority`` lossy."""
            seen: dict[str, list[int]] = {}
            for j in pairs:
                tally = seen.setdefault(ports[other[j]].host, [0, 0])
                tally[0] += 1
                tally[1] += lossy[j]
            return len(seen), sum(1 for n_, bad in seen.values() if bad >= s.majority * n_)

        for i in sorted(suspects, key=lambda i: (ports[i].host, ports[i].rail)):
            if not out_n[i] and not in_n[i]:
                continue  # only in pairs of a bad leaf
            # as target: probers that reach their other targets
            healthy = [j for j in as_target[i] if mostly_good(out_n[pa[j]], out_good[pa[j]], j)]
            n_healthy, t_lossy = by_host(healthy, pa)  # prober hosts
            # as prober: targets that their other probers reach
            reached = [j for j in as_prober[i] if mostly_good(in_n[pb[j]], in_good[pb[j]], j)]
            n_reached, p_lossy = by_host(reached, pb)  # target hosts
            p = ports[i]
            seen: list[str] = []
            if n_healthy >= s.min_probers and t_lossy >= s.majority * n_healthy:
                seen.append("target")
            if n_reached >= s.min_probers and p_lossy >= s.majority * n_reached:
                seen.append("prober")
            if seen:
                found[p] = Verdict(
                    "port",
                    p,
                    "observed",
                    n_healthy + n_reached,
                    t_lossy + p_lossy,
                    seen_as=tuple(seen),
                )
            elif t_lossy + p_lossy > 0 and (t_lossy >= 2 or p_lossy >= 2):
                found[p] = Verdict(
                    "inconclusive",
                    p,
                    "observed",
                    n_healthy + n_reached,
                    t_lossy + p_lossy,
                    reason=f"{t_lossy} of {n_healthy} healthy probers and {p_lossy} of "
                    f"{n_reached} reachable targets lose (need {s.min_probers} witnesses, "
                    f"{s.majority:.0%} losing)",
                )

    @staticmethod
    def _losses(w: _Window) -> tuple[list[list[int]], dict[str, list[int]]]:
        """[sent, lost] summed over the pairs a port is part of (either end), per port number
        and per leaf (a pair with both ends behind one leaf counts once)."""
        per_port = [[0, 0] for _ in w.ports]
        per_leaf: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        leaf = w.leaf
        for a, b, sent, lost in zip(w.prober, w.target, w.sent, w.lost, strict=True):
            for acc in (per_port[a], per_leaf[leaf[a]]):
                acc[0] += sent
                acc[1] += lost
            if b != a:
                per_port[b][0] += sent
                per_port[b][1] += lost
            if leaf[b] != leaf[a]:
                per_leaf[leaf[b]][0] += sent
                per_leaf[leaf[b]][1] += lost
        return per_port, dict(per_leaf)

    def _hysteresis(
        self, w: _Window, found: dict[PortId | str, Verdict], now: float
    ) -> list[Verdict]:
        s = self.settings
        # copy on write: :attr:`active` is replaced whole at the end, so a reader in another
        # thread (the service runs update() off its event loop) sees one window or the next
        active = {k: copy.copy(a) for k, a in self.active.items()}
        out: list[Verdict] = []
        losses: tuple[list[list[int]], dict[str, list[int]]] | None = None
        for subject, v in found.items():
            if v.kind == "inconclusive":
                if subject not in active:
                    out.append(v)
                continue
            a = active.get(subject)
            if a is None:
                active[subject] = _Active(v.kind, now, None, v.seen_as, v.witnesses, v.lossy)
                out.append(Verdict(v.kind, subject, "raised", v.witnesses, v.lossy, v.seen_as))
            else:
                a.low_since, a.witnesses, a.lossy = None, v.witnesses, v.lossy
                out.append(Verdict(v.kind, subject, "held", v.witnesses, v.lossy, a.seen_as))
        for subject, a in list(active.items()):
            if subject in found and found[subject].kind != "inconclusive":
                continue
            if losses is None:
                losses = self._losses(w)
            if isinstance(subject, PortId):
                i = w.number.get((subject.host, subject.rail))
                sent, lost = losses[0][i] if i is not None else (0, 0)
            else:
                sent, lost = losses[1].get(subject, (0, 0))
            loss = lost / sent if sent else None
            if loss is not None and loss < s.loss_clear:
                a.low_since = now if a.low_since is None else a.low_since
            elif loss is not None:
                a.low_since = None
            low_now = loss is not None and loss < s.loss_clear  # silence never clears
            if low_now and a.low_since is not None and now - a.low_since >= s.clear_after_s:
                del active[subject]
                out.append(Verdict(a.kind, subject, "cleared", a.witnesses, a.lossy, a.seen_as))
            else:
                out.append(Verdict(a.kind, subject, "held", a.witnesses, a.lossy, a.seen_as))
        self.active = active
        return out
