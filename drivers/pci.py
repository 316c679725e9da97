"""The PCI sysfs driver: the host layout (GPUs, RDMA NICs, PCIe switches, NUMA nodes) from
``/sys/bus/pci/devices``.

Consumes the kernel's PCI sysfs ABI (Documentation/ABI/testing/sysfs-bus-pci), per function
``<root>/bus/pci/devices/<bdf>``, a symlink to its place in the device tree, e.g.
``../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0`` (host bridge
``pci0000:00``, root port ``0000:00:01.0``, switch upstream port ``0000:01:00.0``, switch
downstream port ``0000:02:08.0``, the device):

- ``class``      ``0x030200`` (24-bit class code: base, sub-class, prog-if)
- ``vendor``     ``0x10de``
- ``numa_node``  decimal, ``-1`` when the platform gives no affinity
- ``infiniband/<name>``  the RDMA device of the function (``mlx5_0``, ``rdmap79s0`` for EFA)
- ``physfn``     present on an SR-IOV virtual function (left out: a VF is not a rail)

Produces a :class:`~linkguard.layout.HostLayout` (:func:`read_pci_layout`): GPUs (class 0x0302xx,
or 0x0300xx of a GPU vendor) and RDMA NICs (class 0x0207xx InfiniBand; 0x0200xx Ethernet only with
an ``infiniband/`` entry, i.e. RoCE/EFA, not the management NIC), each with its bus id, NUMA node,
the bridges above it below the root port (outermost first) and its switch id (the outermost of
those; see :mod:`linkguard.layout`). GPUs and NICs are each indexed in PCI bus-id order.

Bad input: any file may be missing, unreadable or garbage, and a device link may not resolve.
A bad value becomes unknown (NUMA None, no bridges/switch, no name), the device is kept, the
problem goes to ``HostLayout.problems`` and is logged once per process. A function whose
``class`` cannot be read is left out (it cannot be told apart from a disk). Nothing here raises.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import structlog

from linkguard.drivers.sysfs_ib import read_sysfs
from linkguard.layout import BDF, GPU, NIC, HostLayout, is_gpu_class, is_nic_class

__all__ = ["DEFAULT_SYSFS", "read_pci_layout"]

log = structlog.get_logger(__name__)

DEFAULT_SYSFS = Path("/sys")

#: A PCI host bridge's directory in the device tree: ``pci<domain>:<bus>``.
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")

#: Problems already logged (bounded: a host has a few hundred PCI functions at most).
_logged: set[str] = set()
_LOG_LIMIT = 4096


def _note(problems: list[str], problem: str) -> None:
    problems.append(problem)
    if problem not in _logged and len(_logged) < _LOG_LIMIT:
        _logged.add(problem)
        log.warning("pci_bad_value", problem=problem)


def _read(path: str, what: str, problems: list[str], *, required: bool = True) -> str | None:
    try:
        text = read_sysfs(path).strip()
    except FileNotFoundError:
        if required:
            _note(problems, f"{what}: missing")
        return None
    except OSError as exc:
        _note(problems, f"{what}: {exc.strerror or exc}")
        return None
    if not text:
        _note(problems, f"{what}: empty")
        return None
    return text


def _hex(text: str | None, what: str, problems: list[str]) -> int | None:
    if text is None:
        return None
    try:
        return int(text, 16)
    except ValueError:
        _note(problems, f"{what}: unparsable {text[:40]!r}")
        return None


def _numa(path: str, what: str, problems: list[str]) -> int | None:
    text = _read(path, what, problems)
    if text is None:
        return None
    try:
        v = int(text)
    except ValueError:
        _note(problems, f"{what}: unparsable {text[:40]!r}")
        return None
    return v if 0 <= v <= 1023 else None  # -1: no affinity given


def _bridges(link: str, bdf: str, what: str, problems: list[str]) -> tuple[str, ...]:
    """The bus ids between the root port and the device (both excluded), from the resolved
    device path; () with a problem noted when it cannot be resolved or has no host bridge."""
    try:
        target = os.path.realpath(link, strict=True)
    except OSError as exc:
        _note(problems, f"{what}: device link does not resolve ({exc.strerror or exc})")
        return ()
    parts = Path(target).parts
    starts = [i for i, p in enumerate(parts) if _HOST_BRIDGE.match(p)]
    if not starts or parts[-1] != bdf:
        _note(problems, f"{what}: device path {target[-120:]!r} is not below a PCI host bridge")
        return ()
    chain = parts[starts[-1] + 1 : -1]
    if not all(BDF.match(p) for p in chain):
        _note(problems, f"{what}: unexpected element in device path {target[-120:]!r}")
        return ()
    return tuple(chain[1:])  # chain[0] is the root port


def _rdma_name(path: str, what: str, problems: list[str]) -> str | None:
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        _note(problems, f"{what}: {exc.strerror or exc}")
        return None
    return names[0] if names else None


def _bdf_key(bdf: str) -> tuple[int, ...]:
    dom, bus, devfn = bdf.split(":")
    dev, fn = devfn.split(".")
    return (int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16))


def read_pci_layout(root: str | Path = DEFAULT_SYSFS) -> HostLayout:
    """The GPUs and RDMA NICs under ``<root>/bus/pci/devices`` (module docstring). A missing
    or unreadable devices directory gives an empty layout with the problem noted. Never
    raises for bad sysfs content."""
    problems: list[str] = []
    devices = os.path.join(str(root), "bus", "pci", "devices")
    try:
        entries = sorted((e for e in os.listdir(devices) if BDF.match(e)), key=_bdf_key)
    except OSError as exc:
        _note(problems, f"{devices}: {exc.strerror or exc}")
        entries = []
    gpus: list[dict] = []
    nics: list[dict] = []
    for bdf in entries:
        base = os.path.join(devices, bdf)
        cls = _hex(_read(f"{base}/class", f"{bdf}/class", problems), f"{bdf}/class", problems)
        if cls is None:
            continue
        vendor = None
        if (cls >> 8) == 0x0300:  # VGA: a GPU only from a GPU vendor (not the BMC's)
            what = f"{bdf}/vendor"
            vendor = _hex(_read(f"{base}/vendor", what, problems), what, problems)
        gpu = is_gpu_class(cls, vendor)
        if not gpu and not is_nic_class(cls):
            continue
        if os.path.lexists(f"{base}/physfn"):
            continue  # an SR-IOV virtual function
        name = None
        if not gpu:
            name = _rdma_name(f"{base}/infiniband", f"{bdf}/infiniband", problems)
            if name is None and (cls >> 8) != 0x0207:
                continue  # an Ethernet function without RDMA: not a rail
        bridges = _bridges(base, bdf, bdf, problems)
        fields = {
            "bdf": bdf,
            "numa": _numa(f"{base}/numa_node", f"{bdf}/numa_node", problems),
            "switch": bridges[0] if bridges else None,
            "bridges": bridges,
        }
        if gpu:
            gpus.append(fields)
        else:
            nics.append({**fields, "name": name})
    return HostLayout(
        gpus=tuple(GPU(index=i, **f) for i, f in enumerate(gpus)),
        nics=tuple(NIC(index=i, **f) for i, f in enumerate(nics)),
        source=str(root),
        problems=tuple(problems),
    )
