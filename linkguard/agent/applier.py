"""The applier: puts a plan in place on this host.

Consumes: validated plans and the set of locally down ports. Produces: routes in linkguard's
own table (through a :class:`~linkguard.drivers.routes.RouteTable`: on-link prefix routes, /32
exceptions via a gateway, ``unreachable`` /32s; see :func:`kernel_routes`), the rail map file
(written atomically when what it says changes), the last plan persisted in the state dir
(``last-plan.json``; a compact plan with the peer routes it was expanded with, one file per
peer in ``peers/``, which the agent writes as they arrive; each file holds the payload as
received, a signed envelope when the service signs, verified again by :meth:`Applier.start`),
and :class:`~linkguard.models.Ack`s.

Beyond the routes a plan names, applying it makes TCP move with them (a route change alone
brings UDP back, not TCP; measured in the namespace lab, README "Jobs"):

- each unicast route carries ``src`` = a local GPU endpoint (:func:`kernel_routes`), so that a
  connection opened without a bind is sourced from an address that the peers' linkguard routes
  carry, not from a rail's own address, which stays tied to that rail after a reroute;
- optionally a locked ``rto_min`` (``routes.rto_min_ms``), so a segment lost in the switch-over
  is retransmitted after that long instead of Linux's 200 ms minimum (TCP_RTO_MIN);
- after every change, the neighbour (ARP) entries that the old table used and the new one does
  not are deleted (:func:`stale_neighbours`): a segment sent in the moment before a reroute
  waits in the queue of an unresolved entry of the lost rail, and TCP does not retransmit a
  segment still in the host's queues, so without this the connection stalls until the lost
  rail answers again.

Every apply is a full reconcile of the table against the plan, so a restart, a missed message or
a hand-edited table converge to the plan with no duplicates and no churn for unchanged routes.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

import structlog

from linkguard.agent.plans import Effective, PlanRefused, check_plan, effective, rail_map
from linkguard.agent.statewrites import StateWrites
from linkguard.atomicfile import atomic_write
from linkguard.drivers.neighbours import Neighbour
from linkguard.drivers.routes import Destination, KernelRoute, ReconcileResult
from linkguard.models import Ack, AckResult, BadMessage, PeerRoutes, Plan, decode, expand_plan
from linkguard.signing import SignatureError, Verifier, unwrap

__all__ = [
    "Applier",
    "RouteTableLike",
    "atomic_write",
    "endpoint_sources",
    "kernel_routes",
    "load_peer_routes",
    "lost_netdevs",
    "stale_neighbours",
]

log = structlog.get_logger(__name__)


class RouteTableLike(Protocol):
    """What the applier needs of a route table (kernel or in-memory)."""

    async def __aenter__(self) -> RouteTableLike: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    async def ensure_rules(self) -> None: ...
    async def reconcile(self, desired: Sequence[KernelRoute]) -> ReconcileResult: ...
    async def update(
        self, upsert: Sequence[KernelRoute], remove: Iterable[Destination] = ()
    ) -> ReconcileResult: ...
    async def flush(self) -> object: ...  # the kernel table's: how many routes it deleted
    async def neighbours(self, netdevs: Iterable[str] | None = None) -> list[Neighbour]: ...
    async def delete_neighbours(self, entries: Iterable[Neighbour]) -> int: ...


def endpoint_sources(eff: Effective) -> dict[int, ipaddress.IPv4Address]:
    """Source address per home rail: the endpoint of this host's lowest-numbered GPU homed on
    that rail (a GPU's endpoint and home rail never change with a reroute, so neither does the
    source of the routes towards a rail's peers); key -1: the lowest GPU's endpoint, for home
    rails no local GPU has. Empty when the plan assigns no GPU."""
    out: dict[int, ipaddress.IPv4Address] = {}
    for a in sorted(eff.rail_assignments, key=lambda a: a.gpu):
        out.setdefault(a.home_rail, a.endpoint)
        out.setdefault(-1, a.endpoint)
    return out


def kernel_routes(
    eff: Effective,
    *,
    source: bool = True,
    rto_min_ms: int | None = None,
) -> dict[Destination, KernelRoute]:
    """The table ``eff`` asks for, by destination: each prefix route on-link out of its
    netdevs (one: a plain route; several: multipath; none: ``unreachable``), each /32
    exception via its gateway, and an ``unreachable`` /32 for each of ``eff.unreachable``.
    A /32 exception wins over a prefix route written as a /32 for the same address.
    With ``source`` (the agent's default, ``routes.source: endpoint``) unicast routes get
    ``src`` by the destination's home rail (:func:`endpoint_sources`); every unicast route
    gets ``rto_min_ms`` (ms, None: none)."""
    srcs = endpoint_sources(eff) if source else {}

    def src(home_rail: int) -> ipaddress.IPv4Address | None:
        return srcs.get(home_rail, srcs.get(-1))

    out: dict[Destination, KernelRoute] = {}
    for p in eff.prefix_routes:
        hops = tuple(n for n in p.netdevs if n is not None)  # check_plan refused None ones
        if hops:
            route = KernelRoute(
                p.prefix, nexthops=hops, src=src(p.home_rail), rto_min_ms=rto_min_ms
            )
        else:
            route = KernelRoute(p.prefix, kind="unreachable")
        out[route.destination] = route
    for r in eff.routes:
        out[r.destination] = KernelRoute(
            r.destination, r.gateway, r.netdev, src=src(r.home_rail), rto_min_ms=rto_min_ms
        )
    for d in eff.unreachable:
        out[d] = KernelRoute(d, kind="unreachable")
    return out


def _prefixlen(d: Destination) -> int:
    """``d``'s prefix length, 32 for an address (no ``IPv4Network(d)``: that parses ``d``'s
    text again, the most of this module's cost per plan in a 64-agent chaos run)."""
    return d.prefixlen if isinstance(d, ipaddress.IPv4Network) else 32


class _Uses:
    """Which neighbour entries (address, netdev) a table sends through: the gateway of each
    route via a gateway, and every address whose longest matching route is on-link (no
    gateway) out of that netdev (one of a multipath route's nexthops)."""

    def __init__(self, table: Mapping[Destination, KernelRoute]) -> None:
        self.table = table
        self.lengths = sorted({_prefixlen(d) for d in table}, reverse=True)
        self.gateways = {
            (r.gateway, n) for r in table.values() if r.gateway is not None for n in r.netdevs
        }

    def lookup(self, addr: ipaddress.IPv4Address) -> KernelRoute | None:
        for plen in self.lengths:
            net = ipaddress.IPv4Network((int(addr) >> (32 - plen) << (32 - plen), plen))
            route = self.table.get(addr if plen == 32 else net)
            if route is not None:
                return route
        return None

    def __call__(self, addr: ipaddress.IPv4Address, netdev: str) -> bool:
        if (addr, netdev) in self.gateways:
            return True
        r = self.lookup(addr)
        return r is not None and r.kind == "unicast" and r.gateway is None and netdev in r.netdevs


def lost_netdevs(
    before: Mapping[Destination, KernelRoute], after: Mapping[Destination, KernelRoute]
) -> set[str]:
    """The netdevs that carry some destination in ``before`` but not in ``after``: a route's
    netdevs that its destination's route in ``after`` lacks (all of them when it is gone), and
    for a destination new in ``after`` (a /32 exception) the netdevs of the route that
    carried it in ``before`` that it no longer uses. Only their neighbour entries can be
    :func:`stale_neighbours`."""
    out: set[str] = set()
    for d, r in before.items():
        new = after.get(d)
        out |= set(r.netdevs) - set(new.netdevs if new is not None else ())
    old = _Uses(before)
    for d, r in after.items():
        if d not in before:
            was = old.lookup(d.network_address if isinstance(d, ipaddress.IPv4Network) else d)
            if was is not None:
                out |= set(was.netdevs) - set(r.netdevs)
    return out


def stale_neighbours(
    before: Mapping[Destination, KernelRoute],
    after: Mapping[Destination, KernelRoute],
    entries: Iterable[Neighbour],
) -> list[Neighbour]:
    """The neighbour ``entries`` that may hold packets (:attr:`Neighbour.holds_packets`:
    unresolved, the only state in which the kernel queues them, up to ``unres_qlen_bytes``;
    ip-sysctl.rst) for an address that table ``before`` sent through them and table
    ``after`` no longer does (:class:`_Uses`). After a reroute nothing resolves them (the
    path is lost), so their packets would wait until the old path answers again. A resolved
    entry of a lost path is left to expire: packets sent to it leave the host (and are lost
    on the wire, which TCP repairs by itself)."""
    was, now = _Uses(before), _Uses(after)
    return [
        n
        for n in entries
        if n.holds_packets and was(n.address, n.netdev) and not now(n.address, n.netdev)
    ]


def load_peer_routes(
    directory: Path, *, verifier: Verifier | None = None, require_signed: bool = True
) -> dict[str, PeerRoutes]:
    """The peer routes persisted in ``directory`` (``<peer>.json``, as received), by peer.
    An unreadable or invalid file is logged (``peer_routes_unreadable``) and skipped; so is
    one that fails the signature check with ``verifier`` (``state_file_refused``, with the
    :class:`~linkguard.signing.SignatureError` reason), as :func:`unwrap` decides."""
    out: dict[str, PeerRoutes] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            raw = path.read_bytes()
            body = unwrap(raw, verifier, require=require_signed).body
        except OSError as exc:
            log.warning("peer_routes_unreadable", path=str(path), error=str(exc))
            continue
        except SignatureError as exc:
            _state_file_refused(path, exc)
            continue
        try:
            pr = decode(PeerRoutes, body, expect_host=path.stem)
        except BadMessage as exc:
            log.warning("peer_routes_unreadable", path=str(path), error=str(exc))
            continue
        out[pr.host] = pr
    return out


def _state_file_refused(path: Path, exc: SignatureError) -> None:
    log.error(
        "state_file_refused",
        path=str(path),
        reason=exc.reason,
        detail=exc.detail[:300],
        action="not applied; waiting for the service's signed copy",
        hint="the file was changed after it was received, or the service key changed",
    )


class Applier:
    """Applies plans for ``host``. Not thread-safe; call from one task."""

    def __init__(
        self,
        *,
        host: str,
        table: RouteTableLike,
        netdevs: Collection[str],
        prefixes: Collection[ipaddress.IPv4Network],
        rail_map_path: Path,
        state_dir: Path,
        verifier: Verifier | None = None,
        require_signed: bool = True,
        route_source: bool = True,
        rto_min_ms: int | None = None,
        neighbour_flush: bool = True,
    ) -> None:
        """``verifier``: the service's key, which the persisted plan and peer routes must be
        signed with when :meth:`start` restores them (``require_signed``: unsigned ones are
        refused too); None: restored unverified. ``route_source``: routes carry a local GPU
        endpoint as ``src`` (:func:`endpoint_sources`); ``rto_min_ms``: a locked TCP
        ``rto_min`` on every unicast route (ms; None: the kernel's 200 ms);
        ``neighbour_flush``: remember each table change, so that :meth:`flush_stale` deletes
        the neighbour entries it left stale (:func:`stale_neighbours`; module docstring)."""
        self.host = host
        self.verifier = verifier
        self.require_signed = require_signed
        self.route_source = route_source
        self.rto_min_ms = rto_min_ms
        self.neighbour_flush = neighbour_flush
        #: neighbour entries deleted after route changes, since start
        self.neighbours_flushed = 0
        #: the installed table before each change not yet followed by :meth:`flush_stale`
        self._unflushed: list[dict[Destination, KernelRoute]] = []
        self.table = table
        self.netdevs = set(netdevs)
        self.prefixes = list(prefixes)
        self.rail_map_path = rail_map_path
        self.plan_path = state_dir / "last-plan.json"
        self.peers_dir = state_dir / "peers"
        #: the state dir's writes and their failures (a full disk is counted, never raised)
        self.writes = StateWrites()
        self._rail_map_said: tuple | None = None  # what the rail map file says, epoch aside
        #: the plan :meth:`start` restored as received (compact, with the peer routes it
        #: expanded it with; or full, with none); None: nothing restored
        self.restored: tuple[Plan, dict[str, PeerRoutes]] | None = None
        self.plan: Plan | None = None
        self.locally_down: set[str] = set()
        self.last_result: ReconcileResult | None = None
        #: what this applier put in the table, as of its last change
        self.installed: dict[Destination, KernelRoute] = {}

    @property
    def applied_epoch(self) -> int | None:
        return self.plan.epoch if self.plan else None

    async def start(self) -> None:
        """Install the ip rules, then reconcile the table with the last persisted plan (its
        signature checked again with :attr:`verifier`: a file that fails is logged as
        ``state_file_refused`` and nothing is applied)."""
        await self.table.ensure_rules()
        if not self.plan_path.exists():
            return
        try:
            raw = self.plan_path.read_bytes()
            body = unwrap(raw, self.verifier, require=self.require_signed).body
        except SignatureError as exc:
            _state_file_refused(self.plan_path, exc)
            return
        except OSError as exc:
            log.warning("last_plan_unreadable", path=str(self.plan_path), error=str(exc))
            return
        try:
            compact = decode(Plan, body, expect_host=self.host)
            peers = (
                load_peer_routes(
                    self.peers_dir, verifier=self.verifier, require_signed=self.require_signed
                )
                if compact.shared is not None
                else {}
            )
            plan = expand_plan(compact, peers)
        except (OSError, BadMessage, ValueError) as exc:
            log.warning("last_plan_unreadable", path=str(self.plan_path), error=str(exc))
            return
        try:  # the config may have changed since (prefixes, netdevs): re-check its scope
            check_plan(
                plan,
                host=self.host,
                applied_epoch=None,
                netdevs=self.netdevs,
                prefixes=self.prefixes,
            )
        except PlanRefused as exc:
            log.warning(
                "last_plan_discarded",
                path=str(self.plan_path),
                reason=exc.reason,
                detail=exc.detail,
                hint="waiting for a new plan from the service",
            )
            return
        self.plan = plan
        self.restored = (compact, peers)
        await self._put_in_place()
        log.info("reconciled_with_last_plan", epoch=plan.epoch, result=self._summary())

    def check(self, plan: Plan, *, same_epoch: bool = False) -> None:
        """Raise :class:`PlanRefused` when ``plan`` must not be applied (``same_epoch``: the
        applied epoch itself is not stale, for expanded compact plans)."""
        applied = self.applied_epoch
        check_plan(
            plan,
            host=self.host,
            applied_epoch=applied - 1 if same_epoch and applied is not None else applied,
            netdevs=self.netdevs,
            prefixes=self.prefixes,
            checked=self.plan,
            applied_term=self.plan.term if self.plan is not None else 0,
        )

    async def apply(self, plan: Plan, *, same_epoch: bool = False, persist: bool = True) -> Ack:
        """Check and apply ``plan``; the ack says applied, refused or failed. ``persist``
        False: the caller keeps what ``plan`` was made from in the state dir (a compact plan
        and its peer routes)."""
        t0 = time.monotonic()
        try:
            self.check(plan, same_epoch=same_epoch)
        except PlanRefused as exc:
            log.warning("plan_refused", epoch=plan.epoch, reason=exc.reason, detail=exc.detail)
            return Ack(
                host=self.host,
                epoch=plan.epoch,
                result=AckResult.REFUSED,
                error=str(exc),
                applied_at=time.time(),
            )
        return await self.put(plan, persist=persist, t0=t0)

    async def put(self, plan: Plan, *, persist: bool = True, t0: float | None = None) -> Ack:
        """Apply ``plan`` without checking it: the caller has (the agent's core, with
        :func:`~linkguard.agent.plans.check_plan`). The ack says applied or failed; its
        ``apply_ms`` counts from ``t0`` (monotonic s; default: now). ``persist`` as in
        :meth:`apply`."""
        t0 = time.monotonic() if t0 is None else t0
        self.plan = plan
        if persist:
            self.writes.write("plan", self.plan_path, plan.model_dump_json())
        return await self._ack(plan, t0, fast_path=False)

    async def port_down(self, key: str) -> Ack | None:
        """Fast path: ``key`` ("hca/port") went down; overlay its backup now if the plan has one."""
        self.locally_down.add(key)
        if self.plan is None or not any(f"{b.hca}/{b.port}" == key for b in self.plan.backups):
            return None
        return await self._ack(self.plan, time.monotonic(), fast_path=True, full=False)

    def port_up(self, key: str) -> None:
        """``key`` is usable again; its traffic returns with the service's next plan."""
        self.locally_down.discard(key)

    async def port_back(self, key: str) -> bool:
        """``key`` is up again after the agent's own hold-down (the monitor's ``up``): like
        :meth:`port_up`, and its backup's overlay comes off the plan in place at once (only
        the routes it changed; nothing when the plan in place already routes around it).
        A service that never saw the port go down (its states lost on the way, or a flap
        its solve back-off folded away) sends no next plan: the overlay stayed for good, all
        endpoints behind a backup without rails ``unreachable`` while every port was up
        (found by the lab chaos run). True when the table changed."""
        had = key in self.locally_down
        self.port_up(key)
        if not had or self.plan is None:
            return False
        before = dict(self.installed)
        try:
            await self._put_in_place(full=False)
        except Exception as exc:  # the kernel refused: the next plan reconciles; keep running
            log.error("fast_path_removal_failed", port=key, error=repr(exc))
            return False
        if self.installed != before:
            log.info("fast_path_removed", port=key, epoch=self.plan.epoch)
        return self.installed != before

    async def withdraw(self) -> None:
        """Remove linkguard's table and rules and the rail map (the SIGTERM 'withdraw'
        policy); the last plan stays in the state dir for the next start."""
        await self.table.flush()
        self.rail_map_path.unlink(missing_ok=True)
        self._rail_map_said = None

    async def _ack(self, plan: Plan, t0: float, *, fast_path: bool, full: bool = True) -> Ack:
        try:
            await self._put_in_place(full=full)
        except Exception as exc:  # the kernel refused the whole apply; report, keep running
            log.error("plan_apply_failed", epoch=plan.epoch, error=repr(exc))
            return Ack(
                host=self.host,
                epoch=plan.epoch,
                result=AckResult.FAILED,
                error=repr(exc)[:2000],
                applied_at=time.time(),
                fast_path=fast_path,
            )
        ms = (time.monotonic() - t0) * 1000
        errors = self.last_result.errors if self.last_result else []
        log.info(
            "plan_applied",
            epoch=plan.epoch,
            fast_path=fast_path,
            apply_ms=round(ms, 2),
            **self._summary(),
        )
        return Ack(
            host=self.host,
            epoch=plan.epoch,
            result=AckResult.FAILED if errors else AckResult.APPLIED,
            error="; ".join(f"{d}: {m}" for d, m in errors)[:2000] or None,
            applied_at=time.time(),
            apply_ms=ms,
            fast_path=fast_path,
        )

    async def _put_in_place(self, *, full: bool = True) -> None:
        """Plans reconcile the whole table (converges whatever happened to it); the fast path
        only changes what its backup changes, so it costs the same on any table size."""
        assert self.plan is not None
        eff = effective(self.plan, self.locally_down)
        desired = kernel_routes(eff, source=self.route_source, rto_min_ms=self.rto_min_ms)
        if full:
            self.last_result = await self.table.reconcile(list(desired.values()))
        else:
            upsert = [r for d, r in desired.items() if self.installed.get(d) != r]
            remove = [d for d in self.installed if d not in desired]
            self.last_result = await self.table.update(upsert, remove)
        failed = {d for d, _ in self.last_result.errors}
        before, self.installed = (
            self.installed,
            {d: r for d, r in desired.items() if d not in failed},
        )
        if self.neighbour_flush and before != self.installed:
            self._unflushed.append(before)
        said = (eff.rail_assignments, eff.fast_path_ports)  # all the rail map says but epoch
        if said != self._rail_map_said or not self.rail_map_path.exists():
            doc = rail_map(self.host, self.plan.epoch, eff)
            atomic_write(self.rail_map_path, json.dumps(doc, indent=2) + "\n")
            self._rail_map_said = said

    async def flush_stale(self) -> int:
        """Delete the neighbour entries the table changes since the last call left stale
        (:func:`stale_neighbours` of each table before a change against the one in place
        now); returns how many. Kept apart from the change itself so that the caller can
        send the ack and the port state first (the wiring module runs it right after); a
        kernel error is logged (``neighbour_flush_failed``), never raised: the routes are in
        place either way, and TCP then waits for the old path as before."""
        befores, self._unflushed = self._unflushed, []
        netdevs = set().union(*(lost_netdevs(b, self.installed) for b in befores))
        if not netdevs:
            return 0
        try:
            entries = await self.table.neighbours(netdevs)
            found: set[Neighbour] = set()
            for b in befores:
                found.update(stale_neighbours(b, self.installed, entries))
            stale = [n for n in entries if n in found]
            if not stale:
                return 0
            deleted = await self.table.delete_neighbours(stale)
        except Exception as exc:  # a failed flush costs TCP one stall, never the apply
            log.warning("neighbour_flush_failed", error=repr(exc)[:500])
            return 0
        self.neighbours_flushed += deleted
        log.info(
            "neighbours_flushed",
            deleted=deleted,
            entries=[f"{n.address}@{n.netdev}" for n in stale[:16]],
        )
        return deleted

    def _summary(self) -> dict[str, object]:
        r = self.last_result
        if r is None:
            return {}
        return {
            "added": r.added,
            "replaced": r.replaced,
            "deleted": r.deleted,
            "unchanged": r.unchanged,
            "errors": len(r.errors),
        }
