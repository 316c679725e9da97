"""Verbs async events -> sysfs re-reads (linkguard.drivers.verbs_events, verbs_reader).

The pure parts are fed values directly; the reader is run as a real process: the shipped
script with the system python and pyverbs (no devices here), with the venv python (no pyverbs),
and with a stand-in ``pyverbs`` module that scripts events (the only way to get events on a
machine without an HCA); crashing readers are real processes too. Sysfs trees are copies of
the real gpud H100 capture.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from linkguard.drivers.sysfs_ib import SysfsIBSource, read_sysfs
from linkguard.drivers.verbs_events import (
    MAX_LINE,
    READER_SCRIPT,
    EventKind,
    ReaderStatus,
    VerbsEvent,
    VerbsEventReader,
    backoff_s,
    decide,
    parse_line,
    reader_wanted,
)
from linkguard.drivers.verbs_reader import EVENT_NAMES
from tests.drivers.test_sysfs_ib import GPUD, copy_tree
from tests.support import until

SYSTEM_PYTHON = Path("/usr/bin/python3")
WATCHED = frozenset({"mlx5_0", "mlx5_1"})


def ev(hca: str, code: int, name: str = "ignored") -> bytes:
    return json.dumps({"hca": hca, "event": name, "code": code, "at": 1.7e9, "mono": 5.0}).encode()


# --------------------------------------------------------------------------------------------
# pure: the event table, parsing, decisions


def test_event_codes_are_rdma_cores() -> None:
    """The numbers of enum ibv_event_type (infiniband/verbs.h, implicit from 0)."""
    want = {"DEVICE_FATAL": 8, "PORT_ACTIVE": 9, "PORT_ERR": 10, "LID_CHANGE": 11}
    want |= {"PKEY_CHANGE": 12, "SM_CHANGE": 13, "CLIENT_REREGISTER": 17, "GID_CHANGE": 18}
    assert {n: c for c, n in EVENT_NAMES.items() if n in want} == want
    assert sorted(EVENT_NAMES) == list(range(20))


def test_pyverbs_agrees_with_the_table() -> None:
    """Where python3-pyverbs is installed, its IBV_EVENT_* constants are the table's."""
    code = "import json, pyverbs.enums as e; print(json.dumps({k[10:]: int(getattr(e, k)) "
    code += "for k in dir(e) if k.startswith('IBV_EVENT_')}))"
    if not SYSTEM_PYTHON.exists():
        pytest.skip("no /usr/bin/python3")
    out = subprocess.run([SYSTEM_PYTHON, "-I", "-c", code], capture_output=True, timeout=30)
    if out.returncode != 0:
        pytest.skip("python3-pyverbs not installed (optional: Debian package python3-pyverbs)")
    theirs = json.loads(out.stdout)
    assert {c: n for n, c in theirs.items() if c < 20} == EVENT_NAMES


@pytest.mark.parametrize(
    ("code", "kind", "reason"),
    [
        (10, EventKind.PORT, "port_event"),  # PORT_ERR
        (9, EventKind.PORT, "port_event"),  # PORT_ACTIVE
        (11, EventKind.PORT, "port_event"),  # LID_CHANGE
        (12, EventKind.PORT, "port_event"),  # PKEY_CHANGE
        (13, EventKind.PORT, "port_event"),  # SM_CHANGE
        (17, EventKind.PORT, "port_event"),  # CLIENT_REREGISTER
        (18, EventKind.PORT, "port_event"),  # GID_CHANGE
        (8, EventKind.DEVICE_FATAL, "device_fatal"),
        (4242, EventKind.UNKNOWN, "unknown_code"),
    ],
)
def test_port_device_and_unknown_events_reread_that_hca(
    code: int, kind: EventKind, reason: str
) -> None:
    event = parse_line(ev("mlx5_1", code))
    assert isinstance(event, VerbsEvent)
    action = decide(event, WATCHED)
    assert (action.reread, action.kind, action.reason) == ("mlx5_1", kind, reason)


@pytest.mark.parametrize("code", [0, 1, 2, 3, 4, 5, 6, 7, 14, 15, 16, 19])
def test_resource_events_reread_nothing(code: int) -> None:
    """QP/CQ/SRQ/WQ events are about objects the reader never creates."""
    action = decide(parse_line(ev("mlx5_0", code)), WATCHED)  # type: ignore[arg-type]
    assert (action.reread, action.kind) == (None, EventKind.RESOURCE)


def test_an_hca_not_watched_is_ignored() -> None:
    action = decide(parse_line(ev("mlx5_4", 10)), WATCHED)  # type: ignore[arg-type]
    assert (action.reread, action.kind, action.reason) == (None, EventKind.PORT, "not_watched")


def test_the_code_names_the_event_not_the_line() -> None:
    """A line saying PORT_ACTIVE with code 10 is a PORT_ERR; an unknown code is UNKNOWN."""
    assert parse_line(ev("mlx5_0", 10, "PORT_ACTIVE")) == VerbsEvent(
        hca="mlx5_0", code=10, name="PORT_ERR", at=1.7e9, mono=5.0
    )
    assert parse_line(ev("mlx5_0", 99, "PORT_ERR")).name == "UNKNOWN"  # type: ignore[union-attr]


def test_status_lines() -> None:
    assert parse_line(b'{"status":"no_devices"}') == ReaderStatus("no_devices")
    got = parse_line(b'{"status":"unavailable","error":"ModuleNotFoundError: pyverbs"}')
    assert got == ReaderStatus("unavailable", error="ModuleNotFoundError: pyverbs")
    started = parse_line(b'{"status":"started","hcas":["mlx5_0","mlx5_1"]}')
    assert started == ReaderStatus("started", hcas=("mlx5_0", "mlx5_1"))


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"PORT_ERR mlx5_0", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"status": "rebooting"}', "unknown status"),
        (b'{"hca": "../../etc", "code": 10, "at": 1, "mono": 1}', "bad hca"),
        (b'{"hca": "mlx5_0", "code": -1, "at": 1, "mono": 1}', "bad code"),
        (b'{"hca": "mlx5_0", "code": true, "at": 1, "mono": 1}', "bad code"),
        (b'{"hca": "mlx5_0", "code": "10", "at": 1, "mono": 1}', "bad code"),
        (b'{"hca": "mlx5_0", "code": 10, "at": "now", "mono": 1}', "'at' is not a number"),
        (b'{"hca": "mlx5_0", "code": 10, "at": 1}', "'mono' is not a number"),
        (b'{"hca": "mlx5_0", "code": 10, "at": 1, "mono": NaN}', "'mono' is not a number"),
        (b"{" + b" " * MAX_LINE + b"}", f"> {MAX_LINE}"),
    ],
)
def test_bad_lines_are_refused_with_a_reason(line: bytes, why: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_line(line)
    assert why in str(info.value)


def test_reader_wanted(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    assert reader_wanted("auto", driver="sysfs", sysfs_root=root) == (
        True,
        "auto: sysfs driver with RDMA devices",
    )
    assert reader_wanted("off", driver="sysfs", sysfs_root=root)[0] is False
    assert reader_wanted("auto", driver="netlink", sysfs_root=root)[0] is False
    empty = tmp_path / "empty"
    empty.mkdir()
    assert reader_wanted("auto", driver="sysfs", sysfs_root=empty) == (
        False,
        f"no RDMA devices under {empty}",
    )
    assert reader_wanted("auto", driver="sysfs", sysfs_root=tmp_path / "missing")[0] is False


def test_backoff_doubles_up_to_the_cap() -> None:
    got = [backoff_s(n, min_s=0.5, max_s=10) for n in range(1, 8)]
    assert got == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_s(10_000, min_s=1, max_s=60) == 60


# --------------------------------------------------------------------------------------------
# the poll-now hook of the sysfs driver: a flood of events is one re-read


class CountingReader:
    """sysfs reads, counted per file name (the real files are read)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, path: str) -> str:
        self.paths.append(path)
        return read_sysfs(path)

    def state_reads(self, hca: str) -> int:
        return sum(1 for p in self.paths if f"/{hca}/ports/" in p and p.endswith("/state"))


async def test_a_flood_of_events_for_one_hca_is_one_reread(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    counting = CountingReader()
    source = SysfsIBSource(root=root, interval_s=30, reader=counting)
    target = VerbsEventReader(target=source, watched=WATCHED, argv=["true"])
    it = source.watch()
    first = await anext(it)
    assert {o.key for o in first} >= {"mlx5_0/1", "mlx5_1/1"}
    before0, before1 = counting.state_reads("mlx5_0"), counting.state_reads("mlx5_1")
    (root / "mlx5_0/ports/1/state").write_text("1: DOWN\n")
    for _ in range(200):  # all before the source runs again: one request
        target.handle(ev("mlx5_0", 10) + b"\n")
    batch = await asyncio.wait_for(anext(it), 5)  # the regular poll is 30 s away
    assert [(o.key, o.state.value if o.state else None) for o in batch] == [("mlx5_0/1", "DOWN")]
    assert source.rereads == 1
    assert target.stats.rereads_requested == 200
    # one full reading of mlx5_0's one port: state read twice (peek + full), nothing else
    assert counting.state_reads("mlx5_0") - before0 == 2
    assert counting.state_reads("mlx5_1") == before1
    await it.aclose()


async def test_a_reread_of_an_unchanged_hca_yields_nothing(tmp_path: Path) -> None:
    """An event whose port reads as before is not a change: nothing is yielded until the
    port really changes (polling, at its own pace, stays the ground truth)."""
    root = copy_tree(tmp_path, GPUD)
    source = SysfsIBSource(root=root, interval_s=0.3)
    it = source.watch()
    await anext(it)
    source.poll_now(["mlx5_1", "mlx5_9000"])  # mlx5_9000: not a device; found nowhere
    nxt = asyncio.ensure_future(anext(it))
    await until(lambda: source.rereads == 1, "the re-read")
    assert not nxt.done()
    (root / "mlx5_1/ports/1/phys_state").write_text("3: Disabled\n")  # no event: the poll sees it
    batch = await asyncio.wait_for(nxt, 5)
    assert [(o.key, o.phys_state.value if o.phys_state else None) for o in batch] == [
        ("mlx5_1/1", "Disabled")
    ]
    await it.aclose()


# --------------------------------------------------------------------------------------------
# the reader process


def run_reader(python: str | Path, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    out = subprocess.run(
        [str(python), *args, str(READER_SCRIPT)],
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_real_reader_without_devices_says_no_devices() -> None:
    """The shipped reader with the system python and Debian's python3-pyverbs, on a machine
    without an RDMA device (get_device_list() raises here): one line, exit 0. Skipped (never
    failed, even with LINKGUARD_REQUIRE_REAL=1) where python3-pyverbs is not installed: it is
    optional hardware support and the agent runs without it."""
    if not SYSTEM_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 (python3-pyverbs needs the system python)")
    probe = subprocess.run([SYSTEM_PYTHON, "-I", "-c", "import pyverbs.device"], timeout=30)
    if probe.returncode != 0:
        pytest.skip("python3-pyverbs not installed (optional: apt-get install python3-pyverbs)")
    if any(Path("/sys/class/infiniband_verbs").glob("uverbs*")):
        pytest.skip("this machine has RDMA devices: the reader would block on their events")
    assert run_reader(SYSTEM_PYTHON, "-I") == [{"status": "no_devices"}]


def test_reader_without_pyverbs_says_unavailable() -> None:
    """The venv python has no pyverbs (the PyPI one does not load on bookworm)."""
    lines = run_reader(sys.executable, "-I")
    assert len(lines) == 1 and lines[0]["status"] == "unavailable"
    assert "pyverbs" in lines[0]["error"]


FAKE_PYVERBS = '''
"""Stand-in for pyverbs.device: devices and event codes from $FAKE_VERBS (JSON
{"mlx5_0": [10, 9, 4242], ...}); each Context's events come in order; once every device's
events are acked (appended to $FAKE_VERBS_ACKS), the first device's call fails as pyverbs does
when the device goes away, the others block."""
import json, os, time

class PyverbsRDMAError(Exception):
    pass

_SPEC = json.loads(os.environ["FAKE_VERBS"])

class _Dev:
    def __init__(self, name):
        self.name = name.encode()

def get_device_list():
    if not _SPEC:
        raise PyverbsRDMAError("Failed to get devices list")
    return [_Dev(n) for n in _SPEC]

class AsyncEvent:
    def __init__(self, hca, code):
        self.hca, self.event_type = hca, code
    def ack(self):
        with open(os.environ["FAKE_VERBS_ACKS"], "a") as f:
            f.write(f"{self.hca} {self.event_type}\\n")

class Context:
    def __init__(self, name):
        if name not in _SPEC:
            raise PyverbsRDMAError(f"Failed to find device {name}")
        self.name, self.codes = name, list(_SPEC[name])
    def get_async_event(self):
        total = sum(len(c) for c in _SPEC.values())
        while not self.codes:
            try:
                acked = len(open(os.environ["FAKE_VERBS_ACKS"]).read().splitlines())
            except FileNotFoundError:
                acked = 0
            if acked >= total and self.name == next(iter(_SPEC)):
                raise PyverbsRDMAError("Failed to get async event", 5)
            time.sleep(0.01)
        return AsyncEvent(self.name, self.codes.pop(0))
'''


def fake_pyverbs(tmp_path: Path, spec: dict[str, list[int]]) -> dict[str, str]:
    pkg = tmp_path / "fake" / "pyverbs"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "device.py").write_text(textwrap.dedent(FAKE_PYVERBS))
    return {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "fake"),
        "FAKE_VERBS": json.dumps(spec),
        "FAKE_VERBS_ACKS": str(tmp_path / "acks"),
    }


def test_reader_streams_acked_events_one_worker_per_device(tmp_path: Path) -> None:
    """The shipped reader's own loop (stand-in pyverbs: no HCA here): one worker process per
    device, every event acked then printed with its name from the code (99: UNKNOWN), a
    failing event call ends that worker (hca_error) and the reader (exit 1, restarted by the
    agent)."""
    env = fake_pyverbs(tmp_path, {"mlx5_0": [10, 9, 99], "mlx5_1": [18]})
    out = subprocess.run(
        [sys.executable, str(READER_SCRIPT)], capture_output=True, timeout=60, env=env
    )
    lines = [json.loads(t) for t in out.stdout.splitlines()]
    assert out.returncode == 1, out.stderr.decode()[-2000:]
    assert lines[0] == {"status": "started", "hcas": ["mlx5_0", "mlx5_1"]}
    events = [(d["hca"], d["event"], d["code"]) for d in lines if "hca" in d and "code" in d]
    assert [e for e in events if e[0] == "mlx5_0"] == [
        ("mlx5_0", "PORT_ERR", 10),
        ("mlx5_0", "PORT_ACTIVE", 9),
        ("mlx5_0", "UNKNOWN", 99),
    ]
    assert [e for e in events if e[0] == "mlx5_1"] == [("mlx5_1", "GID_CHANGE", 18)]
    assert sorted((tmp_path / "acks").read_text().split("\n")[:-1]) == [
        "mlx5_0 10",
        "mlx5_0 9",
        "mlx5_0 99",
        "mlx5_1 18",
    ]
    now = time.monotonic()
    assert all(now - 60 < d["mono"] <= now for d in lines if "mono" in d)
    errors = [d for d in lines if d.get("status") == "hca_error"]
    assert errors and "Failed to get async event" in errors[0]["error"]
    assert lines[-1]["status"] == "hca_exit" and lines[-1]["rc"] == 1
    for d in lines:  # every line is one parseable object
        parse_line(json.dumps(d).encode())


def test_reader_with_an_empty_device_list_says_no_devices(tmp_path: Path) -> None:
    env = fake_pyverbs(tmp_path, {})
    assert run_reader(sys.executable, env=env) == [{"status": "no_devices"}]


# --------------------------------------------------------------------------------------------
# the agent side of the process: restarts, status lines


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def test_a_crashing_reader_is_restarted_with_backoff(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    crash = script(
        tmp_path,
        "crash.py",
        f"""
        import sys, time
        with open({str(starts)!r}, "a") as f:
            f.write(f"{{time.monotonic()}}\\n")
        print("Traceback: boom", file=sys.stderr)
        sys.exit(3)
        """,
    )
    rr = VerbsEventReader(
        target=SysfsIBSource(root=tmp_path),
        watched=WATCHED,
        argv=[sys.executable, "-I", str(crash)],
        backoff_min_s=0.1,
        backoff_max_s=0.4,
    )
    with capture_logs() as logs:
        task = asyncio.create_task(rr.run())
        await until(lambda: len(_lines(starts)) >= 5, "five starts", timeout=20)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    times = [float(t) for t in starts.read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(times)][:4]
    # 0.1, 0.2, 0.4, 0.4 s (+ a python start each): exponential, capped
    assert len(gaps) == 4
    assert all(g >= d for g, d in zip(gaps, [0.1, 0.2, 0.4, 0.4], strict=True)), gaps
    assert gaps[2] > gaps[0] + 0.2
    exited = [e for e in logs if e["event"] == "verbs_reader_exited"]
    assert exited[0]["rc"] == 3 and "Traceback: boom" in exited[0]["detail"]
    assert exited[0]["hint"] == "events only speed detection up; ports are still polled"
    assert [e["restart_in_s"] for e in exited[:4]] == [0.1, 0.2, 0.4, 0.4]


async def test_a_reader_command_that_says_nothing_points_at_verbs_python(tmp_path: Path) -> None:
    """``verbs_python: /bin/false`` starts, exits 1 and says nothing: the log says to check
    that verbs_python is a Python with pyverbs, not only that the reader exited."""
    false = Path("/bin/false")
    rr = VerbsEventReader(
        target=SysfsIBSource(root=tmp_path), watched=WATCHED, python=false, backoff_min_s=0.01
    )
    with capture_logs() as logs:
        task = asyncio.create_task(rr.run())
        await until(lambda: rr.stats.exits >= 1, "the reader to exit")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    exited = [e for e in logs if e["event"] == "verbs_reader_exited"]
    assert exited[0]["rc"] == 1 and exited[0]["detail"] == ""
    assert "is /bin/false a Python with rdma-core's pyverbs" in exited[0]["hint"]
    # a reader that crashed with a traceback is not told that (test above: detail is enough)


async def test_no_devices_and_unavailable_are_said_once_and_not_restarted(tmp_path: Path) -> None:
    for status, level in (("no_devices", "info"), ("unavailable", "warning")):
        starts = tmp_path / f"starts-{status}"
        body = f"""
        import json
        open({str(starts)!r}, "a").write("x\\n")
        print(json.dumps({{"status": {status!r}, "error": "ModuleNotFoundError"}}), flush=True)
        """
        rr = VerbsEventReader(
            target=SysfsIBSource(root=tmp_path),
            watched=WATCHED,
            argv=[sys.executable, "-I", str(script(tmp_path, f"{status}.py", body))],
            backoff_min_s=0.01,
        )
        with capture_logs() as logs:
            await asyncio.wait_for(rr.run(), 20)  # returns: nothing to restart
        said = [e for e in logs if e["event"] == "verbs_events_off"]
        assert [e["log_level"] for e in said] == [level]
        assert [e for e in logs if e["event"] == "verbs_reader_exited"] == []
        assert starts.read_text() == "x\n" and rr.stats.starts == 1


async def test_bad_lines_are_counted_and_logged_once(tmp_path: Path) -> None:
    body = f"""
    import json, sys
    print("garbage", flush=True)
    sys.stdout.write("x" * {MAX_LINE * 3} + "\\n")
    print(json.dumps({{"hca": "mlx5_0", "event": "PORT_ERR", "code": 10, "at": 1, "mono": 2}}))
    print("[]", flush=True)
    print(json.dumps({{"status": "no_devices"}}), flush=True)
    """
    source = SysfsIBSource(root=tmp_path)
    rr = VerbsEventReader(
        target=source,
        watched=WATCHED,
        argv=[sys.executable, "-I", str(script(tmp_path, "bad.py", body))],
    )
    with capture_logs() as logs:
        await asyncio.wait_for(rr.run(), 20)
    assert rr.stats.bad_lines == 3
    assert len([e for e in logs if e["event"] == "verbs_reader_bad_line"]) == 1
    assert rr.stats.rereads_requested == 1  # the good line between the bad ones was taken
    assert source._wanted == {"mlx5_0"}


async def test_a_missing_python_is_said_once_and_not_retried(tmp_path: Path) -> None:
    rr = VerbsEventReader(
        target=SysfsIBSource(root=tmp_path),
        watched=WATCHED,
        python=tmp_path / "no-such-python3",
        backoff_min_s=0.01,
    )
    with capture_logs() as logs:
        await asyncio.wait_for(rr.run(), 10)
    said = [e for e in logs if e["event"] == "verbs_events_off"]
    assert [(e["log_level"], e["reason"]) for e in said] == [("warning", "reader cannot start")]
    assert rr.stats.starts == 0 and rr.stats.status == "unavailable"
