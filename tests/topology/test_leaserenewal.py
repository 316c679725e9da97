"""Stopping a lease's renewal loop (linkguard.topology.leaserenewal.stop_renewing): it ends
even when a cancellation is lost, as Python 3.11's ``asyncio.wait_for`` loses one when the
awaited renewal completes at the same moment (CPython gh-86296)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from linkguard.topology.leaserenewal import stop_renewing


async def test_a_loop_that_loses_a_cancellation_is_stopped_all_the_same() -> None:
    renewals = 0
    lost_cancels = 0

    async def keeper() -> None:  # renews on after the first cancellation, as wait_for's race
        nonlocal renewals, lost_cancels
        while True:
            try:
                await asyncio.sleep(0.01)
                renewals += 1
            except asyncio.CancelledError:
                if lost_cancels:
                    raise
                lost_cancels += 1  # swallowed: the loop carries on

    task = asyncio.create_task(keeper())
    await asyncio.sleep(0.05)
    await asyncio.wait_for(stop_renewing(task), 5)
    assert task.cancelled() and lost_cancels == 1 and renewals >= 1


async def test_a_loop_that_failed_or_none_at_all() -> None:
    async def failed() -> None:
        raise RuntimeError("renewal loop broke")

    task = asyncio.create_task(failed())
    await asyncio.sleep(0)
    await stop_renewing(task)  # its exception was the loop's to log: not raised again
    assert isinstance(task.exception(), RuntimeError)
    await stop_renewing(None)


async def test_the_callers_cancellation_is_not_swallowed() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:  # swallows every cancellation until released
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(1)

    task = asyncio.create_task(stubborn())
    stopper = asyncio.create_task(stop_renewing(task))
    await asyncio.sleep(0.25)
    assert not stopper.done()  # still cancelling it, every 0.1 s
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    release.set()
    task.cancel()
    await asyncio.wait_for(task, 5)  # released: it returns
    assert task.done() and not task.cancelled()
