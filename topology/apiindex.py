"""The fabric as the topology service's HTTP API reads it: every HCA port indexed once with
its leaf, SU and cable rate, what the dashboard shows of a port, and what every route handler
shares (:class:`ApiContext`).

Consumes: the service's fabric (once, when the app is made) and a port's latest
:class:`~linkguard.models.PortState`. Produces: :class:`FabricIndex` (ports in fabric order, by
host, by place; the ``/api/v1/fabric`` document), :func:`shown` and :func:`drained_by` (the
dashboard's colour of a port and why it is drained), a port's JSON view, and
:meth:`ApiContext.known_host` (an unknown host is a 404).
"""

import math
from dataclasses import dataclass, field
from typing import Any

from fastapi import HTTPException
from starlette.datastructures import State

from linkguard.models import PortState, PortStatus
from linkguard.topology.serviceview import ServiceView

__all__ = [
    "ApiContext",
    "FabricIndex",
    "FabricPort",
    "drained_by",
    "finite",
    "hca_ref",
    "port_view",
    "shown",
]


def drained_by(st: PortState | None, *, probe_suspect: bool) -> str | None:
    """Why a port whose latest state is ``st`` is drained: ``probe`` when per-rail probes
    localised it as dropping packets (``probe_suspect``: its (host, rail) is in
    :attr:`FabricState.probe_suspect <linkguard.topology.state.FabricState.probe_suspect>`),
    else ``agent`` when its agent drained it (status ``degraded``: error counters over a
    threshold, or back slower; ``reason`` says which), else None."""
    if probe_suspect:
        return "probe"
    if st is not None and st.status == PortStatus.DEGRADED:
        return "agent"
    return None


def shown(st: PortState | None, link_rate_gbps: float | None = None) -> str:
    """What the dashboard shows of a port whose latest state is ``st`` (None: none yet), on a
    link the fabric rates at ``link_rate_gbps`` (Gb/s; None: unrated): ``down``,
    ``held_down``, ``suppressed`` (status suppressed, or damping says suppressed), ``degraded``
    (up and usable but below the link's rate, or a ``degraded`` status), ``up``, ``unknown``."""
    if st is None:
        return "unknown"
    status = st.status
    if status == PortStatus.DOWN:
        return "down"
    if status == PortStatus.HELD_DOWN:
        return "held_down"
    if status == PortStatus.SUPPRESSED or st.damping.suppressed:
        return "suppressed"
    if status == PortStatus.DEGRADED:
        return "degraded"
    if status == PortStatus.UP:
        if (
            st.usable
            and link_rate_gbps is not None
            and st.rate_gbps is not None
            and st.rate_gbps < link_rate_gbps
        ):
            return "degraded"
        return "up"
    return "unknown"


@dataclass(frozen=True)
class FabricPort:
    """One HCA port of the fabric: its host, HCA, rail, netdev, leaf, SU and cable rate."""

    host: str
    hca: str
    port: int
    key: str  # "hca/port", FabricState.ports' key with the host
    rail: int
    netdev: str | None
    link_layer: str | None
    leaf: str | None
    su: int | None
    rate_gbps: float | None  # the cable's rate in the fabric


class FabricIndex:
    """Every HCA port of the fabric with its leaf, SU and cable rate, in fabric order."""

    def __init__(self, service: ServiceView) -> None:
        fabric = service.fabric
        switches = {s.name: s for s in fabric.switches}
        cable: dict[str, tuple[str, float | None]] = {}  # "host:hca/port" -> (leaf, rate)
        for link in fabric.links:
            if link.kind != "host-leaf":
                continue
            for end, other in ((link.a, link.b), (link.b, link.a)):
                if other in switches and ":" in end:
                    cable[end] = (other, link.rate_gbps)
        self.by_host: dict[str, list[FabricPort]] = {}
        self.host_su: dict[str, int | None] = {}
        for inv in fabric.hosts:
            leaves = [cable.get(f"{inv.host}:{h.key}", (None, None)) for h in inv.hcas]
            sus = [switches[leaf].su for leaf, _ in leaves if leaf is not None]
            host_su = next((s for s in sus if s is not None), None)
            self.host_su[inv.host] = host_su
            self.by_host[inv.host] = [
                FabricPort(
                    host=inv.host,
                    hca=h.hca,
                    port=h.port,
                    key=h.key,
                    rail=h.rail,
                    netdev=h.netdev,
                    link_layer=h.link_layer.value if h.link_layer else None,
                    leaf=leaf,
                    su=switches[leaf].su if leaf is not None else host_su,
                    rate_gbps=rate,
                )
                for h, (leaf, rate) in zip(inv.hcas, leaves, strict=True)
            ]
        self.ports = [p for ports in self.by_host.values() for p in ports]
        self.places = {(p.host, p.key): p for p in self.ports}

    def fabric_doc(self, service: ServiceView) -> dict[str, Any]:
        fabric = service.fabric
        leaves = [s for s in fabric.switches if s.role == "leaf"]
        return {
            "name": fabric.name,
            "rails": list(fabric.rails),
            "sus": sorted({s.su for s in leaves if s.su is not None}),
            "hosts_count": len(fabric.hosts),
            "spines": [{"name": s.name, "su": s.su} for s in fabric.switches if s.role == "spine"],
            "leaves": [{"name": s.name, "rail": s.rail, "su": s.su} for s in leaves],
            "hosts": [
                {"host": host, "su": self.host_su[host], "hcas": [hca_ref(p) for p in ports]}
                for host, ports in self.by_host.items()
            ],
        }


def hca_ref(p: FabricPort) -> dict[str, Any]:
    return {"hca": p.hca, "port": p.port, "rail": p.rail, "leaf": p.leaf, "netdev": p.netdev}


def port_view(p: FabricPort, st: PortState | None, *, probe_suspect: bool) -> dict[str, Any]:
    if st is None:
        doc: dict[str, Any] = {
            "host": p.host,
            "hca": p.hca,
            "port": p.port,
            "rail": p.rail,
            "link_layer": p.link_layer,
            "netdev": p.netdev,
            "status": PortStatus.UNKNOWN.value,
            "usable": False,
            "observed_at": None,
        }
    else:
        doc = st.model_dump(mode="json")
    doc.update(
        shown=shown(st, p.rate_gbps),
        drained_by=drained_by(st, probe_suspect=probe_suspect),
        su=p.su,
        leaf=p.leaf,
    )
    return doc


def finite(value: Any) -> Any:
    """``value`` (JSON-like) with NaN and infinities as None: JSON has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


@dataclass
class ApiContext:
    """What the route handlers of one app share: the ``service`` they read, its fabric's
    ``index``, the app's ``state`` (``closing``: an asyncio.Event that ends every open
    stream) and ``cached`` documents (encoded once: static for the service's life)."""

    service: ServiceView
    index: FabricIndex
    state: State
    cached: dict[str, bytes] = field(default_factory=dict)

    def known_host(self, host: str) -> list[FabricPort]:
        """The ports of ``host`` in fabric order; HTTPException 404 when the fabric lacks it."""
        ports = self.index.by_host.get(host)
        if ports is None:
            raise HTTPException(
                404, f"unknown host {host[:253]!r}: not in fabric {self.service.fabric.name!r}"
            )
        return ports
