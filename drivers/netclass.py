"""What ``/sys/class/net`` says of an RDMA device's netdev: whether it is a bond master (and
its members), or enslaved to one. Read at discovery, next to
:mod:`~linkguard.drivers.sysfs_discover`.

Consumes the kernel's net class ABI (Documentation/ABI/testing/sysfs-class-net and
sysfs-class-net-bonding, drivers/net/bonding/bond_sysfs.c):

- ``<net>/<dev>/bonding/slaves``  the members of a bond master, space-separated
  (``"ens1f0np0 ens1f1np1"``); the ``bonding/`` directory exists only on a bond master
- ``<net>/<dev>/master``           symlink to the upper device of an enslaved netdev (its
  basename is the bond's name); absent on a netdev that is no one's member

Produces :class:`NetdevLinks`. Never raises for a bad or missing file: a netdev the tree does
not have is simply neither bond nor member (``NetdevLinks()``), an unreadable ``slaves`` file
is in ``errors``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from linkguard.drivers.sysfs_attrs import Reader, _optional, read_sysfs

__all__ = ["NetdevLinks", "net_root", "read_netdev_links"]

_NETDEV_NAME = re.compile(r"^[A-Za-z0-9_.\-@:]{1,15}$")

#: members read at most (the bonding driver has no limit; a real LAG has 2)
_MAX_MEMBERS = 16


@dataclass(frozen=True)
class NetdevLinks:
    """One netdev's bonding links. ``bond``: it is a bond master (``bonding/`` exists);
    ``members``: its member netdevs in ``bonding/slaves`` order (a bond may have none);
    ``master``: the bond it is enslaved to (the ``master`` link's name), None when none;
    ``errors``: reads that failed."""

    bond: bool = False
    members: tuple[str, ...] = ()
    master: str | None = None
    errors: tuple[str, ...] = ()


def net_root(ib_root: Path) -> Path | None:
    """The net class directory next to an InfiniBand class directory: ``X/class/net`` for
    ``X/class/infiniband`` (``/sys/class/net`` for the default root); None for any other path
    (a copied tree of the IB class alone has no netdevs)."""
    if ib_root.name == "infiniband" and ib_root.parent.name == "class":
        return ib_root.parent / "net"
    return None


def read_netdev_links(root: Path, netdev: str, *, reader: Reader = read_sysfs) -> NetdevLinks:
    """The :class:`NetdevLinks` of ``<root>/<netdev>`` (``root``: a net class directory).
    A netdev name that is not one (``..``, too long) or is absent gives ``NetdevLinks()``."""
    if not _NETDEV_NAME.match(netdev) or netdev in (".", ".."):
        return NetdevLinks()
    root_s, errors = str(root), list[str]()
    bond = os.path.isdir(f"{root_s}/{netdev}/bonding")
    members: tuple[str, ...] = ()
    if bond:
        text = _optional(reader, root_s, f"{netdev}/bonding/slaves", errors) or ""
        members = tuple(n for n in text.split() if _NETDEV_NAME.match(n))[:_MAX_MEMBERS]
    master: str | None = None
    link = f"{root_s}/{netdev}/master"
    if os.path.islink(link):
        try:
            name = os.path.basename(os.readlink(link).rstrip("/"))
        except OSError as exc:
            errors.append(f"{netdev}/master: {exc.strerror or exc}")
        else:
            master = name if _NETDEV_NAME.match(name) else None
    return NetdevLinks(bond=bond, members=members, master=master, errors=tuple(errors))
