"""One sysfs attribute of an RDMA port: reading it (:func:`read_sysfs`, errno text) and parsing
its text (state, phys_state, rate, link_layer, counters) into a value and a problem. The format
of each attribute is in :mod:`linkguard.drivers.sysfs_ib`'s docstring; nothing here raises for
one bad file (a failure or a problem goes to the caller's ``errors``)."""

from __future__ import annotations

import errno as errno_mod
import math
import os
import re
from collections.abc import Callable
from typing import TypeVar

from linkguard.models import (
    LANE_GBPS,
    LINK_WIDTHS,
    MAX_PORT_RATE_GBPS,
    LinkLayer,
    PhysState,
    PortStateName,
)

T = TypeVar("T")


#: ``reader(path) -> text``: reads one sysfs attribute; raises OSError like the kernel's ``show()``.
Reader = Callable[[str], str]


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
