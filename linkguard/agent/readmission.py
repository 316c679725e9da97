"""Re-admission after hold-down, and the rate rule while up: UP, or DEGRADED and why.

Consumes a port's :class:`~linkguard.agent.portrecord.PortRecord` (its latest reading and what
it had while last UP: rate, link layer, GID table) with its counter-health reason already set,
the configured ``expected_rates`` (``"hca/port"`` -> Gb/s) and ``rate_settle_s`` (s). Produces
the port's status once its hold-down is over (UP or DEGRADED, with ``readmit_reason``), the
learnt reference rate, and when a rate becomes that reference (a deadline for the monitor's
tick). The rules are those of :mod:`linkguard.agent.monitor` (its docstring, "DEGRADED").
Pure: no clock, no I/O; ``now`` is monotonic seconds from the caller. Logs
``port_readmission_degraded``, ``port_readmission_recovered``, ``port_rate_below_reference``,
``port_link_layer_changed``, ``port_gid_index_changed`` and ``expected_rate_below_reading``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import structlog

from linkguard.agent.portrecord import PortRecord
from linkguard.drivers.base import PortObservation
from linkguard.models import PortStatus

__all__ = ["Readmission", "gid_moves"]

log = structlog.get_logger(__name__)


def gid_moves(before: Mapping[int, str], after: Mapping[int, str]) -> list[str]:
    """The GID indexes that a job may no longer use as it did (``NCCL_IB_GID_INDEX``,
    ``ib_write_bw -x``): each index of ``before`` (index -> GID, non-empty entries) that now
    holds another GID or none, as ``"<index>: <old> -> <new or None>"``, by index. A GID value
    may legitimately sit at two indexes (RoCE v1 and v2 entries), so indexes are compared, not
    values; new entries at unused indexes are not moves."""
    return [
        f"{i}: {gid} -> {after.get(i)}" for i, gid in sorted(before.items()) if after.get(i) != gid
    ]


class Readmission:
    """The re-admission check and the rate rule for the ports of ``host``.

    ``expected_rates`` maps ``"hca/port"`` to the rate (Gb/s) the port must run at (else a
    learnt one); ``rate_settle_s`` (s, >= 0, ``ValueError`` otherwise) is how long a higher
    rate must hold before it becomes a port's learnt reference.
    """

    def __init__(
        self, *, host: str, expected_rates: Mapping[str, float], rate_settle_s: float
    ) -> None:
        if not (math.isfinite(rate_settle_s) and rate_settle_s >= 0):
            raise ValueError(f"rate_settle_s must be a finite number >= 0, got {rate_settle_s!r}")
        self.host = host
        #: "hca/port" -> the rate (Gb/s) the port must run at to be re-admitted UP
        self.expected = dict(expected_rates or {})
        self._expected_warned: set[str] = set()  # expected rate below a reading: said once
        self.rate_settle_s = float(rate_settle_s)

    def up_or_degraded(self, p: PortRecord, now: float) -> PortStatus:
        """UP, or DEGRADED while the counters (``p.health_reason``, set by the caller), a
        bond's members (``p.link_reason``, :mod:`linkguard.agent.linkkinds`), the
        re-admission check or the rate check say so. The rate of a port not short of it (only
        upwards, once held ``rate_settle_s``) and an UP port's link layer and GID table become
        the reference for its next re-admission."""
        key = f"{p.hca}/{p.port}"
        o = p.obs
        if p.readmit_reason is not None and o is not None:
            layer_ok = p.admitted_layer is None or p.link_layer == p.admitted_layer
            if self._readmit_rate(p, o) is None and layer_ok:
                log.info(
                    "port_readmission_recovered", host=self.host, port=key, was=p.readmit_reason
                )
                p.readmit_reason = None
        expected = self.expected.get(key)
        if (
            expected is not None
            and o is not None
            and o.rate_gbps is not None
            and o.rate_gbps > expected
            and key not in self._expected_warned
        ):  # a typo (40 for 400) turns the rate check off for this port: say so once
            self._expected_warned.add(key)
            log.warning(
                "expected_rate_below_reading",
                host=self.host,
                port=key,
                expected_gbps=expected,
                read_gbps=o.rate_gbps,
                hint="the port is held only to expected_rate_gbps; a slower retrain above it "
                "goes unnoticed. Raise it to the rate the port should run at, or remove it",
            )
        if p.readmit_reason is None and o is not None:
            # the rate rule while up: the same check as at re-admission, on every reading
            p.readmit_reason = self._rate_short(p, o)
            if p.readmit_reason is not None:
                log.warning(
                    "port_rate_below_reference", host=self.host, port=key, reason=p.readmit_reason
                )
        if p.readmit_reason is None and o is not None and self._layer_changed(p):
            # a link-layer change too quick for the state poll: as at re-admission
            p.readmit_reason = self._layer_reason(p)
        if p.readmit_reason is None and self._rate_settled(p, now):
            # a rate held for rate_settle_s (counters may be over a threshold: the rate is
            # still right); one glitched reading (a retrain caught mid-way, a corrupt file)
            # never becomes the bar the port is then held to
            assert p.obs is not None and p.obs.rate_gbps is not None  # _rate_settled: both set
            p.ref_rate = max(p.ref_rate or 0.0, p.obs.rate_gbps)
        if p.readmit_reason is not None or p.health_reason is not None or p.link_reason:
            return PortStatus.DEGRADED
        if o is not None:
            p.admitted_layer = p.link_layer
            if o.gids is not None:
                p.admitted_gids = o.gids
        return PortStatus.UP

    def _rate_settled(self, p: PortRecord, now: float) -> bool:
        o = p.obs
        return (
            o is not None
            and bool(o.rate_gbps)
            and p.rate_since is not None
            and now - p.rate_since >= self.rate_settle_s
        )

    def rate_deadline(self, p: PortRecord) -> float | None:
        """When a rate above the port's reference becomes it (a tick is due then), else None."""
        o = p.obs
        if not p.raw or o is None or not o.rate_gbps or p.rate_since is None:
            return None
        if f"{p.hca}/{p.port}" in self.expected or o.rate_gbps <= (p.ref_rate or 0.0):
            return None
        return p.rate_since + self.rate_settle_s

    def _ref_rate(self, p: PortRecord) -> float | None:
        return self.expected.get(f"{p.hca}/{p.port}") or p.ref_rate

    def _rate_short(self, p: PortRecord, o: PortObservation) -> str | None:
        """``"rate 200 < 400 Gb/s"`` when ``o``'s rate is below the port's reference rate,
        else None (rate unread, or no reference yet)."""
        ref = self._ref_rate(p)
        if o.rate_gbps is not None and ref is not None and o.rate_gbps < ref:
            return f"rate {o.rate_gbps:g} < {ref:g} Gb/s"
        return None

    def _readmit_rate(self, p: PortRecord, o: PortObservation) -> str | None:
        """:meth:`_rate_short`, and, for a port that has a learnt reference, an unread rate:
        ``"rate unreadable (was 400 Gb/s)"``. A port is not re-admitted on a rate it cannot
        show (the check would pass on nothing); one that never had a readable rate (the
        netlink driver reads none) has no reference and is not held to one."""
        short = self._rate_short(p, o)
        if short is None and o.rate_gbps is None and p.ref_rate is not None:
            return f"rate unreadable (was {self._ref_rate(p):g} Gb/s)"
        return short

    @staticmethod
    def _layer_changed(p: PortRecord) -> bool:
        """A link layer read that differs from the one the port had while last UP (an unread
        one is no change while up)."""
        return (
            p.admitted_layer is not None
            and p.link_layer is not None
            and p.link_layer != p.admitted_layer
        )

    def _layer_reason(self, p: PortRecord) -> str:
        """``"link_layer InfiniBand -> Ethernet"``, logged as ``port_link_layer_changed``."""
        was = p.admitted_layer.value if p.admitted_layer else None
        now_layer = p.link_layer.value if p.link_layer else None
        key = f"{p.hca}/{p.port}"
        log.warning("port_link_layer_changed", host=self.host, port=key, was=was, now=now_layer)
        return f"link_layer {was} -> {now_layer}"

    def readmit(self, p: PortRecord) -> None:
        """Compare the port coming back from hold-down with what it was while last UP (rate,
        link layer, GID table); sets ``readmit_reason`` / ``gid_index_changed`` and logs."""
        o, key = p.obs, f"{p.hca}/{p.port}"
        if o is None:
            return
        rate_short = self._readmit_rate(p, o)
        reasons = [] if rate_short is None else [rate_short]
        if p.admitted_layer is not None and p.link_layer != p.admitted_layer:
            reasons.append(self._layer_reason(p))
        p.readmit_reason = "; ".join(reasons) or None
        if p.readmit_reason is not None:
            log.warning(
                "port_readmission_degraded", host=self.host, port=key, reason=p.readmit_reason
            )
        if o.gids is not None and p.admitted_gids is not None:
            moved = gid_moves(p.admitted_gids, o.gids)
            p.gid_index_changed = bool(moved)
            if moved:
                log.warning("port_gid_index_changed", host=self.host, port=key, moved=moved[:16])
            p.admitted_gids = o.gids
