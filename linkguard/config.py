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
from typing import TYPE_CHECKING, Any, Literal, TypeVar

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

from linkguard.agent.monitor import DampingPolicy
from linkguard.models import MAX_MESSAGE_BYTES, LinkLayer
from linkguard.topology.backoff import BackoffPolicy

if TYPE_CHECKING:
    from linkguard.bus import TlsConfig

__all__ = [
    "AgentSettings",
    "ApiSettings",
    "BusSettings",
    "ConfigError",
    "GeneratorSettings",
    "LedgerSettings",
    "PortConfig",
    "ServiceSettings",
    "listen_address",
    "load_settings",
]


class ConfigError(ValueError):
    """A configuration value or file that cannot be used."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    """

    host: str = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535, description="8883 for the TLS listener of deploy/")
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
    reconnect_min_s: float = Field(0.2, gt=0)
    reconnect_max_s: float = Field(10.0, gt=0)
    max_message_bytes: int = Field(MAX_MESSAGE_BYTES, ge=1024)

    @model_validator(mode="after")
    def _tls_and_credentials(self) -> BusSettings:
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
        return {
            "host": self.host,
            "port": self.port,
            "username": self.username,
            "password": password,
            "tls": self.tls_config(),
            "keepalive_s": self.keepalive_s,
            "reconnect_min_s": self.reconnect_min_s,
            "reconnect_max_s": self.reconnect_max_s,
        }


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

    hca: str = Field(min_length=1, max_length=64)
    port: int = Field(1, ge=1, le=255)
    rail: int | None = Field(None, ge=0, le=63, description="None: by PCI address order")
    netdev: str | None = Field(None, max_length=15)
    address: ipaddress.IPv4Address | None = None
    link_layer: LinkLayer | None = None
    numa_node: int | None = None


class GeneratorSettings(_Section):
    """Rail-optimized fabric generator parameters (used when no fabric file is given)."""

    hosts: int = Field(32, ge=1, le=16384)
    rails: int = Field(8, ge=1, le=16)
    gpus_per_host: int | None = Field(None, ge=1, le=64)
    hosts_per_su: int = Field(32, ge=1, le=1024)


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


class _Base(BaseSettings):
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    bus: BusSettings = BusSettings()

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


class AgentSettings(_Base):
    """``linkguard agent``: one per GPU host."""

    model_config = SettingsConfigDict(
        env_prefix="LINKGUARD_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253)
    driver: Literal["sysfs", "netlink", "simulated"] = "sysfs"
    sysfs_root: Path = Path("/sys/class/infiniband")
    poll_interval_ms: float = Field(100.0, ge=5, le=60_000)
    netns: str | None = Field(
        None,
        description="network namespace of the netdevs and routes (labs); None = the agent's own",
    )
    ports: list[PortConfig] = Field(
        default_factory=list,
        description="empty: every HCA port found in sysfs, rails by PCI address order",
    )
    endpoints: list[ipaddress.IPv4Address] = Field(default_factory=list, max_length=64)
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
        from linkguard.topics import valid_segment

        if not valid_segment(v):
            raise ValueError(f"host {v!r}: use letters, digits, '.', '_' or '-'")
        return v

    route_table: int = Field(4242, ge=1, le=2**31 - 1, description="linkguard's own table")
    rule_priority: int = Field(1000, ge=1, le=32765)
    apply_routes: bool = True
    damping: DampingPolicy = DampingPolicy()
    state_dir: Path = Path("/var/lib/linkguard")
    rail_map_path: Path = Path("/run/linkguard/rail-map.json")
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
        env_prefix="LINKGUARD_", env_nested_delimiter="__", extra="forbid"
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


#: Environment variables with the LINKGUARD_ prefix that are not settings (test switches).
_NOT_SETTINGS = {"LINKGUARD_REQUIRE_REAL", "LINKGUARD_FIXTURES"}


def _unknown_env(cls: type[BaseSettings]) -> list[str]:
    """LINKGUARD_* variables that name no setting of the agent or the service (typos)."""
    known = set(AgentSettings.model_fields) | set(ServiceSettings.model_fields)
    bad = []
    for name in os.environ:
        if not name.startswith("LINKGUARD_") or name in _NOT_SETTINGS:
            continue
        field = name.removeprefix("LINKGUARD_").split("__", 1)[0].lower()
        if field not in known:
            bad.append(name)
    return sorted(bad)


def _load_yaml(path: Path) -> None:
    """Refuse what YamlConfigSettingsSource would misreport: not a file, not a mapping."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file")
    try:
        doc = yaml.safe_load(path.read_text())
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
    loc = ".".join(str(p) for p in e["loc"])
    return f"{loc}: {msg}" if loc else msg


def load_settings(cls: type[S], path: Path | None = None, **overrides: Any) -> S:
    """Build settings from ``path`` (YAML), the environment and ``overrides``.

    Raises :class:`ConfigError` for a missing/unreadable file, bad YAML, a bad value, or a
    ``LINKGUARD_*`` environment variable that names no setting.
    """
    unknown = _unknown_env(cls)
    if unknown:
        raise ConfigError(f"unknown setting(s) in the environment: {', '.join(unknown)}")
    target: type[S] = cls
    if path is not None:
        _load_yaml(path)

        class _FromFile(cls):  # type: ignore[valid-type,misc]
            model_config = SettingsConfigDict(**{**cls.model_config, "yaml_file": str(path)})

        _FromFile.__name__ = cls.__name__
        target = _FromFile
    try:
        return target(**overrides)
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
