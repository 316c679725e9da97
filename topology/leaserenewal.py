"""Keeping a leader lease: the renewal loop both election backends share.

Consumes: a lease holder (:class:`RenewableLease`: :class:`~linkguard.topology.leader.EtcdLease`,
:class:`~linkguard.topology.leader_k8s.KubernetesLease`) and its backend's renew call.
Produces: renewals every ``ttl_s/3`` and the holder's local deadline moved after each one
that succeeds; the holder's ``_lose`` when a renewal says it no longer leads or the deadline
passes. It sits below both backends so that :mod:`linkguard.topology.leader` (which picks
the backend) and :mod:`linkguard.topology.leader_k8s` (one backend) do not import each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

__all__ = ["RenewableLease", "keep_lease"]

log = structlog.get_logger(__name__)


class RenewableLease(Protocol):
    """What :func:`keep_lease` needs of a lease holder
    (:class:`~linkguard.topology.leader.EtcdLease`,
    :class:`~linkguard.topology.leader_k8s.KubernetesLease`)."""

    deadline: float  # monotonic s: leadership ends here unless a renewal moves it
    lost: asyncio.Event

    @property
    def ttl_s(self) -> float: ...
    @property
    def margin_s(self) -> float: ...
    @property
    def term(self) -> int | None: ...

    def _lose(self, why: str) -> None: ...


async def keep_lease(
    lease: RenewableLease,
    renew: Callable[[], Awaitable[str | None]],
    *,
    first_in_s: float,
    granted_s: Callable[[], float],
    failed: str,
    deadline_missed: str,
    on_error: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Renew ``lease`` every ``ttl_s/3`` (the first after ``first_in_s``) until it is lost.
    ``renew`` returns None when this instance still leads, else why not (lost at once). A
    renewal that raises is logged as ``failed`` and retried within 0.2 s (after ``on_error``);
    each one that succeeds moves the local deadline to when it was *sent* + ``granted_s()`` -
    ``margin_s`` (the server counts from its arrival, later), so leadership ends here before
    the lease can expire there; at the deadline it is lost (``deadline_missed``)."""
    interval = lease.ttl_s / 3
    next_at = time.monotonic() + first_in_s
    while not lease.lost.is_set():
        now = time.monotonic()
        if now >= lease.deadline:
            lease._lose(deadline_missed)
            return
        if now < next_at:
            await asyncio.sleep(min(next_at, lease.deadline) - now)
            continue
        sent = time.monotonic()
        try:
            async with asyncio.timeout(max(0.05, lease.deadline - sent)):
                why = await renew()
        except Exception as exc:
            log.warning(failed, error=repr(exc)[:300], term=lease.term)
            if on_error is not None:
                await on_error()
            next_at = time.monotonic() + min(0.2, interval)
            continue
        if why is not None:
            lease._lose(why)
            return
        lease.deadline = max(lease.deadline, sent + granted_s() - lease.margin_s)
        next_at = sent + interval


async def stop_renewing(keeper: asyncio.Task[None] | None) -> None:
    """End the renewal task ``keeper`` (from :func:`keep_lease`; None: nothing to do), cancelling
    it again every 0.1 s until it has ended. One cancellation is not always enough: on Python
    3.11 ``asyncio.wait_for`` returns a renewal that completes just as the cancellation arrives
    instead of raising it (CPython gh-86296), and the loop would renew on, so a plain ``await``
    of the task never returned (a 180 s hang of a resign in ``tests/test_leader_k8s.py``). A
    failed loop's exception was logged by the loop and is dropped here; a cancellation of the
    caller propagates."""
    if keeper is None:
        return
    while not keeper.done():
        keeper.cancel()
        await asyncio.wait({keeper}, timeout=0.1)
    if not keeper.cancelled():
        keeper.exception()  # retrieved: no "exception was never retrieved" at exit
