"""The agent's metrics: what it exports (:data:`AGENT_METRICS`) and its registry and exporter
(:class:`AgentMetrics`).

Consumes: an agent through :class:`~linkguard.metricsources.AgentSource` (its inventory, port
monitor, applier, ``stats`` and bus), read when scraped, and the events it hands in (port
events: flaps; acks: apply time). Produces: the Prometheus exposition of its own registry, served
on ``metrics_listen`` by ``prometheus_client``'s HTTP server in a thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from linkguard import __version__
from linkguard.config import listen_address
from linkguard.metrics.families import (
    APPLY_BUCKETS_S,
    BUS_METRICS,
    PORT_LABELS,
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
from linkguard.metricsources import AgentSource
from linkguard.models import Ack, PortEvent, PortStatus

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = ["AGENT_METRICS", "AgentMetrics"]

log = structlog.get_logger(__name__)

PLAN_APPLY = MetricSpec(
    "linkguard_plan_apply_seconds",
    "histogram",
    "Time (s) to put a plan in place (path=plan: a plan from the service, reconciling "
    "the table; path=fast_path: a local backup overlay after a port went down)",
    ("path",),
    APPLY_BUCKETS_S,
)
PORT_STATE = MetricSpec(
    "linkguard_port_state",
    "gauge",
    "1 when the port is in use (status up), 0 otherwise (down, held_down, "
    "suppressed, degraded, unknown)",
    PORT_LABELS,
)
PORT_STATUS = MetricSpec(
    "linkguard_port_status",
    "gauge",
    "Effective status after hold-down and damping, one-hot: 1 for the current status "
    "(up, down, held_down, suppressed, degraded, unknown), 0 for the others",
    (*PORT_LABELS, "status"),
)
PORT_HELD_DOWN = MetricSpec(
    "linkguard_port_held_down",
    "gauge",
    "1 while the port is back but inside its hold-down (status held_down)",
    PORT_LABELS,
)
PORT_HOLD_DOWN_REMAINING = MetricSpec(
    "linkguard_port_hold_down_remaining_seconds",
    "gauge",
    "Seconds (s) left before the port may be used again (hold-down or suppression), "
    "as of the monitor's last reading",
    PORT_LABELS,
)
PORT_SUPPRESSED = MetricSpec(
    "linkguard_port_suppressed",
    "gauge",
    "1 while the port is suppressed (damping penalty above the suppress threshold)",
    PORT_LABELS,
)
PORT_DAMPING_PENALTY = MetricSpec(
    "linkguard_port_damping_penalty",
    "gauge",
    "RFC 2439-style damping figure of merit (unitless; 1000 per flap, decays with "
    "half_life_s; 0 in backoff mode)",
    PORT_LABELS,
)
PORT_DAMPING_FLAPS = MetricSpec(
    "linkguard_port_damping_flaps",
    "gauge",
    "Flaps in the current damping history (cleared after quiet_period_s without one)",
    PORT_LABELS,
)
PORT_RATE = MetricSpec(
    "linkguard_port_rate_gbps",
    "gauge",
    "Link rate (Gb/s) as the driver reads it (sysfs rate, netdev speed); absent when unknown",
    PORT_LABELS,
)
PORT_FLAPS = MetricSpec(
    "linkguard_port_flaps_total",
    "counter",
    "Flaps (the port went from usable to down, or down and up between two readings) since "
    "the agent started",
    PORT_LABELS,
)
PLAN_EPOCH_APPLIED = MetricSpec(
    "linkguard_plan_epoch_applied", "gauge", "Epoch of the plan in place (0: none yet)"
)
ROUTES_DRY_RUN = MetricSpec(
    "linkguard_routes_dry_run",
    "gauge",
    "1 while routes.apply is false (a dry run): plans are taken, acked and counted as applied, "
    "but into an in-memory table; the kernel's routes and ip rules are left untouched. 0: "
    "plans go into linkguard's kernel table",
)
PLANS_APPLIED = MetricSpec(
    "linkguard_plans_applied_total",
    "counter",
    "Plans from the service applied (or applied with errors) since the agent started",
)
PLANS_REFUSED = MetricSpec(
    "linkguard_plans_refused_total",
    "counter",
    "Plans refused, by reason (stale_epoch, invalid, wrong_host, out_of_scope, ...)",
    ("reason",),
)
FAST_PATH = MetricSpec(
    "linkguard_fast_path_total",
    "counter",
    "Fast paths taken: a port went down and its backup was put in place locally",
)
NEIGHBOURS_FLUSHED = MetricSpec(
    "linkguard_neighbours_flushed_total",
    "counter",
    "Neighbour (ARP) entries deleted because a route change left them stale (a "
    "segment parked on one would stall its TCP connection until the old path "
    "answered again; routes.neighbour_flush)",
)
MESSAGES_DROPPED = MetricSpec(
    "linkguard_messages_dropped_total",
    "counter",
    "Bus messages dropped, by reason (not_json, invalid, oversized, wrong_host, "
    "stale_epoch, unexpected_topic, out_of_scope; signed plans: unsigned, "
    "unknown_key, bad_signature, bad_envelope)",
    ("reason",),
)
PORT_STATES_PUBLISHED = MetricSpec(
    "linkguard_port_states_published_total",
    "counter",
    "Port states published on the bus since the agent started",
)
EVENT_JOURNAL_HELD = MetricSpec(
    "linkguard_event_journal_held",
    "gauge",
    "Port events held in the agent's journal that the service has not confirmed yet "
    "(replayed after a reconnect; at most journal_max_events)",
)
EVENT_JOURNAL_DROPPED = MetricSpec(
    "linkguard_event_journal_dropped_total",
    "counter",
    "Unconfirmed port events the journal dropped past journal_max_events since the agent "
    "started (the service records them as a journal_gap)",
)
STATE_WRITE_FAILURES = MetricSpec(
    "linkguard_state_write_failures_total",
    "counter",
    "Writes of a state_dir file the disk refused (ENOSPC, EIO, EROFS, ...), by file "
    "(plan, peer_routes, damping, counter_health, term, events); the agent routes on from "
    "memory",
    ("file",),
)
BUILD_INFO = MetricSpec(
    "linkguard_build_info",
    "gauge",
    "Always 1; the labels say the linkguard version, the role and this agent's host",
    ("version", "role", "host"),
)

#: every family the agent exports, in the order a scrape lists them
AGENT_METRICS: tuple[MetricSpec, ...] = (
    PLAN_APPLY,
    PORT_STATE,
    PORT_STATUS,
    PORT_HELD_DOWN,
    PORT_HOLD_DOWN_REMAINING,
    PORT_SUPPRESSED,
    PORT_DAMPING_PENALTY,
    PORT_DAMPING_FLAPS,
    PORT_RATE,
    PORT_FLAPS,
    PLAN_EPOCH_APPLIED,
    ROUTES_DRY_RUN,
    PLANS_APPLIED,
    PLANS_REFUSED,
    FAST_PATH,
    NEIGHBOURS_FLUSHED,
    MESSAGES_DROPPED,
    PORT_STATES_PUBLISHED,
    EVENT_JOURNAL_HELD,
    EVENT_JOURNAL_DROPPED,
    STATE_WRITE_FAILURES,
    *BUS_METRICS,
    BUILD_INFO,
)


class AgentMetrics:
    """The metrics of one agent: ``registry`` (its own), the exporter (:meth:`start`).

    The agent hands in its port events (:meth:`observe_events`: flaps) and the acks of what
    it applied (:meth:`observe_ack`: apply time); everything else is read from the agent when
    scraped. ``port``: the exporter's bound TCP port (None while not serving)."""

    def __init__(self, agent: AgentSource) -> None:
        self.agent = agent
        self.registry = CollectorRegistry()
        self.apply_seconds = histogram(PLAN_APPLY, self.registry)
        for path in ("plan", "fast_path"):
            self.apply_seconds.labels(path)
        #: flaps (usable -> down transitions) per "hca/port" since the agent started
        self.flaps: Counter[str] = Counter({h.key: 0 for h in agent.inventory.hcas})
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry.register(StateCollector(self._families, lambda: self._loop))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # -- fed by the agent ----------------------------------------------------------------------
    def observe_events(self, events: Sequence[PortEvent]) -> None:
        """Count flaps: a status transition to ``down`` from ``up``, ``held_down`` or
        ``suppressed`` (exactly the monitor's flaps: a readable usable -> unusable change; the
        first reading at start, from ``unknown``, is none), and one from ``up`` or
        ``degraded`` straight to ``held_down`` or ``suppressed``: a flap no reading saw,
        counted from the netdev's carrier_changes (:mod:`linkguard.agent.linkkinds`)."""
        for ev in events:
            if (ev.current == PortStatus.DOWN and ev.previous.value in ("up", *UNUSABLE)) or (
                ev.current in (PortStatus.HELD_DOWN, PortStatus.SUPPRESSED)
                and ev.previous in (PortStatus.UP, PortStatus.DEGRADED)
            ):
                self.flaps[f"{ev.hca}/{ev.port}"] += 1

    def observe_ack(self, ack: Ack) -> None:
        """Record the apply time of ``ack`` (``apply_ms``; refused acks carry none)."""
        if ack.apply_ms is not None:
            path = "fast_path" if ack.fast_path else "plan"
            self.apply_seconds.labels(path).observe(ack.apply_ms / 1000)

    def render(self, accept_header: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)`` of a scrape, as the exporter answers it."""
        return render(self.registry, accept_header)

    # -- the exporter ------------------------------------------------------------------------
    async def start(self, listen: str | None) -> None:
        """Serve ``GET /metrics`` (any path, in fact) on ``listen`` (``HOST:PORT``; None or
        "": not at all) from a thread (``prometheus_client.start_http_server``). A port that
        cannot be bound is logged (``metrics_listen_failed``) and the agent runs on without
        an exporter: monitoring never stops the protection. Raises ValueError for a malformed
        ``listen`` (settings validate it first)."""
        self._loop = asyncio.get_running_loop()
        if not listen:
            return
        host, port = listen_address(listen)
        try:
            server, thread = await asyncio.to_thread(start_http_server, port, host, self.registry)
        except OSError as exc:
            log.error(
                "metrics_listen_failed",
                listen=listen,
                error=str(exc),
                hint="another process on that port? set metrics_listen (null: no exporter)",
            )
            return
        self._server, self._thread = server, thread
        self.port = server.server_port
        log.info("metrics_listening", listen=listen, port=self.port, path="/metrics")

    async def stop(self) -> None:
        """Stop the exporter and free its port (idempotent; takes up to 0.5 s, the server's
        poll interval, off the event loop)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        self.port = None
        if server is None:
            return
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, 5)

    # -- read at scrape time ---------------------------------------------------------------------
    def _families(self) -> list[Metric]:
        a = self.agent
        ports = [(h, a.monitor.state(h.key)) for h in a.inventory.hcas]
        g = _PortGauges()
        for h, st in ports:
            labels = [h.hca, str(h.port), "" if h.rail is None else str(h.rail)]
            status = st.status.value if st is not None else "unknown"
            g.state.add_metric(labels, 1.0 if status == "up" else 0.0)
            for s in STATUSES:
                g.status.add_metric([*labels, s], 1.0 if s == status else 0.0)
            g.held.add_metric(labels, 1.0 if status == "held_down" else 0.0)
            g.suppressed.add_metric(labels, 1.0 if status == "suppressed" else 0.0)
            g.flaps_total.add_metric(labels, self.flaps[h.key])
            if st is not None:
                g.remaining.add_metric(labels, st.damping.hold_down_remaining_s)
                g.penalty.add_metric(labels, st.damping.penalty)
                g.history.add_metric(labels, st.damping.flaps)
                if st.rate_gbps is not None:
                    g.rate.add_metric(labels, st.rate_gbps)
        stats = a.stats
        epoch = a.applier.applied_epoch
        info = gauge(BUILD_INFO)
        info.add_metric([__version__, "agent", a.host], 1.0)
        return [
            *g.all(),
            gauge(PLAN_EPOCH_APPLIED, epoch or 0),
            gauge(ROUTES_DRY_RUN, 0.0 if a.settings.routes.apply else 1.0),
            counter(PLANS_APPLIED, stats.plans_applied),
            counter(PLANS_REFUSED, dict(stats.plans_refused)),
            counter(FAST_PATH, stats.fast_paths),
            counter(NEIGHBOURS_FLUSHED, a.applier.neighbours_flushed),
            counter(MESSAGES_DROPPED, dict(stats.messages_dropped)),
            counter(PORT_STATES_PUBLISHED, stats.states_published),
            gauge(EVENT_JOURNAL_HELD, stats.journal_held),
            counter(EVENT_JOURNAL_DROPPED, stats.journal_dropped),
            counter(STATE_WRITE_FAILURES, dict(a.applier.writes.failures)),
            *bus_families(a.bus),
            info,
        ]


class _PortGauges:
    """The per-port families of one agent scrape."""

    def __init__(self) -> None:
        self.state: GaugeMetricFamily = gauge(PORT_STATE)
        self.status = gauge(PORT_STATUS)
        self.held = gauge(PORT_HELD_DOWN)
        self.remaining = gauge(PORT_HOLD_DOWN_REMAINING)
        self.suppressed = gauge(PORT_SUPPRESSED)
        self.penalty = gauge(PORT_DAMPING_PENALTY)
        self.history = gauge(PORT_DAMPING_FLAPS)
        self.rate = gauge(PORT_RATE)
        self.flaps_total = counter(PORT_FLAPS)

    def all(self) -> list[Metric]:
        return [
            self.state,
            self.status,
            self.held,
            self.remaining,
            self.suppressed,
            self.penalty,
            self.history,
            self.rate,
            self.flaps_total,
        ]
