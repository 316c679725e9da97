"""The fleet-audit example of docs/fabric.md (once the README's), shared by the CLI and audit
tests: a generated 16-host x 4-rail fabric, edited as that page says (gpu003's rail-0/1 cables
swapped, gpu005's rail-3 cable at 100 Gb/s, gpu009 gone)."""

from __future__ import annotations

from pathlib import Path

import yaml

from linkguard.cli import main

#: the generator options of the example
GEN = ["--hosts", "16", "--rails", "4", "--hosts-per-su", "8"]


def write_observed(tmp_path: Path) -> Path:
    """The edited copy as a fabric file ``observed.yaml`` in ``tmp_path``."""
    observed = tmp_path / "observed.yaml"
    assert main(["fabric", "generate", *GEN, "-o", str(observed)]) == 0
    doc = yaml.safe_load(observed.read_text())
    swap = {"gpu003:mlx5_0/1": "su0-leaf1", "gpu003:mlx5_1/1": "su0-leaf0"}
    for link in doc["links"]:
        link["b"] = swap.get(link["a"], link["b"])
        if link["a"] == "gpu005:mlx5_3/1":
            link["rate_gbps"] = 100
    doc["links"] = [x for x in doc["links"] if not x["a"].startswith("gpu009:")]
    doc["hosts"] = [h for h in doc["hosts"] if h["host"] != "gpu009"]
    observed.write_text(yaml.safe_dump(doc, sort_keys=False))
    return observed
