"""The service's side of discovery (``fabric: {discover: ...}``): the agents' discovery
documents as they arrive, and the fabric they make with the switch graph.

Consumes: ``hosts/<host>/discovery`` messages (topic and payload) and the switch graph read at
start (:mod:`linkguard.topology.discoverio`). Produces: whether a message changed what is known
(the wiring then builds again after the settle time) and a
:class:`~linkguard.topology.discover.Discovery`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from linkguard import topics
from linkguard.models import BadMessage, decode
from linkguard.models.discovery import HostDiscovery, LldpNeighbour
from linkguard.settings.discoversection import DiscoverSource
from linkguard.topology.discover import Discovery, discover_fabric
from linkguard.topology.switchgraph import SwitchGraph, from_lldp

__all__ = ["DiscoveryDesk"]


@dataclass
class DiscoveryDesk:
    """The documents held (by host) and how to build the fabric from them. ``graph``: the
    ibnetdiscover switch graph (None with LLDP: built from the documents and
    ``switch_tables`` at each :meth:`build`). ``refused``: one line per document refused."""

    source: DiscoverSource
    graph: SwitchGraph | None = None
    switch_tables: Mapping[str, Sequence[LldpNeighbour]] = field(default_factory=dict)
    docs: dict[str, HostDiscovery] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)

    def take(self, topic: str, payload: bytes, *, max_bytes: int) -> bool:
        """One ``hosts/<host>/discovery`` message; True when what is known changed (a new
        host, a changed document, a deleted one). A document that does not decode, or names
        another host than its topic, is refused (``refused``) and changes nothing."""
        parsed = topics.parse(topic)
        if parsed is None or parsed.kind != "discovery":
            return False
        if not payload:
            return self.docs.pop(parsed.host, None) is not None
        try:
            doc = decode(
                HostDiscovery, payload, topic=topic, expect_host=parsed.host, max_bytes=max_bytes
            )
        except BadMessage as exc:
            self.refused.append(f"{topic}: {exc.reason}: {exc.detail}"[:400])
            del self.refused[:-100]
            return False
        if doc.same_as(self.docs.get(doc.host)):
            return False
        self.docs[doc.host] = doc
        return True

    def build(self) -> Discovery:
        """The fabric of the documents held (:func:`~linkguard.topology.discover.
        discover_fabric` with the source's prefixes and name)."""
        graph = self.graph
        if graph is None:
            graph = from_lldp({h: d.lldp for h, d in self.docs.items()}, self.switch_tables)
        s = self.source
        return discover_fabric(
            list(self.docs.values()),
            graph,
            name=s.name,
            rail_prefix=str(s.rail_prefix) if s.rail_prefix else None,
            endpoint_prefix=str(s.endpoint_prefix) if s.endpoint_prefix else None,
            gpus_per_host=s.gpus_per_host,
        )
