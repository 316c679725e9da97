"""What a metric is (:class:`MetricSpec`: name, type, help, labels) and the pieces both
registries share: the histogram buckets, the scrape-time collector that reads the owner's state
on its event loop, the bus's families and the exposition.

Consumes: specs (declared in :mod:`linkguard.metrics.agent` and
:mod:`linkguard.metrics.service`) and the values read at scrape time. Produces:
prometheus-client metric families built from those specs, so a family's name, help text and
label names exist in one place, the one ``docs/metrics.md`` is rendered from
(:mod:`linkguard.metricsdocs`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from linkguard.models import PortStatus

__all__ = [
    "APPLY_BUCKETS_S",
    "BUS_METRICS",
    "PORT_LABELS",
    "REROUTE_BUCKETS_S",
    "SCRAPE_TIMEOUT_S",
    "SOLVER_BUCKETS_S",
    "STATUSES",
    "UNUSABLE",
    "MetricSpec",
    "StateCollector",
    "bus_families",
    "counter",
    "gauge",
    "histogram",
    "render",
]

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

#: every port status, in the order the one-hot and by-status families list them
STATUSES = tuple(s.value for s in PortStatus)
#: the labels of every per-port family
PORT_LABELS = ("hca", "port", "rail")
#: statuses that take a port out of use (linkguard.topology.state.UNUSABLE)
UNUSABLE = frozenset({"down", "held_down", "suppressed", "degraded"})


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family.

    ``name``: as scraped in the Prometheus text format (a counter's ends in ``_total``;
    prometheus-client names the family without it). ``type``: ``gauge``, ``counter`` or
    ``histogram``. ``help``: the ``# HELP`` text, with its unit. ``labels``: the label names of
    every series, in order (a histogram's ``le`` not included). ``buckets``: a histogram's
    upper bounds (s), else None."""

    name: str
    type: Literal["gauge", "counter", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


def gauge(spec: MetricSpec, value: float | None = None) -> GaugeMetricFamily:
    """An empty labelled gauge family of ``spec`` (add its series), or, with no labels, the
    gauge with ``value``."""
    if spec.labels:
        return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    return GaugeMetricFamily(spec.name, spec.help, value=value)


def counter(spec: MetricSpec, values: dict[str, int] | int | None = None) -> CounterMetricFamily:
    """A counter family of ``spec``: from a count (no labels), from counts by its one label,
    or (``values`` None, labelled) empty to add its series to."""
    if isinstance(values, int):
        return CounterMetricFamily(spec.name, spec.help, value=values)
    fam = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    for key, n in sorted((values or {}).items()):
        fam.add_metric([key], n)
    return fam


def histogram(spec: MetricSpec, registry: CollectorRegistry) -> Histogram:
    """The histogram of ``spec`` (its buckets, its labels) registered in ``registry``."""
    assert spec.buckets is not None, spec.name
    return Histogram(
        spec.name, spec.help, list(spec.labels), buckets=spec.buckets, registry=registry
    )


def on_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[[], T]) -> T:
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


class StateCollector(Collector):
    """Calls ``families()`` on the owner's loop at every scrape."""

    def __init__(
        self,
        families: Callable[[], list[Metric]],
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self._families = families
        self._loop = loop

    def collect(self) -> Iterable[Metric]:
        return on_loop(self._loop(), self._families)


def render(registry: CollectorRegistry, accept_header: str | None) -> tuple[bytes, str]:
    """``(body, content type)`` of a scrape of ``registry``: the Prometheus text format, or
    OpenMetrics when ``accept_header`` asks for it."""
    encoder, content_type = choose_encoder(accept_header or "")
    return encoder(registry), content_type


# -- the bus (the agent's and the service's) ---------------------------------------------------

BUS_CONNECTED = MetricSpec(
    "linkguard_bus_connected", "gauge", "1 while connected to the MQTT broker, 0 otherwise"
)
BUS_CONNECTS = MetricSpec(
    "linkguard_bus_connects_total",
    "counter",
    "Connections made to the MQTT broker (the first and every reconnect)",
)
BUS_BROKER = MetricSpec(
    "linkguard_bus_broker",
    "gauge",
    "1 for the broker (host:port of bus.brokers) the bus is connected to; none while disconnected",
    ("broker",),
)
BUS_FAILOVERS = MetricSpec(
    "linkguard_bus_failovers_total",
    "counter",
    "Moves to the next broker of bus.brokers after a failed or lost connection",
)
BUS_SUBSCRIPTIONS_REFUSED = MetricSpec(
    "linkguard_bus_subscriptions_refused_total",
    "counter",
    "Subscriptions the broker refused (SUBACK 0x80: its ACL, or NATS JetStream without "
    "a stream leader), retried until granted",
)
BUS_TAKEOVERS = MetricSpec(
    "linkguard_bus_client_id_taken_over_total",
    "counter",
    "Sessions the broker ended shortly after accepting them, repeatedly, while every "
    "reconnect succeeded: another client connecting with this client id (a takeover)",
)
#: the bus's families, in the order a scrape lists them
BUS_METRICS = (
    BUS_CONNECTED,
    BUS_CONNECTS,
    BUS_BROKER,
    BUS_FAILOVERS,
    BUS_SUBSCRIPTIONS_REFUSED,
    BUS_TAKEOVERS,
)


def bus_families(bus: Any) -> list[Metric]:
    """:data:`BUS_METRICS` read from ``bus`` (its ``connected`` event, ``broker``,
    ``connects``, ``failovers``, ``subscriptions_refused``, ``takeovers``; any of them
    missing reads as disconnected or 0)."""
    connected = getattr(bus, "connected", None)
    up = connected is not None and connected.is_set()
    broker = gauge(BUS_BROKER)
    if up and getattr(bus, "broker", None):
        broker.add_metric([str(bus.broker)], 1.0)
    return [
        gauge(BUS_CONNECTED, 1.0 if up else 0.0),
        counter(BUS_CONNECTS, int(getattr(bus, "connects", 0))),
        broker,
        counter(BUS_FAILOVERS, int(getattr(bus, "failovers", 0))),
        counter(BUS_SUBSCRIPTIONS_REFUSED, int(getattr(bus, "subscriptions_refused", 0))),
        counter(BUS_TAKEOVERS, int(getattr(bus, "takeovers", 0))),
    ]
