"""One port's observation from sysfs (:func:`read_port`): its state, phys_state, rate and link
layer, and its counters from ``counters/``, ``counters_ext/`` and ``hw_counters/`` (saturated
ones marked), with the counter files kept open between polls (:class:`_KeptOpen`) within a file
descriptor budget. Formats: :mod:`linkguard.drivers.sysfs_ib`."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from linkguard.drivers.base import PortObservation
from linkguard.drivers.sysfs_attrs import (
    _MAX_READ,
    _U64_MAX,
    COUNTER_WIDTHS,
    Reader,
    _at_max,
    _listdir,
    _parse,
    _read,
    parse_counter,
    parse_link_layer,
    parse_phys_state,
    parse_rate,
    parse_state,
    read_sysfs,
)
from linkguard.drivers.sysfs_discover import read_gids
from linkguard.models import (
    LinkLayer,
    PhysState,
    PortStateName,
)


@dataclass(frozen=True)
class _Counters:
    values: dict[str, int | None]
    saturated: frozenset[str]
    errors: tuple[str, ...]


def _ext_name(name: str) -> str:
    """counters_ext name -> counters/ name: ``port_xmit_data_64`` -> ``port_xmit_data``,
    ``port_unicast_xmit_packets`` -> ``unicast_xmit_packets``."""
    if name.endswith("_64"):
        return name[:-3]
    if name.startswith(("port_unicast_", "port_multicast_")):
        return name[len("port_") :]
    return name


_COUNTER_DIRS = ("counters", "counters_ext", "hw_counters")


def _dirs_signature(root: str, base: str) -> tuple[tuple[int, int] | None, ...]:
    """(inode, mtime in ns) of each counter directory of the port ``base``, None when absent:
    a directory re-created or a file added, removed or replaced in it changes it (sysfs
    directories never change in place; a re-registered device's are new inodes)."""
    sig: list[tuple[int, int] | None] = []
    for d in _COUNTER_DIRS:
        try:
            st = os.stat(f"{root}/{base}/{d}")
        except OSError:
            sig.append(None)
        else:
            sig.append((st.st_ino, st.st_mtime_ns))
    return tuple(sig)


def _settled(signature: tuple[tuple[int, int] | None, ...]) -> bool:
    """Every directory of a :func:`_dirs_signature` last changed over a second ago."""
    before = time.time_ns() - 1_000_000_000
    return all(s is None or s[1] < before for s in signature)


@dataclass(frozen=True)
class _CounterFiles:
    """The counter files of one port: ``counters/``, ``counters_ext/`` and ``hw_counters/``
    names (sorted), listed again when their directories' ``signature`` changes; ``errors``
    from listing them."""

    legacy: tuple[str, ...]
    ext: tuple[str, ...]
    hw: tuple[str, ...]
    errors: tuple[str, ...] = ()
    signature: tuple[tuple[int, int] | None, ...] = ()


def _list_counters(root: str, base: str) -> _CounterFiles:
    signature = _dirs_signature(root, base)  # before listing: a change in between re-lists
    errors: list[str] = []
    legacy = _listdir(f"{root}/{base}/counters", f"{base}/counters", errors)
    ext = _listdir(f"{root}/{base}/counters_ext", f"{base}/counters_ext", errors)
    hw = _listdir(f"{root}/{base}/hw_counters", f"{base}/hw_counters", errors)
    # lifespan: the hw_counters cache lifetime in ms, a setting
    hw_names = tuple(n for n in hw if n != "lifespan")
    return _CounterFiles(tuple(legacy), tuple(ext), hw_names, tuple(errors), signature)


def _counter(reader: Reader, root: str, rel: str, errors: list[str]) -> int | None:
    """``_parse(reader, root, rel, parse_counter, errors)`` with a fast path for the usual
    plain decimal (a counter poll reads ~50 files per port)."""
    text = _read(reader, root, rel, errors)
    if text is None:
        return None
    t = text.strip()
    if t.isdigit() and t.isascii() and len(t) <= 20 and (v := int(t)) <= _U64_MAX:
        return v
    value, problem = parse_counter(text)
    if problem is not None:
        errors.append(f"{rel}: {problem}")
    return value


def _read_counters(
    reader: Reader, root: str, base: str, files: _CounterFiles | None = None
) -> _Counters:
    """Every counter of the port ``base`` (``<hca>/ports/<n>``). ``files``: its listing from
    :func:`_list_counters` (listed now when None)."""
    if files is None:
        files = _list_counters(root, base)
    errors: list[str] = list(files.errors)
    values: dict[str, int | None] = {}
    widths: dict[str, int | None] = {}
    for name in files.legacy:
        values[name] = _counter(reader, root, f"{base}/counters/{name}", errors)
        widths[name] = COUNTER_WIDTHS.get(name)
    # 64-bit counters_ext win over the 32-bit legacy ones when present and readable.
    for ext in files.ext:
        value = _counter(reader, root, f"{base}/counters_ext/{ext}", errors)
        name = _ext_name(ext)
        if value is not None or name not in values:
            values[name] = value
            widths[name] = 64
    for name in files.hw:
        key = name if name not in values else f"hw_{name}"
        values[key] = _counter(reader, root, f"{base}/hw_counters/{name}", errors)
        widths[key] = None
    saturated = frozenset(n for n, v in values.items() if v is not None and _at_max(v, widths[n]))
    return _Counters(values, saturated, tuple(errors))


class _KeptOpen:
    """A :data:`Reader` that keeps each attribute it read open and re-reads it with
    ``pread(fd, 4096, 0)``: one system call instead of open + read + close. On sysfs a read at
    offset 0 runs the attribute's ``show()`` again (fs/seq_file.c ``seq_read_iter`` restarts at
    position 0), so the value is as fresh as a new open's. At most ``budget`` files are kept open
    (the rest are read as :func:`read_sysfs` does); any failed ``pread`` closes that file and
    reads it again by path, so errors are exactly :func:`read_sysfs`'s (a re-registered device's
    old node fails with ENODEV, its path gives the new one). :meth:`forget` closes the files
    under a directory (the poller does when the port's counter directories changed: a file
    replaced by rename, as tests do, is then re-opened); :meth:`close` closes them all."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.fds: dict[str, int] = {}

    def __call__(self, path: str) -> str:
        fd = self.fds.get(path)
        if fd is None:
            if len(self.fds) >= self.budget:
                return read_sysfs(path)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self.fds[path] = fd
        try:
            data = os.pread(fd, _MAX_READ, 0)
        except OSError:
            del self.fds[path]
            os.close(fd)
            return read_sysfs(path)
        return data.decode("utf-8", "replace")

    def forget(self, prefix: str) -> None:
        for path in [p for p in self.fds if p.startswith(prefix)]:
            os.close(self.fds.pop(path))

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            os.close(fd)


def _fd_budget() -> int:
    """Files the counter reader may keep open: half the soft RLIMIT_NOFILE, at most 4096 (1024
    under systemd by default: 512, the 47 counter files of each of 8 mlx5 ports fit)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    return 4096 if soft == resource.RLIM_INFINITY else max(0, min(soft // 2, 4096))


@dataclass(frozen=True)
class _Base:
    state: PortStateName | None = None
    phys_state: PhysState | None = None
    rate_gbps: float | None = None
    link_layer: LinkLayer | None = None
    errors: tuple[str, ...] = ()
    present: bool = True  # False: the port directory is gone


def _read_base(reader: Reader, root: str, hca: str, port: int) -> _Base:
    """state, phys_state, rate and link_layer of one port."""
    base = f"{hca}/ports/{port}"
    errors: list[str] = []
    state = _parse(reader, root, f"{base}/state", parse_state, errors)
    if state is None and not os.path.isdir(f"{root}/{base}"):
        return _Base(errors=(f"{base}: ENOENT (port directory gone)",), present=False)
    return _Base(
        state=state,
        phys_state=_parse(reader, root, f"{base}/phys_state", parse_phys_state, errors),
        rate_gbps=_parse(reader, root, f"{base}/rate", parse_rate, errors),
        link_layer=_parse(reader, root, f"{base}/link_layer", parse_link_layer, errors),
        errors=tuple(errors),
    )


def _observation(
    hca: str, port: int, now: float, base: _Base, counters: _Counters | None, netdev: str | None
) -> PortObservation:
    return PortObservation(
        hca=hca,
        port=port,
        monotonic=now,
        link_layer=base.link_layer,
        state=base.state,
        phys_state=base.phys_state,
        rate_gbps=base.rate_gbps,
        netdev=netdev,
        counters=dict(counters.values) if counters is not None else {},
        saturated=counters.saturated if counters is not None else frozenset(),
        errors=base.errors + (counters.errors if counters is not None else ()),
    )


def read_port(
    root: Path,
    hca: str,
    port: int,
    *,
    now: float,
    reader: Reader = read_sysfs,
    netdev: str | None = None,
) -> PortObservation:
    """One full reading of ``<root>/<hca>/ports/<port>`` at monotonic time ``now`` (s).

    ``state``/``phys_state``/``link_layer`` are parsed by number/name (see the ``parse_*``
    functions), ``rate_gbps`` is in Gb/s. ``counters`` merges ``counters/``, ``counters_ext/``
    (64-bit, preferred when readable) and ``hw_counters/`` (prefixed ``hw_`` only on a name
    clash); values are raw: ``port_xmit_data``/``port_rcv_data`` stay in 4-octet words (IBA
    PortCounters; multiply by 4 for bytes). ``saturated`` names counters stuck at the maximum of
    their IBA width (COUNTER_WIDTHS). ``netdev`` is passed through (discovery knows it).
    A missing counters directory is not an error (e.g. only ``hw_counters/`` present). RoCE
    (Ethernet) ports also get their GID table in ``gids`` (:func:`read_gids`).
    Never raises for a bad file: see the module docstring for ``errors``.
    """
    root_s = str(root)
    base = _read_base(reader, root_s, hca, port)
    counters = _read_counters(reader, root_s, f"{hca}/ports/{port}") if base.present else None
    roce = base.present and base.link_layer == LinkLayer.ETHERNET
    obs = _observation(hca, port, now, base, counters, netdev)
    return replace(obs, gids=read_gids(root, hca, port, reader=reader)) if roce else obs


def _error_key(error: str) -> tuple[str, str]:
    """(file, kind) of an error string, so that changing garbage is still "the same bad file"."""
    rel, _, detail = error.partition(": ")
    return rel, detail.split(" ", 1)[0]


def _removed(hca: str, port: int, now: float) -> PortObservation:
    return PortObservation(
        hca=hca,
        port=port,
        monotonic=now,
        errors=(f"{hca}/ports/{port}: ENOENT (device removed)",),
        present=False,
    )
