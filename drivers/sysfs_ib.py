"""The sysfs InfiniBand driver: port observations from ``/sys/class/infiniband``.

Consumes the kernel's RDMA sysfs ABI (Documentation/ABI/stable/sysfs-class-infiniband), per port
``/sys/class/infiniband/<hca>/ports/<n>/``:

- ``state``       ``"%d: %s"``, e.g. ``4: ACTIVE`` (IBA vol. 1 14.2.5.6 PortInfo.PortState)
- ``phys_state``  ``"%u: %s"``, e.g. ``5: LinkUp`` (PortInfo.PortPhysicalState; the kernel prints
  7 as ``Phy Test``)
- ``rate``        ``"%d%s Gb/sec (%dX%s)"``, e.g. ``400 Gb/sec (4X NDR)``, ``2.5 Gb/sec (1X SDR)``;
  old kernels / iWARP print ``10 Gb/sec (4X)``; some drivers print ``0 GB/sec``
- ``link_layer``  ``InfiniBand`` | ``Ethernet`` (RoCE) | ``Unknown``
- ``counters/``   PMA PortCounters (decimal; older kernels print ``N/A (no PMA)`` when the MAD
  fails, newer ones fail the read with an errno), ``counters_ext/`` (64-bit ``*_64``, mlx4) and
  ``hw_counters/`` (driver-specific, e.g. mlx5 ``out_of_buffer``; its ``lifespan`` file is a
  setting in ms, not a counter, and is skipped)
- ``gids/<n>``    RoCE GID table, ``%pI6`` text (``fe80:0000:...``); all-zero = an empty entry.
  Read for Ethernet ports only, at re-discovery and when the port's state changes (a flap can
  move GID indexes; :mod:`linkguard.agent.monitor` compares them at re-admission)

Produces :class:`~linkguard.drivers.base.PortObservation` (via :func:`read_port` and
:class:`SysfsIBSource`) and :class:`HCADescriptor` (via :func:`discover_hcas`).

Bad input: every file read may fail (EINVAL, EOPNOTSUPP, EACCES, ENOENT, EIO) or contain garbage /
nothing. That value becomes ``None`` and the observation's ``errors`` gets
``"<hca>/ports/<n>/<file>: <ERRNO> (<text>)"`` (or ``: empty`` / ``: unparsable '<text>'``).
Nothing here raises for one bad file.

The parts: :mod:`~linkguard.drivers.sysfs_attrs` reads and parses one attribute,
:mod:`~linkguard.drivers.sysfs_discover` finds the HCAs, :mod:`~linkguard.drivers.sysfs_port`
reads one port; this module polls them all (:class:`SysfsIBSource`) and re-exports their names.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import replace
from pathlib import Path

import structlog

from linkguard.drivers.base import PortObservation
from linkguard.drivers.sysfs_attrs import (
    _U64_MAX,
    COUNTER_WIDTHS,
    Reader,
    _errno_text,
    is_saturated,
    parse_counter,
    parse_link_layer,
    parse_phys_state,
    parse_rate,
    parse_state,
    read_sysfs,
)
from linkguard.drivers.sysfs_discover import (
    DEFAULT_ROOT,
    HCADescriptor,
    _natural,
    discover_hcas,
    read_gids,
)
from linkguard.drivers.sysfs_port import (
    _CounterFiles,
    _Counters,
    _dirs_signature,
    _error_key,
    _fd_budget,
    _list_counters,
    _observation,
    _read_base,
    _read_counters,
    _removed,
    _settled,
    read_port,
)
from linkguard.drivers.sysfs_port import _KeptOpen as _KeptOpen  # tests use it from here
from linkguard.models import LinkLayer

__all__ = [
    "COUNTER_WIDTHS",
    "DEFAULT_ROOT",
    "HCADescriptor",
    "Reader",
    "SysfsIBSource",
    "discover_hcas",
    "is_saturated",
    "parse_counter",
    "parse_link_layer",
    "parse_phys_state",
    "parse_rate",
    "parse_state",
    "read_gids",
    "read_port",
    "read_sysfs",
]

log = structlog.get_logger(__name__)


#: ``phy_stats(netdev) -> {name: value}``: a RoCE port's netdev statistics (``ethtool -S``,
#: :func:`linkguard.drivers.ethtool_stats.read_ethtool_stats`); raises OSError when unreadable.
PhyStats = Callable[[str], dict[str, int]]


# --------------------------------------------------------------------------------------------
# the polling source


class _Poller:
    """The synchronous part of :class:`SysfsIBSource`: runs in a worker thread."""

    def __init__(
        self,
        *,
        root: Path,
        ports: set[str] | None,
        reader: Reader,
        rediscover_s: float,
        counters_interval_s: float,
        phy_stats: PhyStats | None = None,
    ) -> None:
        self.root = root
        self.phy_stats = phy_stats
        #: per RoCE port, its GID table and PHY counters at their last reading
        self.gids: dict[str, dict[int, str]] = {}
        self.phy: dict[str, dict[str, int]] = {}
        self.root_s = str(root)
        self.filter = frozenset(ports) if ports is not None else None
        self.reader = reader
        self.rediscover_s = rediscover_s
        self.counters_interval_s = counters_interval_s
        self.hcas: dict[str, HCADescriptor] = {}
        self.names: frozenset[str] | None = None
        self.last: dict[str, PortObservation] = {}
        #: per port, the raw text of ``state`` and ``phys_state`` at its last full reading
        self.raw: dict[str, tuple[str | None, str | None]] = {}
        self.counters: dict[str, _Counters] = {}
        #: per port, its counter files (listed at re-discovery)
        self.counter_files: dict[str, _CounterFiles] = {}
        #: ports whose last reported reading carried reused counters (``counters_fresh`` False)
        self.stale: set[str] = set()
        #: counters are read through kept-open files with the real reader (tests inject theirs)
        self.counter_reader: Reader = _KeptOpen(_fd_budget()) if reader is read_sysfs else reader
        #: held by :meth:`poll` and :meth:`close` (a cancelled watch() may leave a poll running
        #: in its worker thread: its files are closed only after it)
        self.lock = threading.Lock()
        self.closed = False
        self.discovered_at = float("-inf")
        self.counters_at = float("-inf")
        self.stack_missing_logged = False
        self.logged: set[tuple[str, str]] = set()

    def _log_errors(self, errors: Iterable[str], **kw: object) -> None:
        for err in errors:
            key = _error_key(err)
            if key not in self.logged:
                self.logged.add(key)
                log.warning("sysfs_bad_value", error=err, root=self.root_s, **kw)

    def _roce(
        self, obs: PortObservation, key: str, *, counters_read: bool, full: bool
    ) -> PortObservation:
        """A RoCE port's reading with its GID table (re-read at re-discovery and when state or
        phys_state changed) and, with ``phy_stats``, its netdev's PHY counters (``*_phy``,
        re-read with the counters; u64, saturated only at 2**64 - 1). An unreadable netdev
        is logged once and adds nothing (missing counters, never 0). Other ports: unchanged."""
        if obs.link_layer != LinkLayer.ETHERNET:
            return obs
        prev = self.last.get(key)
        moved = prev is None or (prev.state, prev.phys_state) != (obs.state, obs.phys_state)
        if full or moved or key not in self.gids:
            self.gids[key] = read_gids(self.root, obs.hca, obs.port, reader=self.reader)
        if self.phy_stats is not None and obs.netdev and (counters_read or key not in self.phy):
            from linkguard.drivers.ethtool_stats import phy_counters

            try:
                self.phy[key] = phy_counters(self.phy_stats(obs.netdev))
            except (OSError, ValueError) as exc:
                self.phy[key] = {}
                self._log_errors([f"{obs.netdev}/ethtool-S: {exc}"], port=key)
        phy = self.phy.get(key, {})
        counters = {**phy, **obs.counters}  # sysfs names win a clash (none known)
        saturated = obs.saturated | {n for n, v in phy.items() if v == _U64_MAX}
        return replace(obs, counters=counters, saturated=saturated, gids=dict(self.gids[key]))

    def _peek(self, hca: str, port: int, name: str) -> str | None:
        """The raw text of one port attribute, None when it cannot be read (the full reading
        says why)."""
        try:
            return self.reader(f"{self.root_s}/{hca}/ports/{port}/{name}")
        except (OSError, ValueError, UnicodeError):
            return None

    def _discover(self, now: float, names: frozenset[str]) -> None:
        if names and self.stack_missing_logged:
            log.info("rdma_stack_appeared", root=self.root_s)
            self.stack_missing_logged = False
        found = {d.hca: d for d in discover_hcas(self.root, reader=self.reader)}
        for hca in sorted(found.keys() - self.hcas.keys(), key=_natural):
            log.info("ib_device_added", hca=hca, ports=list(found[hca].ports))
        for hca in sorted(self.hcas.keys() - found.keys(), key=_natural):
            log.warning("ib_device_removed", hca=hca)
        for d in found.values():
            self._log_errors(d.errors, hca=d.hca)
        self.hcas = found
        self.names = names
        self.discovered_at = now

    def close(self) -> None:
        """Close the kept-open counter files: now, or when the poll still running in a worker
        thread (a cancelled watch()) ends; never blocks on it (a wedged HCA can hang a read)."""
        self.closed = True
        if self.lock.acquire(blocking=False):
            try:
                self._close_files()
            finally:
                self.lock.release()

    def _read_counters(self, key: str, rel: str) -> _Counters:
        """The port's counters, its files listed again only when their directories changed."""
        files = self.counter_files.get(key)
        if files is None or _dirs_signature(self.root_s, rel) != files.signature:
            self._forget(key, rel)
            files = _list_counters(self.root_s, rel)
            # Kept (and its files kept open) only once the directories have been quiet for a
            # second: a directory's mtime ticks coarsely (a jiffy), so a file replaced within
            # the tick of the listing would not change the signature. sysfs: always quiet.
            if files.errors or not _settled(files.signature):
                return _read_counters(self.reader, self.root_s, rel, files)
            self.counter_files[key] = files
        return _read_counters(self.counter_reader, self.root_s, rel, files)

    def _forget(self, key: str, rel: str) -> None:
        self.counter_files.pop(key, None)
        if isinstance(self.counter_reader, _KeptOpen):
            self.counter_reader.forget(f"{self.root_s}/{rel}/")

    def _close_files(self) -> None:
        if isinstance(self.counter_reader, _KeptOpen):
            self.counter_reader.close()

    def poll(self, now: float, only: frozenset[str] | None = None) -> list[PortObservation]:
        """Read every port; return the observations whose reading changed since the last poll
        (everything on the first call), including "removed" observations for vanished ports.

        ``only``: re-read just the ports of these HCAs (an async event named them), and each of
        them in full (state, phys_state, rate, link layer: a LID/GID/speed change need not
        change ``state``); counters are reused and nothing else is rediscovered unless the
        class directory's names changed."""
        with self.lock:
            try:
                return self._poll(now, only)
            finally:
                if self.closed:
                    self._close_files()

    def _poll(self, now: float, only: frozenset[str] | None) -> list[PortObservation]:
        try:
            names = frozenset(os.listdir(self.root_s))
        except (FileNotFoundError, NotADirectoryError):
            names = frozenset()
            if not self.stack_missing_logged:
                log.warning("RDMA stack not loaded", root=self.root_s)
                self.stack_missing_logged = True
        except OSError as exc:  # transient: keep what we know
            self._log_errors([f"{self.root_s}: {_errno_text(exc)}"])
            names = self.names if self.names is not None else frozenset()
        rediscovered = names != self.names or (
            only is None and now - self.discovered_at >= self.rediscover_s
        )
        if rediscovered:
            self._discover(now, names)

        read_counters = only is None and now - self.counters_at >= self.counters_interval_s
        if read_counters:
            self.counters_at = now
        changed: list[PortObservation] = []
        seen: set[str] = set()
        for d in self.hcas.values():
            if only is not None and d.hca not in only:
                continue
            for p in d.ports:
                key = f"{d.hca}/{p}"
                if self.filter is not None and key not in self.filter:
                    continue
                seen.add(key)
                # Between full readings (counters_interval_s, re-discovery) only state and
                # phys_state are read: a port whose two files say what they said is unchanged
                # (rate and link layer change with a retrain, which changes them; any other
                # change shows at the next full reading). Halves the reads per poll.
                raw = (self._peek(d.hca, p, "state"), self._peek(d.hca, p, "phys_state"))
                full = read_counters or rediscovered or only is not None
                if not full and raw == self.raw.get(key):
                    continue
                self.raw[key] = raw
                base = _read_base(self.reader, self.root_s, d.hca, p)
                if base.present:
                    counters = self.counters.get(key)
                    fresh = read_counters or counters is None
                    if fresh:
                        counters = self._read_counters(key, f"{d.hca}/ports/{p}")
                        self.counters[key] = counters
                    obs = _observation(d.hca, p, now, base, counters, d.netdevs.get(p))
                    if not fresh:
                        obs = replace(obs, counters_fresh=False)
                    obs = self._roce(
                        obs, key, counters_read=read_counters, full=rediscovered or only is not None
                    )  # an event (GID_CHANGE...) re-reads the GID table too
                else:  # removed between discovery and this read: reported like a removal
                    obs = _removed(d.hca, p, now)
                # a port last reported with reused counters is reported again at its next
                # counter reading, changed or not: the monitor takes that re-read as the
                # baseline after a return (linkguard.agent.monitor), and must not wait for it
                if not obs.same_reading(self.last.get(key)) or (
                    obs.counters_fresh and key in self.stale
                ):
                    changed.append(obs)
                    self._log_errors(obs.errors, port=key)
                    (self.stale.discard if obs.counters_fresh else self.stale.add)(key)
                self.last[key] = obs
        for key in sorted(self.last.keys() - seen, key=_natural):
            if only is not None and self.last[key].hca not in only:
                continue
            gone = self.last.pop(key)
            self.counters.pop(key, None)
            self.raw.pop(key, None)
            self.gids.pop(key, None)
            self.phy.pop(key, None)
            self._forget(key, f"{gone.hca}/ports/{gone.port}")
            self.stale.discard(key)
            obs = _removed(gone.hca, gone.port, now)
            if not obs.same_reading(gone):
                changed.append(obs)
        return changed


class SysfsIBSource:
    """A :class:`~linkguard.drivers.base.PortSource` polling ``/sys/class/infiniband``.

    ``interval_s`` (s, default 0.1) is the state poll period. ``ports`` optionally restricts to
    ``"hca/port"`` keys. ``counters_interval_s`` (s, default 1.0): counters are re-read at most
    this often (each ``counters/`` read is a PMA MAD to the HCA firmware; state does not need
    them), the last counter values are reused in between. ``rediscover_s`` (s, default 5.0):
    full re-discovery period; a device appearing/disappearing in the class directory is picked
    up on the next poll anyway. ``reader`` reads one attribute (tests inject errors with it).
    ``phy_stats``: reads a RoCE port's netdev PHY counters with each counter reading
    (:func:`linkguard.drivers.ethtool_stats.read_ethtool_stats`; None: not read).
    """

    def __init__(
        self,
        *,
        root: Path = DEFAULT_ROOT,
        interval_s: float = 0.1,
        ports: set[str] | None = None,
        counters_interval_s: float = 1.0,
        rediscover_s: float = 5.0,
        reader: Reader = read_sysfs,
        phy_stats: PhyStats | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.root = Path(root)
        self.interval_s = interval_s
        self.ports = set(ports) if ports is not None else None
        self.counters_interval_s = counters_interval_s
        self.rediscover_s = rediscover_s
        self.reader = reader
        self.phy_stats = phy_stats
        #: HCAs poll_now() asked for, taken by the poller thread under ``_lock``
        self._wanted: set[str] = set()
        self._lock = threading.Lock()
        #: set to wake the poller thread early: poll_now() or the end of watch()
        self._wake = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: targeted re-reads done (:meth:`poll_now` requests coalesce into one each)
        self.rereads = 0

    def poll_now(self, hcas: Iterable[str]) -> None:
        """Re-read every port of ``hcas`` now instead of at the next ``interval_s`` tick (an
        async event said something changed on these devices). Requests made before the re-read
        runs coalesce into one; HCAs not watched are simply not found. The regular polls go on
        as before: this only adds reads. Thread-safe.

        The poller thread is woken through the event loop, after the callback that asked: a
        burst of events handled in one go (200 PORT_ERR lines in one read) is one re-read."""
        with self._lock:
            first = not self._wanted
            self._wanted.update(hcas)
        loop = self._loop
        if not first:
            return  # already on its way
        if loop is None or loop.is_closed():
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    async def watch(self) -> AsyncGenerator[list[PortObservation], None]:
        """First a full snapshot (``[]`` when the RDMA stack is not loaded), then every
        ``interval_s`` the ports whose reading changed (no yield when nothing changed). A removed
        device's ports come once with ``state=None`` and an ``ENOENT (device removed)`` error.
        A :meth:`poll_now` request adds one re-read of its HCAs' ports between the ticks.
        Runs until cancelled; an exception raised by a poll is raised here.

        Reads and timing run in one thread of their own (``sysfs-poll``), which hands the event
        loop only the polls that changed something: an idle fabric costs the loop nothing
        (``asyncio.to_thread`` plus a loop timer per 100 ms tick was half the agent's idle CPU,
        benchmarks/agent.py). The thread ends after its current poll once watch() ends; it
        never blocks the loop (a read from a wedged HCA can hang)."""
        poller = _Poller(
            root=self.root,
            ports=self.ports,
            reader=self.reader,
            rediscover_s=self.rediscover_s,
            counters_interval_s=self.counters_interval_s,
            phy_stats=self.phy_stats,
        )
        loop = self._loop = asyncio.get_running_loop()
        out: asyncio.Queue[list[PortObservation] | BaseException] = asyncio.Queue()
        stop = threading.Event()

        def hand(item: list[PortObservation] | BaseException) -> None:
            try:
                loop.call_soon_threadsafe(out.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening
                stop.set()

        thread = threading.Thread(
            target=self._run, args=(poller, stop, hand), name="sysfs-poll", daemon=True
        )
        thread.start()
        try:
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            self._wake.set()
            poller.close()

    def _run(
        self,
        poller: _Poller,
        stop: threading.Event,
        hand: Callable[[list[PortObservation] | BaseException], None],
    ) -> None:
        """The poller thread: a snapshot, then a poll every ``interval_s`` (a late poll moves
        the next ones, it does not bunch them) and a targeted one whenever poll_now() asks."""
        try:
            next_at = time.monotonic()
            hand(poller.poll(next_at))
            while not stop.is_set():
                next_at = max(next_at + self.interval_s, time.monotonic())
                while (delay := next_at - time.monotonic()) > 0:
                    self._wake.wait(delay)
                    if stop.is_set():
                        return
                    self._wake.clear()  # before taking the set: a later request wakes again
                    with self._lock:
                        wanted, self._wanted = frozenset(self._wanted), set()
                    if wanted:  # poll_now(): these HCAs at once
                        self.rereads += 1
                        if changed := poller.poll(time.monotonic(), wanted):
                            hand(changed)
                if changed := poller.poll(time.monotonic()):
                    hand(changed)
        except Exception as exc:  # raised by watch(), in the loop's thread
            hand(exc)
