"""Bad messages through the real message handlers: a topology service and two agents on an
in-memory broker (``fuzz.live.LiveFleet``; the service signs its plans, the agents require
signatures) get junk and damaged valid messages (unsigned, and signed with the service's key)
on every topic they read; no handler raises, all keep running, every message that does not
decode or is not signed is counted as dropped, and a real port going down is still acted on
afterwards."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.live import FABRIC, H0, H1, TOPIC_MODELS, LiveFleet
from fuzz.strategies import json_values, mutated, mutated_doc
from fuzz.targets import samples
from linkguard import topics
from linkguard.models import FabricFaults, PortState, PortStatus, encode
from linkguard.topology.fabric import home_rails
from linkguard.topology.solver import egress
from tests.fuzz.profiles import FUZZ


@pytest.fixture(scope="module")
def fleet() -> Iterator[LiveFleet]:
    f = LiveFleet()
    yield f
    f.close()


def _valid(topic: str) -> list[bytes]:
    return [encode(m) for m in samples()["messages"].get(TOPIC_MODELS[topic], [])] or [b"{}"]


_junk = st.one_of(
    st.binary(min_size=1, max_size=128),
    json_values().map(lambda v: json.dumps(v).encode()),
)


def test_junk_on_every_topic_is_counted(fleet: LiveFleet) -> None:
    @FUZZ
    @given(st.sampled_from(list(TOPIC_MODELS)), _junk)
    def check(topic: str, payload: bytes) -> None:
        fleet.deliver(topic, payload)  # raises unless handled, running and counted

    before = fleet.drops()
    check()
    after = fleet.drops()
    assert all(after[c] > before[c] for c in after), (before, after)


def test_damaged_valid_messages_keep_everything_running(fleet: LiveFleet) -> None:
    def damaged(topic: str) -> st.SearchStrategy[bytes]:
        docs = [json.loads(p) for p in _valid(topic)]
        return st.one_of(
            st.sampled_from(_valid(topic)).flatmap(mutated),
            st.sampled_from(docs).flatmap(mutated_doc).map(lambda d: json.dumps(d).encode()),
        )

    @FUZZ
    @given(
        st.sampled_from(list(TOPIC_MODELS)).flatmap(lambda t: st.tuples(st.just(t), damaged(t))),
        st.booleans(),
    )
    def check(case: tuple[str, bytes], seal: bool) -> None:
        # sealed: signed by the service's key, as a service that signs a broken plan would
        fleet.deliver(*case, seal=seal)

    check()


def test_regression_a_signature_with_non_ascii_characters(fleet: LiveFleet) -> None:
    """Such an envelope on ``peers/+`` ended every agent's message task (ValueError out of
    ``signing.unwrap``): now each agent counts it as ``bad_envelope`` and carries on."""
    assert fleet.signer is not None
    doc = json.loads(fleet.signer.seal(_valid(topics.peer_routes(H1))[0]))
    doc["sig"] = "é" * 86
    before = {h: a.stats.messages_dropped["bad_envelope"] for h, a in fleet.fleet.agents.items()}
    fleet.deliver(topics.peer_routes(H1), json.dumps(doc).encode())
    after = {h: a.stats.messages_dropped["bad_envelope"] for h, a in fleet.fleet.agents.items()}
    assert after == {h: n + 1 for h, n in before.items()}


@pytest.mark.parametrize(
    "topic",
    [
        "linkguard/v1/hosts/gpu000/ports/mlx5_0/" + "1" * 5000,
        "linkguard/v1/hosts/gpu000/ports/mlx5_0/99999999999",
        "linkguard/v1/hosts/" + "x" * 300 + "/ack",
        "linkguard/v1/peers/" + "é",
    ],
    ids=["port-5000-digits", "port-11-digits", "long-host", "non-ascii-host"],
)
def test_regression_odd_topics(fleet: LiveFleet, topic: str) -> None:
    """The first one ended the service: ValueError from int() of 5,000 digits in
    ``topics.parse``, raised out of its message handler."""
    fleet.deliver(topic, b"{}")
    fleet.check_running()


def test_a_real_down_is_still_acted_on(fleet: LiveFleet) -> None:
    """After all that, the service still takes a genuine state and re-plans around it: gpu000
    reaches gpu001's rail-1 GPU over another rail."""
    service, agent = fleet.fleet.service, fleet.fleet.agents[H0]
    nothing = FabricFaults(at=time.time())  # whatever switch faults the fuzzing left: none
    fleet.deliver(topics.fabric_faults(), encode(nothing))
    fleet.run_until(lambda: service.faults == nothing, "the fault set cleared")
    solves = service.solves
    state = PortState(
        host=H1,
        hca="mlx5_1",
        port=1,
        rail=1,
        status=PortStatus.DOWN,
        usable=False,
        observed_at=time.time(),
        seq=10**9,
    )
    fleet.deliver(topics.port_state(H1, "mlx5_1", 1), encode(state))
    fleet.run_until(
        lambda: service.solves > solves and fleet.fleet.all_acked(), "a solve acked by all"
    )
    inv = FABRIC.host(H1)
    target = inv.endpoints[home_rails(inv).index(1)]
    assert 1 in service.state.unusable()[H1]
    assert 1 not in egress(agent.applier.plan, target)


def test_the_fuzz_fleet_decodes_past_the_production_host_budget(fleet: LiveFleet) -> None:
    """A fuzz find (the `bus` target, CI): the fuzzer sends as a few hosts, far past a host's
    production budget (256 topics, 200 messages/s), so the service dropped messages before
    decoding them (counted in ``budget_dropped``, not ``dropped``) and the decoders went
    unfuzzed. The fuzz fleet's budget is out of the way: junk on 300 new port topics of one
    host is decoded and counted as undecodable, every one; none is dropped by the budget."""
    assert fleet.fleet is not None
    svc = fleet.fleet.service
    budget_before = sum(svc.budget_dropped.values())
    before = sum(svc.dropped.values())
    for i in range(300):
        assert fleet.deliver(topics.port_state(H0, f"fz{i}", 1), b"\xff not json")
    assert sum(svc.dropped.values()) - before == 300
    assert sum(svc.budget_dropped.values()) == budget_before
