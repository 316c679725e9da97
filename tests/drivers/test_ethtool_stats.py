"""RoCE PHY counters: ``ethtool -S`` parsed from a real mlx5 capture, read through pyroute2's
ethtool ioctl on a real veth (in a namespace the test creates), merged into sysfs readings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from linkguard.agent.health import CounterHealth
from linkguard.drivers.ethtool_stats import (
    PHY_COUNTERS,
    parse_ethtool_stats,
    phy_counters,
)
from linkguard.drivers.sysfs_ib import SysfsIBSource, _Poller
from tests.drivers.test_sysfs_ib import FIXTURES, GPUD, copy_tree
from tests.support import missing, require_binary, require_root

CAPTURE = FIXTURES / "isc-projects-ethq" / "mlx5_core.ethtool-S.txt"


@pytest.fixture
def capture() -> str:
    if not CAPTURE.is_file():
        missing(f"fixture {CAPTURE} not found (set LINKGUARD_FIXTURES)")
    return CAPTURE.read_text()


def test_real_mlx5_capture_parses_completely(capture: str) -> None:
    values, problems = parse_ethtool_stats(capture)
    assert problems == []
    assert len(values) == 751  # every line of the capture is one counter
    assert values["rx_packets"] == 845320277
    assert values["tx_bytes_phy"] == 2662454044895
    assert phy_counters(values) == {
        "link_down_events_phy": 0,
        "rx_crc_errors_phy": 0,
        "rx_symbol_err_phy": 0,
    }


def test_ethtool_own_format_and_bad_lines() -> None:
    text = (
        "NIC statistics:\n"
        "     rx_crc_errors_phy: 12\n"
        "     rx_symbol_err_phy: 18446744073709551615\n"
        "     weird line\n"
        "     rx_bytes: -3\n"
        "     link_down_events_phy: 99999999999999999999999\n"
        "     rx_crc_errors_phy: 13\n"  # repeated: first wins
    )
    values, problems = parse_ethtool_stats(text)
    assert values == {"rx_crc_errors_phy": 12, "rx_symbol_err_phy": 2**64 - 1}
    assert problems == [
        "line 4: 'weird line'",
        "line 5: rx_bytes: not a u64 counter '-3'",
        "line 6: link_down_events_phy: not a u64 counter '99999999999999999999999'",
    ]
    assert phy_counters({"rx_packets": 1}) == {}  # missing, never 0


def test_rising_crc_errors_in_the_real_capture_degrade(capture: str) -> None:
    """The real capture's counters, advanced over time as a failing optic would."""
    base, _ = parse_ethtool_stats(capture)
    h = CounterHealth()
    key = "mlx5_bond_0/1"
    verdicts = []
    for i in range(4):
        stats = dict(base, rx_crc_errors_phy=base["rx_crc_errors_phy"] + 45 * i)
        verdicts.append(h.observe(key, phy_counters(stats), frozenset(), usable=True, now=10.0 * i))
    assert [v.degraded for v in verdicts] == [False, False, False, True]
    assert verdicts[-1].reason == "rx_crc_errors_phy 135/60s"


def _in_netns(ns: str, code: str) -> object:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[2],
    )
    return json.loads(out.stdout)


def test_pyroute2_ioctl_reads_what_ethtool_prints_on_a_real_veth() -> None:
    require_root()
    ethtool = require_binary("ethtool")
    ns = f"lgeth{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(
            ["ip", "-n", ns, "link", "add", "ve0", "index", "71", "type", "veth", "peer", "name",
             "ve1", "index", "72"],
            check=True,
        )  # fmt: skip
        code = (
            "import json; from linkguard.drivers.ethtool_stats import read_ethtool_stats as r, "
            "EthtoolStatsUnsupported as U\n"
            "out = {'ve0': r('ve0')}\n"
            "try: r('nope0')\nexcept OSError as e: out['nope0'] = [type(e).__name__, e.errno]\n"
            "try: r('lo')\nexcept U as e: out['lo'] = type(e).__name__\n"
            "print(json.dumps(out))"
        )
        got = _in_netns(ns, code)
        printed = subprocess.run(
            ["ip", "netns", "exec", ns, ethtool, "-S", "ve0"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    parsed, problems = parse_ethtool_stats(printed)
    assert problems == []
    assert isinstance(got, dict)
    assert got["ve0"] == parsed  # the library path reads exactly what `ethtool -S` prints
    assert got["ve0"]["peer_ifindex"] == 72
    assert phy_counters(got["ve0"]) == {}  # a veth has no PHY counters: missing, not 0
    assert got["nope0"] == ["OSError", 19]  # ENODEV
    assert got["lo"] == "EthtoolStatsUnsupported"


def test_sysfs_poller_merges_phy_counters_of_roce_ports(tmp_path: Path, capture: str) -> None:
    root = copy_tree(tmp_path, GPUD)
    values, _ = parse_ethtool_stats(capture)
    stats = {"n": 0}

    def phy_stats(netdev: str) -> dict[str, int]:  # the real capture, advancing per read
        if netdev != "bond0":
            raise OSError(19, "No such device")
        stats["n"] += 1
        return dict(values, rx_symbol_err_phy=7 * stats["n"])

    net = root / "mlx5_bond_0" / "device" / "net" / "bond0"
    net.mkdir(parents=True)
    poller = _Poller(
        root=root,
        ports={"mlx5_bond_0/1", "mlx5_0/1"},
        reader=SysfsIBSource().reader,
        rediscover_s=5.0,
        counters_interval_s=1.0,
        phy_stats=phy_stats,
    )
    first = {o.key: o for o in poller.poll(0.0)}
    roce, ib = first["mlx5_bond_0/1"], first["mlx5_0/1"]
    assert roce.netdev == "bond0"
    assert {n: roce.counters[n] for n in PHY_COUNTERS} == {
        "link_down_events_phy": 0,
        "rx_crc_errors_phy": 0,
        "rx_symbol_err_phy": 7,
    }
    assert roce.gids == {}  # the fixture has no gids/ (an empty table)
    assert not any(n.endswith("_phy") for n in ib.counters) and ib.gids is None
    # between counter readings the last PHY values are kept (no change, no reading)
    assert poller.poll(0.5) == []
    again = {o.key: o for o in poller.poll(1.0)}
    assert again["mlx5_bond_0/1"].counters["rx_symbol_err_phy"] == 14


def test_unreadable_netdev_adds_no_phy_counters(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    (root / "mlx5_bond_0" / "device" / "net" / "bond0").mkdir(parents=True)

    def phy_stats(netdev: str) -> dict[str, int]:
        raise OSError(19, os.strerror(19))

    poller = _Poller(
        root=root,
        ports={"mlx5_bond_0/1"},
        reader=SysfsIBSource().reader,
        rediscover_s=5.0,
        counters_interval_s=1.0,
        phy_stats=phy_stats,
    )
    (obs,) = poller.poll(0.0)
    assert obs.state is not None and not any(n.endswith("_phy") for n in obs.counters)
