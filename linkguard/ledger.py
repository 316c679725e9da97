"""The interruption ledger: what happened to the fabric, kept in SQLite for the report, the HTTP
API's event timeline and the dashboard.

Consumes: the topology service's change feed (:class:`~linkguard.topology.changes.Change`, through
the callback :meth:`Ledger.consumer` returns), or one fleet simulation's rows
(:meth:`Ledger.write_closed_run`, from :func:`linkguard.simulations.ledgerrecord.record_simulation`:
the generated timeline and the simulator's report).
Produces: a SQLite file (stdlib ``sqlite3``, WAL mode) and the queries :meth:`Ledger.events`
(the paged timeline) and :meth:`Ledger.report` (:class:`~linkguard.ledgerreport.LedgerReport`).

Tables (schema :data:`SCHEMA_VERSION`, in ``meta``; a file of a newer schema is refused). Times
(``at``) are wall-clock seconds since the Unix epoch; a simulation's start at
:data:`~linkguard.simulations.engine.WALL0`:

- ``runs``: one per service run or simulation: ``source`` (``service`` / ``simulation``),
  fabric name, hosts, GPUs, rails, ``window_start`` / ``window_end`` (what the run observed;
  a service run's end moves forward with every write and every 30 s), ``duration_s``, the job
  model used (``model``: the fields of
  :class:`~linkguard.failuremodel.FailureModel`, JSON) and ``stats`` (JSON: a
  simulation's ``reroutes``, ``solves``, ``plans``; a service run's ``initial_epoch``, the
  epoch of its first ``plans`` change, the initial build, which the report does not count as a
  reroute);
- ``events``: every change as the service saw it (kind, ``at``, ``seq``, host / hca / port /
  rail / leaf / su where the change names a port or host, ``data`` JSON; a ``port`` change
  without its ``counters``, an ``audit`` change without its findings list);
- ``port_events``: down/up transitions (``previous``, ``current``, ``reason``; ``at`` is the
  agent's time of the transition);
- ``suppressions``: a port's damping suppression turning on or off (``flaps``, ``penalty``);
- ``plans`` (epoch, hosts re-planned, peer routes, messages, ``solve_ms``) and ``acks`` (host,
  epoch, result, ``apply_ms``, ``fast_path``);
- ``audit_findings``: one row per finding of each new fleet audit;
- ``outages`` and ``outage_ports``: incidents, the unit the job cost model works on (below).

Incidents (built by :class:`IncidentBuilder` in the writer thread, from the live feed; ``at``
here is the service's time of the change):

- A port *goes down* when its status becomes ``down`` from a known other status (its
  ``port_event``, or its ``port`` state if that arrives first; a first report of an already
  down port, e.g. after a restart, opens nothing). It joins the open incident whose first down
  was at most ``incident_window_s`` (default 1 s) earlier, else opens a new one: a leaf reboot is
  one incident. ``kind``: ``link`` (one port), ``host`` (ports of one host), ``leaf`` (ports
  behind one leaf), ``ports`` (anything else); ``cause``: the first port's reason.
- It *closes* when each of its ports has left ``down`` (up, held down or suppressed: the link
  is back); ``down_s`` = its longest down episode, as the simulator's outages. ``isolated``:
  a host it touched had no usable (``up``) port left at the time.
- ``reroute_ms``: only hosts whose port was usable (``up``) right before it went down need a
  reroute. Each such host is *covered* by the first ``plans`` epoch published after its down
  that re-plans it while that port is still unusable. The reroute is done when every such host
  is covered and has acked (``result: applied``, not a fast-path ack) an epoch at least its
  covering one, or is usable again without having been covered. An ack taken before the
  ``plans`` change counts (the service emits that change once every message is published,
  and the first acks can arrive sooner). ``reroute_ms`` = from the incident's first down to
  the last of those acks: detection, solve, publish and apply on every affected host (the
  agents' own fast path is faster; it is not what is measured). ``reroute``: ``none``
  (nobody needed a reroute: e.g. the port was already held down), ``pending``, ``done``, or
  ``unconfirmed`` (a covered host never acked before its ports were usable again, or an
  hour passed). The report charges ``pending`` and ``unconfirmed`` incidents as without
  linkguard. A solve that started just before a port went down and re-planned its host for
  another reason would count as covering it (the ``plans`` change does not say when its
  solve started); that shortens ``reroute_ms`` and is rare.

Retention: ``retention_days`` (service default 90, :class:`~linkguard.config.LedgerSettings`);
rows older than that are deleted when the ledger opens and every hour after; runs that ended
before it are dropped, and the start of older ones moves up to it. None keeps everything (a
simulation's ledger, or one opened for the report). A service pointed at an old ledger (a
simulation's, whose times start at ``WALL0``, 2023-11-14) therefore empties it at start.

Reading: queries and ``read_only`` ledgers open the file with SQLite's ``mode=ro`` (see
:class:`Ledger`): a report never creates or changes a file. The writer checks every 30 s that
its path still names the file it has open and logs ``ledger_file_replaced`` once if not.

Writes never block the caller: :meth:`Ledger.consumer`'s callback only puts the change on a
bounded queue (``queue_size`` changes; beyond that they are counted in ``dropped`` and logged
once). One writer thread takes everything queued, writes it in one transaction and commits:
a change is readable within milliseconds when the fabric is quiet, batched under load.
:meth:`Ledger.flush` waits for it (tests, shutdown); :meth:`Ledger.close` flushes and closes.
Errors: :class:`LedgerError` for a file that cannot be a ledger (a directory, a missing parent
directory, not an SQLite file, another program's database, a newer schema); ``ValueError`` for bad
query arguments. A write that fails (disk full) is logged and counted in ``write_errors``; the
service carries on.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from linkguard.failuremodel import FailureModel
    from linkguard.ledgerreport import LedgerReport
    from linkguard.topology.changes import Change
    from linkguard.topology.fabric import Fabric

__all__ = [
    "SCHEMA_VERSION",
    "Incident",
    "IncidentBuilder",
    "Ledger",
    "LedgerError",
    "NoRunError",
    "PortPlace",
    "parse_time",
    "port_places",
]

log = structlog.get_logger(__name__)

#: The ledger's schema version (``meta.schema_version``).
SCHEMA_VERSION = 1

#: Change kinds the ledger records (those of :mod:`linkguard.topology.changes`).
EVENT_KINDS = ("port", "port_event", "host", "plans", "ack", "audit", "health")

#: Retention purge interval and the window end heartbeat of a running service (s).
PURGE_EVERY_S = 3600.0
HEARTBEAT_S = 30.0
#: A pending reroute becomes ``unconfirmed`` after this long (s).
REROUTE_GIVE_UP_S = 3600.0

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    source TEXT NOT NULL CHECK (source IN ('service', 'simulation')),
    fabric TEXT NOT NULL,
    hosts INTEGER NOT NULL,
    gpus INTEGER NOT NULL,
    rails INTEGER NOT NULL,
    window_start REAL NOT NULL,
    window_end REAL NOT NULL,
    duration_s REAL,
    model TEXT NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',
    closed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    seq INTEGER,
    kind TEXT NOT NULL,
    at REAL NOT NULL,
    host TEXT, hca TEXT, port INTEGER, rail INTEGER, leaf TEXT, su INTEGER,
    data TEXT NOT NULL
);
CREATE INDEX events_at ON events (at);
CREATE INDEX events_kind_at ON events (kind, at);
CREATE INDEX events_host_at ON events (host, at);
CREATE INDEX events_rail_at ON events (rail, at);
CREATE TABLE port_events (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    at REAL NOT NULL,
    host TEXT NOT NULL, hca TEXT NOT NULL, port INTEGER NOT NULL,
    rail INTEGER, leaf TEXT, su INTEGER,
    previous TEXT NOT NULL, current TEXT NOT NULL, reason TEXT
);
CREATE INDEX port_events_at ON port_events (at);
CREATE TABLE suppressions (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    at REAL NOT NULL,
    host TEXT NOT NULL, hca TEXT NOT NULL, port INTEGER NOT NULL,
    rail INTEGER, leaf TEXT, su INTEGER,
    suppressed INTEGER NOT NULL, flaps INTEGER NOT NULL, penalty REAL NOT NULL
);
CREATE INDEX suppressions_at ON suppressions (at);
CREATE TABLE plans (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    epoch INTEGER NOT NULL,
    at REAL NOT NULL,
    hosts INTEGER NOT NULL,
    peer_routes INTEGER NOT NULL,
    messages INTEGER,
    solve_ms REAL
);
CREATE INDEX plans_at ON plans (at);
CREATE TABLE acks (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    host TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    result TEXT NOT NULL,
    apply_ms REAL,
    fast_path INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX acks_at ON acks (at);
CREATE TABLE audit_findings (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    at REAL NOT NULL,
    kind TEXT NOT NULL, severity TEXT NOT NULL, subject TEXT NOT NULL,
    host TEXT, hca TEXT, port INTEGER,
    expected TEXT, observed TEXT, detail TEXT
);
CREATE INDEX audit_findings_at ON audit_findings (at);
CREATE TABLE outages (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    at REAL NOT NULL,
    at_s REAL NOT NULL,
    kind TEXT NOT NULL,
    down_s REAL,
    ports INTEGER NOT NULL,
    isolated INTEGER NOT NULL,
    open INTEGER NOT NULL,
    reroute TEXT NOT NULL CHECK (reroute IN ('none', 'pending', 'done', 'unconfirmed')),
    reroute_ms REAL,
    cause TEXT
);
CREATE INDEX outages_at ON outages (at);
CREATE TABLE outage_ports (
    outage_id INTEGER NOT NULL REFERENCES outages (id) ON DELETE CASCADE,
    host TEXT NOT NULL, hca TEXT NOT NULL, port INTEGER NOT NULL,
    rail INTEGER, leaf TEXT, su INTEGER,
    PRIMARY KEY (outage_id, host, hca, port)
);
"""

#: Tables whose rows carry ``at`` (retention deletes by it).
_TIMED = ("events", "port_events", "suppressions", "plans", "acks", "audit_findings", "outages")

_SUBJECT_PORT = re.compile(r"^(?P<host>[^:\s]+):(?P<hca>[^/\s]+)/(?P<port>\d{1,3})$")


class LedgerError(Exception):
    """A file that cannot be used as a ledger; the message names the path and why."""


class NoRunError(LedgerError):
    """The ledger is readable but has no run in the asked window (nothing to report)."""


PortKey = tuple[str, str, int]  # host, hca, port


@dataclass(frozen=True)
class PortPlace:
    """Where a host port sits in the fabric: its ``rail``, ``leaf`` (None when not cabled in
    the fabric file) and the leaf's ``su``."""

    rail: int | None
    leaf: str | None
    su: int | None


def port_places(fabric: Fabric) -> dict[PortKey, PortPlace]:
    """(host, hca, port) -> :class:`PortPlace` for every host port of ``fabric`` (leaf from
    its ``host-leaf`` link, SU from that leaf switch)."""
    su_of = {s.name: s.su for s in fabric.switches}
    by_end = {
        f"{h.host}:{c.key}": (h.host, c.hca, c.port, c.rail) for h in fabric.hosts for c in h.hcas
    }
    leaf_of: dict[str, str] = {}
    for link in fabric.links:
        if link.kind != "host-leaf":
            continue
        end, leaf = (link.a, link.b) if link.a in by_end else (link.b, link.a)
        if end in by_end:
            leaf_of[end] = leaf
    out: dict[PortKey, PortPlace] = {}
    for end, (host, hca, port, rail) in by_end.items():
        place_leaf = leaf_of.get(end)
        out[(host, hca, port)] = PortPlace(
            rail, place_leaf, su_of.get(place_leaf) if place_leaf else None
        )
    return out


#: The latest time :func:`parse_time` accepts: 9999-12-31T23:59:59Z (Unix s), the end of what
#: ISO 8601 dates and :func:`iso` can show.
MAX_TIME = 253_402_300_799.0

#: A bare integer of fewer digits than this is refused as a time: ``20231120`` reads like the
#: date 2023-11-20 but would be 1970-08-23 in Unix seconds (s since the epoch reach 9 digits in
#: 1973).
_EPOCH_DIGITS = 9
_BARE_INT = re.compile(r"[+-]?[\d_]+")


def parse_time(text: str | float | int) -> float:
    """Seconds since the Unix epoch from a number or an ISO 8601 date/time (``2024-05-01``,
    ``2024-05-01T12:00:00+02:00``; without a zone it is UTC). A number given as text counts as
    Unix seconds only with at least 9 digits, a decimal point or an exponent (``1700000000``,
    ``1.7e9``, ``0.0``): a shorter bare integer such as ``20231120`` is ambiguous (a date?) and
    refused. The result is between 0 (1970-01-01) and :data:`MAX_TIME` (9999-12-31). Raises
    ValueError starting ``not a time: <text>`` and saying how to write one otherwise."""
    how = (
        "give an ISO 8601 date/time such as 2023-11-20 or 2023-11-20T12:00:00Z, or seconds "
        "since the Unix epoch with at least 9 digits or a decimal point, such as 1700000000"
    )
    short_int = False
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s)
            short_int = bool(_BARE_INT.fullmatch(s)) and sum(map(str.isdigit, s)) < _EPOCH_DIGITS
        except ValueError:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
                if dt.tzinfo is None:
                    dt = dt.replace(tzinfo=UTC)
                value = dt.timestamp()
            except (ValueError, OverflowError):
                raise ValueError(f"not a time: {str(text)[:64]!r} ({how})") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_TIME):
        raise ValueError(
            f"not a time: {str(text)[:64]!r} (must be between 1970-01-01 and 9999-12-31, "
            f"0 .. {MAX_TIME:.0f} s since the Unix epoch)"
        )
    if short_int:
        raise ValueError(
            f"not a time: {str(text)[:64]!r} is ambiguous, a bare number of fewer than "
            f"{_EPOCH_DIGITS} digits ({how}; 0.0 for the epoch itself)"
        )
    return value


def iso(t: float) -> str:
    """``t`` (Unix s) as ISO 8601 UTC, to the second (``2023-11-14T22:13:20Z``); a value no
    date can show (negative, past year 9999, not finite) as ``<t> s``. Never raises."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError, TypeError):
        return f"{t!r} s"


# -- incidents --------------------------------------------------------------------------------


@dataclass(eq=False)
class Incident:
    """One incident in the making (see the module docstring). ``row_id``: its ``outages`` row
    once written; ``new_ports``: ports joined since the last write."""

    at: float
    cause: str | None
    ports: dict[PortKey, PortPlace] = field(default_factory=dict)
    down: dict[PortKey, float] = field(default_factory=dict)
    longest_s: float = 0.0
    isolated: bool = False
    needs: set[str] = field(default_factory=set)
    cover: dict[str, int] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)
    reroute: str = "none"
    reroute_ms: float | None = None
    row_id: int | None = None
    new_ports: list[PortKey] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return bool(self.down)

    @property
    def down_s(self) -> float | None:
        """Longest down episode (s); None while a port is still down."""
        return None if self.down else round(self.longest_s, 6)

    @property
    def kind(self) -> str:
        if len(self.ports) == 1:
            return "link"
        if len({k[0] for k in self.ports}) == 1:
            return "host"
        leaves = {p.leaf for p in self.ports.values()}
        return "leaf" if len(leaves) == 1 and None not in leaves else "ports"


class IncidentBuilder:
    """Incidents from port statuses, plans and acks, in the order the service saw them (module
    docstring). Pure: each ``on_*`` method takes the change's time and returns the incidents
    it changed (to be written). ``host_ports``: every port of each host (isolation)."""

    def __init__(
        self,
        places: dict[PortKey, PortPlace],
        *,
        window_s: float = 1.0,
    ) -> None:
        if not (math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"incident_window_s must be finite and >= 0, got {window_s}")
        self.places = places
        self.window_s = window_s
        self.host_ports: dict[str, list[PortKey]] = {}
        for key in places:
            self.host_ports.setdefault(key[0], []).append(key)
        self.status: dict[PortKey, str] = {}
        self.port_incident: dict[PortKey, Incident] = {}
        #: incidents still open or waiting for their reroute, oldest first
        self.active: list[Incident] = []
        #: host -> (epoch, time) of its latest applied plan ack (the service may take an ack
        #: before it has finished publishing, i.e. before its ``plans`` change)
        self.last_ack: dict[str, tuple[int, float]] = {}

    def _usable(self, key: PortKey) -> bool:
        return self.status.get(key, "up") == "up"

    def on_status(
        self,
        key: PortKey,
        status: str,
        at: float,
        *,
        previous: str | None = None,
        reason: str | None = None,
        rail: int | None = None,
    ) -> list[Incident]:
        """A port's status as a ``port`` state (``previous`` None) or a ``port_event``
        (``previous`` its previous status) reported it at ``at``."""
        before = self.status.get(key)
        if before is None and previous is not None:
            before = previous
        self.status[key] = status
        touched: list[Incident] = []
        if status == "down" and before not in (None, "down", "unknown"):
            inc = next(
                (i for i in reversed(self.active) if i.open and 0 <= at - i.at <= self.window_s),
                None,
            )
            if inc is None:
                inc = Incident(at=at, cause=reason)
                self.active.append(inc)
            if key not in inc.ports:
                inc.new_ports.append(key)
            inc.ports[key] = self.places.get(key, PortPlace(rail, None, None))
            inc.down[key] = at
            self.port_incident[key] = inc
            if before == "up":
                inc.needs.add(key[0])
            host_keys = self.host_ports.get(key[0], [key])
            if not any(self._usable(k) for k in host_keys):
                inc.isolated = True
            touched.append(inc)
        elif status == "down" and reason:
            inc = self.port_incident.get(key)
            if inc is not None and inc.cause is None:  # the event names what the state did not
                inc.cause = reason
                touched.append(inc)
        elif before == "down" and status != "down":
            inc = self.port_incident.pop(key, None)
            if inc is not None and key in inc.down:
                inc.longest_s = max(inc.longest_s, at - inc.down.pop(key))
                touched.append(inc)
        if status == "up":
            for inc in self.active:
                if key[0] in inc.needs and self._settle(inc, at) and inc not in touched:
                    touched.append(inc)
        self._retire(at)
        return touched

    def on_plans(self, epoch: int, hosts: Iterable[str], at: float) -> list[Incident]:
        """A plans publish re-planning ``hosts``: it covers the hosts of open reroutes whose
        incident port is still unusable."""
        hosts = set(hosts)
        touched = []
        for inc in self.active:
            changed = False
            for h in inc.needs - inc.cover.keys():
                if h in hosts and any(not self._usable(k) for k in inc.ports if k[0] == h):
                    inc.cover[h] = epoch
                    acked = self.last_ack.get(h)
                    if acked is not None and acked[0] >= epoch:
                        inc.acked[h] = acked[1]
                    changed = True
            if changed:
                if inc.reroute in ("none", "done"):
                    inc.reroute = "pending"
                    inc.reroute_ms = None
                self._settle(inc, at)
                touched.append(inc)
        self._retire(at)
        return touched

    def on_ack(
        self, host: str, epoch: int, *, result: str, fast_path: bool, at: float
    ) -> list[Incident]:
        """An agent's ack."""
        if result != "applied" or fast_path:
            return []
        if epoch > self.last_ack.get(host, (-1, at))[0]:  # the first ack of each epoch
            self.last_ack[host] = (epoch, at)
        touched = []
        for inc in self.active:
            want = inc.cover.get(host)
            if want is not None and host not in inc.acked and epoch >= want:
                inc.acked[host] = at
                self._settle(inc, at)
                touched.append(inc)
        self._retire(at)
        return touched

    def _settle(self, inc: Incident, at: float) -> bool:
        """Decide ``inc``'s reroute if it can be; True when that changed it."""
        if inc.reroute != "pending":
            return False
        waiting = False
        for h in inc.needs:
            ports_usable = all(self._usable(k) for k in inc.ports if k[0] == h)
            if h in inc.cover:
                if h not in inc.acked and not ports_usable:
                    waiting = True
                elif h not in inc.acked:
                    inc.reroute = "unconfirmed"  # usable again, its plan never acked
                    return True
            elif not ports_usable:
                waiting = True  # its plans are still to come
        if waiting:
            if at - inc.at > REROUTE_GIVE_UP_S:
                inc.reroute = "unconfirmed"
                return True
            return False
        inc.reroute = "done"
        inc.reroute_ms = round((max(inc.acked.values()) - inc.at) * 1000, 3)
        return True

    def _retire(self, at: float) -> None:
        """Forget incidents that are closed and whose reroute is decided (or given up)."""
        keep = []
        for inc in self.active:
            if inc.reroute == "pending" and at - inc.at > REROUTE_GIVE_UP_S:
                inc.reroute = "unconfirmed"
            if inc.open or inc.reroute == "pending":
                keep.append(inc)
        self.active = keep


# -- the ledger -------------------------------------------------------------------------------


class _Stop:
    pass


_STOP = _Stop()


def _model_json(model: FailureModel | None) -> str:
    from linkguard.failuremodel import FailureModel

    return json.dumps(asdict(model or FailureModel()))


def model_from_json(text: str) -> FailureModel:
    """A :class:`~linkguard.failuremodel.FailureModel` from a run's ``model`` JSON
    (fields it does not know are ignored; missing ones take their defaults)."""
    from linkguard.failuremodel import FailureModel

    try:
        raw = json.loads(text)
    except (TypeError, ValueError):
        raw = {}
    if not isinstance(raw, dict):
        raw = {}
    known = {f.name for f in fields(FailureModel)}
    # JSON values: FailureModel's own checks (TypeError, ValueError) reject wrong ones
    kw: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known
    }
    try:
        return FailureModel(**kw)
    except (TypeError, ValueError):
        return FailureModel()


def _file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class Ledger:
    """One ledger file (module docstring).

    ``path``: the SQLite file (created with its parent's permissions when ``create`` and
    missing; its directory must exist). ``retention_days``: delete older rows on open and
    hourly (None: never). ``incident_window_s``: ports going down this close to an incident's
    first down join it. ``read_only``: only query an existing ledger (the report): opened
    with SQLite's ``mode=ro``, so nothing is created or changed; a ledger no writer has open
    (no ``-wal`` file beside it) is read as ``immutable``, so not even SQLite's ``-wal`` /
    ``-shm`` files appear. Queries (:meth:`events`, :meth:`report`) always read that way.
    Raises :class:`LedgerError` for a path that cannot be a ledger, ValueError for
    ``read_only`` with ``retention_days``."""

    def __init__(
        self,
        path: Path | str,
        *,
        retention_days: float | None = None,
        incident_window_s: float = 1.0,
        create: bool = True,
        queue_size: int = 100_000,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        if read_only and retention_days is not None:
            raise ValueError("a read-only ledger cannot purge: retention_days must be None")
        self.read_only = read_only
        create = create and not read_only
        if retention_days is not None and not (
            math.isfinite(retention_days) and retention_days > 0
        ):
            raise ValueError(f"retention_days must be > 0 or None, got {retention_days}")
        if not (math.isfinite(incident_window_s) and incident_window_s >= 0):
            raise ValueError(f"incident_window_s must be >= 0, got {incident_window_s}")
        self.retention_days = retention_days
        self.incident_window_s = incident_window_s
        self._check_path(create)
        self._lock = threading.Lock()
        self._conn = self._connect(create=create)
        self.run_id: int | None = None
        self._run_start = 0.0
        self._places: dict[PortKey, PortPlace] = {}
        self.builder: IncidentBuilder | None = None
        self._suppressed: dict[PortKey, bool] = {}
        # changes to write; a flush's Event (set once written); _STOP
        self._queue: queue.Queue[Change | threading.Event | _Stop] = queue.Queue(
            maxsize=max(1, queue_size)
        )
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_purge = 0.0
        self._file_id = None if read_only else _file_id(self.path)
        self._last_file_check = 0.0
        self._file_replaced = False
        self._initial_epoch_seen = False
        #: changes not recorded: the queue was full, or the ledger was closed
        self.dropped = 0
        #: write transactions that failed (logged)
        self.write_errors = 0
        #: changes recorded
        self.recorded = 0
        if retention_days is not None:
            self.purge()

    # -- opening --------------------------------------------------------------------------------
    def _check_path(self, create: bool) -> None:
        p = self.path
        if p.is_dir():
            raise LedgerError(f"ledger {p} is a directory; give a file path")
        if not p.exists():
            if not create:
                raise LedgerError(f"no ledger at {p}")
            if not p.parent.is_dir():
                raise LedgerError(f"cannot create ledger {p}: {p.parent} is not a directory")

    def _open_read_only(self) -> sqlite3.Connection:
        """A ``mode=ro`` connection (``immutable`` too when no writer has the file open: no
        ``-wal`` beside it); never creates or changes a file. Raises :class:`LedgerError`."""
        p = self.path
        if not p.is_file():
            gone = " (deleted or moved since it was opened)" if hasattr(self, "_conn") else ""
            raise LedgerError(f"no ledger at {p}{gone}")
        uri = p.resolve().as_uri() + "?mode=ro"
        if not Path(f"{p}-wal").exists():
            uri += "&immutable=1"
        try:
            return sqlite3.connect(
                uri, uri=True, timeout=10, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read ledger {p}: {exc}") from None

    def _connect(self, *, create: bool) -> sqlite3.Connection:
        """Open, switch to WAL, create or check the schema (read-only: only check it)."""
        p = self.path
        if self.read_only:
            conn = self._open_read_only()
        else:
            try:
                conn = sqlite3.connect(p, timeout=10, isolation_level=None, check_same_thread=False)
            except sqlite3.Error as exc:
                raise LedgerError(f"cannot open ledger {p}: {exc}") from None
        try:
            if not self.read_only:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise LedgerError(f"ledger {p}: SQLite refused WAL mode (journal mode {mode})")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA foreign_keys=ON")
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if not tables:
                if not create:
                    raise LedgerError(f"{p} is not a linkguard ledger (an empty database)")
                conn.executescript(
                    "BEGIN;"
                    + _SCHEMA
                    + f"INSERT INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');"
                    + f"INSERT INTO meta VALUES ('created_at', '{time.time()!r}');"
                    + "COMMIT;"
                )
            elif "meta" not in tables:
                raise LedgerError(
                    f"{p} is an SQLite database but not a linkguard ledger (no meta table)"
                )
            else:
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                try:
                    version = int(row[0]) if row else None
                except ValueError:
                    version = None
                if version is None:
                    raise LedgerError(f"{p} is not a linkguard ledger (no schema version)")
                if version > SCHEMA_VERSION:
                    raise LedgerError(
                        f"ledger {p} has schema version {version}, newer than this linkguard's "
                        f"{SCHEMA_VERSION}: use a newer linkguard to read it"
                    )
                if version < SCHEMA_VERSION:  # no older schema was ever released
                    raise LedgerError(f"ledger {p} has unknown old schema version {version}")
        except LedgerError:
            conn.close()
            raise
        except sqlite3.Error as exc:
            conn.close()
            raise LedgerError(f"cannot use {p} as a ledger: {exc}") from None
        return conn

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A connection of its own for one query (any thread), in one read transaction."""
        if self._closed:
            raise LedgerError(f"ledger {self.path} is closed")
        conn = self._open_read_only()
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("BEGIN")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read ledger {self.path}: {exc}") from None
        finally:
            conn.close()

    @property
    def journal_mode(self) -> str:
        with self._lock:
            return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0])

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(
                self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[
                    0
                ]
            )

    # -- runs -----------------------------------------------------------------------------------
    def start_run(
        self,
        fabric: Fabric,
        *,
        source: str = "service",
        model: FailureModel | None = None,
        window_start: float | None = None,
        window_end: float | None = None,
        duration_s: float | None = None,
        stats: dict[str, object] | None = None,
    ) -> int:
        """Record a run over ``fabric`` and make it the one changes are recorded under;
        returns its id. ``model``: the job model (default
        :class:`~linkguard.failuremodel.FailureModel`'s defaults)."""
        if source not in ("service", "simulation"):
            raise ValueError(f"source must be 'service' or 'simulation', got {source!r}")
        if self.read_only:
            raise LedgerError(f"ledger {self.path} is open read-only")
        start = time.time() if window_start is None else window_start
        end = start if window_end is None else window_end
        self._places = port_places(fabric)
        self.builder = IncidentBuilder(self._places, window_s=self.incident_window_s)
        self._suppressed = {}
        self._run_start = start
        self._initial_epoch_seen = False
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO runs (source, fabric, hosts, gpus, rails, window_start, window_end,"
                " duration_s, model, stats) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    source,
                    fabric.name,
                    len(fabric.hosts),
                    sum(len(h.endpoints) for h in fabric.hosts),
                    len(fabric.rails),
                    start,
                    end,
                    duration_s,
                    _model_json(model),
                    json.dumps(stats or {}),
                ),
            )
            self.run_id = int(cur.lastrowid or 0)
        return self.run_id

    # -- the live feed --------------------------------------------------------------------------
    def consumer(self) -> Callable[[Change], None]:
        """The callback for :meth:`ChangeFeed.subscribe
        <linkguard.topology.changes.ChangeFeed.subscribe>`: it only queues the change (never
        blocks). Starts the writer thread. Raises RuntimeError before :meth:`start_run`."""
        if self.run_id is None:
            raise RuntimeError("Ledger.start_run() first: changes are recorded under a run")
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._writer, name="linkguard-ledger", daemon=True
            )
            self._thread.start()

        def consume(change: Change) -> None:
            if self._closed:
                self.dropped += 1
                return
            try:
                self._queue.put_nowait(change)
            except queue.Full:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.error("ledger_queue_full", dropped=self.dropped, path=str(self.path))

        return consume

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued so far is committed; False after ``timeout`` s."""
        if self._thread is None or not self._thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Flush, stop the writer, mark the run closed, close the file. Idempotent."""
        if self._closed:
            return
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
        self._closed = True
        with self._lock:
            if self.read_only:
                self._conn.close()
                return
            try:
                if self.run_id is not None:
                    self._conn.execute(
                        "UPDATE runs SET window_end = max(window_end, ?), closed = 1,"
                        " duration_s = coalesce(duration_s, max(window_end, ?) - window_start)"
                        " WHERE id = ? AND source = 'service'",
                        (time.time(), time.time(), self.run_id),
                    )
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.error("ledger_close_failed", path=str(self.path), error=str(exc))
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writer(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=HEARTBEAT_S)
                batch = [first]
            except queue.Empty:
                batch = []
            while len(batch) < 20_000:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            changes = [x for x in batch if not isinstance(x, threading.Event | _Stop)]
            try:
                self.write(changes)
            except Exception as exc:  # never let the writer die: the service carries on
                self.write_errors += 1
                log.error(
                    "ledger_write_failed",
                    path=str(self.path),
                    changes=len(changes),
                    error=repr(exc),
                )
            for x in batch:
                if isinstance(x, threading.Event):
                    x.set()
            if any(x is _STOP for x in batch):
                return

    def write(self, changes: list[Change], *, now: float | None = None) -> None:
        """Record ``changes`` in one transaction (the writer thread calls this; tests and
        one-shot tools may call it directly). Also moves the run's window end to ``now`` and
        purges by retention when due."""
        if self.run_id is None or self.builder is None:
            raise RuntimeError("Ledger.start_run() first")
        now = time.time() if now is None else now
        rows: dict[str, list[tuple[object, ...]]] = {t: [] for t in _INSERTS}
        touched: dict[int, Incident] = {}
        saved: dict[int, tuple[int | None, list[PortKey]]] = {}
        initial = None
        if not self._initial_epoch_seen:
            first = next((c for c in changes if c.kind == "plans"), None)
            if first is not None:
                self._initial_epoch_seen = True
                initial = int(first.data.get("epoch", 0))
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                for c in changes:
                    for inc in self._record(c, rows):
                        touched[id(inc)] = inc
                saved = {k: (inc.row_id, list(inc.new_ports)) for k, inc in touched.items()}
                for inc in touched.values():
                    self._write_incident(conn, inc)
                for table, batch in rows.items():
                    if batch:
                        conn.executemany(_INSERTS[table], batch)
                end = max([now, *(c.at for c in changes)])
                conn.execute(
                    "UPDATE runs SET window_end = max(window_end, ?) WHERE id = ?",
                    (end, self.run_id),
                )
                if initial is not None:  # the run's initial build: not a reroute (report)
                    conn.execute(
                        "UPDATE runs SET stats = json_set(stats, '$.initial_epoch', ?)"
                        " WHERE id = ?",
                        (initial, self.run_id),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                for k, (row_id, ports) in saved.items():  # written again with the next batch
                    touched[k].row_id, touched[k].new_ports = row_id, ports
                raise
        self.recorded += len(changes)
        if now - self._last_file_check >= HEARTBEAT_S:
            self._check_file(now)
        if self.retention_days is not None and now - self._last_purge >= PURGE_EVERY_S:
            self.purge(now=now)

    def _check_file(self, now: float) -> None:
        """Log ``ledger_file_replaced`` once when the path no longer names the open file
        (deleted, moved or replaced under the service: its writes go nowhere readable)."""
        self._last_file_check = now
        if self._file_replaced or self._file_id is None or _file_id(self.path) == self._file_id:
            return
        self._file_replaced = True
        log.error(
            "ledger_file_replaced",
            path=str(self.path),
            hint="the ledger file was deleted, moved or replaced while open; what is recorded "
            "now goes to the old file, which nothing can read: restart the service to "
            "open the ledger at this path again",
        )

    def _record(self, c: Change, rows: dict[str, list[tuple[object, ...]]]) -> list[Incident]:
        """Rows for one change into ``rows``; the incidents it touched."""
        assert self.builder is not None
        d, run, at = c.data, self.run_id, c.at
        host = d.get("host") if isinstance(d.get("host"), str) else None
        hca = d.get("hca") if isinstance(d.get("hca"), str) else None
        port = d.get("port") if isinstance(d.get("port"), int) else None
        rail = d.get("rail") if isinstance(d.get("rail"), int) else None
        key = (host, hca, port) if host and hca and port is not None else None
        place = self._places.get(key) if key else None
        if place is not None and place.rail is not None:
            rail = place.rail
        leaf, su = (place.leaf, place.su) if place else (None, None)
        data: dict[str, Any] = d
        touched: list[Incident] = []
        if c.kind == "port" and key is not None:
            data = {k: v for k, v in d.items() if k not in ("counters", "counters_saturated")}
            status = str(d.get("status", "unknown"))
            touched = self.builder.on_status(
                key,
                status,
                at,
                reason=d.get("reason"),
                rail=rail,
            )
            damping = d.get("damping") or {}
            suppressed = bool(damping.get("suppressed", False))
            if suppressed != self._suppressed.get(key, False):
                self._suppressed[key] = suppressed
                rows["suppressions"].append(
                    (
                        run,
                        at,
                        host,
                        hca,
                        port,
                        rail,
                        leaf,
                        su,
                        int(suppressed),
                        int(damping.get("flaps", 0) or 0),
                        float(damping.get("penalty", 0.0) or 0.0),
                    )
                )
        elif c.kind == "port_event" and key is not None:
            previous, current = str(d.get("previous")), str(d.get("current"))
            event_at = float(d.get("at", at) or at)
            rows["port_events"].append(
                (run, event_at, host, hca, port, rail, leaf, su, previous, current, d.get("reason"))
            )
            touched = self.builder.on_status(
                key,
                current,
                at,
                previous=previous,
                reason=d.get("reason"),
                rail=rail,
            )
        elif c.kind == "plans":
            hosts = [h for h in d.get("hosts", []) if isinstance(h, str)]
            peers = d.get("peer_routes", [])
            rows["plans"].append(
                (
                    run,
                    int(d.get("epoch", 0)),
                    at,
                    len(hosts),
                    len(peers) if isinstance(peers, list) else int(peers or 0),
                    d.get("messages"),
                    d.get("solve_ms"),
                )
            )
            touched = self.builder.on_plans(int(d.get("epoch", 0)), hosts, at)
        elif c.kind == "ack" and host:
            result = str(d.get("result"))
            fast = bool(d.get("fast_path", False))
            epoch = int(d.get("epoch", 0))
            rows["acks"].append((run, host, epoch, result, d.get("apply_ms"), int(fast), at))
            touched = self.builder.on_ack(host, epoch, result=result, fast_path=fast, at=at)
        elif c.kind == "audit":
            findings = d.get("findings") or []
            data = {k: v for k, v in d.items() if k != "findings"}
            data["findings_count"] = len(findings)
            for f in findings:
                if not isinstance(f, dict):
                    continue
                subject = str(f.get("subject", ""))
                m = _SUBJECT_PORT.match(subject)
                rows["audit_findings"].append(
                    (
                        run,
                        at,
                        str(f.get("kind", "")),
                        str(f.get("severity", "")),
                        subject,
                        m["host"]
                        if m
                        else (subject if subject in self.builder.host_ports else None),
                        m["hca"] if m else None,
                        int(m["port"]) if m else None,
                        f.get("expected"),
                        f.get("observed"),
                        f.get("detail"),
                    )
                )
        rows["events"].append(
            (run, c.seq, c.kind, at, host, hca, port, rail, leaf, su, json.dumps(data))
        )
        return touched

    def _write_incident(self, conn: sqlite3.Connection, inc: Incident) -> None:
        values = (
            inc.kind,
            inc.down_s,
            len(inc.ports),
            int(inc.isolated),
            int(inc.open),
            inc.reroute,
            inc.reroute_ms,
            inc.cause,
        )
        if inc.row_id is None:
            cur = conn.execute(
                "INSERT INTO outages (run_id, at, at_s, kind, down_s, ports, isolated, open,"
                " reroute, reroute_ms, cause) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (self.run_id, inc.at, round(inc.at - self._run_start, 6), *values),
            )
            inc.row_id = int(cur.lastrowid or 0)
        else:
            conn.execute(
                "UPDATE outages SET kind=?, down_s=?, ports=?, isolated=?, open=?, reroute=?,"
                " reroute_ms=?, cause=? WHERE id=?",
                (*values, inc.row_id),
            )
        if inc.new_ports:
            conn.executemany(
                "INSERT OR IGNORE INTO outage_ports VALUES (?,?,?,?,?,?,?)",
                [
                    (inc.row_id, *k, inc.ports[k].rail, inc.ports[k].leaf, inc.ports[k].su)
                    for k in inc.new_ports
                ],
            )
            inc.new_ports = []

    def purge(self, *, now: float | None = None) -> int:
        """Delete rows older than ``retention_days`` (no-op when None); returns rows deleted."""
        now = time.time() if now is None else now
        self._last_purge = now
        if self.retention_days is None:
            return 0
        cutoff = now - self.retention_days * 86400
        deleted = 0
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                for table in _TIMED:
                    deleted += self._conn.execute(
                        f"DELETE FROM {table} WHERE at < ?", (cutoff,)
                    ).rowcount
                self._conn.execute(
                    "DELETE FROM runs WHERE window_end < ? AND id IS NOT ?", (cutoff, self.run_id)
                )
                self._conn.execute(  # a run still recording keeps no duration (closed sets it)
                    "UPDATE runs SET window_start = ?, duration_s = CASE WHEN duration_s IS NULL"
                    " THEN NULL ELSE window_end - ? END WHERE window_start < ?",
                    (cutoff, cutoff, cutoff),
                )
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._conn.execute("ROLLBACK")
                raise LedgerError(f"ledger {self.path}: retention purge failed: {exc}") from None
        if deleted:
            log.info("ledger_purged", path=str(self.path), rows=deleted, before=iso(cutoff))
        return deleted

    # -- a closed run's rows, written at once (a simulation: linkguard.simulations.ledgerrecord) --
    @property
    def places(self) -> dict[PortKey, PortPlace]:
        """Each port of the current run's fabric -> its rail, leaf and SU (:func:`port_places`;
        empty before :meth:`start_run`)."""
        return self._places

    def write_closed_run(
        self,
        run: int,
        *,
        port_rows: Iterable[tuple[Any, ...]],
        event_rows: Iterable[tuple[Any, ...]],
        outages: Iterable[tuple[tuple[Any, ...], Iterable[PortKey]]],
    ) -> None:
        """Write a whole run's rows in one transaction and close it: ``port_rows`` in the
        ``port_events`` columns (run, at, host, hca, port, rail, leaf, su, previous, current,
        reason), ``event_rows`` in the ``events`` columns (run, seq, kind, at, host, hca, port,
        rail, leaf, su, data JSON), ``outages`` as (``(at, at_s, kind, down_s, ports,
        isolated, open, reroute, reroute_ms, cause)``, the ports it took down; those not in
        :attr:`places` are skipped). Rolls back and re-raises on any error."""
        places = self._places
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                conn.executemany(_INSERTS["port_events"], port_rows)
                conn.executemany(_INSERTS["events"], event_rows)
                for row, keys in outages:
                    cur = conn.execute(
                        "INSERT INTO outages (run_id, at, at_s, kind, down_s, ports, isolated,"
                        " open, reroute, reroute_ms, cause) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (run, *row),
                    )
                    conn.executemany(
                        "INSERT OR IGNORE INTO outage_ports VALUES (?,?,?,?,?,?,?)",
                        [
                            (cur.lastrowid, *k, places[k].rail, places[k].leaf, places[k].su)
                            for k in keys
                            if k in places
                        ],
                    )
                conn.execute("UPDATE runs SET closed = 1 WHERE id = ?", (run,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # -- queries --------------------------------------------------------------------------------
    def events(
        self,
        *,
        host: str | None = None,
        rail: int | None = None,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[int, list[dict[str, Any]]]:
        """The recorded changes, newest first: ``(total matching, page)``. Filters: ``host``,
        ``rail``, ``kind`` (one of :data:`EVENT_KINDS`), ``since`` (inclusive) / ``until``
        (exclusive) in Unix s. Each item: ``id``, ``seq`` (the service's change number, None
        for a simulation), ``kind``, ``at``, ``host``, ``hca``, ``port``, ``rail``, ``leaf``,
        ``su``, ``data``. Raises ValueError for a negative ``limit``/``offset``, an unknown
        kind or ``since`` after ``until``."""
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an integer >= 0, got {offset!r}")
        if kind is not None and kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(EVENT_KINDS)}")
        if since is not None and until is not None and since > until:
            raise ValueError(f"since ({since}) is after until ({until})")
        where: list[str] = []
        args: list[str | int | float] = []
        for col, value in (("host", host), ("rail", rail), ("kind", kind)):
            if value is not None:
                where.append(f"{col} = ?")
                args.append(value)
        if since is not None:
            where.append("at >= ?")
            args.append(since)
        if until is not None:
            where.append("at < ?")
            args.append(until)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._reader() as conn:
            total = conn.execute(f"SELECT count(*) FROM events{clause}", args).fetchone()[0]
            rows = conn.execute(
                "SELECT id, seq, kind, at, host, hca, port, rail, leaf, su, data FROM events"
                f"{clause} ORDER BY at DESC, id DESC LIMIT ? OFFSET ?",
                [*args, limit, offset],
            ).fetchall()
        out = []
        for r in rows:
            item = dict(r)
            item["data"] = json.loads(item["data"])
            out.append(item)
        return int(total), out

    def report(
        self,
        *,
        price_per_gpu_hour: float = 2.0,
        since: float | None = None,
        until: float | None = None,
        now: float | None = None,
        transports: Iterable[str] | None = None,
        model_overrides: Mapping[str, Any] | None = None,
    ) -> LedgerReport:
        """The interruption report over ``[since, until)`` (Unix s; default: the runs'
        whole window), clamped to what the runs recorded; a service run still recording
        reaches ``now`` (default the clock); priced on ``transports`` (default all of
        :data:`linkguard.jobcost.TRANSPORTS`) with the newest run's job model and
        ``model_overrides`` (:func:`linkguard.ledgerreport.build_report`). Raises ValueError
        for a negative or non-finite price, a time outside 0 .. :data:`MAX_TIME`, ``since``
        not before ``until``, an unknown transport or an override the model refuses;
        :class:`NoRunError` when no run overlaps the window; :class:`LedgerError` when the
        ledger cannot be read or its runs hold values no run can have (naming row and field).
        """
        from linkguard.ledgerreport import build_report

        with self._reader() as conn:
            return build_report(
                conn,
                path=str(self.path),
                price_per_gpu_hour=price_per_gpu_hour,
                since=since,
                until=until,
                now=time.time() if now is None else now,
                model_overrides=model_overrides,
                **({} if transports is None else {"transports": transports}),
            )

    def count(self, table: str) -> int:
        """Rows in ``table`` (one of the ledger's tables; for tests and tools)."""
        if table not in (*_TIMED, "runs", "outage_ports"):
            raise ValueError(f"unknown table {table!r}")
        with self._reader() as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


_INSERTS = {
    "events": "INSERT INTO events (run_id, seq, kind, at, host, hca, port, rail, leaf, su, data)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "port_events": "INSERT INTO port_events (run_id, at, host, hca, port, rail, leaf, su,"
    " previous, current, reason) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "suppressions": "INSERT INTO suppressions (run_id, at, host, hca, port, rail, leaf, su,"
    " suppressed, flaps, penalty) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "plans": "INSERT INTO plans (run_id, epoch, at, hosts, peer_routes, messages, solve_ms)"
    " VALUES (?,?,?,?,?,?,?)",
    "acks": "INSERT INTO acks (run_id, host, epoch, result, apply_ms, fast_path, at)"
    " VALUES (?,?,?,?,?,?,?)",
    "audit_findings": "INSERT INTO audit_findings (run_id, at, kind, severity, subject, host,"
    " hca, port, expected, observed, detail) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
}
