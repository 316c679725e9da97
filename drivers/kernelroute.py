"""A route of linkguard's own routing table as :class:`~linkguard.drivers.routes.RouteTable`
writes it (:class:`KernelRoute`), the check that a desired set is one linkguard may write
(:func:`check_routes`), and what a reconcile did (:class:`ReconcileResult`). Pure: no netlink;
:mod:`linkguard.drivers.routes` re-exports these names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

#: The kinds linkguard writes.
KINDS = ("unicast", "unreachable")
#: A route's destination: an address for a /32, a network for any other prefix length.
Destination = IPv4Address | IPv4Network


@dataclass(frozen=True)
class KernelRoute:
    """One route of linkguard's table, in one of the shapes :meth:`RouteTable.reconcile` writes:

    - via ``gateway`` out of ``netdev`` (a /32 exception): ``ip route replace D via G dev N``;
    - on-link out of ``netdev`` (``gateway`` None): ``ip route replace D dev N``;
    - on-link multipath: ``nexthops`` two or more netdevs, equal weights, no gateway or
      ``netdev``: ``ip route replace D nexthop dev A nexthop dev B``;
    - ``kind="unreachable"``, nothing else set: ``ip route replace unreachable D``.

    A unicast route may add ``src`` (``... src S``: the preferred source address) and
    ``rto_min_ms`` (``... rto_min <n>ms``, locked).

    Normalised on construction so that equal routes compare equal whatever the spelling:
    ``destination`` is an IPv4Address for a /32 (an IPv4Network /32 becomes its address) and an
    IPv4Network otherwise; ``nexthops`` is sorted without duplicates (the nexthop *set* is what
    counts), and a single one without gateway or netdev becomes ``netdev``.

    In :meth:`RouteTable.dump` a route of another shape has ``kind`` set to the kernel's type
    name (``blackhole``, ...) and ``gateway``/``netdev`` None where they do not apply.
    """

    destination: Destination
    gateway: IPv4Address | None = None
    netdev: str | None = None
    nexthops: tuple[str, ...] = ()
    kind: str = "unicast"
    src: IPv4Address | None = None
    rto_min_ms: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.destination, IPv4Network) and self.destination.prefixlen == 32:
            object.__setattr__(self, "destination", self.destination.network_address)
        hops = tuple(sorted(set(self.nexthops)))
        if len(hops) == 1 and self.netdev is None and self.gateway is None:
            object.__setattr__(self, "netdev", hops[0])
            hops = ()
        object.__setattr__(self, "nexthops", hops)

    @property
    def network(self) -> IPv4Network:
        """The destination as a network (a /32 for an address)."""
        return IPv4Network(self.destination)

    @property
    def netdevs(self) -> tuple[str, ...]:
        """Every netdev the route names (``netdev`` or ``nexthops``)."""
        return (self.netdev,) if self.netdev is not None else self.nexthops


def check_routes(desired: Sequence[KernelRoute], prefixes: Sequence[IPv4Network] = ()) -> None:
    """Raise ValueError unless ``desired`` is a set of routes linkguard may write: every
    destination once, inside one of ``prefixes`` (when given), of kind unicast or unreachable,
    and in one of the :class:`KernelRoute` shapes (a unicast route with a gateway or at least
    one netdev, never both ``netdev`` and ``nexthops``; an unreachable one with neither, and
    without ``src`` or ``rto_min_ms``); ``rto_min_ms`` 1..120000 (TCP_RTO_MAX is 120 s)."""
    seen: set[Destination] = set()
    for r in desired:
        if not isinstance(r.destination, IPv4Address | IPv4Network):
            raise ValueError(f"destination {r.destination!r} is not an IPv4 address or network")
        if r.destination in seen:
            raise ValueError(f"destination {r.destination} desired twice")
        seen.add(r.destination)
        if prefixes and not any(r.network.subnet_of(p) for p in prefixes):
            raise ValueError(
                f"destination {r.destination} is outside the managed prefixes "
                f"{', '.join(map(str, prefixes))}"
            )
        if r.kind not in KINDS:
            raise ValueError(f"route to {r.destination}: kind {r.kind!r} is not one of {KINDS}")
        if r.rto_min_ms is not None and not 1 <= r.rto_min_ms <= 120_000:
            raise ValueError(f"route to {r.destination}: rto_min {r.rto_min_ms} ms not 1..120000")
        if r.kind == "unreachable":
            if r.gateway is not None or r.netdevs:
                raise ValueError(f"unreachable route to {r.destination} names a next hop")
            if r.src is not None or r.rto_min_ms is not None:
                raise ValueError(f"unreachable route to {r.destination} has a src or rto_min")
        elif r.nexthops:
            if r.gateway is not None or r.netdev is not None:
                raise ValueError(f"route to {r.destination} has nexthops and a gateway or netdev")
        elif r.gateway is None and r.netdev is None:
            raise ValueError(f"route to {r.destination} has neither gateway nor netdev")


@dataclass
class ReconcileResult:
    """What :meth:`RouteTable.reconcile` did. ``errors``: (destination, kernel message) for
    routes the kernel refused or that name a missing netdev; ``elapsed_ms`` wall time (ms)."""

    added: int = 0
    replaced: int = 0
    deleted: int = 0
    unchanged: int = 0
    errors: list[tuple[Destination, str]] = field(default_factory=list)
    elapsed_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> int:
        return self.added + self.replaced + self.deleted
