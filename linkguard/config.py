"""Settings for the agent and the topology service (pydantic-settings).

Sources, highest first: explicit arguments, environment (``LINKGUARD_`` prefix, ``__`` for
nesting: ``LINKGUARD_BUS__PORT=1884``), a YAML file (``--config``), then the defaults here.
A bad value raises :class:`ConfigError` naming the field and the source file.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from linkguard.backoffpolicy import BackoffPolicy
from linkguard.counterpolicy import CounterHealthPolicy
from linkguard.damping import DampingPolicy
from linkguard.models import (
    MAX_MESSAGE_BYTES,
    CoreTier,
    LinkLayer,
    ManagementHostsPerSU,
    SettingsModel,
    SpinesPerSU,
    port_rate_problem,
)
from linkguard.topics import valid_segment

if TYPE_CHECKING:
    from linkguard.bus import TlsConfig

__all__ = [
    "AgentSettings",
    "ApiSettings",
    "BusSettings",
    "ConfigError",
    "EtcdLeaderSettings",
    "GeneratorSettings",
    "HookSettings",
    "KubernetesLeaderSettings",
    "LeaderSettings",
    "LedgerSettings",
    "OfflineSettings",
    "PortConfig",
    "ProbeRunSettings",
    "RouteOptions",
    "ServiceSettings",
    "listen_address",
    "load_settings",
]


class ConfigError(ValueError):
    """A configuration value or file that cannot be used."""


class _Section(SettingsModel):
    # NaN and infinities are refused in every section ("must be a finite number"), before any
    # bound is checked: NaN compares false with every bound and would otherwise pass ge/le
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class BusSettings(_Section):
    """How to reach the MQTT broker: address, TLS, credentials, timers.

    TLS and credentials (the hardened broker of deploy/mosquitto/, certificates and passwords
    made by deploy/make-certs.sh): ``tls`` on, ``ca_file`` the CA that signed the broker's
    certificate (None: the system's trusted CAs), ``cert_file``/``key_file`` a client
    certificate (optional; PEM, the key may be inside ``cert_file``), ``username`` and either
    ``password`` or ``password_file`` (its first line, read when the agent or service starts;
    never logged: ``password`` is a SecretStr). Every file is checked when the settings are
    loaded: a missing or unreadable one, or a certificate or key that does not load, raises
    :class:`ConfigError` naming the setting.

    A broker cluster (e.g. 3 NATS nodes with JetStream and their MQTT listeners): ``brokers``
    lists its nodes as ``host:port`` (``[v6addr]:port`` for IPv6; a YAML list or one string
    with commas; in the environment a JSON list:
    ``LINKGUARD_BUS__BROKERS='["n1:1883","n2:1883"]'``). The bus
    connects to the first and, when a connection fails or is lost, to the next, round robin
    (:class:`linkguard.bus.Bus`). Empty (the default): ``host``/``port`` alone; giving
    ``brokers`` and ``host`` or ``port`` too is an error (say the broker once). TLS, the
    credentials and the timers apply to every node, and with ``tls`` each node's certificate
    must name the host written here.
    """

    host: str = Field("127.0.0.1", description="the MQTT broker (with port; see brokers)")
    port: int = Field(1883, ge=1, le=65535, description="8883 for the TLS listener of deploy/")
    brokers: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="host:port of each node of a broker cluster, tried in turn (round robin) "
        "after a failure; empty: host and port",
    )
    username: str | None = Field(
        None, min_length=1, description="the host's name for agents (the broker's ACL maps it)"
    )
    password: SecretStr | None = Field(None, description="or password_file; never logged")
    password_file: Path | None = Field(
        None, description="file whose first line is the password (mode 0600), read at start"
    )
    tls: bool = Field(False, description="connect with TLS (the broker's 8883 listener)")
    ca_file: Path | None = Field(
        None, description="PEM CA certificate(s) to verify the broker; None: system CAs"
    )
    cert_file: Path | None = Field(None, description="PEM client certificate (optional)")
    key_file: Path | None = Field(
        None, description="PEM key of cert_file; None: the key is in cert_file"
    )
    tls_insecure: bool = Field(
        False,
        description="do not check that the broker's certificate names bus.host (the chain is "
        "still verified); for tests only",
    )
    keepalive_s: int = Field(
        15,
        ge=5,
        le=3600,
        description="MQTT keepalive (s); the broker "
        "publishes the last will after 1.5x this without traffic",
    )
    reconnect_min_s: float = Field(0.2, gt=0, description="first wait before a reconnect (s)")
    reconnect_max_s: float = Field(
        10.0, gt=0, description="the wait doubles per failed reconnect up to this (s)"
    )
    subscribe_qos: int = Field(
        1,
        ge=0,
        le=1,
        description="QoS of the bus's subscriptions (the agent's peers/+ one is QoS 0 "
        "always). 0 suits a NATS cluster: NATS makes a JetStream consumer per QoS 1 "
        "subscription, and after a node dies deleting and re-creating them takes its "
        "survivors 18-46 s (QoS 0: 0.1-10 s; tests/test_nats_cluster.py); under CPU load "
        "such a consumer also skipped messages (nats-server 2.9.10; README, NATS). With "
        "clean sessions either way loses only what was in flight on a dropped connection, "
        "which the retained state and re-publish on reconnect cover",
    )
    max_message_bytes: int = Field(
        MAX_MESSAGE_BYTES, ge=1024, description="a bus message above this is refused unread"
    )

    @field_validator("brokers", mode="before")
    @classmethod
    def _broker_list(cls, v: object) -> object:
        if isinstance(v, str):  # "n1:1883,n2:1883"
            return [b.strip() for b in v.split(",") if b.strip()]
        return v

    @field_validator("brokers")
    @classmethod
    def _broker_addresses(cls, v: list[str]) -> list[str]:
        for entry in v:
            _broker_address(entry)
        if len(set(v)) != len(v):
            raise ValueError(f"a broker is listed twice: {v}")
        return v

    def broker_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every broker to use, in order: ``brokers``, or ``host``/``port``."""
        if self.brokers:
            return [_broker_address(b) for b in self.brokers]
        return [(self.host, self.port)]

    @model_validator(mode="after")
    def _tls_and_credentials(self) -> BusSettings:
        if self.brokers and {"host", "port"} & self.model_fields_set:
            raise ValueError("give brokers, or host and port, not both (brokers lists every node)")
        if not self.brokers and "brokers" in self.model_fields_set:
            raise ValueError(
                "brokers is empty: list at least one host:port, or leave brokers out and give "
                "host and port"
            )
        if self.password is not None and self.password_file is not None:
            raise ValueError("give password or password_file, not both")
        if (self.password is not None or self.password_file is not None) and not self.username:
            raise ValueError("a password needs a username")
        if self.password_file is not None:
            self._password_from_file()
        files = ("ca_file", "cert_file", "key_file")
        if not self.tls:
            given = [f for f in files if getattr(self, f) is not None]
            if given or self.tls_insecure:
                raise ValueError(
                    f"{', '.join(given or ['tls_insecure'])} given but tls is off (set tls: true)"
                )
            return self
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs cert_file (the client certificate)")
        for name in files:
            path = getattr(self, name)
            if path is not None:
                _readable(name, path)
        # load them as the bus will (linkguard.bus.TlsConfig.context), naming the bad one
        ctx = ssl.create_default_context()
        if self.ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.ca_file))
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise ValueError(
                    f"ca_file {self.ca_file} is not a PEM CA certificate: {exc}"
                ) from None
        if self.cert_file is not None:
            key = self.key_file or self.cert_file
            try:
                ctx.load_cert_chain(str(self.cert_file), str(key))
            except (OSError, ValueError) as exc:
                raise ValueError(
                    f"cert_file {self.cert_file} with key {key}: not a PEM certificate and "
                    f"its private key: {exc}"
                ) from None
        return self

    def _password_from_file(self) -> str:
        path = self.password_file
        assert path is not None
        _readable("password_file", path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"password_file {path}: cannot read it: {exc}") from None
        lines = text.splitlines()
        if not lines or not lines[0]:
            raise ValueError(f"password_file {path}: the first line (the password) is empty")
        return lines[0]

    def tls_config(self) -> TlsConfig | None:
        """The TLS parameters for :class:`linkguard.bus.Bus` (None: plain TCP)."""
        from linkguard.bus import TlsConfig  # here: the bus module imports the MQTT client

        if not self.tls:
            return None
        return TlsConfig(
            ca_file=self.ca_file,
            cert_file=self.cert_file,
            key_file=self.key_file,
            insecure=self.tls_insecure,
        )

    def connection(self) -> dict[str, Any]:
        """Keyword arguments for :class:`linkguard.bus.Bus` (broker, TLS, credentials, timers).
        Reads ``password_file`` now; raises :class:`ConfigError` when it became unreadable."""
        password = self.password.get_secret_value() if self.password is not None else None
        if self.password_file is not None:
            try:
                password = self._password_from_file()
            except ValueError as exc:
                raise ConfigError(f"bus.{exc}") from None
        brokers = self.broker_addresses()
        return {
            "host": brokers[0][0],
            "port": brokers[0][1],
            "brokers": brokers,
            "username": self.username,
            "password": password,
            "tls": self.tls_config(),
            "keepalive_s": self.keepalive_s,
            "reconnect_min_s": self.reconnect_min_s,
            "reconnect_max_s": self.reconnect_max_s,
            "subscribe_qos": self.subscribe_qos,
        }


def _broker_address(entry: str) -> tuple[str, int]:
    """(host, port) of a ``host:port`` or ``[v6addr]:port`` entry of ``bus.brokers``.
    ValueError naming the entry when the host is empty, has spaces, or the port is missing or
    outside 1..65535."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([^\s:\[\]/]+):(\d{1,5})", entry)
    if m is None:
        raise ValueError(
            f"broker {entry!r}: expected host:port (or [IPv6]:port), e.g. nats1.mgmt:1883"
        )
    host, port = (m[1], int(m[2])) if m[1] else (m[3], int(m[4]))
    if not 1 <= port <= 65535:
        raise ValueError(f"broker {entry!r}: port {port} outside 1..65535")
    return host, port


def _readable(setting: str, path: Path) -> None:
    """ValueError naming ``setting`` (a BusSettings field) unless ``path`` is a readable
    regular file."""
    if not path.exists():
        raise ValueError(f"{setting} {path} does not exist")
    if not path.is_file():
        raise ValueError(f"{setting} {path} is not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{setting} {path} is not readable by this user")


class PortConfig(_Section):
    """One compute HCA port of this host and the rail it serves."""

    hca: str = Field(min_length=1, max_length=64, description="HCA name in sysfs, e.g. mlx5_0")
    port: int = Field(1, ge=1, le=255, description="HCA port number (sysfs ports/N)")
    rail: int | None = Field(None, ge=0, le=63, description="None: by PCI address order")
    netdev: str | None = Field(
        None, max_length=15, description="the port's netdev; None: from sysfs (device/net)"
    )
    address: ipaddress.IPv4Address | None = Field(
        None, description="the port's rail address, reported in the inventory"
    )
    link_layer: LinkLayer | None = Field(None, description="None: from sysfs link_layer")
    numa_node: int | None = Field(None, description="None: from sysfs device/numa_node")
    expected_rate_gbps: float | None = Field(
        None,
        gt=0,
        description="the rate (Gb/s) this port must run at to be used, while up and when it "
        "comes back from hold-down; below it the port is degraded (None: the highest rate "
        "read while up). One a port reports: a width (1, 2, 4, 8, 12 lanes) times a lane "
        "rate (SDR 2.5 ... XDR 200), e.g. 100, 200, 400, 800",
    )

    @field_validator("expected_rate_gbps")
    @classmethod
    def _a_port_rate(cls, v: float | None) -> float | None:
        """A port never reports a rate outside :data:`~linkguard.models.PORT_RATES_GBPS`: a bar
        above every reading (or between them) would keep the port degraded for good."""
        problem = None if v is None else port_rate_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


def resolve_command(command: str) -> str:
    """The absolute path of a hook's ``argv[0]``: an absolute path to an executable regular
    file, or a bare name found on ``PATH`` (``shutil.which``). ValueError otherwise (a relative
    path such as ``./x`` depends on the working directory: refused)."""
    import shutil

    if not command or "\0" in command:
        raise ValueError("argv[0] is empty or has a NUL byte")
    if "/" in command:
        path = Path(command)
        if not path.is_absolute():
            raise ValueError(f"{command!r}: give an absolute path or a name on PATH")
        try:
            runnable = path.is_file() and os.access(path, os.X_OK)
        except (OSError, ValueError):  # a name too long, an unencodable one
            runnable = False
        if not runnable:
            raise ValueError(f"{command!r} is not an executable file")
        return command
    try:
        found = shutil.which(command)
    except (OSError, ValueError):
        found = None
    if found is None:
        raise ValueError(
            f"{command!r} not found on PATH ({os.environ.get('PATH', '')}); argv is a list "
            "(never a shell string): the command alone first, each argument its own item"
        )
    return found


#: When a hook runs (:class:`HookSettings`' ``when``).
HookTrigger: TypeAlias = Literal["change", "lost_above", "whole_again"]


def _on_every_change() -> list[HookTrigger]:
    return ["change"]


class HookSettings(_Section):
    """One job-facing hook (:mod:`linkguard.agent.hooks`): a command the agent runs when this
    host's rail map changes, with the change (``linkguard.rail-change/v1``,
    :mod:`linkguard.agent.railmap`) as one JSON document on stdin.

    ``argv`` is a list, never a shell string; ``argv[0]`` is an absolute path to an executable
    or a name on the agent's PATH, checked when the settings load. ``when``: ``change`` (every
    change), ``lost_above`` (the number of lost rails rises above ``lost_above``),
    ``whole_again`` (no rail lost any more; also at the first change after the agent starts
    when none is). A failure (exit status not 0, ``timeout_s`` passed: the process group is
    killed, or it cannot start) is retried up to ``retries`` times, ``backoff_s`` after the
    first failure, doubling up to ``backoff_max_s``; a newer change replaces a pending retry.
    ``env``: added to the agent's environment for the command."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="the hook's name in logs"
    )
    argv: list[str] = Field(
        min_length=1, max_length=256, description="the command, run without a shell"
    )
    when: list[HookTrigger] = Field(
        default_factory=_on_every_change, min_length=1, description="the changes that run it"
    )
    lost_above: int = Field(0, ge=0, le=63, description="N of when: lost_above (rails)")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="then the process group is killed")
    retries: int = Field(3, ge=0, le=20, description="attempts after the first failed one")
    backoff_s: float = Field(1.0, gt=0, le=3600, description="wait before the first retry (s)")
    backoff_max_s: float = Field(60.0, gt=0, le=86_400, description="longest wait (s)")
    env: dict[str, str] = Field(
        default_factory=dict, max_length=64, description="added to its environment"
    )

    @field_validator("when", mode="before")
    @classmethod
    def _one_when(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @field_validator("argv", mode="before")
    @classmethod
    def _not_a_shell_string(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError(
                "argv must be a list of arguments, e.g. [/usr/local/bin/drain, --host, x], "
                "not a shell string (hooks never run a shell)"
            )
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if any("\0" in a for a in v):
            raise ValueError("argv items must not contain NUL bytes")
        resolve_command(v[0])
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or "\0" in val:
                raise ValueError(f"env {k!r}: not a valid variable name or value")
        return v


class GeneratorSettings(_Section):
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


class ApiSettings(_Section):
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


#: UDP port of udp-mode probes (linkguard.agent.probe.DEFAULT_UDP_PORT)
PROBE_UDP_PORT = 47_910
#: UDP port of roce-mode probes: RoCEv2's (IANA "roce", 4791; linkguard.agent.probe)
PROBE_ROCE_PORT = 4791


class RouteOptions(_Section):
    """How the agent writes its routes beyond what a plan names (``routes:`` of the agent;
    :mod:`linkguard.agent.applier`), so that TCP moves with a reroute, not only UDP.

    ``source``: ``endpoint`` gives every route towards a peer endpoint ``src`` = this host's
    GPU endpoint on the same home rail (a connection opened without a bind is then sourced
    from an address the peers' linkguard routes carry; with the rail's own address, the
    kernel's choice, replies keep coming over the lost rail). An endpoint that is not an
    address of the host is left out (``route_src_not_local``). ``kernel``: no ``src``.
    ``rto_min_ms``: a locked TCP minimum retransmission timeout on every route (ms, as
    ``ip route ... rto_min 20ms``); a segment lost in the switch-over is sent again after
    about this long instead of Linux's 200 ms TCP_RTO_MIN; it applies to every TCP connection
    towards the GPU endpoints, also when nothing failed (a lower bound, not a fixed timeout).
    None: the kernel's. ``neighbour_flush``: after every route change, delete the neighbour
    (ARP) entries the old routes used and the new ones do not (a segment parked on the lost
    rail's unresolved entry is otherwise never retransmitted: the connection stalls until
    that rail answers again)."""

    source: Literal["endpoint", "kernel"] = Field(
        "endpoint", description="src of linkguard's routes: the local GPU endpoint, or none"
    )
    rto_min_ms: int | None = Field(
        None,
        ge=1,
        le=120_000,
        description="locked TCP rto_min on linkguard's routes (ms); None: the kernel's 200 ms",
    )
    neighbour_flush: bool = Field(
        True, description="delete the neighbour entries a route change leaves stale"
    )


class ProbeRunSettings(_Section):
    """Per-rail probes (``probes:`` of the agent and the service; issue 8). Off by default.
    The service plans who probes whom (:mod:`linkguard.topology.probeplan`) every ``epoch_s``
    and localises faults from the agents' reports (:mod:`linkguard.topology.localize`); the
    agent probes (:mod:`linkguard.agent.probe`) and reports every ``window_s``.

    ``port`` not given: :data:`PROBE_UDP_PORT` (47910) in ``udp`` mode, :data:`PROBE_ROCE_PORT`
    (4791, RoCEv2's) in ``roce`` mode. Raises ``pydantic.ValidationError`` (naming both
    settings and their values) for settings that would switch localisation off:
    ``min_samples > window_s * rate_pps`` (no pair ever gets enough probes in a window),
    ``min_probers > fan_out`` (never enough witnesses), ``timeout_s > window_s``,
    ``window_s > epoch_s``, ``clear_after_s < window_s``; and for ``fan_out * rate_pps > 16``
    or ``cross_su > fan_out``."""

    enabled: bool = Field(False, description="probe rails and act on localised faults")
    mode: Literal["udp", "roce"] = Field("udp", description="udp on RoCE NICs (see probe.py)")
    port: int = Field(
        PROBE_UDP_PORT,
        ge=1,
        le=65535,
        description="UDP port; not given: 47910 in udp mode, 4791 (RoCEv2) in roce mode",
    )
    fan_out: int = Field(4, ge=1, le=16, description="peers probed per (host, rail)")
    cross_su: int = Field(2, ge=0, le=16, description="of fan_out, on other SUs' leaves")
    rate_pps: float = Field(1.0, gt=0, le=16, description="probes/s to each peer")
    min_probers: int = Field(3, ge=1, le=16, description="witnesses a verdict needs")
    epoch_s: float = Field(300.0, gt=0, le=86_400, description="probe plan rotation (s)")
    window_s: float = Field(10.0, gt=0, le=3600, description="report window (s)")
    timeout_s: float = Field(1.0, gt=0, le=60, description="a probe unanswered this long is lost")
    min_samples: int = Field(5, ge=1, le=100_000, description="probes on a pair before it counts")
    clear_after_s: float = Field(60.0, ge=0, le=86_400, description="loss low this long clears")

    @model_validator(mode="after")
    def _bounded(self) -> ProbeRunSettings:
        if self.fan_out * self.rate_pps > 16:
            raise ValueError(
                f"fan_out {self.fan_out} x rate_pps {self.rate_pps:g} = "
                f"{self.fan_out * self.rate_pps:g} probes/s per port > 16 (the bound that keeps "
                "a 16,384-GPU fleet at or under 524,288 packets/s)"
            )
        if self.cross_su > self.fan_out:
            raise ValueError(f"cross_su {self.cross_su} > fan_out {self.fan_out}")
        return self

    @model_validator(mode="after")
    def _localisable(self) -> ProbeRunSettings:
        # settings that pass every bound of their own but leave the localiser nothing to use
        per_window = self.window_s * self.rate_pps
        if self.min_samples > per_window:
            raise ValueError(
                f"min_samples {self.min_samples} > window_s {self.window_s:g} x rate_pps "
                f"{self.rate_pps:g} = {per_window:g} probes a pair gets per report window: "
                "no pair would ever count and nothing would be localised; lower min_samples "
                "or raise window_s or rate_pps"
            )
        if self.min_probers > self.fan_out:
            raise ValueError(
                f"min_probers {self.min_probers} > fan_out {self.fan_out}: a port has about "
                "fan_out probers and targets, so no verdict could get min_probers witnesses"
            )
        if self.timeout_s > self.window_s:
            raise ValueError(
                f"timeout_s {self.timeout_s:g} > window_s {self.window_s:g}: a probe must be "
                "answered or counted lost within the report window it was sent in"
            )
        if self.window_s > self.epoch_s:
            raise ValueError(
                f"window_s {self.window_s:g} > epoch_s {self.epoch_s:g}: the probe plan would "
                "rotate before a report window ends"
            )
        if self.clear_after_s < self.window_s:
            raise ValueError(
                f"clear_after_s {self.clear_after_s:g} < window_s {self.window_s:g}: a verdict "
                "would clear before one whole window of answered probes, and a lossy port "
                "would flap between drained and used; give clear_after_s >= window_s"
            )
        return self

    @model_validator(mode="after")
    def _port_of_mode(self) -> ProbeRunSettings:
        if "port" not in self.model_fields_set and self.mode == "roce":
            self.port = PROBE_ROCE_PORT  # RoCEv2's port unless the user gave one
            self.model_fields_set.discard("port")  # filled in, not given
        return self


class OfflineSettings(_Section):
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


class EtcdLeaderSettings(_Section):
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
                _broker_address(entry.removeprefix("http://"))
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
        return [_broker_address(e.removeprefix("http://")) for e in self.endpoints]


class KubernetesLeaderSettings(_Section):
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


class LeaderSettings(_Section):
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


class LedgerSettings(_Section):
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


class _Base(BaseSettings, SettingsModel):
    log_format: Literal["json", "console"] = Field(
        "json", description="structlog output: one JSON object per line, or for a terminal"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="the least severe log event written"
    )
    bus: BusSettings = Field(BusSettings(), description="the MQTT bus (broker, TLS, QoS)")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        yaml_file = settings_cls.model_config.get("yaml_file")
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls))
        return tuple(sources)


_LISTEN = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)):(?P<port>\d{1,5})$"
)


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` (port 0-65535; 0: any free port) as ``(host, port)``.
    Raises ValueError naming the accepted forms."""
    m = _LISTEN.match(text.strip())
    if m is None or int(m["port"]) > 65535:
        raise ValueError(
            f"{text!r} is not an address to listen on: use HOST:PORT or [IPV6]:PORT with a "
            "port 0-65535 (0: any free port), e.g. 127.0.0.1:9477; null or '' for none"
        )
    return (m["v6"] or m["host"], int(m["port"]))


#: verbs_events words, any case: YAML 1.1's booleans mean what the environment's words mean
_VERBS_EVENTS_WORDS = {
    **dict.fromkeys(("auto", "on", "true", "yes"), "auto"),
    **dict.fromkeys(("off", "false", "no"), "off"),
}


class AgentSettings(_Base):
    """``linkguard agent``: one per GPU host."""

    model_config = SettingsConfigDict(
        env_prefix="LINKGUARD_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    host: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=253,
        description="this host's name on the bus and in the fabric file",
    )
    driver: Literal["sysfs", "netlink", "simulated"] = Field(
        "sysfs", description="sysfs: IB ports polled; netlink: netdev carrier; simulated: tests"
    )
    sysfs_root: Path = Field(Path("/sys/class/infiniband"), description="the IB class dir")
    poll_interval_ms: float = Field(
        100.0, ge=5, le=60_000, description="sysfs port state read this often (ms)"
    )
    netns: str | None = Field(
        None,
        description="network namespace of the netdevs and routes (labs); None = the agent's own",
    )
    ports: list[PortConfig] = Field(
        default_factory=list,
        description="empty: every HCA port found in sysfs, rails by PCI address order",
    )
    endpoints: list[ipaddress.IPv4Address] = Field(
        default_factory=list, max_length=64, description="one /32 per GPU, index = GPU"
    )
    endpoint_prefixes: list[ipaddress.IPv4Network] = Field(
        default_factory=lambda: [ipaddress.IPv4Network("10.200.0.0/16")],
        description="plans may only route destinations inside these; one ip rule each",
    )

    @field_validator("endpoint_prefixes")
    @classmethod
    def _narrow_prefixes(cls, v: list[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
        if not v:
            raise ValueError("give at least one endpoint prefix (the GPU endpoints' range)")
        for p in v:
            if p.prefixlen < 8:
                raise ValueError(
                    f"{p} is too wide: linkguard routes only the GPU endpoint "
                    "range, never a default or /0-/7 route"
                )
        return v

    @field_validator("host")
    @classmethod
    def _host_name(cls, v: str) -> str:
        if not valid_segment(v):
            raise ValueError(f"host {v!r}: use letters, digits, '.', '_' or '-'")
        return v

    route_table: int = Field(4242, ge=1, le=2**31 - 1, description="linkguard's own table")
    rule_priority: int = Field(
        1000, ge=1, le=32765, description="priority of the ip rules to route_table"
    )
    apply_routes: bool = Field(
        True,
        description="false: a dry run, plans applied to an in-memory table and the kernel's "
        "routes and rules left untouched (quickstart and simulations run so)",
    )
    routes: RouteOptions = Field(
        default_factory=RouteOptions,
        description="route source address, TCP rto_min, neighbour flush (what TCP needs to "
        "follow a reroute)",
    )
    damping: DampingPolicy = Field(
        DampingPolicy(), description="flap damping: how long a flapping port is held down"
    )
    counter_health: CounterHealthPolicy = Field(
        default_factory=CounterHealthPolicy,
        description="error-counter rates that drain an up port (linkguard.agent.health)",
    )
    state_dir: Path = Field(
        Path("/var/lib/linkguard"),
        description="last plan, peer routes, flap history, counter verdicts (kept over restarts)",
    )
    rail_map_path: Path = Field(
        Path("/run/linkguard/rail-map.json"), description="the rail map local jobs read"
    )
    nccl_topo_file: Path | None = Field(
        None,
        description="this host's NCCL topology file (NCCL_TOPO_FILE XML): the agent writes a "
        "copy without the unusable NICs as nccl-topo.xml next to the rail map "
        "(linkguard.nccl); None: no topology file is rendered",
    )
    shutdown_policy: Literal["keep", "withdraw"] = Field(
        "keep", description="on SIGTERM: keep the routes in place, or withdraw table and rules"
    )
    refresh_interval_s: float = Field(
        30.0, ge=1, description="re-publish all port states this often (s, +-10 % jitter)"
    )
    service_public_key: Path | None = Field(
        None,
        description="the topology service's Ed25519 public key (PEM or raw 32 bytes, "
        "`linkguard keys generate`): plans and peer routes must be signed with its private "
        "key; None: they are applied unverified (simulations, quickstart; logged at start)",
    )
    require_signed_plans: bool = Field(
        True,
        description="with service_public_key: refuse unsigned plans and peer routes (false "
        "only while rolling keys out: unsigned ones are then applied, signed ones verified)",
    )
    metrics_listen: str | None = Field(
        "127.0.0.1:9477",
        description="Prometheus exporter (GET /metrics): HOST:PORT or [IPV6]:PORT, port 0 = "
        "any free one; null or '' = no exporter (linkguard.metrics)",
    )

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        listen_address(v)
        return v.strip()

    hooks: list[HookSettings] = Field(
        default_factory=list,
        max_length=32,
        description="commands run when this host's rail map changes (linkguard.agent.hooks)",
    )
    probes: ProbeRunSettings = Field(
        default_factory=ProbeRunSettings,
        description="per-rail probes toward the service's targets (off by default)",
    )
    rails_socket: Path | None = Field(
        None,
        description="Unix socket (mode 0660) streaming the rail map, one JSON line per change "
        "(linkguard.agent.localsub; `linkguard rails follow`), e.g. /run/linkguard/rails.sock; "
        "None: no socket",
    )
    rails_socket_group: str | None = Field(
        None, min_length=1, description="group owning rails_socket (its members may connect)"
    )
    rails_socket_queue: int = Field(
        256, ge=1, le=100_000, description="changes a slow subscriber may lag before it is cut"
    )
    verbs_events: Literal["auto", "off"] = Field(
        "auto",
        description="RDMA async events (PORT_ERR, PORT_ACTIVE, LID/GID/SM changes) make the "
        "sysfs driver re-read that HCA's ports at once (linkguard.drivers.verbs_events); auto: "
        "with the sysfs driver when sysfs_root has devices and pyverbs loads; off: polling only; "
        "on/true/yes mean auto, false/no mean off (YAML or LINKGUARD_VERBS_EVENTS alike)",
    )

    @field_validator("verbs_events", mode="before")
    @classmethod
    def _on_off(cls, v: object) -> object:
        # YAML 1.1 reads a bare on/off/yes/no as a bool, the environment gives the word: both
        # paths take the same words (any case) and give the same value
        if isinstance(v, bool):
            return "auto" if v else "off"
        if isinstance(v, str):
            word = v.strip().lower()
            if word in _VERBS_EVENTS_WORDS:
                return _VERBS_EVENTS_WORDS[word]
        raise ValueError(
            f"{v!r}: expected auto or off (on, true, yes mean auto; false, no mean off)"
        )

    verbs_python: Path = Field(
        Path("/usr/bin/python3"),
        description="the Python that runs the event reader: Debian's python3-pyverbs works "
        "only with the system python3",
    )
    verbs_reader: Path | None = Field(
        None, description="the event reader script; None: the one shipped in linkguard.drivers"
    )

    @field_validator("hooks")
    @classmethod
    def _hook_names(cls, v: list[HookSettings]) -> list[HookSettings]:
        names = [h.name for h in v]
        if len(set(names)) != len(names):
            raise ValueError(f"hook names must be unique: {names}")
        return v

    @field_validator("rails_socket")
    @classmethod
    def _socket_path(cls, v: Path | None) -> Path | None:
        if v is None:
            return None
        if not v.is_absolute():
            raise ValueError(f"{v}: give an absolute path")
        # sun_path holds 107 bytes; the socket is bound as .<name>.tmp first, then renamed
        if len(os.fsencode(v.parent / f".{v.name}.tmp")) > 107:
            raise ValueError(f"{v}: too long for a Unix socket path (about 100 bytes at most)")
        return v

    @field_validator("route_table")
    @classmethod
    def _not_reserved(cls, v: int) -> int:
        if v in (0, 253, 254, 255):
            raise ValueError(f"table {v} is reserved (unspec/default/main/local)")
        return v


S = TypeVar("S", bound="_Base")


class ServiceSettings(_Base):
    """``linkguard topology serve``."""

    model_config = SettingsConfigDict(
        env_prefix="LINKGUARD_", env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    fabric: Path | None = Field(None, description="fabric file (JSON/YAML); None = generate")
    generate: GeneratorSettings | None = Field(
        None, description="generator parameters, when there is no fabric file"
    )
    # When to solve: RFC 8405's SPF back-off (linkguard.topology.backoff), with its names.
    solve_initial_delay_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description="after a quiet period, solve this long after the first change that takes "
        "a port out of use (RFC 8405 INITIAL_SPF_DELAY): a single failed link is rerouted at "
        "once (10 ms here cost 20 ms of p99 data-plane gap in benchmarks/lab_gap.py)",
    )
    debounce_ms: float = Field(
        150.0,
        ge=0,
        le=10_000,
        description="changes that follow the first one are batched this long (RFC 8405 "
        "SHORT_SPF_DELAY; Open/R batches over 10-250 ms); above the agents' poll interval "
        "(100 ms), so a leaf failure costs at most two plans per host",
    )
    solve_long_delay_ms: float = Field(
        1000.0,
        ge=0,
        le=60_000,
        description="batching window once changes keep coming for longer than "
        "solve_time_to_learn_ms (RFC 8405 LONG_SPF_DELAY): a storm costs one solve per window",
    )
    solve_time_to_learn_ms: float = Field(
        500.0, ge=0, le=60_000, description="RFC 8405 TIME_TO_LEARN_INTERVAL"
    )
    solve_holddown_ms: float = Field(
        3000.0,
        ge=0,
        le=600_000,
        description="quiet time after which the next change is solved after "
        "solve_initial_delay_ms again (RFC 8405 HOLDDOWN_INTERVAL; >= solve_time_to_learn_ms)",
    )

    def backoff_policy(self) -> BackoffPolicy:
        """The solve back-off of these settings (RFC 8405)."""
        return BackoffPolicy(
            initial_ms=self.solve_initial_delay_ms,
            short_ms=self.debounce_ms,
            long_ms=self.solve_long_delay_ms,
            time_to_learn_ms=self.solve_time_to_learn_ms,
            holddown_ms=self.solve_holddown_ms,
        )

    @model_validator(mode="after")
    def _backoff_consistent(self) -> ServiceSettings:
        if self.solve_holddown_ms < self.solve_time_to_learn_ms:
            raise ValueError(
                f"solve_holddown_ms ({self.solve_holddown_ms:g}) must be >= "
                f"solve_time_to_learn_ms ({self.solve_time_to_learn_ms:g}) (RFC 8405)"
            )
        return self

    @model_validator(mode="after")
    def _one_fabric_source(self) -> ServiceSettings:
        if self.fabric is not None and self.generate is not None:
            raise ValueError(
                f"fabric {str(self.fabric)!r} (the fabric: key, LINKGUARD_FABRIC or --fabric) "
                "and generate: (generator parameters) are both given: give either, not both"
            )
        return self

    startup_settle_s: float = Field(
        1.0, ge=0, le=600, description="collect retained states this long before the first plans"
    )
    signing_key: Path | None = Field(
        None,
        description="Ed25519 private key (PEM PKCS #8 or raw 32 bytes, mode 0600 or stricter; "
        "`linkguard keys generate`) that signs every plan and peer routes message; None: "
        "published unsigned",
    )
    ledger: LedgerSettings = Field(
        default_factory=LedgerSettings,
        description="interruption ledger (LINKGUARD_LEDGER__PATH=...); off until a path is set",
    )
    api: ApiSettings = Field(
        default_factory=ApiSettings,
        description="HTTP API and dashboard (LINKGUARD_API__PORT=...); on by default, bound "
        "to 127.0.0.1:8470",
    )
    leader: LeaderSettings = Field(
        default_factory=LeaderSettings,
        description="leader election among several services of one fabric "
        "(LINKGUARD_LEADER__ETCD__ENDPOINTS=...); none by default",
    )
    offline: OfflineSettings = Field(
        default_factory=OfflineSettings,
        description="routing around hosts whose agent's connection was lost (last will)",
    )
    probes: ProbeRunSettings = Field(
        default_factory=ProbeRunSettings,
        description="per-rail probes: plan, localise, route around (off by default)",
    )


#: Environment variables with the LINKGUARD_ prefix that are not settings: the test and CI
#: switches (tests/support.py, tests/conftest.py, tests/e2e/conftest.py, tests/test_dashboard.py,
#: fuzz/run.py) and what the agent gives its hooks (linkguard.agent.hooks), so that a hook may
#: run ``linkguard nccl env`` or ``linkguard rails follow``.
_NOT_SETTINGS = frozenset(
    {
        "LINKGUARD_REQUIRE_REAL",
        "LINKGUARD_FIXTURES",
        "LINKGUARD_E2E_BROKER",
        "LINKGUARD_ARTIFACTS",
        "LINKGUARD_CHROMIUM",
        "LINKGUARD_HOOK",
        "LINKGUARD_HOOK_ATTEMPT",
    }
)


def _section_models(annotation: object) -> list[type[BaseModel]] | None:
    """The settings sections an annotation nests (``X``, ``X | None``, ``X | Y``), or None when
    it is anything else (a value, a list, a dict: any deeper name is left to pydantic)."""
    import types
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models: list[type[BaseModel]] = []
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            sub = _section_models(arg)
            if sub is None:
                return None
            models += sub
        return models or None
    return None


def _names_setting(model: type[BaseModel], path: list[str]) -> bool:
    """Whether ``path`` (an environment name split at ``__``, lower case) names a setting of
    ``model`` or a value inside one (a dict's key)."""
    fields = model.model_fields
    if not path or path[0] not in fields:
        return False
    sections = _section_models(fields[path[0]].annotation)
    if len(path) == 1 or sections is None:
        return True
    return any(_names_setting(m, path[1:]) for m in sections)


def _env_names(cls: type[BaseSettings]) -> tuple[list[str], list[str], list[str]]:
    """The ``LINKGUARD_*`` variables (outside ``_NOT_SETTINGS``) that ``cls`` (AgentSettings
    or ServiceSettings) does not read, sorted, as ``(typos, other_role, unknown_other)``:
    ``typos`` name no setting of either role and are not in the other role's sections either
    (at the top level, or inside a section of ``cls``); ``other_role`` name a setting of the
    other role only; ``unknown_other`` lie in a section only the other role has but name none
    of its settings (the other role refuses them)."""
    other = ServiceSettings if issubclass(cls, AgentSettings) else AgentSettings
    typos, other_role, unknown_other = [], [], []
    for name in os.environ:
        if not name.startswith("LINKGUARD_") or name in _NOT_SETTINGS:
            continue
        path = name.removeprefix("LINKGUARD_").lower().split("__")
        if _names_setting(cls, path):
            continue
        if _names_setting(other, path):
            other_role.append(name)
        elif path[0] in other.model_fields and path[0] not in cls.model_fields:
            unknown_other.append(name)
        else:
            typos.append(name)
    return sorted(typos), sorted(other_role), sorted(unknown_other)


def _log_env_names(settings: _Base, other_role: list[str], unknown_other: list[str]) -> None:
    """Log, once per load, the ``LINKGUARD_*`` variables these settings ignore: warning
    ``unknown_env_setting`` for names no role has, info ``env_setting_of_other_role`` for the
    other role's. Before ``configure_logging`` (the CLI loads the settings first) the events
    go to stderr in the settings' own log format and level, never to stdout (which may carry
    a command's output)."""
    import sys

    import structlog

    if not (other_role or unknown_other):
        return
    role, other = (
        ("agent", "service") if isinstance(settings, AgentSettings) else ("service", "agent")
    )
    if structlog.is_configured():
        log = structlog.get_logger(__name__)
    else:
        renderer = (
            structlog.processors.JSONRenderer()
            if settings.log_format == "json"
            else structlog.dev.ConsoleRenderer(colors=False)
        )
        log = structlog.wrap_logger(
            structlog.PrintLogger(sys.stderr),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(settings.log_level.upper()),
        )
    if unknown_other:
        log.warning(
            "unknown_env_setting",
            role=role,
            variables=unknown_other,
            note="named no setting of the agent or the service; ignored",
        )
    if other_role:
        log.info(
            "env_setting_of_other_role",
            role=role,
            variables=other_role,
            note=f"settings of the {other}; ignored by the {role}",
        )


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML says keys are
    unique; PyYAML keeps the last one silently, so a second ``bus:`` would replace the
    first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(path: Path) -> None:
    """Refuse what YamlConfigSettingsSource would misreport: not a file, not a mapping."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file")
    try:
        doc = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except RecursionError:
        raise ConfigError(f"cannot read config {path}: nested too deeply") from None
    # ValueError: undecodable bytes, an integer of more than 4,300 digits
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(
            f"config {path}: the top level must be a mapping of settings, "
            f"not a {type(doc).__name__}"
        )


def _error_text(e: Any) -> str:
    """One pydantic error as ``loc: message`` (a model-level error without ``loc``; a
    validator's ValueError without pydantic's ``Value error, `` prefix)."""
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "finite_number":  # NaN or an infinity (YAML .nan/.inf, env nan/inf)
        msg = "must be a finite number"
    loc = ".".join(str(p) for p in e["loc"])
    return f"{loc}: {msg}" if loc else msg


def load_settings(cls: type[S], path: Path | None = None, **overrides: Any) -> S:
    """Build settings from ``path`` (YAML), the environment and ``overrides``.

    Raises :class:`ConfigError` for a missing/unreadable file, bad YAML, a bad value, or a
    ``LINKGUARD_*`` environment variable that names no setting of either role (a typo). The
    other role's variables (an environment shared by both) are logged at info and ignored; a
    variable inside a section only the other role has that names none of its settings is
    logged as a warning (``unknown_env_setting``) and ignored: the other role refuses it.
    """
    typos, other_role, unknown_other = _env_names(cls)
    if typos:
        raise ConfigError(
            f"unknown setting(s) in the environment: {', '.join(typos)} (no setting of the "
            "agent or the service has this name; `__` enters a section: LINKGUARD_BUS__PORT)"
        )
    target: type[S] = cls
    if path is not None:
        _load_yaml(path)

        # mypy cannot type a class statement whose base is a type variable
        class _FromFile(cls):  # type: ignore[valid-type,misc]
            model_config = SettingsConfigDict(**{**cls.model_config, "yaml_file": str(path)})

        _FromFile.__name__ = cls.__name__
        target = _FromFile
    try:
        settings = target(**overrides)
    except ValidationError as exc:
        where = (
            f" (from {path}, LINKGUARD_* variables or options)"
            if path
            else (" (from LINKGUARD_* variables or options)")
        )
        details = "; ".join(_error_text(e) for e in exc.errors()[:5])
        raise ConfigError(f"bad {cls.__name__} value{where}: {details}") from None
    except Exception as exc:  # YAML syntax errors surface from the source as plain errors
        if "EnvSettingsSource" in str(exc):
            raise ConfigError(
                f"bad LINKGUARD_* environment value: {exc}; lists and sections are JSON, e.g. "
                """LINKGUARD_ENDPOINTS='["10.200.3.1","10.200.3.2"]'"""
            ) from None
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    _log_env_names(settings, other_role, unknown_other)
    return settings
