"""The ``job:`` block of a scenario: a training job that ``linkguard sim lab`` runs on the lab.

Consumes: the ``job:`` mapping of a scenario file (:mod:`linkguard.simulations.scenario`).
Produces: a validated :class:`JobSpec`; :func:`check_job` adds the checks that need the fabric
(hosts exist, enough layers for every rail). Only ``sim lab`` runs a job
(:mod:`linkguard.simulations.labjob` starts it, :mod:`linkguard.simulations.jobtrain` is one
rank); ``sim run`` and ``sim fleet`` ignore it. Nothing here imports torch::

    job:
      kind: torch-gloo        # PyTorch DDP over Gloo on the CPU, one rank per host
      hosts: [gpu000, gpu001] # optional; default every host of the fabric (at least 2)
      compute_ms: 50          # per step, a sleep standing for the GPU's compute (ms)
      width: 256              # the model: `layers` x Linear(width, width) ...
      layers: 8               # ... one DDP bucket (one all-reduce) per layer and step
      batch: 32
      timeout_s: 10           # Gloo's collective timeout: a collective stuck longer fails
      warmup_steps: 20        # steps every rank completes before the first fault
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from linkguard.models import HostName
from linkguard.topology.fabric import Fabric

__all__ = ["JOB_KINDS", "JobSpec", "check_job", "job_hosts"]

#: Job kinds a scenario may ask for.
JOB_KINDS = ("torch-gloo",)


class JobSpec(BaseModel):
    """A training job across lab hosts (module docstring). One rank per host in ``hosts``
    (None: every host of the fabric, in fabric order; rank 0 first), each with one Gloo
    device per GPU endpoint of its host. A step is ``compute_ms`` of sleep, forward and
    backward of the model, ``layers`` gradient all-reduces and one stop-flag all-reduce;
    ``timeout_s`` bounds every collective (s): without linkguard an outage longer than it
    (plus TCP's back-off) fails the job, as the experiment behind the defaults saw (a 40 s
    outage stalled 54.5 s; a 10 s timeout failed the job)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )

    kind: Literal["torch-gloo"]
    hosts: list[HostName] | None = Field(None, min_length=2, max_length=32)
    compute_ms: float = Field(50.0, ge=0, le=10_000, description="sleep per step (ms)")
    width: int = Field(256, ge=8, le=4096, description="features of each Linear layer")
    layers: int = Field(8, ge=1, le=64, description="Linear layers = DDP buckets per step")
    batch: int = Field(32, ge=1, le=4096)
    timeout_s: float = Field(10.0, ge=1, le=3600, description="Gloo collective timeout (s)")
    warmup_steps: int = Field(20, ge=3, le=10_000, description="steps before the first fault")

    @field_validator("hosts")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            twice = sorted({h for h in v if v.count(h) > 1})
            raise ValueError(f"a host runs one rank: {', '.join(twice)} listed twice")
        return v


def job_hosts(job: JobSpec, fabric: Fabric) -> list[str]:
    """The job's hosts in rank order."""
    return list(job.hosts) if job.hosts is not None else list(fabric.host_names)


def check_job(job: JobSpec, fabric: Fabric) -> list[str]:
    """Problems of ``job`` on ``fabric``, one sentence each, prefixed ``job``: hosts that are
    not in the fabric, fewer than two ranks, a host without GPU endpoints, fewer layers
    than a host has endpoints (then not every rail carries an all-reduce every step)."""
    names = set(fabric.host_names)
    hosts = job_hosts(job, fabric)
    missing = [h for h in hosts if h not in names]
    if missing:
        return [f"job: host {missing[0]!r} is not in the fabric"]
    if len(hosts) < 2:
        return [f"job: needs at least 2 hosts (one rank each), the fabric has {len(hosts)}"]
    problems = []
    for h in hosts:
        eps = fabric.host(h).endpoints
        if not eps:
            problems.append(f"job: host {h!r} has no GPU endpoints to bind Gloo to")
        elif job.layers < len(eps):
            problems.append(
                f"job: layers {job.layers} < the {len(eps)} GPU endpoints of {h}: each layer is "
                "one DDP bucket (one all-reduce) per step, and the all-reduces rotate over the "
                f"endpoints; give layers >= {len(eps)} so every rail carries traffic every step"
            )
            break
    return problems
