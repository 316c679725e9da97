"""Signed plan envelopes (``linkguard.signing.unwrap``, as the agent opens ``plans/`` and
``peers/`` messages) on damaged sealed messages and random JSON: SignatureError, or a body that
decodes as the decoders' property says; a damaged body never verifies."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fuzz.strategies import json_values, mutated, mutated_doc
from fuzz.targets import envelopes, fuzz_signer, samples, seeds
from linkguard.models import encode
from linkguard.signing import SignatureError, unwrap
from tests.fuzz.profiles import FUZZ

#: every sample plan and peer routes, sealed with the fuzz key
SEALED = [
    fuzz_signer().seal(encode(m)) for k in ("plan", "peers") for m in samples()["messages"][k]
]


@FUZZ
@given(st.sampled_from(seeds("envelopes")).flatmap(mutated))
def test_mutated_envelopes(data: bytes) -> None:
    envelopes(data)


@FUZZ
@given(
    st.sampled_from([json.loads(s) for s in SEALED]).flatmap(
        lambda d: mutated_doc(d, st.one_of(json_values(max_leaves=3), st.text(max_size=100)))
    ),
    st.integers(0, 5),
)
def test_envelopes_with_one_field_changed(doc: object, mode: int) -> None:
    envelopes(bytes([mode]) + json.dumps(doc, ensure_ascii=False).encode())


@FUZZ
@given(st.sampled_from(SEALED), st.data())
def test_a_changed_body_never_verifies(sealed: bytes, data: st.DataObject) -> None:
    doc = json.loads(sealed)
    body = data.draw(mutated(doc["body"].encode()).map(lambda b: b.decode("utf-8", "replace")))
    assume(body != doc["body"])
    doc["body"] = body
    with pytest.raises(SignatureError, match="bad_signature"):
        unwrap(json.dumps(doc).encode(), fuzz_signer().verifier, require=True)


def test_regression_a_signature_with_non_ascii_characters_is_a_bad_envelope() -> None:
    """Was ValueError out of base64.b64decode, past the agent's SignatureError handler: the
    agent's message task ended (a crash from one message on ``peers/+``)."""
    doc = json.loads(SEALED[0])
    doc["sig"] = "é" * 86
    with pytest.raises(SignatureError, match="bad_envelope"):
        unwrap(json.dumps(doc).encode(), fuzz_signer().verifier, require=True)
