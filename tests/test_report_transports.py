"""``linkguard report`` per transport over real SQLite ledgers: a simulation's ledger of the
hand-made timeline (tests/transport_cases.py) gives the simulator's prices; a service's ledger
built from a change feed (a blip, a flap under hold-down, a second loss in a fused pair, a long
down) is priced by hand; ``--transport``, ``--ip-stall-from`` / ``--ip-stall-ms`` and bad input
on the command line (``sim fleet`` and ``report``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from linkguard.cli import main
from linkguard.failuremodel import IP_STALL_S
from linkguard.ledger import Ledger
from linkguard.simulations.engine import WALL0
from linkguard.simulations.ledgerrecord import record_simulation
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.generator import generate_rail_optimized
from tests.transport_cases import COSTLIER, EXPECTED, hand_report

SIDES = {
    "without": "without_linkguard",
    "with": "with_linkguard",
    "at_once": "with_linkguard_at_once",
}
T = 4.294967296  # one RC retransmit timeout at NCCL_IB_TIMEOUT=20 (s)
B = 7 * T  # NCCL's budget at NCCL_IB_RETRY_CNT=7
FAST = T + 0.1  # the fail-fast wait + its detection


@pytest.fixture(scope="module")
def hand_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hand")
    ft, rep = hand_report(d)
    path = d / "hand.sqlite3"
    with Ledger(path) as led:
        record_simulation(led, ft, rep)
    return path


def test_a_simulation_ledger_prices_each_transport_as_the_simulator(hand_ledger: Path) -> None:
    with Ledger(hand_ledger, read_only=True) as led:
        rep = led.report()
    for transport, sides in EXPECTED.items():
        tc = rep.transports[transport]
        for side, (interruptions, stalls, idle) in sides.items():
            cost = getattr(tc, SIDES[side])
            assert (cost.interruptions, cost.stalls) == (interruptions, stalls), (transport, side)
            assert cost.idle_s == pytest.approx(idle, abs=1e-5), (transport, side)
        # ledger row ids in time order stand for the timeline's entries
        ids = [o["id"] for o in rep.outages]
        entries = [0, 2, 4, 4, 4, 5, 6, 7, 10]
        by_entry = {e: [i for i, x in zip(ids, entries, strict=True) if x == e] for e in entries}
        want = tuple(tuple(by_entry[e][0] for e in c) for c in COSTLIER[transport])
        assert (tc.costlier, tc.costlier_at_once) == want
    # the engine's hold-downs are in the ledger as a service records them
    conn = sqlite3.connect(hand_ledger)
    flap = conn.execute(
        "SELECT at, previous, current FROM port_events WHERE host='gpu003' AND rail=0 ORDER BY at"
    ).fetchall()
    conn.close()
    assert [(round(at - WALL0, 3), a, b) for at, a, b in flap] == [
        (3000, "up", "down"),
        (3001, "down", "held_down"),
        (3002, "held_down", "down"),
        (3003, "down", "held_down"),
        (3004, "held_down", "down"),
        (3005, "down", "held_down"),
        (3045, "held_down", "up"),
    ]


def test_a_service_ledger_prices_each_transport(tmp_path: Path) -> None:
    """4 hosts x 2 rails (8 GPUs, rails 0-1 fused), 10,000 s, the service's own feed."""
    fabric = generate_rail_optimized(hosts=4, rails=2)
    t0 = 1_750_000_000.0
    feed = ChangeFeed()
    epoch = [1]

    def port(host: str, rail: int, status: str) -> dict:
        c = next(c for c in fabric.host(host).hcas if c.rail == rail)
        return {"host": host, "hca": c.hca, "port": c.port, "rail": rail, "status": status}

    def moved(host: str, rail: int, previous: str, current: str, at: float) -> None:
        feed.emit("port", port(host, rail, current), at=t0 + at)
        feed.emit(
            "port_event",
            {**port(host, rail, current), "previous": previous, "current": current, "at": t0 + at},
            at=t0 + at,
        )

    def rerouted(host: str, at: float) -> None:  # the plan moving host, acked 30 ms later
        epoch[0] += 1
        feed.emit("plans", {"epoch": epoch[0], "hosts": [host], "peer_routes": []}, at=t0 + at)
        feed.emit("ack", {"host": host, "epoch": epoch[0], "result": "applied"}, at=t0 + at + 0.03)

    with Ledger(tmp_path / "svc.sqlite3", retention_days=None) as led:
        led.start_run(fabric, window_start=t0)
        feed.subscribe(led.consumer())
        for h in fabric.hosts:
            for c in h.hcas:
                feed.emit("port", port(h.host, c.rail, "up"), at=t0)
        # a 10 s blip of gpu001 rail 0, held down 10 s after
        moved("gpu001", 0, "up", "down", 100)
        rerouted("gpu001", 100)
        moved("gpu001", 0, "down", "held_down", 110)
        moved("gpu001", 0, "held_down", "up", 120)
        # gpu002 rail 1 flaps: three 1 s downs, the 2nd and 3rd while held down
        moved("gpu002", 1, "up", "down", 1000)
        rerouted("gpu002", 1000)
        for k in (1, 3):
            moved("gpu002", 1, "down", "held_down", 1000 + k)
            moved("gpu002", 1, "held_down", "down", 1001 + k)
        moved("gpu002", 1, "down", "held_down", 1005)
        moved("gpu002", 1, "held_down", "up", 1045)
        # gpu003 loses rail 0 for 600 s, then rail 1 (its fused pair) for 600 s
        moved("gpu003", 0, "up", "down", 3000)
        rerouted("gpu003", 3000)
        moved("gpu003", 1, "up", "down", 3100)
        rerouted("gpu003", 3100)
        moved("gpu003", 0, "down", "held_down", 3600)
        moved("gpu003", 0, "held_down", "up", 3610)
        moved("gpu003", 1, "down", "held_down", 3700)
        moved("gpu003", 1, "held_down", "up", 3710)
        # gpu000 rail 1 down 60 s
        moved("gpu000", 1, "up", "down", 5000)
        rerouted("gpu000", 5000)
        moved("gpu000", 1, "down", "held_down", 5060)
        moved("gpu000", 1, "held_down", "up", 5070)
        assert led.flush()
        rep = led.report(until=t0 + 10_000)
    assert rep.duration_s == 10_000 and rep.gpus == 8
    assert [(o["at_s"], o["down_s"], o["reroute"], o["isolated"]) for o in rep.outages] == [
        (100, 10, "done", False),
        (1000, 1, "done", False),
        (1002, 1, "none", False),
        (1004, 1, "none", False),
        (3000, 600, "done", False),
        (3100, 600, "done", True),  # gpu003 had no rail left
        (5000, 60, "done", False),
    ]
    ip, ib, fo = (rep.transports[t] for t in ("ip", "nccl-ib", "nccl-ib-failover"))
    # ip without: TCP's next retransmission: 10 s -> 12.6, 1 s -> 1.4 (x3), 600 s -> 684.6
    # twice (3000..3784.6: 784.6), 60 s -> 102.2
    assert (ip.without_linkguard.stalls, ip.without_linkguard.idle_s) == (7, 903.6)
    # with: IP_STALL_S (0.2534 s) per rerouted outage, nothing for the held-down flap downs,
    # and gpu003 left with no rail at 3100 stalls as without (684.6; 3000..3000.2534 apart)
    assert (ip.with_linkguard.stalls, ip.with_linkguard.idle_s) == (
        5,
        pytest.approx(684.6 + 4 * IP_STALL_S),
    )
    # nccl-ib without: 10 s -> 3 T; flap: T each (1000..1004 + T); 600 s at 3000: restart at
    # B (3000..4680.06; 3100 comes while it restarts); 60 s at 5000: restart
    c = ib.without_linkguard
    assert (c.interruptions, c.stalls) == (2, 4)
    assert c.idle_s == pytest.approx(3 * T + (4 + T) + 2 * (B + 1650), abs=1e-5)
    # with: the 10 s blip restarts (100..1754.39, the flap stalls inside it), 3000 and 5000
    # restart FAST after the down
    c = ib.with_linkguard
    assert (c.interruptions, c.stalls) == (3, 3)
    assert c.idle_s == pytest.approx(3 * (FAST + 1650), abs=1e-5)
    assert [rep.outages[i]["id"] for i in (0,)] == list(ib.costlier)  # dearer: the blip
    # at once: the blip and the first flap down restart (100..2650.1), 3000, 5000
    c = ib.with_linkguard_at_once
    assert (c.interruptions, c.stalls) == (4, 0)
    assert c.idle_s == pytest.approx((1000 - 100 + 0.1 + 1650) + 2 * (0.1 + 1650), abs=1e-5)
    # failover without: the blip and the flap stall (3 T, 4 + T); 3000: rail 0 fails over to
    # rail 1 (B); 3100: rail 1 is the pair's last member: restart at 3100 + B; 5000: rail 1 of
    # gpu000 fails over to rail 0 (B)
    c = fo.without_linkguard
    assert (c.interruptions, c.stalls) == (1, 6)
    assert c.idle_s == pytest.approx(3 * T + (4 + T) + B + (B + 1650) + B, abs=1e-5)
    # with: fail-fast for the doomed 3100 loss only
    c = fo.with_linkguard
    assert (c.interruptions, c.stalls) == (1, 6)
    assert c.idle_s == pytest.approx(3 * T + (4 + T) + B + (FAST + 1650) + B, abs=1e-5)
    assert fo.with_linkguard_at_once.idle_s == pytest.approx(
        3 * T + (4 + T) + B + (0.1 + 1650) + B, abs=1e-5
    )
    assert fo.costlier == ()


def _report(ledger: Path, out: Path, *args: str) -> str:
    assert main(["report", "--ledger", str(ledger), "--out", str(out), *args]) == 0
    return out.read_text()


def test_cli_transport_and_ip_stall(hand_ledger: Path, tmp_path: Path) -> None:
    one = json.loads(
        _report(hand_ledger, tmp_path / "r.json", "--format", "json", "--transport", "nccl-ib")
    )
    assert one["schema"] == "linkguard.ledger-report/v2"
    assert list(one["transports"]) == ["nccl-ib"] and one["transport"] == "nccl-ib"
    assert one["without_linkguard"]["interruptions"] == EXPECTED["nccl-ib"]["without"][0]
    assert one["interruptions_avoided"] == 4 - 5  # fail-fast turns the 10 s blip into a restart
    text = _report(hand_ledger, tmp_path / "r.txt", "--transport", "nccl-ib-failover")
    assert [x.split()[1] for x in text.splitlines() if x.startswith("transport ")] == [
        "nccl-ib-failover"
    ]
    # the ip stall from a number or from the lab job benchmark's JSON: 7 rerouted outages
    ms = json.loads(
        _report(hand_ledger, tmp_path / "m.json", "--format", "json", "--ip-stall-ms", "300")
    )
    assert ms["transports"]["ip"]["with_linkguard"]["idle_s"] == pytest.approx(7 * 0.3)
    assert ms["model"]["ip_stall_source"] == "--ip-stall-ms"
    bench = tmp_path / "job_stall.json"
    bench.write_text(json.dumps({"with_linkguard": {"stall_ms": {"p50": 150, "p99": 412.5}}}))
    got = json.loads(
        _report(hand_ledger, tmp_path / "b.json", "--format", "json", "--ip-stall-from", str(bench))
    )
    assert got["transports"]["ip"]["with_linkguard"]["idle_s"] == pytest.approx(7 * 0.4125)
    assert str(bench) in got["transports"]["ip"]["assumes"]
    csv_text = _report(hand_ledger, tmp_path / "r.csv", "--format", "csv", "--transport", "ip")
    row = next(r for r in csv_text.splitlines() if r.startswith("with_linkguard,ip,idle_s,"))
    assert float(row.rsplit(",", 1)[1]) == pytest.approx(7 * IP_STALL_S)
    assert ",nccl-ib," not in csv_text


def test_sim_fleet_takes_the_transport_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    js = tmp_path / "f.json"
    args = ["sim", "fleet", "--hosts", "64", "--days", "30", "--seed", "2", "--json", str(js)]
    assert main([*args, "--transport", "nccl-ib-failover", "--ip-stall-ms", "250"]) == 0
    out = capsys.readouterr().out
    assert "transport nccl-ib-failover (" in out and "transport ip (" not in out
    d = json.loads(js.read_text())
    assert d["schema"] == "linkguard.fleet-report/v2" and list(d["transports"]) == [
        "nccl-ib-failover"
    ]
    assert d["transport"] == "nccl-ib-failover" and d["model"]["ip_stall_s"] == 0.25


@pytest.mark.parametrize("command", ["report", "sim"])
def test_bad_transport_input_exits_2(
    command: str, hand_ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = (
        ["report", "--ledger", str(hand_ledger)]
        if command == "report"
        else ["sim", "fleet", "--hosts", "4", "--days", "1"]
    )
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    nokey = tmp_path / "nokey.json"
    nokey.write_text('{"with_linkguard": {"stall_ms": {"p50": 3}}}')
    negative = tmp_path / "neg.json"
    negative.write_text('{"with_linkguard": {"stall_ms": {"p99": -1}}}')
    good = tmp_path / "good.json"
    good.write_text('{"with_linkguard": {"stall_ms": {"p99": 300}}}')
    for args, msg in (
        (["--transport", "rdma"], "argument --transport: invalid choice: 'rdma'"),
        (["--ip-stall-ms", "-5"], "argument --ip-stall-ms: must be between 0 and"),
        (["--ip-stall-ms", "nan"], "argument --ip-stall-ms: must be between 0 and"),
        (["--ip-stall-from", str(junk)], f"argument --ip-stall-from: {junk}: not JSON"),
        (["--ip-stall-from", str(nokey)], "no with_linkguard.stall_ms.p99"),
        (["--ip-stall-from", str(negative)], "p99 is -1, must be 0..3600000 ms"),
        (["--ip-stall-from", str(tmp_path / "gone.json")], "cannot read"),
        (["--ip-stall-ms", "1", "--ip-stall-from", str(good)], "not allowed with argument"),
    ):
        with pytest.raises(SystemExit) as exc:
            main([*base, *args])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and msg in err and "Traceback" not in err, args
