"""What the metrics read when scraped: the agent and the topology service as typing protocols.

:mod:`linkguard.metrics` sits below the agent (:mod:`linkguard.agent.daemon`) and the service
(:mod:`linkguard.topology.service`), which create their metrics; it reads them through these
protocols instead of importing their classes. Each member is what a scrape reads; the classes
that satisfy them are named in each docstring (mypy checks that they do where the metrics are
created).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sized
from typing import Any, Protocol

from linkguard.changerecord import ChangeRecord
from linkguard.models import Ack, HostInventory, PortState

__all__ = [
    "AgentCounters",
    "AgentRouteSettings",
    "AgentSource",
    "AppliedPlan",
    "ChangeSubscription",
    "FabricStateSource",
    "LeadershipSource",
    "NamedFabric",
    "PortStates",
    "RouteApplySetting",
    "ServiceSource",
    "VerdictKind",
    "Verdicts",
]


class PortStates(Protocol):
    """The agent's port monitor (:class:`~linkguard.agent.monitor.PortMonitor`)."""

    def state(self, key: str) -> PortState | None: ...


class AppliedPlan(Protocol):
    """The agent's applier (:class:`~linkguard.agent.applier.Applier`)."""

    @property
    def applied_epoch(self) -> int | None: ...
    @property
    def neighbours_flushed(self) -> int: ...
    @property
    def writes(self) -> StateWriteFailures: ...


class StateWriteFailures(Protocol):
    """The agent's state-file writes (:class:`~linkguard.agent.statewrites.StateWrites`)."""

    @property
    def failures(self) -> Mapping[str, int]: ...


class AgentCounters(Protocol):
    """The agent's counters (:class:`~linkguard.agent.daemon.AgentStats`)."""

    @property
    def plans_applied(self) -> int: ...
    @property
    def plans_refused(self) -> Mapping[str, int]: ...
    @property
    def messages_dropped(self) -> Mapping[str, int]: ...
    @property
    def fast_paths(self) -> int: ...
    @property
    def states_published(self) -> int: ...
    @property
    def journal_held(self) -> int: ...
    @property
    def journal_dropped(self) -> int: ...


class RouteApplySetting(Protocol):
    """The agent's ``routes:`` settings (:class:`~linkguard.settings.sections.RouteOptions`)."""

    @property
    def apply(self) -> bool: ...


class AgentRouteSettings(Protocol):
    """The agent's settings (:class:`~linkguard.settings.agent.AgentSettings`), as far as a
    scrape reads them."""

    @property
    def routes(self) -> RouteApplySetting: ...


class AgentSource(Protocol):
    """An agent (:class:`~linkguard.agent.daemon.Agent`): its host, settings (``routes.apply``),
    inventory, port monitor, applier, counters and bus (read with ``getattr``: ``connected``,
    ``broker``, ...)."""

    @property
    def host(self) -> str: ...
    @property
    def settings(self) -> AgentRouteSettings: ...
    @property
    def inventory(self) -> HostInventory: ...
    @property
    def monitor(self) -> PortStates: ...
    @property
    def applier(self) -> AppliedPlan: ...
    @property
    def stats(self) -> AgentCounters: ...
    @property
    def bus(self) -> Any: ...


class FabricStateSource(Protocol):
    """The service's fabric state (:class:`~linkguard.topology.state.FabricState`)."""

    @property
    def host_names(self) -> Collection[str]: ...
    @property
    def online(self) -> Mapping[str, bool]: ...
    @property
    def ports(self) -> Mapping[tuple[str, str], PortState]: ...
    @property
    def acks(self) -> Mapping[str, Ack]: ...
    @property
    def away(self) -> Sized: ...
    @property
    def dirty(self) -> bool: ...
    @property
    def epoch(self) -> int: ...

    def acked_epoch(self, host: str) -> int | None: ...
    def pending_acks(self, hosts: Iterable[str] | None = None) -> Sized: ...


class VerdictKind(Protocol):
    """One raised probe verdict: its ``kind`` (``port`` or ``leaf``)."""

    @property
    def kind(self) -> str: ...


class Verdicts(Protocol):
    """The service's probe localizer (:class:`~linkguard.topology.localize.Localizer`)."""

    @property
    def active(self) -> Mapping[Any, VerdictKind]: ...


class LeadershipSource(Protocol):
    """The service's leader election (:class:`~linkguard.topology.leader.Leadership`)."""

    @property
    def term(self) -> int | None: ...

    def is_leader(self) -> bool: ...


class ChangeSubscription(Protocol):
    """The service's change feed (:class:`~linkguard.topology.changes.ChangeFeed`)."""

    @property
    def listeners(self) -> int: ...

    def subscribe(self, callback: Callable[[ChangeRecord], None]) -> Callable[[], None]: ...


class NamedFabric(Protocol):
    """The service's fabric (:class:`~linkguard.topology.fabric.Fabric`): name and hosts."""

    @property
    def name(self) -> str: ...
    @property
    def hosts(self) -> Collection[HostInventory]: ...


class ConvergenceSource(Protocol):
    """The service's convergence (:class:`~linkguard.topology.convergence.Convergence`)."""

    @property
    def resends(self) -> int: ...

    def not_acking(self, now: float) -> Sized: ...


class ServiceSource(Protocol):
    """A topology service (:class:`~linkguard.topology.service.TopologyService`)."""

    @property
    def audit_json(self) -> str | None: ...
    @property
    def fabric(self) -> NamedFabric: ...
    @property
    def changes(self) -> ChangeSubscription: ...
    @property
    def state(self) -> FabricStateSource: ...
    @property
    def localizer(self) -> Verdicts | None: ...
    @property
    def probe_inconclusive(self) -> Sized: ...
    @property
    def leadership(self) -> LeadershipSource: ...
    @property
    def solves(self) -> int: ...
    @property
    def plans_published(self) -> int: ...
    @property
    def dropped(self) -> Mapping[str, int]: ...
    @property
    def budget_dropped(self) -> Mapping[str, int]: ...
    @property
    def probe_pairs_unanswerable(self) -> int: ...
    @property
    def convergence(self) -> ConvergenceSource: ...
    @property
    def unprotected(self) -> Sized: ...
    @property
    def bus(self) -> Any: ...
