"""End-to-end harness: a namespace lab, real agent and service processes, a real Mosquitto,
an MQTT observer and UDP flows between GPU endpoints. The live parts are
:mod:`linkguard.simulations.labprocs` (shared with ``linkguard sim lab``); this module adds the
kernel-table readers the tests assert on."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from linkguard.simulations.labprocs import (
    TABLE,
    Flow,
    Observer,
    Procs,
    lab_fabric,
    observer_bus,
    outages_after_reroute,
    start_all,
    start_flow,
    until,
    write_configs,
)

__all__ = [
    "TABLE",
    "Flow",
    "Observer",
    "Procs",
    "copy_tree",
    "kernel_routes",
    "kernel_table",
    "lab_fabric",
    "observer_bus",
    "outages_after_reroute",
    "start_all",
    "start_flow",
    "until",
    "write_configs",
]


def _table_json(netns: str, table: int) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "route", "show", "table", str(table)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out or "[]")


def kernel_table(netns: str, table: int = TABLE) -> dict[str, tuple]:
    """destination -> (type, gateway, devs) of one table, as ``ip -j route`` shows it; devs is
    a sorted tuple (several for a multipath route)."""
    res = {}
    for r in _table_json(netns, table):
        devs = [r["dev"]] if "dev" in r else [n["dev"] for n in r.get("nexthops", [])]
        res[r["dst"]] = (r.get("type", "unicast"), r.get("gateway"), tuple(sorted(devs)))
    return res


def kernel_routes(netns: str, table: int = TABLE) -> dict[str, tuple[str | None, str | None]]:
    """destination -> (gateway, dev) of one table, as ``ip -j route`` shows it."""
    return {r["dst"]: (r.get("gateway"), r.get("dev")) for r in _table_json(netns, table)}


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst
