"""Prometheus metrics of the agent and the topology service (prometheus-client), in
node_exporter style: ``linkguard_`` names, base units (seconds, Gb/s in the name), ``_total``
counters, per-port labels ``hca``, ``port``, ``rail``.

Consumes: an :class:`~linkguard.agent.daemon.Agent` (its inventory, port monitor, applier,
``stats`` and bus) or a :class:`~linkguard.topology.service.TopologyService` (through the
protocols of :mod:`linkguard.metricsources`, so this module imports neither; the service's
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
keeps are fed from events. The full list is in README.md, section "Metrics".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from linkguard import __version__
from linkguard.changerecord import ChangeRecord
from linkguard.config import listen_address
from linkguard.metricsources import AgentSource, ServiceSource
from linkguard.models import Ack, AckResult, PortEvent, PortStatus

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = [
    "APPLY_BUCKETS_S",
    "REROUTE_BUCKETS_S",
    "SOLVER_BUCKETS_S",
    "AgentMetrics",
    "ServiceMetrics",
]

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: Plan / fast-path apply time (s): 0.1 ms .. 1 s (a fast path takes well under 1 ms on an
#: in-memory table, a full plan through netlink a few ms; README "What it does").
APPLY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
#: Solve time (s): 0.5 ms .. 5 s (an update is about 2-15 ms at 2,048 hosts x 8 rails, the full
#: build at start about 0.6 s).
SOLVER_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
#: Down -> last ack (s): 10 ms .. 60 s (about 50 ms in the namespace lab, 2-3.5 s for a leaf
#: at 2,048 hosts).
REROUTE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: A scrape waits this long (s) for the owner's event loop; a loop blocked longer fails the
#: scrape (HTTP 500: Prometheus marks the target down, which is what a wedged agent is).
SCRAPE_TIMEOUT_S = 5.0

_STATUSES = tuple(s.value for s in PortStatus)
_PORT_LABELS = ("hca", "port", "rail")
#: statuses that take a port out of use (linkguard.topology.state.UNUSABLE)
_UNUSABLE = frozenset({"down", "held_down", "suppressed", "degraded"})


def _on_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], T]) -> T:
    """``fn()`` run on ``loop`` (from another thread: scheduled there, waited for up to
    :data:`SCRAPE_TIMEOUT_S`; TimeoutError past it); directly when already on it, or when
    there is no running loop to ask."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or running is loop or loop.is_closed() or not loop.is_running():
        return fn()
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:
            done.set_exception(exc)

    loop.call_soon_threadsafe(call)
    return done.result(SCRAPE_TIMEOUT_S)


class _StateCollector(Collector):
    """Calls ``families()`` on the owner's loop at every scrape."""

    def __init__(
        self,
        families: Callable[[], list[Metric]],
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self._families = families
        self._loop = loop

    def collect(self) -> Iterable[Metric]:
        return _on_loop(self._loop(), self._families)


def _counter(name: str, doc: str, values: dict[str, int] | int, label: str = "reason") -> Metric:
    """A counter family from a count (no labels) or counts by ``label``."""
    if isinstance(values, int):
        return CounterMetricFamily(name, doc, value=values)
    fam = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(values.items()):
        fam.add_metric([key], n)
    return fam


def _render(registry: CollectorRegistry, accept_header: str | None) -> tuple[bytes, str]:
    encoder, content_type = choose_encoder(accept_header or "")
    return encoder(registry), content_type


# -- the agent ---------------------------------------------------------------------------------


class AgentMetrics:
    """The metrics of one agent: ``registry`` (its own), the exporter (:meth:`start`).

    The agent hands in its port events (:meth:`observe_events`: flaps) and the acks of what
    it applied (:meth:`observe_ack`: apply time); everything else is read from the agent when
    scraped. ``port``: the exporter's bound TCP port (None while not serving)."""

    def __init__(self, agent: AgentSource) -> None:
        self.agent = agent
        self.registry = CollectorRegistry()
        self.apply_seconds = Histogram(
            "linkguard_plan_apply_seconds",
            "Time (s) to put a plan in place (path=plan: a plan from the service, reconciling "
            "the table; path=fast_path: a local backup overlay after a port went down)",
            ["path"],
            buckets=APPLY_BUCKETS_S,
            registry=self.registry,
        )
        for path in ("plan", "fast_path"):
            self.apply_seconds.labels(path)
        #: flaps (usable -> down transitions) per "hca/port" since the agent started
        self.flaps: Counter[str] = Counter({h.key: 0 for h in agent.inventory.hcas})
        self._loop: asyncio.AbstractEventLoop | None = None
        self.registry.register(_StateCollector(self._families, lambda: self._loop))
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # -- fed by the agent ----------------------------------------------------------------------
    def observe_events(self, events: Sequence[PortEvent]) -> None:
        """Count flaps: a status transition to ``down`` from ``up``, ``held_down`` or
        ``suppressed`` (exactly the monitor's flaps: a readable usable -> unusable change; the
        first reading at start, from ``unknown``, is none)."""
        for ev in events:
            if ev.current == PortStatus.DOWN and ev.previous.value in ("up", *_UNUSABLE):
                self.flaps[f"{ev.hca}/{ev.port}"] += 1

    def observe_ack(self, ack: Ack) -> None:
        """Record the apply time of ``ack`` (``apply_ms``; refused acks carry none)."""
        if ack.apply_ms is not None:
            path = "fast_path" if ack.fast_path else "plan"
            self.apply_seconds.labels(path).observe(ack.apply_ms / 1000)

    def render(self, accept_header: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)`` of a scrape, as the exporter answers it."""
        return _render(self.registry, accept_header)

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
            for s in _STATUSES:
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
        info = GaugeMetricFamily(
            "linkguard_build_info",
            "Always 1; the labels say the linkguard version, the role and this agent's host",
            labels=["version", "role", "host"],
        )
        info.add_metric([__version__, "agent", a.host], 1.0)
        return [
            *g.all(),
            GaugeMetricFamily(
                "linkguard_plan_epoch_applied",
                "Epoch of the plan in place (0: none yet)",
                value=epoch or 0,
            ),
            _counter(
                "linkguard_plans_applied",
                "Plans from the service applied (or applied with errors) since the agent started",
                stats.plans_applied,
            ),
            _counter(
                "linkguard_plans_refused",
                "Plans refused, by reason (stale_epoch, invalid, wrong_host, out_of_scope, ...)",
                dict(stats.plans_refused),
            ),
            _counter(
                "linkguard_fast_path",
                "Fast paths taken: a port went down and its backup was put in place locally",
                stats.fast_paths,
            ),
            _counter(
                "linkguard_neighbours_flushed",
                "Neighbour (ARP) entries deleted because a route change left them stale (a "
                "segment parked on one would stall its TCP connection until the old path "
                "answered again; routes.neighbour_flush)",
                a.applier.neighbours_flushed,
            ),
            _counter(
                "linkguard_messages_dropped",
                "Bus messages dropped, by reason (not_json, invalid, oversized, wrong_host, "
                "stale_epoch, unexpected_topic, out_of_scope; signed plans: unsigned, "
                "unknown_key, bad_signature, bad_envelope)",
                dict(stats.messages_dropped),
            ),
            _counter(
                "linkguard_port_states_published",
                "Port states published on the bus since the agent started",
                stats.states_published,
            ),
            *_bus_families(a.bus),
            info,
        ]


class _PortGauges:
    """The per-port families of one agent scrape."""

    def __init__(self) -> None:
        L = list(_PORT_LABELS)
        self.state = GaugeMetricFamily(
            "linkguard_port_state",
            "1 when the port is in use (status up), 0 otherwise (down, held_down, "
            "suppressed, degraded, unknown)",
            labels=L,
        )
        self.status = GaugeMetricFamily(
            "linkguard_port_status",
            "Effective status after hold-down and damping, one-hot: 1 for the current status "
            "(up, down, held_down, suppressed, degraded, unknown), 0 for the others",
            labels=[*L, "status"],
        )
        self.held = GaugeMetricFamily(
            "linkguard_port_held_down",
            "1 while the port is back but inside its hold-down (status held_down)",
            labels=L,
        )
        self.remaining = GaugeMetricFamily(
            "linkguard_port_hold_down_remaining_seconds",
            "Seconds (s) left before the port may be used again (hold-down or suppression), "
            "as of the monitor's last reading",
            labels=L,
        )
        self.suppressed = GaugeMetricFamily(
            "linkguard_port_suppressed",
            "1 while the port is suppressed (damping penalty above the suppress threshold)",
            labels=L,
        )
        self.penalty = GaugeMetricFamily(
            "linkguard_port_damping_penalty",
            "RFC 2439-style damping figure of merit (unitless; 1000 per flap, decays with "
            "half_life_s; 0 in backoff mode)",
            labels=L,
        )
        self.history = GaugeMetricFamily(
            "linkguard_port_damping_flaps",
            "Flaps in the current damping history (cleared after quiet_period_s without one)",
            labels=L,
        )
        self.rate = GaugeMetricFamily(
            "linkguard_port_rate_gbps",
            "Link rate (Gb/s) as the driver reads it (sysfs rate, netdev speed); absent when "
            "unknown",
            labels=L,
        )
        self.flaps_total = CounterMetricFamily(
            "linkguard_port_flaps",
            "Flaps (the port went from usable to down) since the agent started",
            labels=L,
        )

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


def _bus_families(bus: Any) -> list[Metric]:
    connected = getattr(bus, "connected", None)
    up = connected is not None and connected.is_set()
    broker = GaugeMetricFamily(
        "linkguard_bus_broker",
        "1 for the broker (host:port of bus.brokers) the bus is connected to; none while "
        "disconnected",
        labels=["broker"],
    )
    if up and getattr(bus, "broker", None):
        broker.add_metric([str(bus.broker)], 1.0)
    return [
        GaugeMetricFamily(
            "linkguard_bus_connected",
            "1 while connected to the MQTT broker, 0 otherwise",
            value=1.0 if up else 0.0,
        ),
        _counter(
            "linkguard_bus_connects",
            "Connections made to the MQTT broker (the first and every reconnect)",
            int(getattr(bus, "connects", 0)),
        ),
        broker,
        _counter(
            "linkguard_bus_failovers",
            "Moves to the next broker of bus.brokers after a failed or lost connection",
            int(getattr(bus, "failovers", 0)),
        ),
        _counter(
            "linkguard_bus_subscriptions_refused",
            "Subscriptions the broker refused (SUBACK 0x80: its ACL, or NATS JetStream without "
            "a stream leader), retried until granted",
            int(getattr(bus, "subscriptions_refused", 0)),
        ),
    ]


# -- the topology service --------------------------------------------------------------------


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
        self.solver_seconds = Histogram(
            "linkguard_solver_seconds",
            "Time (s) to solve the fabric after state changes (solves that published plans)",
            buckets=SOLVER_BUCKETS_S,
            registry=self.registry,
        )
        self.reroute_seconds = Histogram(
            "linkguard_reroute_seconds",
            "Time (s) from the service taking a port's down state to the last applied ack "
            "of the plans that reroute it (service clock)",
            buckets=REROUTE_BUCKETS_S,
            registry=self.registry,
        )
        self.ack_apply_seconds = Histogram(
            "linkguard_ack_apply_seconds",
            "Apply time (s) the agents report in their acks (path=plan or fast_path)",
            ["path"],
            buckets=APPLY_BUCKETS_S,
            registry=self.registry,
        )
        for path in ("plan", "fast_path"):
            self.ack_apply_seconds.labels(path)
        self.acks: Counter[str] = Counter({r.value: 0 for r in AckResult})
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
        self.registry.register(_StateCollector(self._families, lambda: self._loop))
        self.unsubscribe = service.changes.subscribe(self._on_change)

    def render(self, accept_header: str | None = None) -> tuple[bytes, str]:
        """``(body, content type)``: the Prometheus text format (0.0.4), or OpenMetrics when
        ``accept_header`` asks for ``application/openmetrics-text``
        (``prometheus_client.exposition.choose_encoder``). Callable on the service's loop or
        from another thread (then the state is read on the loop; TimeoutError when it does
        not answer within :data:`SCRAPE_TIMEOUT_S`)."""
        return _render(self.registry, accept_header)

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

    def _on_port(self, at: float, d: dict[str, Any]) -> None:
        key = (str(d.get("host")), f"{d.get('hca')}/{d.get('port')}")
        if key not in self._ports:
            return
        usable = d.get("status") not in _UNUSABLE
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
        fam_hosts = GaugeMetricFamily(
            "linkguard_hosts",
            "Fabric hosts by agent state (online: its agent says so; offline: last will, "
            "a clean stop, or never seen)",
            labels=["state"],
        )
        fam_hosts.add_metric(["online"], online)
        fam_hosts.add_metric(["offline"], len(hosts) - online)
        fam_ports = GaugeMetricFamily(
            "linkguard_ports",
            "Fabric host ports by their latest reported status (unknown: none reported yet)",
            labels=["status"],
        )
        for s in _STATUSES:
            fam_ports.add_metric([s], counts[s])
        audit = GaugeMetricFamily(
            "linkguard_audit_findings",
            "Findings of the last fleet audit (service/audit), by severity",
            labels=["severity"],
        )
        for sev, n in sorted(self.audit.items()):
            audit.add_metric([sev], n)
        verdicts = GaugeMetricFamily(
            "linkguard_probe_verdicts",
            "Per-rail probe verdicts in force, by kind (port: raised, its rail drained for its "
            "host; leaf: raised, logged only; inconclusive: thin evidence, never acted on)",
            labels=["kind"],
        )
        loc = svc.localizer  # raised verdicts; the inconclusive ones of the last localisation
        by_kind: Counter[str] = (
            Counter(a.kind for a in loc.active.values()) if loc is not None else Counter()
        )
        by_kind["inconclusive"] = len(svc.probe_inconclusive)
        for kind in ("port", "leaf", "inconclusive"):
            verdicts.add_metric([kind], by_kind[kind])
        info = GaugeMetricFamily(
            "linkguard_build_info",
            "Always 1; the labels say the linkguard version, the role and the fabric's name",
            labels=["version", "role", "fabric"],
        )
        info.add_metric([__version__, "service", svc.fabric.name], 1.0)
        return [
            GaugeMetricFamily(
                "linkguard_plan_epoch",
                "Highest plan epoch issued (epochs start at the service's start time in ms)",
                value=state.epoch,
            ),
            GaugeMetricFamily(
                "linkguard_leader",
                "1 while this service steers (holds the leader lease, or no election is "
                "configured), 0 while it stands by",
                value=1.0 if svc.leadership.is_leader() else 0.0,
            ),
            GaugeMetricFamily(
                "linkguard_leader_term",
                "Leader term stamped on this service's plans (0: no election, or a standby "
                "that never led)",
                value=svc.leadership.term or 0,
            ),
            _counter("linkguard_solves", "Solves run since the service started", svc.solves),
            _counter(
                "linkguard_plans_published",
                "Plans published (one per re-planned host and solve) since the service started",
                svc.plans_published,
            ),
            fam_hosts,
            fam_ports,
            GaugeMetricFamily(
                "linkguard_hosts_routed_around",
                "Hosts whose agent's last will arrived and that peers route around "
                "(offline.route_around_after_s)",
                value=len(state.away),
            ),
            GaugeMetricFamily(
                "linkguard_hosts_pending_ack",
                "Hosts whose current plan has no applied ack with its epoch yet",
                value=len(state.pending_acks()),
            ),
            _counter(
                "linkguard_acks",
                "Acks received from agents, by result (applied, refused, failed)",
                dict(self.acks),
                label="result",
            ),
            _counter(
                "linkguard_messages_dropped",
                "Bus messages dropped, by reason (not_json, invalid, oversized, wrong_host, "
                "wrong_port, ...; probe reports: unknown_probe_port, unassigned_probe_pair, "
                "stale_probe_epoch; signed plans: foreign, unsigned, unknown_key, bad_signature)",
                dict(svc.dropped),
            ),
            audit,
            verdicts,
            _counter(
                "linkguard_probe_pairs_unanswerable",
                "Probe pairs left out because their target's agent was not online for the "
                "report's window (stopped, restarting or just started: its responder runs in "
                "the agent, so the loss says nothing about the link)",
                svc.probe_pairs_unanswerable,
            ),
            GaugeMetricFamily(
                "linkguard_change_stream_clients",
                "Clients reading the change stream (HTTP API /api/v1/stream) now",
                value=svc.changes.listeners,
            ),
            *_bus_families(svc.bus),
            info,
        ]
