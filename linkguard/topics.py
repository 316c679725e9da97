"""MQTT topic names, built in this one module. Version prefix ``linkguard/v1``.

Layout (all QoS 1; "R" = retained):
  linkguard/v1/hosts/<host>/inventory            R  HostInventory
  linkguard/v1/hosts/<host>/discovery            R  HostDiscovery (every RDMA port, netdev,
                                                    LLDP neighbour: ``fabric discover``)
  linkguard/v1/hosts/<host>/status               R  HostStatus (last will: online=false)
  linkguard/v1/hosts/<host>/ports/<hca>/<port>   R  PortState
  linkguard/v1/hosts/<host>/events                  PortEvent
  linkguard/v1/hosts/<host>/ack                  R  Ack
  linkguard/v1/hosts/<host>/probes                  ProbeReport (per-rail probe results)
  linkguard/v1/hosts/<host>/plan-request            PlanRequest (the agent asks for its plan
                                                    again; see below)
  linkguard/v1/plans/<host>                      R  Plan
  linkguard/v1/probes/<host>                     R  ProbeTargets (whom each rail probes)
  linkguard/v1/peers/<host>                      R  PeerRoutes (routes every whole host needs
                                                    towards this impaired host; see below)
  linkguard/v1/confirmed/<host>                  R  EventsConfirmed (the host's journaled
                                                    port events the service has recorded)
  linkguard/v1/service/status                    R  ServiceStatus (last will: online=false)
  linkguard/v1/service/audit                     R  fleet audit of agent inventories (JSON)
  linkguard/v1/service/health                    R  switch-level health (JSON, below)
  linkguard/v1/fabric/faults                     R  FabricFaults (operator -> service; the
                                                    complete current set, replaces the last)

``service/health`` is published by the topology service after connecting, after every
accepted or refused ``fabric/faults`` and after a solve that changes the degraded rails:
``Health.summary()`` of :mod:`linkguard.topology.health` (``bisection_gbps``,
``nominal_bisection_gbps``, ``leaves_down``, ``leaves_cut_off``, ``leaves_uplinks_reduced``
{leaf: fraction of uplink capacity left}, ``hosts_losing_rails``) plus ``degraded_rails``
(sorted rail numbers the solver treats as degraded: at least ``Solver.degraded_after`` hosts
cannot use them, so multipath routes leave them out; [] before the first solve), ``at`` (when
the switch-level health was assessed, Unix seconds), ``faults`` (the FabricFaults in effect,
as JSON; null before any was accepted) and ``refused`` (null when the last set received was
accepted, else {``reason``: oversized | not_json | invalid, ``detail``, ``at``: when it was
refused, ``faults``: the refused payload as JSON, or as text when it is not JSON}).

``peers/<host>`` exists for hosts that were impaired (cannot use every rail) at some point:
hosts with a compact plan (``Plan.shared``) subscribe to ``peers/+`` and add what each says
(:func:`linkguard.models.expand_plan`), so a host link event changes one retained message that
the broker fans out, not every host's plan. A peer that is whole again keeps a message with no
``classes``. The service deletes the ones of hosts its fabric does not list. Each carries the
fabric's degraded rails (``PeerRoutes.degraded``): a whole host's compact plan does not depend
on them, so a leaf failure re-publishes only the plans of the hosts that lost a rail, and the
agent leaves the degraded rails of its newest peer routes with classes out of its multipaths.

``confirmed/<host>`` is published by the topology service each time it takes (or is sent
again) a port event that carries a journal number (``PortEvent.seq``): ``upto`` is the highest
number of that journal (``journal``) below which none is missing (recorded, or in a range the
agent reported lost). The agent reads it (and ``service/status``: a service with a new
``instance`` or ``started_at`` has restarted) to forget confirmed events and replay the others
after a reconnect (:mod:`linkguard.agent.journal`). The service de-duplicates by (host,
journal, seq): a replayed event is recorded once.

``hosts/<host>/plan-request`` is published by an agent that may be behind: after every
(re)connect, and when a peer routes message carries a newer leader term than its plan. It
carries the epoch the agent applied; the service re-sends that host's plan and the peer routes
it needs when that epoch is below the one it owes an ack for, at most once per
``convergence.request_min_interval_s`` per host (the others are dropped and counted as
``plan_request_limited``). The service also re-sends, unasked, to an online host that has not
acked its current epoch ``convergence.resend_after_s`` after the publish, with a capped
back-off (:mod:`linkguard.topology.convergence`).

A refused ``fabric/faults`` set (malformed, or naming a switch or cable the fabric lacks)
leaves the faults in effect unchanged, and the service publishes the set in effect back on
``fabric/faults`` (retained), so a restarted service reads that set, not the refused one.
Before it accepted any, the service falls back to the ``faults`` of the ``service/health``
retained by its previous instance; with none either, it publishes nothing there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "linkguard/v1"
_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]+$")

__all__ = [
    "PREFIX",
    "ParsedTopic",
    "ack",
    "all_discovery",
    "all_host_topics",
    "all_peer_routes",
    "all_plans",
    "discovery",
    "events",
    "events_confirmed",
    "fabric_faults",
    "inventory",
    "parse",
    "peer_routes",
    "plan",
    "plan_request",
    "port_state",
    "probe_report",
    "probe_targets",
    "service_audit",
    "service_health",
    "service_status",
    "status",
    "valid_segment",
]


def valid_segment(value: str) -> bool:
    """True when ``value`` can be one topic segment (a host or HCA name)."""
    return bool(_SEGMENT.match(value))


def _seg(value: str) -> str:
    """A topic segment: no MQTT wildcards or separators (``+ # /``), never empty."""
    if not _SEGMENT.match(value):
        raise ValueError(f"not a valid topic segment: {value!r}")
    return value


def inventory(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/inventory"


def discovery(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/discovery"


def status(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/status"


def port_state(host: str, hca: str, port: int) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/ports/{_seg(hca)}/{int(port)}"


def events(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/events"


def ack(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/ack"


def events_confirmed(host: str) -> str:
    return f"{PREFIX}/confirmed/{_seg(host)}"


def plan_request(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/plan-request"


def plan(host: str) -> str:
    return f"{PREFIX}/plans/{_seg(host)}"


def peer_routes(host: str) -> str:
    return f"{PREFIX}/peers/{_seg(host)}"


def probe_targets(host: str) -> str:
    return f"{PREFIX}/probes/{_seg(host)}"


def probe_report(host: str) -> str:
    return f"{PREFIX}/hosts/{_seg(host)}/probes"


def service_status() -> str:
    return f"{PREFIX}/service/status"


def service_audit() -> str:
    return f"{PREFIX}/service/audit"


def service_health() -> str:
    return f"{PREFIX}/service/health"


def fabric_faults() -> str:
    return f"{PREFIX}/fabric/faults"


def all_host_topics() -> str:
    """Subscription filter for everything agents publish."""
    return f"{PREFIX}/hosts/#"


def all_discovery() -> str:
    """Subscription filter for every host's discovery document (``fabric discover``)."""
    return f"{PREFIX}/hosts/+/discovery"


def all_plans() -> str:
    return f"{PREFIX}/plans/+"


def all_peer_routes() -> str:
    return f"{PREFIX}/peers/+"


@dataclass(frozen=True)
class ParsedTopic:
    # inventory | discovery | status | port | events | ack | probes | plan_request | plan | peers |
    # probe_targets | confirmed; host ""
    # for the fabric-wide ones: service_status | service_audit | service_health | fabric_faults
    kind: str
    host: str
    hca: str | None = None
    port: int | None = None


def parse(topic: str) -> ParsedTopic | None:
    """Inverse of the builders; None for anything that is not a linkguard v1 topic."""
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != "linkguard" or parts[1] != "v1":
        return None
    if not all(_SEGMENT.match(p) for p in parts[2:]):
        return None
    if parts[2] == "plans" and len(parts) == 4:
        return ParsedTopic("plan", parts[3])
    if parts[2] == "peers" and len(parts) == 4:
        return ParsedTopic("peers", parts[3])
    if parts[2] == "confirmed" and len(parts) == 4:
        return ParsedTopic("confirmed", parts[3])
    if parts[2] == "probes" and len(parts) == 4:
        return ParsedTopic("probe_targets", parts[3])
    if parts[2:] == ["service", "status"]:
        return ParsedTopic("service_status", "")
    if parts[2:] == ["service", "audit"]:
        return ParsedTopic("service_audit", "")
    if parts[2:] == ["service", "health"]:
        return ParsedTopic("service_health", "")
    if parts[2:] == ["fabric", "faults"]:
        return ParsedTopic("fabric_faults", "")
    if parts[2] != "hosts":
        return None
    host = parts[3]
    rest = parts[4:]
    if rest in (["inventory"], ["discovery"], ["status"], ["events"], ["ack"], ["probes"]):
        return ParsedTopic(rest[0], host)
    if rest == ["plan-request"]:
        return ParsedTopic("plan_request", host)
    # at most 10 digits: int() refuses a text of more than 4,300 (ValueError), and any MQTT
    # client can publish such a topic
    if len(rest) == 3 and rest[0] == "ports" and rest[2].isdigit() and len(rest[2]) <= 10:
        return ParsedTopic("port", host, rest[1], int(rest[2]))
    return None
