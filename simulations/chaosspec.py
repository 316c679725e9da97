"""The ``chaos:`` section of a scenario file: a lab chaos run
(:mod:`linkguard.simulations.labchaos`, ``linkguard sim lab``) instead of a timeline.

Consumes: the section's YAML mapping. Produces: a validated :class:`ChaosSpec`. The storm and
the proxy's rules it describes are :mod:`linkguard.simulations.chaosstorm`'s
(:func:`~linkguard.simulations.chaosstorm.storm_schedule`,
:func:`~linkguard.simulations.chaosstorm.chaos_rules`), the ones ``linkguard sim chaos`` uses.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ChaosSpec"]


class ChaosSpec(BaseModel):
    """A seeded storm of port faults in the lab's kernel (fabric ends of the host veths set
    down/up) while the chaos proxy between the agents and the broker drops ``loss`` of the
    publishes, duplicates, delays and reorders ``loss / 2`` each and cuts ``cuts``
    connections; then the checks of :mod:`linkguard.simulations.labchaos`. Times in s."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    loss: float = Field(0.1, ge=0, le=1, description="drop probability per publish (0..1)")
    storm_s: float = Field(3.0, gt=0, le=600, description="the storm's length (s)")
    events_per_s: float = Field(
        3.0, gt=0, le=100, description="port faults per second in the storm (mean)"
    )
    cuts: int = Field(2, ge=0, le=1000, description="agent connections the proxy cuts")
    cut_probability: float = Field(
        0.05,
        ge=0,
        le=1,
        description="the chance a publish (after the storm's first 5) cuts its connection, "
        "until ``cuts`` were cut",
    )
    within_s: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="every host acks the service's current epoch within this long after the "
        "storm (s)",
    )
    resend_after_s: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="the service's convergence.resend_after_s for the run (s; production "
        "default 5)",
    )
    resend_max_s: float = Field(
        2.0,
        gt=0,
        le=3600,
        description="the service's convergence.resend_max_s for the run (s; production default 60)",
    )

    @model_validator(mode="after")
    def _resend_order(self) -> ChaosSpec:
        if self.resend_max_s < self.resend_after_s:
            raise ValueError(
                f"chaos.resend_max_s {self.resend_max_s:g} is below resend_after_s "
                f"{self.resend_after_s:g}"
            )
        return self
