"""``linkguard config check FILE --role agent|service``: a good file prints the effective
settings (exit 0), a bad one every bad value as ``field.path: message`` (exit 2), a file with
old flat keys loads with a warning naming each new key; every config file under deploy/ passes
with its role."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from linkguard.cli import main
from linkguard.topology.generator import generate_rail_optimized
from tests.test_deploy import DEPLOY, env_file, find, site, site_env

__all__ = ["site"]  # the fixture, imported from test_deploy


def _check(path: Path, role: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["config", "check", str(path), "--role", role])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_good_file_prints_the_effective_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "host: gpu007\nroutes: {table: 77}\nrails_socket: {path: /run/lg/r.sock}\n"
        "bus: {username: gpu007, password: a-secret-never-printed}\n"
    )
    code, out, err = _check(cfg, "agent", capsys)
    assert code == 0, err
    doc = yaml.safe_load(out)
    assert doc["host"] == "gpu007"
    assert doc["routes"]["table"] == 77 and doc["routes"]["apply"] is True  # default filled in
    assert doc["rails_socket"] == {"path": "/run/lg/r.sock", "group": None, "queue": 256}
    assert doc["verbs"]["events"] == "auto"
    assert "a-secret-never-printed" not in out + err
    assert doc["bus"]["password"] == "**********"
    assert "deprecated" not in err


def test_a_bad_file_lists_every_bad_value_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "service.yaml"
    cfg.write_text("solve: {short_ms: -1}\napi: {port: 70000}\nturbo: true\n")
    code, out, err = _check(cfg, "service", capsys)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0] == f"config check: {cfg}: not valid service settings:"
    assert sorted(line.strip().split(":")[0] for line in lines[1:]) == [
        "api.port",
        "solve.short_ms",
        "turbo",
    ]
    assert "  solve.short_ms: Input should be greater than or equal to 0" in lines
    assert "  turbo: Extra inputs are not permitted" in lines


def test_a_file_that_is_not_settings_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _check(tmp_path / "missing.yaml", "agent", capsys)
    assert (code, out) == (2, "")
    assert "does not exist" in err
    cfg = tmp_path / "list.yaml"
    cfg.write_text("- a\n")
    code, _, err = _check(cfg, "agent", capsys)
    assert code == 2 and "the top level must be a mapping" in err


def test_the_wrong_role_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _check(DEPLOY / "config/topology.yaml", "agent", capsys)
    assert code == 2 and "fabric: Extra inputs are not permitted" in err
    assert err.splitlines()[-1] == "hint: these keys are the service's: --role service?"
    code, _, err = _check(DEPLOY / "config/agent.yaml", "service", capsys)
    assert code == 2 and err.splitlines()[-1] == "hint: these keys are the agent's: --role agent?"


def test_a_deprecated_file_loads_with_a_warning_per_old_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "old.yaml"
    cfg.write_text("debounce_ms: 40\nsolve_holddown_ms: 2000\ngenerate: {hosts: 4, rails: 2}\n")
    code, out, err = _check(cfg, "service", capsys)
    assert code == 0, err
    assert yaml.safe_load(out)["solve"]["short_ms"] == 40
    assert yaml.safe_load(out)["solve"]["holddown_ms"] == 2000
    assert "warning: debounce_ms is deprecated; use solve.short_ms" in err.splitlines()
    assert "warning: solve_holddown_ms is deprecated; use solve.holddown_ms" in err.splitlines()
    cfg.write_text("debounce_ms: 40\nsolve: {short_ms: 50}\n")  # both: refused, naming both
    code, _, err = _check(cfg, "service", capsys)
    assert code == 2
    assert "debounce_ms and solve.short_ms are both given: give only solve.short_ms" in err


def test_the_command_in_a_process(tmp_path: Path) -> None:
    """The installed entry point: exit codes and streams as a shell sees them."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("route_table: 77\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    run = [sys.executable, "-m", "linkguard.cli", "config", "check", str(cfg), "--role", "agent"]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["routes"]["table"] == 77
    assert "warning: route_table is deprecated; use routes.table" in out.stderr
    cfg.write_text("routes: {table: 254}\n")
    out = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert "  routes.table: table 254 is reserved (unspec/default/main/local)" in out.stderr


def _deploy_configs(tmp_path: Path) -> list[tuple[Path, str, dict[str, str]]]:
    """Every settings file under deploy/ (the example configs and the ConfigMaps' copies),
    with its role and the environment its unit or pod gives it."""
    configs = [
        (DEPLOY / "config/agent.yaml", "agent", env_file(DEPLOY / "systemd/agent.env.example")),
        (
            DEPLOY / "config/topology.yaml",
            "service",
            env_file(DEPLOY / "systemd/topology.env.example"),
        ),
    ]
    for name, key, role, kind in (
        ("linkguard-agent", "agent.yaml", "agent", "DaemonSet"),
        ("linkguard-topology", "topology.yaml", "service", "Deployment"),
    ):
        path = tmp_path / f"configmap-{key}"
        path.write_text(find("ConfigMap", name)["data"][key])
        (c,) = find(kind, name)["spec"]["template"]["spec"]["containers"]
        pod_env = {  # as tests/test_deploy.py: a node name, a token for the Secret
            e["name"]: "gpu-node-7"
            if "fieldRef" in e["valueFrom"]
            else "a-secret-token-of-32-characters!"
            for e in c.get("env", [])
        }
        configs.append((path, role, pod_env))
    return configs


def test_every_config_under_deploy_passes_with_its_role(
    site: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    configs = _deploy_configs(tmp_path)
    assert len(configs) == 4
    # the service reads its fabric file at start (config check too): the site's copy
    fabric = tmp_path / "fabric.json"
    fabric.write_text(generate_rail_optimized(hosts=4, rails=2).model_dump_json())
    for path, role, env in configs:
        for k in [k for k in os.environ if k.startswith("LINKGUARD_")]:
            if k != "LINKGUARD_REQUIRE_REAL":
                monkeypatch.delenv(k)
        for k, v in (env | site_env(site, "agent" if role == "agent" else "topology")).items():
            monkeypatch.setenv(k, v)
        if role == "service":
            monkeypatch.setenv("LINKGUARD_FABRIC", str(fabric))
        code, out, err = _check(path, role, capsys)
        assert code == 0, f"{path}: {err}"
        assert "deprecated" not in err, f"{path} uses an old key: {err}"
        assert yaml.safe_load(out)["bus"]["tls"] is True


def test_what_the_process_would_refuse_at_start_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Settings that load but with which the agent or the service exits 2 at start."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "host: gpu001\ndriver: simulated\nservice_public_key: /nonexistent/service.pub\n"
        "ports:\n  - {hca: mlx5_0, port: 1, rail: 0}\n  - {hca: mlx5_4, port: 1, rail: 0}\n"
    )
    code, out, err = _check(cfg, "agent", capsys)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines[0] == f"config check: {cfg}: the agent would not start:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "driver",
        "ports",
        "service_public_key",
    ]
    assert "two HCAs on the same rail" in lines[2]
    svc = tmp_path / "service.yaml"
    svc.write_text("log_level: info\n")  # neither fabric: nor generate:
    code, _, err = _check(svc, "service", capsys)
    assert code == 2 and "  fabric: no fabric: give --fabric FILE" in err
    svc.write_text(f"fabric: {tmp_path / 'missing.json'}\nsigning_key: {tmp_path / 'k'}\n")
    code, _, err = _check(svc, "service", capsys)
    assert code == 2 and "cannot read fabric file" in err and "  signing_key: " in err


@pytest.mark.parametrize(
    ("role", "text"),
    [
        ("agent", "host: gpu001\nroutes: {table: 77}\n"),
        ("service", "generate: {hosts: 8, rails: 4}\nsolve: {short_ms: 30}\n"),
    ],
)
def test_the_printed_settings_load_again_as_the_same_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], role: str, text: str
) -> None:
    first = tmp_path / "first.yaml"
    first.write_text(text)
    code, out, err = _check(first, role, capsys)
    assert code == 0, err
    again = tmp_path / "again.yaml"
    again.write_text(out)
    code, out2, err = _check(again, role, capsys)
    assert code == 0, err
    assert yaml.safe_load(out2) == yaml.safe_load(out)
    assert "deprecated" not in err


def test_a_renamed_key_is_reported_once(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("host: gpu001\nroute_table: 77\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    run = [sys.executable, "-m", "linkguard.cli", "config", "check", str(cfg), "--role", "agent"]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("route_table") == 1, out.stderr
    assert out.stderr.strip() == "warning: route_table is deprecated; use routes.table"
