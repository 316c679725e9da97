"""Probe packet bytes: round trip in both modes, the RoCEv2 BTH fields, and hostile bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import BTH

from linkguard.agent.probe import (
    KIND_PROBE,
    KIND_REPLY,
    PROBE_QPN,
    Probe,
    ProbeError,
    ProbeSender,
    build_probe,
    parse_probe,
)

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(
    kind=st.sampled_from([KIND_PROBE, KIND_REPLY]),
    pid=U64,
    seq=U64,
    ts=U64,
    tr=U64,
    mode=st.sampled_from(["udp", "roce"]),
)
@settings(max_examples=200, deadline=None)
def test_round_trip(kind: int, pid: int, seq: int, ts: int, tr: int, mode: str) -> None:
    p = Probe(kind, pid, seq, ts, tr)
    data = build_probe(p, mode)  # type: ignore[arg-type]
    assert len(data) == (40 if mode == "udp" else 56)
    assert parse_probe(data, mode) == p  # type: ignore[arg-type]


def test_roce_probe_is_a_ud_send_only_to_the_multicast_qpn() -> None:
    data = build_probe(Probe(KIND_PROBE, 1, 2**24 + 5, 99), "roce")
    bth = BTH(data)
    assert bth.opcode == 0x64  # UD_SEND_ONLY in scapy.contrib.roce
    assert bth.get_field("opcode").i2s[bth.opcode] == "UD_SEND_ONLY"
    assert bth.dqpn == PROBE_QPN == 0xFFFFFF
    assert bth.pkey == 0xFFFF
    assert bth.psn == 5  # sequence mod 2^24
    assert data[:4] == bytes.fromhex("6400ffff") and data[-4:] == b"\0\0\0\0"  # zero ICRC
    assert data[12:16] == b"LGPR"


@pytest.mark.parametrize(
    ("data", "mode", "reason"),
    [
        (b"", "udp", "short"),
        (b"LGPR", "udp", "short"),
        (build_probe(Probe(1, 1, 1, 1)) + b"x", "udp", "size"),
        (b"XXXX" + build_probe(Probe(1, 1, 1, 1))[4:], "udp", "magic"),
        (
            build_probe(Probe(1, 1, 1, 1))[:4] + b"\x02" + build_probe(Probe(1, 1, 1, 1))[5:],
            "udp",
            "version",
        ),
        (
            build_probe(Probe(1, 1, 1, 1))[:5] + b"\x07" + build_probe(Probe(1, 1, 1, 1))[6:],
            "udp",
            "kind",
        ),
        (build_probe(Probe(1, 1, 1, 1), "roce")[12:52] + b"\0" * 16, "roce", "bth"),
        (b"\0" * 12 + build_probe(Probe(1, 1, 1, 1)) + b"\0" * 4, "roce", "bth"),
        # a udp-mode header (length 40) inside a valid BTH: the length field disagrees
        (
            build_probe(Probe(1, 1, 1, 1), "roce")[:12]
            + build_probe(Probe(1, 1, 1, 1))
            + b"\0" * 4,
            "roce",
            "length",
        ),
    ],
)
def test_bad_datagrams_are_refused_with_a_reason(data: bytes, mode: str, reason: str) -> None:
    with pytest.raises(ProbeError) as e:
        parse_probe(data, mode)  # type: ignore[arg-type]
    assert e.value.reason == reason


@given(data=st.binary(max_size=200), mode=st.sampled_from(["udp", "roce"]))
@settings(max_examples=500, deadline=None)
def test_hostile_bytes_never_crash(data: bytes, mode: str) -> None:
    try:
        p = parse_probe(data, mode)  # type: ignore[arg-type]
    except ProbeError as e:
        assert e.reason in {"short", "size", "bth", "magic", "version", "kind", "length"}
    else:  # only a well-formed probe parses, and it rebuilds to the same bytes
        assert build_probe(p, mode) == data  # type: ignore[arg-type]


@given(
    prefix=st.sampled_from([b"LGPR\x01\x01\x00\x28", b"LGPR\x01\x02\x00\x28"]),
    rest=st.binary(min_size=32, max_size=32),
)
@settings(max_examples=200, deadline=None)
def test_near_valid_bytes_parse_or_refuse(prefix: bytes, rest: bytes) -> None:
    p = parse_probe(prefix + rest)  # magic, version, kind and length right: any body is a probe
    assert build_probe(p) == prefix + rest


def test_build_refuses_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="seq -1 is not a u64"):
        build_probe(Probe(1, 0, -1, 0))
    with pytest.raises(ValueError, match="kind 3"):
        build_probe(Probe(3, 0, 0, 0))


def test_sender_rate_is_bounded() -> None:
    with pytest.raises(ValueError, match=r"4 probes/s x 5 peers > 16/s"):
        ProbeSender(address="127.0.0.1", peers=[f"127.0.0.{i}" for i in range(2, 7)], rate_pps=4)
