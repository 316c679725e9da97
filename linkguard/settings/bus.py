"""How to reach the MQTT broker (``bus:`` of both roles): :class:`BusSettings`.

Consumes: the ``bus`` section. Produces: the broker addresses, TLS parameters and credentials
:class:`linkguard.bus.Bus` takes (:meth:`BusSettings.connection`). Raises
:class:`~linkguard.settings.base.ConfigError` for a password file that became unreadable.
"""

from __future__ import annotations

import os
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr, field_validator, model_validator

from linkguard.models import MAX_MESSAGE_BYTES
from linkguard.settings.base import ConfigError, Section

if TYPE_CHECKING:
    from linkguard.bus import TlsConfig

__all__ = ["BusSettings", "broker_address"]


class BusSettings(Section):
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
            broker_address(entry)
        if len(set(v)) != len(v):
            raise ValueError(f"a broker is listed twice: {v}")
        return v

    def broker_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of every broker to use, in order: ``brokers``, or ``host``/``port``."""
        if self.brokers:
            return [broker_address(b) for b in self.brokers]
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


def broker_address(entry: str) -> tuple[str, int]:
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
