"""The sysfs InfiniBand driver on copies of real sysfs trees (../shared/fixtures/real)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard.drivers.base import PortObservation, PortSource
from linkguard.drivers.counters import CounterBaseline
from linkguard.drivers.sysfs_ib import (
    SysfsIBSource,
    discover_hcas,
    parse_phys_state,
    parse_rate,
    parse_state,
    read_port,
    read_sysfs,
)
from linkguard.models import LinkLayer, PhysState, PortStateName
from tests.support import missing

FIXTURES = Path(
    os.environ.get(
        "LINKGUARD_FIXTURES", Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "real"
    )
)
PROCFS = "prometheus-procfs/tree/sys/class/infiniband"
NODE_EXPORTER = "prometheus-node_exporter/tree/sys/class/infiniband"
GPUD = "leptonai-gpud/tree/sys-class-infiniband-h100.0"
GPUD_HCAS = [f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)] + ["mlx5_bond_0"]


def copy_tree(tmp_path: Path, rel: str) -> Path:
    """A writable copy of a fixture tree (the originals are read-only)."""
    src = FIXTURES / rel
    if not src.is_dir():
        missing(f"fixture tree {src} not found (set LINKGUARD_FIXTURES)")
    dst = tmp_path / "infiniband"
    shutil.copytree(src, dst)
    for dirpath, _dirs, files in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    return dst


def put(path: Path, text: str) -> None:
    """Replace a file atomically, so a concurrent poll never sees it half-written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def failing(suffix: str, code: int) -> Callable[[str], str]:
    """A reader that fails like the kernel's show() for one file."""

    def reader(path: str) -> str:
        if path.endswith(suffix):
            raise OSError(code)
        return read_sysfs(path)

    return reader


@pytest.fixture
def gpud(tmp_path: Path) -> Path:
    return copy_tree(tmp_path, GPUD)


@pytest.fixture
def procfs(tmp_path: Path) -> Path:
    return copy_tree(tmp_path, PROCFS)


@pytest.fixture
def node_exporter(tmp_path: Path) -> Path:
    return copy_tree(tmp_path, NODE_EXPORTER)


# ---------------------------------------------------------------------------- real trees


def test_gpud_h100_tree(gpud: Path) -> None:
    hcas = discover_hcas(gpud)
    assert [d.hca for d in hcas] == GPUD_HCAS
    mlx5_0 = hcas[0]
    assert (mlx5_0.ports, mlx5_0.hca_type, mlx5_0.fw_ver) == ((1,), "MT4129", "28.41.1000")
    assert mlx5_0.board_id == "MT_0000000838"
    assert hcas[-1].link_layers == {1: LinkLayer.ETHERNET}

    o = read_port(gpud, "mlx5_0", 1, now=12.5)
    assert (o.state, o.phys_state, o.rate_gbps) == (PortStateName.ACTIVE, PhysState.LINK_UP, 400.0)
    assert (o.link_layer, o.monotonic, o.errors) == (LinkLayer.INFINIBAND, 12.5, ())
    assert o.counters["port_xmit_data"] == 230442669431839  # raw 4-octet words
    assert o.counters["port_xmit_wait"] == 2489603687
    assert o.counters["link_downed"] == 0
    assert o.counters["out_of_buffer"] == 0  # hw_counters/
    assert o.counters["rx_write_requests"] == 3809045607
    assert "lifespan" not in o.counters  # a setting (ms), not a counter
    # 4-bit ExcessiveBufferOverrunErrors at 15 is stuck, like every H100 port in this tree
    assert o.saturated == {"excessive_buffer_overrun_errors"}

    bond = read_port(gpud, "mlx5_bond_0", 1, now=0)
    assert (bond.link_layer, bond.rate_gbps, bond.state) == (
        LinkLayer.ETHERNET,
        200.0,
        PortStateName.ACTIVE,
    )

    mlx5_1 = read_port(gpud, "mlx5_1", 1, now=0)
    assert mlx5_1.counters["link_downed"] == 255
    assert "link_downed" in mlx5_1.saturated  # 8-bit LinkDownedCounter at max


def test_node_exporter_tree(node_exporter: Path) -> None:
    assert [d.hca for d in discover_hcas(node_exporter)] == ["i40iw0", "mlx4_0"]

    iw = read_port(node_exporter, "i40iw0", 1, now=0)
    assert iw.rate_gbps == 10.0  # "10 Gb/sec (4X)": no speed suffix
    assert len(iw.counters) == 17
    assert all(v is None for v in iw.counters.values())  # N/A (no PMA)
    assert iw.errors == ()  # "no PMA" is known-unknown, not a bad file

    p1 = read_port(node_exporter, "mlx4_0", 1, now=0)
    assert p1.counters["port_xmit_wait"] == 4294967295
    assert "port_xmit_wait" in p1.saturated
    # counters_ext/port_rcv_packets_64 (0) wins over the legacy 32-bit file (6825908347)
    assert p1.counters["port_rcv_packets"] == 0
    assert p1.counters["port_xmit_data"] == 3733440
    assert p1.counters["unicast_xmit_packets"] == 61239
    assert p1.counters["port_xmit_discards"] == 5

    p2 = read_port(node_exporter, "mlx4_0", 2, now=0)  # only a subset of counter files
    assert p2.errors == () and p2.state is PortStateName.ACTIVE
    assert "symbol_error" not in p2.counters and p2.counters["port_rcv_data"] == 4631917


def test_procfs_tree(procfs: Path) -> None:
    hcas = {d.hca: d for d in discover_hcas(procfs)}
    assert sorted(hcas) == ["hfi1_0", "mlx4_0", "mlx5_0"]
    hfi = hcas["hfi1_0"]
    assert (hfi.hca_type, hfi.fw_ver) == (None, "1.27.0")  # Omni-Path: no hca_type
    assert hfi.board_id is not None and hfi.board_id.startswith("HPE 100Gb 1-port OP101")
    assert read_port(procfs, "hfi1_0", 1, now=0).rate_gbps == 100.0

    # phys_state reads "4: ACTIVE": the number decides (4 = PortConfigurationTraining)
    q = read_port(procfs, "mlx5_0", 1, now=0)
    assert q.state is PortStateName.ACTIVE
    assert q.phys_state is PhysState.PORT_CONFIGURATION_TRAINING
    assert q.errors == (
        "mlx5_0/ports/1/phys_state: text 'ACTIVE' does not match 4 (PortConfigurationTraining)",
    )
    assert (q.rate_gbps, q.counters["roce_adp_retrans"]) == (25.0, 99)

    # link_layer "InfiniBand\n\n"
    assert read_port(procfs, "mlx4_0", 2, now=0).link_layer is LinkLayer.INFINIBAND


def test_discovery_pci_numa_netdevs(gpud: Path, tmp_path: Path) -> None:
    """The fixtures carry no device symlinks: add them as the kernel lays them out."""
    pci = tmp_path / "devices" / "pci0000:17" / "0000:18:00.0"
    (pci / "net" / "ibp24s0").mkdir(parents=True)
    (pci / "numa_node").write_text("0\n")
    (gpud / "mlx5_0" / "device").symlink_to(pci)
    bond_pci = tmp_path / "devices" / "pci0000:a0" / "0000:a1:00.1"
    bond_pci.mkdir(parents=True)
    (bond_pci / "numa_node").write_text("-1\n")
    (gpud / "mlx5_bond_0" / "device").symlink_to(bond_pci)
    ndevs = gpud / "mlx5_bond_0" / "ports" / "1" / "gid_attrs" / "ndevs"
    ndevs.mkdir(parents=True)
    (ndevs / "0").write_text("bond0\n")

    hcas = {d.hca: d for d in discover_hcas(gpud)}
    assert (hcas["mlx5_0"].pci_address, hcas["mlx5_0"].numa_node) == ("0000:18:00.0", 0)
    assert hcas["mlx5_0"].netdevs == {1: "ibp24s0"}
    assert (hcas["mlx5_bond_0"].pci_address, hcas["mlx5_bond_0"].numa_node) == (
        "0000:a1:00.1",
        None,  # -1: no NUMA affinity
    )
    assert hcas["mlx5_bond_0"].netdevs == {1: "bond0"}
    assert (hcas["mlx5_1"].pci_address, hcas["mlx5_1"].netdevs) == (None, {})


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("400 Gb/sec (4X NDR)\n", 400.0),
        ("200 Gb/sec (2X NDR)\n", 200.0),
        ("10 Gb/sec (4X)\n", 10.0),
        ("2.5 Gb/sec (1X SDR)\n", 2.5),
        ("0 GB/sec\n", 0.0),
        ("56 Gb/sec (4X FDR)\n", 56.0),
        ("40 Gb/sec (4X FDR10)\n", 40.0),
        ("2400 Gb/sec (12X XDR)\n", 2400.0),
        ("300 Gb/sec (3X NDR)\n", 300.0),  # a width rate_show has no name for: not checked
    ],
)
def test_parse_rate(text: str, gbps: float) -> None:
    assert parse_rate(text) == (gbps, None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("800 Gb/sec (4X NDR)\n", "800 Gb/s is not 4X NDR (400 Gb/s)"),
        ("20 Gb/sec (4X)\n", "20 Gb/s is not 4X SDR (10 Gb/s)"),
        ("100000 Gb/sec\n", "100000 Gb/s is above any port's (2400 Gb/s, 12X XDR)"),
        ("5000 Gb/sec (4X GDR)\n", "5000 Gb/s is above any port's (2400 Gb/s, 12X XDR)"),
        ("30000 Gb/sec (3X NDR)\n", "30000 Gb/s is above any port's (2400 Gb/s, 12X XDR)"),
    ],
)
def test_parse_rate_refuses_what_rate_show_never_prints(text: str, problem: str) -> None:
    """rate_show prints width x lane rate; anything else is a corrupt or forged file, and a
    rate the monitor could take as the port's bar (it is held to it until a restart)."""
    assert parse_rate(text) == (None, problem)


def test_parse_state_and_phys_state() -> None:
    assert parse_state("1: DOWN\n") == (PortStateName.DOWN, None)
    assert parse_state("5: ACTIVE_DEFER\n") == (PortStateName.ACTIVE_DEFER, None)
    state, problem = parse_state("4: DOWN\n")  # the number wins
    assert state is PortStateName.ACTIVE and problem is not None
    assert parse_state("9: UNKNOWN\n")[0] is None
    assert parse_phys_state("2: Polling\n") == (PhysState.POLLING, None)
    assert parse_phys_state("7: Phy Test\n") == (PhysState.PHY_TEST, None)  # kernel spelling
    assert parse_phys_state("0: <unknown>\n")[0] is None


# ---------------------------------------------------------------------------- bad input


def test_no_class_directory(tmp_path: Path) -> None:
    assert discover_hcas(tmp_path / "nope") == []


async def test_rdma_stack_not_loaded_then_appears(tmp_path: Path) -> None:
    root = tmp_path / "infiniband"
    src = copy_tree(tmp_path / "src", GPUD)
    source = SysfsIBSource(root=root, interval_s=0.02)
    agen = source.watch()
    try:
        with capture_logs() as logs:
            assert await anext(agen) == []
            os.rename(src, root)  # the whole class directory appears at once
            batch = await next_batch(agen, lambda b: True)
        assert sorted(o.hca for o in batch) == GPUD_HCAS
        assert [e["event"] for e in logs].count("RDMA stack not loaded") == 1
        assert [e["log_level"] for e in logs if e["event"] == "RDMA stack not loaded"] == [
            "warning"
        ]
    finally:
        await agen.aclose()


def test_garbage_file(gpud: Path) -> None:
    put(gpud / "mlx5_4/ports/1/state", "\x00\xff garbage\n")
    o = read_port(gpud, "mlx5_4", 1, now=0)
    assert o.state is None
    assert len(o.errors) == 1 and o.errors[0].startswith("mlx5_4/ports/1/state: unparsable")
    assert (o.phys_state, o.rate_gbps) == (PhysState.LINK_UP, 400.0)  # rest of the port read
    assert read_port(gpud, "mlx5_5", 1, now=0).state is PortStateName.ACTIVE  # other ports too


def test_garbage_counter(gpud: Path) -> None:
    put(gpud / "mlx5_4/ports/1/counters/symbol_error", "-1\n")
    o = read_port(gpud, "mlx5_4", 1, now=0)
    assert o.counters["symbol_error"] is None
    assert o.counters["port_rcv_errors"] == 14
    assert o.errors == ("mlx5_4/ports/1/counters/symbol_error: unparsable '-1'",)


def test_empty_file(gpud: Path) -> None:
    put(gpud / "mlx5_4/ports/1/rate", "")
    o = read_port(gpud, "mlx5_4", 1, now=0)
    assert o.rate_gbps is None and o.errors == ("mlx5_4/ports/1/rate: empty",)
    assert o.state is PortStateName.ACTIVE


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (errno.EACCES, "EACCES"),
        (errno.EINVAL, "EINVAL"),
        (errno.EOPNOTSUPP, "EOPNOTSUPP"),
        (errno.EIO, "EIO"),
    ],
)
def test_state_read_fails_with_errno(gpud: Path, code: int, name: str) -> None:
    o = read_port(gpud, "mlx5_4", 1, now=0, reader=failing("mlx5_4/ports/1/state", code))
    assert o.state is None
    assert o.errors == (f"mlx5_4/ports/1/state: {name} ({os.strerror(code)})",)
    assert (o.phys_state, o.rate_gbps, o.link_layer) == (
        PhysState.LINK_UP,
        400.0,
        LinkLayer.INFINIBAND,
    )
    assert o.counters["port_rcv_errors"] == 14


def test_counter_read_fails_einval(gpud: Path) -> None:
    reader = failing("counters/link_downed", errno.EINVAL)
    o = read_port(gpud, "mlx5_1", 1, now=0, reader=reader)
    assert o.counters["link_downed"] is None and "link_downed" not in o.saturated
    assert o.errors == ("mlx5_1/ports/1/counters/link_downed: EINVAL (Invalid argument)",)
    assert o.state is PortStateName.ACTIVE


def test_counters_ext_unreadable_falls_back(node_exporter: Path) -> None:
    reader = failing("counters_ext/port_rcv_packets_64", errno.EIO)
    o = read_port(node_exporter, "mlx4_0", 1, now=0, reader=reader)
    assert o.counters["port_rcv_packets"] == 6825908347  # legacy file
    assert o.errors == (
        "mlx4_0/ports/1/counters_ext/port_rcv_packets_64: EIO (Input/output error)",
    )


def test_deleted_file_enoent(gpud: Path) -> None:
    (gpud / "mlx5_4/ports/1/phys_state").unlink()
    o = read_port(gpud, "mlx5_4", 1, now=0)
    assert o.phys_state is None
    assert o.errors == ("mlx5_4/ports/1/phys_state: ENOENT (No such file or directory)",)
    assert o.state is PortStateName.ACTIVE


def test_counter_goes_down_is_a_reset(gpud: Path) -> None:
    baseline = CounterBaseline()
    first = read_port(gpud, "mlx5_4", 1, now=0)
    baseline.update(first.key, first.counters, first.saturated)
    put(gpud / "mlx5_4/ports/1/counters/port_rcv_errors", "20\n")  # 14 -> 20
    put(gpud / "mlx5_4/ports/1/counters/symbol_error", "3\n")
    second = read_port(gpud, "mlx5_4", 1, now=1)
    deltas = baseline.update(second.key, second.counters, second.saturated)
    assert (deltas["port_rcv_errors"], deltas["symbol_error"]) == (6, 3)
    assert deltas["excessive_buffer_overrun_errors"] is None  # saturated: unknown
    put(gpud / "mlx5_4/ports/1/counters/port_rcv_errors", "2\n")  # cleared, counted 2 since
    third = read_port(gpud, "mlx5_4", 1, now=2)
    assert baseline.update(third.key, third.counters, third.saturated)["port_rcv_errors"] == 2


def test_only_hw_counters(gpud: Path) -> None:
    shutil.rmtree(gpud / "mlx5_4/ports/1/counters")
    o = read_port(gpud, "mlx5_4", 1, now=0)
    assert o.errors == ()
    assert "port_rcv_errors" not in o.counters
    assert (o.counters["out_of_buffer"], o.counters["rx_dct_connect"]) == (0, 422237)
    assert o.saturated == frozenset()


def test_zero_rate_without_width(gpud: Path) -> None:
    put(gpud / "mlx5_4/ports/1/rate", "0 GB/sec\n")
    o = read_port(gpud, "mlx5_4", 1, now=0)
    assert (o.rate_gbps, o.errors) == (0.0, ())


# ---------------------------------------------------------------------------- watch()


async def next_batch(
    agen: AsyncIterator[list[PortObservation]],
    done: Callable[[list[PortObservation]], bool],
    *,
    check: Callable[[list[PortObservation]], None] = lambda b: None,
    deadline_s: float = 5.0,
) -> list[PortObservation]:
    """The first batch for which ``done`` holds; ``check`` asserts on every batch until then."""
    async with asyncio.timeout(deadline_s):
        while True:
            batch = await anext(agen)
            check(batch)
            if done(batch):
                return batch


def only(key: str) -> Callable[[list[PortObservation]], None]:
    def check(batch: list[PortObservation]) -> None:
        assert [o.key for o in batch] == [key]

    return check


async def test_watch_flap_and_device_removal(gpud: Path) -> None:
    source = SysfsIBSource(root=gpud, interval_s=0.02)
    assert isinstance(source, PortSource)
    agen = source.watch()
    try:
        snapshot = await anext(agen)
        assert len(snapshot) == 9
        assert all(o.state is PortStateName.ACTIVE for o in snapshot)

        port = gpud / "mlx5_4/ports/1"
        put(port / "state", "1: DOWN\n")
        put(port / "phys_state", "2: Polling\n")
        batch = await next_batch(
            agen,
            lambda b: b[0].state is PortStateName.DOWN and b[0].phys_state is PhysState.POLLING,
            check=only("mlx5_4/1"),
        )
        assert batch[0].errors == () and batch[0].rate_gbps == 400.0

        put(port / "state", "4: ACTIVE\n")
        put(port / "phys_state", "5: LinkUp\n")
        await next_batch(
            agen,
            lambda b: b[0].state is PortStateName.ACTIVE and b[0].phys_state is PhysState.LINK_UP,
            check=only("mlx5_4/1"),
        )

        os.rename(gpud / "mlx5_9", gpud.parent / "unplugged")  # atomic, unlike rmtree
        batch = await next_batch(agen, lambda b: True, check=only("mlx5_9/1"))
        assert batch[0].state is None and batch[0].phys_state is None
        assert batch[0].errors == ("mlx5_9/ports/1: ENOENT (device removed)",)

        os.rename(gpud.parent / "unplugged", gpud / "mlx5_9")  # hot-plugged back
        batch = await next_batch(agen, lambda b: True, check=only("mlx5_9/1"))
        assert (batch[0].state, batch[0].errors) == (PortStateName.ACTIVE, ())
    finally:
        await agen.aclose()


async def test_watch_port_filter(gpud: Path) -> None:
    agen = SysfsIBSource(root=gpud, interval_s=0.02, ports={"mlx5_5/1"}).watch()
    try:
        assert [o.key for o in await anext(agen)] == ["mlx5_5/1"]
    finally:
        await agen.aclose()


async def test_watch_logs_a_bad_file_once(gpud: Path) -> None:
    calls = 0
    polled_5_times = asyncio.Event()
    loop = asyncio.get_running_loop()

    def reader(path: str) -> str:  # runs in the poller's thread
        nonlocal calls
        if path.endswith("mlx5_6/ports/1/rate"):
            calls += 1
            if calls == 5:
                loop.call_soon_threadsafe(polled_5_times.set)
            raise OSError(errno.EOPNOTSUPP)
        return read_sysfs(path)

    agen = SysfsIBSource(root=gpud, interval_s=0.01, reader=reader).watch()
    try:
        with capture_logs() as logs:
            snapshot = await anext(agen)
            pending = asyncio.ensure_future(anext(agen))  # keeps the poller running
            async with asyncio.timeout(5):
                await polled_5_times.wait()
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
        bad = [e for e in logs if e["event"] == "sysfs_bad_value"]
        assert [e["error"] for e in bad] == [
            "mlx5_6/ports/1/rate: EOPNOTSUPP (Operation not supported)"
        ]
        assert {o.key: o.rate_gbps for o in snapshot}["mlx5_6/1"] is None
    finally:
        await agen.aclose()


def test_full_poll_time_of_gpud_tree(gpud: Path) -> None:
    hcas = discover_hcas(gpud)
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        obs = [read_port(gpud, d.hca, p, now=0) for d in hcas for p in d.ports]
        best = min(best, time.perf_counter() - t0)
    assert len(obs) == 9 and sum(len(o.counters) for o in obs) == 9 * 46
    print(f"full poll of the gpud H100 tree (9 ports, 414 counters): {best * 1e3:.2f} ms")


def test_between_full_readings_only_state_and_phys_state_are_read(gpud: Path) -> None:
    from linkguard.drivers.sysfs_ib import _Poller

    reads: list[str] = []

    def counting(path: str) -> str:
        reads.append(path.rsplit("/", 1)[-1])
        return read_sysfs(path)

    poller = _Poller(
        root=gpud, ports=None, reader=counting, rediscover_s=1e9, counters_interval_s=1.0
    )
    assert len(poller.poll(0.0)) == 9  # the first poll reads everything
    reads.clear()
    assert poller.poll(0.1) == []
    assert sorted(set(reads)) == ["phys_state", "state"] and len(reads) == 9 * 2
    # a retrain to a lower rate without a state change: seen at the next full reading (1 s)
    put(gpud / "mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)\n")
    assert poller.poll(0.2) == []
    changed = poller.poll(1.0)
    assert [(o.key, o.rate_gbps) for o in changed] == [("mlx5_0/1", 200.0)]
    # a state change is seen at once, with everything else of that port re-read
    put(gpud / "mlx5_1/ports/1/state", "1: DOWN\n")
    reads.clear()
    changed = poller.poll(1.1)
    assert [(o.key, o.state) for o in changed] == [("mlx5_1/1", PortStateName.DOWN)]
    assert "rate" in reads and "link_layer" in reads


# ------------------------------------------------------------------ kept-open counter files


def _open_fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
    return out


def test_kept_open_counters_see_in_place_writes_and_replaced_files(tmp_path: Path) -> None:
    from linkguard.drivers.sysfs_ib import _KeptOpen, _Poller

    gpud = copy_tree(tmp_path, GPUD)
    counters = gpud / "mlx5_4/ports/1/counters"
    old = time.time() - 10  # a quiet directory (copytree keeps the fixture's own mtimes)
    os.utime(counters, (old, old))
    os.utime(counters.parent / "hw_counters", (old, old))
    poller = _Poller(
        root=gpud, ports={"mlx5_4/1"}, reader=read_sysfs, rediscover_s=1e9, counters_interval_s=1
    )
    first = {o.key: o for o in poller.poll(0.0)}["mlx5_4/1"]
    kept = poller.counter_reader
    assert isinstance(kept, _KeptOpen)
    # every counters/ and hw_counters/ file of the port is held open
    assert len(kept.fds) == len(first.counters) == 21 + 25
    assert str(counters / "symbol_error") in _open_fds()

    (counters / "symbol_error").write_text("77\n")  # in place: the same file, read at offset 0
    second = {o.key: o for o in poller.poll(1.0)}["mlx5_4/1"]
    assert second.counters["symbol_error"] == 77 and second.counters_fresh

    put(counters / "port_rcv_errors", "12345\n")  # a new inode: the directory changed
    third = {o.key: o for o in poller.poll(2.0)}["mlx5_4/1"]
    assert third.counters["port_rcv_errors"] == 12345
    assert third.counters["symbol_error"] == 77
    # the directory changed within the last second: read by path until it is quiet again
    assert not any(p.startswith(str(counters)) for p in kept.fds)

    # between counter readings the values are reused, and say so
    put(gpud / "mlx5_4/ports/1/state", "1: DOWN\n")
    between = {o.key: o for o in poller.poll(2.5)}["mlx5_4/1"]
    assert between.counters == third.counters and between.counters_fresh is False

    poller.close()
    assert kept.fds == {} and str(counters / "symbol_error") not in _open_fds()


def test_kept_open_reader_stays_within_its_budget(tmp_path: Path) -> None:
    from linkguard.drivers.sysfs_ib import _KeptOpen

    gpud = copy_tree(tmp_path, GPUD)
    files = sorted((gpud / "mlx5_0/ports/1/counters").iterdir())[:5]
    reader = _KeptOpen(budget=3)
    values = [reader(str(f)) for f in files]
    assert values == [f.read_text() for f in files]
    assert sorted(reader.fds) == [str(f) for f in files[:3]]
    # a file gone under its kept descriptor: read again by path, so the error is ENOENT
    files[0].unlink()
    os.close(reader.fds[str(files[0])])  # the old node failing (sysfs: ENODEV)
    reader.fds[str(files[0])] = os.open(str(gpud), os.O_RDONLY)  # pread on a dir fails: EISDIR
    with pytest.raises(FileNotFoundError):
        reader(str(files[0]))
    assert str(files[0]) not in reader.fds
    reader.close()
    assert reader.fds == {}


async def test_watch_polls_in_its_own_thread_and_cleans_up(tmp_path: Path) -> None:
    import threading

    from tests.support import until

    gpud = copy_tree(tmp_path, GPUD)
    before = _open_fds()
    source = SysfsIBSource(root=gpud, interval_s=0.05)
    agen = source.watch()
    await anext(agen)
    assert [t.name for t in threading.enumerate()].count("sysfs-poll") == 1
    assert len(_open_fds() - before) >= 8 * 46  # the counter files of the 8 IB ports
    put(gpud / "mlx5_5/ports/1/state", "1: DOWN\n")
    batch = await asyncio.wait_for(anext(agen), 5)
    assert [(o.key, o.state) for o in batch] == [("mlx5_5/1", PortStateName.DOWN)]
    await agen.aclose()
    await until(lambda: "sysfs-poll" not in [t.name for t in threading.enumerate()], "the thread")
    assert _open_fds() - before == set()


async def test_a_poll_that_raises_is_raised_by_watch(tmp_path: Path) -> None:
    gpud = copy_tree(tmp_path, GPUD)
    calls = 0

    def reader(path: str) -> str:
        nonlocal calls
        calls += 1
        if calls > 200:
            raise RuntimeError("driver bug")  # not an OSError: a bug, not a bad file
        return read_sysfs(path)

    agen = SysfsIBSource(root=gpud, interval_s=0.01, reader=reader).watch()
    with pytest.raises(RuntimeError, match="driver bug"):
        async for _ in agen:
            pass
