"""Prometheus metrics of the agent and the topology service (prometheus-client), in
node_exporter style: ``linkguard_`` names, base units (seconds, Gb/s in the name), ``_total``
counters, per-port labels ``hca``, ``port``, ``rail``.

Consumes: an :class:`~linkguard.agent.daemon.Agent` (its inventory, port monitor, applier,
``stats`` and bus) or a :class:`~linkguard.topology.service.TopologyService` (through the
protocols of :mod:`linkguard.metricsources`, so this package imports neither; the service's
:class:`~linkguard.topology.state.FabricState`, counters, bus and ``changes`` feed), read when
scraped; plus the events the owner hands in (:meth:`AgentMetrics.observe_events`,
:meth:`AgentMetrics.observe_ack`) or the service emits on ``service.changes`` (plans, acks,
port changes, audits). Produces: the Prometheus text format (or OpenMetrics, as the scraper's
``Accept`` header asks) from one :class:`~prometheus_client.CollectorRegistry` per agent or
service, so many agents in one process (tests, simulations) never share a series.

Agents serve it themselves (:meth:`AgentMetrics.start`: ``prometheus_client``'s HTTP server on
``metrics_listen``, in a thread; ``GET /metrics`` answers 200, no redirect); the service's HTTP
API mounts :meth:`ServiceMetrics.render`. State is read at scrape time by a custom collector
that runs on the owner's event loop (the loop is the only writer, so a scrape sees one
consistent state and no bookkeeping is doubled); only histograms and the counters no owner
keeps are fed from events.

Every family is declared once, as a :class:`~linkguard.metrics.families.MetricSpec` (name,
type, help with its unit, labels): :data:`AGENT_METRICS` (:mod:`.agent`) and
:data:`SERVICE_METRICS` (:mod:`.service`); ``docs/metrics.md`` is rendered from them
(:mod:`linkguard.metricsdocs`, ``python tools/gendocs.py``).
"""

from __future__ import annotations

from linkguard.metrics.agent import AGENT_METRICS, AgentMetrics
from linkguard.metrics.families import (
    APPLY_BUCKETS_S,
    REROUTE_BUCKETS_S,
    SCRAPE_TIMEOUT_S,
    SOLVER_BUCKETS_S,
    UNUSABLE,
    MetricSpec,
)
from linkguard.metrics.service import SERVICE_METRICS, ServiceMetrics

__all__ = [
    "AGENT_METRICS",
    "APPLY_BUCKETS_S",
    "REROUTE_BUCKETS_S",
    "SCRAPE_TIMEOUT_S",
    "SERVICE_METRICS",
    "SOLVER_BUCKETS_S",
    "UNUSABLE",
    "AgentMetrics",
    "MetricSpec",
    "ServiceMetrics",
]
