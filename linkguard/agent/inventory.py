"""Build this host's inventory: which HCA port serves which rail.

Rail index comes from the config when given, else from PCI address order of the discovered
HCAs (the order the PCIe topology fixes, identical on every host of a homogeneous fleet).
Only when a rail port has no PCI address (a copied tree, a VM without the ``device`` link)
are the rails ordered by natural device-name order (``mlx5_0 < mlx5_1 < mlx5_4 < mlx5_10``),
logged once as ``rails_ordered_by_name`` with how to pin them (``ports:``): a name can be
another rail after a firmware or driver change, a PCI address cannot.

Bonds (docs/operations.md "Device naming and link kinds"): an RDMA device is a bond device
when its name is ``<driver>_bond_<n>`` (mlx5 RoCE LAG) or its netdev is a bond master; a
port whose netdev is enslaved to a bond but that is no bond device is a LAG
misconfiguration (:func:`lag_problems`): never a rail of its own.

The host layout (which GPU sits near which HCA: PCIe switch, NUMA node; :mod:`linkguard.layout`)
is added by :func:`read_host_layout` + :func:`with_layout`, once at agent start: from the NCCL
topology file when the config names one, else from the PCI sysfs tree next to the IB driver's.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog
from pydantic import ValidationError

from linkguard.config import PortConfig
from linkguard.drivers.pci import read_pci_layout
from linkguard.layout import LayoutError, annotate_inventory, load_nccl_topo
from linkguard.models import HCAInfo, HostInventory, LinkLayer

__all__ = [
    "DiscoveredPort",
    "InventoryError",
    "build_inventory",
    "compute_ports",
    "is_bond",
    "lag_problems",
    "natural_key",
    "pci_root",
    "read_host_layout",
    "with_layout",
]


log = structlog.get_logger(__name__)

#: an RDMA LAG device's name: mlx5 names the device of a RoCE LAG ``mlx5_bond_<n>``
#: (drivers/infiniband/hw/mlx5/main.c, ``name = lag ? "mlx5_bond_%d" : "mlx5_%d"``)
_BOND_NAME = re.compile(r"_bond_\d+$")


class InventoryError(ValueError):
    """The configured and discovered ports cannot form a valid inventory."""


@dataclass(frozen=True)
class DiscoveredPort:
    """One port found in sysfs. ``bond_netdev``: its netdev is a bond master
    (``bonding/`` in the net class); ``members``: that bond's member netdevs; ``master``: the
    bond its netdev is enslaved to (None: none). :mod:`linkguard.drivers.netclass`."""

    hca: str
    port: int
    link_layer: LinkLayer | None = None
    pci_address: str | None = None
    numa_node: int | None = None
    netdev: str | None = None
    bond_netdev: bool = False
    members: tuple[str, ...] = ()
    master: str | None = None


def is_bond(d: DiscoveredPort) -> bool:
    """A bond device: named ``*_bond_<n>`` (mlx5 RoCE LAG) or its netdev is a bond master."""
    return d.bond_netdev or bool(_BOND_NAME.search(d.hca))


def _enslaved(d: DiscoveredPort) -> bool:
    return d.master is not None and not is_bond(d)


def lag_problems(discovered: Sequence[DiscoveredPort]) -> list[str]:
    """One line per port whose netdev is enslaved to a bond but that is no bond device (the
    RoCE LAG did not form: both the bond's members and their RDMA devices are visible, so
    RDMA traffic would bypass the bond): ``"mlx5_2/1: netdev ens2 is a member of bond0, but
    mlx5_2 is no bond device (RoCE LAG not active): not a rail"``."""
    return [
        f"{d.hca}/{d.port}: netdev {d.netdev} is a member of {d.master}, but {d.hca} is no "
        "bond device (RoCE LAG not active): not a rail"
        for d in discovered
        if _enslaved(d)
    ]


def natural_key(hca: str, port: int) -> tuple[tuple[int, object], ...]:
    """Natural order of ``hca`` then ``port``: ``mlx5_4`` < ``mlx5_10`` (digits as numbers)."""
    parts = [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", hca) if t]
    return (*parts, (0, port))


def _pci_key(p: DiscoveredPort) -> tuple[int, tuple[int, ...], str, int]:
    """Sort key: PCI domain:bus:device.function numerically; ports without one go last."""
    if p.pci_address is None:
        return (1, (), p.hca, p.port)
    try:
        dom, bus, devfn = p.pci_address.split(":")
        dev, fn = devfn.split(".")
        return (0, (int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)), p.hca, p.port)
    except ValueError:
        return (1, (), p.hca, p.port)


def compute_ports(discovered: Sequence[DiscoveredPort]) -> list[DiscoveredPort]:
    """The ports that are rails when the config names none: the InfiniBand ports when there
    are any (an H100 node's Ethernet bond, ``mlx5_bond_0``, is its storage/in-band NIC, not a
    rail), else all (a RoCE fabric, where a bond device is a rail: its health is the bond's
    and its members'). A port enslaved to a bond without being a bond device
    (:func:`lag_problems`) is never a rail."""
    ports = [d for d in discovered if not _enslaved(d)]
    ib = [d for d in ports if d.link_layer == LinkLayer.INFINIBAND]
    return ib or ports


def build_inventory(
    host: str,
    *,
    configured: Sequence[PortConfig] = (),
    discovered: Sequence[DiscoveredPort] = (),
    endpoints: Sequence[ipaddress.IPv4Address] = (),
    default_link_layer: LinkLayer = LinkLayer.INFINIBAND,
) -> HostInventory:
    """Merge config and discovery into a :class:`HostInventory`.

    With ``configured`` ports, exactly those are used (discovery only fills PCI address, NUMA
    node, link layer and netdev they leave open); ports without a rail get the next free rails
    in PCI order. Without config, the :func:`compute_ports` are the rails, in PCI address order.
    When a port to be ranked has no PCI address, all of them are ranked in natural name
    order instead (:func:`natural_key`), logged once per call as ``rails_ordered_by_name``.
    Raises :class:`InventoryError` on duplicate rails/ports.
    """
    found = {(d.hca, d.port): d for d in discovered}
    entries: list[tuple[PortConfig | None, DiscoveredPort]]
    if configured:
        entries = []
        for pc in configured:
            d = found.get((pc.hca, pc.port), DiscoveredPort(pc.hca, pc.port))
            entries.append((pc, d))
    else:
        entries = [(None, d) for d in compute_ports(discovered)]
    taken = {c.rail for c, _ in entries if c is not None and c.rail is not None}
    free = (r for r in range(64) if r not in taken)
    unranked = sorted((d for c, d in entries if c is None or c.rail is None), key=_pci_key)
    no_pci = [f"{d.hca}/{d.port}" for d in unranked if _pci_key(d)[0] == 1]
    if no_pci:
        unranked.sort(key=lambda d: natural_key(d.hca, d.port))
        log.warning(
            "rails_ordered_by_name",
            host=host,
            no_pci_address=no_pci[:64],
            order=[f"{d.hca}/{d.port}" for d in unranked][:64],
            hint="no PCI address (no `device` link in sysfs): rails follow the device names, "
            "which a driver or firmware change can renumber; pin them with ports: "
            "[{hca: mlx5_0, rail: 0}, ...] in the agent config",
        )
    auto = {(d.hca, d.port): next(free) for d in unranked}
    hcas: list[HCAInfo] = []
    for c, d in entries:
        rail = c.rail if c is not None and c.rail is not None else auto[(d.hca, d.port)]
        try:
            hcas.append(
                HCAInfo(
                    hca=d.hca,
                    port=d.port,
                    rail=rail,
                    link_layer=(c.link_layer if c and c.link_layer else d.link_layer)
                    or default_link_layer,
                    netdev=(c.netdev if c and c.netdev else d.netdev),
                    pci_address=d.pci_address,
                    numa_node=(c.numa_node if c and c.numa_node is not None else d.numa_node),
                    address=c.address if c else None,
                )
            )
        except ValueError as exc:
            raise InventoryError(f"port {d.hca}/{d.port}: {_brief(exc)}") from None
    hcas.sort(key=lambda h: h.rail)
    try:
        return HostInventory(host=host, hcas=hcas, endpoints=list(endpoints))
    except ValueError as exc:
        raise InventoryError(f"inventory of {host!r}: {_brief(exc)}") from None


def _brief(exc: ValueError) -> str:
    """One line per problem, without pydantic's banner and documentation links."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            (f"{'.'.join(str(p) for p in e['loc'])}: " if e["loc"] else "")
            + e["msg"].removeprefix("Value error, ")
            for e in exc.errors()[:5]
        )
    return str(exc)


# --------------------------------------------------------------------------------------------
# host layout


def pci_root(sysfs_root: Path) -> Path | None:
    """The sysfs mount the PCI tree is read under (``<root>/bus/pci/devices``), from the IB
    driver's ``sysfs_root``: ``/sys`` for ``/sys/class/infiniband`` (any ``X/class/infiniband``
    gives X); None for any other path (a copied tree of the IB class alone has no PCI tree)."""
    if sysfs_root.name == "infiniband" and sysfs_root.parent.name == "class":
        return sysfs_root.parent.parent
    return None


def read_host_layout(*, nccl_topo_file: Path | None, sysfs: Path | None):
    """This host's :class:`~linkguard.layout.HostLayout`: from ``nccl_topo_file`` when given
    (:func:`~linkguard.layout.load_nccl_topo`), else from the PCI tree under ``sysfs``
    (:func:`~linkguard.drivers.pci.read_pci_layout`) when it has a ``bus/pci/devices``, else
    None. Blocking file I/O (run it off
    the event loop). Raises :class:`~linkguard.layout.LayoutError` for an NCCL file that cannot
    be used; a bad sysfs value never raises (it is one of the layout's ``problems``)."""
    if nccl_topo_file is not None:
        return load_nccl_topo(nccl_topo_file)
    if sysfs is None or not (sysfs / "bus" / "pci" / "devices").is_dir():
        return None
    return read_pci_layout(sysfs)


def with_layout(inv: HostInventory, layout) -> tuple[HostInventory, str | None]:
    """``(inventory annotated with layout, None)`` (:func:`~linkguard.layout.annotate_inventory`:
    ``pcie_switch`` per HCA, ``gpu_pcie_switch``, NUMA nodes left open), or ``(inv, why)`` with
    ``inv`` unchanged when the layout has nothing for this host (no GPU and no HCA of the
    inventory) or does not fit it (:class:`~linkguard.layout.LayoutError`). Never raises."""
    if layout is None:
        return inv, "no layout source: no nccl_topo_file, no PCI sysfs tree"
    names = {h.hca for h in inv.hcas}
    bdfs = {(h.pci_address or "").lower() for h in inv.hcas} - {""}
    known = [n for n in layout.nics if n.name in names or n.bdf in bdfs]
    if not layout.gpus and not known:
        return inv, f"{layout.source or 'layout'}: no GPU and none of the host's HCAs found"
    try:
        return annotate_inventory(inv, layout), None
    except LayoutError as exc:
        return inv, str(exc)
