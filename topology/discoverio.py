"""Read what the service's discovery needs from files, once at start: the ibnetdiscover dump
(and GUID map) or the switches' lldpctl tables, and the expected fabric.

Consumes: a :class:`~linkguard.settings.discoversection.FabricDiscovery`. Produces: a
:class:`~linkguard.topology.discoverdesk.DiscoveryDesk` and the expected fabric (or None).
Raises :class:`~linkguard.config.ConfigError` naming the file that cannot be read or used.
"""

from __future__ import annotations

from linkguard.drivers.lldp import LldpError, read_lldp_file
from linkguard.settings.base import ConfigError
from linkguard.settings.discoversection import FabricDiscovery
from linkguard.topology.discoverdesk import DiscoveryDesk
from linkguard.topology.fabric import Fabric, FabricError, load_fabric
from linkguard.topology.ibnetdiscover import load_guid_map, parse_ibnetdiscover
from linkguard.topology.switchgraph import from_ibnetdiscover

__all__ = ["load_discovery"]


def load_discovery(spec: FabricDiscovery) -> tuple[DiscoveryDesk, Fabric | None]:
    """The desk (switch graph loaded) and the expected fabric of ``spec``. Blocking file I/O."""
    src = spec.discover
    try:
        graph = None
        if src.ibnetdiscover is not None:
            text = src.ibnetdiscover.read_bytes().decode("utf-8", errors="replace")
            topo = parse_ibnetdiscover(text, source=str(src.ibnetdiscover))
            gmap = load_guid_map(src.guid_map) if src.guid_map is not None else None
            graph = from_ibnetdiscover(topo, gmap)
        tables = {name: read_lldp_file(path) for name, path in src.switch_lldp.items()}
    except OSError as exc:
        raise ConfigError(f"fabric.discover: cannot read {exc.filename}: {exc.strerror}") from None
    except (FabricError, LldpError, ValueError) as exc:
        raise ConfigError(f"fabric.discover: {exc}") from None
    try:
        expected = load_fabric(spec.expected) if spec.expected is not None else None
    except FabricError as exc:
        raise ConfigError(f"fabric.expected: {exc}") from None
    return DiscoveryDesk(source=src, graph=graph, switch_tables=tables), expected
