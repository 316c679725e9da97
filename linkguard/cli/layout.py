"""``linkguard layout``: this host's GPU-NIC layout (PCIe switch, NUMA node) from sysfs or an
NCCL topology file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linkguard.cli.common import fail


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lay = sub.add_parser(
        "layout",
        help="this host's GPU-NIC layout: PCIe switch, NUMA node, nearest NICs",
        description="Print which NIC sits near which GPU on this host, read from the PCI "
        "sysfs tree (ROOT/bus/pci/devices) or from an NCCL topology file (NCCL_TOPO_FILE "
        "XML): each GPU with its PCI bus id, NUMA node and PCIe switch, and every NIC nearest "
        "first with its affinity (switch: same PCIe switch; numa: same NUMA node; any). "
        "--format fabric prints the host entry's pcie_switch per HCA and gpu_pcie_switch "
        "(YAML) to paste into a fabric file.",
        epilog="Exit codes: 0 printed, 1 no GPU found (no layout to print), 2 an NCCL "
        "topology file that cannot be read or used.",
    )
    lay.add_argument(
        "--sysfs",
        type=Path,
        default=Path("/"),
        metavar="ROOT",
        help="root the PCI tree is read under: ROOT/sys/bus/pci/devices, or ROOT/bus/pci/"
        "devices when ROOT is a sysfs mount (default /)",
    )
    lay.add_argument(
        "--nccl-topo", type=Path, metavar="FILE", help="read an NCCL topology XML instead"
    )
    lay.add_argument("--format", choices=["text", "json", "fabric"], default="text")


def run(args: argparse.Namespace) -> int:
    """``layout``: the host layout (:mod:`linkguard.layout`) as text, JSON or a fabric-file
    fragment; exit 1 without GPUs, 2 for an NCCL file that cannot be used."""
    from linkguard.layout import LayoutError
    from linkguard.layoutview import fabric_fragment, layout_document, layout_text

    if args.nccl_topo is not None:
        from linkguard.layout import load_nccl_topo

        try:
            layout = load_nccl_topo(args.nccl_topo)
        except LayoutError as exc:
            return fail(str(exc), 2)
    else:
        from linkguard.drivers.pci import read_pci_layout
        from linkguard.logs import configure_logging

        configure_logging("console", "error")  # unreadable values are listed in the output
        root = args.sysfs
        if not (root / "bus" / "pci").is_dir() and (root / "sys" / "bus" / "pci").is_dir():
            root = root / "sys"
        layout = read_pci_layout(root)
    if not layout.gpus:
        where = layout.source or str(args.sysfs)
        return fail(
            f"no GPU found in {where} ({len(layout.nics)} RDMA NIC(s)): nothing to lay out; "
            "give --nccl-topo FILE or --sysfs ROOT of a GPU host",
            1,
        )
    if args.format == "json":
        import json

        text = json.dumps(layout_document(layout), indent=1) + "\n"
    elif args.format == "fabric":
        import yaml

        try:
            text = yaml.safe_dump(fabric_fragment(layout), sort_keys=False)
        except LayoutError as exc:
            return fail(str(exc), 2)
    else:
        text = layout_text(layout)
    sys.stdout.write(text)
    return 0
