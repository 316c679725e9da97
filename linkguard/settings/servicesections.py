"""The topology service's sections.

Consumes: the service's ``generate``, ``solve``, ``api``, ``offline``, ``convergence``,
``leader`` and ``ledger`` sections. Produces: :class:`GeneratorSettings`, :class:`SolveSettings`
(RFC 8405's back-off, as the :class:`~linkguard.backoffpolicy.BackoffPolicy` it makes),
:class:`ApiSettings`, :class:`OfflineSettings`, :class:`ConvergenceSettings`,
:class:`LeaderSettings` (:class:`EtcdLeaderSettings`, :class:`KubernetesLeaderSettings`) and
:class:`LedgerSettings`. Each raises ``pydantic.ValidationError`` naming the key for a bad
value.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from linkguard.backoffpolicy import BackoffPolicy
from linkguard.models import CoreTier, ManagementHostsPerSU, SpinesPerSU
from linkguard.settings.base import Section
from linkguard.settings.bus import broker_address

__all__ = [
    "ApiSettings",
    "ConvergenceSettings",
    "EtcdLeaderSettings",
    "GeneratorSettings",
    "HostBudgetSettings",
    "KubernetesLeaderSettings",
    "LeaderSettings",
    "LedgerSettings",
    "OfflineSettings",
    "SolveSettings",
]


class GeneratorSettings(Section):
    """Rail-optimized fabric generator parameters (used when no fabric file is given): those
    of :func:`~linkguard.topology.generator.generate_rail_optimized`, with its defaults, as
    ``linkguard fabric generate`` and a scenario's ``generate:`` take them."""

    hosts: int = Field(32, ge=1, le=16384, description="GPU hosts in the fabric")
    rails: int = Field(8, ge=1, le=16, description="rails (HCA ports) per host")
    gpus_per_host: int | None = Field(
        None, ge=1, le=64, description="GPU endpoints per host; None: one per rail"
    )
    hosts_per_su: int = Field(
        32,
        ge=1,
        le=1024,
        description="node slots per SU (one leaf per rail), management slots included",
    )
    management_hosts_per_su: ManagementHostsPerSU = 0
    spines_per_su: SpinesPerSU = 4
    core: CoreTier = None


class ApiSettings(Section):
    """The topology service's HTTP API and dashboard (:mod:`linkguard.topology.api`)."""

    enabled: bool = Field(True, description="serve the API and dashboard")
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        max_length=253,
        description="address to listen on; the default keeps it on this machine",
    )
    port: int = Field(
        8470,
        ge=0,
        le=65535,
        description="TCP port; 0 = any free port (logged as api_listening, kept on "
        "service.api_port)",
    )
    token: SecretStr | None = Field(
        None,
        description="bearer token every state-changing call needs (PUT /api/v1/faults); "
        "None: those calls answer 403",
    )

    @field_validator("token")
    @classmethod
    def _long_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("the API token must be at least 16 characters")
        return v


class SolveSettings(Section):
    """When the service solves after a change (``solve:``): RFC 8405's SPF back-off
    (:mod:`linkguard.topology.backoff`), with its names, in ms. Raises
    ``pydantic.ValidationError`` when ``holddown_ms`` is below ``time_to_learn_ms`` (RFC 8405
    section 6)."""

    initial_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description="after a quiet period, solve this long after the first change that takes "
        "a port out of use (RFC 8405 INITIAL_SPF_DELAY): a single failed link is rerouted at "
        "once (10 ms here cost 20 ms of p99 data-plane gap in benchmarks/lab_gap.py)",
    )
    short_ms: float = Field(
        150.0,
        ge=0,
        le=10_000,
        description="changes that follow the first one are batched this long (RFC 8405 "
        "SHORT_SPF_DELAY; Open/R batches over 10-250 ms); above the agents' poll interval "
        "(100 ms), so a leaf failure costs at most two plans per host",
    )
    long_ms: float = Field(
        1000.0,
        ge=0,
        le=60_000,
        description="batching window once changes keep coming for longer than "
        "time_to_learn_ms (RFC 8405 LONG_SPF_DELAY): a storm costs one solve per window",
    )
    time_to_learn_ms: float = Field(
        500.0, ge=0, le=60_000, description="RFC 8405 TIME_TO_LEARN_INTERVAL"
    )
    holddown_ms: float = Field(
        3000.0,
        ge=0,
        le=600_000,
        description="quiet time after which the next change is solved after initial_ms "
        "again (RFC 8405 HOLDDOWN_INTERVAL; >= time_to_learn_ms)",
    )

    @model_validator(mode="after")
    def _backoff_consistent(self) -> SolveSettings:
        if self.holddown_ms < self.time_to_learn_ms:
            raise ValueError(
                f"holddown_ms ({self.holddown_ms:g}) must be >= "
                f"time_to_learn_ms ({self.time_to_learn_ms:g}) (RFC 8405)"
            )
        return self

    def policy(self) -> BackoffPolicy:
        """The solve back-off of these settings (RFC 8405)."""
        return BackoffPolicy(
            initial_ms=self.initial_ms,
            short_ms=self.short_ms,
            long_ms=self.long_ms,
            time_to_learn_ms=self.time_to_learn_ms,
            holddown_ms=self.holddown_ms,
        )


class HostBudgetSettings(Section):
    """What one host may cost the service (:mod:`linkguard.topology.hostbudget`): messages and
    bytes per second (token buckets, with a burst), and retained topics under its name. What
    exceeds it is dropped before it is decoded, counted
    (``linkguard_host_budget_dropped_total{reason}``) and logged once per host and minute
    (``host_budget_exceeded``). Issue 21: one host publishing 100 KB junk drove the service to
    107 % CPU; a host's own traffic is a few dozen retained topics (status, inventory, ack, a
    state per port) and, in a flap storm, a few messages per port and second."""

    messages_per_s: float = Field(
        200.0, gt=0, le=1e6, description="messages per second one host may send (sustained)"
    )
    messages_burst: int = Field(
        2000, ge=1, le=10_000_000, description="messages one host may send at once"
    )
    bytes_per_s: float = Field(
        1_048_576.0, gt=0, le=1e10, description="bytes per second one host may send (sustained)"
    )
    bytes_burst: int = Field(
        4_194_304, ge=1024, le=10**10, description="bytes one host may send at once"
    )
    retained_topics: int = Field(
        256,
        ge=8,
        le=1_000_000,
        description="distinct topics a host may publish on (its retained ones, events, "
        "probes); a message on a new one past this is dropped",
    )


class OfflineSettings(Section):
    """What the service does when an agent's connection is lost (its MQTT last will,
    :class:`~linkguard.models.HostStatus` ``reason="lost"``; a clean stop changes nothing).

    After ``route_around_after_s`` without the agent back, every rail of that host counts as
    unusable: the host's endpoints get ``unreachable`` routes in every peer's plan, so peers fail
    fast instead of sending into a host that may be gone, until its agent is online again. The
    grace period keeps an agent restart (a few seconds under systemd) from touching any route.
    A loss of many hosts at once is more likely the management network or the broker than the
    hosts: past ``max_fraction`` of the fabric's hosts (at least one host) nothing more is routed
    around and ``route_around_held`` is logged (the hosts already routed around stay so).
    """

    route_around_after_s: float | None = Field(
        30.0,
        ge=0,
        le=86_400,
        description="grace period (s) after a host's last will before its endpoints are routed "
        "around; null = never route around an offline host",
    )

    @field_validator("route_around_after_s", mode="before")
    @classmethod
    def _never(cls, v: object) -> object:
        # LINKGUARD_OFFLINE__ROUTE_AROUND_AFTER_S=null (or empty): the environment's null
        if isinstance(v, str) and v.strip().lower() in ("", "null", "none", "never"):
            return None
        return v

    max_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="route around at most this fraction of the fabric's hosts (at least 1) at "
        "once; more lost at once holds (likely a broker or management-network fault)",
    )

    def limit(self, hosts: int) -> int:
        """How many of ``hosts`` may be routed around at once (at least 1)."""
        return max(1, int(self.max_fraction * hosts))


class ConvergenceSettings(Section):
    """What the service does about an online host that has not acked its current epoch
    (:mod:`linkguard.topology.convergence`): a plan or peer routes message lost on the way (a
    QoS 0 subscription, a dropped connection), or an ack lost on the way back.

    ``resend_after_s`` after the service published the plan a host owes an ack for, with no
    applied ack of that epoch, the host counts as not acking (``host_not_acking`` logged with
    host, epoch and age; ``linkguard_hosts_not_acking``; the API's and dashboard's
    ``not_acking``) and its plan and the peer routes it needs are published again; then again
    after twice that wait, doubling up to ``resend_max_s`` between re-sends, for as long as the
    host is online and owes the ack. An agent's ``plan-request`` (it reconnected or learned it
    is behind) is answered the same way, at most once per ``request_min_interval_s`` per
    host."""

    resend_after_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="an online host without an applied ack of its current epoch this long (s) "
        "after the publish counts as not acking and gets its plan and peer routes again",
    )
    resend_max_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="the wait between re-sends doubles from resend_after_s up to this (s)",
    )
    request_min_interval_s: float = Field(
        2.0,
        ge=0,
        le=3600,
        description="an agent's plan-request is answered at most once per this long (s) per "
        "host; the others are counted (dropped reason plan_request_limited) and ignored",
    )

    @model_validator(mode="after")
    def _max_above_first(self) -> ConvergenceSettings:
        if self.resend_max_s < self.resend_after_s:
            raise ValueError(
                f"resend_max_s ({self.resend_max_s:g}) must be >= resend_after_s "
                f"({self.resend_after_s:g})"
            )
        return self


class EtcdLeaderSettings(Section):
    """Leader election through an etcd lease (:class:`linkguard.topology.leader.EtcdLease`):
    the service that holds the lease steers, the others wait as warm standbys."""

    endpoints: list[str] = Field(
        min_length=1,
        max_length=16,
        description="host:port of etcd's client URLs (2379), tried in turn after a failure; "
        "in the environment a JSON list: LINKGUARD_LEADER__ETCD__ENDPOINTS='[\"e1:2379\"]'",
    )
    ttl_s: int = Field(
        5,
        ge=2,
        le=300,
        description="lease TTL (s; etcd grants at least ~2): a dead leader is replaced within "
        "about ttl_s + 0.5 s; the leader steps down ttl_s/4 before its lease could expire",
    )
    key: str | None = Field(
        None,
        min_length=2,
        max_length=256,
        pattern=r"^/[A-Za-z0-9_./\-]+$",
        description="the leader key; None: /linkguard/<fabric name>/leader (services of one "
        "fabric must use the same key, services of different fabrics different ones)",
    )
    rpc_timeout_s: float = Field(2.0, gt=0, le=30, description="bound on every etcd call (s)")

    @field_validator("endpoints", mode="before")
    @classmethod
    def _endpoint_list(cls, v: object) -> object:
        if isinstance(v, str):  # "e1:2379,e2:2379"
            return [e.strip() for e in v.split(",") if e.strip()]
        return v

    @field_validator("endpoints")
    @classmethod
    def _endpoint_addresses(cls, v: list[str]) -> list[str]:
        for entry in v:
            try:
                broker_address(entry.removeprefix("http://"))
            except ValueError:
                raise ValueError(
                    f"etcd endpoint {entry!r}: expected host:port (or [IPv6]:port), e.g. "
                    "etcd1.mgmt:2379"
                ) from None
        if len(set(v)) != len(v):
            raise ValueError(f"an etcd endpoint is listed twice: {v}")
        return v

    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every endpoint, in order (an ``http://`` prefix is dropped)."""
        return [broker_address(e.removeprefix("http://")) for e in self.endpoints]


class KubernetesLeaderSettings(Section):
    """Leader election through a ``coordination.k8s.io/v1`` Lease
    (:class:`linkguard.topology.leader_k8s.KubernetesLease`), from inside a pod: the service
    account's token, CA and namespace and ``KUBERNETES_SERVICE_HOST``/``_PORT``. The service
    account needs get, create and update on leases in ``namespace`` (deploy/k8s)."""

    namespace: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="the Lease's namespace; None: the pod's own (the service account's "
        "namespace file)",
    )
    name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="the Lease's name (DNS subdomain); None: linkguard-<fabric name>-leader "
        "(services of one fabric must use the same Lease, of different fabrics different ones)",
    )
    ttl_s: int = Field(
        15,
        ge=2,
        le=300,
        description="the Lease's leaseDurationSeconds (client-go's default is 15): a dead "
        "leader is replaced about ttl_s + one or two polls (min(2, ttl_s/4) s each) after its "
        "last renewal; the leader steps down ttl_s/4 before its Lease could expire",
    )
    api_timeout_s: float = Field(
        5.0, gt=0, le=30, description="bound on every call to the API server (s)"
    )


class LeaderSettings(Section):
    """Who steers when several topology services run for one fabric. No section (the
    default): no election, this service is the only one (a second one on the same broker
    yields, :mod:`linkguard.presence`). ``etcd`` or ``kubernetes`` (not both): the lease
    holder leads, the others stand by."""

    etcd: EtcdLeaderSettings | None = Field(
        None, description="elect the leader through an etcd lease (Debian etcd-server)"
    )
    kubernetes: KubernetesLeaderSettings | None = Field(
        None,
        description="elect the leader through a Kubernetes coordination.k8s.io/v1 Lease "
        "(in a pod; LINKGUARD_LEADER__KUBERNETES__TTL_S=...)",
    )

    @model_validator(mode="after")
    def _one_backend(self) -> LeaderSettings:
        if self.etcd is not None and self.kubernetes is not None:
            raise ValueError(
                "leader: both etcd and kubernetes are configured; choose one (every service "
                "of a fabric must use the same election)"
            )
        return self


class LedgerSettings(Section):
    """The interruption ledger the service writes (:mod:`linkguard.ledger`): SQLite, WAL."""

    path: Path | None = Field(
        None,
        description="SQLite file, e.g. /var/lib/linkguard/ledger.sqlite3 (its directory must "
        "exist); null or '' = no ledger is kept",
    )
    retention_days: float = Field(
        90.0,
        gt=0,
        le=36_500,
        description="rows older than this are deleted when the service starts and hourly",
    )
    incident_window_s: float = Field(
        1.0,
        ge=0,
        le=60,
        description="ports going down within this long of an incident's first down join it "
        "(a leaf reboot is one incident)",
    )

    @field_validator("path", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        # LINKGUARD_LEDGER__PATH= (empty) means no ledger, as metrics_listen; never "."
        return None if isinstance(v, str) and not v.strip() else v
