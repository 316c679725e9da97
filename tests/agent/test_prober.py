"""The agent's probe runner (:mod:`linkguard.agent.prober`) on real UDP sockets over loopback:
two "hosts" on 127.0.0.0/8 addresses answer and probe each other from their targets and report
loss and RTT every window; a peer that stops answering shows as every probe lost; a rail
address that is not on this host is logged and left out, never fatal."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from linkguard.agent.prober import ProbeRunner
from linkguard.models import ProbePeer, ProbeRail, ProbeReport, ProbeTargets
from tests.support import until

A, B = "127.0.0.71", "127.0.0.72"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _targets(host: str, me: str, peer_host: str, peer: str, port: int, epoch: int = 1):
    return ProbeTargets(
        host=host,
        epoch=epoch,
        port=port,
        rate_pps=20 / 2,  # 10 probes/s to the one peer
        timeout_s=0.2,
        window_s=0.5,
        rails=[
            ProbeRail(rail=0, address=me, peers=[ProbePeer(host=peer_host, rail=0, address=peer)])
        ],
    )


@contextlib.asynccontextmanager
async def _runner(host: str, reports: list[ProbeReport]) -> AsyncIterator[ProbeRunner]:
    runner = ProbeRunner(host)

    async def publish(r: ProbeReport) -> None:
        reports.append(r)

    task = asyncio.create_task(runner.run(publish))
    try:
        yield runner
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_two_hosts_probe_each_other_and_a_silent_peer_shows_as_loss() -> None:
    port = _free_udp_port()
    a_reports: list[ProbeReport] = []
    b_reports: list[ProbeReport] = []
    async with _runner("gpu000", a_reports) as a:
        a.set_targets(_targets("gpu000", A, "gpu001", B, port))
        async with _runner("gpu001", b_reports) as b:
            b.set_targets(_targets("gpu001", B, "gpu000", A, port))
            await until(
                lambda: any(r.pairs and r.pairs[0].sent >= 3 for r in a_reports[1:]),
                "a full window of A's probes",
            )
        got = next(r for r in a_reports[1:] if r.pairs[0].sent >= 3)
        assert got.host == "gpu000" and got.epoch == 1 and got.window_s == 0.5
        (pair,) = got.pairs
        assert (pair.rail, pair.peer_host, pair.peer_rail) == (0, "gpu001", 0)
        assert pair.lost == 0
        assert pair.rtt_p50_ms is not None and 0 < pair.rtt_p50_ms < 200
        assert pair.rtt_p99_ms is not None and pair.rtt_p99_ms >= pair.rtt_p50_ms
        assert any(r.pairs[0].sent >= 3 and r.pairs[0].lost == 0 for r in b_reports)
        # B is gone (its responder closed): every probe of a later window is lost
        n = len(a_reports)
        await until(
            lambda: any(
                r.pairs[0].sent >= 3 and r.pairs[0].lost == r.pairs[0].sent for r in a_reports[n:]
            ),
            "a window of A's probes all lost",
        )
        lost = next(r for r in a_reports[n:] if r.pairs[0].lost == r.pairs[0].sent >= 3)
        assert lost.pairs[0].rtt_p50_ms is None


async def test_an_address_not_on_this_host_is_logged_not_fatal() -> None:
    reports: list[ProbeReport] = []
    port = _free_udp_port()
    with capture_logs() as logs:
        async with _runner("gpu000", reports) as a:
            t = _targets("gpu000", "192.0.2.1", "gpu001", B, port)  # TEST-NET-1: not local
            a.set_targets(t)
            await until(lambda: len(reports) >= 1, "a report without the rail")
            assert reports[0].pairs == [] and a.failures == 0
            a.set_targets(_targets("gpu000", A, "gpu001", B, port, epoch=2))
            await until(lambda: any(r.epoch == 2 and r.pairs for r in reports), "new targets")
    failed = [e for e in logs if e["event"] == "probe_rail_failed"]
    assert failed[0]["address"] == "192.0.2.1" and failed[0]["log_level"] == "warning"
    assert {e["log_level"] for e in failed[1:]} <= {"debug"}  # retried every window, quietly
    # its only rail failed: said as a warning, not as probes started
    (idle,) = [e for e in logs if e["event"] == "probes_not_started"]
    assert (idle["epoch"], idle["rails"], idle["log_level"]) == (1, [0], "warning")
    started = [e["epoch"] for e in logs if e["event"] == "probes_started"]
    assert started == [2]


async def test_deleted_targets_stop_the_probes() -> None:
    port = _free_udp_port()
    reports: list[ProbeReport] = []
    with capture_logs() as logs:
        async with _runner("gpu000", reports) as a:
            a.set_targets(_targets("gpu000", A, "gpu001", B, port))
            await until(lambda: len(reports) >= 1, "a first report")
            a.clear_targets()
            assert a.targets is None
            # the responder closes with the probes: A's probe port is free again
            await until(lambda: _udp_free(A, port), "the responder closed")
            n = len(reports)
            a.set_targets(_targets("gpu000", A, "gpu001", B, port, epoch=2))
            await until(lambda: any(r.epoch == 2 for r in reports[n:]), "new targets probed")
            assert all(r.epoch == 2 for r in reports[n:])
    stopped = [e for e in logs if e["event"] == "probes_stopped"]
    assert [e["epoch"] for e in stopped] == [1]


def _udp_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
        return True


async def test_a_rail_that_cannot_bind_yet_is_tried_again_every_window() -> None:
    """The probe port of A's rail address is taken (at boot, the address may not be up
    yet): A reports nothing for that rail, then binds it the window after it is free, and
    answers and probes from then on, without waiting for new targets."""
    port = _free_udp_port()
    blocker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    blocker.bind((A, port))
    a_reports: list[ProbeReport] = []
    with contextlib.closing(blocker), capture_logs() as logs:
        async with _runner("gpu001", []) as b, _runner("gpu000", a_reports) as a:
            b.set_targets(_targets("gpu001", B, "gpu000", A, port))
            a.set_targets(_targets("gpu000", A, "gpu001", B, port))
            await until(lambda: len(a_reports) >= 2, "two windows with the rail unbound")
            assert all(r.pairs == [] for r in a_reports)
            blocker.close()
            await until(
                lambda: any(p.sent >= 3 and p.lost == 0 for r in a_reports for p in r.pairs),
                "a window of A's probes answered after the rail bound",
            )
    started = [e for e in logs if e["event"] == "probe_rail_started"]
    assert [(e["epoch"], e["rail"]) for e in started] == [(1, 0)]
    assert a.failures == 0


def test_targets_of_another_host_are_refused() -> None:
    with pytest.raises(ValueError, match="gpu001"):
        ProbeRunner("gpu000").set_targets(_targets("gpu001", A, "gpu000", B, 47_910))
