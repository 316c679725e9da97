"""One change of the topology service's feed, as the base package reads it.

:class:`ChangeRecord` is the shape of :class:`linkguard.topology.changes.Change` (``seq``,
``kind``, ``at``, ``data``; the kinds and their ``data`` are listed in
:mod:`linkguard.topology.changes`). The ledger (:mod:`linkguard.ledger`) and the service's
metrics (:mod:`linkguard.metrics`) consume changes through this protocol, so they do not import
the topology package that is built on them.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ChangeRecord"]


class ChangeRecord(Protocol):
    """A change: ``seq`` (1, 2, ... per service run), ``kind`` (``port``, ``port_event``,
    ``host``, ``plans``, ``ack``, ``audit``, ``health``), ``at`` (wall-clock s since the Unix
    epoch, when the service took it) and its JSON-ready ``data``."""

    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def at(self) -> float: ...
    @property
    def data(self) -> dict[str, Any]: ...
