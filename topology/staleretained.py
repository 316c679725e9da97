"""What a service does about retained messages of hosts its fabric does not list: the
stale-plan and stale-host rules of :class:`~linkguard.topology.core.ServiceCore` (a mixin of
it; pure, like the core).

Consumes: retained plans, peer routes and ``hosts/<host>/...`` messages of such hosts.
Produces: what to delete (:meth:`StaleRetained.take_stale_hosts`, ``ClearStalePlans``) and
the emptied, signed peer routes to publish before a deletion (agents that verify ignore an
unsigned one).
"""

from __future__ import annotations

from linkguard.config import ServiceSettings
from linkguard.models import BadMessage, PeerRoutes, Plan, decode
from linkguard.signing import SignatureError, unwrap
from linkguard.topology.effects import ClearStalePlans, Effect, RetainedKind
from linkguard.topology.integrity import Integrity
from linkguard.topology.state import FabricState

__all__ = ["STALE_HOST_TOPICS_MAX", "StaleRetained"]

#: retained topics of departed hosts noted for deletion at most (a flood of them is bounded)
STALE_HOST_TOPICS_MAX = 65_536


class StaleRetained:
    """The stale-retained rules; the attributes are the core's (set in its ``__init__``)."""

    settings: ServiceSettings
    state: FabricState
    integrity: Integrity
    settled: bool
    strangers: set[str]
    stale_host_topics: dict[str, set[str]]
    _stale_host_noted: int
    stale_plans: dict[str, int | None]
    stale_peers: dict[str, int | None]
    stale_peer_routes: dict[str, PeerRoutes]

    def on_stale_plan(
        self, topic: str, payload: bytes, host: str, kind: RetainedKind
    ) -> list[Effect]:
        """A retained plan or peer routes of ``host``, which the fabric does not list: an agent
        started with that name would apply the plan (one of another fabric), every agent would
        route to the peer. Noted; deleted right away when the startup settle is over, else by
        the solver task when it is."""
        epoch = None
        verifier = self.integrity.verifier
        try:
            opened = unwrap(payload, verifier, require=False)
            model: type[Plan] | type[PeerRoutes] = Plan if kind == "plan" else PeerRoutes
            obj = decode(
                model,
                opened.body,
                topic=topic,
                expect_host=host,
                max_bytes=self.settings.bus.max_message_bytes,
            )
        except (BadMessage, SignatureError):
            pass
        else:
            epoch = obj.epoch
            if isinstance(obj, PeerRoutes) and opened.verified:
                self.stale_peer_routes[host] = obj
        (self.stale_plans if kind == "plan" else self.stale_peers)[host] = epoch
        return [ClearStalePlans()] if self.settled else []

    def take_stale_hosts(self) -> dict[str, list[str]]:
        """The retained topics to delete, by host, of hosts the fabric does not list and whose
        agent is not online (:attr:`stale_host_topics` but :attr:`strangers`); forgotten here
        once taken."""
        gone = sorted(h for h in self.stale_host_topics if h not in self.strangers)
        out = {h: sorted(self.stale_host_topics.pop(h)) for h in gone}
        self._stale_host_noted -= sum(map(len, out.values()))
        return out

    def _note_stale_host_topic(self, host: str, topic: str) -> None:
        """A retained message of ``host`` (not in the fabric) on ``topic``: to delete."""
        noted = self.stale_host_topics.setdefault(host, set())
        if topic not in noted and self._stale_host_noted < STALE_HOST_TOPICS_MAX:
            noted.add(topic)
            self._stale_host_noted += 1

    def emptied_stale_peers(self, wall: float) -> dict[str, PeerRoutes]:
        """The stale peer routes this service's key signed, emptied (no classes, a new epoch,
        issued at ``wall``, Unix s) to be published signed before they are deleted: agents
        that verify ignore an unsigned deletion, and would keep their routes."""
        emptied = {
            h: pr.model_copy(
                update={
                    "classes": [],
                    "modulus": 1,
                    "epoch": max(self.state.epoch, pr.epoch) + 1,
                    "issued_at": wall,
                }
            )
            for h, pr in self.stale_peer_routes.items()
            if h in self.stale_peers
        }
        self.stale_peer_routes.clear()
        return emptied
