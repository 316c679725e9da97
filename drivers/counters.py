"""Counter deltas between readings, aware of resets and saturation.

Consumes: successive ``(counters, saturated)`` readings of a port (from
:class:`~linkguard.drivers.base.PortObservation`). Produces: per-counter deltas since the previous
reading, in the counter's own unit (``port_xmit_data``/``port_rcv_data`` stay in 4-octet words,
as sysfs shows them). Pure: no clock, no I/O.

Rules (a delta of ``None`` means "unknown", never 0):

- first reading of a counter (or first after it was unreadable): ``None``, it becomes the baseline;
- unreadable now (``None``): ``None``, and the baseline is dropped (a gap spans an unknown time);
- saturated now (stuck at the maximum of its IBA width, IBA vol. 1 16.1.3.5 PortCounters):
  ``None``; it is not treated as a wrap. The stuck value stays the baseline, so a later clear
  (e.g. ``perfquery -x``) shows up as a reset;
- lower than before: a reset (counters cleared, driver reloaded). The counter is taken to have
  restarted at 0 and counted up since, so the delta is the new value, which is the new baseline
  (with ``reset_unknown=True``: ``None``, for consumers that must never act on a reset, such as
  :mod:`linkguard.agent.health`);
- otherwise ``new - old``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CounterBaseline"]


class CounterBaseline:
    """Per-key (``"hca/port"``) baselines of counter values."""

    def __init__(self) -> None:
        self._base: dict[str, dict[str, int]] = {}

    def update(
        self,
        key: str,
        counters: Mapping[str, int | None],
        saturated: frozenset[str],
        *,
        reset_unknown: bool = False,
    ) -> dict[str, int | None]:
        """Deltas of ``counters`` since the previous ``update`` for ``key``; same keys as
        ``counters``. Counters absent from this reading are forgotten. ``reset_unknown``: a
        counter lower than before gives ``None`` instead of its new value. Never raises."""
        previous = self._base.get(key, {})
        base: dict[str, int] = {}
        deltas: dict[str, int | None] = {}
        for name, value in counters.items():
            if value is None:
                deltas[name] = None
                continue
            base[name] = value
            old = previous.get(name)
            if name in saturated or old is None:
                deltas[name] = None
            elif value < old:
                # reset: restarted at 0, counted up to value (or unknown, when asked)
                deltas[name] = None if reset_unknown else value
            else:
                deltas[name] = value - old
        self._base[key] = base
        return deltas

    def forget(self, key: str) -> None:
        """Drop the baselines of ``key`` (port removed)."""
        self._base.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._base
