"""Whether a scenario can run on the namespace lab here (:mod:`linkguard.simulations.labrun`).

Consumes: a :class:`~linkguard.simulations.scenario.LoadedScenario` and agent settings.
Produces: nothing, or a :class:`LabRunError` saying why not: a fabric file, a fabric too large
(:data:`MAX_LAB_HOSTS`, :data:`MAX_LAB_RAILS`) or without rail-major endpoints, agent settings
the agent refuses; and, checking the environment, no root, no iproute2, no Mosquitto, no torch
for a job.
"""

from __future__ import annotations

import os
import shutil

from linkguard.simulations.labjob import torch_problem
from linkguard.simulations.labprocs import agent_overrides
from linkguard.simulations.scenario import LoadedScenario

__all__ = ["MAX_LAB_HOSTS", "MAX_LAB_RAILS", "LabRunError", "check_lab_scenario"]

#: Largest fabric the lab builds (hosts, rails): each host is a namespace, each port a veth
#: pair, each agent a Python process (~60 MB); 32 agents fit a small machine.
MAX_LAB_HOSTS = 32
MAX_LAB_RAILS = 16


class LabRunError(RuntimeError):
    """The scenario cannot run on the lab here (not root, no mosquitto, a fabric file, a
    fabric too large); the message says why."""


def check_lab_scenario(
    loaded: LoadedScenario,
    *,
    environment: bool = True,
    agent_settings: dict[str, object] | None = None,
) -> None:
    """Raise :class:`LabRunError` when ``loaded`` cannot run on a lab: a fabric file, a fabric
    too large or without rail-major endpoints, agent settings (the scenario's, then
    ``agent_settings``) the agent refuses; with ``environment``, also when this machine
    lacks what the lab needs (root, iproute2, Mosquitto, and torch for a job)."""
    sc, fabric = loaded.scenario, loaded.fabric
    try:
        agent_overrides({**sc.agent_settings, **(agent_settings or {})})
    except ValueError as exc:
        raise LabRunError(f"{loaded.path}: {exc}") from None
    if sc.fabric.generate is None:
        raise LabRunError(
            f"{loaded.path}: the lab builds generated fabrics only (fabric: generate: {{...}}); "
            f"this scenario uses the fabric file {sc.fabric.file!r}: use `sim run` for it"
        )
    if len(fabric.hosts) > MAX_LAB_HOSTS or len(fabric.rails) > MAX_LAB_RAILS:
        raise LabRunError(
            f"{loaded.path}: {len(fabric.hosts)} hosts x {len(fabric.rails)} rails is too large "
            f"for a lab (at most {MAX_LAB_HOSTS} hosts and {MAX_LAB_RAILS} rails: every host is "
            "a namespace with its own agent process); use `sim run` for it"
        )
    if not fabric.endpoint_subnets:
        raise LabRunError(f"{loaded.path}: the lab needs rail-major endpoints (endpoint_subnets)")
    if not environment:
        return
    if os.geteuid() != 0:
        raise LabRunError(
            "sim lab needs root: it builds network namespaces and veth pairs (run it as root, "
            "e.g. with sudo)"
        )
    if shutil.which("ip") is None:
        raise LabRunError("sim lab needs iproute2 (`ip`)")
    if not (shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")):
        raise LabRunError("sim lab needs Mosquitto (Debian package `mosquitto`)")
    if sc.job is not None and (problem := torch_problem()):
        raise LabRunError(f"{loaded.path}: {problem}")
