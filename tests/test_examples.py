"""The pilot's example configs (``deploy/examples/``) as ``linkguard config check`` reads them:
the installed command, in a process of its own, as an operator runs it in steps 1 and 2 of
docs/pilot.md.

Shown: both files are valid for their role with no old key; the values a dry run depends on
are what the walk-through says (routes not applied, plain MQTT to the pilot broker on 1883,
no TLS, no signing, the agent's exporter on 127.0.0.1:9477, the service's API with its
``/metrics`` on 127.0.0.1:8470); the printed effective settings load again as the same
settings. The service reads its fabric file when checked: ``LINKGUARD_FABRIC`` points it at a
generated one, as the environment of a real service would override the file's path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from linkguard.topology.generator import generate_rail_optimized

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "deploy" / "examples"
#: the installed entry point next to this interpreter (`pip install -e .` puts it there)
CLI = Path(sys.executable).with_name("linkguard")


def run_check(path: Path, role: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """``linkguard config check PATH --role ROLE`` in a process with no ``LINKGUARD_*``
    variable but ``env``: (its stdout, its stderr). Fails the test on an exit code other
    than 0."""
    assert CLI.exists(), f"{CLI} missing: pip install -e . first"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    out = subprocess.run(
        [str(CLI), "config", "check", str(path), "--role", role],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean | (env or {}),
    )
    assert out.returncode == 0, f"{path} --role {role}: exit {out.returncode}\n{out.stderr}"
    assert out.stdout.startswith(f"# effective {role} settings of {path}\n"), out.stdout[:200]
    return out.stdout, out.stderr


def config_check(path: Path, role: str, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """:func:`run_check`: (the effective settings it printed, as a mapping; its stderr)."""
    out, err = run_check(path, role, env)
    doc = yaml.safe_load(out)
    assert isinstance(doc, dict)
    return doc, err


@pytest.fixture
def fabric_env(tmp_path: Path) -> dict[str, str]:
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(generate_rail_optimized(hosts=4, rails=2).model_dump_json())
    return {"LINKGUARD_FABRIC": str(fabric)}


def _no_tls(bus: dict[str, Any]) -> None:
    assert bus["host"] == "mqtt.pilot.example"
    assert bus["port"] == 1883
    assert bus["tls"] is False
    assert bus["ca_file"] is None and bus["cert_file"] is None and bus["key_file"] is None
    assert bus["username"] is None and bus["password"] is None


def test_the_agent_example_is_a_dry_run_with_metrics() -> None:
    doc, err = config_check(EXAMPLES / "agent.yaml", "agent")
    assert err == "", err  # no old key, nothing to warn about
    assert doc["routes"]["apply"] is False
    assert doc["routes"]["table"] == 4242
    _no_tls(doc["bus"])
    assert doc["metrics_listen"] == "127.0.0.1:9477"
    assert doc["driver"] == "sysfs" and doc["sysfs_root"] == "/sys/class/infiniband"
    assert doc["ports"] == []  # every HCA port found, rails in PCI address order
    assert doc["endpoint_prefixes"] == ["10.200.0.0/16"]
    assert doc["service_public_key"] is None  # unsigned plans until step 5
    assert doc["hooks"] == [] and doc["rails_socket"]["path"] is None
    assert doc["probes"]["enabled"] is False


def test_the_service_example_runs_without_tls_or_signing(fabric_env: dict[str, str]) -> None:
    doc, err = config_check(EXAMPLES / "topology.yaml", "service", fabric_env)
    assert err == "", err
    assert doc["fabric"] == fabric_env["LINKGUARD_FABRIC"]
    _no_tls(doc["bus"])
    assert doc["signing_key"] is None
    assert doc["api"]["enabled"] is True
    assert (doc["api"]["host"], doc["api"]["port"]) == ("127.0.0.1", 8470)
    assert doc["ledger"]["path"] == "/var/lib/linkguard-topology/ledger.sqlite3"
    assert doc["generate"] is None


def test_the_service_example_names_the_fabric_step_2_writes(tmp_path: Path) -> None:
    """Without the override the service would read /etc/linkguard/fabric.yaml: checked before
    step 2 wrote it, the check says so (exit 2) instead of passing."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    if Path("/etc/linkguard/fabric.yaml").exists():
        pytest.skip("this machine has an /etc/linkguard/fabric.yaml")
    out = subprocess.run(
        [str(CLI), "config", "check", str(EXAMPLES / "topology.yaml"), "--role", "service"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert "fabric: " in out.stderr and "/etc/linkguard/fabric.yaml" in out.stderr


@pytest.mark.parametrize(("name", "role"), [("agent.yaml", "agent"), ("topology.yaml", "service")])
def test_the_printed_settings_load_again(
    name: str, role: str, tmp_path: Path, fabric_env: dict[str, str]
) -> None:
    env = fabric_env if role == "service" else {}
    printed, _ = run_check(EXAMPLES / name, role, env)
    again = tmp_path / f"effective-{name}"
    again.write_text(printed)  # as printed, its comment line included
    second, err = config_check(again, role, env)
    assert second == yaml.safe_load(printed)
    assert err == ""
