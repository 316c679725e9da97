"""Port observations from rtnetlink link state (RoCE / IPoIB netdevs), through pyroute2.

Consumes: RTM_NEWLINK / RTM_DELLINK messages (rtnetlink(7), group RTNLGRP_LINK) of one network
namespace. Produces: :class:`~linkguard.drivers.base.PortObservation` batches, a snapshot first
and then only the ports whose reading changed.

The health signal is the carrier: IFF_LOWER_UP in ``ifi_flags`` (include/uapi/linux/if.h,
"driver signals L1 up"; the same bit ``ip link`` prints as LOWER_UP). Operstate is not used: it
can read DOWN when only the peer of a veth went down, and on real NICs it lags behind.

pyroute2 (0.9.x) facts this module relies on, each checked against its source and on this kernel:

* ``AsyncIPRoute(netns=name)`` defaults to ``flags=os.O_CREAT`` and silently *creates* a missing
  namespace; :func:`open_iproute` passes ``flags=0`` and turns the FileNotFoundError into
  :class:`NetnsNotFoundError`.
* ``AsyncIPRoute.get()`` with the default ``msg_seq=0`` yields the broadcast messages of *one*
  datagram and then returns: it has to be called in a loop.
* A receive error (ENOBUFS after a socket overflow) is stored in the socket's status and every
  later call raises it again: the socket is dead and must be replaced. This driver then opens a
  new socket, re-dumps every link and emits what changed.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from linkguard.drivers.base import PortObservation
from linkguard.drivers.rtnl import IFF_LOWER_UP, IFF_UP, RTMGRP_LINK, AsyncIPRoute
from linkguard.drivers.rtnl import config as pyroute2_config
from linkguard.models import LinkLayer, PortStateName

__all__ = ["NetlinkPort", "NetlinkPortSource", "NetnsNotFoundError", "open_iproute"]

log = structlog.get_logger(__name__)

#: Default receive buffer of the event socket (bytes; the kernel doubles it). 1 MiB holds
#: thousands of link messages (~1.5 KiB each), far more than one host's link churn.
DEFAULT_RCVBUF = 1 << 20
#: A dump that gets no answer within this many seconds is treated like an overflow (s).
DUMP_TIMEOUT_S = 10.0


# pyroute2 opens a socket in another namespace from a forked child, and stops the child with
# SIGTERM. The child inherits asyncio's signal wakeup fd, so without this the parent's event
# loop reads that SIGTERM as its own and the daemon shuts down. With it, the child resets
# SIGTERM/SIGINT to their defaults before doing anything (pyroute2/process.py, wrapper()).
pyroute2_config.disable_mp_signal = True


class NetnsNotFoundError(FileNotFoundError):
    """The named network namespace does not exist (``/run/netns/<name>`` is missing)."""


def open_iproute(netns: str | None, **kwargs: Any) -> AsyncIPRoute:
    """An :class:`AsyncIPRoute` in ``netns`` (None: the current namespace), socket created now.

    Never creates a namespace (``flags=0``). Raises :class:`NetnsNotFoundError` when ``netns``
    does not exist. Extra keyword arguments go to AsyncIPRoute (``rcvbuf``, ``strict_check``).
    """
    ipr = AsyncIPRoute(netns=netns, flags=0, **kwargs)
    try:
        ipr.socket  # noqa: B018 - the property creates the socket (inside the netns) now
    except FileNotFoundError:
        ipr.close()
        raise NetnsNotFoundError(
            errno.ENOENT, f"network namespace {netns!r} does not exist"
        ) from None
    return ipr


@dataclass(frozen=True)
class NetlinkPort:
    """One HCA port whose health is the carrier of ``netdev`` (RoCE: the PF netdev or the
    bond; IPoIB: ``ib0``...). ``port`` is 1-based as in sysfs."""

    hca: str
    port: int
    netdev: str
    link_layer: LinkLayer = LinkLayer.ETHERNET
    #: a bond device's member netdevs: each one's carrier is read too (``members``)
    members: tuple[str, ...] = ()


class NetlinkPortSource:
    """A :class:`~linkguard.drivers.base.PortSource` over rtnetlink link state.

    Each observation: ``carrier`` = IFF_LOWER_UP, ``state`` = ACTIVE when carrier and IFF_UP
    are both set, else DOWN; ``phys_state`` and ``rate_gbps`` None (rtnetlink carries neither);
    ``link_layer`` and ``netdev`` from the config; ``carrier_changes`` = IFLA_CARRIER_CHANGES
    (None when the kernel does not send it); a port with ``members`` gets ``members`` =
    each member's carrier (None: not found), read from the same messages.
    A netdev missing from the namespace gives
    ``state``/``carrier`` None and the error ``netdev <name> not found``; it is reported again
    when it appears (RTM_NEWLINK) or disappears (RTM_DELLINK, or renamed away).

    ``netns`` is a name under /run/netns or a path (``/proc/<pid>/ns/net``); None is the
    current namespace. ``watch()`` raises :class:`NetnsNotFoundError` for a missing namespace.
    ``rcvbuf`` (bytes) sizes the event socket; tests shrink it to force an overflow.
    :attr:`overflows` counts socket overflows (each one followed by a full re-dump).
    """

    def __init__(
        self,
        *,
        ports: Sequence[NetlinkPort],
        netns: str | None = None,
        rcvbuf: int = DEFAULT_RCVBUF,
    ) -> None:
        keys = [(p.hca, p.port) for p in ports]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate (hca, port) in ports")
        self.ports: tuple[NetlinkPort, ...] = tuple(ports)
        self.netns = netns
        self.rcvbuf = rcvbuf
        self.overflows = 0
        #: every netdev read (a port's own and its members) -> the ports it is part of
        self._by_netdev: dict[str, list[NetlinkPort]] = {}
        for p in self.ports:
            for dev in dict.fromkeys((p.netdev, *p.members)):
                self._by_netdev.setdefault(dev, []).append(p)

    # -- reading --------------------------------------------------------------------------

    def _observe(
        self, changed: Iterable[str], links: dict[str, Any | None], now: float
    ) -> list[PortObservation]:
        """Observations of the ports on the ``changed`` netdevs, from the latest ifinfmsg of
        each netdev in ``links`` (None or missing: the netdev is absent)."""
        ports = dict.fromkeys(p for dev in changed for p in self._by_netdev.get(dev, ()))
        return [self._port_observation(p, links, now) for p in ports]

    def _port_observation(
        self, p: NetlinkPort, links: dict[str, Any | None], now: float
    ) -> PortObservation:
        msg = links.get(p.netdev)
        members = (
            {m: _carrier(links.get(m)) for m in p.members if m != p.netdev} if p.members else None
        )
        if msg is None:
            return PortObservation(
                hca=p.hca,
                port=p.port,
                monotonic=now,
                link_layer=p.link_layer,
                netdev=p.netdev,
                errors=(f"netdev {p.netdev} not found",),
                present=False,
                members=members,
            )
        flags = int(msg["flags"])
        carrier = bool(flags & IFF_LOWER_UP)
        up = carrier and bool(flags & IFF_UP)
        changes = msg.get_attr("IFLA_CARRIER_CHANGES")
        return PortObservation(
            hca=p.hca,
            port=p.port,
            monotonic=now,
            link_layer=p.link_layer,
            state=PortStateName.ACTIVE if up else PortStateName.DOWN,
            netdev=p.netdev,
            carrier=carrier,
            carrier_changes=int(changes) if isinstance(changes, int) else None,
            members=members,
        )

    # -- the source -----------------------------------------------------------------------

    async def watch(self) -> AsyncGenerator[list[PortObservation], None]:
        """Snapshot of every configured port, then lists of the ports whose reading changed.

        Runs until cancelled. Raises :class:`NetnsNotFoundError` if the namespace is missing.
        After an ENOBUFS overflow it reopens the socket, re-dumps and yields the differences.
        """
        last: dict[tuple[str, int], PortObservation] = {}
        first = True
        while True:
            ipr = open_iproute(self.netns, rcvbuf=self.rcvbuf)
            try:
                # subscribe before the dump: an event that races the dump is seen afterwards
                await ipr.bind(groups=RTMGRP_LINK)
                index_of: dict[str, int] = {}  # tracked netdev -> ifindex while it exists
                try:
                    async with asyncio.timeout(DUMP_TIMEOUT_S):
                        links = {
                            m.get("ifname"): m
                            async for m in await ipr.link("dump")
                            if m.get("ifname") in self._by_netdev
                        }
                except (OSError, TimeoutError) as exc:
                    if not _is_overflow(exc):
                        raise
                    self._overflowed(exc, during="dump")
                    continue
                now = time.monotonic()
                for netdev, msg in links.items():
                    index_of[netdev] = msg["index"]
                batch = _changes(self._observe(self._by_netdev, links, now), last)
                if first or batch:
                    log.info(
                        "netlink_snapshot" if first else "netlink_resync",
                        netns=self.netns,
                        ports=len(self.ports),
                        changed=len(batch),
                        missing=sorted(d for d in self._by_netdev if d not in index_of),
                    )
                    first = False
                    yield batch
                async for batch in self._events(ipr, index_of, last, links):
                    yield batch
            finally:
                ipr.close()

    async def _events(
        self,
        ipr: AsyncIPRoute,
        index_of: dict[str, int],
        last: dict[tuple[str, int], PortObservation],
        links: dict[str, Any | None],
    ) -> AsyncGenerator[list[PortObservation], None]:
        """Link events until the socket overflows (then returns, so the caller re-dumps).
        ``links``: the latest message of each tracked netdev (updated here)."""
        while True:
            try:
                msgs = [m async for m in ipr.get()]
            except OSError as exc:
                if not _is_overflow(exc):
                    raise
                self._overflowed(exc, during="events")
                return
            now = time.monotonic()
            current: dict[str, Any | None] = {}  # netdev -> latest msg (None: gone)
            for msg in msgs:
                event = msg.get("event")
                if event not in ("RTM_NEWLINK", "RTM_DELLINK"):
                    continue
                name, index = msg.get("ifname"), msg.get("index")
                # a tracked netdev renamed away or deleted: identified by its ifindex
                for netdev, idx in list(index_of.items()):
                    if idx == index and (event == "RTM_DELLINK" or name != netdev):
                        del index_of[netdev]
                        current[netdev] = None
                if name in self._by_netdev:
                    if event == "RTM_NEWLINK":
                        index_of[name] = index
                        current[name] = msg
                    elif index_of.get(name) in (None, index):
                        index_of.pop(name, None)
                        current[name] = None
            links.update(current)
            batch = _changes(self._observe(current, links, now), last)
            if batch:
                for o in batch:
                    log.info(
                        "netlink_port_change",
                        netns=self.netns,
                        port=o.key,
                        netdev=o.netdev,
                        carrier=o.carrier,
                        carrier_changes=o.carrier_changes,
                        members=dict(o.members) if o.members is not None else None,
                        state=o.state,
                        errors=list(o.errors) or None,
                    )
                yield batch

    def _overflowed(self, exc: BaseException, *, during: str) -> None:
        self.overflows += 1
        log.warning(
            "netlink_overflow",
            netns=self.netns,
            during=during,
            error=str(exc) or type(exc).__name__,
            overflows=self.overflows,
            action="reopen and re-dump",
        )


def _carrier(msg: Any | None) -> bool | None:
    """IFF_LOWER_UP of an ifinfmsg; None for an absent netdev."""
    return None if msg is None else bool(int(msg["flags"]) & IFF_LOWER_UP)


def _is_overflow(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or getattr(exc, "errno", None) == errno.ENOBUFS


def _changes(
    batch: list[PortObservation], last: dict[tuple[str, int], PortObservation]
) -> list[PortObservation]:
    """The observations of ``batch`` that differ from ``last`` (which is updated)."""
    out = []
    for o in batch:
        key = (o.hca, o.port)
        if not o.same_reading(last.get(key)):
            last[key] = o
            out.append(o)
    return out
