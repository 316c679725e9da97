"""The sysfs IB driver on damaged copies of real sysfs trees (files rewritten with junk, binary
bytes or huge values, removed, turned into directories, failing with an errno): it never raises,
every value is typed or None with an error naming the file, and every reading becomes a port
state the service decodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fuzz.strategies import numbers
from fuzz.targets import SYSFS_ACTIONS, SYSFS_ERRNOS, SYSFS_TREES, SysfsTrees, sysfs
from linkguard.drivers.sysfs_ib import (
    parse_counter,
    parse_link_layer,
    parse_phys_state,
    parse_rate,
    parse_state,
)
from linkguard.models import LinkLayer, PhysState, PortStateName
from tests.fuzz.profiles import FUZZ


@pytest.fixture(scope="module")
def trees(real_fixtures: Path) -> Iterator[SysfsTrees]:
    t = SysfsTrees(real_fixtures)
    yield t
    t.close()


_TEXT = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "replace")),
    numbers.map(bytes.decode),
    st.builds(lambda n, s: f"{n}: {s}", numbers.map(bytes.decode), st.text(max_size=12)),
    st.builds(lambda n, s: f"{n} Gb/sec ({s})", numbers.map(bytes.decode), st.text(max_size=8)),
    st.sampled_from(["4: ACTIVE", "5: LinkUp", "N/A (no PMA)", "0 GB/sec", "InfiniBand\n\n"]),
)


@FUZZ
@given(_TEXT)
@example("9" * 400 + " Gb/sec (4X NDR)")
@example("4" * 5000 + ": ACTIVE")
def test_parsers_return_a_value_or_a_problem(text: str) -> None:
    for parser, kind in (
        (parse_state, PortStateName),
        (parse_phys_state, PhysState),
        (parse_link_layer, LinkLayer),
        (parse_rate, float),
        (parse_counter, int),
    ):
        value, problem = parser(text)
        assert value is None or isinstance(value, kind), (parser, value)
        assert problem is None or isinstance(problem, str)
    rate, _ = parse_rate(text)
    assert rate is None or 0 <= rate < float("inf")
    count, _ = parse_counter(text)
    assert count is None or 0 <= count <= 2**64 - 1


def test_regression_a_rate_too_big_for_a_float_is_unparsable() -> None:
    """Was inf Gb/s (float('9' * 400)): a reading no port has, passed on as a number."""
    assert parse_rate("9" * 400 + " Gb/sec (4X NDR)") == (
        None,
        "unparsable '9999999999999999999999999999999999999999...'",
    )


_CONTENT = st.one_of(
    st.binary(max_size=64),
    numbers,
    numbers.map(lambda n: n + b" Gb/sec (4X NDR)\n"),
    numbers.map(lambda n: n + b": ACTIVE\n"),
    st.sampled_from([b"", b"\n", b"N/A (no PMA)\n", b"\xff\xfe\x00", b"1" * 5000]),
)


@st.composite
def _mutations(draw: st.DrawFn, trees: SysfsTrees) -> tuple[str, list]:
    tree = draw(st.sampled_from(list(SYSFS_TREES)))
    out = []
    for _ in range(draw(st.integers(1, 4))):
        rel = draw(st.sampled_from(trees.paths[tree]))
        action = draw(st.sampled_from(SYSFS_ACTIONS))
        arg = (
            draw(_CONTENT)
            if action == "write"
            else draw(st.sampled_from(SYSFS_ERRNOS))
            if action == "errno"
            else b""
        )
        out.append((rel, action, arg))
    return tree, out


def test_damaged_trees_never_stop_the_driver(trees: SysfsTrees) -> None:
    @FUZZ
    @given(_mutations(trees))
    def check(case: tuple[str, list]) -> None:
        tree, mutations = case
        observations = trees.run(tree, mutations)  # checks types, states decode at the service
        by_key = {(o.hca, o.port): o for o in observations}
        last = {rel: (action, arg) for rel, action, arg in mutations}  # what a path ends as
        for rel, (action, arg) in last.items():
            parts = rel.split("/")
            if len(parts) != 4 or parts[1] != "ports" or parts[3] != "state":
                continue
            o = by_key.get((parts[0], int(parts[2])))
            if o is None:
                continue
            if action == "write":  # junk: what parse_state refuses in the page the driver reads
                unreadable = parse_state(arg[:4096].decode("utf-8", "replace"))[0] is None
            else:  # removed, a directory, or the read fails
                unreadable = True
            if unreadable:
                # an unreadable state is unknown, never DOWN (no reroute), and says which file
                assert o.state is None
                assert any(e.startswith(rel) or "port directory gone" in e for e in o.errors)

    check()


def test_every_tree_reads_clean_when_untouched(trees: SysfsTrees) -> None:
    for tree in SYSFS_TREES:
        observations = trees.run(tree, [])
        assert observations == []  # no mutation: no device read (see SysfsTrees.run)
        obs = trees.run(tree, [(trees.paths[tree][0] + "/nonexistent-file", "remove", b"")])
        assert obs and all(o.state is not None for o in obs)


@FUZZ
@given(st.binary(max_size=256))
def test_sysfs_target_on_random_bytes(data: bytes) -> None:
    sysfs(data)


def test_trees_are_restored(trees: SysfsTrees) -> None:
    tree = "procfs"
    before = {
        p: (trees.base / tree / p).read_bytes()
        for p in trees.paths[tree]
        if (trees.base / tree / p).is_file()
    }
    trees.run(tree, [("mlx4_0/ports", "remove", b""), ("hfi1_0/ports/1/state", "dir", b"")])
    after = {p: Path(trees.base / tree / p).read_bytes() for p in before}
    assert after == before
