"""Every bus message decoder on random bytes, random JSON and mutated valid messages: only
BadMessage (with a documented reason) escapes, and what decodes re-encodes to itself."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz.strategies import json_values, mutated, mutated_doc
from fuzz.targets import check_decode, decoder_models, decoders, samples
from linkguard import topics
from linkguard.models import BadMessage, PortState, decode, encode
from tests.fuzz.profiles import FUZZ

KINDS = list(decoder_models())


def _valid(kind: str) -> list:
    return samples()["messages"][kind]


def _payloads(kind: str) -> st.SearchStrategy[bytes]:
    docs = [json.loads(encode(m)) for m in _valid(kind)]
    return st.one_of(
        st.binary(max_size=256),
        json_values().map(lambda v: json.dumps(v).encode()),
        st.sampled_from(docs).flatmap(mutated_doc).map(lambda d: json.dumps(d).encode()),
        st.sampled_from([encode(m) for m in _valid(kind)]).flatmap(mutated),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_decoder_refuses_with_bad_message_only(kind: str) -> None:
    model = decoder_models()[kind]
    host = "gpu000" if "host" in model.model_fields else None

    @FUZZ
    @given(_payloads(kind))
    def check(payload: bytes) -> None:
        check_decode(model, payload)
        check_decode(model, payload, expect_host=host)

    check()


def test_valid_messages_decode() -> None:
    for kind in KINDS:
        for msg in _valid(kind):
            assert check_decode(decoder_models()[kind], encode(msg)) == msg


@FUZZ
@given(st.binary(max_size=512))
def test_decoders_target_on_random_bytes(data: bytes) -> None:
    decoders(data)


_SEGMENTS = st.one_of(
    st.sampled_from(["hosts", "ports", "plans", "peers", "gpu000", "mlx5_0", "1", "status", ""]),
    st.text(max_size=12),
    st.integers(0, 2**40).map(str),
    st.just("1" * 5000),
)


@FUZZ
@given(st.lists(_SEGMENTS, max_size=7).map(lambda p: "/".join(["linkguard", "v1", *p])))
@example("linkguard/v1/hosts/gpu000/ports/mlx5_0/" + "1" * 5000)
def test_topic_parse_never_raises(topic: str) -> None:
    parsed = topics.parse(topic)
    assert parsed is None or isinstance(parsed, topics.ParsedTopic)


def test_regression_port_topic_with_a_huge_number_is_not_a_port_topic() -> None:
    """Was ValueError (int() of more than 4,300 digits) out of the service's handler, which
    ended the service: any client could publish the topic."""
    assert topics.parse("linkguard/v1/hosts/gpu000/ports/mlx5_0/" + "1" * 5000) is None
    assert topics.parse("linkguard/v1/hosts/gpu000/ports/mlx5_0/1").port == 1


@pytest.mark.parametrize(
    "payload",
    [
        b'{"host": "gpu000", "hca": "mlx5_0", "port": ' + b"1" * 5000 + b', "observed_at": 1}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"host": "gpu000", "hca": "mlx5_0", "port": 1, "observed_at": 1e999}',
        "\ud800".encode("utf-8", "surrogatepass"),
    ],
    ids=["huge-int", "deep-nesting", "float-overflow", "lone-surrogate"],
)
def test_edge_payloads_are_bad_messages(payload: bytes) -> None:
    with pytest.raises(BadMessage):
        decode(PortState, payload)
