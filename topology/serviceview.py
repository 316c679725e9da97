"""What the HTTP API reads of the topology service, as a typing protocol.

The service (:mod:`linkguard.topology.service`, its wiring) creates the API's server
(:class:`~linkguard.topology.api.ApiServer`) and hands itself in; the API reads it through
:class:`ServiceView` instead of importing the service's class, so the two modules do not import
each other. :class:`~linkguard.topology.service.TopologyService` satisfies it (mypy checks that
where the service creates the server). A view is also what the service's metrics read
(:class:`~linkguard.metricsources.ServiceSource`).
"""

from __future__ import annotations

from typing import Protocol

from linkguard.bus import BusSession
from linkguard.config import ServiceSettings
from linkguard.metricsources import ServiceSource
from linkguard.topology.changes import ChangeFeed
from linkguard.topology.convergence import Convergence
from linkguard.topology.fabric import Fabric
from linkguard.topology.state import FabricState

__all__ = ["ServiceView"]


class ServiceView(ServiceSource, Protocol):
    """A running topology service as the API reads it: its settings, fabric, state, change
    feed, bus (``PUT /api/v1/faults`` publishes on it), the last audit and health documents
    and its probe verdicts. ``ledger`` and ``metrics`` are read with ``getattr`` (a service
    may have neither)."""

    @property
    def settings(self) -> ServiceSettings: ...
    @property
    def fabric(self) -> Fabric: ...
    @property
    def state(self) -> FabricState: ...
    @property
    def changes(self) -> ChangeFeed: ...
    @property
    def bus(self) -> BusSession: ...
    @property
    def health_doc(self) -> dict[str, object] | None: ...
    @property
    def convergence(self) -> Convergence: ...

    def probe_verdicts(self, *, now: float | None = None) -> list[dict[str, object]]: ...
