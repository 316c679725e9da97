"""Renderings of a :class:`~linkguard.layout.HostLayout` for ``linkguard layout``.

Consumes: a HostLayout (from :func:`linkguard.drivers.pci.read_pci_layout` or
:func:`linkguard.layout.load_nccl_topo`). Produces: a plain-text table
(:func:`layout_text`), a JSON-able document (:func:`layout_document`) and the fragment of a
fabric file's host entry that carries the layout (:func:`fabric_fragment`: ``pcie_switch`` and
``numa_node`` per HCA, ``gpu_pcie_switch`` and ``gpu_numa`` per GPU, the field names of
:class:`~linkguard.models.HCAInfo` and :class:`~linkguard.models.HostInventory`). Pure.
"""

from __future__ import annotations

from typing import Any

from linkguard.layout import GPU, NIC, Affinity, HostLayout, LayoutError

#: Most GPUs of a host in a fabric file (``HostInventory.gpu_pcie_switch``'s max_length).
MAX_GPUS = 64

__all__ = ["MAX_GPUS", "fabric_fragment", "layout_document", "layout_text", "nic_label"]


def nic_label(n: NIC) -> str:
    """A NIC as people name it: ``mlx5_0`` (``mlx5_0:2`` for port 2), else its bus id, else
    ``nic<index>``."""
    if n.name:
        return f"{n.name}:{n.port}" if n.port not in (None, 1) else n.name
    return n.bdf or f"nic{n.index}"


def _nearest(layout: HostLayout, g: GPU) -> list[tuple[NIC, Affinity]]:
    return [(n, layout.affinity(g, n)) for n in layout.nearest_nics(g)]


def layout_document(layout: HostLayout) -> dict[str, Any]:
    """``{"source": str, "gpus": [{"index", "bdf", "numa", "pcie_switch", "nearest_nics":
    [{"nic": label, "name", "bdf", "affinity": "switch"|"numa"|"any"}, ...]}], "nics":
    [{"index", "name", "port", "bdf", "numa", "pcie_switch"}], "problems": [str]}``; nearest
    NICs in :meth:`~linkguard.layout.HostLayout.nearest_nics` order, None where unknown."""
    return {
        "source": layout.source,
        "gpus": [
            {
                "index": g.index,
                "bdf": g.bdf,
                "numa": g.numa,
                "pcie_switch": g.switch,
                "nearest_nics": [
                    {"nic": nic_label(n), "name": n.name, "bdf": n.bdf, "affinity": a.name.lower()}
                    for n, a in _nearest(layout, g)
                ],
            }
            for g in layout.gpus
        ],
        "nics": [
            {
                "index": n.index,
                "name": n.name,
                "port": n.port,
                "bdf": n.bdf,
                "numa": n.numa,
                "pcie_switch": n.switch,
            }
            for n in layout.nics
        ],
        "problems": list(layout.problems),
    }


def layout_text(layout: HostLayout) -> str:
    """One line per GPU: index, bus id, NUMA node, PCIe switch, then its NICs nearest first,
    each ``label(affinity)``; ``-`` for unknown values; then the values that could not be
    read, if any."""

    def v(x: object) -> str:
        return "-" if x is None else str(x)

    head = ("GPU", "BDF", "NUMA", "PCIE_SWITCH", "NEAREST_NICS")
    rows = [head] + [
        (
            str(g.index),
            v(g.bdf),
            v(g.numa),
            v(g.switch),
            " ".join(f"{nic_label(n)}({a.name.lower()})" for n, a in _nearest(layout, g)) or "-",
        )
        for g in layout.gpus
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
             for r in rows]  # fmt: skip
    out = [f"# {layout.source}: {len(layout.gpus)} GPU(s), {len(layout.nics)} NIC(s)", *lines]
    out += [f"# unreadable: {p}" for p in layout.problems]
    return "\n".join(line.rstrip() for line in out) + "\n"


def fabric_fragment(layout: HostLayout) -> dict[str, Any]:
    """The layout fields of a fabric file's host entry: ``{"hcas": [{"hca", "port",
    "pci_address", "pcie_switch", "numa_node"}], "gpu_pcie_switch": [...], "gpu_numa":
    [...]}``, HCAs in NIC index order (``hca``/``port`` left out where the source has none: the
    p4d NCCL file lists bare NICs by bus id), list position = GPU index. Merge it into the host's
    entry by HCA name (rails, netdevs and addresses are not the layout's to say).
    :class:`~linkguard.layout.LayoutError` for a GPU index of :data:`MAX_GPUS` or more."""
    hcas = []
    for n in layout.nics:
        entry: dict[str, Any] = {}
        if n.name:
            entry["hca"] = n.name
            entry["port"] = n.port or 1
        entry["pci_address"] = n.bdf
        entry["pcie_switch"] = n.switch
        entry["numa_node"] = n.numa
        hcas.append(entry)
    by_index = {g.index: g for g in layout.gpus}
    count = max(by_index, default=-1) + 1  # positional: a GPU index the source skips is None
    if count > MAX_GPUS:
        raise LayoutError(
            f"{layout.source or 'layout'}: GPU index {count - 1}: a fabric file's host has at "
            f"most {MAX_GPUS} GPUs"
        )
    return {
        "hcas": hcas,
        "gpu_pcie_switch": [by_index[i].switch if i in by_index else None for i in range(count)],
        "gpu_numa": [by_index[i].numa if i in by_index else None for i in range(count)],
    }
