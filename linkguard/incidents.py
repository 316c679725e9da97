"""Incidents: the unit the job cost model works on, built from the topology service's change
feed as the ledger records it.

Incidents (built by :class:`IncidentBuilder` in the writer thread, from the live feed; ``at``
here is the service's time of the change):

- A port *goes down* when its status becomes ``down`` from a known other status (its
  ``port_event``, or its ``port`` state if that arrives first; a first report of an already
  down port, e.g. after a restart, opens nothing). It joins the open incident whose first down
  was at most ``incident_window_s`` (default 1 s) earlier, else opens a new one: a leaf reboot is
  one incident. ``kind``: ``link`` (one port), ``host`` (ports of one host), ``leaf`` (ports
  behind one leaf), ``ports`` (anything else); ``cause``: the first port's reason.
- It *closes* when each of its ports has left ``down`` (up, held down or suppressed: the link
  is back); ``down_s`` = its longest down episode, as the simulator's outages. ``isolated``:
  a host it touched had no usable (``up``) port left at the time.
- ``reroute_ms``: only hosts whose port was usable (``up``) right before it went down need a
  reroute. Each such host is *covered* by the first ``plans`` epoch published after its down
  that re-plans it while that port is still unusable. The reroute is done when every such host
  is covered and has acked (``result: applied``, not a fast-path ack) an epoch at least its
  covering one, or is usable again without having been covered. An ack taken before the
  ``plans`` change counts (the service emits that change once every message is published,
  and the first acks can arrive sooner). ``reroute_ms`` = from the incident's first down to
  the last of those acks: detection, solve, publish and apply on every affected host (the
  agents' own fast path is faster; it is not what is measured). ``reroute``: ``none``
  (nobody needed a reroute: e.g. the port was already held down), ``pending``, ``done``, or
  ``unconfirmed`` (a covered host never acked before its ports were usable again, or an
  hour passed). The report charges ``pending`` and ``unconfirmed`` incidents as without
  linkguard. A solve that started just before a port went down and re-planned its host for
  another reason would count as covering it (the ``plans`` change does not say when its
  solve started); that shortens ``reroute_ms`` and is rare.

Consumes: port statuses, plans publishes and acks with the service's time of each
(:class:`IncidentBuilder`'s ``on_*`` methods, called by :mod:`linkguard.changerows`), and where
each port sits (:func:`port_places` of the fabric). Produces: the :class:`Incident` records each
call changed (the ledger writes them as ``outages`` / ``outage_ports`` rows). Pure: no clock,
no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from linkguard.models import HostInventory

__all__ = [
    "REROUTE_GIVE_UP_S",
    "FabricInventory",
    "Incident",
    "IncidentBuilder",
    "LinkEnds",
    "PortKey",
    "PortPlace",
    "SwitchPlace",
    "port_places",
]

#: A pending reroute becomes ``unconfirmed`` after this long (s).
REROUTE_GIVE_UP_S = 3600.0

PortKey = tuple[str, str, int]  # host, hca, port


@dataclass(frozen=True)
class PortPlace:
    """Where a host port sits in the fabric: its ``rail``, ``leaf`` (None when not cabled in
    the fabric file) and the leaf's ``su``."""

    rail: int | None
    leaf: str | None
    su: int | None


class SwitchPlace(Protocol):
    """What the ledger reads of a fabric switch (:class:`~linkguard.topology.fabric.Switch`)."""

    @property
    def name(self) -> str: ...
    @property
    def su(self) -> int | None: ...


class LinkEnds(Protocol):
    """What the ledger reads of a fabric link (:class:`~linkguard.topology.fabric.Link`):
    its ``kind`` (``host-leaf``, ...) and its two ends (``"<host>:<hca>/<port>"`` or a switch
    name)."""

    @property
    def kind(self) -> str: ...
    @property
    def a(self) -> str: ...
    @property
    def b(self) -> str: ...


class FabricInventory(Protocol):
    """What the ledger reads of a fabric (:class:`~linkguard.topology.fabric.Fabric`, which
    lives in the topology package built on this one): its name, host inventories, switches,
    links and rail indices."""

    @property
    def name(self) -> str: ...
    @property
    def hosts(self) -> Sequence[HostInventory]: ...
    @property
    def switches(self) -> Sequence[SwitchPlace]: ...
    @property
    def links(self) -> Sequence[LinkEnds]: ...
    @property
    def rails(self) -> Sequence[int]: ...


def port_places(fabric: FabricInventory) -> dict[PortKey, PortPlace]:
    """(host, hca, port) -> :class:`PortPlace` for every host port of ``fabric`` (a
    :class:`~linkguard.topology.fabric.Fabric`; leaf from its ``host-leaf`` link, SU from that
    leaf switch)."""
    su_of = {s.name: s.su for s in fabric.switches}
    by_end = {
        f"{h.host}:{c.key}": (h.host, c.hca, c.port, c.rail) for h in fabric.hosts for c in h.hcas
    }
    leaf_of: dict[str, str] = {}
    for link in fabric.links:
        if link.kind != "host-leaf":
            continue
        end, leaf = (link.a, link.b) if link.a in by_end else (link.b, link.a)
        if end in by_end:
            leaf_of[end] = leaf
    out: dict[PortKey, PortPlace] = {}
    for end, (host, hca, port, rail) in by_end.items():
        place_leaf = leaf_of.get(end)
        out[(host, hca, port)] = PortPlace(
            rail, place_leaf, su_of.get(place_leaf) if place_leaf else None
        )
    return out


@dataclass(eq=False)
class Incident:
    """One incident in the making (see the module docstring). ``row_id``: its ``outages`` row
    once written; ``new_ports``: ports joined since the last write."""

    at: float
    cause: str | None
    ports: dict[PortKey, PortPlace] = field(default_factory=dict)
    down: dict[PortKey, float] = field(default_factory=dict)
    longest_s: float = 0.0
    isolated: bool = False
    needs: set[str] = field(default_factory=set)
    cover: dict[str, int] = field(default_factory=dict)
    acked: dict[str, float] = field(default_factory=dict)
    reroute: str = "none"
    reroute_ms: float | None = None
    row_id: int | None = None
    new_ports: list[PortKey] = field(default_factory=list)

    @property
    def open(self) -> bool:
        return bool(self.down)

    @property
    def down_s(self) -> float | None:
        """Longest down episode (s); None while a port is still down."""
        return None if self.down else round(self.longest_s, 6)

    @property
    def kind(self) -> str:
        if len(self.ports) == 1:
            return "link"
        if len({k[0] for k in self.ports}) == 1:
            return "host"
        leaves = {p.leaf for p in self.ports.values()}
        return "leaf" if len(leaves) == 1 and None not in leaves else "ports"


class IncidentBuilder:
    """Incidents from port statuses, plans and acks, in the order the service saw them (module
    docstring). Pure: each ``on_*`` method takes the change's time and returns the incidents
    it changed (to be written). ``host_ports``: every port of each host (isolation)."""

    def __init__(
        self,
        places: dict[PortKey, PortPlace],
        *,
        window_s: float = 1.0,
    ) -> None:
        if not (math.isfinite(window_s) and window_s >= 0):
            raise ValueError(f"incident_window_s must be finite and >= 0, got {window_s}")
        self.places = places
        self.window_s = window_s
        self.host_ports: dict[str, list[PortKey]] = {}
        for key in places:
            self.host_ports.setdefault(key[0], []).append(key)
        self.status: dict[PortKey, str] = {}
        #: hosts whose agents journal their events (a journaled event was seen): their
        #: events, not their states, open and close incidents
        self.journaled_hosts: set[str] = set()
        self.port_incident: dict[PortKey, Incident] = {}
        #: incidents still open or waiting for their reroute, oldest first
        self.active: list[Incident] = []
        #: host -> (epoch, time) of its latest applied plan ack (the service may take an ack
        #: before it has finished publishing, i.e. before its ``plans`` change)
        self.last_ack: dict[str, tuple[int, float]] = {}

    def _joins(self, inc: Incident, at: float, journaled: bool) -> bool:
        """A port down at ``at`` joins ``inc``: it is open and its first down was at most
        ``window_s`` earlier (either way for a journaled event, which may come late)."""
        d = at - inc.at
        return inc.open and (abs(d) if journaled else d) <= self.window_s and (journaled or d >= 0)

    def _usable(self, key: PortKey) -> bool:
        return self.status.get(key, "up") == "up"

    def on_status(
        self,
        key: PortKey,
        status: str,
        at: float,
        *,
        previous: str | None = None,
        reason: str | None = None,
        rail: int | None = None,
        journaled: bool = False,
    ) -> list[Incident]:
        """A port's status as a ``port`` state (``previous`` None) or a ``port_event``
        (``previous`` its previous status) reported it at ``at``. ``journaled``: a numbered
        event of the agent's journal (``at`` its own time; its ``previous`` is taken as it
        is: the journal's events of a port come complete and in order). Once a host sent
        one, its states only seed a port's first status: its events open and close the
        incidents (a replayed event may come after the state). An incident a state opened
        before the host's first journaled event is moved back to that event's time."""
        if journaled:
            self.journaled_hosts.add(key[0])
        elif previous is None and key[0] in self.journaled_hosts:
            self.status.setdefault(key, status)  # its events say when; a state may be early
            return []
        before = self.status.get(key)
        if (before is None or journaled) and previous is not None:
            before = previous
        self.status[key] = status
        touched: list[Incident] = []
        opened = self.port_incident.get(key)
        if (
            journaled
            and status == "down"
            and before not in (None, "down", "unknown")
            and opened is not None
            and key in opened.down
        ):
            # opened by the port's state before its journal's event came (a reconnect): the
            # event's time is when it went down
            opened.down[key] = min(opened.down[key], at)
            opened.at = min(opened.at, at)
            touched.append(opened)
        elif status == "down" and before not in (None, "down", "unknown"):
            # journaled events may come late and out of time order across hosts
            inc = next((i for i in reversed(self.active) if self._joins(i, at, journaled)), None)
            if inc is None:
                inc = Incident(at=at, cause=reason)
                self.active.append(inc)
            inc.at = min(inc.at, at)
            if key not in inc.ports:
                inc.new_ports.append(key)
            inc.ports[key] = self.places.get(key, PortPlace(rail, None, None))
            inc.down[key] = at
            self.port_incident[key] = inc
            if before == "up":
                inc.needs.add(key[0])
            host_keys = self.host_ports.get(key[0], [key])
            if not any(self._usable(k) for k in host_keys):
                inc.isolated = True
            touched.append(inc)
        elif status == "down" and reason:
            inc = self.port_incident.get(key)
            if inc is not None and inc.cause is None:  # the event names what the state did not
                inc.cause = reason
                touched.append(inc)
        elif before == "down" and status != "down":
            inc = self.port_incident.pop(key, None)
            if inc is not None and key in inc.down:
                inc.longest_s = max(inc.longest_s, at - inc.down.pop(key))
                touched.append(inc)
        if status == "up":
            for inc in self.active:
                if key[0] in inc.needs and self._settle(inc, at) and inc not in touched:
                    touched.append(inc)
        self._retire(at)
        return touched

    def on_plans(self, epoch: int, hosts: Iterable[str], at: float) -> list[Incident]:
        """A plans publish re-planning ``hosts``: it covers the hosts of open reroutes whose
        incident port is still unusable."""
        hosts = set(hosts)
        touched = []
        for inc in self.active:
            changed = False
            for h in inc.needs - inc.cover.keys():
                if h in hosts and any(not self._usable(k) for k in inc.ports if k[0] == h):
                    inc.cover[h] = epoch
                    acked = self.last_ack.get(h)
                    if acked is not None and acked[0] >= epoch:
                        inc.acked[h] = acked[1]
                    changed = True
            if changed:
                if inc.reroute in ("none", "done"):
                    inc.reroute = "pending"
                    inc.reroute_ms = None
                self._settle(inc, at)
                touched.append(inc)
        self._retire(at)
        return touched

    def on_ack(
        self, host: str, epoch: int, *, result: str, fast_path: bool, at: float
    ) -> list[Incident]:
        """An agent's ack."""
        if result != "applied" or fast_path:
            return []
        if epoch > self.last_ack.get(host, (-1, at))[0]:  # the first ack of each epoch
            self.last_ack[host] = (epoch, at)
        touched = []
        for inc in self.active:
            want = inc.cover.get(host)
            if want is not None and host not in inc.acked and epoch >= want:
                inc.acked[host] = at
                self._settle(inc, at)
                touched.append(inc)
        self._retire(at)
        return touched

    def _settle(self, inc: Incident, at: float) -> bool:
        """Decide ``inc``'s reroute if it can be; True when that changed it."""
        if inc.reroute != "pending":
            return False
        waiting = False
        for h in inc.needs:
            ports_usable = all(self._usable(k) for k in inc.ports if k[0] == h)
            if h in inc.cover:
                if h not in inc.acked and not ports_usable:
                    waiting = True
                elif h not in inc.acked:
                    inc.reroute = "unconfirmed"  # usable again, its plan never acked
                    return True
            elif not ports_usable:
                waiting = True  # its plans are still to come
        if waiting:
            if at - inc.at > REROUTE_GIVE_UP_S:
                inc.reroute = "unconfirmed"
                return True
            return False
        inc.reroute = "done"
        inc.reroute_ms = round((max(inc.acked.values()) - inc.at) * 1000, 3)
        return True

    def _retire(self, at: float) -> None:
        """Forget incidents that are closed and whose reroute is decided (or given up)."""
        keep = []
        for inc in self.active:
            if inc.reroute == "pending" and at - inc.at > REROUTE_GIVE_UP_S:
                inc.reroute = "unconfirmed"
            if inc.open or inc.reroute == "pending":
                keep.append(inc)
        self.active = keep
