"""Whole-file writes that readers never see half done: :func:`atomic_write`.

Consumes: a path and its new content (text or bytes). Produces: that file, replaced in one
``rename(2)`` (POSIX: a reader opens the old file or the new one, never a mix), fsynced first.
Used by the agent's applier (plan, rail map), the agent's state files and :mod:`linkguard.nccl`'s
rendered job files; it lives here, under both, so neither imports the other for it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename: readers see the old or the
    new content, never a mix. ``mode``: the rail map is world-readable (jobs read it)."""
    # one writer per file (the agent's event loop): a fixed temporary name per process, not
    # mkstemp's random one (its name generator cost more than the write at 256 agents)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileNotFoundError:  # the first write there
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, flags, mode)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
