"""Host layout: which GPU sits near which NIC (PCIe switch, NUMA node), and the NCCL topology
file reader.

Consumes: an NCCL topology file (the XML that ``NCCL_TOPO_FILE`` names, :func:`load_nccl_topo`,
:func:`parse_nccl_topo`) or a PCI sysfs tree (read by :mod:`linkguard.drivers.pci`, which builds
the same :class:`HostLayout`). Produces: a :class:`HostLayout` (GPUs and NICs, each with PCI bus
id, NUMA node and PCIe switch id), its affinity order (:meth:`HostLayout.nearest_nics`: same PCIe
switch, then same NUMA node, then any), and :func:`annotate_inventory`, which copies switch ids
and NUMA nodes into a :class:`~linkguard.models.HostInventory` for the fabric file and the
solver. Pure: no I/O except :func:`load_nccl_topo` reading its one file.

The switch id of a device is the bus id of the outermost PCIe bridge above it below the root
port: in sysfs the first bridge after the root port in the device's path, in an NCCL file the
outermost ``<pci>`` element enclosing it (NCCL writes each switch as one ``<pci class=0x0604..>``
element, root and downstream ports left out). Two devices with equal switch ids reach each other
without crossing a CPU's root complex (NCCL's ``PIX``/``PXB``); the deepest bridge they share
(:func:`common_bridge`) tells nested switches apart.

NCCL topology XML (as NCCL's ``src/graph/xml.cc`` writes and reads it, and the vendor files in
``aws-ofi-nccl/topology``): ``<system version="1">`` > ``<cpu numaid=N ...>`` > ``<pci busid=
class=...>`` (nested for switches) > ``<gpu dev=...>`` or ``<nic>`` > ``<net name=... dev=...
port=...>``. A ``<pci>`` with no ``<gpu>``/``<nic>`` child is classified by its ``class``
attribute alone (the p4d file lists bare GPUs ``0x030200`` and NICs ``0x020000``).
"""

from __future__ import annotations

import enum
import re
from pathlib import Path
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree as SafeET
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from linkguard.models import HostInventory

__all__ = [
    "BDF",
    "GPU",
    "MAX_TOPO_BYTES",
    "NIC",
    "Affinity",
    "HostLayout",
    "LayoutError",
    "annotate_inventory",
    "common_bridge",
    "is_gpu_class",
    "is_nic_class",
    "load_nccl_topo",
    "parse_nccl_topo",
]

#: Largest NCCL topology file read (bytes). Real ones are ~4 KB (p4d) to ~10 KB (p5, 8 GPUs and
#: 32 NICs); a host with 64 GPUs and 256 NICs stays under 200 KB.
MAX_TOPO_BYTES = 1 << 20

#: Deepest ``<pci>`` nesting accepted: a PCIe hierarchy under one root port is a few switches deep
#: (two-level switch trees at most on current GPU servers); deeper means a broken or hostile file.
MAX_PCI_DEPTH = 16

#: PCI vendor ids whose VGA-class (0x0300xx) functions are GPUs (NVIDIA, AMD); other VGA
#: functions are a BMC's or a CPU's graphics (ASPEED 0x1a03, Matrox 0x102b, Intel 0x8086).
GPU_VGA_VENDORS = frozenset({0x10DE, 0x1002})

#: A PCI bus id, ``domain:bus:device.function`` in hex (lower case), as sysfs names devices and
#: NCCL writes ``busid``; domains can have more than 4 digits (Intel VMD: ``10000:00:00.0``).
BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")


class LayoutError(ValueError):
    """A host layout source that cannot be used (malformed or hostile NCCL topology XML, an
    unknown GPU/NIC asked of a layout); the message names the source and the element."""


class Affinity(enum.IntEnum):
    """How near a NIC is to a GPU, nearest first (the solver's order for alternates)."""

    SWITCH = 0  #: same PCIe switch (NCCL PIX/PXB): GPUDirect RDMA without the root complex
    NUMA = 1  #: same NUMA node (NCCL PHB/NODE): through the CPU's root complex
    ANY = 2  #: another NUMA node or unknown (NCCL SYS): over the inter-socket link


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Device(_Model):
    bdf: str | None = Field(None, description="PCI bus id, 0000:4f:00.0 (lower case)")
    numa: int | None = Field(None, ge=0, le=1023, description="NUMA node; None = unknown")
    switch: str | None = Field(None, description="PCIe switch id (module docstring); None = none")
    bridges: tuple[str, ...] = Field(
        (),
        description="bus ids of the bridges above the device below the root port, outermost first",
    )


class GPU(_Device):
    """One GPU. ``index``: NCCL's ``<gpu dev>``, else the rank in PCI bus-id order (the CUDA
    numbering with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, nvidia-smi's)."""

    index: int = Field(ge=0)


class NIC(_Device):
    """One RDMA NIC (port). ``name``: the RDMA device (``mlx5_0``, ``rdmap79s0``; None when the
    source has none); ``index``: NCCL's ``<net dev>``, else the rank in PCI bus-id order."""

    index: int = Field(ge=0)
    name: str | None = None
    port: int | None = Field(None, ge=1, le=255)


def common_bridge(a: _Device, b: _Device) -> str | None:
    """The deepest bridge both ``a`` and ``b`` sit below (their nearest common PCIe switch
    port), None when they share none (different switches, or not below one)."""
    out = None
    for x, y in zip(a.bridges, b.bridges, strict=False):
        if x != y:
            break
        out = x
    return out


class HostLayout(_Model):
    """The GPUs and RDMA NICs of one host with their PCIe switch and NUMA node.

    ``source``: where it was read (a file path or sysfs root); ``problems``: values that could
    not be read and were taken as unknown (from sysfs; an NCCL file is all or nothing).
    """

    gpus: tuple[GPU, ...] = ()
    nics: tuple[NIC, ...] = ()
    source: str = ""
    problems: tuple[str, ...] = ()

    def gpu(self, which: int | str) -> GPU:
        """The GPU of index ``which`` (int) or bus id ``which`` (str); :class:`LayoutError`
        if none."""
        for g in self.gpus:
            if (g.index == which) if isinstance(which, int) else (g.bdf == which.lower()):
                return g
        raise LayoutError(f"{self.source or 'layout'}: no GPU {which!r}")

    def nic(self, which: str) -> NIC:
        """The NIC named ``which`` (RDMA device name) or with bus id ``which``;
        :class:`LayoutError` if none."""
        for n in self.nics:
            if which in (n.name, n.bdf):
                return n
        raise LayoutError(f"{self.source or 'layout'}: no NIC {which!r}")

    def affinity(self, gpu: GPU, nic: NIC) -> Affinity:
        """:attr:`Affinity.SWITCH` when both have the same switch id, else
        :attr:`Affinity.NUMA` when both have the same known NUMA node, else :attr:`Affinity.ANY`."""
        if gpu.switch is not None and gpu.switch == nic.switch:
            return Affinity.SWITCH
        if gpu.numa is not None and gpu.numa == nic.numa:
            return Affinity.NUMA
        return Affinity.ANY

    def nearest_nics(self, gpu: int | str | GPU) -> list[NIC]:
        """Every NIC, nearest to ``gpu`` (index, bus id or :class:`GPU`) first: by
        :meth:`affinity` (same PCIe switch, same NUMA node, any), within one switch the deeper
        common bridge first (nested switches), then by NIC index. :class:`LayoutError` for an
        unknown GPU."""
        g = gpu if isinstance(gpu, GPU) else self.gpu(gpu)

        def key(n: NIC) -> tuple[int, int, int]:
            common = common_bridge(g, n)
            depth = g.bridges.index(common) + 1 if common is not None else 0
            return (int(self.affinity(g, n)), -depth, n.index)

        return sorted(self.nics, key=key)

    def local_nics(self, gpu: int | str | GPU) -> list[NIC]:
        """The NICs of the nearest :class:`Affinity` tier ``gpu`` has any in (all NICs on its
        switch; else those on its NUMA node; else all), in :meth:`nearest_nics` order."""
        ordered = self.nearest_nics(gpu)
        if not ordered:
            return []
        g = gpu if isinstance(gpu, GPU) else self.gpu(gpu)
        best = self.affinity(g, ordered[0])
        return [n for n in ordered if self.affinity(g, n) == best]


# --------------------------------------------------------------------------------------------
# PCI classes


def is_gpu_class(pci_class: int, vendor: int | None = None) -> bool:
    """A GPU by PCI class code (24 bits, ``0x030200``): a 3D controller (0x0302xx), or a VGA
    controller (0x0300xx) of a GPU vendor (:data:`GPU_VGA_VENDORS`; unknown vendor: no)."""
    base = pci_class >> 8
    return base == 0x0302 or (base == 0x0300 and vendor in GPU_VGA_VENDORS)


def is_nic_class(pci_class: int) -> bool:
    """A network controller that can carry RDMA: InfiniBand (0x0207xx) or Ethernet (0x0200xx,
    RoCE/EFA; from sysfs only with an RDMA device, see :mod:`linkguard.drivers.pci`)."""
    return (pci_class >> 8) in (0x0207, 0x0200)


# --------------------------------------------------------------------------------------------
# NCCL topology XML


def load_nccl_topo(path: str | Path) -> HostLayout:
    """Read an NCCL topology file (``NCCL_TOPO_FILE``); see :func:`parse_nccl_topo`.
    :class:`LayoutError` naming ``path`` when it cannot be read, is larger than
    :data:`MAX_TOPO_BYTES`, or does not parse."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = f.read(MAX_TOPO_BYTES + 1)
    except OSError as exc:
        raise LayoutError(f"{p}: cannot read NCCL topology file: {exc}") from exc
    return parse_nccl_topo(data, source=str(p))


def parse_nccl_topo(data: str | bytes, *, source: str = "<nccl topo>") -> HostLayout:
    """The :class:`HostLayout` of an NCCL topology XML document (module docstring for the
    format).

    GPUs: ``<pci>`` elements with a ``<gpu>`` child (index = its ``dev``) or, childless, a GPU
    class (:func:`is_gpu_class`; index = order in the file). NICs: each ``<net>`` of a ``<nic>``
    (name, ``dev`` as index, ``port``), or a childless ``<pci>`` of a NIC class (no name; index =
    order). Bus id = the enclosing ``<pci busid>``; NUMA node = the enclosing ``<cpu numaid>``
    (negative: unknown); switch = the outermost enclosing ``<pci>`` bridge.

    Raises :class:`LayoutError` naming ``source`` for: more than :data:`MAX_TOPO_BYTES`, XML
    that does not parse, any DTD or entity declaration (no entity expansion, no external
    references: defusedxml), a root other than ``<system>``, nesting deeper than
    :data:`MAX_PCI_DEPTH`, a non-integer ``numaid``/``dev``/``port``/``class``, GPUs with and
    without ``dev`` mixed, or duplicate GPU/NIC indices.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if len(raw) > MAX_TOPO_BYTES:
        raise LayoutError(f"{source}: larger than {MAX_TOPO_BYTES} bytes: not an NCCL topology")
    try:
        root = SafeET.fromstring(raw, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as exc:
        raise LayoutError(f"{source}: refused: {type(exc).__name__} ({exc})") from None
    except ParseError as exc:
        raise LayoutError(f"{source}: not well-formed XML: {exc}") from None
    if root.tag != "system":
        raise LayoutError(f"{source}: root element is <{root.tag}>, expected <system>")
    walk = _Walk(source)
    for child in root:
        if child.tag == "cpu":
            numa = walk.integer(child, "numaid", base=10)
            if numa is not None and numa > 1023:
                raise LayoutError(f"{source}: <cpu numaid={numa}>: NUMA nodes are 0..1023")
            walk.under(
                child, numa=numa if numa is not None and numa >= 0 else None, stack=(), depth=0
            )
    return walk.layout()


class _Walk:
    """One pass over a ``<system>`` tree collecting GPUs and NICs in document order."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.gpus: list[tuple[int | None, dict]] = []
        self.nics: list[tuple[int | None, dict]] = []

    def where(self, el: Element) -> str:
        busid = el.get("busid") or el.get("name")
        return f"<{el.tag}{f' {busid}' if busid else ''}>"

    def integer(self, el: Element, attr: str, *, base: int = 0) -> int | None:
        text = el.get(attr)
        if text is None:
            return None
        try:
            return int(text.strip(), base)
        except ValueError:
            raise LayoutError(
                f"{self.source}: {self.where(el)} has {attr}={text[:40]!r}, not an integer"
            ) from None

    def under(self, el: Element, *, numa: int | None, stack: tuple[str, ...], depth: int) -> None:
        if depth > MAX_PCI_DEPTH:
            raise LayoutError(
                f"{self.source}: <pci> nested deeper than {MAX_PCI_DEPTH} at {self.where(el)}"
            )
        for child in el:
            if child.tag == "pci":
                self.pci(child, numa=numa, stack=stack, depth=depth + 1)
            elif child.tag == "nic":
                self.nic(child, bdf=None, numa=numa, stack=stack)
            elif child.tag == "cpu":  # NCCL nests none, but a hand-written file might
                raise LayoutError(f"{self.source}: <cpu> inside {self.where(el)}")

    def pci(self, el: Element, *, numa: int | None, stack: tuple[str, ...], depth: int) -> None:
        busid = (el.get("busid") or "").strip().lower() or None
        if busid is not None and not BDF.match(busid):
            raise LayoutError(
                f"{self.source}: <pci busid={busid[:40]!r}> is not a PCI bus id (0000:4f:00.0)"
            )
        cls = self.integer(el, "class")
        vendor = self.integer(el, "vendor")
        kids = [c.tag for c in el]
        if "gpu" in kids:
            for g in el.findall("gpu"):
                self.gpus.append((self.integer(g, "dev", base=10), self.dev(busid, numa, stack)))
        if "nic" in kids:
            for n in el.findall("nic"):
                self.nic(n, bdf=busid, numa=numa, stack=stack)
        if "gpu" in kids or "nic" in kids:
            # NCCL never nests a <pci> in one with a <gpu>/<nic>; a hand-written file may:
            # those devices count too (below this one's bus id, as under a bridge)
            inner = (*stack, busid) if busid else stack
            for c in el.findall("pci"):
                if depth + 1 > MAX_PCI_DEPTH:
                    raise LayoutError(
                        f"{self.source}: <pci> nested deeper than {MAX_PCI_DEPTH} at "
                        f"{self.where(c)}"
                    )
                self.pci(c, numa=numa, stack=inner, depth=depth + 1)
            return
        if "pci" in kids or "cpu" in kids:
            inner = (*stack, busid) if busid else stack
            self.under(el, numa=numa, stack=inner, depth=depth)
        elif cls is not None and is_gpu_class(cls, vendor if vendor is not None else 0x10DE):
            # a bare GPU-class function (the p4d file): vendor attributes are optional in
            # NCCL's files, so a VGA function without one counts as a GPU
            self.gpus.append((None, self.dev(busid, numa, stack)))
        elif cls is not None and is_nic_class(cls):
            self.nics.append((None, {**self.dev(busid, numa, stack), "name": None}))

    def nic(self, el: Element, *, bdf: str | None, numa: int | None, stack: tuple[str, ...]):
        for net in el.findall("net"):
            name = (net.get("name") or "").strip() or None
            fields = {**self.dev(bdf, numa, stack), "name": name, "port": self.integer(net, "port")}
            if fields["port"] is not None and not 1 <= fields["port"] <= 255:
                raise LayoutError(f"{self.source}: {self.where(net)} port {fields['port']}")
            self.nics.append((self.integer(net, "dev", base=10), fields))

    @staticmethod
    def dev(bdf: str | None, numa: int | None, stack: tuple[str, ...]) -> dict:
        return {
            "bdf": bdf,
            "numa": numa,
            "switch": stack[0] if stack else None,
            "bridges": stack,
        }

    def numbered(self, what: str, items: list[tuple[int | None, dict]], cls: type) -> tuple:
        given = [i for i, _ in items if i is not None]
        if given and len(given) != len(items):
            raise LayoutError(
                f"{self.source}: some {what}s have a dev attribute and some do not "
                f"({len(given)} of {len(items)})"
            )
        if len(set(given)) != len(given):
            dup = sorted({i for i in given if given.count(i) > 1})
            raise LayoutError(f"{self.source}: duplicate {what} dev {dup}")
        if any(i < 0 for i in given):
            raise LayoutError(f"{self.source}: negative {what} dev in {sorted(given)}")
        out = [
            cls(index=i if i is not None else k, **fields) for k, (i, fields) in enumerate(items)
        ]
        return tuple(sorted(out, key=lambda d: d.index))

    def layout(self) -> HostLayout:
        try:
            return HostLayout(
                gpus=self.numbered("GPU", self.gpus, GPU),
                nics=self.numbered("NIC", self.nics, NIC),
                source=self.source,
            )
        except ValidationError as exc:  # a value the checks above let through
            raise LayoutError(f"{self.source}: {exc.errors()[0]['msg']}") from None


# --------------------------------------------------------------------------------------------
# into the fabric model


def annotate_inventory(inv: HostInventory, layout: HostLayout) -> HostInventory:
    """``inv`` with PCIe switch ids and NUMA nodes from ``layout``: each HCA matched by PCI
    address (``pci_address`` = NIC bus id), else by name (``hca`` = NIC name), gets the NIC's
    ``pcie_switch`` and, where it has none, its ``numa_node``; GPU g (index = endpoint g) gets
    ``gpu_pcie_switch[g]`` and, where ``gpu_numa`` is empty, ``gpu_numa[g]``. GPUs the layout
    lacks get None; HCAs it lacks are left as they are. Raises :class:`LayoutError` when GPU
    indices of the layout and the inventory's endpoints do not overlap at all (a layout of
    another host type)."""
    by_bdf = {n.bdf: n for n in layout.nics if n.bdf is not None}
    by_name = {n.name: n for n in layout.nics if n.name is not None}
    hcas = []
    for c in inv.hcas:
        n = by_bdf.get((c.pci_address or "").lower()) or by_name.get(c.hca)
        if n is None:
            hcas.append(c)
            continue
        update: dict = {"pcie_switch": n.switch}
        if c.numa_node is None and n.numa is not None:
            update["numa_node"] = n.numa
        hcas.append(c.model_copy(update=update))
    gpus = {g.index: g for g in layout.gpus}
    count = len(inv.endpoints)
    if count and gpus and not any(g in gpus for g in range(count)):
        raise LayoutError(
            f"{layout.source or 'layout'}: GPU indices {sorted(gpus)} do not match host "
            f"{inv.host}'s {count} endpoints"
        )
    update = {
        "hcas": hcas,
        "gpu_pcie_switch": [gpus[g].switch if g in gpus else None for g in range(count)],
    }
    if not inv.gpu_numa:
        update["gpu_numa"] = [gpus[g].numa if g in gpus else None for g in range(count)]
    try:
        return HostInventory.model_validate({**inv.model_dump(), **update})
    except ValueError as exc:
        raise LayoutError(
            f"{layout.source or 'layout'}: cannot annotate {inv.host}: {exc}"
        ) from None
