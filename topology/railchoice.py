"""The egress rail of one /32 whose home rail cannot be used: the solver's rail choice rule
(:mod:`linkguard.topology.solver`'s module docstring: the survivors both ends can use, nearest
the failed HCA first, taken round-robin by the circular offset between the two hosts).

Consumes: the two hosts (:class:`~linkguard.topology.hostbase.IndexedHost`), their usable
rails, the peer GPU and the offset. Produces: a rail, or None (no survivor). Pure; keeps a
cache of survivor orders per (rails both can use, failed rail, host layout).
"""

from __future__ import annotations

from linkguard.topology.hostbase import IndexedHost

__all__ = ["RailChoice"]


class RailChoice:
    """The rail choice rule with its cache of survivor orders."""

    def __init__(self) -> None:
        self._survivors: dict[tuple, tuple[int, ...]] = {}

    def order_survivors(self, failed: IndexedHost, both: frozenset[int], r: int) -> tuple[int, ...]:
        """Survivors on the failed HCA's PCIe switch first, then on its NUMA node, then the
        rest, each by rail."""
        key = (both, r, failed.sig)
        s = self._survivors.get(key)
        if s is not None:
            return s
        hca = failed.by_rail.get(r)
        numa = hca.numa_node if hca is not None else None
        switch = hca.pcie_switch if hca is not None else None

        def order(c: int) -> tuple[bool, bool, int]:
            other = failed.by_rail.get(c)
            near = switch is not None and other is not None and other.pcie_switch == switch
            same = numa is not None and other is not None and other.numa_node == numa
            return (not near, not same, c)

        s = tuple(sorted(both, key=order))
        self._survivors[key] = s
        return s

    def choose(
        self, h: IndexedHost, uh: frozenset[int], p: IndexedHost, up: frozenset[int], g: int, o: int
    ) -> int | None:
        """Egress rail for H -> endpoint g of P (see module docstring), None if none; ``o`` =
        (pos(H) - pos(P) - 1) mod N, or any number congruent to it modulo the survivor counts."""
        r = p.home[g]
        if r in uh and r in up and r in h.by_rail:
            return r
        if r not in up and r in p.by_rail and not (r not in uh and r in h.by_rail):
            failed, offset = p, o
        else:  # H lost r (or lacks it: irregular fabric); -o - 2 = pos(P) - pos(H) - 1 - N
            failed, offset = h, -o - 2
        s = self.order_survivors(failed, uh & up, r)
        if not s:
            return None
        j, k = p.rank[g]
        return s[(offset * k + j) % len(s)]
