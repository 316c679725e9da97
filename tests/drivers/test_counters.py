"""CounterBaseline: deltas between readings, with resets, saturation and unknowns."""

from __future__ import annotations

from linkguard.drivers.counters import CounterBaseline

NONE: frozenset[str] = frozenset()


def test_first_reading_has_no_delta_then_differences() -> None:
    b = CounterBaseline()
    assert b.update("mlx5_0/1", {"symbol_error": 3, "port_rcv_data": 1000}, NONE) == {
        "symbol_error": None,
        "port_rcv_data": None,
    }
    assert b.update("mlx5_0/1", {"symbol_error": 5, "port_rcv_data": 1000}, NONE) == {
        "symbol_error": 2,
        "port_rcv_data": 0,  # 4-octet words, unchanged unit
    }


def test_counter_going_down_is_a_reset_to_zero_then_counted_up() -> None:
    b = CounterBaseline()
    b.update("k", {"port_rcv_errors": 14}, NONE)
    assert b.update("k", {"port_rcv_errors": 4}, NONE) == {"port_rcv_errors": 4}
    assert b.update("k", {"port_rcv_errors": 9}, NONE) == {"port_rcv_errors": 5}  # new baseline


def test_saturated_counter_is_unknown_not_wrapped() -> None:
    b = CounterBaseline()
    b.update("k", {"link_downed": 250}, NONE)
    sat = frozenset({"link_downed"})
    assert b.update("k", {"link_downed": 255}, sat) == {"link_downed": None}
    assert b.update("k", {"link_downed": 255}, sat) == {"link_downed": None}
    # cleared (perfquery -x): 255 -> 2 is a reset, 2 events since
    assert b.update("k", {"link_downed": 2}, NONE) == {"link_downed": 2}


def test_unreadable_counter_stays_none_and_drops_its_baseline() -> None:
    b = CounterBaseline()
    b.update("k", {"symbol_error": 1}, NONE)
    assert b.update("k", {"symbol_error": None}, NONE) == {"symbol_error": None}
    assert b.update("k", {"symbol_error": 7}, NONE) == {"symbol_error": None}  # new baseline
    assert b.update("k", {"symbol_error": 8}, NONE) == {"symbol_error": 1}


def test_keys_are_independent_and_forgettable() -> None:
    b = CounterBaseline()
    b.update("a/1", {"x": 1}, NONE)
    b.update("b/1", {"x": 100}, NONE)
    assert b.update("a/1", {"x": 2}, NONE) == {"x": 1}
    assert "b/1" in b
    b.forget("b/1")
    assert "b/1" not in b
    assert b.update("b/1", {"x": 101}, NONE) == {"x": None}
