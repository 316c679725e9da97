"""One hand-made timeline priced per transport, shared by the fleet simulator's tests
(tests/simulations/test_transports.py) and the report's over a ledger
(tests/test_report_transports.py): 4 hosts x 4 rails in one SU (16 GPUs, fused pairs 0-1 and
2-3), 10,000 s, the default job model and damping (hold-down 10 s, doubling per flap).

Outages (entry: at, what):
  0:  100 s  gpu001 rail 1 down 10 s: shorter than NCCL's budget, longer than one RC timeout
  2: 1000 s  gpu002 rail 2 down 60 s: longer than the budget
  4: 3000 s  gpu003 rail 0 flaps: down 1 s at 3000, 3002, 3004 (held down in between,
             re-admitted at 3045 after a 40 s hold-down)
  5: 5000 s  leaf su0-leaf3 reboots for 300 s: rail 3 of every host
  6: 7000 s  gpu000 rail 0 down 600 s; 7: 7100 s  gpu000 rail 1 down 600 s (its fused pair)
 10: 8500 s  gpu001 rail 2 down for good (1,500 s to the end)

Numbers used below (s): RC retransmit timeout T = 4.096 us x 2^20 = 4.294967296; NCCL's budget
B = 7 T = 30.064771072; a restart costs its detection + 750 + 900 (half a 30 min checkpoint);
fail-fast: once down T, + 0.1 to detect; TCP retransmissions at 0.2, 0.6, 1.4, 3.0, 6.2, 12.6,
25.4, 51.0, 102.2, 204.6, 324.6, 444.6, 564.6, 684.6, 804.6, the connection timing out at 924.6.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from linkguard.failuremodel import IP_STALL_S
from linkguard.simulations.engine import run
from linkguard.simulations.failures import FailureModel, FleetTimeline
from linkguard.simulations.fleetreport import FleetReport, fleet_report
from linkguard.simulations.scenario import SCHEMA, load_scenario

T = 4.294967296
B = 7 * T  # 30.064771072
FAST = T + 0.1  # 4.394967296: fail-fast wait + detection

TIMELINE = [
    {"at_s": 100, "kind": "link_down", "host": "gpu001", "rail": 1},
    {"at_s": 110, "kind": "link_up", "host": "gpu001", "rail": 1},
    {"at_s": 1000, "kind": "link_down", "host": "gpu002", "rail": 2},
    {"at_s": 1060, "kind": "link_up", "host": "gpu002", "rail": 2},
    {"at_s": 3000, "kind": "flap", "host": "gpu003", "rail": 0, "period_s": 2, "duration_s": 6},
    {"at_s": 5000, "kind": "leaf_reboot", "leaf": "su0-leaf3", "down_s": 300},
    {"at_s": 7000, "kind": "link_down", "host": "gpu000", "rail": 0},
    {"at_s": 7100, "kind": "link_down", "host": "gpu000", "rail": 1},
    {"at_s": 7600, "kind": "link_up", "host": "gpu000", "rail": 0},
    {"at_s": 7700, "kind": "link_up", "host": "gpu000", "rail": 1},
    {"at_s": 8500, "kind": "link_down", "host": "gpu001", "rail": 2},
]

#: (at_s, down_s, out_s of each port): when linkguard used each port again, from the engine's
#: hold-downs (10 s after a single down; the flap's 3rd return is held 40 s)
OUTAGES = [
    (100.0, 10.0, [20.0]),
    (1000.0, 60.0, [70.0]),
    (3000.0, 1.0, [45.0]),
    (3002.0, 1.0, [43.0]),
    (3004.0, 1.0, [41.0]),
    (5000.0, 300.0, [310.0] * 4),
    (7000.0, 600.0, [610.0]),
    (7100.0, 600.0, [610.0]),
    (8500.0, 1500.0, [1500.0]),
]

#: transport -> side -> (interruptions, stalls, idle_s); sides: "without", "with" (fail fast
#: after one RC timeout, the default) and "at_once" (fail fast on every loss)
EXPECTED: dict[str, dict[str, tuple[int, int, float]]] = {
    "ip": {
        # stalls until TCP's next retransmission: 10 s -> 12.6, 60 -> 102.2, each 1 s flap
        # down -> 1.4, 300 -> 324.6, 600 -> 684.6 twice (7000..7784.6: 784.6); the last down
        # outlasts the 15th retransmission: the connection times out at 8500 + 924.6 and the
        # job restarts (idle to the end: 1,500)
        "without": (1, 8, 12.6 + 102.2 + 3 * 1.4 + 324.6 + 784.6 + 1500),
        # every rerouted outage: IP_STALL_S, 0.2534 s (the lab job's measured p99 stall,
        # benchmarks/job_stall.py); the 2nd and 3rd flap downs hit a port already held down:
        # nothing
        "with": (0, 7, 7 * IP_STALL_S),
    },
    "nccl-ib": {
        # 10 s: stall to the 3rd RC retransmission (3 T); 60 s: restart at B (1000..2680.06);
        # flap: T each, 3000..3004 + T together; leaf reboot: restart (5000..6680.06); 7000:
        # restart, its processes back at 7030.06 + 750 (7100 comes while it restarts); 8500
        # hits the restarted job: restart again, 7000..10000 together
        "without": (4, 4, 3 * T + (B + 1650) + (4 + T) + (B + 1650) + 3000),
        # fail-fast restarts the 10 s blip (100..1754.39): dearer than its 12.9 s stall, and
        # the 60 s down at 1000 hits the job recomputing (100..2654.39 together); the flap
        # downs (1 s) are ridden out; the others restart FAST after the down instead of B
        "with": (5, 3, (1000 - 100 + FAST + 1650) + (4 + T) + (FAST + 1650) + 3000),
        # every loss restarts the job 0.1 s after the down: 100..2650.1 (the blip and the 60 s
        # down, overlapping), 3000..4650.1 (the first flap down; the others come while it
        # restarts), 5000..6650.1 (leaf), 7000..10000 (7000 and 8500)
        "at_once": (6, 0, (1000 - 100 + 0.1 + 1650) + (0.1 + 1650) + (0.1 + 1650) + 3000),
    },
    "nccl-ib-failover": {
        # 10 s on rail 1: stall 3 T; 60 s on rail 2: its QPs fail over to rail 3 after B (a
        # B stall), rail 2 failed for this job; flap: T each (4 + T); the leaf reboot takes
        # rail 3 everywhere: gpu002 has no working member of pair 2-3 left: restart
        # (5000..6680.06; the new processes at 5780.06 use every port); 7000: rail 0 fails
        # over to rail 1 (B); 7100: rail 1, the pair's last member: restart (7100..8780.06);
        # 8500 (rail 2 of gpu001) fails over to rail 3 meanwhile
        "without": (2, 7, 3 * T + B + (4 + T) + (B + 1650) + B + (B + 1650)),
        # fail-fast only for a pair's last member: the leaf reboot on gpu002 and the 7100 down
        "with": (2, 7, 3 * T + B + (4 + T) + (FAST + 1650) + B + (FAST + 1650)),
        "at_once": (2, 7, 3 * T + B + (4 + T) + (0.1 + 1650) + B + (0.1 + 1650)),
    },
}

#: transport -> (outage entries charged more with linkguard, with fail fast at once)
COSTLIER = {"ip": ((), ()), "nccl-ib": ((0,), (0, 4)), "nccl-ib-failover": ((), ())}


def hand_report(tmp_path: Path) -> tuple[FleetTimeline, FleetReport]:
    """The timeline replayed by the engine and priced on every transport."""
    doc = {
        "schema": SCHEMA,
        "name": "transports",
        "description": "One timeline priced per transport.",
        "fabric": {"generate": {"hosts": 4, "rails": 4, "hosts_per_su": 4, "spines_per_su": 2}},
        "duration_s": 10_000,
        "debounce_ms": 100,
        "timeline": TIMELINE,
    }
    path = tmp_path / "transports.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_scenario(path)
    ft = FleetTimeline(loaded=loaded, model=FailureModel(), counts={}, dropped=0)
    report = run(loaded)
    assert report.passed, report.failures
    return ft, fleet_report(ft, report)
