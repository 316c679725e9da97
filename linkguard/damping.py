"""The damping rules a port that came back is kept out by: hold-down back-off or RFC 2439
penalty suppression (:class:`DampingPolicy`, ``damping`` in the agent settings).

Consumes: settings (YAML, environment) through pydantic. Produces: the policy and its
arithmetic (hold-down per flap count, penalty decay, reuse delay), which the agent's port
monitor (:mod:`linkguard.agent.monitor`) applies. Here, below the agent, so that the settings
(:mod:`linkguard.config`) need not import the agent.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from linkguard.models import SettingsModel

__all__ = ["DampingPolicy"]

#: The penalty ceiling is reuse * 2**ratio; a ratio above this is a configuration mistake.
_MAX_SUPPRESS_RATIO = 64.0


class DampingPolicy(SettingsModel):
    """How a port that came back is kept out before reuse. Times in seconds (s).

    Defaults are chosen for synchronous GPU training, where the two costs are lopsided:

    * Keeping a healthy port out for H s moves its traffic to the surviving rails; with 1 of 8
      rails out the busiest NIC carries 8/7 of its load (DESIGN.md), so the job loses at most
      ~0.14*H s even when fully communication-bound: 1.4 s for 10 s, 43 s for 300 s.
    * Re-admitting a port that fails again costs a job-wide stall every time: in-flight RC
      traffic waits at least one retransmit timeout (4.096 us * 2**NCCL_IB_TIMEOUT = 4.3 s at
      the default 20), and Alibaba HPN measured > 9 s of halted training per ToR link flap.

    Hence ``hold_down_initial_s`` = 10 s: a clean one-off repair (reseat, leaf reboot) gets its
    rail back within seconds at a cost of ~1/3 of one stall, while a marginal cable or
    transceiver that retrains again right away (flaps come in bursts: HPN sees 5K-60K a day
    fleet-wide) is caught. Each further flap doubles it (10, 20, 40, 80, 160, 300 s) up to
    ``hold_down_max_s`` = 300 s (Open/R's maximum); a port that flapped six times in a row is
    for the operators, and 43 s of degraded rail is what ten avoided 4.3 s stalls cost.
    ``quiet_period_s`` = 600 s (2 x max): a port flapping every few minutes keeps its history,
    a repaired link starts fresh after ten quiet minutes. Open/R's 60 s -> 300 s is tuned for
    backbone routers; here a held rail costs little, but the first return should be fast.

    Penalty mode (RFC 2439 section 4) uses the RFC/vendor thresholds (per flap 1000, suppress
    2000, reuse 750) with ``half_life_s`` = 60 s: RFC 2439 section 4.3 wants the half-life well
    above the flap period it should catch, and an IB flap cycle (Polling -> LinkUp -> INIT ->
    ACTIVE, paced by the SM sweep, OpenSM default 10 s) lasts seconds to tens of seconds. Three
    flaps less than 60*log2(1/0.618) = 41.7 s apart suppress the port; reuse comes
    60*log2(penalty/750) s after the last flap (>= 85 s). ``max_suppress_s`` = 300 s bounds it
    like the backoff maximum: the penalty is clipped to the ceiling
    ``reuse_threshold * 2**(max_suppress_s / half_life_s)`` = 24000 (RFC 2439 sections 4.2
    "T-hold" and 4.8.2 "clip to ceiling"). RFC 2439's separate reachable/unreachable half-lives
    (decay-ok/decay-ng) are folded into one.

    Raises ``pydantic.ValidationError`` (a ``ValueError``) naming the field when a value is not a
    finite positive number, ``reuse_threshold >= suppress_threshold``,
    ``hold_down_initial_s > hold_down_max_s``, or the ceiling is not above
    ``suppress_threshold`` (a port could never be suppressed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["backoff", "penalty"] = Field(
        "backoff", description="backoff: a hold-down that doubles per flap; penalty: RFC 2439"
    )
    hold_down_initial_s: float = Field(
        10.0, description="backoff: the first flap holds the port down this long (s)"
    )
    hold_down_max_s: float = Field(
        300.0, description="backoff: each flap doubles the hold-down up to this (s)"
    )
    quiet_period_s: float = Field(
        600.0, description="backoff: this long without a flap forgets the history (s)"
    )
    penalty_per_flap: float = Field(
        1000.0, description="penalty: added per flap (RFC 2439 section 4)"
    )
    half_life_s: float = Field(60.0, description="penalty: the penalty halves in this long (s)")
    suppress_threshold: float = Field(
        2000.0, description="penalty: above this the port is held down"
    )
    reuse_threshold: float = Field(
        750.0, description="penalty: below this a held port is used again"
    )
    max_suppress_s: float = Field(
        300.0, description="penalty: longest hold-down after the last flap (s)"
    )

    @model_validator(mode="after")
    def _check(self) -> DampingPolicy:
        bad = [
            f"{name} must be a finite number > 0 (got {value!r})"
            for name, value in self
            if name != "mode" and not (math.isfinite(value) and value > 0)
        ]
        if bad:
            raise ValueError("; ".join(bad))
        if self.reuse_threshold >= self.suppress_threshold:
            raise ValueError(
                f"reuse_threshold ({self.reuse_threshold:g}) must be below suppress_threshold "
                f"({self.suppress_threshold:g}), or a suppressed port would be reused at once"
            )
        if self.hold_down_initial_s > self.hold_down_max_s:
            raise ValueError(
                f"hold_down_initial_s ({self.hold_down_initial_s:g}) must not exceed "
                f"hold_down_max_s ({self.hold_down_max_s:g})"
            )
        ratio = self.max_suppress_s / self.half_life_s
        if ratio > _MAX_SUPPRESS_RATIO:
            raise ValueError(
                f"max_suppress_s / half_life_s = {ratio:g} is above {_MAX_SUPPRESS_RATIO:g}: "
                "the penalty ceiling reuse * 2**ratio would be astronomically large"
            )
        if self.ceiling <= self.suppress_threshold:
            raise ValueError(
                f"the penalty ceiling reuse_threshold * 2**(max_suppress_s / half_life_s) = "
                f"{self.ceiling:g} is not above suppress_threshold ({self.suppress_threshold:g}): "
                "no port could ever be suppressed; raise max_suppress_s or lower the threshold"
            )
        return self

    @property
    def ceiling(self) -> float:
        """Highest penalty a port can reach (RFC 2439 section 4.2, T-hold): from here it
        decays to ``reuse_threshold`` in exactly ``max_suppress_s``."""
        return self.reuse_threshold * 2.0 ** (self.max_suppress_s / self.half_life_s)

    def hold_down_for(self, flaps: int) -> float:
        """Hold-down (s) for a return after ``flaps`` flaps in the current history.

        Backoff: ``min(max, initial * 2**(flaps-1))`` (0 or 1 flap -> initial). Penalty: always
        ``initial`` (the penalty does the backing off).
        """
        if self.mode == "penalty" or flaps <= 1:
            return self.hold_down_initial_s
        return min(self.hold_down_max_s, self.hold_down_initial_s * 2.0 ** min(flaps - 1, 64))

    def decayed(self, penalty: float, elapsed_s: float) -> float:
        """``penalty * 2**(-elapsed/half_life)`` (RFC 2439 section 2.3, exponential decay)."""
        return penalty * 2.0 ** (-max(0.0, elapsed_s) / self.half_life_s)

    def reuse_delay(self, penalty: float) -> float:
        """Seconds until ``penalty`` decays to ``reuse_threshold`` (0 if already there)."""
        if penalty <= self.reuse_threshold:
            return 0.0
        return self.half_life_s * math.log2(penalty / self.reuse_threshold)
