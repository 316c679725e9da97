"""The agent with a verbs event reader process (linkguard.drivers.verbs_events).

The reader here is a real process speaking the reader's JSON-lines protocol on its stdout (the
real transport), driven by the test through a spool directory, because this machine has no HCA
to raise events. The sysfs tree is a copy of the real gpud H100 capture, mutated. The bus is
the in-memory broker: nothing here is about MQTT.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from structlog.testing import capture_logs

from linkguard.agent.daemon import Agent
from linkguard.config import AgentSettings, PortConfig
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.drivers.sysfs_ib import SysfsIBSource
from linkguard.drivers.verbs_events import VerbsTriggeredSource
from linkguard.membus import MemoryBroker
from linkguard.models import PortStatus
from tests.drivers.test_sysfs_ib import GPUD, copy_tree, put
from tests.support import until

#: a reader that relays the event files dropped into SPOOL as its own JSON lines, stamping
#: them with its clock as the real reader does; each start is appended to STARTS
RELAY = """
import json, os, sys, time
open(STARTS, "a").write(f"{time.monotonic()}\\n")
print(json.dumps({"status": "started", "hcas": ["mlx5_0", "mlx5_1"]}), flush=True)
while True:
    for name in sorted(os.listdir(SPOOL)):
        if name.endswith(".json"):
            path = os.path.join(SPOOL, name)
            doc = json.loads(open(path).read())
            os.unlink(path)
            doc.update(at=time.time(), mono=time.monotonic())
            sys.stdout.write(json.dumps(doc) + "\\n")
            sys.stdout.flush()
    time.sleep(0.002)
"""

NO_DEVICES = """
import json, time
open(STARTS, "a").write(f"{time.monotonic()}\\n")
print(json.dumps({"status": "no_devices"}), flush=True)
"""


def reader(tmp: Path, body: str) -> tuple[Path, Path, Path]:
    """(script, spool dir, starts file) of a fake reader with ``body``."""
    spool, starts = tmp / "spool", tmp / "starts"
    spool.mkdir()
    path = tmp / "reader.py"
    path.write_text(f"SPOOL = {str(spool)!r}\nSTARTS = {str(starts)!r}\n" + textwrap.dedent(body))
    return path, spool, starts


def send(spool: Path, n: int, hca: str, code: int) -> None:
    tmp = spool / f"{n:04d}.tmp"
    tmp.write_text(json.dumps({"hca": hca, "event": "?", "code": code}))
    os.replace(tmp, spool / f"{n:04d}.json")


@asynccontextmanager
async def agent_on(tmp: Path, root: Path, script: Path, poll_ms: float) -> AsyncIterator[Agent]:
    settings = AgentSettings(
        host="gpu000",
        driver="sysfs",
        sysfs_root=root,
        poll_interval_ms=poll_ms,
        ports=[PortConfig(hca="mlx5_0", rail=0), PortConfig(hca="mlx5_1", rail=1)],
        endpoints=[ipaddress.IPv4Address("10.200.0.1"), ipaddress.IPv4Address("10.200.1.1")],
        routes={"apply": False},
        state_dir=tmp / "state",
        rail_map_path=tmp / "run" / "rail-map.json",
        metrics_listen=None,
        verbs={"python": Path(sys.executable), "reader": script},
    )
    agent = Agent(settings, table=MemoryRouteTable(), bus_factory=MemoryBroker().bus_factory)
    task = asyncio.create_task(agent.run())
    try:
        await until(lambda: _status(agent, "mlx5_0/1") == PortStatus.UP, "mlx5_0/1 up")
        await until(lambda: _status(agent, "mlx5_1/1") == PortStatus.UP, "mlx5_1/1 up")
        yield agent
    finally:
        agent.stop()
        await asyncio.wait_for(task, 10)


def _status(agent: Agent, key: str) -> PortStatus | None:
    st = agent.monitor.state(key)
    return st.status if st is not None else None


async def test_port_err_rereads_that_hcas_ports_at_once(tmp_path: Path) -> None:
    """Poll interval 5 s; the port goes down in sysfs and the reader says PORT_ERR for its HCA:
    the agent has the port DOWN well within 1 s of the event (measured from the reader's
    clock), by re-reading that HCA only. An event for an HCA it does not watch and a bad line
    change nothing."""
    root = copy_tree(tmp_path, GPUD)
    script, spool, starts = reader(tmp_path, RELAY)
    async with agent_on(tmp_path, root, script, poll_ms=5000) as agent:
        assert isinstance(agent.source, VerbsTriggeredSource)
        sysfs, rr = agent.source.source, agent.source.reader
        assert isinstance(sysfs, SysfsIBSource)
        await until(lambda: rr.stats.status == "started", "the reader's start line")

        send(spool, 1, "mlx5_4", 10)  # a device the agent does not watch
        await until(lambda: rr.stats.ignored["not_watched"] == 1, "the unwatched event")
        assert rr.stats.rereads_requested == 0 and sysfs.rereads == 0

        put(root / "mlx5_0/ports/1/state", "1: DOWN\n")
        put(root / "mlx5_0/ports/1/phys_state", "2: Polling\n")
        t_sysfs = time.monotonic()
        send(spool, 2, "mlx5_0", 10)  # PORT_ERR
        await until(lambda: _status(agent, "mlx5_0/1") == PortStatus.DOWN, "DOWN", timeout=4)
        seen = time.monotonic()
        down, event = agent.monitor.state("mlx5_0/1"), rr.stats.last_event
        assert down is not None and event is not None and event.name == "PORT_ERR"
        # the reader stamps the event (wall), the monitor the reading that showed DOWN (wall)
        latency = down.observed_at - event.at
        print(
            f"\nverbs PORT_ERR -> port DOWN observed {latency * 1000:.1f} ms after the event "
            f"(test saw it {(seen - t_sysfs) * 1000:.1f} ms after the sysfs change, polling "
            "every 10 ms); poll interval 5000 ms"
        )
        assert 0 <= latency < 1.0
        assert sysfs.rereads == 1
        assert _status(agent, "mlx5_1/1") == PortStatus.UP
        assert starts.read_text().count("\n") == 1  # never restarted


async def test_no_devices_is_said_once_and_polling_goes_on(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    script, _spool, starts = reader(tmp_path, NO_DEVICES)
    with capture_logs() as logs:
        async with agent_on(tmp_path, root, script, poll_ms=100) as agent:
            assert isinstance(agent.source, VerbsTriggeredSource)
            rr = agent.source.reader
            await until(lambda: rr.stats.status == "no_devices", "no_devices")
            put(root / "mlx5_1/ports/1/state", "1: DOWN\n")  # no event: polling finds it
            await until(lambda: _status(agent, "mlx5_1/1") == PortStatus.DOWN, "DOWN by polling")
            assert _status(agent, "mlx5_0/1") == PortStatus.UP
    said = [e for e in logs if e["event"] == "verbs_events_off"]
    assert [(e["log_level"], e["reason"]) for e in said] == [("info", "no RDMA devices")]
    assert [e for e in logs if e["event"] == "verbs_reader_exited"] == []
    assert starts.read_text().count("\n") == 1


async def test_verbs_events_off_runs_no_reader(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, GPUD)
    script, _spool, starts = reader(tmp_path, NO_DEVICES)
    settings = AgentSettings(
        host="gpu000",
        sysfs_root=root,
        ports=[PortConfig(hca="mlx5_0", rail=0)],
        routes={"apply": False},
        state_dir=tmp_path / "state",
        rail_map_path=tmp_path / "run" / "rail-map.json",
        metrics_listen=None,
        verbs={"events": "off", "python": Path(sys.executable), "reader": script},
    )
    agent = Agent(settings, table=MemoryRouteTable(), bus_factory=MemoryBroker().bus_factory)
    assert isinstance(agent.source, SysfsIBSource)
    assert not starts.exists()
