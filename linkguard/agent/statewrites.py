"""What happens when the agent cannot write its state files: :class:`StateWrites`.

Consumes: the writes of ``state_dir``'s files (the last plan, peer routes, flap history,
counter health, term), each named by a ``file`` label. Produces: the file written
(:func:`~linkguard.atomicfile.atomic_write`: no link followed) or, when the disk refuses it
(ENOSPC, EIO, EROFS, EDQUOT, ...: any ``OSError``), a failure that is logged once per streak
(``state_write_failed``, with the errno's name), counted per file
(``linkguard_state_write_failures_total{file}``) and remembered in :attr:`StateWrites.failing`
until a write of that file succeeds again (``state_write_recovered``). The agent then keeps
routing from memory: a state file only matters at the next start (issue 21: a full state disk
ended the agent at the next peer-routes message, and every restart died the same way). While
:attr:`StateWrites.failing` is not empty the agent's retained
:class:`~linkguard.models.HostStatus` says ``state_write_failing: true``, so the service shows
the host as degraded rather than current.
"""

from __future__ import annotations

import errno
from collections import Counter
from pathlib import Path

import structlog

from linkguard.atomicfile import atomic_write

__all__ = ["StateWrites"]

log = structlog.get_logger(__name__)


class StateWrites:
    """The agent's writes of its state files, failures counted (module docstring)."""

    def __init__(self) -> None:
        #: failed writes since start, per file label (``plan``, ``peer_routes``, ...)
        self.failures: Counter[str] = Counter()
        #: files whose last write failed -> the errno's name (``ENOSPC``, ``EIO``, ...)
        self.failing: dict[str, str] = {}

    def write(self, file: str, path: Path, data: str | bytes, *, mode: int = 0o600) -> bool:
        """Write ``data`` to ``path`` (``file``: its label in logs and metrics); True when
        written, False when the disk refused it (logged when the file starts failing, always
        counted). Never raises an ``OSError``."""
        try:
            atomic_write(path, data, mode=mode)
        except OSError as exc:
            self.failures[file] += 1
            name = errno.errorcode.get(exc.errno or 0, "unknown")
            if file not in self.failing:
                log.error(
                    "state_write_failed",
                    file=file,
                    path=str(path),
                    errno=name,
                    error=str(exc)[:200],
                    hint="free space on (or repair) the state_dir's filesystem; the agent "
                    "keeps routing from memory but this file is not current for a restart",
                )
            self.failing[file] = name
            return False
        if self.failing.pop(file, None) is not None:
            log.info("state_write_recovered", file=file, path=str(path))
        return True
