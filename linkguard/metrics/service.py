"""The topology service's metrics: what it exports (:data:`SERVICE_METRICS`) and its registry
(:class:`ServiceMetrics`).

Consumes: a service through :class:`~linkguard.metricsources.ServiceSource` (its
:class:`~linkguard.topology.state.FabricState`, counters, bus and localizer), read when scraped,
and its ``changes`` feed (plans, acks, port changes, audits: the histograms, the acks counter,
the audit findings). Produces: the Prometheus exposition of its own registry, which the HTTP
API serves at ``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from linkguard import __version__
from linkguard.changerecord import ChangeRecord
from linkguard.metrics.families import (
    APPLY_BUCKETS_S,
    BUS_METRICS,
    REROUTE_BUCKETS_S,
    SOLVER_BUCKETS_S,
    STATUSES,
    UNUSABLE,
    MetricSpec,
    StateCollector,
    bus_families,
    counter,
    gauge,
    histogram,
    render,
)
from linkguard.metricsources import ServiceSource
from linkguard.models import AckResult

__all__ = ["SERVICE_METRICS", "ServiceMetrics"]

SOLVER = MetricSpec(
    "linkguard_solver_seconds",
    "histogram",
    "Time (s) to solve the fabric after state changes (solves that published plans)",
    (),
    SOLVER_BUCKETS_S,
)
REROUTE = MetricSpec(
    "linkguard_reroute_seconds",
    "histogram",
    "Time (s) from the service taking a port's down state to the last applied ack "
    "of the plans that reroute it (service clock)",
    (),
    REROUTE_BUCKETS_S,
)
ACK_APPLY = MetricSpec(
    "linkguard_ack_apply_seconds",
    "histogram",
    "Apply time (s) the agents report in their acks (path=plan or fast_path)",
    ("path",),
    APPLY_BUCKETS_S,
)
PLAN_EPOCH = MetricSpec(
    "linkguard_plan_epoch",
    "gauge",
    "Highest plan epoch issued (epochs start at the service's start time in ms)",
)
LEADER = MetricSpec(
    "linkguard_leader",
    "gauge",
    "1 while this service steers (holds the leader lease, or no election is "
    "configured), 0 while it stands by",
)
LEADER_TERM = MetricSpec(
    "linkguard_leader_term",
    "gauge",
    "Leader term stamped on this service's plans (0: no election, or a standby that never led)",
)
SOLVES = MetricSpec("linkguard_solves_total", "counter", "Solves run since the service started")
PLANS_PUBLISHED = MetricSpec(
    "linkguard_plans_published_total",
    "counter",
    "Plans published (one per re-planned host and solve) since the service started",
)
HOSTS = MetricSpec(
    "linkguard_hosts",
    "gauge",
    "Fabric hosts by agent state (online: its agent says so; offline: last will, "
    "a clean stop, or never seen)",
    ("state",),
)
PORTS = MetricSpec(
    "linkguard_ports",
    "gauge",
    "Fabric host ports by their latest reported status (unknown: none reported yet)",
    ("status",),
)
HOSTS_ROUTED_AROUND = MetricSpec(
    "linkguard_hosts_routed_around",
    "gauge",
    "Hosts whose agent's last will arrived and that peers route around "
    "(offline.route_around_after_s)",
)
HOSTS_PENDING_ACK = MetricSpec(
    "linkguard_hosts_pending_ack",
    "gauge",
    "Hosts whose current plan has no applied ack with its epoch yet",
)
HOSTS_NOT_ACKING = MetricSpec(
    "linkguard_hosts_not_acking",
    "gauge",
    "Online hosts past their ack deadline: no ack of the epoch they owe "
    "convergence.resend_after_s after its publish (their plan is being re-sent)",
)
PLAN_RESENDS = MetricSpec(
    "linkguard_plan_resends_total",
    "counter",
    "Plans re-sent to online hosts that had not acked their current epoch in time, or "
    "whose agent asked (plan-request), since the service started",
)
HOSTS_UNPROTECTED = MetricSpec(
    "linkguard_hosts_unprotected",
    "gauge",
    "Online hosts whose agent drops every plan of this service (it requires signed plans "
    "and the service does not sign, or it does not have the service's key): no fast-path "
    "backups there; the log's hosts_unprotected names them and the fix",
)
ACKS = MetricSpec(
    "linkguard_acks_total",
    "counter",
    "Acks received from agents, by result (applied, refused, failed)",
    ("result",),
)
MESSAGES_DROPPED = MetricSpec(
    "linkguard_messages_dropped_total",
    "counter",
    "Bus messages dropped, by reason (not_json, invalid, oversized, wrong_host, "
    "wrong_port, ...; probe reports: unknown_probe_port, unassigned_probe_pair, "
    "stale_probe_epoch; signed plans: foreign, unsigned, unknown_key, bad_signature)",
    ("reason",),
)
JOURNAL_GAP_EVENTS = MetricSpec(
    "linkguard_journal_gap_events_total",
    "counter",
    "Port events missing for good from the agents' journals since the service started: "
    "dropped past journal_max_events before the service confirmed them (journal_gap)",
)
AUDIT_FINDINGS = MetricSpec(
    "linkguard_audit_findings",
    "gauge",
    "Findings of the last fleet audit (service/audit), by severity",
    ("severity",),
)
PROBE_VERDICTS = MetricSpec(
    "linkguard_probe_verdicts",
    "gauge",
    "Per-rail probe verdicts in force, by kind (port: raised, its rail drained for its "
    "host; leaf: raised, logged only; inconclusive: thin evidence, never acted on)",
    ("kind",),
)
PROBE_PAIRS_UNANSWERABLE = MetricSpec(
    "linkguard_probe_pairs_unanswerable_total",
    "counter",
    "Probe pairs left out because their target's agent was not online for the "
    "report's window (stopped, restarting or just started: its responder runs in "
    "the agent, so the loss says nothing about the link)",
)
CHANGE_STREAM_CLIENTS = MetricSpec(
    "linkguard_change_stream_clients",
    "gauge",
    "Clients reading the change stream (HTTP API /api/v1/stream) now",
)
BUILD_INFO = MetricSpec(
    "linkguard_build_info",
    "gauge",
    "Always 1; the labels say the linkguard version, the role and the fabric's name",
    ("version", "role", "fabric"),
)

#: every family the service exports, in the order a scrape lists them
SERVICE_METRICS: tuple[MetricSpec, ...] = (
    SOLVER,
    REROUTE,
    ACK_APPLY,
    PLAN_EPOCH,
    LEADER,
    LEADER_TERM,
    SOLVES,
    PLANS_PUBLISHED,
    HOSTS,
    PORTS,
    HOSTS_ROUTED_AROUND,
    HOSTS_PENDING_ACK,
    HOSTS_NOT_ACKING,
    PLAN_RESENDS,
    HOSTS_UNPROTECTED,
    ACKS,
    MESSAGES_DROPPED,
    JOURNAL_GAP_EVENTS,
    AUDIT_FINDINGS,
    PROBE_VERDICTS,
    PROBE_PAIRS_UNANSWERABLE,
    CHANGE_STREAM_CLIENTS,
    *BUS_METRICS,
    BUILD_INFO,
)


@dataclass
class _Down:
    """A port that went out of use: when (service wall clock, s) and on which host."""

    at: float
    host: str


class ServiceMetrics:
    """The metrics of one topology service: ``registry`` (its own) and :meth:`render`.

    Create it once per service, before :meth:`~TopologyService.run` (it subscribes to
    ``service.changes``; the histograms and ``linkguard_acks_total`` count from then on). The
    rest is read from the service when scraped.

    ``linkguard_reroute_seconds``: for every port that goes from usable to out of use (a
    ``port`` change), from the service taking that state to the last applied ack of the plans
    that followed: the first publish (``plans`` change) after which nothing was left to
    solve (``state.dirty`` false: every state taken so far was in that solve) is the one that
    reroutes it; it is done when every online host re-planned since has acked the epoch it
    owes (:meth:`FabricState.acked_epoch`). The service's own clock at both ends (agent
    detection and the bus hop to the service are not in it); hosts that go offline are not
    waited for; a reroute not done within :data:`MAX_REROUTE_WAIT_S` is dropped, not observed.
    """

    #: reroutes still waiting after this long (s) are dropped, not observed
    MAX_REROUTE_WAIT_S = 600.0
    #: at most this many downs are kept waiting (a storm beyond it is not timed)
    MAX_DOWNS = 100_000

    def __init__(self, service: ServiceSource) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        self.solver_seconds = histogram(SOLVER, self.registry)
        self.reroute_seconds = histogram(REROUTE, self.registry)
        self.ack_apply_seconds = histogram(ACK_APPLY, self.registry)
        for path in ("plan", "fast_path"):
            self.ack_apply_seconds.labels(path)
        self.acks: Counter[str] = Counter({r.value: 0 for r in AckResult})
        self.journal_gap_events = 0
        self.audit: dict[str, int] = {"error": 0, "warning": 0}
        if service.audit_json:
            self._on_audit(json.loads(service.audit_json))
        self._ports = {(h.host, hca.key) for h in service.fabric.hosts for hca in h.hcas}
        self._usable: dict[tuple[str, str], bool] = {}
        self._downs: list[_Down] = []  # out of use, not in a publish yet
        self._timing: list[_Down] = []  # in a publish, waiting for acks
        #: host -> (the epoch it owes an ack for, since when: service wall clock, s)
        self._owed: dict[str, tuple[int, float]] = {}
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self.registry.register(StateCollector(self._families, lambda: self._loop))
        self.unsubscribe = service.changes.subscribe(self._on_change)

    def render(self, accept_header: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)``: the Prometheus text format (0.0.4), or OpenMetrics when
        ``accept_header`` asks for ``application/openmetrics-text``
        (``prometheus_client.exposition.choose_encoder``). Callable on the service's loop or
        from another thread (then the state is read on the loop; TimeoutError when it does
        not answer within :data:`SCRAPE_TIMEOUT_S`)."""
        return render(self.registry, accept_header)

    # -- fed by the change feed ----------------------------------------------------------------
    def _on_change(self, change: ChangeRecord) -> None:
        if self._loop is None:
            with contextlib.suppress(RuntimeError):  # emitted outside a loop (tests)
                self._loop = asyncio.get_running_loop()
        d = change.data
        if change.kind == "port":
            self._on_port(change.at, d)
        elif change.kind == "plans":
            self.solver_seconds.observe(float(d.get("solve_ms") or 0.0) / 1000)
            self._on_plans(change.at, d.get("hosts") or [])
        elif change.kind == "ack":
            self._on_ack(change.at, d)
        elif change.kind == "host" and not d.get("online", True):
            self._owed.pop(str(d.get("host")), None)
            self._done(change.at)
        elif change.kind == "audit":
            self._on_audit(d)
        elif change.kind == "journal_gap" and isinstance(d.get("events"), int):
            self.journal_gap_events += d["events"]

    def _on_port(self, at: float, d: dict[str, Any]) -> None:
        key = (str(d.get("host")), f"{d.get('hca')}/{d.get('port')}")
        if key not in self._ports:
            return
        usable = d.get("status") not in UNUSABLE
        was = self._usable.get(key)
        self._usable[key] = usable
        if was and not usable and len(self._downs) < self.MAX_DOWNS:
            self._downs.append(_Down(at, key[0]))

    def _on_plans(self, at: float, hosts: list[str]) -> None:
        state = self.service.state
        for h in hosts:
            due = state.acked_epoch(h)
            if due is None or not state.online.get(h, False):
                continue
            ack = state.acks.get(h)  # acks can overtake the end of the publish
            if ack is not None and ack.epoch >= due:
                self._owed.pop(h, None)
            else:
                self._owed[h] = (due, self._owed.get(h, (0, at))[1])
        if self._downs and not state.dirty:
            self._timing += self._downs
            self._downs = []
        self._done(at)

    def _on_ack(self, at: float, d: dict[str, Any]) -> None:
        result = str(d.get("result"))
        self.acks[result] += 1
        if d.get("apply_ms") is not None:
            path = "fast_path" if d.get("fast_path") else "plan"
            self.ack_apply_seconds.labels(path).observe(float(d["apply_ms"]) / 1000)
        # an answer for the epoch owed ends the wait for that host, applied or not (a host
        # whose kernel refuses routes must not stop every later reroute from being timed)
        host = str(d.get("host"))
        owed = self._owed.get(host)
        if owed is not None and int(d.get("epoch") or 0) >= owed[0]:
            del self._owed[host]
            self._done(at)

    def _done(self, at: float) -> None:
        """Observe the timed downs once no host owes an ack; forget hosts that owe one and
        downs that wait, longer than :attr:`MAX_REROUTE_WAIT_S`."""
        cutoff = at - self.MAX_REROUTE_WAIT_S
        if any(since < cutoff for _, since in self._owed.values()):
            self._owed = {h: o for h, o in self._owed.items() if o[1] >= cutoff}
        if self._timing and self._timing[0].at < cutoff:
            self._timing = [t for t in self._timing if t.at >= cutoff]
        if self._timing and not self._owed:
            for down in self._timing:
                self.reroute_seconds.observe(max(0.0, at - down.at))
            self._timing = []

    def _on_audit(self, doc: dict[str, Any]) -> None:
        self.audit = {"error": int(doc.get("errors", 0)), "warning": int(doc.get("warnings", 0))}

    # -- read at scrape time ---------------------------------------------------------------------
    def _families(self) -> list[Metric]:
        svc = self.service
        state = svc.state
        hosts = state.host_names
        online = sum(1 for h, up in state.online.items() if up and h in hosts)
        # PortStatus is a StrEnum: its members count under their values (16,384 ports: ~2 ms)
        counts: Counter[str] = Counter(st.status for st in state.ports.values())
        counts["unknown"] += len(self._ports) - len(state.ports)
        fam_hosts = gauge(HOSTS)
        fam_hosts.add_metric(["online"], online)
        fam_hosts.add_metric(["offline"], len(hosts) - online)
        fam_ports = gauge(PORTS)
        for s in STATUSES:
            fam_ports.add_metric([s], counts[s])
        audit = gauge(AUDIT_FINDINGS)
        for sev, n in sorted(self.audit.items()):
            audit.add_metric([sev], n)
        verdicts = gauge(PROBE_VERDICTS)
        loc = svc.localizer  # raised verdicts; the inconclusive ones of the last localisation
        by_kind: Counter[str] = (
            Counter(a.kind for a in loc.active.values()) if loc is not None else Counter()
        )
        by_kind["inconclusive"] = len(svc.probe_inconclusive)
        for kind in ("port", "leaf", "inconclusive"):
            verdicts.add_metric([kind], by_kind[kind])
        info = gauge(BUILD_INFO)
        info.add_metric([__version__, "service", svc.fabric.name], 1.0)
        return [
            gauge(PLAN_EPOCH, state.epoch),
            gauge(LEADER, 1.0 if svc.leadership.is_leader() else 0.0),
            gauge(LEADER_TERM, svc.leadership.term or 0),
            counter(SOLVES, svc.solves),
            counter(PLANS_PUBLISHED, svc.plans_published),
            fam_hosts,
            fam_ports,
            gauge(HOSTS_ROUTED_AROUND, len(state.away)),
            gauge(HOSTS_PENDING_ACK, len(state.pending_acks())),
            gauge(HOSTS_NOT_ACKING, len(svc.convergence.not_acking(time.monotonic()))),
            counter(PLAN_RESENDS, svc.convergence.resends),
            gauge(HOSTS_UNPROTECTED, len(svc.unprotected)),
            counter(ACKS, dict(self.acks)),
            counter(MESSAGES_DROPPED, dict(svc.dropped)),
            counter(JOURNAL_GAP_EVENTS, self.journal_gap_events),
            audit,
            verdicts,
            counter(PROBE_PAIRS_UNANSWERABLE, svc.probe_pairs_unanswerable),
            gauge(CHANGE_STREAM_CLIENTS, svc.changes.listeners),
            *bus_families(svc.bus),
            info,
        ]
