"""linkguard's own routing table: routes to peer endpoints plus the ``ip rule``s that use it.

Consumes: the desired routes of a plan (:class:`KernelRoute`): /32 exceptions via a gateway,
on-link prefix routes out of one netdev or several (multipath), ``unreachable`` routes.
Produces: kernel state in ONE routing table (and the rules pointing at it) of one network
namespace, through rtnetlink (pyroute2); never touches another table or any other rule.

Gateway routes need no ``onlink`` here. When a route is added to a table other than main, the
kernel validates its gateway first in that table and, failing that, with a full FIB lookup
through the rules (net/ipv4/fib_semantics.c, ``fib_check_nh_v4_gw``), which finds the rail's
connected /24 in main. The lookup ignores link state, so a route can be installed over a rail
whose carrier is down. A gateway that no connected route covers, or that is only reachable
through another netdev than the route's, is refused with ENETUNREACH: such a route lands in
:attr:`ReconcileResult.errors` and the other routes are still applied.

Every unicast route may carry a preferred source (``src``, RTA_PREFSRC: the local GPU endpoint,
so that a connection opened without a bind uses an address that linkguard's routes carry, not a
rail's own address, which stays on the dead rail after a reroute) and a locked ``rto_min``
(RTAX_RTO_MIN with its RTAX_LOCK bit, in ms, as ``ip route ... rto_min 20ms`` writes it: TCP's
minimum retransmission timeout on the route, include/net/tcp.h ``tcp_rto_min``). A ``src`` that
is not a local address of the namespace is left out (the kernel would refuse the route with
EINVAL), logged once per address as ``route_src_not_local``.

After a reroute, packets already parked on the lost rail's unresolved neighbour (ARP) entries
keep a TCP connection stalled; :meth:`RouteTable.neighbours` and
:meth:`RouteTable.delete_neighbours` (:mod:`linkguard.drivers.neighbours`) let the applier drop
them.

On-link routes (no gateway) are written as ``ip route`` writes them: one netdev with scope
link, several as an RTA_MULTIPATH list of equal-weight nexthops (scope universe; the kernel
hashes flows over them and dumps them back in the order written; a one-entry list would come
back as a plain ``oif`` route, so one netdev is always written as ``oif``). The kernel refuses
a nexthop on an administratively down netdev (ENETDOWN) but accepts one without carrier.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network
from socket import AF_INET
from types import TracebackType
from typing import Any

import structlog

from linkguard.drivers import neighbours
from linkguard.drivers.kernelroute import (
    KINDS,
    Destination,
    KernelRoute,
    ReconcileResult,
    check_routes,
)
from linkguard.drivers.neighbours import Neighbour, netlink_message
from linkguard.drivers.netlink import open_iproute
from linkguard.drivers.rtnl import FR_ACT_TO_TBL, AsyncIPRoute, NetlinkError

__all__ = [
    "Destination",
    "KernelRoute",
    "NotPermittedError",
    "ReconcileResult",
    "RouteTable",
    "check_routes",
]

log = structlog.get_logger(__name__)

#: Table ids the kernel owns (include/uapi/linux/rtnetlink.h: RT_TABLE_UNSPEC, COMPAT,
#: DEFAULT, MAIN, LOCAL); linkguard refuses to manage them.
RESERVED_TABLES = frozenset({0, 252, 253, 254, 255})
#: Route types and scopes (include/uapi/linux/rtnetlink.h), with the names ``ip route`` prints.
RTN_UNICAST = 1
RTN_UNREACHABLE = 7
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
#: In a delete request: match a route of any scope (pyroute2 would otherwise send universe,
#: and the kernel would not find an on-link route, whose scope is link).
RT_SCOPE_NOWHERE = 255
_KIND_NAMES = {
    RTN_UNICAST: "unicast",
    6: "blackhole",
    RTN_UNREACHABLE: "unreachable",
    8: "prohibit",
    9: "throw",
}
#: Route metrics (include/uapi/linux/rtnetlink.h): RTAX_LOCK is a bit set of locked metrics;
#: tcp_rto_min() reads RTAX_RTO_MIN (ms) only when its bit is set, as ``ip route`` sets it.
RTAX_RTO_MIN = 13
RTO_MIN_LOCK = 1 << RTAX_RTO_MIN


@dataclass(frozen=True)
class _Entry:
    """A kernel route of the table with what deleting exactly it needs."""

    route: KernelRoute
    priority: int
    tos: int
    plain: bool  # metric 0, tos 0 and one of the shapes linkguard writes, as it writes them


def _parse(m: Any, names: dict[int, str]) -> _Entry:
    """One dumped route message of our table as an :class:`_Entry`."""
    dst = IPv4Network(f"{m.get('dst') or '0.0.0.0'}/{m['dst_len']}")
    gw, oif, hops = m.get("gateway"), m.get("oif"), m.get("multipath") or []
    src = m.get("prefsrc")
    mx = m.get("metrics")
    metrics = dict(mx["attrs"]) if mx else {}
    rto_min = metrics.pop("RTAX_RTO_MIN", None)
    locked = metrics.pop("RTAX_LOCK", 0)
    route = KernelRoute(
        destination=dst,
        gateway=IPv4Address(gw) if gw else None,
        netdev=names.get(oif) if oif else None,
        nexthops=tuple(names.get(h.get("oif"), f"#{h.get('oif')}") for h in hops),
        kind=_KIND_NAMES.get(m["type"], f"type {m['type']}"),
        src=IPv4Address(src) if src else None,
        rto_min_ms=rto_min,
    )
    onlink = route.kind == "unicast" and route.gateway is None and not route.nexthops
    priority, tos = m.get("priority") or 0, m["tos"]
    plain = (
        priority == 0
        and tos == 0
        and route.kind in KINDS
        and m["scope"] == (RT_SCOPE_LINK if onlink else RT_SCOPE_UNIVERSE)
        and all(not h.get("hops") and h.get("gateway") is None for h in hops)
        # no metric but a locked rto_min, as linkguard writes it
        and not metrics
        and locked == (RTO_MIN_LOCK if rto_min is not None else 0)
        and len({h.get("oif") for h in hops}) == len(hops)  # a netdev twice: a double share
    )
    return _Entry(route, priority, tos, plain)


class RouteTable:
    """One routing table owned by linkguard, in one network namespace.

    ``table``: the table id (1..2**32-1, not 252-255 or 0). ``rule_priority``: priority of its
    rules (1..32765; main's rule is 32766). ``prefixes``: the destinations it may route; one
    rule ``to <prefix> lookup <table>`` per prefix, or a single ``from all lookup <table>``
    when empty (the table holds only routes to endpoints, so everything else falls through
    to main). Every route in the table is linkguard's: :meth:`reconcile` deletes what is
    not desired, at any prefix length.
    ``netns``: a name under /run/netns or a path; a missing one raises
    :class:`~linkguard.drivers.netlink.NetnsNotFoundError` on ``__aenter__``.

    Use as ``async with RouteTable(...) as rt:``.
    """

    def __init__(
        self,
        *,
        table: int,
        netns: str | None = None,
        rule_priority: int = 1000,
        prefixes: Sequence[IPv4Network] = (),
    ) -> None:
        if not 0 < table < 2**32 or table in RESERVED_TABLES:
            raise ValueError(f"table {table} is reserved or out of range 1..2**32-1")
        if not 0 < rule_priority < 32766:
            raise ValueError(f"rule_priority {rule_priority} outside 1..32765")
        self.table = table
        self.netns = netns
        self.rule_priority = rule_priority
        self.prefixes: tuple[IPv4Network, ...] = tuple(IPv4Network(p) for p in prefixes)
        self._ipr: AsyncIPRoute | None = None
        #: local IPv4 addresses of the namespace: dumped at the first :meth:`reconcile` and
        #: again whenever a route's ``src`` is not among them (an address added later)
        self._local: frozenset[IPv4Address] | None = None
        #: ifindex -> netdev name, as of the last link dump (the neighbour calls reuse it: a
        #: flush follows a route change, which just dumped the links)
        self._names: dict[int, str] | None = None
        self._src_refused: set[IPv4Address] = set()  # route_src_not_local said once each

    async def __aenter__(self) -> RouteTable:
        self._ipr = open_iproute(self.netns)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    @property
    def ipr(self) -> AsyncIPRoute:
        if self._ipr is None:
            raise RuntimeError("RouteTable used outside `async with`")
        return self._ipr

    # -- rules ----------------------------------------------------------------------------

    def _rule_key(self, rule: Any) -> tuple[str, int] | None:
        """(dst, dst_len) of one of *our* rules (lookup table at our priority, no other
        selector), else None."""
        table = rule.get("table")
        if (
            rule["action"] != FR_ACT_TO_TBL
            or table != self.table
            or rule.get("priority", 0) != self.rule_priority
            or rule["src_len"]
            or any(rule.get(k) for k in ("iifname", "oifname", "fwmark"))
        ):
            return None
        return (rule.get("dst") or "0.0.0.0", rule["dst_len"])

    async def _our_rules(self) -> set[tuple[str, int]]:
        return {
            key
            async for r in await self.ipr.get_rules(family=AF_INET)
            if (key := self._rule_key(r)) is not None
        }

    def _wanted_rules(self) -> set[tuple[str, int]]:
        if not self.prefixes:
            return {("0.0.0.0", 0)}
        return {(str(p.network_address), p.prefixlen) for p in self.prefixes}

    async def ensure_rules(self) -> None:
        """Make this table's rules exactly ``to <prefix> lookup <table> priority <p>`` per
        prefix (``from all`` when no prefixes): adds the missing ones, removes ones of ours
        (same table and priority) for prefixes no longer configured, leaves every other rule
        alone. Idempotent. Raises :class:`NotPermittedError` when the kernel says EPERM (no
        CAP_NET_ADMIN), NetlinkError if it refuses otherwise."""
        try:
            await self._ensure_rules()
        except NetlinkError as exc:
            if exc.code != errno.EPERM:
                raise
            raise NotPermittedError(
                f"the kernel refused linkguard's ip rule ({netlink_message(exc)}): the agent needs "
                "CAP_NET_ADMIN for its rules and its route table: run it as root or grant the "
                "capability (deploy/systemd/linkguard-agent.service: AmbientCapabilities="
                "CAP_NET_ADMIN)"
            ) from None

    async def _ensure_rules(self) -> None:
        have, want = await self._our_rules(), self._wanted_rules()
        for dst, dst_len in sorted(want - have):
            await self.ipr.rule("add", **self._rule_args(dst, dst_len))
            log.info("rule_added", netns=self.netns, table=self.table, to=f"{dst}/{dst_len}")
        for dst, dst_len in sorted(have - want):
            await self.ipr.rule("del", **self._rule_args(dst, dst_len))
            log.info("rule_removed", netns=self.netns, table=self.table, to=f"{dst}/{dst_len}")

    def _rule_args(self, dst: str, dst_len: int) -> dict[str, Any]:
        args: dict[str, Any] = {
            "family": AF_INET,
            "table": self.table,
            "priority": self.rule_priority,
            "action": FR_ACT_TO_TBL,
        }
        if dst_len:
            args |= {"dst": dst, "dst_len": dst_len}
        return args

    # -- routes ---------------------------------------------------------------------------

    async def _netdevs(self) -> dict[int, str]:
        self._names = {m["index"]: m.get("ifname") async for m in await self.ipr.link("dump")}
        return self._names

    async def _entries(self, names: dict[int, str]) -> dict[Destination, list[_Entry]]:
        out: dict[Destination, list[_Entry]] = {}
        async for m in await self.ipr.route("dump", family=AF_INET):
            if m.get("table") != self.table:
                continue
            entry = _parse(m, names)
            out.setdefault(entry.route.destination, []).append(entry)
        return out

    async def dump(self) -> dict[Destination, KernelRoute]:
        """Every route of this table (any prefix length), by destination: an IPv4Address for
        a /32, an IPv4Network otherwise. Other tables are not read into the result. With two
        routes for one destination (different metrics) the first wins."""
        entries = await self._entries(await self._netdevs())
        return {dest: es[0].route for dest, es in entries.items()}

    async def reconcile(self, desired: Sequence[KernelRoute]) -> ReconcileResult:
        """Make the table's routes (every prefix length) exactly ``desired``.

        Identical routes are left alone (no churn; a multipath route is identical when its
        nexthop set is), differing ones replaced (``ip route replace``), missing ones added,
        undesired ones deleted. A route naming a netdev that does not exist or that the kernel
        refuses (unreachable gateway: ENETUNREACH, netdev down: ENETDOWN) goes to ``errors``,
        leaves what the kernel had for that destination as it was (like a failed ``ip route
        replace``), and the others still apply. Raises ValueError (:func:`check_routes`)
        before touching anything when a destination is outside ``prefixes`` (if given),
        appears twice, or a route has no valid shape.
        """
        check_routes(desired, self.prefixes)
        started = time.monotonic()
        result = ReconcileResult()
        names = await self._netdevs()
        index = {name: idx for idx, name in names.items()}
        if self._local is None or any(
            r.src is not None and r.src not in self._local for r in desired
        ):  # addresses rarely change: dumped once, and again only when a src is not known
            self._local = await self._local_addresses()
        desired = self._usable_src(desired)
        current = await self._entries(names)
        for want in desired:
            have = current.pop(want.destination, [])
            if len(have) == 1 and have[0].plain and have[0].route == want:
                result.unchanged += 1
                continue
            if not await self._replace(want, index, result):
                continue
            # replace matched the (dst, tos=0, metric=0) route; drop any other shape
            extra = [e for e in have if not (e.priority == 0 and e.tos == 0)]
            await self._delete(extra, result, count=False)
            if have:
                result.replaced += 1
            else:
                result.added += 1
        for entries in current.values():
            await self._delete(entries, result)
        return self._report("routes_reconciled", result, started)

    async def update(
        self, upsert: Sequence[KernelRoute], remove: Iterable[Destination] = ()
    ) -> ReconcileResult:
        """Replace the ``upsert`` routes and delete the ``remove`` destinations (addresses for
        /32s, networks for prefixes), without reading the table first: the fast path, whose
        cost grows with the change, not with the table (:meth:`reconcile` dumps every route
        of the namespace first). Every upsert counts as ``replaced``; a destination in
        ``remove`` that is not there is not an error. Same validation and error handling as
        :meth:`reconcile`."""
        check_routes(upsert, self.prefixes)
        started = time.monotonic()
        result = ReconcileResult()
        index = {name: idx for idx, name in (await self._netdevs()).items()}
        if self._local is None:
            self._local = await self._local_addresses()
        upsert = self._usable_src(upsert)
        for want in upsert:
            if await self._replace(want, index, result):
                result.replaced += 1
        for dest in remove:
            net = IPv4Network(dest)
            try:
                await self.ipr.route(
                    "del",
                    table=self.table,
                    dst=str(net.network_address),
                    dst_len=net.prefixlen,
                    scope=RT_SCOPE_NOWHERE,
                )
            except NetlinkError as exc:
                if exc.code != errno.ESRCH:  # already gone
                    result.errors.append((dest, f"delete: {netlink_message(exc)}"))
                continue
            result.deleted += 1
        return self._report("routes_updated", result, started)

    async def _local_addresses(self) -> frozenset[IPv4Address]:
        return frozenset(
            [
                IPv4Address(m.get("address"))
                async for m in await self.ipr.addr("dump", family=AF_INET)
                if m.get("address")
            ]
        )

    def _usable_src(self, routes: Sequence[KernelRoute]) -> list[KernelRoute]:
        """``routes`` with every ``src`` that is not a local address of the namespace left out
        (logged once per address): the kernel refuses such a route (EINVAL)."""
        local = self._local or frozenset()
        out = []
        for r in routes:
            if r.src is not None and r.src not in local:
                if r.src not in self._src_refused:
                    self._src_refused.add(r.src)
                    log.warning(
                        "route_src_not_local",
                        netns=self.netns,
                        src=str(r.src),
                        hint="routes are written without this source address: put the GPU "
                        "endpoints on the host (e.g. /32s on lo) or set routes.source: kernel",
                    )
                r = replace(r, src=None)
            out.append(r)
        return out

    # -- neighbours (linkguard.drivers.neighbours) --------------------------------------

    async def neighbours(self, netdevs: Iterable[str] | None = None) -> list[Neighbour]:
        """The IPv4 neighbour entries of the namespace (of ``netdevs`` only, when given)."""
        names = self._names if self._names is not None else await self._netdevs()
        return await neighbours.dump(self.ipr, names, netdevs)

    async def delete_neighbours(self, entries: Iterable[Neighbour]) -> int:
        """Delete ``entries``, never a permanent one (:func:`neighbours.delete`). Returns how
        many were deleted; refusals are logged, never raised."""
        names = self._names if self._names is not None else await self._netdevs()
        return await neighbours.delete(self.ipr, names, entries, self.netns)

    def _report(self, event: str, result: ReconcileResult, started: float) -> ReconcileResult:
        """Stamp the elapsed time, log the summary and one warning per refused route."""
        result.elapsed_ms = round((time.monotonic() - started) * 1000, 3)
        log.info(
            event,
            netns=self.netns,
            table=self.table,
            added=result.added,
            replaced=result.replaced,
            deleted=result.deleted,
            unchanged=result.unchanged,
            errors=len(result.errors),
            ms=result.elapsed_ms,
        )
        for dest, msg in result.errors:
            log.warning(
                "route_refused", netns=self.netns, table=self.table, dst=str(dest), error=msg
            )
        return result

    async def _replace(
        self, want: KernelRoute, index: dict[str, int], result: ReconcileResult
    ) -> bool:
        """``ip route replace`` one route in this table; False (and an error in ``result``)
        when one of its netdevs is missing or the kernel refuses it."""
        missing = [n for n in want.netdevs if n not in index]
        if missing:
            result.errors.append((want.destination, f"netdev {missing[0]} not found"))
            return False
        net = want.network
        args: dict[str, Any] = {"dst": str(net.network_address), "dst_len": net.prefixlen}
        if want.src is not None:
            args["prefsrc"] = str(want.src)
        if want.rto_min_ms is not None:
            # RTA_METRICS, not pyroute2's ``metrics`` keyword: that one is dropped from a
            # multipath request (pyroute2 0.9.7)
            args["RTA_METRICS"] = {
                "attrs": [("RTAX_LOCK", RTO_MIN_LOCK), ("RTAX_RTO_MIN", want.rto_min_ms)]
            }
        if want.kind == "unreachable":
            args["type"] = "unreachable"
        elif want.nexthops:
            args["multipath"] = [{"oif": index[n]} for n in want.nexthops]
        else:
            if want.gateway is not None:
                args["gateway"] = str(want.gateway)
            else:
                args["scope"] = RT_SCOPE_LINK  # on-link, as `ip route add D dev N` writes it
            if want.netdev is not None:
                args["oif"] = index[want.netdev]
        try:
            await self.ipr.route("replace", table=self.table, **args)
        except NetlinkError as exc:
            if exc.code == errno.EINVAL and want.src is not None:
                # the source address went away since it was last seen: without it, as
                # for any src that is not local (said once)
                self._local = await self._local_addresses()
                if want.src not in self._local:
                    (fixed,) = self._usable_src([want])
                    return await self._replace(fixed, index, result)
            result.errors.append((want.destination, netlink_message(exc)))
            return False
        return True

    async def _delete(
        self, entries: Iterable[_Entry], result: ReconcileResult, *, count: bool = True
    ) -> None:
        for e in entries:
            net = e.route.network
            try:
                await self.ipr.route(
                    "del",
                    table=self.table,
                    dst=str(net.network_address),
                    dst_len=net.prefixlen,
                    priority=e.priority,
                    tos=e.tos,
                    scope=RT_SCOPE_NOWHERE,
                )
            except NetlinkError as exc:
                result.errors.append((e.route.destination, f"delete: {netlink_message(exc)}"))
                continue
            if count:
                result.deleted += 1

    async def flush(self) -> int:
        """Delete every route of this table (any prefix length) and this table's rules
        (the SIGTERM "withdraw" policy). Returns the number of routes deleted."""
        deleted = 0
        # collect first: no requests on the socket while its dump is still being read
        ours = [m async for m in await self.ipr.route("dump", family=AF_INET)]
        for m in ours:
            if m.get("table") != self.table:
                continue
            args: dict[str, Any] = {
                "table": self.table,
                "dst_len": m["dst_len"],
                "tos": m["tos"],
                "priority": m.get("priority") or 0,
                "scope": RT_SCOPE_NOWHERE,
            }
            if m.get("dst"):
                args["dst"] = m.get("dst")
            try:
                await self.ipr.route("del", **args)
                deleted += 1
            except NetlinkError as exc:
                log.warning(
                    "route_flush_failed",
                    netns=self.netns,
                    dst=m.get("dst"),
                    error=netlink_message(exc),
                )
        for dst, dst_len in sorted(await self._our_rules()):
            await self.ipr.rule("del", **self._rule_args(dst, dst_len))
        log.info("table_flushed", netns=self.netns, table=self.table, routes=deleted)
        return deleted


class NotPermittedError(PermissionError):
    """The kernel refused a route or rule change for lack of privilege (EPERM)."""
