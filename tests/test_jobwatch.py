"""The job-side watch (linkguard.jobwatch) on real Unix sockets: it fires for a port this
process's NCCL uses and only for that one, with the latency recorded, against the agent's
real RailMapServer and against a real agent whose simulated port goes down (nccl.env already
without it when the watch fires); baseline and reconnect rules; bad lines skipped; the signal
and exit interrupts; stdlib only, in a bare interpreter."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import linkguard.jobwatch as jobwatch_module
from linkguard.agent.localsub import RailMapServer
from linkguard.agent.railmap import RailView, document
from linkguard.config import RailsSocketSettings
from linkguard.jobenv import parse_env_file, read_host_nccl
from linkguard.jobwatch import EXIT_RAIL_LOST, RailLost, RailWatch, nccl_retry_budget_s, selects
from linkguard.nccl import NcclFiles, hca_selects
from linkguard.topology.fabric import generate_rail_optimized
from tests.agent.rail_rig import HOST, running_agent, short_dir
from tests.support import until
from tests.test_nccl import FABRIC as NCCL_FABRIC
from tests.test_nccl import Host

GPUS = {"0": "mlx5_0:1", "1": "mlx5_1:1", "2": "mlx5_2:1", "3": "mlx5_3:1"}


def rail_doc(seq: int, *, down: tuple[str, ...] = (), reason: str = "port_event") -> dict:
    """A real linkguard.rail-change/v1 document of HOST (4 rails) with ``down`` ports down."""
    lost = tuple(sorted(int(k.split("_")[1].split("/")[0]) for k in down))
    view = RailView(epoch=7, gpus=GPUS, rails=(0, 1, 2, 3), lost=lost, down=tuple(sorted(down)))
    return document(HOST, view, seq=seq, now=time.time(), reason=reason, before=None)


def line(doc: dict, kind: str = "change") -> bytes:
    return json.dumps({**doc, "kind": kind}).encode() + b"\n"


def wait_for(cond: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Wait (threads, no event loop) for ``cond()``, failing naming ``what`` after
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.005)


class LineServer:
    """A Unix stream socket served from a thread: every connection is kept; :meth:`send`
    writes raw lines to the latest one (or closes it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)

    def send(self, *lines: bytes) -> None:
        for raw in lines:
            self.conns[-1].sendall(raw)

    def hang_up(self) -> None:
        self.conns[-1].close()

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with short_dir() as d:
        yield d


@pytest.fixture
def server(sock_dir: Path) -> Iterator[LineServer]:
    s = LineServer(sock_dir / "rails.sock")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def watches() -> Iterator[list[RailWatch]]:
    made: list[RailWatch] = []
    yield made
    for w in made:
        w.stop()


def started(made: list[RailWatch], path: Path, **kw: Any) -> RailWatch:
    """A watch that fires at once (``grace_s=0``) unless ``kw`` says otherwise: the grace has
    tests of its own."""
    w = RailWatch(path, **{"grace_s": 0, **kw}).start()
    made.append(w)
    return w


# -- against the agent's real server ---------------------------------------------------------------


async def test_fires_for_its_own_port_only_with_the_latency(sock_dir: Path, watches) -> None:
    current = rail_doc(1)
    server = RailMapServer(sock_dir / "rails.sock", current=lambda: current)
    task = asyncio.create_task(server.serve())
    try:
        await asyncio.wait_for(server.ready.wait(), 5)
        heard: list[RailLost] = []
        # this process's NCCL uses rails 1 and 3 (as `linkguard exec` would give it)
        env = {"NCCL_IB_HCA": "=mlx5_1:1,mlx5_3:1"}
        watch = started(watches, server.path, environ=env, on_lost=heard.append)
        await until(lambda: watch.wait_ready(0), "the baseline")
        assert watch.last is not None and watch.last["kind"] == "current"
        server.publish(rail_doc(2, down=("mlx5_0/1",)))  # a rail this process does not use
        server.publish(rail_doc(3, down=("mlx5_0/1", "mlx5_2/1")))
        await until(lambda: watch.stats.documents == 3, "two changes read")
        assert watch.lost is None and heard == []
        watch.check()  # nothing to raise
        sent = time.time()
        server.publish(rail_doc(4, down=("mlx5_0/1", "mlx5_2/1", "mlx5_3/1"), reason="fast_path"))
        await until(lambda: watch.lost is not None, "the loss of mlx5_3/1")
        lost = watch.lost
        assert lost is not None and heard == [lost]
        assert lost.ports == ("mlx5_3/1",)
        assert (lost.change["seq"], lost.change["reason"]) == (4, "fast_path")
        assert lost.delay_ms is not None and lost.delay_ms >= 0
        assert lost.noticed_at >= sent
        with pytest.raises(RailLost, match=r"rail lost on gpu000: mlx5_3/1 \(agent change seq 4"):
            watch.check()
        with pytest.raises(RailLost, match=r"retry budget \(~30 s\)"):
            watch.check()  # every step raises again, the first loss
        # the same port still down, then one more port of this process: one more event
        server.publish(rail_doc(5, down=("mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1")))
        await until(lambda: len(heard) == 2, "the loss of mlx5_1/1")
        assert heard[1].ports == ("mlx5_1/1",) and watch.lost is lost
        assert watch.stats.fired == 2 and watch.stats.bad_lines == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_real_agent_port_down_fires_with_nccl_env_already_updated(tmp_path: Path) -> None:
    """The agent writes nccl.env before it announces a change: a worker that restarts on the
    watch through `linkguard exec` reads the rails the change announced."""
    fabric = generate_rail_optimized(hosts=2, rails=2)
    with short_dir() as d:
        async with running_agent(
            tmp_path, fabric=fabric, rails_socket=RailsSocketSettings(path=d / "rails.sock")
        ) as rig:
            await rig.plan(1)
            await until(lambda: rig.acked(1), "plan 1 acked")
            run = rig.agent.settings.rail_map_path.parent
            await until(lambda: (run / "nccl.env").exists(), "nccl.env")
            env = read_host_nccl(run).env
            assert env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}
            seen: list[dict[str, str]] = []
            watch = RailWatch(
                d / "rails.sock",
                environ=env,
                grace_s=0,
                on_lost=lambda _e: seen.append(read_host_nccl(run).env),
            ).start()
            try:
                await until(lambda: watch.wait_ready(0), "the baseline")
                assert rig.source is not None
                rig.source.link_down("mlx5_0", 1)
                await until(lambda: watch.lost is not None, "the loss of rail 0")
                assert watch.lost is not None and watch.lost.ports == ("mlx5_0/1",)
                assert watch.lost.change["rails_lost"] == [0]
                assert seen == [{"NCCL_IB_HCA": "=mlx5_1:1"}]  # read in the callback
            finally:
                watch.stop()


# -- the rules, on a plain socket -----------------------------------------------------------------


def test_baseline_ports_never_fire_unless_initial_fire(server: LineServer, watches) -> None:
    watch = started(watches, server.path, environ={})  # NCCL_IB_HCA unset: every port
    wait_for(lambda: server.conns, "a connection")
    server.send(line(rail_doc(3, down=("mlx5_2/1",)), "current"))  # down before NCCL opened
    wait_for(lambda: watch.wait_ready(0), "the baseline")
    server.send(line(rail_doc(4)), line(rail_doc(5, down=("mlx5_2/1",))))  # back, down again
    wait_for(lambda: watch.stats.documents == 3, "the changes")
    assert watch.lost is None
    server.send(line(rail_doc(6, down=("mlx5_2/1", "mlx5_0/1"))))
    wait_for(lambda: watch.lost is not None, "mlx5_0/1")
    assert watch.lost is not None and watch.lost.ports == ("mlx5_0/1",)

    late = started(watches, server.path, environ={}, initial="fire")
    wait_for(lambda: len(server.conns) == 2, "a second connection")
    server.send(line(rail_doc(6, down=("mlx5_0/1", "mlx5_2/1")), "current"))
    wait_for(lambda: late.lost is not None, "the current map's losses")
    assert late.lost is not None and late.lost.ports == ("mlx5_0/1", "mlx5_2/1")


def test_reconnects_and_a_loss_during_the_gap_fires(sock_dir: Path, watches) -> None:
    first = LineServer(sock_dir / "rails.sock")
    env = {"NCCL_IB_HCA": "=mlx5_1:1"}
    watch = started(watches, first.path, environ=env, reconnect_s=0.01)
    try:
        wait_for(lambda: first.conns, "a connection")
        first.send(line(rail_doc(9), "current"))
        wait_for(lambda: watch.wait_ready(0), "the baseline")
    finally:
        first.close()  # the agent stops
    second = LineServer(sock_dir / "rails.sock")  # a new agent, mlx5_1 went down meanwhile
    try:
        wait_for(lambda: second.conns, "the reconnection")
        second.send(line(rail_doc(0, reason="none"), "current"))  # no view yet: skipped
        second.send(line(rail_doc(1, down=("mlx5_1/1",), reason="start")))
        wait_for(lambda: watch.lost is not None, "the loss seen after the reconnect")
        assert watch.lost is not None and watch.lost.ports == ("mlx5_1/1",)
        assert watch.stats.connects == 2
    finally:
        second.close()


def test_bad_lines_are_logged_and_skipped(server: LineServer, watches, caplog) -> None:
    caplog.set_level("INFO", logger="linkguard.jobwatch")  # whatever level an earlier test left
    watch = started(watches, server.path, environ={"NCCL_IB_HCA": "mlx5_1"}, reconnect_s=0.01)
    wait_for(lambda: server.conns, "a connection")
    server.send(b"not json\n", b"[1, 2]\n", b'{"kind": "change", "ports_down": "mlx5_1/1"}\n')
    server.send(b'{"kind": "mystery", "ports_down": []}\n', b"\xff\xfe\n")
    server.send(line(rail_doc(1), "current"))
    wait_for(lambda: watch.wait_ready(0), "the document after the bad lines")
    assert watch.stats.bad_lines == 5 and watch.lost is None
    assert "jobwatch_bad_line: not JSON" in caplog.text
    assert "jobwatch_bad_line: not a rail-change document" in caplog.text
    # the agent cuts a slow reader: its error line, then a new connection and current map
    server.send(b'{"kind": "error", "error": "slow_consumer", "detail": "x"}\n')
    wait_for(lambda: len(server.conns) == 2, "the reconnection after the error line")
    assert watch.stats.errors == 1
    server.send(line(rail_doc(2, down=("mlx5_10/1",)), "current"))  # a prefix match, as NCCL
    wait_for(lambda: watch.lost is not None, "the loss of mlx5_10/1")
    assert watch.lost is not None and watch.lost.ports == ("mlx5_10/1",)


def test_ip_transports_have_nothing_to_watch(server: LineServer, watches) -> None:
    watch = started(watches, server.path, environ={"NCCL_IB_DISABLE": "1"})
    assert not watch.watching and "NCCL_IB_DISABLE" in watch.why
    sock = started(watches, server.path, environ={"NCCL_NET": "Socket"})
    assert not sock.watching
    wait_for(lambda: len(server.conns) == 2, "both connections")
    for i in range(2):
        server.conns[i].sendall(line(rail_doc(1), "current"))
        server.conns[i].sendall(line(rail_doc(2, down=tuple(f"mlx5_{r}/1" for r in range(4)))))
    wait_for(lambda: watch.stats.documents == sock.stats.documents == 2, "the documents")
    assert watch.lost is None and sock.lost is None
    given = RailWatch(server.path, ports=["mlx5_3/1", "mlx5_2:1"], environ={"NCCL_IB_DISABLE": "1"})
    assert given.watching and given.selector == "=mlx5_3:1,mlx5_2:1"  # explicit ports win
    with pytest.raises(ValueError, match="give hca:port, hca/port or hca"):
        RailWatch(server.path, ports=["mlx5_0:x"])
    with pytest.raises(ValueError, match=r"port 'bogus spec!': give hca:port"):
        RailWatch(server.path, ports=["bogus spec!"])
    with pytest.raises(TypeError, match=r"ports='mlx5_0:1': give a list of ports"):
        RailWatch(server.path, ports="mlx5_0:1")
    with pytest.raises(ValueError, match="lost_on"):
        RailWatch(server.path, lost_on=["gone"])  # type: ignore[list-item]


def test_held_down_counts_when_asked(server: LineServer, watches) -> None:
    watch = started(watches, server.path, environ={}, lost_on=("down", "held_down"))
    wait_for(lambda: server.conns, "a connection")
    server.send(line(rail_doc(1), "current"))
    held = {**rail_doc(2), "ports_held_down": ["mlx5_1/1"]}
    server.send(line(held))
    wait_for(lambda: watch.lost is not None, "the held-down port")
    assert watch.lost is not None and watch.lost.ports == ("mlx5_1/1",)


def test_with_port_failover_only_a_second_loss_in_a_fused_nic_fires(
    server: LineServer, watches, tmp_path: Path, caplog
) -> None:
    """The environment `linkguard exec --profile failover` gives (the real NcclFiles' fused
    pairs of an 8-rail host): NCCL survives one loss per fused NIC, so only the second fires."""
    caplog.set_level("INFO", logger="linkguard.jobwatch")
    host = Host(NCCL_FABRIC.host(HOST))
    NcclFiles(tmp_path).update(host.inv, host.states(), host.plan())
    env = parse_env_file((tmp_path / "nccl-failover.env").read_text()).env
    assert env["NCCL_NET_FORCE_MERGE"].startswith("mlx5_0:1,mlx5_1:1;mlx5_2:1,mlx5_3:1;")
    watch = started(watches, server.path, environ=env)
    assert [len(g) for g in watch.fused] == [2, 2, 2, 2]
    wait_for(lambda: server.conns, "a connection")
    server.send(line(rail_doc(1), "current"))
    server.send(
        line(rail_doc(2, down=("mlx5_0/1",))), line(rail_doc(3, down=("mlx5_0/1", "mlx5_2/1")))
    )
    wait_for(lambda: watch.stats.documents == 3, "two losses in two fused NICs")
    assert watch.lost is None
    assert "jobwatch_failover: mlx5_2/1 lost inside a fused NIC" in caplog.text
    server.send(line(rail_doc(4, down=("mlx5_0/1", "mlx5_1/1", "mlx5_2/1"))))
    wait_for(lambda: watch.lost is not None, "the second loss in mlx5_0+mlx5_1")
    assert watch.lost is not None and watch.lost.ports == ("mlx5_0/1", "mlx5_1/1")
    # mlx5_2 back up, then its partner down: the fused NIC already failed over once
    server.send(line(rail_doc(5, down=("mlx5_0/1", "mlx5_1/1"))))
    server.send(line(rail_doc(6, down=("mlx5_0/1", "mlx5_1/1", "mlx5_3/1"))))
    wait_for(lambda: len(watch.losses) == 2, "the loss of mlx5_3, mlx5_2's partner")
    assert watch.losses[1].ports == ("mlx5_3/1",)
    plain = RailWatch(server.path, environ={**env, "NCCL_IB_RESILIENCY_PORT_FAILOVER": "0"})
    assert plain.fused == ()  # fusion without failover: every loss is fatal


def test_signal_interrupts_a_blocked_main_thread(server: LineServer, watches) -> None:
    theirs: list[int] = []  # the job's own SIGUSR1 handler (the notify-training hook's signal)

    def handler(signum: int, _frame: object) -> None:
        theirs.append(signum)

    before = signal.signal(signal.SIGUSR1, handler)
    try:
        watch = RailWatch(server.path, environ={}, interrupt="signal", grace_s=0)
        watches.append(watch)
        with pytest.raises(RailLost, match="mlx5_0/1"):
            watch.start()
            os.kill(os.getpid(), signal.SIGUSR1)  # not the watch's: handed on, nothing raised
            assert theirs == [signal.SIGUSR1]

            def agent() -> None:
                wait_for(lambda: server.conns, "a connection")
                server.send(line(rail_doc(1), "current"), line(rail_doc(2, down=("mlx5_0/1",))))

            threading.Thread(target=agent, daemon=True).start()
            time.sleep(60)  # stands for a collective that would hang: the signal ends it
        watch.stop()
        assert signal.getsignal(signal.SIGUSR1) is handler  # restored by stop()
    finally:
        signal.signal(signal.SIGUSR1, before)
    with pytest.raises(ValueError, match="must run in the main thread"):
        failed: list[BaseException] = []

        def elsewhere() -> None:
            try:
                RailWatch(server.path, interrupt="signal").start()
            except ValueError as exc:
                failed.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        raise failed[0]


def test_exit_ends_a_stuck_process(server: LineServer) -> None:
    code = textwrap.dedent(
        f"""
        import sys, time
        sys.path[:0] = [{str(Path(jobwatch_module.__file__).parent)!r}]
        import jobwatch
        jobwatch.RailWatch({str(server.path)!r}, environ={{}}, interrupt="exit", grace_s=0).start()
        print("watching", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-S", "-I", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "watching\n"
        wait_for(lambda: server.conns, "the subprocess's connection")
        server.send(line(rail_doc(1), "current"), line(rail_doc(2, down=("mlx5_2/1",))))
        assert proc.wait(30) == EXIT_RAIL_LOST
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "linkguard.jobwatch: rail lost on gpu000: mlx5_2/1" in err
        assert err.rstrip().endswith(f"exiting {EXIT_RAIL_LOST}")
    finally:
        proc.kill()
        proc.wait()


# -- the module itself -----------------------------------------------------------------------------


def test_imports_nothing_but_the_standard_library() -> None:
    """In a bare interpreter (-S -I: no site-packages) from its own directory, and as
    linkguard.jobwatch from the repository: every module loaded is the standard library's."""
    here = Path(jobwatch_module.__file__).parent
    check = (
        "import sys\nbefore = set(sys.modules)\nimport {mod}\n"
        "new = {{m.split('.')[0] for m in set(sys.modules) - before}}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {{'linkguard', 'jobwatch'}}))\n"
    )
    for path, mod in ((here, "jobwatch"), (here.parent, "linkguard.jobwatch")):
        code = f"import sys; sys.path[:0] = [{str(path)!r}]\n" + check.format(mod=mod)
        out = subprocess.run(
            [sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=30
        )
        assert (out.returncode, out.stdout, out.stderr) == (0, "[]\n", "")


_name = st.sampled_from(["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_12", "ib0", "mlx5_"])


@given(
    entries=st.lists(st.tuples(_name, st.sampled_from(["", ":1", ":2", ":x"])), max_size=4),
    neg=st.booleans(),
    exact=st.booleans(),
    device=_name,
    port=st.integers(1, 2),
)
def test_selects_is_nccls_rule_as_linkguard_nccl_has_it(
    entries: list[tuple[str, str]], neg: bool, exact: bool, device: str, port: int
) -> None:
    value = ("^" if neg else "") + ("=" if exact else "") + ",".join(n + p for n, p in entries)
    assert selects(value, device, port) == hca_selects(value, device, port)
    assert selects(None, device, port) and hca_selects(None, device, port)


def test_retry_budget_from_nccls_variables() -> None:
    assert nccl_retry_budget_s({}) == pytest.approx(30.064, abs=1e-3)  # 4.096 us x 2^20 x 7
    assert nccl_retry_budget_s({"NCCL_IB_TIMEOUT": "18", "NCCL_IB_RETRY_CNT": "7"}) == (
        pytest.approx(7.516, abs=1e-3)
    )
    assert nccl_retry_budget_s({"NCCL_IB_TIMEOUT": "x"}) == nccl_retry_budget_s({})


def test_rail_lost_pickles() -> None:
    import pickle

    err = RailLost(["mlx5_1/1"], rail_doc(3, down=("mlx5_1/1",)), time.time())
    back = pickle.loads(pickle.dumps(err))
    assert (back.ports, back.change, str(back)) == (err.ports, err.change, str(err))


# -- the grace ---------------------------------------------------------------------------------


def test_the_default_grace_is_one_rc_retransmission_timeout() -> None:
    assert jobwatch_module.retransmit_timeout_s({}) == pytest.approx(4.294967296)  # 4.096us*2^20
    assert jobwatch_module.retransmit_timeout_s({"NCCL_IB_TIMEOUT": "14"}) == pytest.approx(
        0.067108864
    )
    assert RailWatch("/nonexistent", environ={}).grace_s == pytest.approx(4.294967296)
    assert RailWatch("/nonexistent", environ={"NCCL_IB_TIMEOUT": "18"}).grace_s == (
        pytest.approx(1.073741824)
    )
    with pytest.raises(ValueError, match="grace_s"):
        RailWatch("/nonexistent", grace_s=-1)
    with pytest.raises(ValueError, match="grace_s"):
        RailWatch("/nonexistent", grace_s=float("nan"))


def test_a_blip_within_the_grace_does_not_fire_a_longer_loss_does(
    server: LineServer, watches, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="linkguard.jobwatch")
    heard: list[RailLost] = []
    watch = started(watches, server.path, environ={}, grace_s=0.3, on_lost=heard.append)
    wait_for(lambda: server.conns, "a connection")
    server.send(line(rail_doc(1), "current"))
    # mlx5_0 down and back within the grace: a blip the queue pairs ride out
    server.send(line(rail_doc(2, down=("mlx5_0/1",))), line(rail_doc(3)))
    wait_for(lambda: watch.stats.documents == 3, "the blip")
    t_down = time.monotonic()
    server.send(line(rail_doc(4, down=("mlx5_1/1",))))
    wait_for(lambda: watch.lost is not None, "mlx5_1/1 still lost after the grace")
    waited = time.monotonic() - t_down
    # the blip never fired (its grace ended long before mlx5_1's did), mlx5_1 did, once
    assert [e.ports for e in heard] == [("mlx5_1/1",)]
    assert waited >= 0.3
    assert watch.lost.change["seq"] == 4  # type: ignore[union-attr]
    assert "jobwatch_blip: mlx5_0/1 back within the 0.30 s grace" in caplog.text
    # a loss while disconnected still fires when its grace is over (the agent went away)
    server.send(line(rail_doc(5, down=("mlx5_1/1", "mlx5_2/1"))))
    wait_for(lambda: watch.stats.documents == 5, "mlx5_2/1 lost")
    server.hang_up()
    wait_for(lambda: len(heard) == 2, "mlx5_2/1 after the grace, with the agent gone")
    assert heard[1].ports == ("mlx5_2/1",)
