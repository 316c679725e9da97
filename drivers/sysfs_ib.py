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
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
import math
import os
import re
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import structlog

from linkguard.drivers.base import PortObservation
from linkguard.models import (
    LANE_GBPS,
    LINK_WIDTHS,
    MAX_PORT_RATE_GBPS,
    LinkLayer,
    PhysState,
    PortStateName,
)

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
T = TypeVar("T")

DEFAULT_ROOT = Path("/sys/class/infiniband")

#: ``reader(path) -> text``: reads one sysfs attribute; raises OSError like the kernel's ``show()``.
Reader = Callable[[str], str]
#: ``phy_stats(netdev) -> {name: value}``: a RoCE port's netdev statistics (``ethtool -S``,
#: :func:`linkguard.drivers.ethtool_stats.read_ethtool_stats`); raises OSError when unreadable.
PhyStats = Callable[[str], dict[str, int]]

#: Bit width of each PMA counter in the IBA PortCounters attribute (attribute ID 0x0012, IBA
#: Specification vol. 1, 16.1.3.5 "PortCounters"), exactly as the kernel's
#: drivers/infiniband/core/sysfs.c ``PORT_PMA_ATTR`` table exposes them in ``counters/``. A counter
#: at its maximum (2**width - 1) is *saturated*: PMA PortCounters stop at all ones instead of
#: wrapping (IBA 16.1.3.5). When the PMA supports PortCountersExtended the kernel shows the four
#: data/packet counters as 64-bit instead (a value above 2**32 - 1 proves that).
COUNTER_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_data": 32,  # 4-octet words (IBA: PortXmitData "divided by 4")
    "port_rcv_data": 32,  # 4-octet words
    "port_xmit_packets": 32,
    "port_rcv_packets": 32,
    "port_xmit_wait": 32,
}
#: Counters with no known width (PortCountersExtended unicast/multicast, hw_counters) only count
#: as saturated at 2**64 - 1. mlx5 hw_counters are 32-bit firmware Q counters that wrap, so
#: 2**32 - 1 there is an ordinary value.
_U64_MAX = 2**64 - 1

_STATE_BY_NUM = {
    0: PortStateName.NOP,
    1: PortStateName.DOWN,
    2: PortStateName.INIT,
    3: PortStateName.ARMED,
    4: PortStateName.ACTIVE,
    5: PortStateName.ACTIVE_DEFER,
}
_PHYS_BY_NUM = {
    1: PhysState.SLEEP,
    2: PhysState.POLLING,
    3: PhysState.DISABLED,
    4: PhysState.PORT_CONFIGURATION_TRAINING,
    5: PhysState.LINK_UP,
    6: PhysState.LINK_ERROR_RECOVERY,
    7: PhysState.PHY_TEST,
}
_NUM_NAME = re.compile(r"^\s*(\d{1,3})\s*:\s*(.*?)\s*$", re.S)
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:Gb|GB)/sec(?:\s*\(([^)]*)\))?\s*$")
#: rate_show's widths (ib_width_enum_to_int); it prints SDR with no name: ``10 Gb/sec (4X)``
_LANES = re.compile(r"^\s*(\d{1,3})X\s*([A-Za-z0-9]*)\s*$")
_HCA_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_NETDEV_NAME = re.compile(r"^[A-Za-z0-9_.\-@:]{1,15}$")
_PCI_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_MAX_READ = 4096  # one sysfs page


def read_sysfs(path: str) -> str:
    """Read one sysfs attribute (at most one page, 4096 bytes) as text.

    Raises OSError with the errno of the kernel's ``show()`` (sysfs fails the ``read``, not the
    ``open``). Undecodable bytes become U+FFFD, so garbage fails parsing rather than decoding.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _MAX_READ)
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


# --------------------------------------------------------------------------------------------
# parsers: text -> (value, problem); problem is None when the text is fine


def _short(text: str) -> str:
    t = text.strip()
    return repr(t if len(t) <= 40 else t[:40] + "...")


def _norm(name: str) -> str:
    return name.replace(" ", "").replace("_", "").lower()


def parse_state(text: str) -> tuple[PortStateName | None, str | None]:
    """``4: ACTIVE`` -> (ACTIVE, None). The number decides; a name that disagrees adds a problem.

    Format: drivers/infiniband/core/sysfs.c ``state_show`` (``"%d: %s"``), numbers from IBA
    vol. 1 14.2.5.6 PortInfo.PortState (0 NOP .. 5 ACTIVE_DEFER). A bare known name is accepted.
    """
    if not text.strip():
        return None, "empty"
    m = _NUM_NAME.match(text)
    if m is None:
        try:
            return PortStateName(text.strip().upper()), None
        except ValueError:
            return None, f"unparsable {_short(text)}"
    num, name = int(m.group(1)), m.group(2)
    value = _STATE_BY_NUM.get(num)
    if value is None:
        return None, f"unknown state number {num} {_short(text)}"
    if _norm(name) != _norm(value.value):
        return value, f"text {_short(name)} does not match {num} ({value.value})"
    return value, None


def parse_phys_state(text: str) -> tuple[PhysState | None, str | None]:
    """``5: LinkUp`` -> (LINK_UP, None). The number decides (IBA vol. 1 14.2.5.6
    PortInfo.PortPhysicalState: 1 Sleep .. 7 PhyTest; 0 "no state change" is not a reading);
    a name that disagrees (``4: ACTIVE``, as in prometheus/procfs' fixture) adds a problem."""
    if not text.strip():
        return None, "empty"
    m = _NUM_NAME.match(text)
    if m is None:
        wanted = _norm(text)
        for value in PhysState:
            if _norm(value.value) == wanted:
                return value, None
        return None, f"unparsable {_short(text)}"
    num, name = int(m.group(1)), m.group(2)
    phys = _PHYS_BY_NUM.get(num)
    if phys is None:
        return None, f"unknown phys_state number {num} {_short(text)}"
    if _norm(name) != _norm(phys.value):
        return phys, f"text {_short(name)} does not match {num} ({phys.value})"
    return phys, None


def parse_rate(text: str) -> tuple[float | None, str | None]:
    """``400 Gb/sec (4X NDR)`` -> 400.0 (Gb/s). Also ``2.5 Gb/sec (1X SDR)``, ``10 Gb/sec (4X)``
    and ``0 GB/sec`` (-> 0.0; the capital-B form is only seen with 0 and read as Gb/s).
    Format: drivers/infiniband/core/sysfs.c ``rate_show``, which prints the active width times
    the lane rate (:data:`linkguard.models.LANE_GBPS`). A rate that is not that product
    (``800 Gb/sec (4X NDR)``), or above ``MAX_PORT_RATE_GBPS`` (12X XDR) with no known width and
    speed, is no reading the kernel makes: a problem, never a rate a port is then held to."""
    if not text.strip():
        return None, "empty"
    m = _RATE.match(text)
    rate = float(m.group(1)) if m is not None else math.inf
    if not math.isfinite(rate):  # no match, or more digits than a float holds (1e309 -> inf)
        return None, f"unparsable {_short(text)}"
    lanes = _LANES.match(m.group(2) or "") if m is not None else None
    width = int(lanes.group(1)) if lanes is not None else 0
    speed = (lanes.group(2).upper() or "SDR") if lanes is not None else ""
    if width in LINK_WIDTHS and speed in LANE_GBPS:
        expected = width * LANE_GBPS[speed]
        if rate != expected:
            return None, f"{rate:g} Gb/s is not {width}X {speed} ({expected:g} Gb/s)"
    elif rate > MAX_PORT_RATE_GBPS:
        return None, f"{rate:g} Gb/s is above any port's ({MAX_PORT_RATE_GBPS:g} Gb/s, 12X XDR)"
    return rate, None


def parse_link_layer(text: str) -> tuple[LinkLayer | None, str | None]:
    """``InfiniBand`` / ``Ethernet`` (surrounding whitespace and blank lines ignored)."""
    t = text.strip()
    if not t:
        return None, "empty"
    for value in LinkLayer:
        if t.lower() == value.value.lower():
            return value, None
    return None, f"unknown link layer {_short(t)}"


def parse_counter(text: str) -> tuple[int | None, str | None]:
    """Decimal counter -> int. ``N/A (no PMA)`` -> (None, None): a known "no Performance
    Management Agent" (iWARP, some drivers), not an error. Anything else non-decimal -> problem."""
    t = text.strip()
    if not t:
        return None, "empty"
    if t.startswith("N/A"):
        return None, None
    if t.isascii() and t.isdigit() and len(t) <= 20:
        value = int(t)
        if value <= _U64_MAX:
            return value, None
    return None, f"unparsable {_short(t)}"


def _at_max(value: int, width: int | None) -> bool:
    return value == (2**width - 1 if width is not None else _U64_MAX)


def is_saturated(name: str, value: int) -> bool:
    """True when a ``counters/`` value is stuck at the maximum of its IBA width (COUNTER_WIDTHS);
    counters of unknown width only at 2**64 - 1."""
    return _at_max(value, COUNTER_WIDTHS.get(name))


# --------------------------------------------------------------------------------------------
# reading helpers


def _errno_text(exc: OSError) -> str:
    code = exc.errno
    if code is None and exc.args and isinstance(exc.args[0], int):
        code = exc.args[0]  # OSError(errno.EIO) built with one argument
    if code is None:
        return f"error ({exc})"
    name = "EOPNOTSUPP" if code == errno_mod.EOPNOTSUPP else errno_mod.errorcode.get(code)
    return f"{name or code} ({os.strerror(code)})"


def _read(reader: Reader, root: str, rel: str, errors: list[str]) -> str | None:
    """Text of ``root/rel`` or None with ``"<rel>: <ERRNO> (...)"`` appended to ``errors``."""
    try:
        return reader(f"{root}/{rel}")
    except OSError as exc:
        errors.append(f"{rel}: {_errno_text(exc)}")
    except (ValueError, UnicodeError) as exc:  # a test reader / odd bytes
        errors.append(f"{rel}: unreadable ({exc.__class__.__name__})")
    return None


def _parse(
    reader: Reader,
    root: str,
    rel: str,
    parser: Callable[[str], tuple[T | None, str | None]],
    errors: list[str],
) -> T | None:
    """Read and parse ``root/rel``; a failure or a parse problem goes to ``errors``."""
    text = _read(reader, root, rel, errors)
    if text is None:
        return None
    value, problem = parser(text)
    if problem is not None:
        errors.append(f"{rel}: {problem}")
    return value


def _listdir(path: str, rel: str, errors: list[str]) -> list[str]:
    """Names in a directory; a missing directory is simply empty (not an error)."""
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        errors.append(f"{rel}: {_errno_text(exc)}")
        return []


def _optional(reader: Reader, root: str, rel: str, errors: list[str]) -> str | None:
    """Stripped text of an attribute that may legitimately be absent (ENOENT -> None silently)."""
    try:
        text = reader(f"{root}/{rel}")
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno_mod.ENOENT or (exc.args and exc.args[0] == errno_mod.ENOENT):
            return None
        errors.append(f"{rel}: {_errno_text(exc)}")
        return None
    except (ValueError, UnicodeError) as exc:
        errors.append(f"{rel}: unreadable ({exc.__class__.__name__})")
        return None
    text = text.strip()
    return text or None


_ZERO_GID = re.compile(r"^[0:]+$")
#: GID table entries read at most (mlx5 RoCE ports have 255; IBA allows up to 2**16)
_MAX_GIDS = 1024


def read_gids(root: Path, hca: str, port: int, *, reader: Reader = read_sysfs) -> dict[int, str]:
    """The non-empty entries of ``<root>/<hca>/ports/<port>/gids/``: index -> GID text
    (lowercased, as the kernel prints it with ``%pI6``). All-zero entries (unused), unreadable
    ones (EINVAL for an index the port does not populate) and non-numeric names are left out;
    at most 1024 entries. A missing ``gids/`` directory gives ``{}``. Never raises."""
    root_s, base = str(root), f"{hca}/ports/{port}/gids"
    ignored: list[str] = []
    names = [n for n in _listdir(f"{root_s}/{base}", base, ignored) if n.isdigit()]
    out: dict[int, str] = {}
    for name in sorted(names, key=int)[:_MAX_GIDS]:
        text = _optional(reader, root_s, f"{base}/{name}", ignored)
        if text and not _ZERO_GID.match(text) and len(text) <= 64:
            out[int(name)] = text.lower()
    return out


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


# --------------------------------------------------------------------------------------------
# discovery


@dataclass(frozen=True)
class HCADescriptor:
    """One RDMA device under the class directory (static facts, re-read on re-discovery).

    ``ports`` are 1-based port numbers (``ports/<n>``). ``pci_address`` is the PCI BDF
    (``0000:18:00.0``) found in the resolved ``device`` symlink (None when there is no symlink or
    no PCI parent, e.g. rxe/siw). ``numa_node`` is ``device/numa_node`` (-1 -> None). ``netdevs``
    maps port -> netdev name from ``ports/<n>/gid_attrs/ndevs/0`` (RoCE), else from
    ``device/net/*`` (one port: the single name; several: by the netdev's 0-based ``dev_port``).
    ``hca_type`` / ``board_id`` / ``fw_ver`` are None when absent (hfi1, irdma). ``errors`` lists
    attribute reads that failed during discovery.
    """

    hca: str
    ports: tuple[int, ...]
    link_layers: dict[int, LinkLayer | None] = field(default_factory=dict)
    pci_address: str | None = None
    numa_node: int | None = None
    netdevs: dict[int, str] = field(default_factory=dict)
    hca_type: str | None = None
    board_id: str | None = None
    fw_ver: str | None = None
    errors: tuple[str, ...] = ()


def _pci_address(dev_link: str) -> str | None:
    if not os.path.lexists(dev_link):
        return None
    try:
        resolved = os.path.realpath(dev_link)
    except OSError:
        return None
    # the symlink's basename is the BDF for PCI devices; otherwise the nearest PCI ancestor
    for part in reversed(resolved.split("/")):
        if _PCI_BDF.match(part):
            return part.lower()
    return None


def _netdevs(reader: Reader, root: str, hca: str, ports: tuple[int, ...]) -> dict[int, str]:
    out: dict[int, str] = {}
    ignored: list[str] = []  # IB ports fail ndevs/0 with EINVAL: expected, not reported
    for p in ports:
        name = _optional(reader, root, f"{hca}/ports/{p}/gid_attrs/ndevs/0", ignored)
        if name and _NETDEV_NAME.match(name):
            out[p] = name
    missing = [p for p in ports if p not in out]
    if not missing:
        return out
    net_dir = f"{root}/{hca}/device/net"
    names = [n for n in _listdir(net_dir, "", ignored) if _NETDEV_NAME.match(n)]
    if not names:
        return out
    if len(ports) == 1 and len(names) == 1:
        out.setdefault(ports[0], names[0])
        return out
    for n in names:
        dev_port = _optional(reader, root, f"{hca}/device/net/{n}/dev_port", ignored)
        if dev_port is not None and dev_port.isdigit() and int(dev_port) + 1 in missing:
            out.setdefault(int(dev_port) + 1, n)
    return out


def discover_hcas(root: Path = DEFAULT_ROOT, *, reader: Reader = read_sysfs) -> list[HCADescriptor]:
    """Every RDMA device under ``root``, sorted naturally by name (``mlx5_2`` < ``mlx5_10``).

    A missing class directory (RDMA stack not loaded) gives ``[]``. Directory names that are not
    valid HCA names are skipped. Never raises for a bad file.
    """
    root_s = str(root)
    try:
        names = os.listdir(root_s)
    except OSError:
        return []
    out: list[HCADescriptor] = []
    for hca in sorted(names, key=_natural):
        if not _HCA_NAME.match(hca) or not os.path.isdir(f"{root_s}/{hca}"):
            continue
        errors: list[str] = []
        ports = tuple(
            sorted(
                int(p)
                for p in _listdir(f"{root_s}/{hca}/ports", f"{hca}/ports", errors)
                if p.isdigit() and 1 <= int(p) <= 255
            )
        )
        link_layers = {
            p: _parse(reader, root_s, f"{hca}/ports/{p}/link_layer", parse_link_layer, errors)
            for p in ports
        }
        numa: int | None = None
        numa_text = _optional(reader, root_s, f"{hca}/device/numa_node", errors)
        if numa_text is not None:
            try:
                numa = int(numa_text)
            except ValueError:
                errors.append(f"{hca}/device/numa_node: unparsable {_short(numa_text)}")
            if numa is not None and not 0 <= numa <= 1023:
                numa = None  # -1: no NUMA affinity
        out.append(
            HCADescriptor(
                hca=hca,
                ports=ports,
                link_layers=link_layers,
                pci_address=_pci_address(f"{root_s}/{hca}/device"),
                numa_node=numa,
                netdevs=_netdevs(reader, root_s, hca, ports),
                hca_type=_optional(reader, root_s, f"{hca}/hca_type", errors),
                board_id=_optional(reader, root_s, f"{hca}/board_id", errors),
                fw_ver=_optional(reader, root_s, f"{hca}/fw_ver", errors),
                errors=tuple(errors),
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# one port


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


# --------------------------------------------------------------------------------------------
# the polling source


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
