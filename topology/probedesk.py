"""The topology service's probe decisions: which pairs each host probes, which reports are taken,
and what a localised verdict changes.

Consumes: the probe epoch to publish targets for, :class:`~linkguard.models.ProbeReport`s of
fabric hosts, the localiser's verdicts, each with ``now`` (monotonic s). Produces: every host's
:class:`~linkguard.models.ProbeTargets`, the :class:`~linkguard.topology.localize.PairResult`s
kept for the localiser, rails marked unusable (or usable again) in the
:class:`~linkguard.topology.state.FabricState`, and the effects to log and emit
(:mod:`linkguard.topology.effects`). Pure: no bus, no clock (the wiring passes ``now`` and,
to show verdicts in Unix time, the wall clock).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from linkguard.config import ProbeRunSettings
from linkguard.models import ProbePeer, ProbeRail, ProbeReport, ProbeTargets
from linkguard.topics import probe_report
from linkguard.topology.effects import Effect, Emit, Log
from linkguard.topology.fabric import Fabric
from linkguard.topology.localize import Localizer, LocalizeSettings, PairResult
from linkguard.topology.localize import Verdict as ProbeVerdict
from linkguard.topology.probeplan import PortId, ProbePlan, ProbeSettings, plan_probes
from linkguard.topology.state import FabricState

__all__ = ["PROBE_DROP_LOG_S", "ProbeDesk"]

#: A host's refused probe reports or pairs (``unassigned_probe_pair``, ``stale_probe_epoch``,
#: ``unknown_probe_port``) are logged at most once per host and reason this often (s); every
#: one is counted in ``dropped``.
PROBE_DROP_LOG_S = 60.0


class ProbeDesk:
    """Probe state of one service. ``online_since`` (host -> since when its agent is online,
    s) and ``dropped`` (refusals by reason) are the core's, shared; ``changed(now, urgent)``
    schedules a solve and returns its effects."""

    def __init__(
        self,
        cfg: ProbeRunSettings,
        fabric: Fabric,
        state: FabricState,
        *,
        online_since: dict[str, float],
        dropped: Counter[str],
        changed: Callable[[float, bool], list[Effect]],
    ) -> None:
        self.cfg = cfg
        self.fabric = fabric
        self.state = state
        self.online_since = online_since
        self.dropped = dropped
        self._changed = changed
        #: the plan of the epoch last published
        self.plan: ProbePlan | None = None
        #: the plans a report may name by its epoch: the current one and the one before it
        #: (agents still report on it until the new targets reach them)
        self.plans: dict[int, ProbePlan] = {}
        #: per (host, reason) of refused probe pairs: when last logged (s) and how many were
        #: refused since (:meth:`_drop`)
        self._drop_logged: dict[tuple[str, str], tuple[float, int]] = {}
        #: the latest result per (prober, target) pair, dated by its arrival (s)
        self.results: dict[tuple[PortId, PortId], PairResult] = {}
        self.localizer: Localizer | None = None
        self.reports = 0
        #: pairs left out because their target's agent was not online for the window
        self.pairs_unanswerable = 0
        #: the inconclusive verdicts of the last localisation by subject (``str``): the
        #: verdict and since when (s) that subject has been inconclusive at every
        #: localisation (never acted on; :meth:`verdicts` lists them)
        self.inconclusive: dict[str, tuple[ProbeVerdict, float]] = {}
        self._leaves = {sw.name: sw for sw in fabric.switches if sw.role == "leaf"}

    def _settings(self) -> tuple[ProbeSettings, LocalizeSettings]:
        """The plan and localiser settings of ``probes`` (a report window counts for three
        windows, at least 30 s)."""
        cfg = self.cfg
        plan = ProbeSettings(
            fan_out=cfg.fan_out,
            cross_su=min(cfg.cross_su, cfg.fan_out),
            rate_pps=cfg.rate_pps,
            min_probers=cfg.min_probers,
        )
        loc = LocalizeSettings(
            min_samples=cfg.min_samples,
            min_probers=cfg.min_probers,
            clear_after_s=cfg.clear_after_s,
            max_age_s=max(3 * cfg.window_s, 30.0),
        )
        return plan, loc

    def targets(self, epoch: int) -> list[ProbeTargets]:
        """Every host's :class:`ProbeTargets` of probe plan ``epoch`` (hosts with no port to
        probe get none); records the plan in :attr:`plan` and, with the plan before it (the
        one published last, else that of ``epoch - 1``), in :attr:`plans`: the pairs reports
        may carry."""
        cfg = self.cfg
        plan_settings, loc_settings = self._settings()
        plan = plan_probes(self.fabric, plan_settings, epoch=epoch)
        previous = self.plan
        if previous is None and epoch > 0:
            previous = plan_probes(self.fabric, plan_settings, epoch=epoch - 1)
        plans = {plan.epoch: plan}
        if previous is not None and previous.epoch != epoch:
            plans[previous.epoch] = previous
        self.plans = plans
        self.plan = plan
        if self.localizer is None:
            self.localizer = Localizer(leaf_of=plan.leaf, settings=loc_settings)
        by_host: dict[str, list[ProbeRail]] = {}
        for p, targets in plan.targets.items():
            peers = [ProbePeer(host=t.host, rail=t.rail, address=plan.address[t]) for t in targets]
            rail = ProbeRail(rail=p.rail, address=plan.address[p], peers=peers)
            by_host.setdefault(p.host, []).append(rail)
        return [
            ProbeTargets(
                host=host,
                epoch=epoch,
                mode=cfg.mode,
                port=cfg.port,
                rate_pps=cfg.rate_pps,
                timeout_s=cfg.timeout_s,
                window_s=cfg.window_s,
                rails=rails,
            )
            for host, rails in sorted(by_host.items())
        ]

    def on_report(self, report: ProbeReport, now: float) -> list[Effect]:
        """Keep the pairs of ``report`` as results at ``now``; ``report.host`` is its topic's
        host (``decode`` refuses another one: ``wrong_host``). Only pairs the service assigned
        to that host are taken: a report of an epoch other than the current plan's or the one
        before is dropped whole (``stale_probe_epoch``, one per report); a pair naming a port
        the fabric does not have is dropped (``unknown_probe_port``), and so is one its plan
        did not give that host's rail (``unassigned_probe_pair``), one per pair. Without that,
        one host could report loss from all its rails to any port and be counted as that many
        witnesses. Refusals are logged per host at most every :data:`PROBE_DROP_LOG_S`.

        A pair whose target's agent is not online, or came online less than the report's
        ``window_s`` + the probe ``timeout_s`` before ``now``, is left out (counted in
        :attr:`pairs_unanswerable`, not logged): the responder runs in the agent, so a
        stopped, restarting or just-started agent would otherwise read as a dead link."""
        if self.plan is None:
            return []  # no targets published yet: nothing asked for this
        plan = self.plans.get(report.epoch)
        if plan is None:
            return self._drop(
                report.host,
                "stale_probe_epoch",
                1,
                now,
                epoch=report.epoch,
                expected=sorted(self.plans),
            )
        self.reports += 1
        unknown: list[str] = []
        unassigned: list[str] = []
        warmup = report.window_s + self.cfg.timeout_s
        for pair in report.pairs:
            prober, target = PortId(report.host, pair.rail), PortId(pair.peer_host, pair.peer_rail)
            if prober not in plan.leaf or target not in plan.leaf or prober == target:
                unknown.append(f"{prober}->{target}")
                continue
            if target not in plan.targets.get(prober, ()):
                unassigned.append(f"{prober}->{target}")
                continue
            since = self.online_since.get(target.host)
            if since is None or now - since < warmup:
                self.pairs_unanswerable += 1
                continue
            self.results[(prober, target)] = PairResult(
                prober,
                target,
                pair.sent,
                pair.lost,
                window_end=now,
                window_s=report.window_s,
                rtt_p50_us=None if pair.rtt_p50_ms is None else pair.rtt_p50_ms * 1000,
                rtt_p99_us=None if pair.rtt_p99_ms is None else pair.rtt_p99_ms * 1000,
            )
        out: list[Effect] = []
        for reason, pairs in (
            ("unknown_probe_port", unknown),
            ("unassigned_probe_pair", unassigned),
        ):
            if pairs:
                out += self._drop(
                    report.host, reason, len(pairs), now, epoch=report.epoch, first=pairs[:4]
                )
        return out

    def _drop(self, host: str, reason: str, n: int, now: float, **detail: object) -> list[Effect]:
        """Count ``n`` refused probe pairs (or one report) of ``host`` under ``reason`` in
        ``dropped``, and log ``message_dropped`` (topic, reason, ``count``: refused since the
        last line, and ``detail``) unless one went out for this host and reason less than
        :data:`PROBE_DROP_LOG_S` before ``now``."""
        self.dropped[reason] += n
        key = (host, reason)
        last, pending = self._drop_logged.get(key, (None, 0))
        pending += n
        if last is not None and now - last < PROBE_DROP_LOG_S:
            self._drop_logged[key] = (last, pending)
            return []
        self._drop_logged[key] = (now, 0)
        fields = {
            "topic": probe_report(host),
            "reason": reason,
            "host": host,
            "count": pending,
            **detail,
        }
        return [Log("warning", "message_dropped", fields)]

    def fresh_results(self, now: float) -> list[PairResult]:
        """The probe results younger than the localiser's ``max_age_s`` at ``now`` (older ones
        are dropped for good). Empty before the first targets."""
        if self.localizer is None:
            return []
        max_age = self.localizer.settings.max_age_s
        for key, r in list(self.results.items()):
            if now - r.window_end > max_age:
                del self.results[key]
        return list(self.results.values())

    def localize(
        self, now: float, verdicts: list[ProbeVerdict] | None = None
    ) -> tuple[list[ProbeVerdict], list[Effect]]:
        """Run the localiser on the fresh results at ``now`` and act on the raised and cleared
        verdicts: a port verdict marks (or clears) its rail as unusable for its host
        (:meth:`FabricState.on_probe_verdict`, then a solve); a leaf verdict is logged
        (switch-level faults are the operator's ``fabric/faults``). Each is logged as
        ``probe_verdict`` and emitted as a ``health`` change, both with where it is
        (:meth:`place`). Inconclusive verdicts are kept in :attr:`inconclusive` (logged as
        ``probe_inconclusive`` when a subject becomes one) and never acted on. ``verdicts``:
        the localiser's, already computed at ``now`` (the wiring computes them in a worker
        thread: ~0.2 s a window at 2,048 hosts x 8 rails, benchmarks/localize.py); None:
        computed here. Returns the verdicts acted on, and the effects."""
        if self.localizer is None:
            return [], []
        if verdicts is None:
            verdicts = self.localizer.update(self.fresh_results(now), now)
        acted: list[ProbeVerdict] = []
        out: list[Effect] = []
        inconclusive: dict[str, tuple[ProbeVerdict, float]] = {}
        for v in verdicts:
            if v.kind == "inconclusive":
                key = str(v.subject)
                seen = self.inconclusive.get(key)
                inconclusive[key] = (v, now if seen is None else seen[1])
                if seen is None:
                    fields = {
                        "subject": key,
                        "witnesses": v.witnesses,
                        "lossy": v.lossy,
                        "reason": v.reason,
                        **self.place(v.subject),
                    }
                    out.append(Log("info", "probe_inconclusive", fields))
                continue
            if v.state not in ("raised", "cleared"):
                continue
            acted.append(v)
            effect = "logged"
            if v.kind == "port" and isinstance(v.subject, PortId):
                suspect = v.state == "raised"
                if self.state.on_probe_verdict(v.subject.host, v.subject.rail, suspect=suspect):
                    effect = "rail_unusable" if suspect else "rail_usable"
                    out += self._changed(now, suspect)
            doc: dict[str, object] = {
                "kind": v.kind,
                "subject": str(v.subject),
                "state": v.state,
                "witnesses": v.witnesses,
                "lossy": v.lossy,
                "seen_as": list(v.seen_as),
                "effect": effect,
            }
            place = self.place(v.subject)
            doc |= place
            out.append(Log("warning" if v.state == "raised" else "info", "probe_verdict", doc))
            # where at the top too: the ledger and ``/api/v1/events?host=&rail=`` filter by it
            out.append(Emit("health", {**place, "probe_verdict": doc}))
        self.inconclusive = inconclusive
        return acted, out

    def place(self, subject: PortId | str) -> dict[str, object]:
        """Where a probe verdict's ``subject`` is: a port's ``host``, ``rail`` and, when the
        fabric has that rail on the host, its ``hca``, ``port`` and ``leaf`` (and the leaf's
        ``su``); a leaf's ``leaf`` and, when known, its ``rail`` and ``su`` (a leaf named
        ``rail<r>``: a fabric without cabling, rail ``r``)."""
        out: dict[str, object] = {}
        if isinstance(subject, PortId):
            out |= {"host": subject.host, "rail": subject.rail}
            if subject.host in self.state.host_names:
                hca = next(
                    (h for h in self.fabric.host(subject.host).hcas if h.rail == subject.rail), None
                )
                if hca is not None:
                    out |= {"hca": hca.hca, "port": hca.port}
            leaf = self.plan.leaf.get(subject) if self.plan is not None else None
            if leaf is None:
                return out
        else:
            leaf = subject
        out["leaf"] = leaf
        switch = self._leaves.get(leaf)
        if switch is not None:
            out |= {"rail": out.get("rail", switch.rail), "su": switch.su}
        elif "rail" not in out and leaf.startswith("rail") and leaf[4:].isdigit():
            out["rail"] = int(leaf[4:])
        return out

    def verdicts(self, now: float, wall: float) -> list[dict[str, object]]:
        """The probe verdicts in force at ``now`` (the clock of :meth:`localize`; ``wall``:
        the Unix time at ``now``, s): every raised ``port`` and ``leaf`` verdict the localiser
        holds and the ``inconclusive`` ones of the last localisation, sorted by kind (port,
        leaf, inconclusive) and subject. Each: ``kind``, ``subject`` (``host/rail<r>`` or a
        leaf name), where (:meth:`place`: ``host``, ``rail``, ``hca``, ``port`` or ``leaf``,
        ``rail``, ``su``; absent ones None), ``since`` (Unix time, s: raised, or inconclusive
        without a break), ``age_s`` (s), ``witnesses`` and ``lossy`` (evidence counts of the
        last localisation that saw it), ``seen_as`` (a port's rules: ``target``, ``prober``),
        ``clearing`` (loss below ``loss_clear`` since ``clearing_since``, Unix s; it clears
        after ``clear_after_s``), ``drained`` (a port verdict whose rail its host's plans
        avoid) and ``reason`` (why an inconclusive one is not acted on). Empty with probes
        off or before the first localisation."""
        offset = wall - now  # this clock -> Unix time
        rows: list[dict[str, object]] = []

        def row(
            kind: str, subject: PortId | str, since: float, **fields: object
        ) -> dict[str, object]:
            place: dict[str, object] = {
                "host": None,
                "rail": None,
                "hca": None,
                "port": None,
                "leaf": None,
            }
            place |= {"su": None} | self.place(subject)
            return {
                "kind": kind,
                "subject": str(subject),
                **place,
                "since": round(offset + since, 3),
                "age_s": round(max(0.0, now - since), 3),
                **fields,
            }

        active = self.localizer.active if self.localizer is not None else {}
        for subject, a in active.items():
            drained = isinstance(subject, PortId) and (
                (subject.host, subject.rail) in self.state.probe_suspect
            )
            rows.append(
                row(
                    a.kind,
                    subject,
                    a.since,
                    witnesses=a.witnesses,
                    lossy=a.lossy,
                    seen_as=list(a.seen_as),
                    clearing=a.low_since is not None,
                    clearing_since=None if a.low_since is None else round(offset + a.low_since, 3),
                    drained=drained,
                    reason="",
                )
            )
        for v, since in self.inconclusive.values():
            rows.append(
                row(
                    "inconclusive",
                    v.subject,
                    since,
                    witnesses=v.witnesses,
                    lossy=v.lossy,
                    seen_as=list(v.seen_as),
                    clearing=False,
                    clearing_since=None,
                    drained=False,
                    reason=v.reason,
                )
            )
        order = {"port": 0, "leaf": 1, "inconclusive": 2}
        return sorted(rows, key=lambda r: (order[str(r["kind"])], str(r["subject"])))
