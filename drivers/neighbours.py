"""Neighbour (ARP) entries of a network namespace: read them, and delete the ones a reroute
left holding packets.

Why: after a reroute, packets already handed to the lost path wait in the neighbour queue of
an unresolved entry on the old netdev, and TCP does not retransmit a segment that is still in
the host's queues (net/ipv4/tcp_output.c, ``skb_still_in_host_queue``): the connection stalls
until the old path answers again. Deleting the entry frees the queued packets, and TCP's next
retransmission takes the new route. Which entries are stale is the applier's decision
(:func:`linkguard.agent.applier.stale_neighbours`); this module only reads and deletes, through
rtnetlink (pyroute2, RTM_GETNEIGH / RTM_DELNEIGH), on the caller's socket.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address
from socket import AF_INET

import structlog

from linkguard.drivers.rtnl import AsyncIPRoute, NetlinkError

__all__ = ["Neighbour", "delete", "dump", "netlink_message"]

log = structlog.get_logger(__name__)

#: Neighbour states (include/uapi/linux/neighbour.h).
NUD_NONE = 0x00
NUD_INCOMPLETE = 0x01
NUD_NOARP = 0x40
NUD_PERMANENT = 0x80


@dataclass(frozen=True)
class Neighbour:
    """One IPv4 neighbour (ARP) entry: ``address`` on ``netdev``, ``state`` the kernel's NUD_*
    bits (include/uapi/linux/neighbour.h: 0x01 INCOMPLETE, 0x02 REACHABLE, 0x04 STALE, 0x08
    DELAY, 0x10 PROBE, 0x20 FAILED, 0x40 NOARP, 0x80 PERMANENT)."""

    address: IPv4Address
    netdev: str
    state: int

    @property
    def permanent(self) -> bool:
        """Set by hand or by the kernel for good (PERMANENT, NOARP): never deleted here."""
        return bool(self.state & (NUD_PERMANENT | NUD_NOARP))

    @property
    def holds_packets(self) -> bool:
        """Unresolved (INCOMPLETE, or NONE: just created): the one state in which the kernel
        queues packets on the entry instead of sending them (net/core/neighbour.c,
        ``__neigh_event_send``)."""
        return self.state == NUD_NONE or bool(self.state & NUD_INCOMPLETE)


async def dump(
    ipr: AsyncIPRoute, names: Mapping[int, str], netdevs: Iterable[str] | None = None
) -> list[Neighbour]:
    """The IPv4 neighbour entries of ``ipr``'s namespace (of ``netdevs`` only, when given);
    ``names`` maps ifindex to netdev name (an entry of an unknown ifindex is left out)."""
    wanted = None if netdevs is None else set(netdevs)
    out = []
    async for m in await ipr.neigh("dump", family=AF_INET):
        name, dst = names.get(m["ifindex"]), m.get("dst")
        if name is None or dst is None or (wanted is not None and name not in wanted):
            continue
        out.append(Neighbour(IPv4Address(dst), name, m["state"]))
    return out


async def delete(
    ipr: AsyncIPRoute,
    names: Mapping[int, str],
    entries: Iterable[Neighbour],
    netns: str | None = None,
) -> int:
    """Delete ``entries`` (``ip neigh del ADDR dev NETDEV``), never a permanent one nor one on
    a netdev ``names`` does not know; one already gone (ENOENT) is not an error. Returns how
    many were deleted; other refusals are logged (``neighbour_delete_failed``), never raised."""
    index = {name: idx for idx, name in names.items()}
    deleted = 0
    for n in entries:
        if n.permanent or n.netdev not in index:
            continue
        try:
            await ipr.neigh("del", dst=str(n.address), ifindex=index[n.netdev], family=AF_INET)
        except NetlinkError as exc:
            if exc.code != errno.ENOENT:
                log.warning(
                    "neighbour_delete_failed",
                    netns=netns,
                    address=str(n.address),
                    netdev=n.netdev,
                    error=netlink_message(exc),
                )
            continue
        deleted += 1
    return deleted


def netlink_message(exc: NetlinkError) -> str:
    """``exc`` as ``"<kernel's message> (errno N)"``."""
    return f"{exc.args[1] if len(exc.args) > 1 else exc} (errno {exc.code})"
