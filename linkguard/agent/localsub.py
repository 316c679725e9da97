"""Local subscription: the rail map streamed over a Unix socket on the host, so a job launcher
or a training framework can follow it without broker credentials.

Consumes: the change documents of :class:`~linkguard.agent.railmap.RailChanges` through
:meth:`RailMapServer.publish` (never blocks) and, for each new subscriber, the current one.
Produces: on ``rails_socket.path`` (a stream socket, mode 0660, group ``rails_socket.group``), per
subscriber one JSON object per line (UTF-8, ``\\n``-terminated): first the current rail map
(``"kind": "current"``; ``seq`` 0 and reason ``none`` before the first change), then every
change in order (``"kind": "change"``, ``seq`` counting up by one); the documents are
``linkguard.rail-change/v1`` (:mod:`linkguard.agent.railmap`). Subscribers only read; what
they send is ignored.

A subscriber that falls more than ``rails_socket.queue`` changes behind (it stopped reading)
is cut: it gets, after what it had been sent, one last line ``{"kind": "error", "error":
"slow_consumer", ...}`` and the connection closes (aborted after :data:`CLOSE_GRACE_S` if it
does not read that either); the agent never waits for it. Reconnecting gives the current map
again. Beyond :data:`MAX_SUBSCRIBERS` at once a new one gets ``"error": "too_many_subscribers"``.

The socket is bound under a temporary name in the same directory, given its mode and group,
then renamed into place (never connectable with looser permissions). A socket file left at
the path by a process that is gone (connection refused) is removed at start; a live one, or a
file that is not a socket, is left alone and the server does not start (logged as
``rails_socket_unavailable``; the agent goes on without it). The file is removed at stop when
it is still this server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import select
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import structlog

from linkguard.config import ConfigError

__all__ = ["CLOSE_GRACE_S", "MAX_SUBSCRIBERS", "RailMapServer", "SocketStats", "follow"]

log = structlog.get_logger(__name__)

#: A cut subscriber's connection is aborted when it has not read its last line after this (s).
CLOSE_GRACE_S = 5.0
#: Subscribers at once; one more is refused with an error line.
MAX_SUBSCRIBERS = 64
#: Longest line a subscriber reads (:func:`follow`); a 64-GPU host's document is about 5 KB.
MAX_LINE_BYTES = 1 << 20


class SocketStats:
    """Counters: ``connected`` (subscribers accepted), ``dropped`` (cut as slow),
    ``refused`` (over :data:`MAX_SUBSCRIBERS`), ``published`` (changes)."""

    def __init__(self) -> None:
        self.connected = 0
        self.dropped = 0
        self.refused = 0
        self.published = 0


class _Client:
    def __init__(self, writer: asyncio.StreamWriter, size: int) -> None:
        self.writer = writer
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=size)
        self.task: asyncio.Task[Any] | None = None
        self.ended: str | None = None  # why this server ended it: "slow_consumer", "gone"


def _line(doc: dict[str, Any], kind: str) -> bytes:
    return json.dumps({**doc, "kind": kind}, separators=(",", ":")).encode() + b"\n"


class RailMapServer:
    """The subscription socket at ``path``. ``current()`` gives the document a new subscriber
    gets first. ``await serve()`` in a task (cancel it to stop); :attr:`ready` is set once the
    socket accepts connections."""

    def __init__(
        self,
        path: Path,
        *,
        current: Callable[[], dict[str, Any]],
        group: str | None = None,
        queue: int = 256,
        mode: int = 0o660,
        close_grace_s: float = CLOSE_GRACE_S,
        max_subscribers: int = MAX_SUBSCRIBERS,
    ) -> None:
        self.path = path
        self.current = current
        self.group = group
        self.queue = queue
        self.mode = mode
        self.close_grace_s = close_grace_s
        self.max_subscribers = max_subscribers
        self.stats = SocketStats()
        self.ready = asyncio.Event()
        self._clients: set[_Client] = set()
        self._cut_clients: set[_Client] = set()  # cut, their last line on its way
        self._ino: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket file bound

    @property
    def subscribers(self) -> int:
        return len(self._clients)

    def publish(self, change: dict[str, Any]) -> None:
        """Queue ``change`` for every subscriber (never blocks); one that is full is cut."""
        self.stats.published += 1
        if not self._clients:
            return
        line = _line(change, "change")
        for c in list(self._clients):
            try:
                c.queue.put_nowait(line)
            except asyncio.QueueFull:
                self._cut(c, "slow_consumer")

    async def serve(self) -> None:
        """Bind, serve until cancelled, then close every connection and remove the socket
        file. A socket that cannot be set up is logged (``rails_socket_unavailable``) and
        this returns: the agent goes on without it."""
        try:
            sock = self._bind()
        except (OSError, ConfigError) as exc:
            log.error(
                "rails_socket_unavailable",
                path=str(self.path),
                error=str(exc),
                action="running without the local subscription socket",
            )
            return
        try:
            server = await asyncio.start_unix_server(
                self._serve_client, sock=sock, limit=MAX_LINE_BYTES
            )
        except BaseException:
            sock.close()
            self._remove()
            raise
        log.info("rails_socket_listening", path=str(self.path), mode=oct(self.mode))
        self.ready.set()
        try:
            await asyncio.Future()  # until cancelled
        finally:
            self.ready.clear()
            server.close()
            for c in [*self._clients, *self._cut_clients]:
                if c.task is not None:
                    c.task.cancel()
            self._remove()

    def _bind(self) -> socket.socket:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        gid = -1
        if self.group is not None:
            try:
                gid = int(self.group) if self.group.isdigit() else grp.getgrnam(self.group).gr_gid
            except KeyError:
                raise ConfigError(f"rails_socket.group {self.group!r}: no such group") from None
        _clear_stale(path)
        tmp = path.parent / f".{path.name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(tmp).st_mode):
                tmp.unlink()  # our own leftover (a crash between bind and rename)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(tmp))
            try:
                os.chmod(tmp, self.mode)
                if gid != -1:
                    os.chown(tmp, -1, gid)
                os.rename(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            st = os.lstat(path)
            self._ino = (st.st_dev, st.st_ino)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _remove(self) -> None:
        """Unlink the socket file if it is still the one this server bound."""
        if self._ino is None:
            return
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._ino:
                self.path.unlink()
        self._ino = None

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(self._clients) >= self.max_subscribers:
            self.stats.refused += 1
            err = {"error": "too_many_subscribers", "detail": f"{self.max_subscribers} at once"}
            writer.write(_line(err, "error"))
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(self.close_grace_s):
                    await writer.drain()
            writer.close()
            return
        c = _Client(writer, self.queue)
        c.task = asyncio.current_task()
        # no await between the two: no change can slip in between the current map and the queue
        c.queue.put_nowait(_line(self.current(), "current"))
        self._clients.add(c)
        self.stats.connected += 1
        watch = asyncio.create_task(self._watch(c, reader), name="rails-subscriber-watch")
        try:
            while True:
                line = await c.queue.get()
                writer.write(line)
                await writer.drain()
        except asyncio.CancelledError:
            if c.ended is None:  # the server stops
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except (ConnectionError, OSError):
            c.ended = c.ended or "gone"
        finally:
            watch.cancel()
            self._clients.discard(c)
            if c.ended == "slow_consumer":
                await self._last_line(c)
            else:
                writer.close()

    async def _watch(self, c: _Client, reader: asyncio.StreamReader) -> None:
        """Read (and ignore) what the subscriber sends; when it closed its end (a hang-up, not
        a mere shutdown of its writing side), end its connection."""
        with contextlib.suppress(ConnectionError, OSError):
            while await reader.read(4096):
                pass
            sock = c.writer.get_extra_info("socket")
            if sock is not None:
                p = select.poll()
                p.register(sock.fileno(), select.POLLHUP)
                if not p.poll(0):
                    return  # half-closed: it still reads
        self._end(c, "gone")

    def _end(self, c: _Client, why: str) -> None:
        if c.ended is None:
            c.ended = why
            if c.task is not None:
                c.task.cancel()

    def _cut(self, c: _Client, why: str) -> None:
        self._clients.discard(c)
        self._cut_clients.add(c)
        self.stats.dropped += 1
        log.warning(
            "rails_subscriber_dropped",
            path=str(self.path),
            reason=why,
            queued=c.queue.qsize(),
            hint="the subscriber stopped reading; it gets the current map when it reconnects",
        )
        self._end(c, why)

    async def _last_line(self, c: _Client) -> None:
        """After what was already written, the error line; close once the subscriber has it,
        abort after :attr:`close_grace_s`."""
        err = {
            "error": "slow_consumer",
            "detail": f"fell {self.queue} changes behind; reconnect for the current rail map",
        }
        w = c.writer
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            w.write(_line(err, "error"))  # buffered by the transport: never blocks
        w.close()
        try:
            async with asyncio.timeout(self.close_grace_s):
                await w.wait_closed()
        except (TimeoutError, ConnectionError, OSError):
            w.transport.abort()
        except asyncio.CancelledError:  # the server stops
            w.transport.abort()
            raise
        finally:
            self._cut_clients.discard(c)


def _clear_stale(path: Path) -> None:
    """Remove a socket file at ``path`` that nobody listens on. ConfigError when ``path`` is
    something else, or a socket another process serves."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"rails_socket.path {path} exists and is not a socket: not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(os.fspath(path))
    except ConnectionRefusedError:
        path.unlink(missing_ok=True)
        log.info("rails_socket_stale_removed", path=str(path))
        return
    except FileNotFoundError:
        return
    finally:
        probe.close()
    raise ConfigError(f"rails_socket.path {path} is served by another process (another agent?)")


async def follow(path: Path, *, out: TextIO = sys.stdout, count: int | None = None) -> int:
    """Print the lines of the socket at ``path`` to ``out`` as they come (the current rail
    map, then each change), flushing each. Returns 0 after ``count`` lines, 1 when the agent
    closed the connection or cut this subscriber (an ``error`` line). OSError when it cannot
    connect (no such socket, permission denied)."""
    reader, writer = await asyncio.open_unix_connection(os.fspath(path), limit=MAX_LINE_BYTES)
    seen = 0
    try:
        while True:
            try:
                line = await reader.readline()
            except (ConnectionResetError, ValueError):  # cut off; a line over the limit
                return 1
            if not line:
                return 1
            out.write(line.decode("utf-8", "replace"))
            out.flush()
            seen += 1
            if b'"kind":"error"' in line:
                return 1
            if count is not None and seen >= count:
                return 0
    finally:
        writer.close()
