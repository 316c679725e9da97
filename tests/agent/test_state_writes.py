"""Issue 21 (hardening): the agent's state files against a hostile directory and a full disk,
on a real agent (the daemon's classes) over a real Mosquitto, with plans and peer routes
published by a client in the service's place.

* planted symlinks: at the old predictable temporary name (``.<name>.<pid>.tmp``) and at the
  target itself, in the state and runtime directories: the link's target is never written;
* a full ``state_dir`` (a real 64 KiB tmpfs filled up): the next peer-routes message is applied
  from memory, the failed write is counted and logged, the agent's retained status says
  ``state_write_failing: true`` until space is back, and the agent keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from pathlib import Path

import httpx
from structlog.testing import capture_logs

from linkguard import topics
from linkguard.agent.daemon import Agent
from linkguard.agent.monitor import DampingPolicy
from linkguard.bus import Bus, BusMessage
from linkguard.config import ApiSettings, BusSettings, ServiceSettings
from linkguard.drivers.simulated import MemoryRouteTable, SimulatedPortSource, active_port
from linkguard.models import HostStatus, decode, encode
from linkguard.simulations.fleet import agent_settings_for
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.service import TopologyService
from linkguard.topology.solver import Solver
from tests.support import missing, require_binary, until

FABRIC = generate_rail_optimized(hosts=12, rails=4)
HOST = "gpu005"
A = "gpu001"  # the impaired peer
PRECIOUS = b"root-owned file a job must not be able to overwrite\n"


class Rig:
    """HOST's agent and a sender in the service's place (compact plans, peer routes), which
    also reads HOST's retained status."""

    def __init__(self, agent: Agent, sender: Bus, statuses: list[HostStatus]) -> None:
        self.agent, self.sender, self.statuses = agent, sender, statuses
        self.solver = Solver(FABRIC)

    async def plan(self, epoch: int) -> None:
        plan = self.solver.compact_plan(HOST, epoch=epoch, now=1.0)
        await self.sender.publish(topics.plan(HOST), encode(plan), retain=True)

    async def peers(self, host: str, epoch: int) -> None:
        pr = self.solver.peer_routes(host, epoch=epoch, now=1.0)
        await self.sender.publish(topics.peer_routes(host), encode(pr), retain=True)

    def applied(self, epoch: int) -> bool:
        a = self.agent.applier.plan
        full = self.solver.plan(HOST, epoch=epoch, now=1.0)
        return a is not None and a.epoch == epoch and a.same_assignments(full)


def _rig(port: int, state_dir: Path, runtime: Path) -> Rig:
    bus = BusSettings(port=port, reconnect_min_s=0.05)
    settings = agent_settings_for(
        FABRIC, HOST, bus=bus, workdir=state_dir.parent, damping=DampingPolicy()
    ).model_copy(update={"state_dir": state_dir, "rail_map_path": runtime / "rail-map.json"})
    source = SimulatedPortSource([active_port(h.hca, h.port) for h in FABRIC.host(HOST).hcas])
    agent = Agent(settings, source=source, table=MemoryRouteTable(), discovered=[])
    statuses: list[HostStatus] = []

    async def on_status(msg: BusMessage) -> None:
        statuses.append(decode(HostStatus, msg.payload))

    sender = Bus(
        host="127.0.0.1",
        port=port,
        client_id="test-service",
        subscriptions=[topics.status(HOST)],
        handler=on_status,
    )
    return Rig(agent, sender, statuses)


async def test_planted_symlinks_are_never_written_through(mosquitto, tmp_path: Path) -> None:
    state, runtime, victims = tmp_path / "state", tmp_path / "run", tmp_path / "victims"
    for d in (state, state / "peers", runtime, victims):
        d.mkdir()
    pid = os.getpid()  # the agent runs in this process: its old temporary names
    planted = {
        state / f".last-plan.json.{pid}.tmp",
        state / "peers" / f".{A}.json.{pid}.tmp",
        state / f".term.{pid}.tmp",
        state / f".damping.json.{pid}.tmp",
        runtime / f".rail-map.json.{pid}.tmp",
        runtime / f".nccl.env.{pid}.tmp",
        runtime / f".nccl.json.{pid}.tmp",
        state / "peers" / f"{A}.json",  # the target itself
    }
    for i, link in enumerate(sorted(planted)):
        victim = victims / f"v{i}"
        victim.write_bytes(PRECIOUS)
        link.symlink_to(victim)
    rig = _rig(mosquitto.port, state, runtime)
    task = asyncio.create_task(rig.agent.run())
    try:
        async with rig.sender:
            await rig.sender.wait_connected(10)
            await rig.agent.bus.wait_connected(10)
            await rig.plan(10)
            await until(lambda: rig.applied(10), "the compact plan")
            rig.solver.update({A: {2}})
            await rig.peers(A, 11)
            await until(lambda: rig.applied(11), "A's peer routes")
            rig.agent.source.link_down("mlx5_1")  # a flap: the damping history is written
            await until(lambda: (state / "damping.json").exists(), "the damping history")
            await until(lambda: (state / "peers" / f"{A}.json").is_file(), "A's peer routes")
    finally:
        rig.agent.stop()
        await asyncio.wait_for(task, 10)
    # every victim as it was; the files written are regular files of their own
    assert {v.name: v.read_bytes() for v in victims.iterdir()} == {
        f"v{i}": PRECIOUS for i in range(len(planted))
    }
    for f in (state / "last-plan.json", state / "peers" / f"{A}.json", runtime / "rail-map.json"):
        assert f.is_file() and not f.is_symlink(), f
    assert b'"epoch":11' in (state / "peers" / f"{A}.json").read_bytes().replace(b" ", b"")
    # no temporary file left behind, planted links aside
    leftovers = {p for p in [*state.rglob(".*.tmp"), *runtime.glob(".*.tmp")] if p not in planted}
    assert leftovers == set()


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    """A real tmpfs of ``size`` mounted on ``path`` (root), unmounted afterwards."""
    if os.geteuid() != 0:
        missing("needs root (mounts a small tmpfs as a full state_dir)")
    require_binary("mount")
    path.mkdir()
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        missing(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """Fill ``directory``'s filesystem up (until ENOSPC); the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


async def test_a_full_state_dir_is_counted_reported_and_routed_from_memory(
    mosquitto, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    with _tmpfs(tmp_path / "state", "64k") as state:
        rig = _rig(mosquitto.port, state, runtime)
        task = asyncio.create_task(rig.agent.run())
        try:
            async with rig.sender:
                await rig.sender.wait_connected(10)
                await rig.agent.bus.wait_connected(10)
                await rig.plan(10)
                await until(lambda: rig.applied(10), "the compact plan")
                assert rig.agent.applier.writes.failing == {}, os.listdir(state)
                filler = _fill(state)

                rig.solver.update({A: {2}})
                with capture_logs() as logs:
                    await rig.peers(A, 11)
                    await until(lambda: rig.applied(11), "A's peer routes, from memory")
                    await until(
                        lambda: rig.statuses and rig.statuses[-1].state_write_failing,
                        "the status says the state dir fails",
                    )
                assert not task.done()
                writes = rig.agent.applier.writes
                assert writes.failures["peer_routes"] >= 1
                assert writes.failing["peer_routes"] == "ENOSPC"
                failed = [e for e in logs if e["event"] == "state_write_failed"]
                assert failed and failed[0]["errno"] == "ENOSPC"
                assert failed[0]["file"] == "peer_routes"
                body, _ = rig.agent.metrics.render()
                line = 'linkguard_state_write_failures_total{file="peer_routes"}'
                assert line in body.decode()
                # the routes are in the kernel (here: the table) all the same
                assert rig.agent.table.routes == rig.agent.applier.installed
                assert rig.statuses[-1].online

                # space back: the next write succeeds and the status says so
                filler.unlink()
                rig.solver.update({A: set()})
                await rig.peers(A, 12)
                await until(lambda: rig.applied(12), "A whole again")
                await until(
                    lambda: rig.statuses[-1].state_write_failing is None,
                    "the status without the failure",
                )
                assert writes.failing == {}
                assert b'"epoch":12' in (state / "peers" / f"{A}.json").read_bytes().replace(
                    b" ", b""
                )
        finally:
            rig.agent.stop()
            await asyncio.wait_for(task, 10)


async def test_the_service_flags_a_host_whose_state_writes_fail(mosquitto, tmp_path: Path) -> None:
    """The service side: a retained status with ``state_write_failing`` marks the host in the
    API (and logs ``host_state_write_failing`` once); the next status without it clears it; an
    older agent's status (no such field) still decodes."""
    service = TopologyService(
        ServiceSettings(
            bus=BusSettings(port=mosquitto.port, reconnect_min_s=0.05),
            startup_settle_s=0,
            api=ApiSettings(port=0),
        ),
        fabric=FABRIC,
    )
    task = asyncio.create_task(service.run())
    agent = Bus(host="127.0.0.1", port=mosquitto.port, client_id="gpu005-agent")

    async def host_doc() -> dict:
        url = f"http://127.0.0.1:{service.api_port}/api/v1/hosts/{HOST}"
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(url)
        assert r.status_code == 200, r.text
        return r.json()

    try:
        async with agent:
            await agent.wait_connected(10)
            await until(lambda: service.api_port is not None, "the API")
            failing = HostStatus(host=HOST, online=True, state_write_failing=True)
            with capture_logs() as logs:
                await agent.publish(topics.status(HOST), encode(failing), retain=True)
                await until(lambda: HOST in service.state.state_write_failing, "flagged")
            assert [e["host"] for e in logs if e["event"] == "host_state_write_failing"] == [HOST]
            doc = await host_doc()
            assert (doc["online"], doc["state_write_failing"]) == (True, True)
            old = b'{"host": "%s", "online": true}' % HOST.encode()  # an older agent
            await agent.publish(topics.status(HOST), old, retain=True)
            await until(lambda: HOST not in service.state.state_write_failing, "cleared")
            doc = await host_doc()
            assert (doc["online"], doc["state_write_failing"]) == (True, False)
    finally:
        service.stop()
        await asyncio.wait_for(task, 15)
