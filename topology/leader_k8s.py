"""Leader election through a Kubernetes ``coordination.k8s.io/v1`` Lease.

The second backend of :class:`linkguard.topology.leader.Leadership` (the first is
:class:`~linkguard.topology.leader.EtcdLease`), selected by ``leader.kubernetes``
(:class:`~linkguard.config.KubernetesLeaderSettings`). It follows client-go's
``tools/leaderelection`` (``LeaseLock``) on the Lease's spec: ``holderIdentity``,
``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` (``MicroTime``: RFC 3339 with
microseconds, ``2006-01-02T15:04:05.000000Z07:00``), ``leaseTransitions``; every write is a PUT
carrying the ``metadata.resourceVersion`` it was decided on, so the API server refuses it with
409 Conflict when anyone wrote the Lease in between (optimistic concurrency), and a create is a
POST that fails with 409 AlreadyExists when another created it first.

The decision is pure (:func:`decide`: the Lease as read, or None, this instance's identity and
term, the wall time and how long the same record has been seen unchanged -> :class:`Create`,
:class:`Acquire`, :class:`Renew`, :class:`Wait` or :class:`Lost`); :class:`KubernetesLease`
does the I/O (plain HTTPS with ``httpx`` to the API server of the pod's cluster).

**The term** is the Lease's ``leaseTransitions`` as this instance wrote it when it took the
Lease. It is a valid fencing term on its own: every change of holder is a write that sets
``leaseTransitions`` to the previous value + 1, and the API server applies writes to one object
one at a time, each against the ``resourceVersion`` it was decided on; so two instances cannot
both take the Lease from the same record (one gets 409), and every new holder's term is higher
than every earlier holder's (provided every writer of the Lease follows this rule, as linkguard
and client-go do; the Role of deploy/k8s lets only the service write it). A renewal keeps it,
and so does a release (``holderIdentity`` cleared). Nothing else (resourceVersion, time) need be
combined with it: resourceVersion is opaque (not to be compared, says the API convention).
linkguard creates a Lease with ``leaseTransitions: 1`` (client-go starts at 0) because term 0
means "no election" on the bus; a Lease with 0 taken over becomes 1. *Deleting* the Lease
resets the counter: a later leader's term would be lower than what agents have stored, and
they would refuse its plans (``deposed_leader``) -- do not delete it (an etcd cluster whose data
is wiped has the same property).

**When another's Lease is taken**: only when it is released (``holderIdentity`` empty, as
client-go's ``ReleaseOnCancel`` and :meth:`KubernetesLease.resign` leave it), or when it has
expired by *both* clocks: its ``renewTime + leaseDurationSeconds`` is past by this host's wall
clock, *and* this instance has seen the same record (``resourceVersion``) unchanged for
``leaseDurationSeconds`` of its own monotonic clock (client-go's rule, which needs no clock
agreement at all: the holder's last renewal was sent before this instance read it). The wall
clock rule alone would let a host whose clock runs ahead take a live Lease early; the
observation rule alone is client-go's. Both together: clock skew can only delay a takeover
(by at most the skew), never cause two leaders.

**Stepping down** is EtcdLease's: the holder counts itself the leader until a local monotonic
deadline, the time its last successful write was *sent* plus ``ttl_s - ttl_s/4``, renews every
``ttl_s/3`` (a PUT against the resourceVersion of its own last write), and stops at once when a
renewal gets 409 Conflict and the Lease read back is not its own any more (another holder,
released, another ``leaseTransitions``, deleted), or when the deadline passes without a
successful renewal (API server unreachable, the process paused). A 409 after which the Lease is
still its own (a write that kept the spec, or its own renewal whose reply was lost) is not a
loss: it renews against the fresh resourceVersion. A standby counts ``ttl_s`` from when it
*read* that write, later than it was sent, so the holder stops first.

Numbers: a standby polls every ``min(2, ttl_s/4)`` s (client-go's RetryPeriod is 2 s); a dead
leader is replaced about ``ttl_s`` + one or two polls after its last renewal; a released Lease
at the next poll.

The Lease format and the pure decision (:func:`decide`) are :mod:`~linkguard.topology.k8slease`,
re-exported here; this module is the API client and the loop that executes the decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from linkguard.config import ConfigError, KubernetesLeaderSettings
from linkguard.topology.k8slease import (
    API_VERSION,
    Acquire,
    Create,
    LeaseFormatError,
    LeaseRecord,
    Lost,
    Renew,
    Wait,
    decide,
    format_micro_time,
    lease_body,
    parse_lease,
    parse_micro_time,
    release_spec,
)
from linkguard.topology.leaserenewal import keep_lease, stop_renewing

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "SERVICE_ACCOUNT",
    "Acquire",
    "ClusterAccess",
    "Create",
    "KubernetesLease",
    "LeaseFormatError",
    "LeaseRecord",
    "Lost",
    "Renew",
    "Wait",
    "decide",
    "format_micro_time",
    "in_cluster",
    "lease_body",
    "parse_lease",
    "parse_micro_time",
    "release_spec",
]

log = structlog.get_logger(__name__)

#: where the kubelet mounts a pod's service account (token, ca.crt, namespace)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


# -- times -------------------------------------------------------------------------------------


# -- the Lease as read ---------------------------------------------------------------------------


# -- the decision --------------------------------------------------------------------------------


# -- the pod's access to its API server ------------------------------------------------------


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach the API server: ``base_url`` (``https://host:port``), the CA bundle
    (None: the system's), the bearer token's file (re-read at every request: bound service
    account tokens are rotated by the kubelet, about hourly), the pod's namespace (None when
    the file is absent)."""

    base_url: str
    ca_file: Path | None
    token_file: Path | None
    namespace: str | None


def in_cluster(env: Mapping[str, str] | None = None, root: Path = SERVICE_ACCOUNT) -> ClusterAccess:
    """client-go's ``rest.InClusterConfig``: ``KUBERNETES_SERVICE_HOST`` and
    ``KUBERNETES_SERVICE_PORT`` (set in every pod), the token and ``ca.crt`` under ``root``,
    the namespace from ``root/namespace``. Raises :class:`~linkguard.config.ConfigError`
    naming what is missing (outside a pod, or ``automountServiceAccountToken: false``)."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError(
            "leader.kubernetes: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set "
            "(not running in a Kubernetes pod?)"
        )
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"leader.kubernetes: KUBERNETES_SERVICE_PORT {port!r} is not a port")
    token, ca = root / "token", root / "ca.crt"
    for f in (token, ca):
        if not f.is_file():
            raise ConfigError(
                f"leader.kubernetes: {f} is missing: the pod needs its service account token "
                "(automountServiceAccountToken: true)"
            )
    ns_file = root / "namespace"
    namespace = ns_file.read_text().strip() if ns_file.is_file() else None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return ClusterAccess(f"https://{host}:{int(port)}", ca, token, namespace or None)


class _ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:300]}")
        self.status = status


class KubernetesLease:
    """Leader through a Kubernetes Lease (see the module docstring). ``access``: the API
    server (:func:`in_cluster`; tests give a loopback stand-in with ``ca_file`` None and an
    ``http://`` URL); ``namespace``/``name``: the Lease; ``identity``: its
    ``holderIdentity``; ``ttl_s``: its ``leaseDurationSeconds`` (>= 2);
    ``api_timeout_s``: the bound on every request."""

    elected = True

    def __init__(
        self,
        *,
        access: ClusterAccess,
        namespace: str,
        name: str,
        identity: str,
        ttl_s: int = 15,
        api_timeout_s: float = 5.0,
    ) -> None:
        if ttl_s < 2:
            raise ValueError(f"kubernetes leader: ttl_s {ttl_s} < 2")
        if not identity:
            raise ValueError("kubernetes leader: empty identity")
        self.access = access
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.ttl_s = ttl_s
        self.api_timeout_s = api_timeout_s
        self.term: int | None = None
        self.lost = asyncio.Event()
        self.why_lost: str | None = None
        #: monotonic times this instance won and stopped leading (None: not yet)
        self.elected_at: float | None = None
        self.lost_at: float | None = None
        #: monotonic time after which this instance no longer counts itself the leader
        self.deadline = 0.0
        self.margin_s = ttl_s / 4
        self.poll_s = min(2.0, ttl_s / 4)
        self.held: dict[str, Any] | None = None  # the Lease as this instance last wrote it
        self._seen: tuple[str, float] | None = None  # (resourceVersion, first seen, monotonic)
        self._client: Any = None
        self._keeper: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(
        cls,
        settings: KubernetesLeaderSettings,
        *,
        fabric: str,
        identity: str,
        access: ClusterAccess | None = None,
    ) -> KubernetesLease:
        """The backend of ``leader.kubernetes``: the pod's access (:func:`in_cluster`) unless
        given; namespace defaults to the pod's, name to ``linkguard-<fabric>-leader``. Raises
        :class:`~linkguard.config.ConfigError` when either cannot be had."""
        access = access or in_cluster()
        namespace = settings.namespace or access.namespace
        if not namespace:
            raise ConfigError(
                "leader.kubernetes.namespace is not set and the pod's namespace file is missing"
            )
        name = settings.name or f"linkguard-{fabric}-leader"
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name) or len(name) > 253:
            raise ConfigError(
                f"leader.kubernetes: {name!r} (from the fabric's name) is not a valid Lease "
                "name; set leader.kubernetes.name"
            )
        return cls(
            access=access,
            namespace=namespace,
            name=name,
            identity=identity,
            ttl_s=settings.ttl_s,
            api_timeout_s=settings.api_timeout_s,
        )

    # -- HTTP ------------------------------------------------------------------------------
    @property
    def _path(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/leases"

    def _http(self) -> Any:
        if self._client is None:
            import httpx  # lazy: loaded only where leader.kubernetes is configured

            verify: Any = True
            if self.access.ca_file is not None:
                verify = ssl.create_default_context(cafile=str(self.access.ca_file))
            self._client = httpx.AsyncClient(
                base_url=self.access.base_url, verify=verify, timeout=self.api_timeout_s
            )
        return self._client

    def _headers(self) -> dict[str, str]:
        h = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.access.token_file is not None:
            h["Authorization"] = f"Bearer {self.access.token_file.read_text().strip()}"
        return h

    async def _request(self, method: str, url: str, body: Any = None) -> dict[str, Any] | None:
        """One request; the object returned (None on 404). Raises :class:`_ApiError` for
        any other non-2xx, httpx's errors for transport failures."""
        r = await self._http().request(method, url, json=body, headers=self._headers())
        if r.status_code == 404 and method == "GET":
            return None
        if not 200 <= r.status_code < 300:
            raise _ApiError(r.status_code, r.text)
        return r.json()

    async def _read(self) -> dict[str, Any] | None:
        return await self._request("GET", f"{self._path}/{self.name}")

    def _seen_for(self, lease: Mapping[str, Any] | None) -> float:
        rv = None
        if lease is not None:
            rv = (lease.get("metadata") or {}).get("resourceVersion")
        now = time.monotonic()
        if rv is None or self._seen is None or self._seen[0] != rv:
            self._seen = (rv, now) if rv is not None else None
            return 0.0
        return now - self._seen[1]

    # -- the interface ---------------------------------------------------------------------
    async def campaign(self) -> int:
        """Read the Lease every :attr:`poll_s` (sooner when :class:`Wait` says so) and take it
        when :func:`decide` says so; API errors and a malformed Lease are logged once per kind
        and retried."""
        said: set[str] = set()
        while True:
            delay = self.poll_s
            try:
                got = await self._try_once()
            except Exception as exc:
                kind = type(exc).__name__ + str(getattr(exc, "status", ""))
                if kind not in said:
                    said.add(kind)
                    log.warning(
                        "leader_kubernetes_error",
                        lease=f"{self.namespace}/{self.name}",
                        error=repr(exc)[:300],
                        action="retrying",
                    )
                got = None
            if isinstance(got, int):
                return got
            if isinstance(got, float):
                delay = max(0.01, min(delay, got))
            await asyncio.sleep(delay)

    async def _try_once(self) -> int | float | None:
        """One read and at most one write: the term when this instance won, the seconds to
        wait, or None (lost a race: read again)."""
        read = await self._read()
        action = decide(
            read,
            identity=self.identity,
            term=None,
            now=datetime.now(UTC),
            seen_for_s=self._seen_for(read),
            ttl_s=self.ttl_s,
        )
        if isinstance(action, Wait):
            return action.delay_s
        assert isinstance(action, Create | Acquire)
        body = lease_body(read, action.spec, namespace=self.namespace, name=self.name)
        sent = time.monotonic()
        try:
            if isinstance(action, Create):
                written = await self._request("POST", self._path, body)
            else:
                written = await self._request("PUT", f"{self._path}/{self.name}", body)
        except _ApiError as exc:
            if exc.status == 409:  # another created or took it first
                log.info("leader_race_lost", lease=f"{self.namespace}/{self.name}")
                return None
            raise
        self.held = written
        self.term = action.term
        self.elected_at = time.monotonic()
        self.deadline = sent + self.ttl_s - self.margin_s
        self._keeper = asyncio.create_task(self._keep(), name="leader-renew")
        log.info(
            "leader_elected",
            lease=f"{self.namespace}/{self.name}",
            term=self.term,
            ttl_s=self.ttl_s,
            previous=(parse_lease(read).holder if read is not None else None),
        )
        return self.term

    def is_leader(self) -> bool:
        return self.term is not None and not self.lost.is_set() and time.monotonic() < self.deadline

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.why_lost = why
            self.lost_at = time.monotonic()
            self.lost.set()
            log.error(
                "leadership_lost", term=self.term, lease=f"{self.namespace}/{self.name}", why=why
            )

    async def _keep(self) -> None:
        """Renew every ``ttl/3`` (against the resourceVersion of this instance's last write);
        step down on 409 Conflict, on a Lease not its own, or at the local deadline."""
        await keep_lease(
            self,
            self._renew_once,
            first_in_s=self.ttl_s / 3,
            granted_s=lambda: self.ttl_s,
            failed="leader_renew_failed",
            deadline_missed="no successful renewal before the local deadline",
        )

    async def _renew_once(self) -> str | None:
        """Renew: PUT this instance's last written Lease with a new renewTime, against its
        resourceVersion. None when it went through, else why this instance no longer leads.

        A 409 Conflict (someone wrote the Lease since) is settled by one GET and
        :func:`decide`: a Lease still this instance's (holder and term unchanged: a write that
        kept the spec, e.g. ``kubectl annotate``, or this instance's own renewal whose reply
        timed out) is renewed once more against the fresh resourceVersion; anything else (held
        by another, released, another term, deleted, malformed) is a loss, reported as
        ``409 Conflict on renewal: <why>``."""
        read: Mapping[str, Any] | None = self.held
        for attempt in range(2):
            try:
                action = decide(
                    read,
                    identity=self.identity,
                    term=self.term,
                    now=datetime.now(UTC),
                    seen_for_s=0.0,
                    ttl_s=self.ttl_s,
                )
            except LeaseFormatError as exc:
                action = Lost(f"malformed Lease: {exc}")
            if isinstance(action, Lost):
                return action.why if attempt == 0 else f"409 Conflict on renewal: {action.why}"
            assert isinstance(action, Renew)
            body = lease_body(read, action.spec, namespace=self.namespace, name=self.name)
            try:
                self.held = await self._request("PUT", f"{self._path}/{self.name}", body)
                return None
            except _ApiError as exc:
                if exc.status == 404:
                    return "the Lease was deleted"
                if exc.status != 409 or attempt:
                    raise
            read = await self._read()  # 409: what is there now?
        raise AssertionError("unreachable")

    async def resign(self) -> None:
        """Stop renewing and release the Lease as client-go's ``ReleaseOnCancel`` does (holder
        cleared, ``leaseTransitions`` kept: a standby takes it at its next poll); close the
        connection. The release is a PUT against this instance's last write's resourceVersion,
        so it clears only this instance's own record: also after a loss by the local deadline
        (nobody may have taken it yet; a standby need not wait out the TTL), and never a
        record another wrote since (409, ignored)."""
        await stop_renewing(self._keeper)
        leading = self.is_leader()
        self.lost.set()  # never steer again after resigning
        held, self.held = self.held, None
        if held is not None:
            try:
                spec = release_spec(held, datetime.now(UTC))
                body = lease_body(held, spec, namespace=self.namespace, name=self.name)
                async with asyncio.timeout(self.api_timeout_s):
                    await self._request("PUT", f"{self._path}/{self.name}", body)
                log.info(
                    "leader_resigned" if leading else "leader_lease_released",
                    term=self.term,
                    lease=f"{self.namespace}/{self.name}",
                )
            except Exception as exc:  # a 409: another took it meanwhile; else it expires
                if leading:
                    log.warning("leader_resign_failed", error=repr(exc)[:300])
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    def describe(self) -> dict[str, Any]:
        return {
            "role": "leader" if self.is_leader() else "standby",
            "term": self.term,
            "backend": "kubernetes",
            "key": f"{self.namespace}/{self.name}",
        }
