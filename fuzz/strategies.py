"""hypothesis strategies for fuzzing: mutations of real inputs, random JSON, random YAML.

Consumes: seed inputs (bytes, or parsed JSON/YAML documents). Produces: strategies of bytes
or documents, for the property tests in ``tests/fuzz/`` and :mod:`fuzz.run`'s hypothesis
engine (:func:`inputs`).

Byte mutations are what a damaged file or a hostile sender gives: a flipped byte, a line
dropped, duplicated or swapped, the text cut short, bytes inserted, a number replaced by a
huge, negative or fractional one. Document mutations (:func:`mutated_doc`) replace one value
anywhere in a document by another JSON value, delete a key or add one.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "inputs",
    "json_values",
    "mutated",
    "mutated_doc",
    "numbers",
    "yaml_scalars",
]

_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?")

#: numbers at the edges: zero, negative, fractional, past 32/64 bits, past float and past
#: Python's int-from-text limit (4,300 digits)
numbers: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from(
        [
            b"0",
            b"-1",
            b"0.5",
            b"4294967295",
            b"4294967296",
            b"18446744073709551615",
            b"18446744073709551616",
            b"9223372036854775808",
            b"1e309",
            b"-0",
            b"NaN",
            b"Infinity",
            b"9" * 400,
            b"1" * 5000,
        ]
    ),
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
    st.floats(allow_nan=False).map(lambda f: repr(f).encode()),
)


@st.composite
def _mutate_once(draw: st.DrawFn, data: bytes) -> bytes:
    op = draw(
        st.sampled_from(
            ["flip", "truncate", "insert", "delete", "drop_line", "dup_line", "swap_lines", "num"]
        )
    )
    n = len(data)
    if op in ("flip", "insert", "delete", "truncate") and n == 0:
        return draw(st.binary(min_size=1, max_size=16))
    if op == "flip":
        i = draw(st.integers(0, n - 1))
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    if op == "truncate":
        return data[: draw(st.integers(0, n - 1))]
    if op == "insert":
        i = draw(st.integers(0, n))
        return data[:i] + draw(st.binary(min_size=1, max_size=32)) + data[i:]
    if op == "delete":
        i = draw(st.integers(0, n - 1))
        return data[:i] + data[i + draw(st.integers(1, 64)) :]
    lines = data.splitlines(keepends=True)
    if op in ("drop_line", "dup_line", "swap_lines") and lines:
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop_line":
            del lines[i]
        elif op == "dup_line":
            lines.insert(i, lines[i])
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        return b"".join(lines)
    spans = [m.span() for m in _NUMBER.finditer(data)]
    if not spans:
        return data + draw(numbers)
    a, b = draw(st.sampled_from(spans))
    return data[:a] + draw(numbers) + data[b:]


def mutated(seed: bytes, *, max_ops: int = 4) -> st.SearchStrategy[bytes]:
    """``seed`` with 1 to ``max_ops`` byte or line mutations applied one after the other."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = seed
        for _ in range(draw(st.integers(1, max_ops))):
            data = draw(_mutate_once(data))
        return data

    return build()


def json_values(*, max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Any JSON value: null, booleans, numbers at the edges, strings, lists, objects."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**65), 2**65),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
        st.sampled_from(["", "gpu000", "mlx5_0", "10.200.0.1", "up", "ACTIVE", "-1"]),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    out = list(doc)
    out[head] = _replace(doc[head], rest, value)
    return out


def _delete(doc: Any, path: tuple) -> Any:
    if len(path) == 1:
        if isinstance(doc, dict):
            return {k: v for k, v in doc.items() if k != path[0]}
        return doc[: path[0]] + doc[path[0] + 1 :]
    head = path[0]
    if isinstance(doc, dict):
        return {**doc, head: _delete(doc[head], path[1:])}
    out = list(doc)
    out[head] = _delete(doc[head], path[1:])
    return out


def mutated_doc(doc: Any, values: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    """``doc`` (parsed JSON or YAML) with one value replaced by one of ``values`` (default
    :func:`json_values`), one key or item deleted, or one key added."""
    values = values if values is not None else json_values(max_leaves=4)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "delete" and path:
            return _delete(doc, path)
        if op == "add":
            dicts = [p for p in paths if isinstance(_get(doc, p), dict)]
            if dicts:
                where = draw(st.sampled_from(dicts))
                key = draw(st.text(max_size=12))
                return _replace(doc, where, {**_get(doc, where), key: draw(values)})
        return _replace(doc, path, draw(values))

    return build()


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


#: YAML scalars worth meeting in a config or scenario file
yaml_scalars: st.SearchStrategy[Any] = st.one_of(
    json_values(max_leaves=3),
    st.sampled_from(
        [".inf", "-.inf", ".nan", "~", "yes", "no", "on", "0x1F", "0o17", "1_000", "2001-12-14"]
    ),
    st.dates(),
    st.binary(max_size=8),
)


def inputs(name: str) -> st.SearchStrategy[bytes]:
    """Inputs for target ``name`` of :data:`fuzz.targets.TARGETS`: random bytes, or one of its
    seeds mutated (seeds built on first use)."""
    from fuzz.targets import seeds

    return st.one_of(
        st.binary(max_size=512),
        st.deferred(lambda: st.sampled_from(seeds(name))).flatmap(mutated),
    )
