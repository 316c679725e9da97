"""The topology service's leader, solve and route-around loops: once this service leads, when
the core's schedule says so, solve and publish, or route around the hosts whose grace period
ended.

Consumes: the leadership (:mod:`linkguard.topology.leader`: campaign, lease lost), the
wake-ups of the core's effects (``ScheduleSolve`` -> ``_kick``, ``KickRouteAround`` ->
``_offline_kick``) and the schedule's due times (:class:`~linkguard.topology.schedule.Schedule`:
the RFC 8405 back-off of :mod:`linkguard.topology.backoff`, the route-around grace).
Produces: ``_won`` once this service leads, solves (off the event loop) and their plans and
peer routes published (:meth:`ServiceIO._solve_and_publish`), the startup's inherited faults,
stale plans and probe targets cleared, ``service/health`` when the degraded rails change, the
route-around effects, and :class:`~linkguard.topology.leader.LeadershipLostError` when the
lease is lost. Creates no task: :mod:`linkguard.topology.service` (the wiring module) runs
:meth:`ScheduleIO._lead`, :meth:`ScheduleIO._solver` and :meth:`ScheduleIO._route_around` as
its ``leader``, ``solver`` and ``route_around`` tasks, and :meth:`ScheduleIO._converge` (plans
re-sent to hosts that do not ack, :mod:`linkguard.topology.convergence`) as ``convergence``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from linkguard.topology.faultsio import FaultsIO
from linkguard.topology.leader import LeadershipLostError

__all__ = ["CONVERGE_POLL_S", "ScheduleIO"]

#: the longest (s) the convergence loop sleeps before looking for hosts owing an ack
CONVERGE_POLL_S = 1.0

log = structlog.get_logger(__name__)


class ScheduleIO(FaultsIO):
    """The solver and route-around loops of
    :class:`~linkguard.topology.service.TopologyService` (a base)."""

    _kick: asyncio.Event
    _offline_kick: asyncio.Event

    async def _lead(self) -> None:
        """Campaign (at once without election); once leading, announce it and let the solver
        run; when the lease is lost, stop: :meth:`run` raises :class:`LeadershipLostError`."""
        if self.leadership.elected:
            log.info("leader_standby", **self.leadership.describe())
        term = await self.leadership.campaign()
        self.core.state.set_term(term)
        self._won.set()
        if self.leadership.elected:
            log.info("leader_active", **self.leadership.describe())
            if self.bus.connected.is_set():  # else _on_connect announces it
                await self._announce()
                await self._publish_health()
        await self.leadership.lost.wait()
        raise LeadershipLostError(
            f"lost the leader lease (term {term}): "
            f"{getattr(self.leadership, 'why_lost', None) or 'lost'}; stopped publishing. "
            "Restart it (systemd Restart=on-failure does) and it waits as a standby"
        )

    async def _solver(self) -> None:
        await self.bus.connected.wait()
        await self._settle()  # let retained states and plans arrive
        await self._won.wait()  # a standby keeps its state warm but never solves
        self._execute_now(self.core.settle())
        await self._adopt_inherited_faults()
        await self._clear_stale_plans()
        if not self.settings.probes.enabled:
            await self._clear_probe_targets(sorted(self.core.state.host_names), "probes disabled")
        while True:
            # clear before solving: a change that arrives during the solve (it runs in a
            # thread) leaves the kick set and schedules its own solve
            self._kick.clear()
            if self.core.schedule.solve_started(time.monotonic()):
                await self._solve_and_publish()
                if self._degraded_rails() != self._health_degraded:
                    await self._publish_health()  # why multipaths now avoid (or use) a rail
            await self._kick.wait()
            due = self.core.schedule.backoff.due
            if due is not None and due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())

    async def _route_around(self) -> None:
        """Route around lost hosts when their grace period ends (the core decides which)."""
        while True:
            self._offline_kick.clear()
            effects, due_at = self.core.schedule.route_around(time.monotonic())
            self._execute_now(effects)
            timeout = None if due_at is None else max(0.0, due_at - time.monotonic())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._offline_kick.wait()

    async def _converge(self) -> None:
        """Re-send plans to online hosts that do not ack their current epoch when the core's
        convergence says so (:meth:`~linkguard.topology.core.ServiceCore.converge`): waits for
        the next re-send due, looking at least every :data:`CONVERGE_POLL_S` for hosts that
        started owing an ack. Only while this service leads."""
        await self._won.wait()
        poll = min(CONVERGE_POLL_S, self.settings.convergence.resend_after_s / 2)
        while True:
            now = time.monotonic()
            due = None
            if self.leadership.is_leader():
                effects, due = self.core.converge(now)
                await self._execute(effects)
            wait = poll if due is None else min(poll, max(0.0, due - time.monotonic()))
            await asyncio.sleep(wait)

    def _warn_unknown_ports(self) -> None:
        self._execute_now(self.core.warn_unknown_ports())
