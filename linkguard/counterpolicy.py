"""When error counters drain an up port: per-counter thresholds (events per window) and the
clear hysteresis (:class:`CounterHealthPolicy`, ``counter_health`` in the agent settings).

Consumes: settings (YAML, environment) through pydantic. Produces: the policy, which the
agent's counter-health tracker (:mod:`linkguard.agent.health`) applies. Here, below the agent,
so that the settings (:mod:`linkguard.config`) need not import the agent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from linkguard.models import SettingsModel

__all__ = ["DEFAULT_THRESHOLDS", "MIN_WINDOW_S", "CounterHealthPolicy", "CounterThreshold"]


#: Shortest ``window_s`` (s) of :class:`CounterHealthPolicy`: 5 counter readings (the sysfs
#: driver re-reads counters every ``counters_interval_s`` = 1 s), so a window sees a rate, not
#: a single delta; a shorter one would rarely hold more than one reading and degrade nothing.
MIN_WINDOW_S = 5.0


class CounterThreshold(BaseModel):
    """Events per window: ``degrade`` or more drains the port; it comes back once the count
    stays at or below ``clear`` (< ``degrade``) for the policy's ``clear_after_s``.

    Both are whole numbers, strictly: an int, or a string of digits (the environment's
    ``..._DEGRADE=50``); a bool (YAML ``true``), a float or anything else raises
    ``pydantic.ValidationError``, the same from YAML and from the environment."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    degrade: int = Field(ge=1, le=2**32, strict=True)
    clear: int = Field(ge=0, le=2**32, strict=True)

    @field_validator("degrade", "clear", mode="before")
    @classmethod
    def _whole_number(cls, v: object) -> object:
        if isinstance(v, int) and not isinstance(v, bool):  # YAML true/false: not 1/0 events
            return v
        if isinstance(v, str) and v.strip().lstrip("+").isdigit():  # the environment's text
            return int(v.strip())
        shown = str(v).lower() if isinstance(v, bool) else repr(v)
        raise ValueError(f"must be a whole number of events per window, not {shown}")

    @model_validator(mode="after")
    def _clear_below(self) -> CounterThreshold:
        if self.clear >= self.degrade:
            raise ValueError(
                f"clear ({self.clear}) must be below degrade ({self.degrade}), or a degraded "
                "port would clear while still over its threshold"
            )
        return self


def _t(degrade: int, clear: int) -> CounterThreshold:
    return CounterThreshold(degrade=degrade, clear=clear)


#: Defaults per counter, events per 60 s window (see :class:`CounterHealthPolicy` for why).
DEFAULT_THRESHOLDS: Mapping[str, CounterThreshold] = MappingProxyType(
    {
        # IB PMA PortCounters (sysfs counters/, IBA vol. 1 16.1.3.5)
        "symbol_error": _t(100, 10),
        "port_rcv_errors": _t(100, 10),
        "link_error_recovery": _t(3, 0),
        "link_downed": _t(2, 0),
        "local_link_integrity_errors": _t(2, 0),
        "excessive_buffer_overrun_errors": _t(2, 0),
        # RoCE netdev PHY counters (mlx5 ethtool -S)
        "rx_symbol_err_phy": _t(100, 10),
        "rx_crc_errors_phy": _t(100, 10),
        "link_down_events_phy": _t(2, 0),
    }
)


class CounterHealthPolicy(SettingsModel):
    """When error counters drain an up port (``counter_health`` in the agent settings).

    ``window_s`` (s) = 60: thresholds are events per 60 s. ``clear_after_s`` (s) = 300: a
    degraded port returns after 5 minutes below every ``clear`` threshold, the damping's
    ``hold_down_max_s`` (a drained rail costs ~1/7 of one NIC's bandwidth, DESIGN.md; a port
    re-admitted too early costs retransmits and another re-plan). ``enabled`` False: never.

    Default thresholds (``DEFAULT_THRESHOLDS``) and where they come from:

    * ``symbol_error``, ``port_rcv_errors`` (IB), ``rx_symbol_err_phy``, ``rx_crc_errors_phy``
      (RoCE): degrade at 100 per 60 s, clear at 10. Derived from the link BER the standards
      require, 1e-12 (IBTA vol. 2 PHY for SDR..EDR; IEEE 802.3 for 25G+ lanes; HDR/NDR and
      400GbE meet it after FEC): at 400 Gb/s that allows 0.4 errors/s = 24 per minute, at
      100 Gb/s 6. 100/min is 4x worse than in-spec at the fastest link and 16x at 100 Gb/s,
      while a healthy link (FEC-corrected) shows ~0; clear at 10/min is in spec everywhere.
      A judgement on top of the spec figure, not a vendor number.
    * ``link_error_recovery`` 3, ``link_downed`` 2, ``link_down_events_phy`` 2 per 60 s (clear
      0): beyond the flaps the monitor saw, so these are retrains too short for the 100 ms
      state poll; each one stalls the link. Judgement (infiniband-diags' ibcheckerrs and
      ibqueryerrors flag any non-zero value; two in a minute is a pattern, one may be noise).
    * ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors`` 2 per 60 s (clear
      0): each increment already means a PHY error threshold (PortInfo.LocalPhyErrors) or the
      overrun threshold (PortInfo.OverrunErrors) was crossed (IBA vol. 1 16.1.3.5); 4-bit
      counters that saturate at 15. Judgement.

    ``thresholds`` given in the settings replace the defaults per counter name (a name not
    given keeps its default); set a counter's ``degrade`` very high to ignore it. A counter may
    give only one of the two: ``clear`` alone keeps the default ``degrade``; ``degrade`` alone
    keeps the default ``clear`` when that is below it, else takes ``degrade // 10`` (the
    defaults' 100/10 ratio; 0 below 10). Raises ``pydantic.ValidationError`` for a
    non-finite/non-positive time, a ``window_s`` under :data:`MIN_WINDOW_S` (5 s: counters are
    read once a second), a ``clear_after_s`` under 1 s (one counter reading), a threshold that
    is not a whole number (a bool included), ``clear >= degrade`` (naming the counter), a
    counter given neither, a counter name that is not one of ``DEFAULT_THRESHOLDS`` (a typo
    must not be ignored).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    enabled: bool = Field(True, description="error counters can drain an up port (degraded)")
    window_s: float = Field(
        60.0, gt=0, le=86_400, description=f"events counted over this long (s), >= {MIN_WINDOW_S:g}"
    )
    # >= 1 s: counters are read once a second; a shorter time would clear on one clean reading
    clear_after_s: float = Field(
        300.0, ge=1.0, le=86_400, description="counters below clear this long end degraded (s)"
    )
    thresholds: dict[str, CounterThreshold] = Field(
        default_factory=dict,
        max_length=64,
        description="counter name -> {degrade, clear} events per window; {}: the defaults",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_thresholds(cls, data: object) -> object:
        # a counter given only degrade or only clear gets the other one (class docstring)
        if not isinstance(data, Mapping):
            return data  # pydantic says what is wrong
        given = data.get("thresholds")
        if not isinstance(given, Mapping):
            return data  # absent, or not a mapping: pydantic says what is wrong
        unknown = [n for n in given if n not in DEFAULT_THRESHOLDS]
        if any(not isinstance(given[n], Mapping) or len(given[n]) < 2 for n in unknown):
            _unknown_counters(unknown)  # not "clear: field required" for a misspelt name
        filled = {}
        for name, t in given.items():
            if isinstance(t, Mapping) and name in DEFAULT_THRESHOLDS:
                t = _fill_threshold(name, t)
            filled[name] = t
        return {**data, "thresholds": filled}

    @field_validator("window_s")
    @classmethod
    def _whole_readings(cls, v: float) -> float:
        if v < MIN_WINDOW_S:
            raise ValueError(
                f"{v:g} s is too short: counters are read once a second (the sysfs driver's "
                f"counters_interval_s = 1 s), so a window under {MIN_WINDOW_S:g} s (5 readings) "
                f"would rarely see a rate and never degrade a port; give window_s >= "
                f"{MIN_WINDOW_S:g}"
            )
        return v

    @model_validator(mode="after")
    def _merge_defaults(self) -> CounterHealthPolicy:
        if not (math.isfinite(self.window_s) and math.isfinite(self.clear_after_s)):
            raise ValueError("window_s and clear_after_s must be finite seconds")
        unknown = [n for n in self.thresholds if n not in DEFAULT_THRESHOLDS]
        if unknown:
            _unknown_counters(unknown)
        merged = {**DEFAULT_THRESHOLDS, **self.thresholds}
        object.__setattr__(self, "thresholds", merged)
        return self


def _unknown_counters(names: Sequence[object]) -> None:
    """ValueError naming the counters that are not in ``DEFAULT_THRESHOLDS``."""
    raise ValueError(
        f"thresholds: unknown counter(s) {', '.join(sorted(map(str, names)))}; known: "
        f"{', '.join(sorted(DEFAULT_THRESHOLDS))}"
    )


def _as_int(v: object) -> int | None:
    """``v`` as an int when it plainly is one (YAML int, or a string of digits from the
    environment), else None (pydantic then reports the bad value)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lstrip("+").isdigit():
        return int(v.strip())
    return None


def _fill_threshold(name: str, t: Mapping[str, object]) -> dict[str, object]:
    """``t`` (one counter's override) with the missing ``degrade`` or ``clear`` filled in from
    ``DEFAULT_THRESHOLDS[name]``; ValueError naming the counter when neither is given, a key
    is neither, or the pair has ``clear >= degrade``."""
    default = DEFAULT_THRESHOLDS[name]
    out = dict(t)
    extra = sorted(str(k) for k in out if k not in ("degrade", "clear"))
    if extra:  # a misspelt key (``degrad``; the environment's ..._DEGRAD) is named
        raise ValueError(
            f"thresholds.{name}: unknown key(s) {', '.join(extra)}; give degrade, clear or both"
        )
    if "degrade" not in out and "clear" not in out:
        raise ValueError(f"thresholds.{name}: give degrade, clear or both")
    if "degrade" not in out:
        out["degrade"] = default.degrade
    elif "clear" not in out:
        d = _as_int(out["degrade"])
        # a degrade under 1 is refused on its own; the clear filled in must not add an error
        keep = d is None or d < 1 or default.clear < d
        out["clear"] = default.clear if d is None or keep else d // 10
    d, c = _as_int(out["degrade"]), _as_int(out["clear"])
    if d is not None and d >= 1 and c is not None and c >= d:  # degrade 0: pydantic's ge=1
        which = ", the default degrade" if "degrade" not in t else ""
        raise ValueError(
            f"thresholds.{name}: clear ({c}) must be below degrade ({d}{which}), or a degraded "
            "port would clear while still over its threshold"
        )
    return out
