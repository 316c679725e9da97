"""The topology service's effect executors: how what its core decided reaches the bus.

Consumes: the core's effects and state (:class:`~linkguard.topology.core.ServiceCore`), the
``fabric/faults`` messages (assessed off the event loop). Produces: retained publishes on the
bus (plans and peer routes signed with ``signing_key``, :data:`PUBLISH_WINDOW` in flight; what
the broker did not take kept in ``unsent`` for the resender), ``service/status``,
``service/health``, ``service/audit``, deletions of stale plans and probe targets, and the
change feed's ``plans``, ``health`` and ``audit`` changes. Creates no task:
:mod:`linkguard.topology.service` (the wiring module) runs these coroutines in its tasks.

Retained plans and peer routes of hosts the fabric does not list are deleted after the startup
settle (:meth:`ServiceIO._clear_stale_plans`). Switch-level faults (``fabric/faults``,
:class:`~linkguard.models.FabricFaults`) are assessed in a worker thread and their health is kept
retained on ``service/health``; a refused set is replaced on ``fabric/faults`` by the set in
effect (:meth:`ServiceIO._refuse`). After a broker restart without persistence this service's
retained messages are put back (:meth:`ServiceIO._on_connect`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import structlog

from linkguard import __version__, topics
from linkguard.bus import BusSession
from linkguard.config import ConfigError, ServiceSettings
from linkguard.ledger import Ledger, LedgerError
from linkguard.models import (
    FabricFaults,
    PeerRoutes,
    Plan,
    ServiceStatus,
    encode,
)
from linkguard.settings.discoversection import FabricDiscovery
from linkguard.signing import Signer
from linkguard.topology.audit import audit, format_json
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.core import ServiceCore
from linkguard.topology.discover import Discovery
from linkguard.topology.effects import (
    AnnounceOnline,
    ClearRetained,
    ClearStalePlans,
    Effect,
    PublishConfirmed,
    PublishPlans,
    Reissue,
)
from linkguard.topology.fabric import Fabric, check_servable, generate_rail_optimized, load_fabric

if TYPE_CHECKING:
    from linkguard.topology.leader import Leadership

__all__ = ["PUBLISH_WINDOW", "ServiceIO", "fabric_from_settings"]

log = structlog.get_logger(__name__)

#: Plans published concurrently (QoS 1 acknowledgements awaited together).
PUBLISH_WINDOW = 256


def fabric_from_settings(settings: ServiceSettings) -> Fabric:
    """The fabric file, or the generator's fabric when ``generate`` is configured explicitly.

    Raises :class:`ConfigError` when neither is given (a service must never publish plans for
    a fabric nobody described) or the ``generate:`` parameters cannot be built (e.g.
    ``spines_per_su: 0`` with more than one SU), and :class:`FabricError` for a bad file or
    one that cannot give applicable plans (:func:`~linkguard.topology.fabric.serving_problems`)."""
    if isinstance(settings.fabric, FabricDiscovery):
        raise ConfigError(
            "fabric: {discover: ...}: the fabric is discovered at run time from the agents "
            "(linkguard.topology.discoverio), not read from settings"
        )
    if settings.fabric is not None:
        return check_servable(load_fabric(settings.fabric), settings.fabric)
    if settings.generate is None:
        raise ConfigError(
            "no fabric: give --fabric FILE (see `linkguard fabric generate`) or a generate: "
            "section in the config"
        )
    try:
        return generate_rail_optimized(**settings.generate.model_dump())
    except ValueError as exc:  # a combination the generator cannot build
        raise ConfigError(f"generate: {exc}") from None


_T = TypeVar("_T")


class _Delegate(Generic[_T]):
    """A read-only attribute of :class:`TopologyService` that is its core's (``get(core)``)."""

    def __init__(self, get: Callable[[ServiceCore], _T]) -> None:
        self._get = get

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Delegate[_T]: ...
    @overload
    def __get__(self, obj: ServiceIO, owner: type | None = None) -> _T: ...
    def __get__(self, obj: ServiceIO | None, owner: type | None = None) -> _Delegate[_T] | _T:
        return self if obj is None else self._get(obj.core)


class ServiceIO:
    """The executors of :class:`~linkguard.topology.service.TopologyService` (its base)."""

    settings: ServiceSettings
    signer: Signer | None
    fabric: Fabric
    core: ServiceCore
    changes: ChangeFeed
    leadership: Leadership
    bus: BusSession
    _audit_kick: asyncio.Event
    _resend_kick: asyncio.Event
    _won: asyncio.Event
    _reissuing: dict[str, asyncio.Task[None]]
    _started: float
    #: when the bus first connected (monotonic s): the start-up settle counts from it
    _first_connect: float | None
    ledger: Ledger | None
    #: with ``fabric: {discover: ...}`` and an expected fabric: the audit compares the two
    audit_expected: Fabric | None
    discovered: Discovery | None

    # the core's state under the names the service always had (other code and tests read them)
    state = _Delegate(lambda c: c.state)
    dropped = _Delegate(lambda c: c.dropped)
    budget_dropped = _Delegate(lambda c: c.budget.dropped)
    backoff = _Delegate(lambda c: c.schedule.backoff)
    solves = _Delegate(lambda c: c.schedule.solves)
    plans_published = _Delegate(lambda c: c.schedule.plans_published)
    plans_per_host = _Delegate(lambda c: c.schedule.plans_per_host)
    inventories = _Delegate(lambda c: c.inventories)
    strangers = _Delegate(lambda c: c.strangers)
    stale_plans = _Delegate(lambda c: c.stale_plans)
    stale_peers = _Delegate(lambda c: c.stale_peers)
    duplicate = _Delegate(lambda c: c.duplicate)
    probe_plan = _Delegate(lambda c: c.probes.plan)
    probe_plans = _Delegate(lambda c: c.probes.plans)
    probe_results = _Delegate(lambda c: c.probes.results)
    probe_reports = _Delegate(lambda c: c.probes.reports)
    probe_pairs_unanswerable = _Delegate(lambda c: c.probes.pairs_unanswerable)
    probe_inconclusive = _Delegate(lambda c: c.probes.inconclusive)
    localizer = _Delegate(lambda c: c.probes.localizer)
    faults = _Delegate(lambda c: c.switch_faults.faults)
    health_at = _Delegate(lambda c: c.switch_faults.health_at)
    refused = _Delegate(lambda c: c.switch_faults.refused)
    convergence = _Delegate(lambda c: c.convergence)
    #: online hosts whose agent drops every plan of this service (:mod:`.posture`)
    unprotected = _Delegate(lambda c: c.posture.unprotected)
    posture = _Delegate(lambda c: c.posture)

    @property
    def online_since(self) -> dict[str, float]:
        """Per host, since when (monotonic s) its agent has been online (the core's)."""
        return self.core.online_since

    @online_since.setter
    def online_since(self, value: dict[str, float]) -> None:
        self.core.online_since.clear()
        self.core.online_since.update(value)

    def __init__(self) -> None:
        #: plans and peer routes the broker did not take, by topic (see _publish_retained)
        self.unsent: dict[str, bytes] = {}
        #: the last ``service/health`` document published (None before the first)
        self.health_doc: dict[str, object] | None = None
        self._health_degraded: list[int] = []  # degraded_rails as last published
        self.audit_json: str | None = None
        #: the probe targets of the current epoch as published (put back on a reconnect: an
        #: agent without targets answers no probes)
        self._probe_targets_sent: list[tuple[str, bytes]] = []

    async def _execute(self, effects: list[Effect]) -> None:
        """Carry out the core's ``effects`` in order: the publishes here, the rest (no await:
        logs, changes, wake-ups, timers) by the wiring's :meth:`_execute_now`."""
        for e in effects:
            if isinstance(e, PublishPlans):
                await self._publish_plans(e)
            elif isinstance(e, ClearRetained):  # once: the next foreign message asks again
                for topic in e.topics:
                    await self.bus.publish(topic, b"", retain=True)
            elif isinstance(e, ClearStalePlans):
                await self._clear_stale_plans()
            elif isinstance(e, AnnounceOnline):
                await self._announce()
            elif isinstance(e, PublishConfirmed):
                msg = e.confirmed
                # QoS 0: no PUBACK to wait for in the receive loop (one per port event); a
                # confirmation lost with a connection comes back as the retained copy on the
                # agent's resubscribe, or again on its next replay
                topic = topics.events_confirmed(msg.host)
                await self.bus.publish(topic, encode(msg), retain=True, qos=0)
            else:
                self._execute_now([e])

    async def _reissue_at(self, e: Reissue) -> None:
        """Put this service's own message back at ``e.at`` (the ``reissue:<topic>`` task's
        body; the wiring starts it)."""
        try:
            delay = e.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._execute(self.core.reissue_due(e.kind, e.host, time.monotonic()))
        finally:
            self.core.integrity.reissue_done(e.topic)
            self._reissuing.pop(e.topic, None)

    def _execute_now(self, effects: list[Effect]) -> None:
        raise NotImplementedError  # the wiring's: it starts the reissue tasks

    def _status(self, *, online: bool) -> ServiceStatus:
        lead = self.leadership.describe() if online and self.leadership.elected else {}
        return ServiceStatus(
            online=online,
            at=time.time(),
            version=__version__,
            instance=self.core.me.instance,
            started_at=self.core.me.started_at,
            role=lead.get("role"),
            term=lead.get("term"),
        )

    async def _announce(self) -> None:
        await self.bus.publish(
            topics.service_status(), encode(self._status(online=True)), retain=True
        )

    def _seal(self, body: bytes) -> bytes:
        """``body`` as published: in a signed envelope with a signing key, else as it is.
        About 60 us per message (Ed25519): call on the worker thread that encodes."""
        return body if self.signer is None else self.signer.seal(body)

    def _sealed(self, msgs: Iterable[tuple[str, Plan | PeerRoutes]]) -> list[tuple[str, bytes]]:
        return [(topic, self._seal(encode(m))) for topic, m in msgs]

    async def _publish_plans(self, e: PublishPlans) -> None:
        """Encode and sign ``e``'s messages off the event loop, note them as sent, publish.
        A put-back (``reissue``) is published once; the rest as :meth:`_publish_retained`."""
        payloads = await asyncio.to_thread(self._sealed, e.messages)
        self.core.sent(payloads, time.monotonic())
        if e.why == "reissue":
            for topic, data in payloads:
                await self.bus.publish(topic, data, retain=True)
        else:
            await self._publish_retained(payloads)

    async def _solve_and_publish(self) -> None:
        t0 = time.monotonic()
        unusable = self.core.state.prepare()
        # The solver is pure and CPU-bound (the full build at start takes about 0.6 s at 2,048
        # hosts x 8 rails): run it, and the encoding, off the event loop so the bus keeps
        # serving; changes arriving meanwhile trigger another solve.
        fresh = await asyncio.to_thread(self.core.state.compute, unusable, now=time.time())
        solved, publish = self.core.schedule.commit(fresh)
        t1 = time.monotonic()
        payloads = await asyncio.to_thread(self._sealed, publish.messages)
        self.core.sent(payloads, time.monotonic())
        t2 = time.monotonic()
        await self._publish_retained(payloads)
        t3 = time.monotonic()
        ms = (round((t1 - t0) * 1000, 2), round((t2 - t1) * 1000, 2), round((t3 - t2) * 1000, 2))
        size = sum(len(d) for _, d in payloads)
        await self._execute(
            self.core.schedule.published(
                solved, unusable, now=t3, messages=len(payloads), size=size, timings_ms=ms
            )
        )

    async def _publish_retained(self, payloads: list[tuple[str, bytes]]) -> None:
        """Publish plans and peer routes (retained, QoS 1), :data:`PUBLISH_WINDOW` in flight
        (messages of different hosts are independent). One the broker did not take
        (disconnected, a PUBACK that never came) is kept in ``unsent`` and re-sent by
        :meth:`_resend` until it is taken or a newer message for its topic replaces it."""
        for i in range(0, len(payloads), PUBLISH_WINDOW):
            chunk = payloads[i : i + PUBLISH_WINDOW]
            done = await asyncio.gather(
                *(self.bus.publish(topic, data, retain=True) for topic, data in chunk)
            )
            for (topic, data), ok in zip(chunk, done, strict=True):
                if ok:
                    self.unsent.pop(topic, None)
                else:
                    self.unsent[topic] = data
        if self.unsent:
            self._resend_kick.set()

    async def _resender(self) -> None:
        """Re-send what :meth:`_publish_retained` could not publish, 1 s after the failure and
        then doubling up to 10 s, until all is taken (``plans_resent`` / ``plans_unsent``)."""
        while True:
            await self._resend_kick.wait()
            self._resend_kick.clear()
            delay = 1.0
            while self.unsent:
                await asyncio.sleep(delay)
                todo = list(self.unsent.items())
                done = await asyncio.gather(
                    *(self.bus.publish(t, d, retain=True) for t, d in todo[:PUBLISH_WINDOW])
                )
                sent = 0
                for (topic, data), ok in zip(todo, done, strict=False):
                    if ok and self.unsent.get(topic) is data:
                        del self.unsent[topic]
                        sent += 1
                if sent:
                    log.info("plans_resent", messages=sent, left=len(self.unsent))
                    delay = 1.0
                else:
                    log.warning("plans_unsent", messages=len(self.unsent), retry_in_s=delay)
                    delay = min(10.0, delay * 2)

    async def _on_connect(self) -> None:
        state = self.core.state
        if not self.leadership.is_leader():  # a standby: nothing of its own to put back
            if state.health is None:
                nominal = FabricFaults(at=time.time())
                state.on_health(await asyncio.to_thread(state.assess_faults, nominal))
            await self._publish_health()  # kept as health_doc (the API's), not published
            return
        await self._announce()
        # After a broker restart without persistence the retained plans are gone: put them back
        # (same epochs, so agents that applied them ignore them). Encoded and signed off the
        # event loop; one a solve replaced meanwhile is skipped (the solve published it)
        msgs: list[tuple[str, Plan | PeerRoutes, Mapping[str, Plan | PeerRoutes]]] = [
            (topics.peer_routes(h), p, state.peers) for h, p in list(state.peers.items())
        ]
        msgs += [(topics.plan(h), p, state.published) for h, p in list(state.published.items())]
        sealed = await asyncio.to_thread(self._sealed, [(t, m) for t, m, _ in msgs])
        payloads = [
            (topic, data)
            for (_, m, now), (topic, data) in zip(msgs, sealed, strict=True)
            if now.get(m.host) is m
        ]
        self.core.sent(payloads, time.monotonic())
        await self._publish_retained(payloads)
        if self._probe_targets_sent:  # the same for the probe targets of this epoch
            await self._publish_retained(list(self._probe_targets_sent))
        if self.audit_json is not None:
            await self.bus.publish(topics.service_audit(), self.audit_json.encode(), retain=True)
        if self.faults is not None:
            # the broker lost the retained set with the outage: put the set in effect back, or
            # a restarted service would route onto a leaf that is still cut off
            await self.bus.publish(topics.fabric_faults(), encode(self.faults), retain=True)
        if state.health is None:  # the nominal health, until faults arrive
            nominal = FabricFaults(at=time.time())
            state.on_health(await asyncio.to_thread(state.assess_faults, nominal))
            self.core.switch_faults.health_at = time.time()
        await self._publish_health()

    def _degraded_rails(self) -> list[int]:
        """The rails the solver treats as degraded now (none before its first solve)."""
        solver = self.core.state.solver
        return sorted(solver.degraded) if solver is not None else []

    async def _publish_health(self) -> None:
        """``service/health`` (the document :mod:`linkguard.topics` describes): the health
        summary, the degraded rails, ``at``, the faults it reflects and the last refusal."""
        health = self.core.state.health
        if health is None:
            return
        self._health_degraded = self._degraded_rails()
        doc = {
            **health.summary(),
            "degraded_rails": self._health_degraded,
            "at": self.health_at,
            "faults": self.faults.model_dump(mode="json") if self.faults else None,
            "refused": self.refused,
        }
        if self.leadership.elected:  # {"role", "term", "backend", "key"}
            doc["leader"] = self.leadership.describe()
        self.health_doc = doc
        await self.bus.publish(topics.service_health(), json.dumps(doc).encode(), retain=True)
        self.changes.emit("health", doc)

    async def _clear_probe_targets(self, hosts: list[str], why: str) -> None:
        """Delete the retained ``probes/<host>`` of ``hosts`` (targets an earlier run published
        outlive it, and an agent keeps probing them until told otherwise). Logged as
        ``probe_targets_cleared``. Never by a service that found another one running."""
        if not hosts or self.core.duplicate is not None:
            return
        await self._publish_retained([(topics.probe_targets(h), b"") for h in hosts])
        log.info("probe_targets_cleared", hosts=len(hosts), why=why)

    async def _clear_stale_plans(self) -> None:
        """Delete the retained plans of hosts the fabric does not list (a zero-length retained
        publish on ``plans/<host>``, logged as ``stale_plan_cleared``: host, epoch). Never by
        a service that found another one running. A publish that fails leaves the plan
        retained: it comes back on the next connection and is cleared then. Stale peer routes
        go the same way (``stale_peers_cleared``); with a signing key, the ones this service's
        key signed are first replaced by signed empty ones."""
        core = self.core
        if core.duplicate is not None:
            return
        if self.signer is not None and core.stale_peer_routes:
            emptied = core.emptied_stale_peers(time.time())
            sealed = await asyncio.to_thread(
                self._sealed, [(topics.peer_routes(h), p) for h, p in emptied.items()]
            )
            core.sent(sealed, time.monotonic())
            for i in range(0, len(sealed), PUBLISH_WINDOW):
                await asyncio.gather(
                    *(
                        self.bus.publish(t, d, retain=True)
                        for t, d in sealed[i : i + PUBLISH_WINDOW]
                    )
                )
        await self._clear_stale_hosts()
        for event, stale, topic in (
            ("stale_plan_cleared", core.stale_plans, topics.plan),
            ("stale_peers_cleared", core.stale_peers, topics.peer_routes),
        ):
            hosts = sorted(stale)
            for i in range(0, len(hosts), PUBLISH_WINDOW):
                chunk = hosts[i : i + PUBLISH_WINDOW]
                done = await asyncio.gather(
                    *(self.bus.publish(topic(h), b"", retain=True) for h in chunk)
                )
                for host, ok in zip(chunk, done, strict=True):
                    epoch = stale.pop(host, None)
                    if ok:
                        log.info(
                            event,
                            host=host,
                            epoch=epoch,
                            fabric=self.fabric.name,
                            why="host not in the fabric",
                        )

    async def _clear_stale_hosts(self) -> None:
        """Delete the retained messages (status, inventory, port states, ack, probe reports) of
        hosts the fabric does not list, whose agent is not online (an online one is a
        misconfigured agent the audit reports: its messages stay); logged per host as
        ``stale_host_cleared`` (host, topics). A failed publish leaves that topic for the next
        connection."""
        for host, noted in self.core.take_stale_hosts().items():
            done: list[bool] = []
            for i in range(0, len(noted), PUBLISH_WINDOW):
                done += await asyncio.gather(
                    *(self.bus.publish(t, b"", retain=True) for t in noted[i : i + PUBLISH_WINDOW])
                )
            log.info(
                "stale_host_cleared",
                host=host,
                topics=sum(done),
                fabric=self.fabric.name,
                why="host not in the fabric",
            )

    async def _auditor(self, debounce_s: float = 1.0) -> None:
        """Keep the fleet audit of the agents online retained on ``service/audit``: published
        after the startup settle, then recomputed (off the event loop) a second after
        inventories or host statuses change. A host counts as reported only while its agent
        is online."""
        await self.bus.connected.wait()
        await self._settle()
        await self._won.wait()  # a standby publishes no audit
        core = self.core
        while True:
            self._audit_kick.clear()
            online = {h for h, up in core.state.online.items() if up}
            inventories = {h: inv for h, inv in core.inventories.items() if h in online}
            # on a discovered fabric with an expected one: what contradicts it, as found
            expected = self.audit_expected
            found = self.discovered if expected is not None else None
            findings = await asyncio.to_thread(
                audit,
                expected if expected is not None else self.fabric,
                observed=found.fabric if found is not None else None,
                observed_guids=found.guids if found is not None else None,
                inventories=inventories,
                reported_hosts=online | core.strangers,
            )
            doc = format_json(findings)
            if doc != self.audit_json and core.duplicate is None:  # not the other's audit
                self.audit_json = doc
                await self.bus.publish(topics.service_audit(), doc.encode(), retain=True)
                self.changes.emit("audit", json.loads(doc))
                log.info(
                    "fleet_audit",
                    findings=len(findings),
                    errors=sum(f.severity == "error" for f in findings),
                )
            await self._audit_kick.wait()
            await asyncio.sleep(debounce_s)

    async def _settle(self) -> None:
        """Wait out what is left of ``startup_settle_s`` counted from the first connect to the
        broker (retained states, plans, statuses and inventories arrive meanwhile): a broker
        that was away at start must not shorten it (issue 21: the first solve went out before
        the retained states had arrived). The callers await ``bus.connected`` first."""
        if self._first_connect is None:
            self._first_connect = time.monotonic()
        settle = self.settings.startup_settle_s - (time.monotonic() - self._first_connect)
        if settle > 0:
            await asyncio.sleep(settle)

    def _open_ledger(self) -> Ledger | None:
        """The ledger of ``settings.ledger`` with a service run started and subscribed to
        :attr:`changes` (its writer thread commits; closed when :meth:`run` ends), or None
        without a path. Raises :class:`ConfigError` for a file that cannot be a ledger."""
        cfg = self.settings.ledger
        if cfg.path is None:
            return None
        try:
            ledger = Ledger(
                cfg.path, retention_days=cfg.retention_days, incident_window_s=cfg.incident_window_s
            )
        except LedgerError as exc:
            raise ConfigError(f"ledger: {exc}") from None
        ledger.start_run(self.fabric, source="service")
        self.changes.subscribe(ledger.consumer())
        log.info("ledger_open", path=str(cfg.path), retention_days=cfg.retention_days)
        return ledger
