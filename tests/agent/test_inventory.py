"""Rail index: from config, else PCI address order; by natural name order only when no PCI
address is known (said in a warning)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from linkguard.agent.inventory import DiscoveredPort, InventoryError, build_inventory
from linkguard.config import PortConfig
from linkguard.models import LinkLayer


def test_rails_follow_pci_order_not_names() -> None:
    # mlx5_0 sits at a higher PCI bus than mlx5_1 (it happens after driver reloads).
    found = [
        DiscoveredPort("mlx5_0", 1, pci_address="0000:9a:00.0", numa_node=1),
        DiscoveredPort("mlx5_1", 1, pci_address="0000:18:00.0", numa_node=0),
        DiscoveredPort("mlx5_2", 1, pci_address="0000:40:00.0", numa_node=0),
    ]
    inv = build_inventory("h", discovered=found)
    assert [(h.hca, h.rail) for h in inv.hcas] == [("mlx5_1", 0), ("mlx5_2", 1), ("mlx5_0", 2)]
    assert inv.hcas[0].numa_node == 0


def test_config_rails_win_and_the_rest_fill_in_pci_order() -> None:
    found = [
        DiscoveredPort("mlx5_0", 1, pci_address="0000:18:00.0"),
        DiscoveredPort("mlx5_1", 1, pci_address="0000:2a:00.0"),
    ]
    inv = build_inventory(
        "h",
        configured=[PortConfig(hca="mlx5_1", rail=0, netdev="ib1"), PortConfig(hca="mlx5_0")],
        discovered=found,
    )
    assert [(h.hca, h.rail, h.netdev, h.pci_address) for h in inv.hcas] == [
        ("mlx5_1", 0, "ib1", "0000:2a:00.0"),
        ("mlx5_0", 1, None, "0000:18:00.0"),
    ]


def test_duplicate_configured_rail_is_a_clear_error() -> None:
    with pytest.raises(InventoryError, match="same rail"):
        build_inventory(
            "h", configured=[PortConfig(hca="mlx5_0", rail=1), PortConfig(hca="mlx5_1", rail=1)]
        )


def test_without_config_only_infiniband_ports_are_rails() -> None:
    found = [
        DiscoveredPort("mlx5_0", 1, LinkLayer.INFINIBAND, pci_address="0000:18:00.0"),
        DiscoveredPort("mlx5_bond_0", 1, LinkLayer.ETHERNET, pci_address="0000:0c:00.0"),
        DiscoveredPort("mlx5_1", 1, LinkLayer.INFINIBAND, pci_address="0000:2a:00.0"),
    ]
    inv = build_inventory("h", discovered=found)
    assert [(h.hca, h.rail) for h in inv.hcas] == [("mlx5_0", 0), ("mlx5_1", 1)]


def test_roce_only_host_uses_its_ethernet_ports() -> None:
    found = [
        DiscoveredPort("mlx5_1", 1, LinkLayer.ETHERNET, pci_address="0000:2a:00.0"),
        DiscoveredPort("mlx5_0", 1, LinkLayer.ETHERNET, pci_address="0000:18:00.0"),
    ]
    assert [h.hca for h in build_inventory("h", discovered=found).hcas] == ["mlx5_0", "mlx5_1"]


def test_no_pci_address_orders_rails_by_natural_name(fixtures_real) -> None:
    """The gpud H100 tree has no `device` links: rails follow the device names in natural
    order (mlx5_0, mlx5_1, mlx5_4..mlx5_9; not mlx5_bond_0, the in-band Ethernet bond), with
    one warning that says how to pin them."""
    from linkguard.agent.daemon import discover
    from linkguard.config import AgentSettings

    root = fixtures_real / "leptonai-gpud/tree/sys-class-infiniband-h100.0"
    found = discover(AgentSettings(host="h", sysfs_root=root))
    assert len(found) == 9
    with capture_logs() as logs:
        inv = build_inventory("h", discovered=found)
    assert [(h.hca, h.rail) for h in inv.hcas] == [
        ("mlx5_0", 0),
        ("mlx5_1", 1),
        ("mlx5_4", 2),
        ("mlx5_5", 3),
        ("mlx5_6", 4),
        ("mlx5_7", 5),
        ("mlx5_8", 6),
        ("mlx5_9", 7),
    ]
    warned = [e for e in logs if e["event"] == "rails_ordered_by_name"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert warned[0]["order"][:3] == ["mlx5_0/1", "mlx5_1/1", "mlx5_4/1"]
    assert "ports:" in warned[0]["hint"]


def test_natural_order_is_not_lexical() -> None:
    """mlx5_10 after mlx5_9 (lexically it would sort before mlx5_2)."""
    found = [DiscoveredPort(f"mlx5_{i}", 1, LinkLayer.INFINIBAND) for i in (10, 2, 9, 0)]
    inv = build_inventory("h", discovered=found)
    assert [h.hca for h in inv.hcas] == ["mlx5_0", "mlx5_2", "mlx5_9", "mlx5_10"]


def test_pci_order_kept_when_every_port_has_one() -> None:
    found = [
        DiscoveredPort("mlx5_0", 1, LinkLayer.INFINIBAND, pci_address="0000:9a:00.0"),
        DiscoveredPort("mlx5_1", 1, LinkLayer.INFINIBAND, pci_address="0000:18:00.0"),
    ]
    with capture_logs() as logs:
        inv = build_inventory("h", discovered=found)
    assert [h.hca for h in inv.hcas] == ["mlx5_1", "mlx5_0"]
    assert not [e for e in logs if e["event"] == "rails_ordered_by_name"]
