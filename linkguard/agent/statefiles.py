"""The agent's state files in ``state_dir``, read at start and written as effects ask.

Consumes: the port monitor (:class:`~linkguard.agent.monitor.PortMonitor`, restored into and
read from), times passed in (``now`` monotonic s, ``wall`` Unix s). Produces: ``damping.json``
(flap history: a restart must not bypass a hold-down), ``counter_health.json`` (counter-health
verdicts and reference rates, format version :data:`HEALTH_STATE_VERSION`), ``term`` (the
highest leader term seen) and ``events.json`` (the port event journal,
:mod:`linkguard.agent.journal`). Every read or write failure is logged, never raised: the agent runs
on without the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

import structlog

from linkguard.agent.journal import EventJournal
from linkguard.agent.monitor import PortMonitor
from linkguard.atomicfile import atomic_write

__all__ = ["HEALTH_STATE_VERSION", "StateFiles"]

log = structlog.get_logger(__name__)

#: format of ``state_dir/counter_health.json`` (:meth:`StateFiles.restore_health`)
HEALTH_STATE_VERSION = 1


class StateFiles:
    """``state_dir``'s flap history, counter health and term files of one agent."""

    def __init__(
        self, state_dir: Path, *, monitor: PortMonitor, counter_health_enabled: bool
    ) -> None:
        self.monitor = monitor
        self.counter_health_enabled = counter_health_enabled
        self.history_path = state_dir / "damping.json"
        self.health_path = state_dir / "counter_health.json"
        self.term_path = state_dir / "term"
        self.journal_path = state_dir / "events.json"
        # (counter verdicts, reference rates) last written; None: the file needs a rewrite
        self._health_saved: tuple[dict[str, str], dict[str, float]] | None = None
        #: verdicts of counter_health.json kept as they are while counter health is disabled
        self._health_kept: dict[str, dict[str, object]] = {}

    def restore_history(self, *, now: float, wall: float) -> None:
        """Flap history of the previous run: a restart must not bypass a hold-down."""
        try:
            doc = json.loads(self.history_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("damping_history_unreadable", path=str(self.history_path), error=str(exc))
            return
        if not isinstance(doc, dict):
            log.warning(
                "damping_history_unreadable",
                path=str(self.history_path),
                error="not a JSON object",
            )
            return
        restored = self.monitor.restore(doc, now=now, wall=wall)
        if restored:
            log.info("damping_history_restored", ports=restored)

    def restore_health(self, *, now: float, wall: float) -> None:
        """Counter-health verdicts and reference rates of the previous run
        (``state_dir/counter_health.json``, ``{"version": 1, "ports": {"hca/port": {"reason":
        ..., "since": <Unix s>}}, "rates": {"hca/port": <Gb/s>}}``; ``rates`` may be absent): a
        restart must not clear a port degraded on its error counters, nor make a port that
        retrained to a lower rate look healthy at that rate. The clear timer restarts at load
        (``clear_after_s`` of clean readings after the restart, see
        :meth:`PortMonitor.restore_health`). A missing file: nothing to restore; an unreadable
        one is logged and the agent starts clean; a corrupt or unknown-version one (a newer
        agent's) is also moved aside to ``counter_health.json.bad`` before this agent writes
        its own (``counter_health_state_moved_aside``). With ``counter_health.enabled`` false
        the file's verdicts are kept in it as they are (``counter_health_verdicts_kept``), for
        when counter health is on again."""
        try:
            doc = json.loads(self.health_path.read_text())
        except FileNotFoundError:
            self._health_saved = ({}, {})  # nothing to write until a port degrades or a
            # reference rate is learnt
            return
        except ValueError as exc:  # not JSON, not UTF-8
            log.warning(
                "counter_health_state_unreadable", path=str(self.health_path), error=str(exc)
            )
            self._move_health_aside()
            return
        except OSError as exc:  # EIO, EACCES: the file may be fine; it is rewritten as is
            log.warning(
                "counter_health_state_unreadable", path=str(self.health_path), error=str(exc)
            )
            return
        version = doc.get("version") if isinstance(doc, dict) else None
        ports = doc.get("ports") if isinstance(doc, dict) else None
        rates = doc.get("rates", {}) if isinstance(doc, dict) else None
        known = version == HEALTH_STATE_VERSION and not isinstance(version, bool)  # true == 1
        if not known or not isinstance(ports, dict) or not isinstance(rates, dict):
            error = (
                f"unknown version {version!r} (this agent reads {HEALTH_STATE_VERSION})"
                if isinstance(doc, dict) and not known
                else "not a JSON object with a ports object (and a rates object, if any)"
            )
            log.warning(
                "counter_health_state_unreadable", path=str(self.health_path), error=error[:200]
            )
            self._move_health_aside()
            return
        restored = self.monitor.restore_health(ports, now=now, wall=wall)
        if restored:
            log.info("counter_health_restored", ports=restored)
        if not self.counter_health_enabled and ports:
            self._health_kept = {
                k: v
                for k, v in ports.items()
                if isinstance(v, dict) and isinstance(v.get("reason"), str)
            }
            restored = list(self._health_kept)  # kept: not rewritten for them
            log.info(
                "counter_health_verdicts_kept",
                ports=sorted(self._health_kept)[:64],
                why="counter_health is disabled: the verdicts are kept in the file, not "
                "applied, and restored when it is enabled again",
            )
        rates_restored = self.monitor.restore_reference_rates(rates)
        if rates_restored:
            log.info("reference_rates_restored", rates={k: rates[k] for k in rates_restored})
        if len(restored) == len(ports) and len(rates_restored) == len(rates):
            # else rewrite the file without what was ignored
            self._health_saved = (
                {k: str(ports[k]["reason"]) for k in restored},
                {k: float(rates[k]) for k in rates_restored},
            )

    def _move_health_aside(self) -> None:
        """Rename a counter_health.json this agent cannot read to ``.bad`` (replacing an older
        one), so the next write loses nothing a person (or a newer agent) may want."""
        aside = self.health_path.with_name(self.health_path.name + ".bad")
        try:
            os.replace(self.health_path, aside)
        except OSError as exc:
            log.warning(
                "counter_health_state_not_moved", path=str(self.health_path), error=str(exc)
            )
            return
        log.warning("counter_health_state_moved_aside", path=str(self.health_path), to=str(aside))

    def save_health(self, *, now: float, wall: float) -> None:
        """Write the counter-health verdicts and reference rates when they changed since the
        last write (with counter health disabled, the verdicts read at start as they were)."""
        ports = {
            **self._health_kept,
            **self.monitor.health_history(now=now, wall=wall),
        }
        rates = self.monitor.reference_rates()
        verdicts = ({k: str(v["reason"]) for k, v in ports.items()}, rates)
        if verdicts == self._health_saved:
            return
        doc = {"version": HEALTH_STATE_VERSION, "ports": ports, "rates": rates}
        try:
            atomic_write(self.health_path, json.dumps(doc), mode=0o600)
        except OSError as exc:
            log.warning(
                "counter_health_state_not_saved", path=str(self.health_path), error=str(exc)
            )
            return
        self._health_saved = verdicts

    def save_history(self, *, now: float, wall: float) -> None:
        try:
            atomic_write(
                self.history_path,
                json.dumps(self.monitor.history(now=now, wall=wall)),
                mode=0o600,
            )
        except OSError as exc:
            log.warning("damping_history_not_saved", path=str(self.history_path), error=str(exc))

    def read_term(self) -> int:
        """The term file's value; 0 when there is none or it is unreadable (logged)."""
        try:
            return int(self.term_path.read_text().strip())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            log.warning("term_unreadable", path=str(self.term_path), error=str(exc)[:200])
            return 0

    def save_term(self, term: int) -> None:
        """Write ``term`` (a failure is logged)."""
        try:
            atomic_write(self.term_path, f"{term}\n", mode=0o600)
        except OSError as exc:
            log.warning("term_not_saved", path=str(self.term_path), error=str(exc)[:200])

    def load_journal(self, *, limit: int, host: str) -> EventJournal:
        """The event journal of the previous run (numbering goes on, unconfirmed events are
        replayed); a new one (new random id, numbering from 1) when there is none. An
        unreadable or corrupt file is logged (``event_journal_unreadable``) and moved aside
        to ``events.json.bad``: the service then sees a new journal, never a reused number."""
        try:
            doc = json.loads(self.journal_path.read_text())
            journal = EventJournal.from_doc(doc, limit=limit, host=host)
        except FileNotFoundError:
            return EventJournal(secrets.token_hex(8), limit=limit)
        except (OSError, ValueError) as exc:
            log.warning(
                "event_journal_unreadable",
                path=str(self.journal_path),
                error=str(exc)[:200],
                action="moved aside to events.json.bad; a new journal starts",
            )
            with contextlib.suppress(OSError):
                os.replace(self.journal_path, self.journal_path.with_name("events.json.bad"))
            return EventJournal(secrets.token_hex(8), limit=limit)
        log.info(
            "event_journal_restored",
            journal=journal.journal,
            next_seq=journal.next_seq,
            held=len(journal.held),
        )
        return journal

    def save_journal(self, journal: EventJournal) -> None:
        """Write the event journal (a failure is logged; the journal lives on in memory)."""
        try:
            atomic_write(self.journal_path, json.dumps(journal.to_doc()), mode=0o600)
        except OSError as exc:
            log.warning("event_journal_not_saved", path=str(self.journal_path), error=str(exc))
