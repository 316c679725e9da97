"""The fabric: its model (re-exported from :mod:`linkguard.topology.fabricmodel`), the rail-
optimized generator (re-exported from :mod:`linkguard.topology.generator`) and fabric files.

Consumes: a fabric file (JSON or YAML, :func:`load_fabric`) or generator parameters
(:func:`generate_rail_optimized`). Produces: a validated :class:`Fabric`, which the solver
(:mod:`linkguard.topology.solver`) turns into plans, and its file form (:func:`dump_fabric`).
Host inventories are the bus contract's :class:`~linkguard.models.HostInventory`: one HCA port
per rail with its rail address (the next hop peers use), one /32 endpoint per GPU.

Link endpoint syntax: a host port is ``"<host>:<hca>/<port>"`` (``"gpu000:mlx5_3/1"``), a switch
port is the switch name (``"su0-leaf3"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ValidationError

from linkguard.topology.fabricmodel import (
    MAX_ENDPOINTS_PER_HOST,
    NDR_GBPS,
    Fabric,
    FabricError,
    Link,
    Switch,
    Tier,
    check_servable,
    home_rails,
    serving_problems,
    switch_tiers,
)
from linkguard.topology.generator import generate_rail_optimized

__all__ = [
    "MAX_ENDPOINTS_PER_HOST",
    "NDR_GBPS",
    "Fabric",
    "FabricError",
    "Link",
    "Switch",
    "Tier",
    "check_servable",
    "dump_fabric",
    "generate_rail_optimized",
    "home_rails",
    "load_fabric",
    "serving_problems",
    "switch_tiers",
]


# --------------------------------------------------------------------------------------------
# Files


def _summary(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for e in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")  # the validators' own sentences
        parts.append(f"{loc}: {msg}" if loc else msg)
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


#: libyaml's safe loader when PyYAML was built with it (about 3x faster than the pure-Python one:
#: a 2,048-host file, 6.5 MB, parses in about 7.5 s instead of 24; its JSON in 0.1 s), else
#: PyYAML's SafeLoader. Both construct only plain YAML types.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_fabric(path: str | Path, *, observed: bool = False) -> Fabric:
    """Read a fabric file: JSON for ``.json``, YAML for ``.yaml``/``.yml`` (safe loader:
    libyaml's when PyYAML has it).

    ``observed``: the file describes a fabric as found (the audit's ``--fabric``), so an HCA
    may be cabled to another rail's leaf (see :class:`Fabric`); expected fabrics and the
    service's fabric keep the default, strict check.

    Raises :class:`FabricError` naming ``path`` when the file cannot be read, has another
    suffix, does not parse, is not a mapping, or fails validation (with a summary of the first
    pydantic errors: ``hosts.1.hcas.0.address: ...``).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise FabricError(f"{p}: unknown fabric file suffix {suffix!r} (use .json, .yaml, .yml)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FabricError(f"{p}: cannot read fabric file: {exc}") from exc
    try:
        data = json.loads(text) if suffix == ".json" else yaml.load(text, Loader=_YAML_LOADER)
    except json.JSONDecodeError as exc:
        raise FabricError(f"{p}: not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise FabricError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise FabricError(
            f"{p}: expected a mapping with name/hosts/switches/links, got {type(data).__name__}"
        )
    try:
        return Fabric.model_validate(data, context={"observed": observed})
    except ValidationError as exc:
        raise FabricError(f"{p}: invalid fabric: {_summary(exc)}") from None


def dump_fabric(fabric: Fabric, fmt: Literal["json", "yaml"] = "json") -> str:
    """Serialize ``fabric`` as JSON (indented) or YAML; :func:`load_fabric` reads either back.
    Raises ValueError on another ``fmt``."""
    data = fabric.model_dump(mode="json", exclude_none=True)
    for h in data["hosts"]:  # no PCIe layout: leave the key out, as files without one have it
        if not h.get("gpu_pcie_switch"):
            h.pop("gpu_pcie_switch", None)
    if fmt == "json":
        return json.dumps(data, indent=1) + "\n"
    if fmt == "yaml":
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when present: ~6x faster
        return yaml.dump(data, Dumper=dumper, sort_keys=False)
    raise ValueError(f"unknown fabric format {fmt!r} (json or yaml)")
