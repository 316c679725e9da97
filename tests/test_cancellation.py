"""Stops that always end (issue 21, "Bounded shutdown").

Python 3.11's ``asyncio.wait_for`` loses a cancellation when the awaited thing completes in the
same loop iteration as the cancel: it returns the result instead of raising CancelledError
(cpython gh-86296, fixed in 3.12 by rebuilding it on ``asyncio.timeout``). A TaskGroup whose
child lost its cancel waits for that child for ever: an agent's probe task did that when its
targets were deleted just before the agent stopped (a 180 s hang of
``tests/agent/test_probe_fleet.py`` on a loaded machine). The source therefore uses
``async with asyncio.timeout(...)``, which delivers the cancel to the awaiting task itself.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from linkguard.agent.prober import ProbeRunner
from linkguard.models import ProbeReport, ProbeTargets

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ("linkguard", "drivers", "topology", "simulations")


async def test_a_prober_cancelled_as_its_targets_go_stops() -> None:
    """The prober waits out its window in ``_probe``; its targets are deleted (the event it
    waits on is set) and the task is cancelled in the same loop iteration: it must end. With
    3.11's ``wait_for`` the cancel was lost, ``_probe`` returned, and ``run`` waited for new
    targets for ever."""
    runner = ProbeRunner("gpu000")
    reports: list[ProbeReport] = []

    async def publish(report: ProbeReport) -> None:
        reports.append(report)

    task = asyncio.create_task(runner.run(publish))
    runner.set_targets(ProbeTargets(host="gpu000", epoch=1, window_s=60.0, rails=[]))
    for _ in range(20):  # let it reach its window's wait
        await asyncio.sleep(0)
    assert not task.done() and reports == []
    runner.clear_targets()  # sets the event the window's wait is on...
    task.cancel()  # ...and the agent stops, in the same iteration
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert done == {task}, "the prober lost its cancellation and runs on"
    assert task.cancelled()


def test_no_wait_for_in_the_source() -> None:
    """``asyncio.wait_for`` is banned from the source: see the module docstring."""
    found = []
    for top in SOURCE:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "wait_for"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "asyncio"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "use `async with asyncio.timeout(...)` instead: " + ", ".join(found)


@pytest.mark.parametrize("same_iteration", [True, False])
async def test_asyncio_timeout_keeps_a_cancel_that_wait_for_loses(same_iteration: bool) -> None:
    """The property the source relies on, on this interpreter: an event set and the waiting
    task cancelled in one iteration ends the task cancelled."""
    event = asyncio.Event()

    async def waiter() -> str:
        async with asyncio.timeout(60):
            await event.wait()
        return "returned"

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    event.set()
    if not same_iteration:
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert done == {task}
    # set a loop turn before the cancel, the wait has ended and the task returns normally
    assert task.cancelled() if same_iteration else task.result() == "returned"
