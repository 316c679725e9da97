"""The agent's bus side: each message to the part that decides on it, and the periodic
publishes.

Consumes: raw bus messages (:class:`~linkguard.bus.BusMessage`) on the agent's own
``status``, ``plans/<host>``, ``peers/+``, ``probes/<host>``, ``confirmed/<host>`` and
``service/status`` topics. Produces: decoded
plans, peer routes and status messages handed to :class:`~linkguard.agent.core.AgentCore`
(through :mod:`linkguard.agent.inbox`: size, signature, model) and its effects run in order
(:class:`~linkguard.agent.executor.EffectExecutor`); probe targets handed to the prober; a
message on any other topic dropped and counted (``unexpected_topic``). Also the port states
re-published each ``refresh_interval_s``, the journal's unconfirmed events re-sent and the
plan asked for when the agent learns it is behind, on the core's schedule, and the
``no_plan_yet`` warning. Creates no task: :mod:`linkguard.agent.daemon` (the wiring module)
runs these in its ``bus``, ``refresh``, ``resend`` and ``expect-plan`` tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import structlog

from linkguard import topics
from linkguard.agent.discoveryio import collect_discovery
from linkguard.agent.executor import EffectExecutor
from linkguard.bus import BusMessage
from linkguard.models import (
    BadMessage,
    EventsConfirmed,
    HostStatus,
    PeerRoutes,
    Plan,
    ServiceStatus,
    decode,
    encode,
)

__all__ = ["MessageDispatch"]

log = structlog.get_logger(__name__)


class MessageDispatch(EffectExecutor):
    """Bus messages -> core -> effects, for :class:`~linkguard.agent.daemon.Agent` (a base)."""

    async def _on_status(self, msg: BusMessage) -> None:
        try:
            seen = decode(HostStatus, msg.payload, topic=msg.topic, expect_host=self.host)
        except BadMessage as exc:
            self.inbox.drop(msg, exc.reason, exc.detail)
            return
        await self.execute(self.core.on_status(seen, me=self.me, retained=msg.retain))

    async def _on_message(self, msg: BusMessage) -> None:
        parsed = topics.parse(msg.topic)
        if parsed is not None and parsed.kind == "status" and parsed.host == self.host:
            await self._on_status(msg)
            return
        if parsed is not None and parsed.kind == "peers":
            await self._on_peer_routes(msg, parsed.host)
            return
        if parsed is not None and parsed.kind == "probe_targets" and parsed.host == self.host:
            self._on_probe_targets(msg)
            return
        if parsed is not None and parsed.kind == "confirmed" and parsed.host == self.host:
            await self._on_journal_message(msg, EventsConfirmed)
            return
        if parsed is not None and parsed.kind == "service_status":
            await self._on_journal_message(msg, ServiceStatus)
            return
        if parsed is None or parsed.kind != "plan" or parsed.host != self.host:
            self.stats.messages_dropped["unexpected_topic"] += 1
            log.warning("message_dropped", topic=msg.topic, reason="unexpected_topic")
            return
        if not msg.payload:
            self.core.plan_cleared(applied_epoch=self.applier.applied_epoch)
            return
        self.core.plan_seen()
        plan = self.inbox.decode(Plan, msg, self.host)
        if plan is not None:
            effects = self.core.on_plan(
                plan, raw=msg.payload, topic=msg.topic, applied=self.applier.plan, now=time.time()
            )
            await self.execute(effects)

    async def _on_journal_message(
        self, msg: BusMessage, model: type[EventsConfirmed] | type[ServiceStatus]
    ) -> None:
        """``confirmed/<host>`` or ``service/status`` -> the core's journal decisions. Not
        signed: at worst a forged one makes the agent forget or resend events."""
        if not msg.payload:
            return  # a deleted retained message
        try:
            obj = decode(
                model,
                msg.payload,
                topic=msg.topic,
                max_bytes=self.settings.bus.max_message_bytes,
                **({"expect_host": self.host} if model is EventsConfirmed else {}),
            )
        except BadMessage as exc:
            self.inbox.drop(msg, exc.reason, exc.detail)
            return
        if isinstance(obj, EventsConfirmed):
            await self.execute(self.core.on_events_confirmed(obj))
        elif isinstance(obj, ServiceStatus):
            await self.execute(self.core.on_service_status(obj, retained=msg.retain))

    async def _on_peer_routes(self, msg: BusMessage, peer: str) -> None:
        """``peers/<peer>``: decoded (a zero-length payload: deleted) -> core -> effects."""
        pr = self.inbox.decode(PeerRoutes, msg, peer) if msg.payload else None
        if pr is None and msg.payload:
            return
        now = time.time()
        applied = self.applier.plan
        effects = self.core.on_peer_routes(
            peer, pr, raw=msg.payload, topic=msg.topic, applied=applied, now=now
        )
        await self.execute(effects)

    # -- periodic ---------------------------------------------------------------------------
    async def _expect_plan(self, after_s: float = 30.0) -> None:
        """Warn (once) when no plan arrived: the host is unprotected until one does."""
        await self.bus.connected.wait()
        await asyncio.sleep(after_s)
        if self.applier.plan is None:
            found = self.inbox.mismatch  # plans arrived, but were dropped: say which side
            log.warning(
                "no_plan_yet",
                host=self.host,
                waited_s=after_s,
                reason=found.reason if found is not None else None,
                missing=found.missing if found is not None else None,
                hint=found.hint
                if found is not None
                else "is this host name in the service's fabric? is the service up?",
            )

    async def _refresh(self) -> None:
        """Re-publish every port state each ``refresh_interval_s``, +-10 % at random: agents
        started together (a fleet reboot) do not refresh in one burst on the broker. The
        discovery document first, then again each ``discovery.refresh_s`` when it changed."""
        await self._refresh_discovery()
        next_discovery = time.monotonic() + self.settings.discovery.refresh_s
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s * random.uniform(0.9, 1.1))
            for st in self.monitor.snapshot(wall=time.time()):
                await self._publish_state(st)
            if time.monotonic() >= next_discovery:
                next_discovery = time.monotonic() + self.settings.discovery.refresh_s
                await self._refresh_discovery()

    async def _refresh_discovery(self) -> None:
        """Collect the discovery document; publish it (retained) when it changed. Before the
        first connection the publish is dropped and the announce at connect sends it."""
        if not self.settings.discovery.enabled:
            return
        found = await collect_discovery(self.settings, self.inventory, wall=time.time())
        if found.same_as(self.discovery):  # only what the attachment is, not its carriers
            return
        self.discovery = found
        if found.problems:
            log.warning("discovery_problems", problems=found.problems[:10])
        if self._announced:
            await self.bus.publish(topics.discovery(self.host), encode(found), retain=True)

    async def _resend(self) -> None:
        """The core's timed decisions (:meth:`~linkguard.agent.core.AgentCore.due`) -> bus:
        the journal's events still unconfirmed past their wait (``journal_resend_after_s``,
        doubling up to ``journal_resend_max_s``) and a plan request when a newer version
        than the plan in hand stays unexplained (:mod:`linkguard.agent.behind`); woken by
        newly journaled events and by such a version (:class:`PersistJournal`,
        :class:`CheckBehind`)."""
        while True:
            self._resend_wake.clear()
            effects, due = self.core.due(now=time.monotonic())
            await self.execute(effects)
            timeout = None if due is None else max(0.0, due - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._resend_wake.wait()
