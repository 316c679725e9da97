"""The agent's per-rail probes: answer probes on every rail address, probe the service's targets
and report loss and RTT every window.

Consumes: the host's latest :class:`~linkguard.models.ProbeTargets` (retained on
``probes/<host>``, from the service's probe plan, :mod:`linkguard.topology.probeplan`).
Produces: one :class:`~linkguard.models.ProbeReport` per ``window_s`` (handed to ``publish``,
which the daemon points at ``hosts/<host>/probes``): per (local rail, peer host, peer rail)
probes sent and lost in the window and RTT p50/p99 in ms, from
:class:`~linkguard.agent.probe.ProbeSender`.

With ``netns`` (the agent's ``netns`` setting, labs) every socket is made and bound inside that
network namespace (setns(2) in a throwaway thread; the socket stays in the namespace).

Off the apply path: its own task, touching no route. Never fatal: a rail address that cannot be
bound (not configured on this host, port in use) is logged as ``probe_rail_failed`` and left
out until the next targets; anything else that fails in a round is logged as ``probe_failed``
and the round is retried after a window.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import structlog

from linkguard.agent.probe import ProbeResponder, ProbeSender
from linkguard.models import ProbePair, ProbeRail, ProbeReport, ProbeTargets

__all__ = ["ProbeRunner"]

log = structlog.get_logger(__name__)

Publish = Callable[[ProbeReport], Awaitable[object]]


def _ms(us: float | None) -> float | None:
    return None if us is None else round(us / 1000, 4)


def bound_socket(netns: str, address: str, port: int) -> socket.socket:
    """A non-blocking UDP socket made and bound to ``(address, port)`` inside ``netns``.
    setns(2) moves only the calling thread, so a throwaway thread enters the namespace. Raises
    OSError (no such namespace, address not there, port in use)."""
    from pyroute2 import netns as pr_netns  # lazy: only the namespace lab's probers need it

    out: list[socket.socket | BaseException] = []

    def make() -> None:
        s = None
        try:
            pr_netns.setns(netns, flags=0)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((address, port))
            s.setblocking(False)
            out.append(s)
        except BaseException as e:  # re-raised in the caller's thread
            if s is not None:
                s.close()
            out.append(e)

    t = threading.Thread(target=make, name=f"probe-socket-{netns}")
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        if isinstance(out[0], OSError):
            raise out[0]
        raise OSError(f"netns {netns}: {out[0]!r}")
    return out[0]


class ProbeRunner:
    """``await runner.run(publish)`` until cancelled; :meth:`set_targets` with every new
    :class:`ProbeTargets` of this host (a different one restarts the probes with it).
    ``reports``: reports handed to ``publish``; ``failures``: rounds that failed."""

    def __init__(self, host: str, *, netns: str | None = None) -> None:
        self.host = host
        self.netns = netns
        self.targets: ProbeTargets | None = None
        self.reports = 0
        self.failures = 0
        self._changed = asyncio.Event()

    def set_targets(self, targets: ProbeTargets) -> None:
        """Probe ``targets`` from now on (ignored when equal to the ones in hand). Raises
        ValueError for another host's targets."""
        if targets.host != self.host:
            raise ValueError(f"targets of {targets.host!r}, this is {self.host!r}")
        if targets != self.targets:
            self.targets = targets
            self._changed.set()

    def clear_targets(self) -> None:
        """Stop probing (the service deleted this host's targets: probes are off, or it has
        no port to probe); the responders close too. Logged as ``probes_stopped``."""
        if self.targets is not None:
            log.info("probes_stopped", epoch=self.targets.epoch, why="targets deleted")
            self.targets = None
            self._changed.set()

    async def run(self, publish: Publish) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            targets = self.targets
            if targets is None:
                continue
            try:
                await self._probe(targets, publish)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never fatal: say so and try again after a window
                self.failures += 1
                log.warning("probe_failed", error=repr(exc)[:300], epoch=targets.epoch)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(targets.window_s):
                        await self._changed.wait()
                self._changed.set()

    async def _probe(self, t: ProbeTargets, publish: Publish) -> None:
        """Probe ``t`` and report every window until new targets arrive. A rail whose address
        cannot be bound (not configured yet at boot, the port taken) is tried again every
        window: it is answered and probed from the window it binds in
        (``probe_rail_started``)."""
        async with AsyncExitStack() as stack:
            senders: dict[int, tuple[ProbeSender, dict[str, tuple[str, int]]]] = {}
            failed = [r for r in t.rails if not await self._start_rail(stack, t, r, senders)]
            if t.rails and len(failed) == len(t.rails):
                log.warning(
                    "probes_not_started",
                    epoch=t.epoch,
                    rails=[r.rail for r in failed],
                    why="no rail address of the targets could be bound on this host (or its "
                    "netns): nothing is probed or answered until one binds (tried every "
                    "window); reports go out empty",
                )
            else:
                log.info("probes_started", epoch=t.epoch, rails=sorted(senders))
            while not self._changed.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(t.window_s):
                        await self._changed.wait()
                if self._changed.is_set():
                    break
                await publish(self._report(t, senders))
                self.reports += 1
                for rail in list(failed):
                    if await self._start_rail(stack, t, rail, senders, retry=True):
                        failed.remove(rail)
                        log.info("probe_rail_started", epoch=t.epoch, rail=rail.rail)

    async def _start_rail(
        self,
        stack: AsyncExitStack,
        t: ProbeTargets,
        rail: ProbeRail,
        senders: dict[int, tuple[ProbeSender, dict[str, tuple[str, int]]]],
        *,
        retry: bool = False,
    ) -> bool:
        """Answer and probe on ``rail`` (its responder and sender kept open on ``stack``;
        the sender in ``senders``); False, logged as ``probe_rail_failed`` (a retry that
        fails again: at debug), when its address cannot be bound: nothing of it stays open."""
        rail_stack = AsyncExitStack()
        try:
            await rail_stack.enter_async_context(
                ProbeResponder(
                    rail.address, port=t.port, mode=t.mode, sock=self._sock(rail.address, t.port)
                )
            )
            sender = None
            if rail.peers:
                peers = {p.address: (p.host, p.rail) for p in rail.peers}
                sender = await rail_stack.enter_async_context(
                    ProbeSender(
                        rail.address,
                        list(peers),
                        port=t.port,
                        mode=t.mode,
                        rate_pps=t.rate_pps,
                        timeout_s=t.timeout_s,
                        window_s=t.window_s,
                        prober_id=rail.rail,
                        sock=self._sock(rail.address, 0),
                    )
                )
        except (OSError, ValueError) as exc:
            await rail_stack.aclose()
            (log.debug if retry else log.warning)(
                "probe_rail_failed",
                rail=rail.rail,
                address=rail.address,
                error=str(exc),
                retry_in_s=t.window_s,
            )
            return False
        await stack.enter_async_context(rail_stack)
        if sender is not None:
            senders[rail.rail] = (sender, peers)
        return True

    def _sock(self, address: str, port: int) -> socket.socket | None:
        """A socket bound in :attr:`netns` (None without one: the probe classes bind)."""
        return None if self.netns is None else bound_socket(self.netns, address, port)

    def _report(
        self, t: ProbeTargets, senders: dict[int, tuple[ProbeSender, dict[str, tuple[str, int]]]]
    ) -> ProbeReport:
        pairs = []
        for rail, (sender, peers) in sorted(senders.items()):
            for address, (host, peer_rail) in peers.items():
                st = sender.stats(address)
                pairs.append(
                    ProbePair(
                        rail=rail,
                        peer_host=host,
                        peer_rail=peer_rail,
                        sent=st.sent,
                        lost=st.lost,
                        rtt_p50_ms=_ms(st.rtt_p50_us),
                        rtt_p99_ms=_ms(st.rtt_p99_us),
                    )
                )
        return ProbeReport(
            host=self.host,
            epoch=t.epoch,
            window_end=time.time(),
            window_s=t.window_s,
            pairs=pairs,
        )
