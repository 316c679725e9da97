"""Who creates tasks (issue 20, CODING_STYLE.md "Decisions are pure, effects live in the
wiring"): the wiring modules, and the documented exceptions below, each with its exact count.

The count is of the calls in a module's syntax tree that start a task: ``asyncio.create_task``,
``TaskGroup.create_task`` / ``loop.create_task`` (any ``<x>.create_task(...)``) and
``asyncio.ensure_future``. A new call anywhere fails here: in a wiring module it raises its
count (change the count, and name the task); anywhere else it is refused unless the module is
added to :data:`EXCEPTIONS` with its count and the reason it cannot be the wiring's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the source trees (as [tool.linkguard.sizes] source in pyproject.toml)
SOURCE = ("linkguard", "drivers", "topology", "simulations")
STARTERS = {"create_task", "ensure_future"}

#: the wiring modules: one per process, they own its TaskGroup and its channels
WIRING = {
    # the TaskGroup's bus, watch, timer, refresh, expect-plan, hooks, rails-socket, probes;
    # announce (restarted on each connect) and neighbour-flush (a fast path's, awaited)
    "linkguard/agent/daemon.py": 12,
    # the TaskGroup's bus, solver, auditor, route_around, resender, convergence, leader, stop,
    # prober, api; reissue:<topic> (one per foreign message being answered, cancelled at the end);
    # on a discovered fabric (run_discovered): the service on the current fabric, and the
    # discovery-wait for a changed document, a stop or the service's end (cancelled after)
    "topology/service.py": 13,
}

#: modules outside the wiring that start tasks: (count, why it is not the wiring's)
EXCEPTIONS = {
    # `async with Bus(...)` / `MemoryBus(...)` (one lifetime for both): a task handing each
    # message to a handler, for callers without a wiring module (CLI tools, simulations, tests)
    "linkguard/buslife.py": (1, "`async with` a bus: runs its session for a handler"),
    "linkguard/agent/hooks.py": (1, "one worker per hook inside the `hooks` task's TaskGroup"),
    "linkguard/agent/localsub.py": (1, "one disconnect watch per rails-socket subscriber"),
    "linkguard/agent/probe.py": (1, "the probe sender of one peer, owned by the prober"),
    "drivers/merged.py": (3, "an async generator merging two sources (a TaskGroup cannot)"),
    "drivers/verbs_events.py": (2, "the verbs reader process's stderr drain and its reader"),
    "topology/leader.py": (1, "the etcd lease keepalive while this service holds the lease"),
    "topology/leader_k8s.py": (1, "the Kubernetes Lease renewal while holding it"),
    "topology/apistream.py": (2, "a change stream's wait on its queue or the server's closing"),
    "simulations/live.py": (4, "a simulation harness: runs the service and agents it wires"),
    "simulations/fleet.py": (2, "a simulation harness: the service and one task per agent"),
}


def _starts(tree: ast.AST) -> list[ast.Call]:
    """The calls of ``tree`` that start a task."""
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.attr
            if isinstance(func, ast.Attribute)
            else func.id
            if isinstance(func, ast.Name)
            else None
        )
        if name in STARTERS:
            calls.append(node)
    return calls


def task_starts() -> dict[str, list[ast.Call]]:
    """Per source module (path relative to the repository), its task-starting calls (only
    modules with at least one)."""
    found: dict[str, list[ast.Call]] = {}
    for top in SOURCE:
        for path in sorted((ROOT / top).rglob("*.py")):
            calls = _starts(ast.parse(path.read_text(), filename=str(path)))
            if calls:
                found[path.relative_to(ROOT).as_posix()] = calls
    return found


def test_only_the_wiring_and_the_documented_exceptions_create_tasks() -> None:
    counts = {module: len(calls) for module, calls in task_starts().items()}
    expected = {**WIRING, **{module: n for module, (n, _) in EXCEPTIONS.items()}}
    unexpected = {m: n for m, n in counts.items() if m not in expected}
    assert not unexpected, (
        f"tasks created outside the wiring modules: {unexpected}; start them from "
        "linkguard/agent/daemon.py or topology/service.py, or list the module in EXCEPTIONS "
        "with its count and why"
    )
    assert counts == expected


def test_every_exception_says_why() -> None:
    for module, (count, why) in EXCEPTIONS.items():
        assert count > 0 and why.strip(), module
        assert module not in WIRING, module


def test_the_wiring_names_every_task() -> None:
    """Each task a wiring module starts has a ``name=`` (the TaskGroup's named tasks), so a
    stack dump or a failure says which part it was."""
    starts = task_starts()
    for module in WIRING:
        for call in starts[module]:
            assert any(k.arg == "name" for k in call.keywords), (module, call.lineno)


def test_the_count_sees_every_kind_of_start() -> None:
    source = (
        "import asyncio\n"
        "from asyncio import create_task\n"
        "async def f(tg, loop):\n"
        "    asyncio.create_task(g(), name='a')\n"
        "    tg.create_task(g(), name='b')\n"
        "    loop.create_task(g())\n"
        "    create_task(g())\n"
        "    asyncio.ensure_future(g())\n"
        "    await asyncio.gather(g())\n"  # not a task this module names: not counted
    )
    assert len(_starts(ast.parse(source))) == 5
