"""Verbs async events (PORT_ERR, PORT_ACTIVE, LID/GID/SM/PKEY changes) as a poll trigger.

Consumes the JSON lines of the event reader process (:mod:`linkguard.drivers.verbs_reader`, run
with the system Python that has rdma-core's ``pyverbs``). Produces nothing new: each event
makes the sysfs driver re-read every port of the event's HCA at once
(:meth:`~linkguard.drivers.sysfs_ib.SysfsIBSource.poll_now`), so a port that went down is seen
within milliseconds of the kernel's event rather than at the next poll tick.

Rules (the reasons are field bugs, see issue 8):

- An event is never applied to a port by number. pyverbs' ``AsyncEvent`` exposes only
  ``event_type`` (``ibv_async_event.element.port_num`` is not reachable), and applying one port's
  event to another port is the classic bug of trusting the wrong number; so an event names an
  HCA and every port of that HCA is re-read from sysfs.
- Events only speed detection up. Polling stays the ground truth: a PORT_ACTIVE may never come,
  a reader may be down, and the state an event announces is whatever sysfs then says.
- The reader is its own process (``get_async_event`` blocks holding the GIL): it never runs in
  the agent's event loop. It exiting or crashing is logged and it is restarted with exponential
  back-off; ``no_devices`` / ``unavailable`` are logged once and the agent runs on polling alone.

The pure parts, tested directly: :func:`parse_line` (one line -> event or status),
:func:`decide` (event -> which HCA to re-read and why), :func:`reader_wanted` (settings ->
whether to run the reader), :func:`backoff_s` (restart delay).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import json
import os
import re
import signal
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from linkguard.drivers.base import PortObservation, PortSource
from linkguard.drivers.verbs_reader import EVENT_NAMES

if TYPE_CHECKING:
    from linkguard.drivers.sysfs_ib import SysfsIBSource

__all__ = [
    "DEVICE_EVENTS",
    "MAX_LINE",
    "PORT_EVENTS",
    "READER_SCRIPT",
    "Action",
    "EventKind",
    "ReaderStatus",
    "VerbsEvent",
    "VerbsEventReader",
    "VerbsTriggeredSource",
    "backoff_s",
    "decide",
    "parse_line",
    "reader_wanted",
    "with_verbs_events",
]

log = structlog.get_logger(__name__)

#: the reader script shipped with this package (stdlib + pyverbs only)
READER_SCRIPT = Path(__file__).with_name("verbs_reader.py")

#: longest line taken from the reader (bytes, newline included); a longer one is a bad line
MAX_LINE = 4096

#: events about a port's link or its subnet-manager-assigned identity (IBA vol. 1 11.6.3 /
#: ibv_get_async_event(3) "port events"): the ports of the HCA are re-read
PORT_EVENTS = frozenset(
    {"PORT_ACTIVE", "PORT_ERR", "LID_CHANGE", "PKEY_CHANGE", "SM_CHANGE", "CLIENT_REREGISTER"}
    | {"GID_CHANGE"}
)
#: the device is unusable (ibv_get_async_event(3) "CA events"): re-read, its ports will show it
DEVICE_EVENTS = frozenset({"DEVICE_FATAL"})

_HCA_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # as the sysfs driver accepts them
_STATUSES = frozenset({"started", "no_devices", "unavailable", "hca_error", "hca_exit"})


class EventKind(enum.StrEnum):
    PORT = "port"  #: PORT_EVENTS
    DEVICE_FATAL = "device_fatal"  #: DEVICE_EVENTS
    RESOURCE = "resource"  #: QP/CQ/SRQ/WQ events: about objects, not links (the reader owns none)
    UNKNOWN = "unknown"  #: a code this version does not know


@dataclass(frozen=True)
class VerbsEvent:
    """One event line: ``hca``, ``code`` (``enum ibv_event_type``), ``name`` (from ``code`` by
    :data:`~linkguard.drivers.verbs_reader.EVENT_NAMES`, "UNKNOWN" when not in it; the line's
    own name is not trusted), ``at`` (wall s) and ``mono`` (the reader's CLOCK_MONOTONIC, s)."""

    hca: str
    code: int
    name: str
    at: float
    mono: float


@dataclass(frozen=True)
class ReaderStatus:
    """A status line: ``status`` in started / no_devices / unavailable / hca_error /
    hca_exit, with ``error``, ``hca`` and ``hcas`` when the line has them."""

    status: str
    error: str | None = None
    hca: str | None = None
    hcas: tuple[str, ...] = ()


def _number(doc: dict[str, object], key: str) -> float:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or abs(v) > 1e12:
        raise ValueError(f"{key!r} is not a number: {v!r}"[:200])
    return float(v)


def _text(v: object, limit: int = 300) -> str | None:
    return None if v is None else str(v)[:limit]


def parse_line(line: bytes) -> VerbsEvent | ReaderStatus:
    """One reader line -> :class:`VerbsEvent` or :class:`ReaderStatus`.

    Raises ValueError (with a short reason) for anything else: not UTF-8 JSON, not an object,
    an HCA name sysfs would not accept, a code that is not an int in 0..2**31-1, ``at``/``mono``
    not finite numbers, an unknown status.
    """
    if len(line) > MAX_LINE:
        raise ValueError(f"line of {len(line)} bytes > {MAX_LINE}")
    try:
        doc = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {type(doc).__name__}")
    if "status" in doc:
        status = doc["status"]
        if status not in _STATUSES:
            raise ValueError(f"unknown status {str(status)[:40]!r}")
        hcas = doc.get("hcas") or []
        return ReaderStatus(
            status=status,
            error=_text(doc.get("error")),
            hca=_text(doc.get("hca"), 64),
            hcas=tuple(str(h)[:64] for h in hcas) if isinstance(hcas, list) else (),
        )
    hca = doc.get("hca")
    if not isinstance(hca, str) or not _HCA_NAME.match(hca):
        raise ValueError(f"bad hca {str(hca)[:40]!r}")
    code = doc.get("code")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code < 2**31:
        raise ValueError(f"bad code {str(code)[:40]!r}")
    return VerbsEvent(
        hca=hca,
        code=code,
        name=EVENT_NAMES.get(code, "UNKNOWN"),
        at=_number(doc, "at"),
        mono=_number(doc, "mono"),
    )


@dataclass(frozen=True)
class Action:
    """What to do with one event: ``reread`` the HCA whose every port is re-read now (None:
    nothing to do), ``kind`` of event, ``reason`` (``port_event``, ``device_fatal``,
    ``unknown_code``, ``resource_event``, ``not_watched``)."""

    reread: str | None
    kind: EventKind
    reason: str


def kind_of(code: int) -> EventKind:
    """The :class:`EventKind` of an ``enum ibv_event_type`` value."""
    name = EVENT_NAMES.get(code)
    if name is None:
        return EventKind.UNKNOWN
    if name in PORT_EVENTS:
        return EventKind.PORT
    if name in DEVICE_EVENTS:
        return EventKind.DEVICE_FATAL
    return EventKind.RESOURCE


def decide(event: VerbsEvent, watched: frozenset[str]) -> Action:
    """The action for ``event`` when the agent watches the HCAs ``watched``.

    Port events and DEVICE_FATAL re-read every port of the event's HCA (never one port by
    number: see the module docstring). An unknown code re-reads too: a read costs little and
    the code may be a newer kernel's link event. QP/CQ/SRQ/WQ events are about objects the
    reader never creates: nothing. An HCA not watched: nothing.
    """
    kind = kind_of(event.code)
    if event.hca not in watched:
        return Action(None, kind, "not_watched")
    if kind == EventKind.RESOURCE:
        return Action(None, kind, "resource_event")
    reason = {
        EventKind.PORT: "port_event",
        EventKind.DEVICE_FATAL: "device_fatal",
        EventKind.UNKNOWN: "unknown_code",
    }[kind]
    return Action(event.hca, kind, reason)


def reader_wanted(mode: str, *, driver: str, sysfs_root: Path) -> tuple[bool, str]:
    """Whether the agent runs the reader, and why: ``mode`` "off" never; "auto" only with the
    sysfs driver and at least one device directory under ``sysfs_root``."""
    if mode == "off":
        return False, "verbs.events is off"
    if driver != "sysfs":
        return False, f"driver {driver!r} (verbs events trigger sysfs re-reads)"
    try:
        has = any(_HCA_NAME.match(n) for n in os.listdir(sysfs_root))
    except OSError:
        has = False
    if not has:
        return False, f"no RDMA devices under {sysfs_root}"
    return True, "auto: sysfs driver with RDMA devices"


def backoff_s(failures: int, *, min_s: float, max_s: float) -> float:
    """Delay (s) before restarting a reader that failed ``failures`` (>= 1) times in a row:
    ``min_s * 2**(failures-1)``, at most ``max_s``."""
    return min(max_s, min_s * 2 ** min(max(failures - 1, 0), 30))


class Rereader(Protocol):
    def poll_now(self, hcas: Iterable[str]) -> None: ...


@dataclass
class ReaderStats:
    """Counters an operator (and the tests) can read."""

    starts: int = 0
    exits: int = 0
    events: collections.Counter[str] = field(default_factory=collections.Counter)
    rereads_requested: int = 0
    ignored: collections.Counter[str] = field(default_factory=collections.Counter)
    bad_lines: int = 0
    status: str | None = None  # the last status line
    #: the last event that asked for a re-read, and the agent's monotonic time of the request
    last_event: VerbsEvent | None = None
    last_request_mono: float | None = None


class VerbsEventReader:
    """Runs the reader process and turns its events into ``target.poll_now([hca])``.

    ``argv`` is the reader command (default: ``[python, "-I", READER_SCRIPT]``). ``watched``:
    the HCAs the agent watches. ``backoff_min_s`` / ``backoff_max_s``: restart delay after an
    exit (doubling per consecutive failure; reset when a run lasted ``stable_s``). Never
    raises out of :meth:`run` except CancelledError.
    """

    def __init__(
        self,
        *,
        target: Rereader,
        watched: Iterable[str],
        python: Path = Path("/usr/bin/python3"),
        argv: Sequence[str] | None = None,
        backoff_min_s: float = 1.0,
        backoff_max_s: float = 60.0,
        stable_s: float = 60.0,
    ) -> None:
        self.target = target
        self.watched = frozenset(watched)
        self.argv = list(argv) if argv is not None else [str(python), "-I", str(READER_SCRIPT)]
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.stable_s = stable_s
        self.stats = ReaderStats()
        self._logged: set[str] = set()
        self._done = False  # no_devices / unavailable: not restarted
        self._line_count = 0  # lines read from the reader, all runs

    def _once(self, key: str, level: str, event: str, **kw: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            getattr(log, level)(event, **kw)

    async def run(self) -> None:
        """Run (and restart) the reader until cancelled or it says it has nothing to read."""
        failures = 0
        while not self._done:
            started = time.monotonic()
            lines = self._line_count
            rc, why = await self._run_once()
            if self._done:
                return
            failures = 1 if time.monotonic() - started >= self.stable_s else failures + 1
            delay = backoff_s(failures, min_s=self.backoff_min_s, max_s=self.backoff_max_s)
            hint = "events only speed detection up; ports are still polled"
            if self._line_count == lines and not why:  # not a word: not the reader at all?
                hint = (
                    f"the reader printed nothing: is {self.argv[0]} a Python with rdma-core's "
                    f"pyverbs (try: {self.argv[0]} -c 'import pyverbs')? Set verbs.python, or "
                    f"verbs.events: off; {hint}"
                )
            log.warning(
                "verbs_reader_exited",
                rc=rc,
                detail=why,
                restart_in_s=round(delay, 3),
                hint=hint,
            )
            await asyncio.sleep(delay)

    async def _run_once(self) -> tuple[int | None, str]:
        """One run of the reader: (exit status, last stderr/status text)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its workers are in its process group: killed with it
                limit=MAX_LINE,
            )
        except (FileNotFoundError, PermissionError) as exc:  # no such python: nothing to retry
            self._done = True
            self.stats.status = "unavailable"
            self._once(
                "done",
                "warning",
                "verbs_events_off",
                reason="reader cannot start",
                error=str(exc)[:300],
                hint="set verbs.python to the python that has pyverbs, or verbs.events: off",
            )
            return None, ""
        except OSError as exc:
            self.stats.exits += 1
            return None, f"spawn failed: {exc}"[:300]
        self.stats.starts += 1
        err: collections.deque[str] = collections.deque(maxlen=5)
        assert proc.stdout is not None and proc.stderr is not None
        drain = asyncio.create_task(self._stderr(proc.stderr, err), name="verbs-stderr")
        try:
            await self._lines(proc.stdout)
            rc = await proc.wait()
        finally:
            # cancelled (the agent stops), or stdout closed: leave no process behind (its
            # workers share its process group), then keep what stderr said (1 s at most)
            await asyncio.shield(self._kill(proc))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(drain)
            drain.cancel()
        self.stats.exits += 1
        return rc, " | ".join(err)[-600:]

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        """SIGKILL the reader's process group (it and its workers) unless it exited, reap it."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()

    @staticmethod
    async def _stderr(stream: asyncio.StreamReader, keep: collections.deque[str]) -> None:
        while chunk := await stream.read(4096):
            keep.extend(t for t in chunk.decode("utf-8", "replace").splitlines() if t.strip())

    async def _lines(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # longer than MAX_LINE: asyncio dropped it
                self._bad(f"line longer than {MAX_LINE} bytes")
                continue
            if not line:
                return
            self._line_count += 1
            self.handle(line)

    def _bad(self, reason: str) -> None:
        self.stats.bad_lines += 1
        self._once("bad_line", "warning", "verbs_reader_bad_line", reason=reason)

    def handle(self, line: bytes) -> None:
        """Take one line of the reader (see :func:`parse_line`); bad lines are counted and
        logged once."""
        try:
            item = parse_line(line.rstrip(b"\n"))
        except ValueError as exc:
            self._bad(str(exc))
            return
        if isinstance(item, ReaderStatus):
            self._status(item)
            return
        self.stats.events[item.name] += 1
        action = decide(item, self.watched)
        if action.reread is None:
            self.stats.ignored[action.reason] += 1
            self._once(
                f"ignored:{action.reason}:{item.hca}",
                "info",
                "verbs_event_ignored",
                hca=item.hca,
                event_name=item.name,
                reason=action.reason,
            )
            return
        log.info(
            "verbs_event",
            hca=item.hca,
            event_name=item.name,
            code=item.code,
            action="reread_hca_ports",
            reason=action.reason,
        )
        self.stats.rereads_requested += 1
        self.stats.last_event = item
        self.stats.last_request_mono = time.monotonic()
        self.target.poll_now([action.reread])

    def _status(self, st: ReaderStatus) -> None:
        self.stats.status = st.status
        if st.status == "no_devices":
            self._done = True
            self._once("done", "info", "verbs_events_off", reason="no RDMA devices")
        elif st.status == "unavailable":
            self._done = True
            self._once(
                "done",
                "warning",
                "verbs_events_off",
                reason="pyverbs unavailable",
                error=st.error,
                hint="install python3-pyverbs (Debian) for the system python; ports are polled",
            )
        elif st.status == "started":
            log.info("verbs_reader_started", hcas=list(st.hcas))
        else:  # hca_error / hca_exit: the reader exits and is restarted
            log.warning("verbs_reader_" + st.status, hca=st.hca, error=st.error)


class VerbsTriggeredSource:
    """A :class:`~linkguard.drivers.base.PortSource`: ``source``'s observations, with the
    event reader running alongside while it is watched (``reader.target`` is ``source``).
    The reader never ends the watch: its failures are logged and retried inside it."""

    def __init__(self, *, source: PortSource, reader: VerbsEventReader) -> None:
        self.source = source
        self.reader = reader

    async def watch(self) -> AsyncGenerator[list[PortObservation], None]:
        task = asyncio.create_task(self._reader(), name="verbs-events")
        try:
            async with contextlib.aclosing(self.source.watch()) as it:
                async for batch in it:
                    yield batch
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _reader(self) -> None:
        try:
            await self.reader.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must never stop the port watch
            log.error("verbs_reader_failed", error=f"{type(exc).__name__}: {exc}"[:300])


def with_verbs_events(
    source: SysfsIBSource,
    *,
    mode: str,
    driver: str,
    sysfs_root: Path,
    python: Path,
    hcas: Iterable[str],
    reader: Path | None = None,
) -> PortSource:
    """``source`` (a :class:`~linkguard.drivers.sysfs_ib.SysfsIBSource`) with the event reader
    alongside when :func:`reader_wanted` says so, else ``source`` itself (the reason is logged
    at debug). ``reader``: the reader script (None: :data:`READER_SCRIPT`), run as
    ``python -I reader``."""
    wanted, why = reader_wanted(mode, driver=driver, sysfs_root=sysfs_root)
    if not wanted:
        log.debug("verbs_events_not_started", reason=why)
        return source
    ev = VerbsEventReader(
        target=source,
        watched=hcas,
        argv=[str(python), "-I", str(reader or READER_SCRIPT)],
    )
    return VerbsTriggeredSource(source=source, reader=ev)
