"""The probe messages of the bus contract (:mod:`linkguard.models`): the ports the service asks
an agent to probe (:class:`ProbeTargets`) and what the agent measured (:class:`ProbeReport`)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from linkguard.models.base import Epoch, HostName, RailIndex, _Model
from linkguard.models.plan import (
    IPv4Text,
)

__all__ = [
    "ProbePair",
    "ProbePeer",
    "ProbeRail",
    "ProbeReport",
    "ProbeTargets",
]


class ProbePeer(_Model):
    """One port to probe: ``host``'s HCA port on ``rail``, at its rail ``address``."""

    host: HostName
    rail: RailIndex
    address: IPv4Text


class ProbeRail(_Model):
    """The peers one local rail probes (at most 16: ``probeplan.MAX_PROBES_PER_PORT_PPS``)."""

    rail: RailIndex
    address: IPv4Text = Field(description="this host's address on the rail (probe source)")
    peers: list[ProbePeer] = Field(default_factory=list, max_length=16)


class ProbeTargets(_Model):
    """Service -> agent, retained on ``probes/<host>``: whom each of the host's rails probes
    in probe plan ``epoch`` (:mod:`linkguard.topology.probeplan`), how (``mode``/``port``,
    ``rate_pps`` probes/s to each peer, ``timeout_s``) and how often to report (``window_s``,
    :class:`ProbeReport`)."""

    host: HostName
    epoch: Epoch
    mode: Literal["udp", "roce"] = "udp"
    port: int = Field(47_910, ge=1, le=65535)
    rate_pps: float = Field(1.0, gt=0, le=16)
    timeout_s: float = Field(1.0, gt=0, le=60)
    window_s: float = Field(10.0, gt=0, le=3600)
    rails: list[ProbeRail] = Field(default_factory=list, max_length=64)


class ProbePair(_Model):
    """One window of probes from local ``rail`` to ``peer_host``'s ``peer_rail``: ``sent``
    probes whose reply deadline passed in the window, ``lost`` of them unanswered, RTT
    percentiles in milliseconds (None when nothing came back)."""

    rail: RailIndex
    peer_host: HostName
    peer_rail: RailIndex
    sent: int = Field(ge=0, le=1_000_000)
    lost: int = Field(ge=0, le=1_000_000)
    rtt_p50_ms: float | None = Field(None, ge=0, le=60_000)
    rtt_p99_ms: float | None = Field(None, ge=0, le=60_000)

    @model_validator(mode="after")
    def _lost_le_sent(self) -> ProbePair:
        if self.lost > self.sent:
            raise ValueError(f"lost {self.lost} > sent {self.sent}")
        return self


class ProbeReport(_Model):
    """Agent -> service, on ``hosts/<host>/probes`` (not retained) every ``window_s``: the
    probe results of the window ending at ``window_end`` (the agent's wall clock, Unix s;
    informational: the service dates a report by its arrival)."""

    host: HostName
    epoch: Epoch = Field(description="the ProbeTargets epoch probed")
    window_end: float = Field(ge=0)
    window_s: float = Field(gt=0, le=3600)
    pairs: list[ProbePair] = Field(default_factory=list, max_length=1024)
