"""The lab's ``fast_path`` expectation (linkguard.simulations.labmeasure, .labsteps): which
steps are one host's link faults, the time to that host's first fast-path ack the bus observer
saw, and the expectation over a report. No lab is built: the observer is filled by hand with
the acks the agents would publish; the real run is `linkguard sim lab fast-path-only` in CI."""

from __future__ import annotations

from linkguard.models import Ack
from linkguard.simulations.labmeasure import ack_timing, lab_expectations
from linkguard.simulations.labprocs import Observer
from linkguard.simulations.labreport import FaultResult, LabReport
from linkguard.simulations.labsteps import steps_of
from linkguard.simulations.scenario import SCENARIOS_DIR, expand, load_scenario
from linkguard.simulations.scenario_schema import Expect


def _steps(name: str):
    return steps_of(expand(load_scenario(SCENARIOS_DIR / f"{name}.yaml")))


def test_a_step_is_a_host_link_fault_only_when_it_takes_down_one_hosts_ports() -> None:
    fast = _steps("fast-path-only")
    assert [(s.at_s, s.port_host) for s in fast] == [
        (2.0, None),  # the service goes away: not a port
        (3.0, "gpu001"),
        (4.0, "gpu003"),
        (10.0, None),  # the service is back
        (14.0, None),  # link ups take nothing down
        (15.0, None),
    ]
    leaf = _steps("leaf-reboot")
    assert leaf[0].port_host is None  # a switch and four hosts' ports


def _ack(host: str, *, fast_path: bool, epoch: int = 3) -> Ack:
    return Ack(host=host, epoch=epoch, result="applied", applied_at=1.0, fast_path=fast_path)


def test_the_first_fast_path_ack_of_the_faults_host_in_its_window_is_its_time() -> None:
    obs = Observer()
    obs.acks["gpu001"] = [
        (9.9, _ack("gpu001", fast_path=True)),  # before the step: an earlier fault's
        (10.042, _ack("gpu001", fast_path=True)),
        (10.3, _ack("gpu001", fast_path=False)),
        (10.5, _ack("gpu001", fast_path=True)),
    ]
    obs.acks["gpu003"] = [(10.01, _ack("gpu003", fast_path=True))]  # another host's
    hit = FaultResult(at_s=3.0, kind="link_down", what="link_down gpu001", entries=[1])
    hit.host = "gpu001"
    ack_timing(obs, ["gpu001", "gpu003"], hit, t_step=10.0, epoch0=2, end=11.0)
    assert hit.fast_path_ms == 42.0
    late = FaultResult(at_s=3.0, kind="link_down", what="link_down gpu001", entries=[1])
    late.host = "gpu001"
    ack_timing(obs, ["gpu001"], late, t_step=10.6, epoch0=2, end=11.0)
    assert late.fast_path_ms is None  # nothing after 10.6 s within the window
    leaf = FaultResult(at_s=3.0, kind="leaf_reboot", what="leaf", entries=[0])
    ack_timing(obs, ["gpu001", "gpu003"], leaf, t_step=10.0, epoch0=2, end=11.0)
    assert leaf.fast_path_ms is None  # not one host's link fault: not measured


def _report(*faults: FaultResult) -> LabReport:
    return LabReport(
        scenario="fast-path-only",
        path="x.yaml",
        linkguard=True,
        hosts=4,
        rails=4,
        sus=1,
        duration_s=22,
        debounce_ms=50,
        faults=list(faults),
    )


def test_fast_path_holds_only_when_every_host_link_fault_got_its_ack() -> None:
    a = FaultResult(at_s=3.0, kind="link_down", what="a", entries=[1], host="gpu001")
    a.fast_path_ms = 12.5
    b = FaultResult(at_s=4.0, kind="link_down", what="b", entries=[2], host="gpu003")
    service = FaultResult(at_s=2.0, kind="service_restart", what="svc", entries=[0])
    ex = Expect(reachability=False, fast_path=True)
    (missed,) = lab_expectations(_report(service, a, b), ex, linkguard=True)
    assert (missed.name, missed.held, missed.observed) == ("fast_path", False, 1)
    assert "1 of 2" in missed.detail and "gpu003 at 4 s" in missed.detail
    b.fast_path_ms = 30.0
    (held,) = lab_expectations(_report(service, a, b), ex, linkguard=True)
    assert (held.held, held.observed) == (True, 2)
    assert lab_expectations(_report(service), ex, linkguard=True)[0].held is False  # none
    # without linkguard nobody takes a fast path: the baseline half does not check it
    assert lab_expectations(_report(a, b), ex, linkguard=False) == []
    assert "fast path 12 ms" in _report(a).text()
