"""Whole-file writes that readers never see half done: :func:`atomic_write`.

Consumes: a path and its new content (text or bytes). Produces: that file, replaced in one
``rename(2)`` (POSIX: a reader opens the old file or the new one, never a mix), fsynced first.
Used by the agent's applier (plan, rail map), the agent's state files and :mod:`linkguard.nccl`'s
rendered job files; it lives here, under both, so neither imports the other for it.

The agent runs as root and writes into directories a job may share (the runtime directory), so
no write follows a link (issue 21): the temporary file has an unpredictable name (64 random
bits, ``secrets.token_hex``) and is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a link
or file planted at any name is refused (``open(2)``: ``O_EXCL`` fails with EEXIST on an
existing name, a symlink included), never written through; ``rename(2)`` then replaces a
symlink planted at the target itself rather than the file it points to.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["atomic_write"]

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def atomic_write(path: Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename: readers see the old or the
    new content, never a mix. ``mode``: the rail map is world-readable (jobs read it). OSError
    as ``open``/``write``/``fsync``/``rename`` raise it (ENOSPC, EIO, EROFS, ...); the
    temporary file is gone then and ``path`` keeps its old content."""
    # a random name per write, not mkstemp (its name generator and retry loop cost more than
    # the write at 256 agents): 8 random bytes from os.urandom are cheap and unguessable
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        fd = os.open(tmp, _FLAGS, mode)
    except FileNotFoundError:  # the first write there
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, _FLAGS, mode)
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
