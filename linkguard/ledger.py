"""The interruption ledger: what happened to the fabric, kept in SQLite for the report, the HTTP
API's event timeline and the dashboard.

Consumes: the topology service's change feed (:class:`~linkguard.topology.changes.Change`, through
the callback :meth:`Ledger.consumer` returns), or one fleet simulation's rows
(:meth:`Ledger.write_closed_run`, from :func:`linkguard.simulations.ledgerrecord.record_simulation`:
the generated timeline and the simulator's report).
Produces: a SQLite file (stdlib ``sqlite3``, WAL mode) and the queries :meth:`Ledger.events`
(the paged timeline) and :meth:`Ledger.report` (:class:`~linkguard.ledgerreport.LedgerReport`).

Tables: :mod:`linkguard.ledgerfile` (which opens and checks the file). Incidents, the unit the
job cost model works on: :mod:`linkguard.incidents` (built in the writer thread from the live
feed; each change's rows: :mod:`linkguard.changerows`). The report: :mod:`linkguard.ledgerreport`.

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
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from linkguard.changerecord import ChangeRecord
from linkguard.changerows import ChangeRows, Rows, write_incident
from linkguard.failuremodel import FailureModel
from linkguard.incidents import (
    FabricInventory,
    Incident,
    IncidentBuilder,
    PortKey,
    PortPlace,
    port_places,
)
from linkguard.ledgerfile import (
    EVENT_KINDS,
    HEARTBEAT_S,
    INSERTS,
    PURGE_EVERY_S,
    SCHEMA_VERSION,
    TIMED_TABLES,
    LedgerError,
    NoRunError,
    check_path,
    connect,
    file_id,
    model_from_json,
    model_json,
    open_read_only,
)
from linkguard.ledgerreport import LedgerReport, build_report
from linkguard.timestamps import MAX_TIME, iso, parse_time

# the names this module had before it was split (callers and tests import them from here)
__all__ = [
    "EVENT_KINDS",
    "HEARTBEAT_S",
    "MAX_TIME",
    "SCHEMA_VERSION",
    "Incident",
    "IncidentBuilder",
    "Ledger",
    "LedgerError",
    "NoRunError",
    "PortKey",
    "PortPlace",
    "iso",
    "model_from_json",
    "parse_time",
    "port_places",
]

log = structlog.get_logger(__name__)


class _Stop:
    pass


_STOP = _Stop()


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
        check_path(self.path, create=create)
        self._lock = threading.Lock()
        self._conn = connect(self.path, create=create, read_only=read_only)
        self.run_id: int | None = None
        self._run_start = 0.0
        self._places: dict[PortKey, PortPlace] = {}
        self.builder: IncidentBuilder | None = None
        self._rows: ChangeRows | None = None
        # changes to write; a flush's Event (set once written); _STOP
        self._queue: queue.Queue[ChangeRecord | threading.Event | _Stop] = queue.Queue(
            maxsize=max(1, queue_size)
        )
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_purge = 0.0
        self._file_id = None if read_only else file_id(self.path)
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
    def _open_read_only(self) -> sqlite3.Connection:
        return open_read_only(self.path, was_open=hasattr(self, "_conn"))

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
        fabric: FabricInventory,
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
                    model_json(model),
                    json.dumps(stats or {}),
                ),
            )
            self.run_id = int(cur.lastrowid or 0)
        self._rows = ChangeRows(self.run_id, self._places, self.builder)
        return self.run_id

    # -- the live feed --------------------------------------------------------------------------
    def consumer(self) -> Callable[[ChangeRecord], None]:
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

        def consume(change: ChangeRecord) -> None:
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

    def write(self, changes: Sequence[ChangeRecord], *, now: float | None = None) -> None:
        """Record ``changes`` in one transaction (the writer thread calls this; tests and
        one-shot tools may call it directly). Also moves the run's window end to ``now`` and
        purges by retention when due."""
        if self.run_id is None or self._rows is None:
            raise RuntimeError("Ledger.start_run() first")
        run_id, recorder = self.run_id, self._rows
        now = time.time() if now is None else now
        rows: Rows = {t: [] for t in INSERTS}
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
                    if self._recorded_before(conn, c):
                        continue  # a replayed event an earlier run recorded
                    for inc in recorder.record(c, rows):
                        touched[id(inc)] = inc
                saved = {k: (inc.row_id, list(inc.new_ports)) for k, inc in touched.items()}
                for inc in touched.values():
                    write_incident(conn, inc, run_id=run_id, run_start=self._run_start)
                for table, batch in rows.items():
                    if batch:
                        conn.executemany(INSERTS[table], batch)
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

    def _recorded_before(self, conn: sqlite3.Connection, c: ChangeRecord) -> bool:
        """``c`` is a journaled port event already in ``port_events`` (recorded by an earlier
        run: a service restarted between recording it and its agent hearing so)."""
        key = ChangeRows.journal_key(c)
        if key is None or (self._rows is not None and key in self._rows.journaled):
            return False
        found = conn.execute(
            "SELECT 1 FROM port_events WHERE host = ? AND journal = ? AND seq = ?", key
        ).fetchone()
        return found is not None

    def _check_file(self, now: float) -> None:
        """Log ``ledger_file_replaced`` once when the path no longer names the open file
        (deleted, moved or replaced under the service: its writes go nowhere readable)."""
        self._last_file_check = now
        if self._file_replaced or self._file_id is None or file_id(self.path) == self._file_id:
            return
        self._file_replaced = True
        log.error(
            "ledger_file_replaced",
            path=str(self.path),
            hint="the ledger file was deleted, moved or replaced while open; what is recorded "
            "now goes to the old file, which nothing can read: restart the service to "
            "open the ledger at this path again",
        )

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
                for table in TIMED_TABLES:
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
        reason, journal, seq), ``event_rows`` in the ``events`` columns (run, seq, kind, at,
        host, hca, port, rail, leaf, su, data JSON), ``outages`` as (``(at, at_s, kind,
        down_s, ports, isolated, open, reroute, reroute_ms, cause)``, the ports it took down;
        those not in :attr:`places` are skipped). Rolls back and re-raises on any error."""
        places = self._places
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                conn.executemany(INSERTS["port_events"], port_rows)
                conn.executemany(INSERTS["events"], event_rows)
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
        if table not in (*TIMED_TABLES, "runs", "outage_ports"):
            raise ValueError(f"unknown table {table!r}")
        with self._reader() as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
