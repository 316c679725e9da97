"""Who may steer the fabric: leader election for the topology service.

Consumes: the ``leader`` settings (:class:`~linkguard.config.LeaderSettings`). Produces: a
*term* (an integer that only grows from one leader to the next; 0 with no election) once this
process leads, an event when it no longer does, and :meth:`Leadership.is_leader`, the fence
the service checks before every publish.

Backends, one interface (:class:`Leadership`):

* :class:`SoleLeader`: no election, term 0, always the leader (one service per fabric, as
  before; presence on the bus, :mod:`linkguard.presence`, catches a second one).
* :class:`EtcdLease`: a lease with a TTL in etcd (v3 API through the ``aetcd`` asyncio gRPC
  client) and a key (default ``/linkguard/<fabric>/leader``) created in a transaction only
  when absent, attached to that lease. The term is the revision at which this instance won (the
  key's ``create_revision``: etcd's revisions only grow, so a later winner's term is higher).
  The lease is kept alive every ``ttl/3``; leadership ends when a keepalive says the lease is
  gone, when the key is no longer the one this instance created, or when the *local* deadline
  passes: the time the last successful keepalive was *sent* (monotonic clock) plus the granted
  TTL minus a margin of ``ttl/4``. The server counts its TTL from when it *received* that
  keepalive, so this process stops steering before the lease can expire on the server and
  before anyone else can win the key (a process that was paused, SIGSTOP or a long GC,
  finds its deadline passed the moment it runs again).
* :class:`~linkguard.topology.leader_k8s.KubernetesLease`: a Kubernetes
  ``coordination.k8s.io/v1`` Lease (client-go's leaderelection semantics; the term: the
  Lease's ``leaseTransitions`` as this instance wrote it when it took the Lease); see
  :mod:`linkguard.topology.leader_k8s`.

The etcd backend's numbers: etcd 3.4 grants at least about 2 s whatever is asked
(``minTTL``: 1.5 x the election timeout), so ``ttl_s`` >= 2; a standby polls the key every
``min(0.5, ttl/4)`` s, so a takeover after the leader dies takes at most about
``ttl_s + 0.5 s`` (plus the service's startup settle when the standby had not settled yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol

import structlog

from linkguard.config import ConfigError, EtcdLeaderSettings, LeaderSettings
from linkguard.presence import DuplicateInstanceError
from linkguard.topology.leader_k8s import KubernetesLease
from linkguard.topology.leaserenewal import keep_lease, stop_renewing

__all__ = [
    "EtcdLease",
    "FencedBus",
    "Leadership",
    "LeadershipLostError",
    "SoleLeader",
    "keep_lease",
    "leadership_from_settings",
]

log = structlog.get_logger(__name__)


class LeadershipLostError(DuplicateInstanceError):
    """This topology service held the leader lease and lost it (another took over, etcd
    unreachable for longer than the lease allows); it stopped publishing and exits so that its
    supervisor restarts it as a standby. The CLI exits 1 (see ``linkguard topology serve``)."""


class Leadership(Protocol):
    """One backend of the election. ``term`` (None until :meth:`campaign` returns) only grows
    from one leader to the next; ``lost`` is set, once, when this instance stops leading."""

    term: int | None
    lost: asyncio.Event
    #: False for :class:`SoleLeader` (no election: the bus presence check applies instead)
    elected: bool

    async def campaign(self) -> int:
        """Wait until this instance leads; return its term."""
        ...

    def is_leader(self) -> bool:
        """True while this instance leads: checked (no I/O) before every publish."""
        ...

    async def resign(self) -> None:
        """Give up leadership (another may take over at once) and release resources."""
        ...

    def describe(self) -> dict[str, Any]:
        """``{"role": "leader"|"standby", "term": int|None, "backend": str}``."""
        ...


class SoleLeader:
    """No election: term 0, leader from the start, never loses it (the default)."""

    elected = False

    def __init__(self) -> None:
        self.term: int | None = 0
        self.lost = asyncio.Event()

    async def campaign(self) -> int:
        return 0

    def is_leader(self) -> bool:
        return True

    async def resign(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"role": "leader", "term": 0, "backend": "none"}


class EtcdLease:
    """Leader through an etcd lease (see the module docstring). ``endpoints``: ``(host,
    port)`` of etcd's client URLs, tried in turn; ``identity``: the key's value (this
    instance, for ``etcdctl get``); ``rpc_timeout_s``: the bound on every RPC."""

    elected = True

    def __init__(
        self,
        *,
        endpoints: list[tuple[str, int]],
        key: str,
        ttl_s: int,
        identity: str,
        rpc_timeout_s: float = 2.0,
    ) -> None:
        if not endpoints:
            raise ValueError("etcd leader: no endpoints")
        if ttl_s < 2:
            raise ValueError(f"etcd leader: ttl_s {ttl_s} < 2 (etcd's minimum lease TTL)")
        self.endpoints = list(endpoints)
        self.key = key.encode()
        self.ttl_s = ttl_s
        self.identity = identity.encode()
        self.rpc_timeout_s = rpc_timeout_s
        self.term: int | None = None
        self.lost = asyncio.Event()
        self.lease_id: int | None = None
        #: monotonic time after which this instance no longer counts itself the leader
        self.deadline = 0.0
        self.margin_s = ttl_s / 4
        self.poll_s = min(0.5, ttl_s / 4)
        self._client: Any = None
        self._next = 0  # the endpoint to try next
        self._keeper: asyncio.Task[None] | None = None
        self.why_lost: str | None = None

    # -- connection ----------------------------------------------------------------------------
    async def _connect(self) -> Any:
        if self._client is None:
            import aetcd  # imported where etcd is configured only

            host, port = self.endpoints[self._next % len(self.endpoints)]
            self._client = aetcd.Client(host=host, port=port, timeout=self.rpc_timeout_s)
            async with asyncio.timeout(self.rpc_timeout_s):
                await self._client.connect()
        return self._client

    async def _drop_client(self) -> None:
        """Forget the connection after a failure; the next call tries the next endpoint."""
        client, self._client = self._client, None
        self._next += 1
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.rpc_timeout_s):
                    await client.close()

    async def _call(self, fn: str, *args: Any, **kw: Any) -> Any:
        client = await self._connect()
        async with asyncio.timeout(self.rpc_timeout_s):
            return await getattr(client, fn)(*args, **kw)

    # -- the interface -------------------------------------------------------------------------
    async def campaign(self) -> int:
        """Poll the key every :attr:`poll_s`; when it is absent, grant a lease and create the
        key in a transaction (``create_revision == 0``). etcd errors are logged (once per
        kind) and retried on the next endpoint."""
        said: set[str] = set()
        while True:
            try:
                term = await self._try_once()
            except Exception as exc:  # gRPC errors, timeouts: etcd unreachable
                kind = type(exc).__name__
                if kind not in said:
                    said.add(kind)
                    log.warning(
                        "leader_etcd_unreachable",
                        endpoints=[f"{h}:{p}" for h, p in self.endpoints],
                        error=repr(exc)[:300],
                        action="retrying",
                    )
                await self._drop_client()
                term = None
            if term is not None:
                return term
            await asyncio.sleep(self.poll_s)

    async def _try_once(self) -> int | None:
        got = await self._call("get", self.key)
        if got is not None:
            return None  # another instance leads
        sent = time.monotonic()
        lease = await self._call("lease", self.ttl_s)
        client = await self._connect()
        tx = client.transactions
        won, responses = await self._call(
            "transaction",
            compare=[tx.create(self.key) == 0],
            success=[tx.put(self.key, self.identity, lease=lease)],
            failure=[],
        )
        if not won:
            with contextlib.suppress(Exception):
                await self._call("revoke_lease", lease.id)
            return None
        self.lease_id = lease.id
        self.term = int(responses[0].response_put.header.revision)
        self._granted = lease.ttl
        self.deadline = sent + lease.ttl - self.margin_s
        self._keeper = asyncio.create_task(self._keep(), name="leader-keepalive")
        log.info(
            "leader_elected",
            key=self.key.decode(),
            term=self.term,
            lease=f"{lease.id:x}",
            ttl_s=lease.ttl,
        )
        return self.term

    def is_leader(self) -> bool:
        return self.term is not None and not self.lost.is_set() and time.monotonic() < self.deadline

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.why_lost = why
            self.lost.set()
            log.error("leadership_lost", term=self.term, key=self.key.decode(), why=why)

    async def _keep(self) -> None:
        """Keep the lease alive every ``ttl/3`` and check the key is still this term's; lose
        leadership at the local deadline when no keepalive succeeded in time."""
        await keep_lease(
            self,
            self._keepalive_and_check,
            first_in_s=0.0,
            granted_s=lambda: self._granted,
            failed="leader_keepalive_failed",
            deadline_missed="no successful keepalive before the local deadline",
            on_error=self._drop_client,
        )

    async def _keepalive_and_check(self) -> str | None:
        """One keepalive, then a read of the key: None when both say this instance still
        leads, else why not."""
        reply = await self._call("refresh_lease", self.lease_id)
        ttl = int(getattr(reply, "TTL", 0) or 0)
        if ttl <= 0:
            return "the lease expired on the etcd server"
        self._granted = ttl
        got = await self._call("get", self.key)
        if got is None or int(got.create_revision) != self.term:
            return "the leader key is gone or belongs to another term"
        return None

    _granted: int = 0

    async def resign(self) -> None:
        """Stop the keepalive, revoke the lease (the key goes with it: a standby takes over
        at its next poll), close the connection."""
        await stop_renewing(self._keeper)
        if self.lease_id is not None:
            leading = not self.lost.is_set()
            self.lost.set()  # never steer again after resigning
            # revoked even after a loss by the local deadline: the lease may still live on the
            # server (only this instance's key goes with it), and a standby need not wait
            try:
                await self._call("revoke_lease", self.lease_id)
                if leading:
                    log.info("leader_resigned", term=self.term, key=self.key.decode())
            except Exception as exc:
                if leading:
                    log.warning("leader_resign_failed", error=repr(exc)[:300])
        await self._drop_client()

    def describe(self) -> dict[str, Any]:
        return {
            "role": "leader" if self.is_leader() else "standby",
            "term": self.term,
            "backend": "etcd",
            "key": self.key.decode(),
        }


def leadership_from_settings(settings: LeaderSettings, *, fabric: str, identity: str) -> Any:
    """The backend ``settings`` configure: :class:`EtcdLease` with an ``etcd`` section (key
    defaults to ``/linkguard/<fabric>/leader``), a ``KubernetesLease`` with a ``kubernetes``
    section (its own errors: ``KubernetesLease.from_settings``), else :class:`SoleLeader`. Raises
    :class:`~linkguard.config.ConfigError` when etcd is configured but its client library
    (``aetcd``) is not installed."""
    etcd: EtcdLeaderSettings | None = settings.etcd
    if settings.kubernetes is not None:  # a Lease object (linkguard.topology.leader_k8s)
        return KubernetesLease.from_settings(settings.kubernetes, fabric=fabric, identity=identity)
    if etcd is None:
        return SoleLeader()
    try:
        import aetcd  # noqa: F401  # lazy: is the optional etcd client installed?
    except ImportError as exc:
        raise ConfigError(
            f"leader.etcd is configured but its client library is missing ({exc}): "
            "pip install 'aetcd>=1.0.0,<2'"
        ) from None
    return EtcdLease(
        endpoints=etcd.addresses(),
        key=etcd.key or f"/linkguard/{fabric}/leader",
        ttl_s=etcd.ttl_s,
        identity=identity,
        rpc_timeout_s=etcd.rpc_timeout_s,
    )


class FencedBus:
    """The service's bus with every publish behind the leadership fence: while
    ``leadership.is_leader()`` is false a publish is withheld (counted in :attr:`withheld`,
    returns False as a publish without a connection does). Everything else is the bus's."""

    def __init__(self, bus: Any, leadership: Leadership) -> None:
        self._bus = bus
        self._leadership = leadership
        self.withheld = 0

    async def publish(self, topic: str, payload: bytes, **kw: Any) -> bool:
        if not self._leadership.is_leader():
            self.withheld += 1
            log.debug("publish_withheld", topic=topic, reason="not the leader")
            return False
        return await self._bus.publish(topic, payload, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)
