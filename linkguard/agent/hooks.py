"""Job-facing hooks: commands the agent runs when this host's rail map changes.

Consumes: the change documents of :class:`~linkguard.agent.railmap.RailChanges`
(``linkguard.rail-change/v1``) through :meth:`HookRunner.submit`, which never blocks and never
raises, and the hooks configured as :class:`~linkguard.config.HookSettings`. Produces: one run
of each hook whose condition the change meets, with the document (plus ``"trigger"``: the
conditions met, e.g. ``["lost_above"]``) as one JSON line on its stdin; logs
(``hook_ran``, ``hook_failed`` with the hook's name, exit status and the tail of its stderr,
``hook_gave_up``) and :class:`HookStats` per hook.

How a hook runs: ``argv`` is executed directly (no shell), in a new session (its own process
group), with the agent's environment (without its ``LINKGUARD_*`` settings, which may hold the
bus password, and ``CREDENTIALS_DIRECTORY``) plus the hook's ``env``, ``LINKGUARD_HOOK`` (its
name) and ``LINKGUARD_HOOK_ATTEMPT`` (1, 2, ...). After ``timeout_s`` its process group gets
SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`. A failure (exit status not 0, timeout,
cannot start) is retried ``retries`` times with exponential backoff (``backoff_s``, doubling,
at most ``backoff_max_s``). Each hook holds at most one pending change: a change that arrives while
the hook runs or waits to retry replaces the pending one (counted as ``superseded``) and is
run next with the retry count reset, so a hook always ends up with the latest state;
``rail_map_before`` then keeps the map from before the first change it replaced. The hooks
run in their own tasks: the agent's event loop never waits for one (route applies and acks go
on while a hook hangs). When the agent stops, running hooks are killed.

Conditions (``when``): ``change`` on every change; ``lost_above`` when the number of lost
rails rises above ``lost_above`` (from at most that many, or at the first change after the
agent started); ``whole_again`` when no rail is lost any more (from some, or at the first
change). A pending change of a hook whose condition no longer holds for a newer change (a
``whole_again`` overtaken by a new loss) is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from linkguard.config import ConfigError, HookSettings, resolve_command

__all__ = ["KILL_GRACE_S", "HookRunner", "HookStats", "backoff_delay", "holds", "triggers"]

log = structlog.get_logger(__name__)

#: After a hook's timeout its process group gets SIGTERM, then SIGKILL this long (s) after.
KILL_GRACE_S = 1.0
#: Bytes of a hook's stderr (and stdout) kept for the log: the tail.
TAIL_BYTES = 2000


def triggers(hook: HookSettings, lost_before: int | None, lost_after: int) -> list[str]:
    """The conditions of ``hook`` that a change from ``lost_before`` lost rails (None: the
    first change since the agent started) to ``lost_after`` meets, in ``hook.when`` order."""
    out: list[str] = []
    for w in hook.when:
        if w == "change":
            out.append(w)
        elif w == "lost_above":
            if lost_after > hook.lost_above and (
                lost_before is None or lost_before <= hook.lost_above
            ):
                out.append(w)
        elif w == "whole_again" and lost_after == 0 and (lost_before is None or lost_before > 0):
            out.append(w)
    return out


def holds(hook: HookSettings, trigger: str, lost: int) -> bool:
    """Whether the state a ``trigger`` of ``hook`` signalled is still true at ``lost`` lost
    rails (``change`` always)."""
    if trigger == "lost_above":
        return lost > hook.lost_above
    if trigger == "whole_again":
        return lost == 0
    return True


def backoff_delay(hook: HookSettings, retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): ``backoff_s`` doubled per
    retry, at most ``backoff_max_s``."""
    return min(hook.backoff_s * 2 ** (retry - 1), hook.backoff_max_s)


@dataclass
class HookStats:
    """Counters of one hook. ``attempts``: processes started or tried; ``failed``: by kind
    (``exit``, ``timeout``, ``spawn``); ``superseded``: pending changes replaced or dropped by a
    newer one; ``gave_up``: changes abandoned after the last retry."""

    attempts: int = 0
    succeeded: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    superseded: int = 0
    gave_up: int = 0
    last_error: str | None = None
    last_seq: int | None = None  # seq of the last change the hook took (exit status 0)


@dataclass
class _Job:
    doc: dict[str, Any]
    triggers: list[str]
    attempt: int = 0  # failed attempts so far


class _Hook:
    def __init__(self, settings: HookSettings, argv: list[str]) -> None:
        self.settings = settings
        self.argv = argv
        self.pending: _Job | None = None
        self.wake = asyncio.Event()
        self.stats = HookStats()
        self.running: asyncio.subprocess.Process | None = None
        self.busy = False  # a change taken and not done with (running, or waiting to retry)

    @property
    def name(self) -> str:
        return self.settings.name

    def merge(self, old: _Job, doc: dict[str, Any], new: list[str]) -> _Job | None:
        """``old`` (not yet taken) replaced by the newer ``doc`` that met ``new``: its
        conditions that still hold carry over, ``rail_map_before`` stays ``old``'s. None
        when no condition is left."""
        lost = len(doc["rails_lost"])
        keep = [t for t in old.triggers if t not in new and holds(self.settings, t, lost)]
        if not new and not keep:
            return None
        merged = {**doc, "rail_map_before": old.doc["rail_map_before"]}
        return _Job(merged, [*new, *keep])


class HookRunner:
    """Runs the configured hooks; ``await run()`` in a task (cancel it to stop), and
    :meth:`submit` each change. Raises :class:`~linkguard.config.ConfigError` when a hook's
    command is no longer found (the settings checked it when they loaded)."""

    def __init__(self, hooks: Sequence[HookSettings], *, kill_grace_s: float = KILL_GRACE_S):
        self.kill_grace_s = kill_grace_s
        self._hooks: list[_Hook] = []
        for h in hooks:
            try:
                exe = resolve_command(h.argv[0])
            except ValueError as exc:
                raise ConfigError(f"hooks[{h.name}].argv: {exc}") from None
            self._hooks.append(_Hook(h, [exe, *h.argv[1:]]))
        self._lost: int | None = None  # rails lost at the last change
        self._latest: dict[str, Any] | None = None

    @property
    def stats(self) -> dict[str, HookStats]:
        """By hook name."""
        return {h.name: h.stats for h in self._hooks}

    def idle(self) -> bool:
        """True when no hook runs, waits to retry or has a change to take."""
        return all(h.pending is None and not h.busy for h in self._hooks)

    def submit(self, change: dict[str, Any]) -> None:
        """Hand a change document to every hook whose condition it meets (never blocks)."""
        lost = len(change["rails_lost"])
        before, self._lost, self._latest = self._lost, lost, change
        for h in self._hooks:
            met = triggers(h.settings, before, lost)
            if h.pending is None:
                if met:
                    h.pending = _Job(change, met)
                    h.wake.set()
                continue
            h.stats.superseded += 1
            h.pending = h.merge(h.pending, change, met)
            h.wake.set()

    async def run(self) -> None:
        """One worker per hook until cancelled; running hooks are killed then."""
        if not self._hooks:
            return
        async with asyncio.TaskGroup() as tg:
            for h in self._hooks:
                tg.create_task(self._worker(h), name=f"hook-{h.name}")

    async def _worker(self, h: _Hook) -> None:
        while True:
            await h.wake.wait()
            h.wake.clear()
            h.busy = True
            while h.pending is not None:
                job, h.pending = h.pending, None
                if await self._run_once(h, job):
                    continue
                if h.pending is not None:  # a newer change came while it ran: that one next
                    h.stats.superseded += 1
                    newer = h.pending
                    h.pending = h.merge(job, newer.doc, newer.triggers)
                    continue
                latest = self._latest
                if latest is not None and latest is not job.doc and latest["seq"] > job.doc["seq"]:
                    # newer changes that met no condition of this hook: retry with the latest
                    # state if what the job signalled still holds
                    retry = h.merge(job, latest, [])
                    if retry is None:
                        h.stats.superseded += 1
                        continue
                    retry.attempt = job.attempt
                    job = retry
                if job.attempt >= h.settings.retries:
                    h.stats.gave_up += 1
                    log.error(
                        "hook_gave_up",
                        hook=h.name,
                        seq=job.doc["seq"],
                        attempts=job.attempt + 1,
                        last_error=h.stats.last_error,
                        hint="the next rail map change runs it again",
                    )
                    continue
                job.attempt += 1
                h.stats.retried += 1
                h.pending = job
                h.wake.clear()
                with contextlib.suppress(TimeoutError):  # a newer change cuts the wait short
                    async with asyncio.timeout(backoff_delay(h.settings, job.attempt)):
                        await h.wake.wait()
                h.wake.clear()
            h.busy = False

    async def _run_once(self, h: _Hook, job: _Job) -> bool:
        """Run ``h`` once with ``job``; True when it exited 0."""
        s = h.settings
        h.stats.attempts += 1
        payload = json.dumps({**job.doc, "trigger": job.triggers}).encode() + b"\n"
        env = {
            **{k: v for k, v in os.environ.items() if not _private(k)},
            **s.env,
            "LINKGUARD_HOOK": s.name,
            "LINKGUARD_HOOK_ATTEMPT": str(job.attempt + 1),
        }
        t0 = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *h.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                env=env,
            )
        except OSError as exc:
            self._failed(h, job, "spawn", str(exc), b"")
            return False
        h.running = proc
        out = bytearray()
        err = bytearray()
        try:
            async with asyncio.timeout(s.timeout_s):
                await self._talk(proc, payload, out, err)
        except TimeoutError:
            await self._kill(proc, self.kill_grace_s)
            self._failed(h, job, "timeout", f"still running after {s.timeout_s:g} s", err)
            return False
        except asyncio.CancelledError:  # the agent stops: leave nothing behind
            await asyncio.shield(self._kill(proc, 0.0))
            raise
        finally:
            h.running = None
        ms = (time.monotonic() - t0) * 1000
        if proc.returncode != 0:
            self._failed(h, job, "exit", f"exit status {proc.returncode}", err)
            return False
        h.stats.succeeded += 1
        h.stats.last_seq = job.doc["seq"]
        log.info(
            "hook_ran",
            hook=s.name,
            seq=job.doc["seq"],
            epoch=job.doc["epoch"],
            trigger=job.triggers,
            attempt=job.attempt + 1,
            ms=round(ms, 1),
            stdout_tail=_text(out),
        )
        return True

    @staticmethod
    async def _talk(
        proc: asyncio.subprocess.Process, payload: bytes, out: bytearray, err: bytearray
    ) -> None:
        """Write ``payload`` to the stdin of ``proc`` and close it, keep the tails of its
        stdout and stderr, wait for it to exit."""
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        stdin = proc.stdin

        async def feed() -> None:
            # a hook that exits without reading its stdin is fine
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(payload)
                await stdin.drain()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.close()

        async def tail(stream: asyncio.StreamReader, keep: bytearray) -> None:
            while chunk := await stream.read(65536):
                keep.extend(chunk)
                del keep[:-TAIL_BYTES]

        await asyncio.gather(feed(), tail(proc.stdout, out), tail(proc.stderr, err))
        await proc.wait()

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process, grace_s: float) -> None:
        """SIGTERM to the process group of ``proc``, SIGKILL after ``grace_s``; reaped."""
        if proc.returncode is None:
            for sig in (signal.SIGTERM, signal.SIGKILL) if grace_s > 0 else (signal.SIGKILL,):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(grace_s if sig == signal.SIGTERM else 5):
                        await proc.wait()
                if proc.returncode is not None:
                    break
        # what it started in its group and left behind (stdout held open, a background sleep)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _failed(self, h: _Hook, job: _Job, kind: str, detail: str, err: bytes) -> None:
        h.stats.failed[kind] += 1
        h.stats.last_error = f"{kind}: {detail}"
        left = h.settings.retries - job.attempt
        log.warning(
            "hook_failed",
            hook=h.name,
            kind=kind,
            detail=detail,
            seq=job.doc["seq"],
            attempt=job.attempt + 1,
            retry_in_s=backoff_delay(h.settings, job.attempt + 1) if left > 0 else None,
            stderr_tail=_text(err),
        )


def _private(name: str) -> bool:
    """The agent's own settings (``LINKGUARD_*``: a bus password may be among them) and its
    systemd credentials directory are not passed on to hooks."""
    return name.startswith("LINKGUARD_") or name == "CREDENTIALS_DIRECTORY"


def _text(b: bytes) -> str:
    return bytes(b[-TAIL_BYTES:]).decode("utf-8", "replace").strip()
