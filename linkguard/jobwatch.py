"""Fail a doomed NCCL IB job fast: follow the agent's rails socket and, when a port this
process's NCCL uses goes down, make the training loop raise at its next step, so an elastic
launcher restarts the workers at once (through ``linkguard exec``, on the rails usable then)
instead of after NCCL's retry budget.

Why: NCCL's IB transport binds each queue pair to one HCA port when a communicator connects. On
a port that died it retries for 4.096 us x 2^``NCCL_IB_TIMEOUT`` x ``NCCL_IB_RETRY_CNT``
(:func:`nccl_retry_budget_s`: 30.1 s at NCCL's defaults 20 and 7) before the communicator
fails, while the host's agent sees the port go down within milliseconds and says so on its
rails socket (``rails_socket.path``, :mod:`linkguard.agent.localsub`). For IP transports (Gloo,
NCCL's socket transport, ``NCCL_IB_DISABLE=1``) none of this is needed: the agent's routes move
that traffic at once, and this watch watches nothing for them.

Consumes: the socket's line protocol, one JSON object per line (UTF-8, ``\\n``): first the
current rail map (``"kind": "current"``), then every change (``"kind": "change"``), both
``linkguard.rail-change/v1`` documents (:mod:`linkguard.agent.railmap`), or ``"kind":
"error"`` before the agent cuts a slow reader. Produces: :class:`RailLost` (raised by
:meth:`RailWatch.check`, handed to ``on_lost``), and optionally a signal or an exit.

Which ports are this process's: ``ports`` when given, else its ``NCCL_IB_HCA`` as NCCL matches
it. When it fires: once one of them has stayed down ``grace_s`` (default
:func:`retransmit_timeout_s`, 4.29 s: a shorter blip is ridden out), unless NCCL's port
failover covers the loss; the first document is the baseline. The rules in full, with their
reasons (whose ports, the grace and its trade, which changes fire, the baseline, reconnects,
fused NICs): ``docs/jobs.md``, section "The rules in full".

Standard library only and self-contained: ``import linkguard.jobwatch`` loads nothing of
linkguard's dependencies (``linkguard/__init__`` is stdlib-only too), and the file can be
copied into a job's own code. Use::

    from linkguard.jobwatch import RailLost, RailWatch

    watch = RailWatch().start()       # socket: $LINKGUARD_RAILS_SOCKET or /run/linkguard/...
    dist.init_process_group("nccl")
    for step in range(steps):
        watch.check()                 # raises RailLost once a port this process uses is down
        train_step()

An uncaught :class:`RailLost` ends the worker non-zero; ``torchrun --max-restarts`` then
restarts the node's workers (and the rendezvous the other nodes'), each through ``linkguard
exec``. For a loop blocked inside a collective: ``interrupt="signal"`` also sends the process
``signum`` (SIGUSR1), whose handler raises :class:`RailLost` in the main thread when Python code
runs next (a blocking system call is interrupted; a C++ wait that never returns to Python is
not); a ``signum`` it did not send goes to the Python handler it replaced (the
``notify-training`` hook signals SIGUSR1 too). ``interrupt="exit"`` ends the process at once with
``exit_code`` (``os._exit``: no cleanup), which works whatever the main thread is doing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

__all__ = [
    "DEFAULT_SOCKET",
    "EXIT_RAIL_LOST",
    "RailLost",
    "RailWatch",
    "WatchStats",
    "nccl_retry_budget_s",
    "retransmit_timeout_s",
    "selects",
]

log = logging.getLogger(__name__)

#: the agent's usual ``rails_socket.path`` (off unless configured); ``$LINKGUARD_RAILS_SOCKET``
#: (the agent's old variable for it, still read by the agent) overrides this default
DEFAULT_SOCKET = "/run/linkguard/rails.sock"
#: the exit code of ``interrupt="exit"``: linkguard's own, apart from ``linkguard exec``'s 69/75
EXIT_RAIL_LOST = 76
#: the longest line read; the agent's documents are about 5 KB for a 64-GPU host
MAX_LINE_BYTES = 1 << 20
#: reconnect back-off: first wait and cap (s)
RECONNECT_S = 0.2
RECONNECT_MAX_S = 2.0
#: document list -> the ``lost_on`` name that selects it
_LISTS = {
    # not fast_path_ports: a port stays in it while held down after it came back, and its
    # loss was in ports_down already (the fast path starts in the same document)
    "down": ("ports_down",),
    "held_down": ("ports_held_down",),
    "suppressed": ("ports_suppressed",),
    "degraded": ("ports_degraded",),
}

LostOn = Literal["down", "held_down", "suppressed", "degraded"]


def nccl_retry_budget_s(environ: Mapping[str, str] | None = None) -> float:
    """How long (s) NCCL's IB transport retries a dead path before the communicator fails:
    4.096 us x 2^``NCCL_IB_TIMEOUT`` per try x ``NCCL_IB_RETRY_CNT`` tries (the IB spec's
    local ACK timeout; NCCL's defaults 20 and 7 give 30.06 s). Unparsable values count as the
    defaults."""
    env = os.environ if environ is None else environ

    def num(name: str, default: int) -> int:
        try:
            return int(env.get(name, default))
        except ValueError:
            return default

    return 4.096e-6 * 2 ** min(num("NCCL_IB_TIMEOUT", 20), 31) * num("NCCL_IB_RETRY_CNT", 7)


def retransmit_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """One RC retransmission timeout (s): 4.096 us x 2^``NCCL_IB_TIMEOUT`` (4.29 s at NCCL's
    default 20). A port back within it costs a queue pair one retransmission, no error: the
    default ``grace_s`` of :class:`RailWatch`."""
    return nccl_retry_budget_s({**(os.environ if environ is None else environ),
                                "NCCL_IB_RETRY_CNT": "1"})  # fmt: skip


def selects(value: str | None, device: str, port: int) -> bool:
    """Whether NCCL (2.x, ``net_ib/init.cc`` with ``matchIfList``) uses ``device:port`` under
    ``NCCL_IB_HCA=value``: None or an empty list selects all; ``^`` first negates; ``=`` next
    makes entries exact names, else each entry is a name prefix; an entry without ``:port``
    matches every port. The one copy of this rule: :mod:`linkguard.nccl` imports it
    (``hca_selects``) from here, which keeps this module stdlib-only."""
    if value is None:
        return True
    negate = value.startswith("^")
    rest = value[1:] if negate else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    entries = [e for e in rest.split(",") if e]
    if not entries:
        return not negate
    hit = False
    for e in entries:
        name, _, p = e.partition(":")
        ok_name = device == name if exact else device.startswith(name)
        if ok_name and (not p or (p.isdigit() and int(p) == port)):
            hit = True
            break
    return hit != negate


class RailLost(RuntimeError):
    """A port this process's NCCL uses is out of use: its queue pairs would stall for NCCL's
    retry budget, then fail. ``ports``: the ``"hca/port"`` keys lost; ``change``: the agent's
    document; ``noticed_at``: wall-clock s when the watch read it; ``delay_ms``: from the
    agent's change (its ``time``) to then, in ms (None when the document has no time)."""

    def __init__(self, ports: Iterable[str], change: Mapping[str, Any], noticed_at: float) -> None:
        self.ports = tuple(sorted(ports))
        self.change = dict(change)
        self.noticed_at = noticed_at
        t = change.get("time")
        self.delay_ms = (noticed_at - t) * 1000.0 if isinstance(t, int | float) and t == t else None
        self.budget_s = nccl_retry_budget_s()
        super().__init__(self._text())

    def _text(self) -> str:
        delay = (
            ""
            if self.delay_ms is None
            else f", heard {self.delay_ms:.1f} ms after the agent saw it"
        )
        return (
            f"rail lost on {self.change.get('host')}: {', '.join(self.ports)} "
            f"(agent change seq {self.change.get('seq')}, reason {self.change.get('reason')}"
            f"{delay}); NCCL's IB transport would stall on it for its retry budget "
            f"(~{self.budget_s:.0f} s), restart the workers instead (linkguard exec gives "
            "them the usable rails)"
        )

    def __reduce__(self):  # picklable (multiprocessing, torch elastic's error files)
        return (type(self), (self.ports, self.change, self.noticed_at))


class WatchStats:
    """Counters: ``connects``, ``documents`` (read and used), ``bad_lines`` (not JSON, not a
    rail-change document, over :data:`MAX_LINE_BYTES`), ``errors`` (the agent's error lines),
    ``fired`` (losses reported)."""

    def __init__(self) -> None:
        self.connects = 0
        self.documents = 0
        self.bad_lines = 0
        self.errors = 0
        self.fired = 0


class RailWatch:
    """Follow the rails socket at ``path`` in a daemon thread (:meth:`start`, :meth:`stop`, or
    ``with RailWatch() as w:``), reconnecting when the connection is lost (back-off
    :data:`RECONNECT_S` doubling to :data:`RECONNECT_MAX_S`).

    ``ports``: this process's ports (see the module docstring), default from ``environ``'s
    ``NCCL_IB_HCA``. ``on_lost``: called in the watch thread with each :class:`RailLost`
    (after :meth:`check` is armed; exceptions it raises are logged). ``interrupt``: ``none``
    (only :meth:`check` raises), ``signal`` (also ``os.kill(getpid(), signum)``; :meth:`start`
    must then run in the main thread, it installs the handler) or ``exit`` (``os._exit
    (exit_code)`` after a line on stderr). ``lost_on``: which port lists count as lost.
    ``initial``: ``baseline`` or ``fire`` (see the module docstring). ``grace_s``: how long a
    port stays lost before it fires (s; None: :func:`retransmit_timeout_s` of ``environ``; 0:
    at once). Bad lines are logged
    (logger ``linkguard.jobwatch``) and skipped; nothing here raises into the training loop
    but :class:`RailLost`."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        ports: Iterable[str] | None = None,
        on_lost: Callable[[RailLost], object] | None = None,
        interrupt: Literal["none", "signal", "exit"] = "none",
        signum: int = signal.SIGUSR1,
        exit_code: int = EXIT_RAIL_LOST,
        lost_on: Iterable[LostOn] = ("down",),
        initial: Literal["baseline", "fire"] = "baseline",
        environ: Mapping[str, str] | None = None,
        reconnect_s: float = RECONNECT_S,
        grace_s: float | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.grace_s = retransmit_timeout_s(env) if grace_s is None else float(grace_s)
        if not self.grace_s >= 0:
            raise ValueError(f"grace_s {grace_s!r}: a number of seconds >= 0")
        self.path = os.fspath(path or env.get("LINKGUARD_RAILS_SOCKET") or DEFAULT_SOCKET)
        if interrupt not in ("none", "signal", "exit"):
            raise ValueError(f"interrupt {interrupt!r}: none, signal or exit")
        if initial not in ("baseline", "fire"):
            raise ValueError(f"initial {initial!r}: baseline or fire")
        lost_on = tuple(lost_on)
        unknown = [x for x in lost_on if x not in _LISTS]
        if unknown or not lost_on:
            raise ValueError(f"lost_on {lost_on!r}: choose from {', '.join(_LISTS)}")
        self.lists = tuple(name for x in lost_on for name in _LISTS[x])
        #: (NCCL_IB_HCA-style selector of this process's ports, any IB port in use, why not)
        self.selector, self.watching, self.why = _selector(ports, env)
        #: fused NICs NCCL fails over inside (``NCCL_NET_FORCE_MERGE`` with
        #: ``NCCL_IB_RESILIENCY_PORT_FAILOVER=1``): each a tuple of (hca, port or None)
        self.fused = _fused(env)
        self.on_lost = on_lost
        self.interrupt = interrupt
        self.signum = signum
        self.exit_code = exit_code
        self.initial = initial
        self.reconnect_s = reconnect_s
        self.stats = WatchStats()
        #: the first loss (what :meth:`check` raises), then every loss in order
        self.lost: RailLost | None = None
        self.losses: list[RailLost] = []
        self.last: dict[str, Any] | None = None  # the last document used
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._before: frozenset[str] | None = None  # this process's ports lost, last document
        self._ignored: frozenset[str] = frozenset()  # lost in the baseline: never opened
        self._survived: frozenset[str] = frozenset()  # lost, but NCCL fails over inside
        #: every port ever survived so: a communicator is not assumed to take it back, so a
        #: later loss of another member of its fused NIC is the fatal second one
        self._survived_once: frozenset[str] = frozenset()
        self._old_handler: Any = None
        self._said: set[str] = set()
        #: lost ports waiting out the grace: key -> (monotonic deadline, RailLost to fire)
        self._pending: dict[str, tuple[float, RailLost]] = {}

    # -- lifetime ---------------------------------------------------------------------------

    def start(self) -> RailWatch:
        """Start the watch thread (once); returns self. With ``interrupt="signal"`` installs
        the handler (ValueError outside the main thread)."""
        if self._thread is not None:
            return self
        if self.interrupt == "signal":
            try:
                self._old_handler = signal.signal(self.signum, self._on_signal)
            except ValueError:
                raise ValueError(
                    'RailWatch(interrupt="signal").start() must run in the main thread'
                ) from None
        if not self.watching:
            log.info("jobwatch_nothing_to_watch: %s", self.why)
        self._thread = threading.Thread(target=self._run, name="linkguard-jobwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (closes the connection) and restore a replaced signal handler."""
        self._stop.set()
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._old_handler is not None:
            with contextlib.suppress(ValueError):
                signal.signal(self.signum, self._old_handler)
            self._old_handler = None

    def __enter__(self) -> RailWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the first document has been read (the baseline is set); False after
        ``timeout`` s (no agent, no socket: the watch keeps trying)."""
        return self._ready.wait(timeout)

    # -- the training loop's side -----------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`RailLost` (the first loss) once a port this process uses is lost;
        else return at once (one attribute read)."""
        lost = self.lost
        if lost is not None:
            raise RailLost(lost.ports, lost.change, lost.noticed_at)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.check()
        # not ours (the notify-training hook also sends SIGUSR1): the handler it replaced
        if callable(self._old_handler):
            self._old_handler(signum, frame)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        wait = self.reconnect_s
        while not self._stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError as exc:
                sock.close()
                self._say_once(
                    "connect", "cannot connect to %s: %s (retrying)", self.path, exc.strerror
                )
                self._wait(wait)
                wait = min(wait * 2, RECONNECT_MAX_S)
                continue
            with self._lock:
                if self._stop.is_set():
                    sock.close()
                    break
                self._sock = sock
            self.stats.connects += 1
            self._said.discard("connect")
            wait = self.reconnect_s
            try:
                self._read(sock)
            except OSError as exc:
                if not self._stop.is_set():
                    log.warning("jobwatch_connection_lost: %s: %s (reconnecting)", self.path, exc)
            except Exception:  # a bug here must not end the watch silently
                log.exception("jobwatch_failed (reconnecting)")
            finally:
                with self._lock:
                    self._sock = None
                sock.close()
            if not self._stop.is_set():
                self._wait(wait)

    def _wait(self, seconds: float) -> None:
        """Sleep ``seconds`` (or until stopped), firing the losses whose grace ends meanwhile."""
        end = time.monotonic() + seconds
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            self._stop.wait(min(left, self._until_due()))
            self._due()

    def _until_due(self) -> float:
        """Seconds until the first pending loss is due (inf: none pending)."""
        return min((d for d, _ in self._pending.values()), default=float("inf")) - (
            time.monotonic()
        )

    def _due(self) -> None:
        """Fire the pending losses whose grace is over (still lost: a return removed them)."""
        now = time.monotonic()
        due = {k: err for k, (d, err) in self._pending.items() if d <= now}
        if not due:
            return
        for k in due:
            del self._pending[k]
        first = min(due.values(), key=lambda e: e.noticed_at)
        self._fire(RailLost(sorted(due), first.change, first.noticed_at))

    def _read(self, sock: socket.socket) -> None:
        buf = b""
        while not self._stop.is_set():
            left = self._until_due()
            sock.settimeout(None if left == float("inf") else max(left, 0.0))
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                self._due()
                continue
            if not chunk:
                if not self._stop.is_set():
                    log.warning("jobwatch_connection_closed: %s (reconnecting)", self.path)
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if self._line(line) == "error":
                    return
            if len(buf) > MAX_LINE_BYTES:
                self.stats.bad_lines += 1
                log.warning("jobwatch_bad_line: over %d bytes (reconnecting)", MAX_LINE_BYTES)
                return

    def _line(self, line: bytes) -> str:
        """Handle one line; ``error`` when the agent said it ends this connection."""
        try:
            doc = json.loads(line)
        except ValueError as exc:
            self.stats.bad_lines += 1
            log.warning("jobwatch_bad_line: not JSON (%s): %r", exc, line[:200])
            return "bad"
        if not isinstance(doc, dict):
            self.stats.bad_lines += 1
            log.warning("jobwatch_bad_line: not a JSON object: %r", line[:200])
            return "bad"
        kind = doc.get("kind")
        if kind == "error":
            self.stats.errors += 1
            log.warning("jobwatch_agent_error: %s (reconnecting)", doc.get("error"))
            return "error"
        lost = _ports(doc, self.lists)
        if lost is None or kind not in ("current", "change"):
            self.stats.bad_lines += 1
            log.warning("jobwatch_bad_line: not a rail-change document: %r", line[:200])
            return "bad"
        if kind == "current" and doc.get("seq") == 0 and doc.get("reason") == "none":
            return "empty"  # an agent without a view yet: says nothing
        self.stats.documents += 1
        self.last = doc
        mine = frozenset(k for k in lost if self._mine(k))
        if self._before is None and self.initial == "baseline":
            self._ignored = mine
        doomed = self._doomed(mine - self._ignored)
        new = doomed - (self._before or frozenset())
        self._before = doomed
        self._ready.set()
        survived = mine - self._ignored - doomed
        if survived - self._survived:
            log.warning(
                "jobwatch_failover: %s lost inside a fused NIC: NCCL's port failover moves its "
                "queue pairs to the other member after its retry budget; a second loss in that "
                "NIC fires",
                ", ".join(sorted(survived - self._survived)),
            )
        self._survived = survived
        self._survived_once |= survived
        back = [k for k in self._pending if k not in doomed]
        for k in back:
            del self._pending[k]
        if back:
            log.info(
                "jobwatch_blip: %s back within the %.2f s grace: not fired",
                ", ".join(sorted(back)),
                self.grace_s,
            )
        if new and self.grace_s == 0:
            self._fire(RailLost(new, doc, time.time()))
        elif new:
            err = RailLost(new, doc, time.time())
            deadline = time.monotonic() + self.grace_s
            for k in new:
                self._pending[k] = (deadline, err)
        return "ok"

    def _doomed(self, lost: frozenset[str]) -> frozenset[str]:
        """The ports of ``lost`` a communicator does not survive: all of them, except with
        NCCL's port failover a port whose fused NIC lost no other member (NCCL fails over
        inside a fused NIC once; more than one failed device of it is fatal)."""
        if not self.fused:
            return lost
        gone = lost | self._survived_once
        out = set()
        for key in lost:
            group = next((g for g in self.fused if _member(key, g)), None)
            if group is None or sum(1 for k in gone if _member(k, group)) > 1:
                out.add(key)
        return frozenset(out)

    def _mine(self, key: str) -> bool:
        if not self.watching:
            return False
        hca, _, port = key.rpartition("/")
        return bool(hca) and port.isdigit() and selects(self.selector, hca, int(port))

    def _fire(self, err: RailLost) -> None:
        with self._lock:
            if self.lost is None:
                self.lost = err
            self.losses.append(err)
        self.stats.fired += 1
        if self.on_lost is not None:
            try:
                self.on_lost(err)
            except Exception:
                log.exception("jobwatch_callback_failed")
        if self.interrupt == "signal":
            os.kill(os.getpid(), self.signum)
        elif self.interrupt == "exit":
            with contextlib.suppress(OSError, ValueError):
                os.write(2, f"linkguard.jobwatch: {err}; exiting {self.exit_code}\n".encode())
            os._exit(self.exit_code)

    def _say_once(self, what: str, msg: str, *args: object) -> None:
        if what not in self._said:
            self._said.add(what)
            log.warning("jobwatch_" + what + ": " + msg, *args)


def _fused(env: Mapping[str, str]) -> tuple[tuple[tuple[str, int | None], ...], ...]:
    """The fused NICs of ``NCCL_NET_FORCE_MERGE`` (groups by ``;``, members ``name[:port]``
    by ``,``) when NCCL's port failover is on (``NCCL_IB_RESILIENCY_PORT_FAILOVER=1``, merging
    not forbidden by ``NCCL_IB_MERGE_NICS=0``); () otherwise."""
    if env.get("NCCL_IB_RESILIENCY_PORT_FAILOVER", "").strip() != "1":
        return ()
    if env.get("NCCL_IB_MERGE_NICS", "1").strip() == "0":
        return ()
    groups = []
    for text in env.get("NCCL_NET_FORCE_MERGE", "").split(";"):
        members = []
        for entry in text.split(","):
            name, _, port = entry.strip().partition(":")
            if name:
                members.append((name, int(port) if port.isdigit() else None))
        if len(members) > 1:
            groups.append(tuple(members))
    return tuple(groups)


def _member(key: str, group: tuple[tuple[str, int | None], ...]) -> bool:
    hca, _, port = key.rpartition("/")
    return any(hca == n and (p is None or str(p) == port) for n, p in group)


def _ports(doc: Mapping[str, Any], lists: Iterable[str]) -> set[str] | None:
    """The ``"hca/port"`` keys of ``lists`` in ``doc``; None when one is not a list of
    strings (not a rail-change document)."""
    out: set[str] = set()
    for name in lists:
        v = doc.get(name, [])
        if not isinstance(v, list) or not all(isinstance(k, str) for k in v):
            return None
        out.update(v)
    return out


#: an HCA name as sysfs lists it (/sys/class/infiniband/<name>: mlx5_0, ibp12s0, rxe_eth0)
_HCA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _selector(ports: Iterable[str] | None, env: Mapping[str, str]) -> tuple[str | None, bool, str]:
    """(``NCCL_IB_HCA``-style selector, whether any IB port is in use, why not)."""
    if ports is not None:
        if isinstance(ports, str):
            raise TypeError(f"ports={ports!r}: give a list of ports (['mlx5_0:1']), not a str")
        names = []
        for p in ports:
            hca, sep, port = p.replace("/", ":").partition(":")
            if not _HCA_NAME.fullmatch(hca) or (sep and not port.isdigit()):
                raise ValueError(f"port {p!r}: give hca:port, hca/port or hca")
            names.append(f"{hca}:{port}" if sep else hca)
        if not names:
            return None, False, "no ports given"
        return "=" + ",".join(names), True, ""
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        return None, False, "NCCL_IB_DISABLE is set: NCCL uses no IB port (routes move IP)"
    if env.get("NCCL_NET", "").strip().lower() == "socket":
        return None, False, "NCCL_NET=Socket: NCCL uses no IB port (routes move IP)"
    value = env.get("NCCL_IB_HCA")
    return (value if value and value.strip() else None), True, ""
