"""The topology service's wiring module.

Tasks: ``bus`` (subscribes to every host topic, to retained plans and peer routes, to
``fabric/faults`` and to ``service/health``, for the faults a previous instance accepted) and
``solver`` (waits for a state change, waits as the RFC 8405 back-off says
(:mod:`linkguard.topology.backoff`: ``solve_initial_delay_ms`` after a quiet period, then
``debounce_ms`` batches, then ``solve_long_delay_ms`` while changes keep coming), solves,
publishes the changed full plans, the changed peer routes, then the changed compact plans,
retained with a new epoch),
``auditor`` (the fleet audit, retained on ``service/audit``) and, when ``api.enabled``,
``api`` (the HTTP API and dashboard, :mod:`linkguard.topology.api`, bound before the bus
connects).
Retained plans and peer routes of hosts the fabric does not list (the fleet shrank, or a
service ran on another fabric) are deleted from the broker after the startup settle
(:meth:`TopologyService._clear_stale_plans`). Switch-level faults (``fabric/faults``,
:class:`~linkguard.models.FabricFaults`) are assessed off the event loop and their health is
kept retained on ``service/health``; a refused set is replaced on ``fabric/faults`` by the set
in effect (:meth:`TopologyService._refuse`). Bad messages are logged with their topic and
reason, counted, and dropped; they never reach the fabric state.

With ``signing_key`` every plan and peer routes message is published in a signed envelope
(agents verify it: :mod:`linkguard.signing`), sealed on the worker thread that encodes it.
Retained plans and peer routes read back at start are verified with the service's own key: one
that fails (unsigned, another key, tampered) is not taken as what is on the bus, and the first
solve publishes this service's own in its place. Afterwards any message on those topics that is
not one this service just published (another client's: forged, replayed, a deletion) is
answered by publishing its own again (:meth:`TopologyService._check_live`), so the broker does
not keep handing the other one to agents that connect.

With ``leader.etcd`` or ``leader.kubernetes`` several services run for one fabric (task ``leader``,
:mod:`linkguard.topology.leader`): each connects and reads the bus (a warm standby: the leader's
live plans count as what is on the bus), every publish passes the leadership fence, and only
the lease holder solves and publishes, stamping its term on every plan and peer routes message
(its first solve re-issues every host's of another term). A leader that loses the lease stops
publishing at once and :meth:`TopologyService.run` raises
:class:`~linkguard.topology.leader.LeadershipLostError` (exit 1: its supervisor restarts it as a
standby); a clean stop revokes the lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import signal
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import structlog
from pydantic import BaseModel

from linkguard import __version__, topics
from linkguard.bus import Bus, BusMessage, BusSession, Will
from linkguard.config import ConfigError, ServiceSettings
from linkguard.ledger import Ledger, LedgerError
from linkguard.models import (
    Ack,
    AckResult,
    BadMessage,
    FabricFaults,
    HostInventory,
    HostStatus,
    PeerRoutes,
    Plan,
    PortEvent,
    PortState,
    PortStatus,
    ProbePeer,
    ProbeRail,
    ProbeReport,
    ProbeTargets,
    ServiceStatus,
    decode,
    encode,
)
from linkguard.presence import DuplicateInstanceError, Me, Verdict, judge
from linkguard.signing import SignatureError, Signer, unwrap
from linkguard.topology.audit import audit, format_json, inventory_problems
from linkguard.topology.backoff import SolveBackoff
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.fabric import (
    Fabric,
    check_servable,
    generate_rail_optimized,
    load_fabric,
)
from linkguard.topology.health import Health
from linkguard.topology.leader import FencedBus, LeadershipLostError, leadership_from_settings
from linkguard.topology.localize import Localizer, LocalizeSettings, PairResult
from linkguard.topology.localize import Verdict as ProbeVerdict
from linkguard.topology.probeplan import PortId, ProbePlan, ProbeSettings, plan_probes
from linkguard.topology.state import FabricState

if TYPE_CHECKING:
    from linkguard.topology.api import ApiServer

__all__ = ["TopologyService", "fabric_from_settings", "run_service"]

log = structlog.get_logger(__name__)

#: Plans published concurrently (QoS 1 acknowledgements awaited together).
PUBLISH_WINDOW = 256
#: With a signing key, digests of this many last payloads per plan / peer routes topic are
#: kept to recognise the service's own messages coming back (a few may be in flight at once)...
SENT_KEPT = 4
#: ... for this long (s) after they were published; the last one for good. An older payload
#: of this service's arriving later is a replay.
ECHO_WINDOW_S = 10.0
#: A foreign message on a plan or peer routes topic is answered with the service's own at most
#: this often per topic (s).
REISSUE_INTERVAL_S = 1.0
#: A host's refused probe reports or pairs (``unassigned_probe_pair``, ``stale_probe_epoch``,
#: ``unknown_probe_port``) are logged at most once per host and reason this often (s); every
#: one is counted in ``dropped``.
PROBE_DROP_LOG_S = 60.0

_DECODERS: dict[str, type[BaseModel]] = {
    "port": PortState,
    "status": HostStatus,
    "ack": Ack,
    "plan": Plan,
    "peers": PeerRoutes,
    "inventory": HostInventory,
    "service_status": ServiceStatus,
    "fabric_faults": FabricFaults,
    "events": PortEvent,
    "probes": ProbeReport,
}


def fabric_from_settings(settings: ServiceSettings) -> Fabric:
    """The fabric file, or the generator's fabric when ``generate`` is configured explicitly.

    Raises :class:`ConfigError` when neither is given (a service must never publish plans for
    a fabric nobody described) or the ``generate:`` parameters cannot be built (e.g.
    ``spines_per_su: 0`` with more than one SU), and :class:`FabricError` for a bad file or
    one that cannot give applicable plans (:func:`~linkguard.topology.fabric.serving_problems`)."""
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


class TopologyService:
    """``await service.run()`` until cancelled or :meth:`stop`."""

    def __init__(
        self,
        settings: ServiceSettings,
        *,
        fabric: Fabric | None = None,
        bus_factory: Callable[..., BusSession] = Bus,
    ) -> None:
        """``bus_factory`` makes the bus session (takes :class:`~linkguard.bus.Bus`'s keyword
        arguments); simulations pass an in-memory bus."""
        self.settings = settings
        #: signs plans and peer routes (``signing_key``; None: published unsigned). Raises
        #: KeyFileError (a ConfigError) for a key file that cannot be used, e.g. mode 0644
        self.signer: Signer | None = (
            Signer.from_file(settings.signing_key) if settings.signing_key is not None else None
        )
        self.fabric = fabric if fabric is not None else fabric_from_settings(settings)
        self.state = FabricState(fabric=self.fabric, epoch_start=int(time.time() * 1000))
        self.dropped: Counter[str] = Counter()
        #: every accepted change, for the ledger, the API's stream and the dashboard
        self.changes = ChangeFeed()
        #: per port key, what the last ``port`` change showed (see :func:`_shown`)
        self._shown: dict[tuple[str, str, int], tuple[object, ...]] = {}
        #: the interruption ledger (``ledger.path``; None: none kept): records every change
        self.ledger: Ledger | None = self._open_ledger()
        self.solves = 0
        self.plans_published = 0
        self.plans_per_host: Counter[str] = Counter()
        #: hosts the last publish waits for an applied ack from; (epoch, hosts, publish time)
        self._awaiting: set[str] = set()
        self._awaited: tuple[int, int, float] = (0, 0, 0.0)
        self.inventories: dict[str, HostInventory] = {}
        #: hosts the fabric does not list whose agent says it is online (``unknown_host``)
        self.strangers: set[str] = set()
        self.audit_json: str | None = None
        #: retained plans of hosts the fabric does not list: host -> epoch (None: unreadable),
        #: until :meth:`_clear_stale_plans` deletes them
        self.stale_plans: dict[str, int | None] = {}
        #: the same for retained peer routes (``peers/<host>``)
        self.stale_peers: dict[str, int | None] = {}
        #: those of :attr:`stale_peers` signed by this service's key: emptied (signed) before
        #: they are deleted, since agents that verify cannot take an unsigned deletion
        self._stale_peer_routes: dict[str, PeerRoutes] = {}
        #: with a signing key: digests of the last payloads this service published on each
        #: plan and peer routes topic, to tell its own coming back from another client's
        self._sent: dict[str, deque[tuple[bytes, float]]] = {}
        #: topics whose own message is put back later (:meth:`_foreign`), and when each was
        #: last put back (monotonic s)
        self._reissuing: dict[str, asyncio.Task[None]] = {}
        self._reissued: dict[str, float] = {}
        self._settled = False  # the startup settle is over (see _solver)
        #: the last accepted switch-level faults and when their health was assessed
        self.faults: FabricFaults | None = None
        self.health_at: float | None = None
        #: the last ``service/health`` document published (None before the first)
        self.health_doc: dict[str, object] | None = None
        #: the HTTP API's server and bound port while it is served (``api`` settings)
        self.api: ApiServer | None = None
        self.api_port: int | None = None
        #: ``service/health``'s ``refused``: the last ``fabric/faults`` message refused, None
        #: once a set is accepted
        self.refused: dict[str, object] | None = None
        #: the faults of the retained ``service/health`` found on connecting (a previous
        #: instance's): what :meth:`_refuse` puts back before this instance accepted any
        self.inherited_faults: FabricFaults | None = None
        self._health_degraded: list[int] = []  # degraded_rails as last published
        self._audit_kick = asyncio.Event()
        self._offline_kick = asyncio.Event()  # a host status arrived (see _route_around)
        #: plans and peer routes the broker did not take, by topic (see _publish_retained)
        self.unsent: dict[str, bytes] = {}
        self._resend_kick = asyncio.Event()
        self._kick = asyncio.Event()
        #: when to solve after a change (RFC 8405 back-off, ``solve_*`` and ``debounce_ms``)
        self.backoff = SolveBackoff(settings.backoff_policy())
        self._stop = asyncio.Event()
        self._started = time.monotonic()
        self.me = Me()
        #: who steers (:mod:`linkguard.topology.leader`): with an election configured this
        #: service is a warm standby (reads the bus, publishes nothing: :class:`FencedBus`)
        #: until it holds the lease, then stamps its term on everything it publishes
        self.leadership = leadership_from_settings(
            settings.leader,
            fabric=self.fabric.name,
            identity=f"{socket.gethostname()}/{self.me.instance}",
        )
        self._won = asyncio.Event()  # set once this service leads (at once without election)
        self.duplicate: ServiceStatus | None = None
        self._warned: set[tuple[str, ...]] = set()
        #: per-rail probes (``probes`` settings; off by default): the plan of the epoch last
        #: published, the latest result per (prober, target) pair dated by its arrival
        #: (monotonic s), the localiser holding raised verdicts, and reports taken
        self.probe_plan: ProbePlan | None = None
        #: the plans a report may name by its epoch: the current one and the one before it
        #: (agents still report on it until the new targets reach them)
        self.probe_plans: dict[int, ProbePlan] = {}
        #: per (host, reason) of refused probe pairs: when last logged (monotonic s) and how
        #: many were refused since (:meth:`_probe_drop`)
        self._probe_drop_logged: dict[tuple[str, str], tuple[float, int]] = {}
        self.probe_results: dict[tuple[PortId, PortId], PairResult] = {}
        self.localizer: Localizer | None = None
        self.probe_reports = 0
        #: per host, since when (monotonic s) its agent has been online: a probe target's
        #: responder runs in its agent, so pairs to a host whose agent is not online (or came
        #: online within the report's window) say nothing about the link
        self.online_since: dict[str, float] = {}
        #: probe pairs left out because their target's agent was not online for the window
        self.probe_pairs_unanswerable = 0
        #: the probe targets of the current epoch as published (put back on a reconnect: an
        #: agent without targets answers no probes)
        self._probe_targets_sent: list[tuple[str, bytes]] = []
        #: the inconclusive verdicts of the last localisation by subject (``str``): the
        #: verdict and since when (monotonic s) that subject has been inconclusive at every
        #: localisation (never acted on; :meth:`probe_verdicts` lists them)
        self.probe_inconclusive: dict[str, tuple[ProbeVerdict, float]] = {}
        self._leaves = {sw.name: sw for sw in self.fabric.switches if sw.role == "leaf"}
        self.bus: BusSession = bus_factory(
            **settings.bus.connection(),
            client_id=f"linkguard-topology-{self.me.instance}",
            subscriptions=[
                topics.all_host_topics(),
                topics.all_plans(),
                topics.all_peer_routes(),
                topics.service_status(),
                # before fabric/faults: its retained document arrives before the retained set
                topics.service_health(),
                topics.fabric_faults(),
            ],
            handler=self._on_message,
            on_connect=self._on_connect,
            will=Will(topics.service_status(), encode(self._status(online=False))),
        )
        if self.leadership.elected:  # every publish behind the leadership fence
            self.bus = FencedBus(self.bus, self.leadership)

    def _status(self, *, online: bool) -> ServiceStatus:
        lead = self.leadership.describe() if online and self.leadership.elected else {}
        return ServiceStatus(
            online=online,
            at=time.time(),
            version=__version__,
            instance=self.me.instance,
            started_at=self.me.started_at,
            role=lead.get("role"),
            term=lead.get("term"),
        )

    @property
    def term(self) -> int | None:
        """The leader term this service publishes with (0 without election; None: standby
        that never led)."""
        return self.leadership.term

    async def _lead(self) -> None:
        """Campaign (at once without election); once leading, announce it and let the solver
        run; when the lease is lost, stop: :meth:`run` raises :class:`LeadershipLostError`
        (the CLI exits 1, and a supervisor restarts the process as a standby)."""
        if self.leadership.elected:
            log.info("leader_standby", **self.leadership.describe())
        term = await self.leadership.campaign()
        self.state.set_term(term)
        self._won.set()
        if self.leadership.elected:
            log.info("leader_active", **self.leadership.describe())
            if self.bus.connected.is_set():  # else _on_connect announces it
                await self.bus.publish(
                    topics.service_status(), encode(self._status(online=True)), retain=True
                )
                await self._publish_health()
        await self.leadership.lost.wait()
        raise LeadershipLostError(
            f"lost the leader lease (term {term}): "
            f"{getattr(self.leadership, 'why_lost', None) or 'lost'}; stopped publishing. "
            "Restart it (systemd Restart=on-failure does) and it waits as a standby"
        )

    def _warn_once(self, event: str, *key: str, **kw: object) -> None:
        if (event, *key) not in self._warned:
            self._warned.add((event, *key))
            log.warning(event, **kw)

    def stop(self) -> None:
        self._stop.set()

    def _seal(self, body: bytes) -> bytes:
        """``body`` as published: in a signed envelope with a signing key, else as it is.
        About 60 us per message (Ed25519): call on the worker thread that encodes."""
        return body if self.signer is None else self.signer.seal(body)

    def _note_sent(self, payloads: Iterable[tuple[str, bytes]]) -> None:
        """Remember what is published on plan and peer routes topics (with a signing key;
        see :meth:`_check_live`): the last :data:`SENT_KEPT` payloads' digests per topic,
        with when."""
        if self.signer is None:
            return
        now = time.monotonic()
        for topic, data in payloads:
            kept = self._sent.get(topic)
            if kept is None:
                kept = self._sent[topic] = deque(maxlen=SENT_KEPT)
            kept.append((_digest(data), now))

    async def run(self) -> None:
        log.info(
            "topology_starting",
            fabric=self.fabric.name,
            hosts=len(self.fabric.hosts),
            signing_key_id=self.signer.key_id if self.signer is not None else None,
            solve_delays_ms=[
                self.settings.solve_initial_delay_ms,
                self.settings.debounce_ms,
                self.settings.solve_long_delay_ms,
            ],
        )
        try:  # before anything connects: a port in use stops the start here
            api = self._bind_api()
        except BaseException:
            if self.ledger is not None:
                self.ledger.close()
            raise
        tasks = [
            asyncio.create_task(self.bus.run(), name="bus"),
            asyncio.create_task(self._solver(), name="solver"),
            asyncio.create_task(self._auditor(), name="auditor"),
            asyncio.create_task(self._route_around(), name="route_around"),
            asyncio.create_task(self._resender(), name="resender"),
        ]
        tasks.append(asyncio.create_task(self._lead(), name="leader"))
        if self.settings.probes.enabled:
            tasks.append(asyncio.create_task(self._prober(), name="prober"))
        if api is not None:
            tasks.append(asyncio.create_task(api.serve(), name="api"))
        try:
            stop = asyncio.create_task(self._stop.wait(), name="stop")
            done, _ = await asyncio.wait([*tasks, stop], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                exc = t.exception() if t is not stop else None
                if exc is not None:
                    raise exc
            if self.duplicate is None:  # never mark the other instance offline
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.bus.publish(
                            topics.service_status(), encode(self._status(online=False)), retain=True
                        ),
                        2,
                    )
        finally:
            if api is not None:  # ends its streams, closes its connections (graceful first)
                await api.shutdown(tasks[-1])
                self.api = self.api_port = None
            for t in [*tasks, *self._reissuing.values()]:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # the lease goes now, not at its TTL: a standby takes over at its next poll
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.leadership.resign(), 5)
            if self.ledger is not None:  # commits what is queued (a blocking moment at exit)
                self.ledger.close()
            log.info("topology_stopped", solves=self.solves, plans=self.plans_published)
        if self.duplicate is not None:
            raise DuplicateInstanceError(
                f"another topology service is connected to this broker (instance "
                f"{self.duplicate.instance}, started {time.ctime(self.duplicate.started_at or 0)})"
                "; run one service per fabric"
            )

    def _open_ledger(self) -> Ledger | None:
        """The ledger of ``settings.ledger`` with a service run started and subscribed to
        :attr:`changes` (its writer thread commits; closed when :meth:`run` ends), or None
        without a path. Raises :class:`ConfigError` for a file that cannot be a ledger."""
        cfg = self.settings.ledger
        if cfg.path is None:
            return None
        try:
            ledger = Ledger(
                cfg.path,
                retention_days=cfg.retention_days,
                incident_window_s=cfg.incident_window_s,
            )
        except LedgerError as exc:
            raise ConfigError(f"ledger: {exc}") from None
        ledger.start_run(self.fabric, source="service")
        self.changes.subscribe(ledger.consumer())
        log.info("ledger_open", path=str(cfg.path), retention_days=cfg.retention_days)
        return ledger

    def _bind_api(self) -> ApiServer | None:
        """The HTTP API's server (:mod:`linkguard.topology.api`) with its socket bound, or None
        when ``api.enabled`` is false. Raises :class:`~linkguard.topology.api.ApiBindError` (a
        :class:`ConfigError`: ``topology serve`` exits 2) when the address cannot be bound."""
        if not self.settings.api.enabled:
            return None
        from linkguard.topology.api import ApiServer  # FastAPI only where the API is served

        api = ApiServer(self, self.settings.api)
        self.api_port = api.bind()
        self.api = api
        return api

    async def _on_connect(self) -> None:
        if not self.leadership.is_leader():  # a standby: nothing of its own to put back
            if self.state.health is None:
                nominal = FabricFaults(at=time.time())
                self.state.on_health(await asyncio.to_thread(self.state.assess_faults, nominal))
            await self._publish_health()  # kept as health_doc (the API's), not published
            return
        await self.bus.publish(
            topics.service_status(), encode(self._status(online=True)), retain=True
        )
        # After a broker restart without persistence the retained plans are gone: put them back
        # (same epochs, so agents that applied them ignore them). Encoded and signed off the
        # event loop, as the solver's publishes are; one a solve replaced meanwhile is skipped
        # (the solve published the newer one)
        state = self.state
        msgs: list[tuple[str, Plan | PeerRoutes, Mapping[str, Plan | PeerRoutes]]] = [
            (topics.peer_routes(h), p, state.peers) for h, p in list(state.peers.items())
        ]
        msgs += [(topics.plan(h), p, state.published) for h, p in list(state.published.items())]
        sealed = await asyncio.to_thread(lambda: [self._seal(encode(m)) for _, m, _ in msgs])
        payloads = [
            (topic, data)
            for (topic, m, now), data in zip(msgs, sealed, strict=True)
            if now.get(m.host) is m
        ]
        self._note_sent(payloads)
        await self._publish_retained(payloads)
        if self._probe_targets_sent:  # the same for the probe targets of this epoch
            await self._publish_retained(list(self._probe_targets_sent))
        if self.audit_json is not None:
            await self.bus.publish(topics.service_audit(), self.audit_json.encode(), retain=True)
        if self.faults is not None:
            # the broker lost the retained set with the outage (no persistence, or a crash
            # before its autosave): put the set in effect back, or a restarted service would
            # start from nominal health and route onto a leaf that is still cut off
            await self.bus.publish(topics.fabric_faults(), encode(self.faults), retain=True)
        if self.state.health is None:  # the nominal health, until faults arrive
            nominal = FabricFaults(at=time.time())
            self.state.on_health(await asyncio.to_thread(self.state.assess_faults, nominal))
            self.health_at = time.time()
        await self._publish_health()

    def _degraded_rails(self) -> list[int]:
        """The rails the solver treats as degraded now (none before its first solve)."""
        solver = self.state.solver
        return sorted(solver.degraded) if solver is not None else []

    async def _publish_health(self) -> None:
        """``service/health`` (the document :mod:`linkguard.topics` describes): the health
        summary, the degraded rails, ``at``, the faults it reflects and the last refusal."""
        health = self.state.health
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

    def _drop(self, msg: BusMessage, reason: str, detail: str) -> None:
        self.dropped[reason] += 1
        log.warning(
            "message_dropped",
            topic=msg.topic,
            reason=reason,
            detail=detail[:300],
            bytes=len(msg.payload),
        )

    async def _on_message(self, msg: BusMessage) -> None:
        parsed = topics.parse(msg.topic)
        if parsed is not None and parsed.kind == "service_health":
            self._on_retained_health(msg)
            return
        if parsed is None or parsed.kind not in _DECODERS:
            return
        if parsed.kind == "probes" and (
            not self.settings.probes.enabled or parsed.host not in self.state.host_names
        ):
            return
        if parsed.kind == "service_status":
            await self._on_service_status(msg)
            return
        if parsed.kind == "fabric_faults":
            await self._on_fabric_faults(msg)
            return
        unknown_host = parsed.host not in self.state.host_names
        if parsed.kind in ("plan", "peers") and not msg.retain and not self.leadership.is_leader():
            # a standby: the leader's live plans are what is on the bus (to issue above)
            msg = dataclasses.replace(msg, retain=True)
        if parsed.kind in ("plan", "peers") and not msg.retain and self.signer is not None:
            if not unknown_host:
                self._check_live(msg, parsed.kind, parsed.host)
            return
        if parsed.kind in ("plan", "peers") and not msg.payload:
            return  # a deleted retained plan (this service's own clearing, coming back)
        if parsed.kind in ("plan", "peers") and not msg.retain:
            # live plans are this service's own, coming back: only retained ones (published
            # before this connection) tell it anything. Not decoding them halves the service's
            # CPU per event at 256 hosts (274 -> 156 ms, benchmarks/ack_bench.py).
            return
        if unknown_host and parsed.kind in ("plan", "peers"):
            if msg.retain:
                await self._on_stale_plan(msg, parsed.host, parsed.kind)
            return
        if unknown_host and parsed.kind != "status":
            return  # nothing to plan for a host the fabric does not list
        payload = msg.payload
        if parsed.kind in ("plan", "peers"):
            opened = self._open_retained(msg, parsed.kind, parsed.host)
            if opened is None:
                return
            payload = opened
        try:
            obj = decode(
                _DECODERS[parsed.kind],
                payload,
                topic=msg.topic,
                expect_host=parsed.host,
                max_bytes=self.settings.bus.max_message_bytes,
            )
        except BadMessage as exc:
            self._drop(msg, exc.reason, exc.detail)
            return
        if unknown_host:
            # retained messages of hosts that left stay on the broker: only an agent that says
            # it is online now is worth a warning (and an unknown_host in the audit)
            if isinstance(obj, HostStatus):
                if obj.online:
                    self._warn_once(
                        "host_not_in_fabric",
                        obj.host,
                        host=obj.host,
                        fabric=self.fabric.name,
                        hint="agent host name missing from the fabric file: no plans",
                    )
                    self.strangers.add(obj.host)
                else:
                    self.strangers.discard(obj.host)
                self._audit_kick.set()
            return
        if isinstance(obj, HostInventory):
            self._check_inventory(obj)
        elif isinstance(obj, PortState):
            if parsed.hca != obj.hca or parsed.port != obj.port:
                self.dropped["wrong_port"] += 1
                log.warning("message_dropped", topic=msg.topic, reason="wrong_port")
                return
            usability_changed = self.state.on_port_state(obj)
            key, shown = (obj.host, obj.hca, obj.port), _shown(obj)
            # only a state the fabric state kept (not a late older one, not an unknown port)
            if self.state.ports.get((obj.host, obj.key)) is obj and self._shown.get(key) != shown:
                self._shown[key] = shown
                self.changes.emit("port", obj.model_dump(mode="json"))
            if usability_changed:
                log.info(
                    "port_usability_changed",
                    host=obj.host,
                    port=obj.key,
                    rail=obj.rail,
                    status=obj.status.value,
                    reason=obj.reason,
                )
                self._changed(urgent=obj.status != PortStatus.UP)
        elif isinstance(obj, PortEvent):
            self.changes.emit("port_event", obj.model_dump(mode="json"))
        elif isinstance(obj, ProbeReport):
            self._on_probe_report(obj, now=time.monotonic())
        elif isinstance(obj, HostStatus):
            was_away = obj.host in self.state.away
            if not obj.online:
                self.online_since.pop(obj.host, None)
            elif obj.host not in self.online_since:
                self.online_since[obj.host] = time.monotonic()
            self.state.on_host_status(obj, now=time.monotonic())
            self.changes.emit("host", obj.model_dump(mode="json"))
            self._audit_kick.set()
            log.info("host_status", host=obj.host, online=obj.online, reason=obj.reason)
            if was_away and obj.host not in self.state.away:
                log.info("route_around_ended", host=obj.host, online=obj.online)
                self._changed(urgent=False)
            self._offline_kick.set()
        elif isinstance(obj, Ack):
            self.state.on_ack(obj)
            self.changes.emit("ack", obj.model_dump(mode="json"))
            self._on_applied(obj)
            # one line per host and event would be thousands a minute at fleet scale: the
            # applied ones are debug, ``plans_acked`` says when all hosts are through
            (log.debug if obj.result == AckResult.APPLIED else log.warning)(
                "ack",
                host=obj.host,
                epoch=obj.epoch,
                result=obj.result.value,
                fast_path=obj.fast_path,
                apply_ms=obj.apply_ms,
                error=obj.error,
            )
        elif isinstance(obj, (Plan, PeerRoutes)) and msg.retain:
            if isinstance(obj, Plan):
                self.state.on_retained_plan(obj)
            else:
                self.state.on_retained_peers(obj)
            if self.state.dirty and self._settled:  # it came after the first solve
                self._changed(urgent=False)

    def _probe_settings(self) -> tuple[ProbeSettings, LocalizeSettings]:
        """The plan and localiser settings of ``probes`` (a report window counts for
        three windows, at least 30 s)."""
        cfg = self.settings.probes
        plan = ProbeSettings(
            fan_out=cfg.fan_out,
            cross_su=min(cfg.cross_su, cfg.fan_out),
            rate_pps=cfg.rate_pps,
            min_probers=cfg.min_probers,
        )
        loc = LocalizeSettings(
            min_samples=cfg.min_samples,
            min_probers=cfg.min_probers,
            clear_after_s=cfg.clear_after_s,
            max_age_s=max(3 * cfg.window_s, 30.0),
        )
        return plan, loc

    def probe_targets(self, epoch: int) -> list[ProbeTargets]:
        """Every host's :class:`ProbeTargets` of probe plan ``epoch`` (hosts with no port to
        probe get none); records the plan in :attr:`probe_plan` and, with the plan before it
        (the one published last, else that of ``epoch - 1``), in :attr:`probe_plans`: the
        pairs reports may carry."""
        cfg = self.settings.probes
        plan_settings, loc_settings = self._probe_settings()
        plan = plan_probes(self.fabric, plan_settings, epoch=epoch)
        previous = self.probe_plan
        if previous is None and epoch > 0:
            previous = plan_probes(self.fabric, plan_settings, epoch=epoch - 1)
        plans = {plan.epoch: plan}
        if previous is not None and previous.epoch != epoch:
            plans[previous.epoch] = previous
        self.probe_plans = plans
        self.probe_plan = plan
        if self.localizer is None:
            self.localizer = Localizer(leaf_of=plan.leaf, settings=loc_settings)
        by_host: dict[str, list[ProbeRail]] = {}
        for p, targets in plan.targets.items():
            peers = [ProbePeer(host=t.host, rail=t.rail, address=plan.address[t]) for t in targets]
            rail = ProbeRail(rail=p.rail, address=plan.address[p], peers=peers)
            by_host.setdefault(p.host, []).append(rail)
        return [
            ProbeTargets(
                host=host,
                epoch=epoch,
                mode=cfg.mode,
                port=cfg.port,
                rate_pps=cfg.rate_pps,
                timeout_s=cfg.timeout_s,
                window_s=cfg.window_s,
                rails=rails,
            )
            for host, rails in sorted(by_host.items())
        ]

    async def _prober(self) -> None:
        """With ``probes.enabled``: publish every host's probe targets (retained) at the start
        of each probe epoch (``epoch_s``; epoch = Unix time // epoch_s), and localise faults
        from the reports every ``window_s`` (:meth:`localize_probes`)."""
        cfg = self.settings.probes
        await self.bus.connected.wait()
        await self._won.wait()
        published: int | None = None
        while True:
            epoch = int(time.time() // cfg.epoch_s)
            if epoch != published:
                msgs = await asyncio.to_thread(self.probe_targets, epoch)
                self._probe_targets_sent = [(topics.probe_targets(m.host), encode(m)) for m in msgs]
                await self._publish_retained(self._probe_targets_sent)
                published = epoch
                log.info("probe_targets_published", epoch=epoch, hosts=len(msgs))
            if self.localizer is not None:
                now = time.monotonic()
                results = self._fresh_probe_results(now)
                verdicts = await asyncio.to_thread(self.localizer.update, results, now)
                self.localize_probes(now=now, verdicts=verdicts)
            await asyncio.sleep(cfg.window_s)

    async def _clear_probe_targets(self, hosts: list[str], *, why: str) -> None:
        """Delete the retained ``probes/<host>`` of ``hosts`` (a zero-length retained
        publish each; deleting one the broker does not hold costs nothing): targets an
        earlier run published outlive it, and an agent keeps probing them until told
        otherwise (with probes off, every fabric host's are deleted once, after the startup
        settle). Logged as ``probe_targets_cleared`` (hosts, why). Never by a service that
        found another one running (the targets may be that one's)."""
        if not hosts or self.duplicate is not None:
            return
        await self._publish_retained([(topics.probe_targets(h), b"") for h in hosts])
        log.info("probe_targets_cleared", hosts=len(hosts), why=why)

    def _on_probe_report(self, report: ProbeReport, *, now: float) -> None:
        """Keep the pairs of ``report`` as results at ``now`` (monotonic s); ``report.host``
        is its topic's host (``decode`` refuses another one: ``wrong_host``). Only pairs the
        service assigned to that host are taken: a report of an epoch other than the current
        plan's or the one before is dropped whole (``stale_probe_epoch``, one per report); a
        pair naming a port the fabric does not have is dropped (``unknown_probe_port``), and
        so is one its plan did not give that host's rail (``unassigned_probe_pair``), one per
        pair. Without that, one host could report loss from all its rails to any port and be
        counted as that many witnesses. Refusals are logged per host at most every
        :data:`PROBE_DROP_LOG_S`.

        A pair whose target's agent is not online, or came online less than the report's
        ``window_s`` + the probe ``timeout_s`` before ``now``, is left out (counted in
        :attr:`probe_pairs_unanswerable`, not logged): the responder runs in the agent, so a
        stopped, restarting or just-started agent would otherwise read as a dead link and
        drain its healthy host past the offline grace period (``offline``), or drain the
        ports probing it."""
        if self.probe_plan is None:
            return  # no targets published yet: nothing asked for this
        plan = self.probe_plans.get(report.epoch)
        if plan is None:
            self._probe_drop(
                report.host,
                "stale_probe_epoch",
                1,
                now,
                epoch=report.epoch,
                expected=sorted(self.probe_plans),
            )
            return
        self.probe_reports += 1
        unknown: list[str] = []
        unassigned: list[str] = []
        warmup = report.window_s + self.settings.probes.timeout_s
        for pair in report.pairs:
            prober, target = PortId(report.host, pair.rail), PortId(pair.peer_host, pair.peer_rail)
            if prober not in plan.leaf or target not in plan.leaf or prober == target:
                unknown.append(f"{prober}->{target}")
                continue
            if target not in plan.targets.get(prober, ()):
                unassigned.append(f"{prober}->{target}")
                continue
            since = self.online_since.get(target.host)
            if since is None or now - since < warmup:
                self.probe_pairs_unanswerable += 1
                continue
            self.probe_results[(prober, target)] = PairResult(
                prober,
                target,
                pair.sent,
                pair.lost,
                window_end=now,
                window_s=report.window_s,
                rtt_p50_us=None if pair.rtt_p50_ms is None else pair.rtt_p50_ms * 1000,
                rtt_p99_us=None if pair.rtt_p99_ms is None else pair.rtt_p99_ms * 1000,
            )
        for reason, pairs in (
            ("unknown_probe_port", unknown),
            ("unassigned_probe_pair", unassigned),
        ):
            if pairs:
                self._probe_drop(
                    report.host, reason, len(pairs), now, epoch=report.epoch, first=pairs[:4]
                )

    def _probe_drop(self, host: str, reason: str, n: int, now: float, **detail: object) -> None:
        """Count ``n`` refused probe pairs (or one report) of ``host`` under ``reason`` in
        :attr:`dropped`, and log ``message_dropped`` (topic, reason, ``count``: refused since the
        last line, and ``detail``) unless one went out for this host and reason less than
        :data:`PROBE_DROP_LOG_S` before ``now`` (monotonic s)."""
        self.dropped[reason] += n
        key = (host, reason)
        last, pending = self._probe_drop_logged.get(key, (None, 0))
        pending += n
        if last is not None and now - last < PROBE_DROP_LOG_S:
            self._probe_drop_logged[key] = (last, pending)
            return
        self._probe_drop_logged[key] = (now, 0)
        log.warning(
            "message_dropped",
            topic=topics.probe_report(host),
            reason=reason,
            host=host,
            count=pending,
            **detail,
        )

    def _fresh_probe_results(self, now: float) -> list[PairResult]:
        """The probe results younger than the localiser's ``max_age_s`` at ``now`` (older ones
        are dropped for good)."""
        assert self.localizer is not None
        max_age = self.localizer.settings.max_age_s
        for key, r in list(self.probe_results.items()):
            if now - r.window_end > max_age:
                del self.probe_results[key]
        return list(self.probe_results.values())

    def localize_probes(
        self, *, now: float, verdicts: list[ProbeVerdict] | None = None
    ) -> list[ProbeVerdict]:
        """Run the localiser on the fresh results at ``now`` (monotonic s) and act on the
        raised and cleared verdicts: a port verdict marks (or clears) its rail as unusable for
        its host (:meth:`FabricState.on_probe_verdict`, then a solve); a leaf verdict is logged
        (switch-level faults are the operator's ``fabric/faults``). Each is logged as
        ``probe_verdict`` and emitted as a ``health`` change, both with where it is
        (:meth:`_probe_place`: ``host`` and ``rail``, or ``leaf``). Inconclusive verdicts are
        kept in :attr:`probe_inconclusive` (logged as ``probe_inconclusive`` when a subject
        becomes one) and never acted on. ``verdicts``: the localiser's, already computed at
        ``now`` (the prober task computes them in a worker thread: ~0.2 s a window at 2,048
        hosts x 8 rails, benchmarks/localize.py); None: computed here. Returns the verdicts
        acted on."""
        if self.localizer is None:
            return []
        if verdicts is None:
            verdicts = self.localizer.update(self._fresh_probe_results(now), now)
        acted = []
        inconclusive: dict[str, tuple[ProbeVerdict, float]] = {}
        for v in verdicts:
            if v.kind == "inconclusive":
                key = str(v.subject)
                seen = self.probe_inconclusive.get(key)
                inconclusive[key] = (v, now if seen is None else seen[1])
                if seen is None:
                    log.info(
                        "probe_inconclusive",
                        subject=key,
                        witnesses=v.witnesses,
                        lossy=v.lossy,
                        reason=v.reason,
                        **self._probe_place(v.subject),
                    )
                continue
            if v.state not in ("raised", "cleared"):
                continue
            acted.append(v)
            subject = str(v.subject)
            effect = "logged"
            if v.kind == "port" and isinstance(v.subject, PortId):
                suspect = v.state == "raised"
                if self.state.on_probe_verdict(v.subject.host, v.subject.rail, suspect=suspect):
                    effect = "rail_unusable" if suspect else "rail_usable"
                    self._changed(urgent=suspect)
            doc = {
                "kind": v.kind,
                "subject": subject,
                "state": v.state,
                "witnesses": v.witnesses,
                "lossy": v.lossy,
                "seen_as": list(v.seen_as),
                "effect": effect,
            }
            place = self._probe_place(v.subject)
            doc |= place
            (log.warning if v.state == "raised" else log.info)("probe_verdict", **doc)
            # where at the top too: the ledger and ``/api/v1/events?host=&rail=`` filter by it
            self.changes.emit("health", {**place, "probe_verdict": doc})
        self.probe_inconclusive = inconclusive
        return acted

    def _probe_place(self, subject: PortId | str) -> dict[str, object]:
        """Where a probe verdict's ``subject`` is: a port's ``host``, ``rail`` and, when the
        fabric has that rail on the host, its ``hca``, ``port`` and ``leaf`` (and the leaf's
        ``su``); a leaf's ``leaf`` and, when known, its ``rail`` and ``su`` (a leaf named
        ``rail<r>``: a fabric without cabling, rail ``r``)."""
        out: dict[str, object] = {}
        if isinstance(subject, PortId):
            out |= {"host": subject.host, "rail": subject.rail}
            if subject.host in self.state.host_names:
                hca = next(
                    (h for h in self.fabric.host(subject.host).hcas if h.rail == subject.rail), None
                )
                if hca is not None:
                    out |= {"hca": hca.hca, "port": hca.port}
            leaf = self.probe_plan.leaf.get(subject) if self.probe_plan is not None else None
            if leaf is None:
                return out
        else:
            leaf = subject
        out["leaf"] = leaf
        switch = self._leaves.get(leaf)
        if switch is not None:
            out |= {"rail": out.get("rail", switch.rail), "su": switch.su}
        elif "rail" not in out and leaf.startswith("rail") and leaf[4:].isdigit():
            out["rail"] = int(leaf[4:])
        return out

    def probe_verdicts(self, *, now: float | None = None) -> list[dict[str, object]]:
        """The probe verdicts in force: every raised ``port`` and ``leaf`` verdict the
        localiser holds and the ``inconclusive`` ones of the last localisation, sorted by kind
        (port, leaf, inconclusive) and subject. Each: ``kind``, ``subject`` (``host/rail<r>``
        or a leaf name), where (:meth:`_probe_place`: ``host``, ``rail``, ``hca``, ``port`` or
        ``leaf``, ``rail``, ``su``; absent ones None), ``since`` (Unix time, s: raised, or
        inconclusive without a break), ``age_s`` (s), ``witnesses`` and ``lossy`` (evidence
        counts of the last localisation that saw it), ``seen_as`` (a port's rules: ``target``,
        ``prober``), ``clearing`` (loss below ``loss_clear`` since ``clearing_since``, Unix s;
        it clears after ``clear_after_s``), ``drained`` (a port verdict whose rail its host's
        plans avoid) and ``reason`` (why an inconclusive one is not acted on). ``now``: the
        monotonic clock of :meth:`localize_probes` (default ``time.monotonic()``). Empty with
        probes off or before the first localisation."""
        mono = time.monotonic() if now is None else now
        wall = time.time() - mono  # monotonic -> Unix time
        rows: list[dict[str, object]] = []

        def row(
            kind: str, subject: PortId | str, since: float, **fields: object
        ) -> dict[str, object]:
            place: dict[str, object] = {
                "host": None,
                "rail": None,
                "hca": None,
                "port": None,
                "leaf": None,
            }
            place |= {"su": None} | self._probe_place(subject)
            return {
                "kind": kind,
                "subject": str(subject),
                **place,
                "since": round(wall + since, 3),
                "age_s": round(max(0.0, mono - since), 3),
                **fields,
            }

        active = self.localizer.active if self.localizer is not None else {}
        for subject, a in active.items():
            drained = isinstance(subject, PortId) and (
                (subject.host, subject.rail) in self.state.probe_suspect
            )
            rows.append(
                row(
                    a.kind,
                    subject,
                    a.since,
                    witnesses=a.witnesses,
                    lossy=a.lossy,
                    seen_as=list(a.seen_as),
                    clearing=a.low_since is not None,
                    clearing_since=None if a.low_since is None else round(wall + a.low_since, 3),
                    drained=drained,
                    reason="",
                )
            )
        for v, since in self.probe_inconclusive.values():
            rows.append(
                row(
                    "inconclusive",
                    v.subject,
                    since,
                    witnesses=v.witnesses,
                    lossy=v.lossy,
                    seen_as=list(v.seen_as),
                    clearing=False,
                    clearing_since=None,
                    drained=False,
                    reason=v.reason,
                )
            )
        order = {"port": 0, "leaf": 1, "inconclusive": 2}
        return sorted(rows, key=lambda r: (order[str(r["kind"])], str(r["subject"])))

    def _open_retained(self, msg: BusMessage, kind: str, host: str) -> bytes | None:
        """The message inside a retained plan or peer routes payload of a fabric host. With a
        signing key it must carry this service's valid signature: one that does not (unsigned,
        another key, tampered) is dropped (``message_dropped``, counted by reason) and not
        taken as what is on the bus; this service's own copy replaces it (:meth:`_reissue`).
        Without a key an envelope's body is read unverified."""
        verifier = self.signer.verifier if self.signer is not None else None
        try:
            return unwrap(msg.payload, verifier, require=True).body
        except SignatureError as exc:
            self._drop(msg, exc.reason, exc.detail)
            if verifier is not None:  # without a key a malformed envelope is just dropped
                self._foreign(kind, host)
            return None

    def _check_live(self, msg: BusMessage, kind: str, host: str) -> None:
        """A live plan or peer routes message of a fabric host (signing mode): normally this
        service's own coming back: the last it published on that topic, or one of the few
        before it within :data:`ECHO_WINDOW_S` (compared by digest, not decoded). Anything
        else was published by another client (forged, a replay, a deletion): agents refuse
        it or, a replay, ignore it, but the broker now retains it for the next agent that
        connects, so it is dropped (``foreign``) and this service's own put back
        (:meth:`_reissue`)."""
        kept = self._sent.get(msg.topic)
        if kept is None and not msg.payload:
            return  # a deletion on a topic this service never published on (its own)
        if kept:
            digest, now = _digest(msg.payload), time.monotonic()
            if digest == kept[-1][0] or any(
                d == digest and now - at < ECHO_WINDOW_S for d, at in kept
            ):
                return
        self._drop(msg, "foreign", "published on this topic by another client")
        self._foreign(kind, host)

    def _foreign(self, kind: str, host: str) -> None:
        """Put this service's own ``kind`` message of ``host`` back (:meth:`_reissue`), at
        most once per :data:`REISSUE_INTERVAL_S` per topic (later ones wait, and one wait
        covers every foreign message meanwhile): a client that keeps publishing there, or a
        second service, cannot make this one publish in a loop."""
        topic = topics.plan(host) if kind == "plan" else topics.peer_routes(host)
        if topic in self._reissuing:
            return
        wait = self._reissued.get(topic, -REISSUE_INTERVAL_S) + REISSUE_INTERVAL_S
        self._reissuing[topic] = asyncio.create_task(
            self._reissue_after(kind, host, topic, max(0.0, wait - time.monotonic())),
            name=f"reissue:{topic}",
        )

    async def _reissue_after(self, kind: str, host: str, topic: str, delay_s: float) -> None:
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            self._reissued[topic] = time.monotonic()
            if self.duplicate is None:  # never fight another service over the topic
                await self._reissue(kind, host)
        finally:
            self._reissuing.pop(topic, None)

    async def _reissue(self, kind: str, host: str) -> None:
        """Publish this service's own ``kind`` (plan, peers) message of ``host`` again,
        retained, in place of a foreign one. Without one: a plan is published by the first
        solve (every host's plan it has not seen on the bus); peer routes are deleted (the
        host never had any from this service, or the solve publishes them after)."""
        own = (self.state.published if kind == "plan" else self.state.peers).get(host)
        topic = topics.plan(host) if kind == "plan" else topics.peer_routes(host)
        if own is not None:
            action = "re-published this service's own"
        elif kind == "peers":
            action = "deleted"
        else:
            action = "the first solve publishes this service's own"
        log.warning(
            "foreign_retained_replaced",
            topic=topic,
            epoch=own.epoch if own is not None else None,
            action=action,
        )
        if own is not None:
            data = await asyncio.to_thread(lambda: self._seal(encode(own)))
            self._note_sent([(topic, data)])
            await self.bus.publish(topic, data, retain=True)
        elif kind == "peers":
            await self.bus.publish(topic, b"", retain=True)

    def _on_applied(self, ack: Ack) -> None:
        """Count ``ack`` against the hosts the last publish waits for; the last one logs
        ``plans_acked`` (epoch, hosts, ms from the publish to the last ack)."""
        waiting = self._awaiting
        if ack.host not in waiting or ack.result != AckResult.APPLIED:
            return
        due = self.state.acked_epoch(ack.host)
        if due is not None and ack.epoch < due:
            return
        waiting.discard(ack.host)
        if not waiting:
            epoch, hosts, since = self._awaited
            log.info(
                "plans_acked",
                epoch=epoch,
                hosts=hosts,
                ms=round((time.monotonic() - since) * 1000, 1),
            )

    async def _on_stale_plan(self, msg: BusMessage, host: str, kind: str = "plan") -> None:
        """A retained plan (``kind`` plan) or peer routes (peers) of ``host``, which the fabric
        does not list: an agent started with that name would apply the plan (one of another
        fabric), every agent would route to the peer. Noted; deleted right away when the
        startup settle is over, else by :meth:`_solver` when it is."""
        epoch = None
        verifier = self.signer.verifier if self.signer is not None else None
        with contextlib.suppress(BadMessage, SignatureError):
            opened = unwrap(msg.payload, verifier, require=False)
            model: type[Plan] | type[PeerRoutes] = Plan if kind == "plan" else PeerRoutes
            obj = decode(
                model,
                opened.body,
                topic=msg.topic,
                expect_host=host,
                max_bytes=self.settings.bus.max_message_bytes,
            )
            epoch = obj.epoch
            if isinstance(obj, PeerRoutes) and opened.verified:
                self._stale_peer_routes[host] = obj
        (self.stale_plans if kind == "plan" else self.stale_peers)[host] = epoch
        if self._settled:
            await self._clear_stale_plans()

    async def _clear_stale_plans(self) -> None:
        """Delete the retained plans of hosts the fabric does not list (:attr:`stale_plans`):
        a zero-length retained publish on ``plans/<host>``, logged as ``stale_plan_cleared``
        (host, epoch; None for an unreadable plan). Only after the startup settle, and never
        by a service that found another one running (it may be on another fabric: the plans
        are that one's). A publish that fails leaves the plan retained: it comes back on the
        next connection and is cleared then. An agent of such a host keeps its routes. Stale
        peer routes (:attr:`stale_peers`) go the same way (``stale_peers_cleared``); with a
        signing key, the ones this service's key signed are first replaced by signed empty
        ones (agents that verify ignore an unsigned deletion, and would keep their routes)."""
        if self.duplicate is not None:
            return
        if self.signer is not None and self._stale_peer_routes:
            emptied = {
                h: pr.model_copy(
                    update={
                        "classes": [],
                        "modulus": 1,
                        "epoch": max(self.state.epoch, pr.epoch) + 1,
                        "issued_at": time.time(),
                    }
                )
                for h, pr in self._stale_peer_routes.items()
                if h in self.stale_peers
            }
            self._stale_peer_routes.clear()
            sealed = await asyncio.to_thread(
                lambda: [(topics.peer_routes(h), self._seal(encode(p))) for h, p in emptied.items()]
            )
            self._note_sent(sealed)
            for i in range(0, len(sealed), PUBLISH_WINDOW):
                await asyncio.gather(
                    *(
                        self.bus.publish(t, d, retain=True)
                        for t, d in sealed[i : i + PUBLISH_WINDOW]
                    )
                )
        for event, stale, topic in (
            ("stale_plan_cleared", self.stale_plans, topics.plan),
            ("stale_peers_cleared", self.stale_peers, topics.peer_routes),
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

    async def _on_service_status(self, msg: BusMessage) -> None:
        try:
            seen = decode(ServiceStatus, msg.payload, topic=msg.topic)
        except BadMessage as exc:
            self.dropped[exc.reason] += 1
            log.warning("message_dropped", topic=msg.topic, reason=exc.reason)
            return
        if self.leadership.elected:
            # the lease decides who steers: a standby and its leader both run on this broker
            # (only the leader announces itself; a deposed one stops when its lease check
            # fails), so another service's announcement is no duplicate
            return
        verdict = judge(self.me, seen, retained=msg.retain)
        if verdict == Verdict.YIELD:
            log.error(
                "duplicate_service",
                other_instance=seen.instance,
                action="stopping: the other service started first",
            )
            self.duplicate = seen
            self.stop()
        elif verdict != Verdict.IGNORE:
            if verdict == Verdict.HOLD:
                log.error(
                    "duplicate_service",
                    other_instance=seen.instance,
                    action="keeping: started first; the other must stop",
                )
            await self.bus.publish(
                topics.service_status(), encode(self._status(online=True)), retain=True
            )

    async def _on_fabric_faults(self, msg: BusMessage) -> None:
        """A new complete set of switch-level faults: assess it (worker thread), then put it
        in effect (:meth:`_accept`) and publish ``service/health``. A set equal to the one in
        effect changes nothing (it is this service's own re-publish coming back). A malformed
        set, or one naming a switch or cable the fabric does not have, is refused whole
        (:meth:`_refuse`): the previous faults stay in effect."""
        try:
            faults = decode(
                FabricFaults,
                msg.payload,
                topic=msg.topic,
                max_bytes=self.settings.bus.max_message_bytes,
            )
        except BadMessage as exc:
            await self._refuse(msg, exc.reason, exc.detail)
            return
        if faults == self.faults:
            return
        try:
            health = await asyncio.to_thread(self.state.assess_faults, faults)
        except ValueError as exc:  # a switch or cable the fabric does not have
            await self._refuse(msg, "invalid", str(exc))
            return
        self._accept(faults, health)
        self.refused = None
        await self._publish_health()

    def _accept(self, faults: FabricFaults, health: Health) -> None:
        """Put ``faults`` (assessed as ``health``) in effect; wake the solver when that
        changes which rails are usable."""
        self.state.on_health(health)
        self.faults = faults
        self.health_at = time.time()
        log.info(
            "fabric_faults",
            switches_down=_head(faults.switches_down),
            cables_down=_head(
                f"{c.a}-{c.b}" + ("" if c.count is None else f" x{c.count}")
                for c in faults.cables_down
            ),
            reason=faults.reason,
            **health.summary(),
        )
        if self.state.dirty:
            self._changed()

    async def _refuse(self, msg: BusMessage, reason: str, detail: str) -> None:
        """Refuse a ``fabric/faults`` message (dropped, counted, logged as
        ``message_dropped``); the faults in effect stay. Being retained, the refused message
        replaced the accepted set on the broker, where a restarted service would find only
        it: the set in effect is published back, retained. Before this instance accepted any,
        the set a previous instance had accepted (:meth:`_on_retained_health`) is put in
        effect and published instead. With neither, nothing is published (an empty set would
        claim that nothing is down): the refused set stays on the broker, and every service
        start refuses and reports it again. ``service/health`` then carries ``refused``."""
        self._drop(msg, reason, detail)
        refused = {
            "reason": reason,
            "detail": detail[:1000],
            "at": time.time(),
            "faults": _payload_json(msg.payload, whole=reason != "oversized"),
        }
        if self.faults is None and self.inherited_faults is not None:
            inherited, self.inherited_faults = self.inherited_faults, None
            try:
                health = await asyncio.to_thread(self.state.assess_faults, inherited)
            except ValueError as exc:  # the fabric changed since that instance accepted it
                log.warning("inherited_fabric_faults_refused", detail=str(exc)[:300])
            else:
                self._accept(inherited, health)
        if self.faults is not None:
            await self.bus.publish(topics.fabric_faults(), encode(self.faults), retain=True)
        log.warning(
            "fabric_faults_refused",
            reason=reason,
            action="put the set in effect back on the topic"
            if self.faults is not None
            else "none accepted yet: running without switch-level faults",
        )
        self.refused = refused
        await self._publish_health()

    async def _adopt_inherited_faults(self) -> None:
        """After the startup settle: no set arrived on ``fabric/faults`` (the broker lost it)
        but the previous instance's health names the set it had accepted. Put that set in
        effect and publish it back (retained), rather than plan on nominal health."""
        if self.faults is not None or self.inherited_faults is None:
            return
        inherited, self.inherited_faults = self.inherited_faults, None
        try:
            health = await asyncio.to_thread(self.state.assess_faults, inherited)
        except ValueError as exc:  # the fabric changed since that instance accepted it
            log.warning("inherited_fabric_faults_refused", detail=str(exc)[:300])
            return
        log.warning(
            "fabric_faults_inherited",
            reason="no retained fabric/faults after the startup settle; using the set the "
            "previous instance had accepted (service/health)",
            switches_down=_head(inherited.switches_down),
            cables_down=len(inherited.cables_down),
        )
        self._accept(inherited, health)
        await self.bus.publish(topics.fabric_faults(), encode(inherited), retain=True)
        await self._publish_health()

    def _on_retained_health(self, msg: BusMessage) -> None:
        """A ``service/health`` document retained before this connection (a previous
        instance's; after a reconnect this instance's own): keep the faults it had accepted
        for :meth:`_refuse`. Live documents (this instance's own) and unreadable ones are
        ignored, and so is ``faults: null`` (that instance had accepted none)."""
        if not msg.retain:
            return
        with contextlib.suppress(ValueError, RecursionError):  # ValidationError included
            doc = json.loads(msg.payload)
            faults = doc.get("faults") if isinstance(doc, dict) else None
            if faults is not None:
                self.inherited_faults = FabricFaults.model_validate(faults)

    def _check_inventory(self, inv: HostInventory) -> None:
        """Warn when what an agent has differs from what the fabric says it has (the fleet
        audit's comparison, :func:`~linkguard.topology.audit.inventory_problems`)."""
        self.inventories[inv.host] = inv
        self._audit_kick.set()
        problems = inventory_problems(self.fabric.host(inv.host), inv)
        if problems:
            self._warn_once(
                "inventory_mismatch", inv.host, *problems, host=inv.host, problems=problems
            )

    async def _auditor(self, debounce_s: float = 1.0) -> None:
        """Keep the fleet audit of the agents online (:func:`audit`: inventory mismatches,
        fabric hosts without an agent online, agents of hosts the fabric does not list)
        retained on ``service/audit``: published after the startup settle, then recomputed
        (off the event loop) a second after inventories or host statuses change. A host
        counts as reported only while its agent is online (an offline agent's retained
        inventory is not compared either)."""
        await self.bus.connected.wait()
        await self._settle()
        await self._won.wait()  # a standby publishes no audit
        while True:
            self._audit_kick.clear()
            online = {h for h, up in self.state.online.items() if up}
            inventories = {h: inv for h, inv in self.inventories.items() if h in online}
            findings = await asyncio.to_thread(
                audit,
                self.fabric,
                inventories=inventories,
                reported_hosts=online | self.strangers,
            )
            doc = format_json(findings)
            if doc != self.audit_json and self.duplicate is None:  # not the other's audit
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
        """Wait out what is left of ``startup_settle_s`` (retained states, plans, statuses and
        inventories arrive meanwhile)."""
        settle = self.settings.startup_settle_s - (time.monotonic() - self._started)
        if settle > 0:
            await asyncio.sleep(settle)

    async def _solver(self) -> None:
        await self.bus.connected.wait()
        await self._settle()  # let retained states and plans arrive
        await self._won.wait()  # a standby keeps its state warm but never solves
        self._settled = True
        self._warn_unknown_ports()
        await self._adopt_inherited_faults()
        await self._clear_stale_plans()
        if not self.settings.probes.enabled:
            await self._clear_probe_targets(sorted(self.state.host_names), why="probes disabled")
        while True:
            # clear before solving: a change that arrives during the solve (it runs in a
            # thread) leaves the kick set and schedules its own solve
            self._kick.clear()
            self.backoff.started(time.monotonic())
            if self.state.dirty:
                await self._solve_and_publish()
                if self._degraded_rails() != self._health_degraded:
                    await self._publish_health()  # why multipaths now avoid (or use) a rail
            await self._kick.wait()
            due = self.backoff.due
            if due is not None and due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())

    def _warn_unknown_ports(self) -> None:
        """After the startup settle: agents online whose port states did not arrive (a broker
        that dropped retained messages to this new subscriber: ``max_queued_messages``) are
        planned as if those ports were up until the agents' next refresh. Say so, once."""
        have = {host for host, _ in self.state.ports}
        missing = sorted(h for h, up in self.state.online.items() if up and h not in have)
        if missing:
            log.warning(
                "port_states_missing",
                hosts=len(missing),
                first=missing[:10],
                hint="agents just started, or a broker that dropped retained messages to this "
                "subscriber (Mosquitto: raise max_queued_messages); these hosts count as whole "
                "until their agents publish",
            )

    async def _publish_retained(self, payloads: list[tuple[str, bytes]]) -> None:
        """Publish plans and peer routes (retained, QoS 1), :data:`PUBLISH_WINDOW` in flight
        (messages of different hosts are independent: no round trip per host in turn). One
        the broker did not take (disconnected, a PUBACK that never came: a NATS node times
        out while JetStream re-elects) is kept in ``unsent`` and re-sent by
        :meth:`_resender` until it is taken or a newer message for its topic replaces it."""
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

    async def _route_around(self) -> None:
        """Route around hosts whose agent's last will arrived and that are not back within
        ``offline.route_around_after_s`` (:meth:`FabricState.route_around`): each is logged
        (``host_routed_around``), emitted as a ``host`` change with ``routed_around`` and
        solved at once. More hosts lost at once than ``offline.max_fraction`` allows logs
        ``route_around_held`` once per episode and adds none."""
        cfg = self.settings.offline
        limit = cfg.limit(len(self.fabric.hosts))
        held = False
        while True:
            self._offline_kick.clear()
            r = self.state.route_around(
                time.monotonic(), after_s=cfg.route_around_after_s, limit=limit
            )
            for h in r.added:
                log.warning(
                    "host_routed_around",
                    host=h,
                    after_s=cfg.route_around_after_s,
                    hint="its agent's last will arrived and it is not back: peers get "
                    "unreachable routes to its endpoints until it is online again",
                )
                self.changes.emit(
                    "host", {"host": h, "online": False, "reason": "lost", "routed_around": True}
                )
            if r.added:
                self._changed(urgent=True)
            if r.held and not held:
                log.error(
                    "route_around_held",
                    lost=len(self.state.lost),
                    limit=limit,
                    hint="more hosts lost at once than offline.max_fraction allows: more "
                    "likely the broker or the management network than the hosts; none more "
                    "is routed around",
                )
            held = r.held
            timeout = None if r.due_at is None else max(0.0, r.due_at - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._offline_kick.wait(), timeout)

    def _changed(self, *, urgent: bool = True) -> None:
        """A change that needs a solve: schedule it (RFC 8405 back-off) and wake the solver.
        ``urgent``: something went out of use (see :meth:`SolveBackoff.on_change`)."""
        due = self.backoff.on_change(time.monotonic(), urgent=urgent)
        self._kick.set()
        log.debug("solve_scheduled", state=self.backoff.state.value, due_in_ms=_ms_until(due))

    async def _solve_and_publish(self) -> None:
        t0 = time.monotonic()
        unusable = self.state.prepare()
        # The solver is pure and CPU-bound (the full build at start takes about 0.6 s at 2,048
        # hosts x 8 rails with every plan made, an update milliseconds plus the changed plans):
        # run it, and the encoding, off the event loop so the bus keeps serving; changes
        # arriving meanwhile trigger another solve.
        fresh = await asyncio.to_thread(self.state.compute, unusable, now=time.time())
        solved = self.state.commit(fresh)
        self.solves += 1
        t1 = time.monotonic()

        def encoded() -> list[tuple[str, bytes]]:
            # one publisher, QoS 1: delivered in this order. Full plans first (a host that
            # just lost a rail applies its new plan once, and the peer routes that follow do
            # not touch a full plan), then the peer routes, then compact plans (a host that is
            # whole again expands its plan with the peer routes of the same solve)
            full = [p for p in solved.publish if p.shared is None]
            compact = [p for p in solved.publish if p.shared is not None]
            seal = self._seal  # signed here, off the event loop (about 60 us a message)
            return (
                [(topics.plan(p.host), seal(encode(p))) for p in full]
                + [(topics.peer_routes(p.host), seal(encode(p))) for p in solved.peers]
                + [(topics.plan(p.host), seal(encode(p))) for p in compact]
            )

        payloads = await asyncio.to_thread(encoded)
        self._note_sent(payloads)
        t2 = time.monotonic()
        await self._publish_retained(payloads)
        for h in solved.hosts:
            self.plans_published += 1
            self.plans_per_host[h] += 1
        t3 = time.monotonic()
        if solved.hosts:
            self._awaiting = set(self.state.pending_acks(solved.hosts))
            self._awaited = (solved.epoch, len(self._awaiting), t3)
            self.changes.emit(
                "plans",
                {
                    "epoch": solved.epoch,
                    "hosts": sorted(solved.hosts),
                    "peer_routes": sorted(p.host for p in solved.peers),
                    "messages": len(payloads),
                    "solve_ms": round((t1 - t0) * 1000, 2),
                },
            )
        log.info(
            "plans_published",
            epoch=solved.epoch,
            changed=len(solved.hosts),
            messages=len(payloads),
            peer_routes=len(solved.peers),
            unchanged=solved.unchanged,
            solve_ms=round((t1 - t0) * 1000, 2),
            encode_ms=round((t2 - t1) * 1000, 2),
            publish_ms=round((t3 - t2) * 1000, 2),
            bytes=sum(len(d) for _, d in payloads),
            unusable=_head(f"{h}:{sorted(r)}" for h, r in unusable.items()),
        )


def _shown(st: PortState) -> tuple[object, ...]:
    """What the dashboard shows of a port: a ``port`` change is emitted when this changes."""
    d = st.damping
    return (st.status, st.usable, st.reason, st.rate_gbps, d.suppressed, d.flaps, d.hold_down_s)


def _payload_json(payload: bytes, *, whole: bool, limit: int = 2000) -> object:
    """A refused payload as ``service/health`` shows it: its JSON when it parses (and
    ``whole``), else its first ``limit`` bytes as text."""
    if whole:
        with contextlib.suppress(ValueError, RecursionError):
            return json.loads(payload)
    return payload[:limit].decode(errors="replace")


def _digest(data: bytes) -> bytes:
    """A collision-resistant digest of a published payload (BLAKE2b, 16 bytes)."""
    return hashlib.blake2b(data, digest_size=16).digest()


def _ms_until(t: float) -> float:
    return round(max(0.0, t - time.monotonic()) * 1000, 1)


def _head(items: Iterable[str], n: int = 50) -> list[str]:
    """The first ``n`` of ``items`` for a log line, then ``"... N more"``."""
    out = list(items)
    return out if len(out) <= n else [*out[:n], f"... {len(out) - n} more"]


async def run_service(settings: ServiceSettings) -> None:
    """Run until SIGTERM/SIGINT."""
    service = TopologyService(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    with contextlib.suppress(asyncio.CancelledError):
        await service.run()
