"""Discovery of the RDMA devices under ``/sys/class/infiniband``: :class:`HCADescriptor` per HCA
(ports, link layers, PCI address, NUMA node, netdevs, firmware) and a RoCE port's GID table
(:func:`read_gids`). Formats: :mod:`linkguard.drivers.sysfs_ib`. Never raises for a bad file."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from linkguard.drivers.sysfs_attrs import (
    Reader,
    _listdir,
    _optional,
    _parse,
    _short,
    parse_link_layer,
    read_sysfs,
)
from linkguard.models import LinkLayer

DEFAULT_ROOT = Path("/sys/class/infiniband")


_HCA_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


_NETDEV_NAME = re.compile(r"^[A-Za-z0-9_.\-@:]{1,15}$")


_PCI_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


_ZERO_GID = re.compile(r"^[0:]+$")


#: GID table entries read at most (mlx5 RoCE ports have 255; IBA allows up to 2**16)
_MAX_GIDS = 1024


def read_gids(root: Path, hca: str, port: int, *, reader: Reader = read_sysfs) -> dict[int, str]:
    """The non-empty entries of ``<root>/<hca>/ports/<port>/gids/``: index -> GID text
    (lowercased, as the kernel prints it with ``%pI6``). All-zero entries (unused), unreadable
    ones (EINVAL for an index the port does not populate) and non-numeric names are left out;
    at most 1024 entries. A missing ``gids/`` directory gives ``{}``. Never raises."""
    root_s, base = str(root), f"{hca}/ports/{port}/gids"
    ignored: list[str] = []
    names = [n for n in _listdir(f"{root_s}/{base}", base, ignored) if n.isdigit()]
    out: dict[int, str] = {}
    for name in sorted(names, key=int)[:_MAX_GIDS]:
        text = _optional(reader, root_s, f"{base}/{name}", ignored)
        if text and not _ZERO_GID.match(text) and len(text) <= 64:
            out[int(name)] = text.lower()
    return out


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class HCADescriptor:
    """One RDMA device under the class directory (static facts, re-read on re-discovery).

    ``ports`` are 1-based port numbers (``ports/<n>``). ``pci_address`` is the PCI BDF
    (``0000:18:00.0``) found in the resolved ``device`` symlink (None when there is no symlink or
    no PCI parent, e.g. rxe/siw). ``numa_node`` is ``device/numa_node`` (-1 -> None). ``netdevs``
    maps port -> netdev name from ``ports/<n>/gid_attrs/ndevs/0`` (RoCE), else from
    ``device/net/*`` (one port: the single name; several: by the netdev's 0-based ``dev_port``).
    ``hca_type`` / ``board_id`` / ``fw_ver`` are None when absent (hfi1, irdma). ``errors`` lists
    attribute reads that failed during discovery.
    """

    hca: str
    ports: tuple[int, ...]
    link_layers: dict[int, LinkLayer | None] = field(default_factory=dict)
    pci_address: str | None = None
    numa_node: int | None = None
    netdevs: dict[int, str] = field(default_factory=dict)
    hca_type: str | None = None
    board_id: str | None = None
    fw_ver: str | None = None
    errors: tuple[str, ...] = ()


def _pci_address(dev_link: str) -> str | None:
    if not os.path.lexists(dev_link):
        return None
    try:
        resolved = os.path.realpath(dev_link)
    except OSError:
        return None
    # the symlink's basename is the BDF for PCI devices; otherwise the nearest PCI ancestor
    for part in reversed(resolved.split("/")):
        if _PCI_BDF.match(part):
            return part.lower()
    return None


def _netdevs(reader: Reader, root: str, hca: str, ports: tuple[int, ...]) -> dict[int, str]:
    out: dict[int, str] = {}
    ignored: list[str] = []  # IB ports fail ndevs/0 with EINVAL: expected, not reported
    for p in ports:
        name = _optional(reader, root, f"{hca}/ports/{p}/gid_attrs/ndevs/0", ignored)
        if name and _NETDEV_NAME.match(name):
            out[p] = name
    missing = [p for p in ports if p not in out]
    if not missing:
        return out
    net_dir = f"{root}/{hca}/device/net"
    names = [n for n in _listdir(net_dir, "", ignored) if _NETDEV_NAME.match(n)]
    if not names:
        return out
    if len(ports) == 1 and len(names) == 1:
        out.setdefault(ports[0], names[0])
        return out
    for n in names:
        dev_port = _optional(reader, root, f"{hca}/device/net/{n}/dev_port", ignored)
        if dev_port is not None and dev_port.isdigit() and int(dev_port) + 1 in missing:
            out.setdefault(int(dev_port) + 1, n)
    return out


def discover_hcas(root: Path = DEFAULT_ROOT, *, reader: Reader = read_sysfs) -> list[HCADescriptor]:
    """Every RDMA device under ``root``, sorted naturally by name (``mlx5_2`` < ``mlx5_10``).

    A missing class directory (RDMA stack not loaded) gives ``[]``. Directory names that are not
    valid HCA names are skipped. Never raises for a bad file.
    """
    root_s = str(root)
    try:
        names = os.listdir(root_s)
    except OSError:
        return []
    out: list[HCADescriptor] = []
    for hca in sorted(names, key=_natural):
        if not _HCA_NAME.match(hca) or not os.path.isdir(f"{root_s}/{hca}"):
            continue
        errors: list[str] = []
        ports = tuple(
            sorted(
                int(p)
                for p in _listdir(f"{root_s}/{hca}/ports", f"{hca}/ports", errors)
                if p.isdigit() and 1 <= int(p) <= 255
            )
        )
        link_layers = {
            p: _parse(reader, root_s, f"{hca}/ports/{p}/link_layer", parse_link_layer, errors)
            for p in ports
        }
        numa: int | None = None
        numa_text = _optional(reader, root_s, f"{hca}/device/numa_node", errors)
        if numa_text is not None:
            try:
                numa = int(numa_text)
            except ValueError:
                errors.append(f"{hca}/device/numa_node: unparsable {_short(numa_text)}")
            if numa is not None and not 0 <= numa <= 1023:
                numa = None  # -1: no NUMA affinity
        out.append(
            HCADescriptor(
                hca=hca,
                ports=ports,
                link_layers=link_layers,
                pci_address=_pci_address(f"{root_s}/{hca}/device"),
                numa_node=numa,
                netdevs=_netdevs(reader, root_s, hca, ports),
                hca_type=_optional(reader, root_s, f"{hca}/hca_type", errors),
                board_id=_optional(reader, root_s, f"{hca}/board_id", errors),
                fw_ver=_optional(reader, root_s, f"{hca}/fw_ver", errors),
                errors=tuple(errors),
            )
        )
    return out
