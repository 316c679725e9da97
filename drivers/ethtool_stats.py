"""RoCE PHY error counters of a netdev: the driver statistics that ``ethtool -S`` prints.

Consumes: a netdev name (read through the ``SIOCETHTOOL`` ioctl, ``ETHTOOL_GSTRINGS`` +
``ETHTOOL_GSTATS``, via pyroute2's :class:`~pyroute2.ethtool.ioctl.IoctlEthtool`) or the text
of ``ethtool -S`` (:func:`parse_ethtool_stats`). Produces: ``{name: value}`` of the counters in
:data:`PHY_COUNTERS` (mlx5 names), for :class:`~linkguard.drivers.base.PortObservation`
``counters``.

Why the ioctl and not netlink or sysfs: mlx5's physical-port counters (``link_down_events_phy``,
``rx_crc_errors_phy``, ``rx_symbol_err_phy``: drivers/net/ethernet/mellanox/mlx5/core/
en_stats.c, the PPCNT register groups) exist only as driver-private statistics strings
(``ETH_SS_STATS``). The ethtool netlink interface's ``ETHTOOL_MSG_STATS_GET`` (kernel >= 5.13)
returns only the standard IEEE 802.3 groups (``eth-phy``, ``eth-mac``, ``rmon``...), not these
names, and pyroute2 0.9 does not implement it; sysfs ``statistics/`` has the generic
``rtnl_link_stats64`` only. The ioctl works on any netdev (a veth answers with its own ~10
names) and is what ``ethtool -S`` itself uses.

Bad input: a missing netdev raises ``OSError`` (ENODEV); a netdev without driver statistics
(``lo``) raises :class:`EthtoolStatsUnsupported`. The parser never raises: lines that are not
``name: decimal`` are skipped and returned as problems.
"""

from __future__ import annotations

import re

__all__ = [
    "PHY_COUNTERS",
    "EthtoolStatsUnsupported",
    "parse_ethtool_stats",
    "phy_counters",
    "read_ethtool_stats",
]

#: The mlx5 physical-port counters linkguard's counter health watches (names as ``ethtool -S``
#: prints them; mlx5 ``ethtool -S`` documentation, "Physical Port Counters"):
#: ``link_down_events_phy`` (times the link went down), ``rx_crc_errors_phy`` (frames with an
#: FCS error), ``rx_symbol_err_phy`` (undefined symbols / PCS errors while the link was up).
PHY_COUNTERS: tuple[str, ...] = ("link_down_events_phy", "rx_crc_errors_phy", "rx_symbol_err_phy")

_U64_MAX = 2**64 - 1
_LINE = re.compile(r"^\s*([^:\s][^:]*?)\s*:\s*(\S+)\s*$")


class EthtoolStatsUnsupported(OSError):
    """The netdev has no driver statistics (EOPNOTSUPP from ``ETHTOOL_GSSET_INFO``)."""


def parse_ethtool_stats(text: str) -> tuple[dict[str, int], list[str]]:
    """``ethtool -S`` output -> (``{name: value}``, problems).

    Accepts the header ``NIC statistics:`` and indented ``name: value`` lines (ethtool's own
    format, ``"     %.*s: %llu"`` in ethtool.c ``dump_stats``) and the unindented body of
    the real mlx5 capture (isc-projects/ethq ``tests/mlx5_core``). Names keep their case; a
    repeated name keeps its first value (ethtool prints driver strings verbatim, and some
    drivers repeat one). Values must be decimal and fit in 64 bits; any other line is
    reported in ``problems`` as ``"line <n>: <text>"`` and skipped. Never raises.
    """
    values: dict[str, int] = {}
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.strip().endswith("statistics:"):
            continue
        m = _LINE.match(line)
        if m is None:
            problems.append(f"line {n}: {line.strip()[:60]!r}")
            continue
        name, raw = m.group(1), m.group(2)
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 20 and int(raw) <= _U64_MAX):
            problems.append(f"line {n}: {name}: not a u64 counter {raw[:30]!r}")
            continue
        values.setdefault(name, int(raw))
    return values, problems


def phy_counters(stats: dict[str, int]) -> dict[str, int]:
    """The :data:`PHY_COUNTERS` present in ``stats`` (a netdev without them gives ``{}``:
    missing counters are left out, never 0)."""
    return {name: stats[name] for name in PHY_COUNTERS if name in stats}


def read_ethtool_stats(netdev: str) -> dict[str, int]:
    """Every driver statistic of ``netdev`` in the calling thread's network namespace, as
    ``ethtool -S`` would print them (u64 values). Blocking (two ioctls); call it from a worker
    thread. Raises ``OSError`` (ENODEV: no such netdev) or :class:`EthtoolStatsUnsupported`.
    """
    from pyroute2.ethtool.ioctl import IoctlEthtool, NotSupportedError

    if not netdev or len(netdev) > 15 or "/" in netdev or "\0" in netdev:
        raise ValueError(f"invalid netdev name {netdev!r}")
    eth = IoctlEthtool(netdev)
    try:
        pairs = eth.get_statistics()
    except NotSupportedError:
        raise EthtoolStatsUnsupported(f"{netdev}: no driver statistics (ethtool -S)") from None
    finally:
        eth.close()
    out: dict[str, int] = {}
    for name, value in pairs:
        out.setdefault(str(name), int(value))
    return out
