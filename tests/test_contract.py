"""The bus contract: topics and decoding of good and bad payloads."""

from __future__ import annotations

import json

import pytest

from linkguard import topics
from linkguard.models import (
    Ack,
    BadMessage,
    HCAInfo,
    HostInventory,
    Plan,
    PortState,
    PortStatus,
    RouteAssignment,
    decode,
    encode,
)


def _state(**kw) -> PortState:
    base = dict(
        host="gpu001", hca="mlx5_0", port=1, status=PortStatus.UP, usable=True, observed_at=1.0
    )
    base.update(kw)
    return PortState(**base)


def test_topics_round_trip() -> None:
    t = topics.port_state("gpu001", "mlx5_3", 1)
    assert t == "linkguard/v1/hosts/gpu001/ports/mlx5_3/1"
    p = topics.parse(t)
    assert (p.kind, p.host, p.hca, p.port) == ("port", "gpu001", "mlx5_3", 1)
    assert topics.parse(topics.plan("gpu002")).kind == "plan"
    assert topics.parse(topics.ack("gpu002")).host == "gpu002"
    assert topics.parse("linkguard/v2/plans/x") is None
    assert topics.parse("linkguard/v1/hosts/gpu001/ports/mlx5_0/one") is None


@pytest.mark.parametrize("bad", ["a/b", "+", "#", "", "a b"])
def test_topic_segments_refuse_wildcards(bad: str) -> None:
    with pytest.raises(ValueError, match="topic segment"):
        topics.plan(bad)


def test_decode_round_trip() -> None:
    st = _state(rate_gbps=400.0, counters={"link_downed": 255}, counters_saturated=["link_downed"])
    assert decode(PortState, encode(st)) == st


def test_decode_not_json() -> None:
    with pytest.raises(BadMessage) as e:
        decode(PortState, b"{not json")
    assert e.value.reason == "not_json"


def test_decode_invalid_field_named() -> None:
    payload = json.loads(encode(_state()))
    payload["port"] = 0  # ports are 1-based in sysfs
    with pytest.raises(BadMessage) as e:
        decode(PortState, json.dumps(payload))
    assert e.value.reason == "invalid"
    assert "port" in e.value.detail


def test_decode_unknown_field_refused() -> None:
    payload = json.loads(encode(_state()))
    payload["exec"] = "rm -rf /"
    with pytest.raises(BadMessage, match="exec"):
        decode(PortState, json.dumps(payload))


def test_decode_oversized_refused_before_parsing() -> None:
    with pytest.raises(BadMessage) as e:
        decode(PortState, b" " * 2048, max_bytes=1024)
    assert e.value.reason == "oversized"


def test_decode_wrong_host() -> None:
    with pytest.raises(BadMessage) as e:
        decode(PortState, encode(_state()), expect_host="gpu002")
    assert e.value.reason == "wrong_host"
    # neutral wording: the payload may come from a file (the agent's last plan), not a topic
    assert str(e.value) == "wrong_host: payload host 'gpu001', expected 'gpu002'"
    topic = topics.port_state("gpu002", "mlx5_0", 1)
    with pytest.raises(BadMessage) as e:
        decode(PortState, encode(_state()), topic=topic, expect_host="gpu002")
    assert e.value.topic == topic
    assert str(e.value) == f"wrong_host: payload host 'gpu001', expected 'gpu002' (topic {topic})"


def test_plan_refuses_duplicate_destination() -> None:
    r = RouteAssignment(
        destination="10.200.1.1",
        peer="b",
        peer_gpu=0,
        rail=0,
        home_rail=0,
        netdev="rail0",
        gateway="10.100.0.2",
    )
    with pytest.raises(ValueError, match="twice"):
        Plan(host="a", epoch=1, issued_at=0, routes=[r, r])


def test_prefix_routes_decode_and_refuse_bad_shapes() -> None:
    doc = {
        "host": "a",
        "epoch": 2,
        "issued_at": 0,
        "prefix_routes": [
            {"prefix": "10.200.0.0/24", "home_rail": 0, "rails": [0], "netdevs": ["rail0"]},
            {"prefix": "10.200.1.0/24", "home_rail": 1, "rails": [0, 2], "netdevs": ["r0", "r2"]},
            {"prefix": "10.200.2.0/24", "home_rail": 2, "rails": [], "netdevs": []},
        ],
    }
    plan = decode(Plan, json.dumps(doc))
    assert [p.rails for p in plan.prefix_routes] == [[0], [0, 2], []]
    assert decode(Plan, encode(plan)) == plan
    bad = [
        ({**doc, "prefix_routes": doc["prefix_routes"][:1] * 2}, "routed twice"),
        (
            {**doc, "prefix_routes": [{**doc["prefix_routes"][1], "netdevs": ["r0"]}]},
            "2 rails but 1 netdevs",
        ),
        (
            {**doc, "prefix_routes": [{**doc["prefix_routes"][0], "prefix": "10.200.0.1/24"}]},
            "not a valid IPv4 network",
        ),
        (
            {
                **doc,
                "backups": [
                    {
                        "hca": "m",
                        "port": 1,
                        "rail": 0,
                        "prefix_routes": doc["prefix_routes"][:1] * 2,
                    }
                ],
            },
            "routed twice",
        ),
    ]
    for payload, message in bad:
        with pytest.raises(BadMessage, match=message) as exc:
            decode(Plan, json.dumps(payload))
        assert exc.value.reason == "invalid"


def test_inventory_refuses_two_hcas_on_one_rail() -> None:
    with pytest.raises(ValueError, match="same rail"):
        HostInventory(host="a", hcas=[HCAInfo(hca="mlx5_0", rail=0), HCAInfo(hca="mlx5_1", rail=0)])


def test_ack_epoch_bounds() -> None:
    with pytest.raises(BadMessage):
        decode(Ack, json.dumps({"host": "a", "epoch": -1, "result": "applied", "applied_at": 0}))
