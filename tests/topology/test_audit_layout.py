"""The fleet audit and the service's inventory check with agents that report their PCIe layout
(``pcie_switch`` per HCA, ``gpu_pcie_switch``; linkguard.layout): a fabric without switch ids
is no mismatch (it does not use affinity); one whose switches group devices differently from
the host is a ``layout_mismatch`` warning naming host, device and both switches."""

from __future__ import annotations

from linkguard.layout import annotate_inventory, parse_nccl_topo
from linkguard.models import HostInventory
from linkguard.topology.audit import SEVERITY, audit, format_json, inventory_problems
from linkguard.topology.generator import generate_rail_optimized

#: one socket per pair of switches, two GPUs and two HCAs per switch (DGX A100-like)
XML = """<system version="1">
  <cpu numaid="0">
    <pci busid="0000:01:00.0" class="0x060400">
      <pci busid="0000:03:00.0" class="0x030200"><gpu dev="0"/></pci>
      <pci busid="0000:04:00.0" class="0x030200"><gpu dev="1"/></pci>
      <pci busid="0000:05:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0"/></nic></pci>
      <pci busid="0000:06:00.0" class="0x020700"><nic><net name="mlx5_1" dev="1"/></nic></pci>
    </pci>
    <pci busid="0000:41:00.0" class="0x060400">
      <pci busid="0000:43:00.0" class="0x030200"><gpu dev="2"/></pci>
      <pci busid="0000:44:00.0" class="0x030200"><gpu dev="3"/></pci>
      <pci busid="0000:45:00.0" class="0x020700"><nic><net name="mlx5_2" dev="2"/></nic></pci>
      <pci busid="0000:46:00.0" class="0x020700"><nic><net name="mlx5_3" dev="3"/></nic></pci>
    </pci>
  </cpu>
</system>"""
S0, S1 = "0000:01:00.0", "0000:41:00.0"


def _fabric(per_switch: int):
    return generate_rail_optimized(
        hosts=2, rails=4, numa_split=False, rails_per_pcie_switch=per_switch
    )


def _reported(fabric, xml: str = XML) -> HostInventory:
    """gpu000's inventory as its agent reports it: the fabric's HCAs, annotated from ``xml``."""
    mine = fabric.host("gpu000").model_copy(
        update={
            "hcas": [
                h.model_copy(update={"pcie_switch": None}) for h in fabric.host("gpu000").hcas
            ],
            "gpu_pcie_switch": [],
        }
    )
    return annotate_inventory(mine, parse_nccl_topo(xml))


def _layout_findings(fabric, inv: HostInventory) -> list[tuple]:
    findings = audit(fabric, inventories={"gpu000": inv}, reported_hosts={"gpu000", "gpu001"})
    return [
        (f.severity, f.subject, f.expected, f.observed, f.detail)
        for f in findings
        if f.kind in ("layout_mismatch", "inventory_mismatch")
    ]


def test_a_fabric_without_switch_ids_takes_any_reported_layout() -> None:
    fabric = _fabric(0)
    inv = _reported(fabric)
    assert [h.pcie_switch for h in inv.hcas] == [S0, S0, S1, S1]
    assert inv.gpu_pcie_switch == [S0, S0, S1, S1]
    assert inventory_problems(fabric.host("gpu000"), inv) == []  # the service's check
    assert _layout_findings(fabric, inv) == []
    other = fabric.host("gpu001")  # reports no layout
    whole = audit(fabric, inventories={"gpu000": inv, "gpu001": other})
    assert whole == []
    assert '"errors": 0,\n "warnings": 0' in format_json(whole)


def test_labels_that_group_the_same_devices_agree() -> None:
    """The generator's pcie0/pcie1 and the host's bus ids: the same grouping, no finding."""
    fabric = _fabric(2)
    assert [h.pcie_switch for h in fabric.host("gpu000").hcas] == ["pcie0"] * 2 + ["pcie1"] * 2
    assert _layout_findings(fabric, _reported(fabric)) == []


def test_a_device_on_another_switch_is_a_warning_naming_both() -> None:
    fabric = _fabric(2)
    # on the host mlx5_1 hangs on the second switch (e.g. a card moved to another slot)
    moved = XML.replace(
        '<pci busid="0000:06:00.0" class="0x020700"><nic><net name="mlx5_1" dev="1"/></nic></pci>',
        "",
    ).replace(
        "</pci>\n  </cpu>",
        '  <pci busid="0000:47:00.0" class="0x020700"><nic><net name="mlx5_1" dev="1"/></nic>'
        "</pci>\n    </pci>\n  </cpu>",
    )
    inv = _reported(fabric, moved)
    assert [h.pcie_switch for h in inv.hcas] == [S0, S1, S1, S1]
    assert inventory_problems(fabric.host("gpu000"), inv) == []  # not an HCA mismatch
    assert _layout_findings(fabric, inv) == [
        (
            "warning",
            "gpu000:mlx5_1/1",
            "pcie_switch pcie0",
            f"pcie_switch {S1}",
            f"mlx5_1/1: PCIe switch {S1} on the host, pcie0 in the fabric (alternates are "
            "ranked by the fabric's layout)",
        )
    ]
    assert SEVERITY["layout_mismatch"] == "warning"


def test_bus_ids_in_the_fabric_are_compared_as_they_are() -> None:
    """A fabric written from `linkguard layout --format fabric` names bus ids: another bus id
    on the host is a finding per device (GPUs too), even with the same grouping."""
    doc = _fabric(0).model_dump(mode="json")
    host = doc["hosts"][0]
    for h, sw in zip(host["hcas"], [S0, S0, S1, "0000:81:00.0"], strict=True):
        h["pcie_switch"] = sw
    host["gpu_pcie_switch"] = [S0, S0, "0000:81:00.0", "0000:81:00.0"]
    fabric = type(_fabric(0)).model_validate(doc)
    got = _layout_findings(fabric, _reported(fabric))
    assert [(s, subj, e, o) for s, subj, e, o, _ in got] == [
        ("warning", "gpu000:gpu2", "pcie_switch 0000:81:00.0", f"pcie_switch {S1}"),
        ("warning", "gpu000:gpu3", "pcie_switch 0000:81:00.0", f"pcie_switch {S1}"),
        ("warning", "gpu000:mlx5_3/1", "pcie_switch 0000:81:00.0", f"pcie_switch {S1}"),
    ]


def test_switches_merged_on_the_host_flag_the_smaller_group() -> None:
    """The fabric has two switches, the host one: the larger fabric group keeps the host
    switch, every device of the other is flagged."""
    doc = _fabric(0).model_dump(mode="json")
    host = doc["hosts"][0]
    for h, sw in zip(host["hcas"], ["a", "a", "a", "b"], strict=True):
        h["pcie_switch"] = sw
    host["gpu_pcie_switch"] = ["a", "a", "a", "b"]
    fabric = type(_fabric(0)).model_validate(doc)
    one = XML.replace(S1, S0)
    inv = _reported(fabric, one)
    assert set(inv.gpu_pcie_switch) == {S0}
    assert [(subj, e) for _, subj, e, _, _ in _layout_findings(fabric, inv)] == [
        ("gpu000:gpu3", "pcie_switch b"),
        ("gpu000:mlx5_3/1", "pcie_switch b"),
    ]


def test_a_host_without_a_layout_is_not_compared() -> None:
    fabric = _fabric(2)
    plain = fabric.host("gpu000").model_copy(
        update={
            "hcas": [
                h.model_copy(update={"pcie_switch": None}) for h in fabric.host("gpu000").hcas
            ],
            "gpu_pcie_switch": [],
        }
    )
    assert _layout_findings(fabric, plain) == []
