"""The ledger's SQLite file: its tables, how it is opened and checked, and its errors.

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
  agent's time of the transition; ``journal`` / ``seq``: its number in the agent's event
  journal, unique per host: a replayed event is recorded once; NULL for an agent without);
- ``journal_gaps``: numbers of an agent's journal that are missing for good (``seq_from`` ..
  ``seq_to``; the journal's bound was passed before the service confirmed them);
- ``suppressions``: a port's damping suppression turning on or off (``flaps``, ``penalty``);
- ``plans`` (epoch, hosts re-planned, peer routes, messages, ``solve_ms``) and ``acks`` (host,
  epoch, result, ``apply_ms``, ``fast_path``);
- ``audit_findings``: one row per finding of each new fleet audit;
- ``outages`` and ``outage_ports``: incidents, the unit the job cost model works on
  (:mod:`linkguard.incidents`).

Opening (:func:`connect`): WAL mode, ``synchronous=NORMAL``, foreign keys on; a new file gets
the schema and :data:`SCHEMA_VERSION`; an existing one must carry a ``meta`` table with that
version. :func:`open_read_only` opens with SQLite's ``mode=ro`` (and ``immutable`` when no writer
has the file open), so reading never creates or changes a file.

Consumes: a path. Produces: an ``sqlite3.Connection`` (autocommit mode: callers ``BEGIN`` and
``COMMIT``), the SQL the writer uses (:data:`INSERTS`), :class:`LedgerError` /
:class:`NoRunError`, and a run's job model to and from JSON (:func:`model_json`,
:func:`model_from_json`). Used by :mod:`linkguard.ledger` (the writer and queries) and by the
report (:mod:`linkguard.ledgerrows`, :mod:`linkguard.ledgerreport`), which therefore do not
import the ledger itself.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import structlog

from linkguard.failuremodel import FailureModel

__all__ = [
    "EVENT_KINDS",
    "HEARTBEAT_S",
    "INSERTS",
    "MIGRATIONS",
    "PURGE_EVERY_S",
    "SCHEMA_SQL",
    "SCHEMA_VERSION",
    "TIMED_TABLES",
    "LedgerError",
    "NoRunError",
    "check_path",
    "connect",
    "file_id",
    "model_from_json",
    "model_json",
    "open_read_only",
]

log = structlog.get_logger(__name__)

#: The ledger's schema version (``meta.schema_version``). 2: ``port_events.journal`` /
#: ``seq`` (unique per host) and ``journal_gaps``; a version 1 file is migrated when a
#: service opens it for writing (:data:`MIGRATIONS`), read as it is by the report.
SCHEMA_VERSION = 2

#: Change kinds the ledger records (those of :mod:`linkguard.topology.changes`).
EVENT_KINDS = ("port", "port_event", "journal_gap", "host", "plans", "ack", "audit", "health")

#: Retention purge interval and the window end heartbeat of a running service (s).
PURGE_EVERY_S = 3600.0
HEARTBEAT_S = 30.0

#: The tables (SQLite DDL) of :data:`SCHEMA_VERSION`.
#: the journal_gaps table (schema 2): in the full schema and in the migration to 2
_JOURNAL_GAPS_SQL = """
CREATE TABLE journal_gaps (
    id INTEGER PRIMARY KEY,
    run_id INTEGER,
    at REAL NOT NULL,
    host TEXT NOT NULL, journal TEXT NOT NULL,
    seq_from INTEGER NOT NULL, seq_to INTEGER NOT NULL,
    UNIQUE (host, journal, seq_from)
);
CREATE INDEX journal_gaps_at ON journal_gaps (at);
"""

SCHEMA_SQL = """
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
    previous TEXT NOT NULL, current TEXT NOT NULL, reason TEXT,
    journal TEXT, seq INTEGER
);
CREATE INDEX port_events_at ON port_events (at);
CREATE UNIQUE INDEX port_events_journal ON port_events (host, journal, seq);
{journal_gaps}CREATE TABLE suppressions (
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
""".replace("{journal_gaps}", _JOURNAL_GAPS_SQL)

#: SQL that takes a file of the version before each version to it, by the version it reaches.
MIGRATIONS = {
    2: """
ALTER TABLE port_events ADD COLUMN journal TEXT;
ALTER TABLE port_events ADD COLUMN seq INTEGER;
CREATE UNIQUE INDEX port_events_journal ON port_events (host, journal, seq);
{journal_gaps}""".replace("{journal_gaps}", _JOURNAL_GAPS_SQL),
}

#: Tables whose rows carry ``at`` (retention deletes by it).
TIMED_TABLES = (
    "events",
    "journal_gaps",
    "port_events",
    "suppressions",
    "plans",
    "acks",
    "audit_findings",
    "outages",
)


class LedgerError(Exception):
    """A file that cannot be used as a ledger; the message names the path and why."""


class NoRunError(LedgerError):
    """The ledger is readable but has no run in the asked window (nothing to report)."""


def model_json(model: FailureModel | None) -> str:
    """A run's ``model`` column: ``model``'s fields as JSON (None: the defaults)."""
    return json.dumps(asdict(model or FailureModel()))


def model_from_json(text: str) -> FailureModel:
    """A :class:`~linkguard.failuremodel.FailureModel` from a run's ``model`` JSON
    (fields it does not know are ignored; missing ones take their defaults)."""
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


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_path(path: Path, *, create: bool) -> None:
    """Raise :class:`LedgerError` when ``path`` cannot be a ledger: a directory, or missing
    (and not ``create``, or its parent is not a directory)."""
    p = path
    if p.is_dir():
        raise LedgerError(f"ledger {p} is a directory; give a file path")
    if not p.exists():
        if not create:
            raise LedgerError(f"no ledger at {p}")
        if not p.parent.is_dir():
            raise LedgerError(f"cannot create ledger {p}: {p.parent} is not a directory")


def open_read_only(path: Path, *, was_open: bool = False) -> sqlite3.Connection:
    """A ``mode=ro`` connection (``immutable`` too when no writer has the file open: no
    ``-wal`` beside it); never creates or changes a file. ``was_open``: the ledger had the
    file open before (the error says it went away). Raises :class:`LedgerError`."""
    p = path
    if not p.is_file():
        gone = " (deleted or moved since it was opened)" if was_open else ""
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


def connect(path: Path, *, create: bool, read_only: bool) -> sqlite3.Connection:
    """Open, switch to WAL, create or check the schema (read-only: only check it)."""
    p = path
    if read_only:
        conn = open_read_only(path)
    else:
        try:
            conn = sqlite3.connect(p, timeout=10, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open ledger {p}: {exc}") from None
    try:
        if not read_only:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LedgerError(f"ledger {p}: SQLite refused WAL mode (journal mode {mode})")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            if not create:
                raise LedgerError(f"{p} is not a linkguard ledger (an empty database)")
            conn.executescript(
                "BEGIN;"
                + SCHEMA_SQL
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
            if version < 1:
                raise LedgerError(f"ledger {p} has unknown old schema version {version}")
            if version < SCHEMA_VERSION and not read_only:
                _migrate(conn, version)
                log.info("ledger_migrated", path=str(p), schema_from=version, to=SCHEMA_VERSION)
    except LedgerError:
        conn.close()
        raise
    except sqlite3.Error as exc:
        conn.close()
        raise LedgerError(f"cannot use {p} as a ledger: {exc}") from None
    return conn


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Take a writable file from schema ``version`` to :data:`SCHEMA_VERSION`, one step per
    version, in one transaction."""
    script = "".join(MIGRATIONS[v] for v in range(version + 1, SCHEMA_VERSION + 1))
    conn.executescript(
        "BEGIN;"
        + script
        + f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema_version';"
        + "COMMIT;"
    )


#: The writer's INSERT statements, by table.
INSERTS = {
    "events": "INSERT INTO events (run_id, seq, kind, at, host, hca, port, rail, leaf, su, data)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    # a journaled event (host, journal, seq) already recorded is ignored: replays are
    # recorded once
    "port_events": "INSERT OR IGNORE INTO port_events (run_id, at, host, hca, port, rail,"
    " leaf, su, previous, current, reason, journal, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "journal_gaps": "INSERT OR IGNORE INTO journal_gaps (run_id, at, host, journal, seq_from,"
    " seq_to) VALUES (?,?,?,?,?,?)",
    "suppressions": "INSERT INTO suppressions (run_id, at, host, hca, port, rail, leaf, su,"
    " suppressed, flaps, penalty) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "plans": "INSERT INTO plans (run_id, epoch, at, hosts, peer_routes, messages, solve_ms)"
    " VALUES (?,?,?,?,?,?,?)",
    "acks": "INSERT INTO acks (run_id, host, epoch, result, apply_ms, fast_path, at)"
    " VALUES (?,?,?,?,?,?,?)",
    "audit_findings": "INSERT INTO audit_findings (run_id, at, kind, severity, subject, host,"
    " hca, port, expected, observed, detail) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
}
