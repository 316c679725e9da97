"""The deployment files of deploy/: systemd units, Kubernetes manifests, example configs.

Shown:
- both systemd units pass ``systemd-analyze verify`` with nothing to say (systemd 252 only
  *warns* about an unknown directive or a bad value and still exits 0, so any output fails the
  check; a copy with a typo shows it does), name only capabilities systemd knows, stay under an
  exposure level in ``systemd-analyze security --offline``, and agree with the example configs
  (state dir, rail map dir, credential names);
- the Kubernetes manifests validate against the official schemas (kubernetes-validate, strict:
  an unknown field fails; the schemas ship in the package, no network), and their
  security-relevant fields are what deploy/ promises (host network, sysfs read-only,
  NET_ADMIN only, not privileged; the service unprivileged, one replica, Recreate, its
  ServiceAccount allowed its leader Lease and nothing else);
- the example configs (deploy/config/, the ConfigMaps, the env examples) load through
  linkguard's settings classes, with only the file locations of this machine substituted;
- on real processes (root, a network namespace, Mosquitto over TLS with deploy/make-certs.sh's
  certificates): ``linkguard agent --config deploy/config/agent.yaml`` run as an unprivileged
  user with the unit's capabilities (CAP_NET_ADMIN, nothing else) installs and withdraws its
  ip rule and stops on SIGTERM within the unit's TimeoutStopSec; without the capability it
  cannot; ``linkguard topology serve --config deploy/config/topology.yaml`` runs as an
  unprivileged user with no capability at all.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from linkguard.config import AgentSettings, ConfigError, ServiceSettings, load_settings
from tests.conftest import FIXTURES
from tests.support import missing, require_binary, require_root

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNITS = {"agent": "linkguard-agent.service", "topology": "linkguard-topology.service"}
#: the ExecStart binary of the units (a venv under /opt, see the units' comments)
UNIT_BINARY = "/opt/linkguard/venv/bin/linkguard"
#: the 8 InfiniBand HCAs of the real H100 sysfs tree (its Ethernet bond is left out)
GPUD_TREE = "leptonai-gpud/tree/sys-class-infiniband-h100.0"
GPUD_HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
CAP_NET_ADMIN = 12  # linux/capability.h
NOBODY = 65534


# -- systemd ---------------------------------------------------------------------------------


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze") or (
        "/usr/bin/systemd-analyze" if os.path.exists("/usr/bin/systemd-analyze") else None
    )
    if path is None:
        missing("needs `systemd-analyze` (Debian package systemd)")
    return path  # type: ignore[return-value]


def unit_directives(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> its values in order (a key may repeat), comments dropped."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def one(d: dict[str, list[str]], key: str) -> str:
    (value,) = d[key]
    return value


def runnable_copy(unit: Path, into: Path) -> Path:
    """``unit`` in ``into`` with ExecStart's /opt/linkguard/venv binary replaced by this venv's
    `linkguard` (verify checks that ExecStart is executable); nothing else changed."""
    text = unit.read_text()
    assert text.count(UNIT_BINARY) == 1, f"{unit.name}: expected one ExecStart={UNIT_BINARY}"
    venv_cli = Path(sys.executable).with_name("linkguard")
    assert venv_cli.exists(), f"{venv_cli} missing: pip install -e . first"
    into.mkdir(parents=True, exist_ok=True)
    copy = into / unit.name
    copy.write_text(text.replace(UNIT_BINARY, str(venv_cli)))
    return copy


def verify(unit: Path) -> list[str]:
    """What ``systemd-analyze verify`` says about ``unit``: its output lines, plus the exit
    code when not 0. Empty: clean."""
    r = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", "--generators=no", unit.name],
        cwd=unit.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    return said + ([f"exit code {r.returncode}"] if r.returncode else [])


@pytest.mark.parametrize("name", sorted(UNITS.values()))
def test_unit_verifies_clean(name: str, tmp_path: Path) -> None:
    assert verify(runnable_copy(DEPLOY / "systemd" / name, tmp_path)) == []


@pytest.mark.parametrize(
    ("typo", "expect"),
    [
        (("NoNewPrivileges=yes", "NoNewPrivilege=yes"), "Unknown key 'NoNewPrivilege'"),
        (("ProtectSystem=strict", "ProtectSystem=strikt"), "protect system value"),
        (("AF_NETLINK", "AF_NETLNK"), "address family"),
        (("SystemCallFilter=@system-service", "SystemCallFilter=@system-servce"), "group"),
    ],
)
def test_verify_catches_a_broken_unit(typo: tuple[str, str], expect: str, tmp_path: Path) -> None:
    """The check above is meaningful: a one-word typo fails it (systemd-analyze exits 0 for
    these, so the check is on its output)."""
    good = runnable_copy(DEPLOY / "systemd" / UNITS["agent"], tmp_path)
    old, new = typo
    assert old in good.read_text()
    good.write_text(good.read_text().replace(old, new, 1))
    said = verify(good)
    assert said, f"verify said nothing about {new!r}"
    assert any(expect in line for line in said), said


def test_unit_capabilities_are_known_and_minimal() -> None:
    """verify ignores an unknown capability name (CAP_NET_ADMON passes it): every name the
    units use must be one systemd knows. The agent gets CAP_NET_ADMIN and nothing else, as a
    non-root user that cannot gain more; the service gets none."""
    agent = unit_directives(DEPLOY / "systemd" / UNITS["agent"])
    service = unit_directives(DEPLOY / "systemd" / UNITS["topology"])
    for d in (agent, service):
        for key in ("Service.AmbientCapabilities", "Service.CapabilityBoundingSet"):
            for cap in " ".join(d.get(key, [])).split():
                r = subprocess.run(
                    [systemd_analyze(), "capability", cap], capture_output=True, text=True
                )
                assert r.returncode == 0, f"{key}={cap}: {r.stderr.strip()}"
    assert one(agent, "Service.AmbientCapabilities") == "CAP_NET_ADMIN"
    assert one(agent, "Service.CapabilityBoundingSet") == "CAP_NET_ADMIN"
    assert one(agent, "Service.User") not in ("root", "0")
    assert one(agent, "Service.NoNewPrivileges") == "yes"
    assert "AF_NETLINK" in one(agent, "Service.RestrictAddressFamilies").split()
    assert one(agent, "Service.ReadOnlyPaths") == "/sys"
    assert one(service, "Service.DynamicUser") == "yes"
    assert one(service, "Service.CapabilityBoundingSet") == ""
    assert one(service, "Service.AmbientCapabilities") == ""
    assert "AF_NETLINK" not in one(service, "Service.RestrictAddressFamilies")
    for d in (agent, service):
        assert one(d, "Service.KillSignal") == "SIGTERM"
        assert one(d, "Service.Restart") == "on-failure"
        assert one(d, "Service.RestartPreventExitStatus") == "2"  # linkguard.cli: bad config
        assert one(d, "Service.ProtectSystem") == "strict"


@pytest.mark.parametrize(("name", "threshold"), [(UNITS["agent"], 2.0), (UNITS["topology"], 1.5)])
def test_unit_exposure_level(name: str, threshold: float, tmp_path: Path) -> None:
    """``systemd-analyze security --offline`` rates both well inside "OK" (< 4.0 of 10);
    measured with systemd 252: agent 1.5 (it keeps the host network and CAP_NET_ADMIN by
    design), service 1.1."""
    unit = runnable_copy(DEPLOY / "systemd" / name, tmp_path)
    r = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", "--no-pager", unit.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout)
    assert level is not None, r.stdout[-2000:] + r.stderr
    assert float(level[1]) <= threshold, r.stdout


def test_units_match_the_example_configs() -> None:
    """The unit provides what the config expects: the state dir, the rail map's directory, the
    credential files, the config path."""
    agent_unit = unit_directives(DEPLOY / "systemd" / UNITS["agent"])
    service_unit = unit_directives(DEPLOY / "systemd" / UNITS["topology"])
    agent = yaml.safe_load((DEPLOY / "config/agent.yaml").read_text())
    service = yaml.safe_load((DEPLOY / "config/topology.yaml").read_text())

    assert one(agent_unit, "Service.ExecStart").endswith("agent --config /etc/linkguard/agent.yaml")
    assert one(service_unit, "Service.ExecStart").endswith(
        "topology serve --config /etc/linkguard/topology.yaml"
    )
    assert agent["state_dir"] == "/var/lib/" + one(agent_unit, "Service.StateDirectory")
    assert str(Path(agent["rail_map_path"]).parent) == "/run/" + one(
        agent_unit, "Service.RuntimeDirectory"
    )
    ledger = Path(service["ledger"]["path"])
    assert str(ledger.parent) == "/var/lib/" + one(service_unit, "Service.StateDirectory")

    def credentials(unit: dict[str, list[str]], name: str) -> set[str]:
        return {
            f"/run/credentials/{name}/{c.split(':', 1)[0]}"
            for c in unit.get("Service.LoadCredential", [])
        }

    assert agent["bus"]["password_file"] in credentials(agent_unit, UNITS["agent"])
    assert {service["bus"]["password_file"], service["signing_key"]} == credentials(
        service_unit, UNITS["topology"]
    )


# -- example configs -------------------------------------------------------------------------


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile (no quoting used in ours)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """The files the example configs name, at test locations: the bus CA (a real certificate,
    the TLS settings load it), a password file, the service's key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from linkguard.signing import generate_keys

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "linkguard test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "bus-password").write_text("not-a-real-password\n")
    (tmp_path / "bus-password").chmod(0o600)
    generate_keys(tmp_path)
    return tmp_path


def site_env(site: Path, which: str) -> dict[str, str]:
    """LINKGUARD_* overrides of the example configs' file locations (nothing else)."""
    common = {
        "LINKGUARD_BUS__CA_FILE": str(site / "ca.crt"),
        "LINKGUARD_BUS__PASSWORD_FILE": str(site / "bus-password"),
    }
    if which == "agent":
        return common | {"LINKGUARD_SERVICE_PUBLIC_KEY": str(site / "service.pub")}
    return common | {"LINKGUARD_SIGNING_KEY": str(site / "service.key")}


def load_with_env(
    monkeypatch: pytest.MonkeyPatch, cls: type, path: Path, env: dict[str, str]
) -> Any:
    for k in [k for k in os.environ if k.startswith("LINKGUARD_")]:
        if k != "LINKGUARD_REQUIRE_REAL":
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return load_settings(cls, path)


def test_example_agent_config_loads(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/config/agent.yaml with the env example's values, through AgentSettings."""
    env = env_file(DEPLOY / "systemd/agent.env.example") | site_env(site, "agent")
    s = load_with_env(monkeypatch, AgentSettings, DEPLOY / "config/agent.yaml", env)
    assert (s.bus.tls, s.bus.port, s.bus.username) == (True, 8883, "gpu017")
    assert s.bus.connection()["password"] == "not-a-real-password"
    assert [str(p) for p in s.endpoint_prefixes] == ["10.200.0.0/16"]
    assert len(s.endpoints) == 8
    assert (s.routes.table, s.shutdown_policy, s.require_signed_plans) == (4242, "keep", True)
    assert s.poll_interval_ms == AgentSettings.model_fields["poll_interval_ms"].default


def test_example_topology_config_loads(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_file(DEPLOY / "systemd/topology.env.example") | site_env(site, "topology")
    s = load_with_env(monkeypatch, ServiceSettings, DEPLOY / "config/topology.yaml", env)
    assert (s.api.host, s.api.port) == ("127.0.0.1", 8470)
    assert s.api.token is not None and len(s.api.token.get_secret_value()) >= 16
    assert s.fabric == Path("/etc/linkguard/fabric.json")
    assert s.ledger.path == Path("/var/lib/linkguard-topology/ledger.sqlite3")
    assert (s.bus.tls, s.bus.username) == (True, "linkguard-topology")


def test_example_config_typo_is_refused(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader the examples are checked with refuses a misspelt key (extra="forbid")."""
    bad = site / "agent.yaml"
    bad.write_text((DEPLOY / "config/agent.yaml").read_text().replace("  table:", "  tabel:"))
    with pytest.raises(ConfigError, match=r"routes\.tabel"):
        load_with_env(monkeypatch, AgentSettings, bad, site_env(site, "agent"))


# -- Kubernetes ------------------------------------------------------------------------------


def manifests() -> dict[str, list[dict[str, Any]]]:
    return {
        p.name: [d for d in yaml.safe_load_all(p.read_text()) if d]
        for p in sorted((DEPLOY / "k8s").glob("*.yaml"))
    }


def find(kind: str, name: str) -> dict[str, Any]:
    for docs in manifests().values():
        for d in docs:
            if d["kind"] == kind and d["metadata"]["name"] == name:
                return d
    raise AssertionError(f"no {kind}/{name} in deploy/k8s")


def k8s_errors(doc: dict[str, Any]) -> str | None:
    """The schema error of ``doc`` (None: valid), strict: unknown fields are errors."""
    try:
        import kubernetes_validate
    except ImportError:
        missing("needs kubernetes-validate (pip install -e '.[test]')")
    try:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"  # a jsonschema error
    return None


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    seen = []
    for name, docs in manifests().items():
        for d in docs:
            assert k8s_errors(d) is None, f"{name}: {d['kind']}/{d['metadata']['name']}"
            seen.append(d["kind"])
    for kind in (
        "Namespace",
        "DaemonSet",
        "Deployment",
        "Service",
        "ConfigMap",
        "PersistentVolumeClaim",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    ):
        assert kind in seen


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (
            lambda c: c["securityContext"].update(readOnlyRootFilesytem=True),
            "readOnlyRootFilesytem",
        ),
        (lambda c: c["securityContext"].update(privileged="no"), "privileged"),
        (lambda c: c["resources"]["limits"].update(memory=[]), "memory"),
    ],
)
def test_schema_check_catches_a_broken_manifest(
    edit: Callable[[dict[str, Any]], None], expect: str
) -> None:
    ds = find("DaemonSet", "linkguard-agent")
    edit(ds["spec"]["template"]["spec"]["containers"][0])
    err = k8s_errors(ds)
    assert err is not None and expect in err


def test_agent_daemonset_security() -> None:
    ds = find("DaemonSet", "linkguard-agent")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert pod["hostNetwork"] is True
    assert pod.get("hostPID", False) is False and pod.get("hostIPC", False) is False
    assert pod["automountServiceAccountToken"] is False
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["nodeSelector"]  # GPU nodes only
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/sys/class/infiniband", "/sys/class/net"):
        m = mounts[path]
        assert m.get("readOnly") is True, f"{path} must be mounted read-only"
        assert volumes[m["name"]]["hostPath"]["path"] == path
    # the only host paths it may write: its state dir and the rail map's directory
    writable = {
        volumes[m["name"]]["hostPath"]["path"]
        for m in c["volumeMounts"]
        if "hostPath" in volumes[m["name"]] and not m.get("readOnly")
    }
    assert writable == {"/var/lib/linkguard", "/run/linkguard"}

    # resources: at least benchmarks/agent.py's targets (80 MiB, 1 % of a core = 10m), which
    # the measured figures are near; room above them for the limit; no CPU limit (throttling)
    res = c["resources"]
    assert res["requests"]["cpu"].endswith("m") and int(res["requests"]["cpu"][:-1]) >= 10
    assert _mib(res["requests"]["memory"]) >= 80
    assert _mib(res["limits"]["memory"]) >= 2 * 80
    assert "cpu" not in res["limits"]
    agent_unit = unit_directives(DEPLOY / "systemd" / UNITS["agent"])
    assert pod["terminationGracePeriodSeconds"] == int(one(agent_unit, "Service.TimeoutStopSec"))
    # the config it mounts is the one it is given
    assert c["args"][-1].startswith(mounts["/etc/linkguard/config"]["mountPath"])


def _mib(q: str) -> float:
    m = re.fullmatch(r"(\d+)(Mi|Gi)", q)
    assert m, q
    return int(m[1]) * (1024 if m[2] == "Gi" else 1)


def test_topology_deployment() -> None:
    dep = find("Deployment", "linkguard-topology")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod.get("hostNetwork", False) is False
    (c,) = pod["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    for init in pod.get("initContainers", []):  # the key copier: CAP_CHOWN at most
        assert init["securityContext"]["capabilities"]["add"] == ["CHOWN"]
        assert init["securityContext"]["privileged"] is False

    cfg = yaml.safe_load(find("ConfigMap", "linkguard-topology")["data"]["topology.yaml"])
    svc = find("Service", "linkguard-topology")
    (port,) = svc["spec"]["ports"]
    (cport,) = c["ports"]
    assert port["targetPort"] == cport["name"] and cport["containerPort"] == cfg["api"]["port"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    ledger_vol = next(n for n, v in volumes.items() if "persistentVolumeClaim" in v)
    assert Path(cfg["ledger"]["path"]).parent == Path(mounts[ledger_vol])
    find("PersistentVolumeClaim", volumes[ledger_vol]["persistentVolumeClaim"]["claimName"])


def test_topology_leader_lease_rbac() -> None:
    """leader.kubernetes (linkguard.topology.leader_k8s): the service's ServiceAccount may
    create leases and get/update the one Lease its config names, nothing else; the token,
    CA and namespace are projected where the in-cluster client reads them, into the service's
    container only (the root init container gets no token)."""
    dep = find("Deployment", "linkguard-topology")
    pod = dep["spec"]["template"]["spec"]
    cfg = yaml.safe_load(find("ConfigMap", "linkguard-topology")["data"]["topology.yaml"])
    lease = cfg["leader"]["kubernetes"]["name"]
    ns = dep["metadata"]["namespace"]
    sa = find("ServiceAccount", pod["serviceAccountName"])
    assert sa["metadata"]["namespace"] == ns
    binding = find("RoleBinding", "linkguard-topology-leader")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": ns}
    ]
    role = find(binding["roleRef"]["kind"], binding["roleRef"]["name"])
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == ns
    grants = {
        (verb, name)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames", ["*"])
        if rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
    }
    assert grants == {("create", "*"), ("get", lease), ("update", lease)}
    assert all(r["resources"] == ["leases"] for r in role["rules"])

    assert (
        pod["automountServiceAccountToken"] is False and sa["automountServiceAccountToken"] is False
    )
    where = "/var/run/secrets/kubernetes.io/serviceaccount"  # linkguard.topology.leader_k8s
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == where]
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    paths = set()
    for src in volume["projected"]["sources"]:
        for kind, item in src.items():
            paths |= (
                {item["path"]}
                if kind == "serviceAccountToken"
                else {i["path"] for i in item["items"]}
            )
    assert paths == {"token", "ca.crt", "namespace"}
    for init in pod.get("initContainers", []):
        assert all(m["name"] != mount["name"] for m in init["volumeMounts"])
    # the Lease's settings load (ServiceSettings) and they are what the service uses
    s = ServiceSettings.model_validate({"leader": cfg["leader"]})
    assert s.leader.kubernetes is not None and s.leader.kubernetes.name == lease


@pytest.mark.parametrize(
    ("configmap", "key", "cls"),
    [
        ("linkguard-agent", "agent.yaml", AgentSettings),
        ("linkguard-topology", "topology.yaml", ServiceSettings),
    ],
)
def test_configmap_configs_load(
    configmap: str,
    key: str,
    cls: type,
    site: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ConfigMaps' configs, with the pod's LINKGUARD_* variables (a node name for
    spec.nodeName, a token for the Secret) and this machine's file locations."""
    text = find("ConfigMap", configmap)["data"][key]
    path = tmp_path / key
    path.write_text(text)
    kind, name = (
        ("DaemonSet", "linkguard-agent")
        if cls is AgentSettings
        else ("Deployment", "linkguard-topology")
    )
    (c,) = find(kind, name)["spec"]["template"]["spec"]["containers"]
    pod_env = {}
    for e in c.get("env", []):
        ref = e["valueFrom"]
        pod_env[e["name"]] = (
            "gpu-node-7" if "fieldRef" in ref else "a-secret-token-of-32-characters!"
        )
    which = "agent" if cls is AgentSettings else "topology"
    s = load_with_env(monkeypatch, cls, path, pod_env | site_env(site, which))
    assert s.bus.tls is True
    assert c["args"][-1] == f"/etc/linkguard/config/{key}"


# -- real processes: the unit's privileges, the example configs, the real CLI ----------------


def _wait(cond: Callable[[], object], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


def _has_event(log: Path, event: str) -> bool:
    return any(e.get("event") == event for e in _events(log))


@contextlib.contextmanager
def _netns() -> Iterator[str]:
    name = f"lg-deploy-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _rules(ns: str) -> str:
    return subprocess.run(
        ["ip", "-n", ns, "rule", "show"], capture_output=True, text=True, check=True
    ).stdout


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> float:
    """SIGTERM; seconds to exit (SIGKILL and fail past ``timeout``)."""
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            pytest.fail(f"pid {proc.pid} ignored SIGTERM for {timeout} s")
    return time.monotonic() - t0


def _caps(value: str) -> str:
    """A unit's capability list as setpriv's ``-all,+net_admin`` form."""
    names = [c.removeprefix("CAP_").lower() for c in value.split()]
    return ",".join(["-all", *(f"+{n}" for n in names)])


@pytest.fixture
def lab() -> Iterator[dict[str, Any]]:
    """A network namespace with a TLS Mosquitto on 127.0.0.1 inside it (certificates and
    per-user passwords from deploy/make-certs.sh, the deploy ACL), and a directory the
    unprivileged user can read, holding what /etc/linkguard holds in production."""
    require_root()
    for b in ("mosquitto", "setpriv", "openssl"):
        require_binary(b)
    if shutil.which("mosquitto_passwd") is None:
        missing("needs `mosquitto_passwd` (Debian package mosquitto)")
    from linkguard.broker import free_port
    from linkguard.signing import generate_keys

    probe = subprocess.run(
        [require_binary("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         str(Path(sys.executable).with_name("linkguard")), "--version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if probe.returncode != 0:
        missing(f"this venv cannot run as an unprivileged user: {probe.stderr.strip()[-300:]}")
    host = "lg-deploy-test"
    work = Path(tempfile.mkdtemp(prefix="linkguard-deploy-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        work.chmod(0o755)  # the agent runs as nobody
        certs = work / "certs"
        subprocess.run(
            ["bash", str(DEPLOY / "make-certs.sh"), "-o", str(certs), host],
            check=True,
            capture_output=True,
            timeout=60,
        )
        etc = work / "etc"
        etc.mkdir(mode=0o755)
        shutil.copy(certs / "ca.crt", etc / "ca.crt")
        (etc / "ca.crt").chmod(0o644)
        generate_keys(etc)
        for user, name in ((host, "agent"), ("linkguard-topology", "topology")):
            # what systemd's LoadCredential= gives the service: mode 0400, owned by its user
            cred = etc / f"{name}-bus-password"
            shutil.copy(certs / "users" / f"{user}.password", cred)
            os.chown(cred, NOBODY, NOBODY)
            cred.chmod(0o400)
        os.chown(etc / "service.key", NOBODY, NOBODY)
        shutil.copytree(FIXTURES / GPUD_TREE, work / "sys-class-infiniband")

        port = free_port()
        conf = work / "mosquitto.conf"
        acl = (
            f"acl_file {DEPLOY / 'mosquitto/acl'}\n" if (DEPLOY / "mosquitto/acl").exists() else ""
        )
        conf.write_text(
            f"user root\nper_listener_settings true\nlistener {port} 127.0.0.1\n"
            f"cafile {certs}/ca.crt\ncertfile {certs}/broker.crt\nkeyfile {certs}/broker.key\n"
            f"allow_anonymous false\npassword_file {certs}/passwd\n{acl}persistence false\n"
            f"log_dest file {work}/mosquitto.log\n"
        )
        with _netns() as ns:
            broker = subprocess.Popen(
                ["ip", "netns", "exec", ns, require_binary("mosquitto"), "-c", str(conf)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(broker)
            yield {"ns": ns, "port": port, "work": work, "etc": etc, "host": host}
    finally:
        for p in procs:
            _stop(p)
        shutil.rmtree(work, ignore_errors=True)


def _run_as(
    lab: dict[str, Any],
    argv: list[str],
    env: dict[str, str],
    log: Path,
    *,
    ambient: str,
    bounding: str,
    wrap: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """``linkguard argv`` in the lab's namespace as `nobody` with the capabilities ``ambient``
    and the bounding set ``bounding`` (systemd's lists) and no_new_privs, as systemd starts a
    unit with User=, AmbientCapabilities=, CapabilityBoundingSet=, NoNewPrivileges=yes.
    Only ``env`` of the LINKGUARD_* variables is set. ``wrap``: a command that runs
    `linkguard` (strace), as the same user."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    cmd = [
        "ip", "netns", "exec", lab["ns"],
        require_binary("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        f"--inh-caps={_caps(ambient)}", f"--ambient-caps={_caps(ambient)}",
        f"--bounding-set={_caps(bounding)}", "--no-new-privs", "--", *wrap,
        str(Path(sys.executable).with_name("linkguard")), *argv,
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env=base | env, stdout=out, stderr=subprocess.STDOUT)


def _run_as_unit(
    lab: dict[str, Any],
    unit: str,
    argv: list[str],
    env: dict[str, str],
    log: Path,
    wrap: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """:func:`_run_as` with exactly the capabilities ``unit`` declares."""
    d = unit_directives(DEPLOY / "systemd" / UNITS[unit])
    assert one(d, "Service.NoNewPrivileges") == "yes"
    return _run_as(
        lab,
        argv,
        env,
        log,
        ambient=" ".join(d.get("Service.AmbientCapabilities", [])),
        bounding=" ".join(d.get("Service.CapabilityBoundingSet", [])),
        wrap=wrap,
    )


def _agent_env(lab: dict[str, Any], state: Path, **extra: str) -> dict[str, str]:
    etc: Path = lab["etc"]
    return {
        "LINKGUARD_HOST": lab["host"],
        "LINKGUARD_BUS__HOST": "127.0.0.1",
        "LINKGUARD_BUS__PORT": str(lab["port"]),
        "LINKGUARD_BUS__USERNAME": lab["host"],
        "LINKGUARD_BUS__CA_FILE": str(etc / "ca.crt"),
        "LINKGUARD_BUS__PASSWORD_FILE": str(etc / "agent-bus-password"),
        "LINKGUARD_SERVICE_PUBLIC_KEY": str(etc / "service.pub"),
        "LINKGUARD_SYSFS_ROOT": str(lab["work"] / "sys-class-infiniband"),
        "LINKGUARD_PORTS": json.dumps([{"hca": h, "rail": r} for r, h in enumerate(GPUD_HCAS)]),
        "LINKGUARD_STATE_DIR": str(state / "lib"),
        "LINKGUARD_RAIL_MAP_PATH": str(state / "run/rail-map.json"),
        "LINKGUARD_METRICS_LISTEN": "127.0.0.1:0",
        **extra,
    }


def _state_dir(lab: dict[str, Any], name: str) -> Path:
    """Like StateDirectory= and RuntimeDirectory=: directories owned by the service's user."""
    state = lab["work"] / name
    for sub in ("", "lib", "run"):
        (state / sub).mkdir(exist_ok=True)
        os.chown(state / sub, NOBODY, NOBODY)
    return state


def _service_env(lab: dict[str, Any], state: Path) -> dict[str, str]:
    """The service's LINKGUARD_* overrides in the lab (a generated 2-host fabric)."""
    etc: Path = lab["etc"]
    fabric = lab["work"] / "fabric.json"
    if not fabric.exists():
        subprocess.run(
            [str(Path(sys.executable).with_name("linkguard")), "fabric", "generate", "--hosts",
             "2", "--rails", "2", "-o", str(fabric)],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        fabric.chmod(0o644)
    return {
        "LINKGUARD_FABRIC": str(fabric),
        "LINKGUARD_BUS__HOST": "127.0.0.1",
        "LINKGUARD_BUS__PORT": str(lab["port"]),
        "LINKGUARD_BUS__CA_FILE": str(etc / "ca.crt"),
        "LINKGUARD_BUS__PASSWORD_FILE": str(etc / "topology-bus-password"),
        "LINKGUARD_SIGNING_KEY": str(etc / "service.key"),
        "LINKGUARD_LEDGER__PATH": str(state / "lib/ledger.sqlite3"),
        "LINKGUARD_API__PORT": "0",
        "LINKGUARD_STARTUP_SETTLE_S": "0",
    }


@pytest.mark.real
def test_agent_runs_with_the_units_capabilities_only(lab: dict[str, Any]) -> None:
    """The example config, the real CLI, TLS and a per-host password to the broker, as
    `nobody` with CAP_NET_ADMIN alone: the ip rule appears, the process holds exactly that
    capability, and SIGTERM withdraws the rule and exits 0 within TimeoutStopSec."""
    state = _state_dir(lab, "agent")
    log = lab["work"] / "agent.log"
    rule = "to 10.200.0.0/16 lookup 4242"
    proc = _run_as_unit(
        lab,
        "agent",
        ["agent", "--config", str(DEPLOY / "config/agent.yaml")],
        _agent_env(lab, state, LINKGUARD_SHUTDOWN_POLICY="withdraw"),
        log,
    )
    try:
        _wait(
            lambda: _has_event(log, "bus_connected") or proc.poll() is not None,
            "the agent's bus_connected",
            30,
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        assert rule in _rules(lab["ns"])
        status = dict(
            ln.split(":", 1) for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        )
        assert status["Uid"].split()[0] == str(NOBODY)
        for field in ("CapEff", "CapPrm", "CapAmb", "CapBnd"):
            assert int(status[field], 16) == 1 << CAP_NET_ADMIN, (field, status[field])
        assert status["NoNewPrivs"].strip() == "1"
        stop_s = _stop(proc)
    finally:
        _stop(proc)
    timeout = float(
        one(unit_directives(DEPLOY / "systemd" / UNITS["agent"]), "Service.TimeoutStopSec")
    )
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert stop_s < timeout
    assert _has_event(log, "agent_withdrew_routes")
    assert rule not in _rules(lab["ns"])


@pytest.mark.real
def test_agent_without_cap_net_admin_cannot_route(lab: dict[str, Any]) -> None:
    """The control: the same agent with no capability fails at its first ip rule (EPERM), exits
    2 saying it needs CAP_NET_ADMIN, and leaves no rule behind. So the capability above is
    needed, and the drop is real."""
    state = _state_dir(lab, "agent-nocap")
    log = lab["work"] / "agent-nocap.log"
    argv = ["agent", "--config", str(DEPLOY / "config/agent.yaml")]
    p = _run_as(lab, argv, _agent_env(lab, state), log, ambient="", bounding="")
    try:
        p.wait(30)
    finally:
        _stop(p)
    assert p.returncode == 2  # a clear refusal, not a traceback
    text = log.read_text()
    assert "the agent needs CAP_NET_ADMIN" in text and "Traceback" not in text, text[-2000:]
    assert "lookup 4242" not in _rules(lab["ns"])


@pytest.mark.real
def test_topology_service_runs_without_capabilities(lab: dict[str, Any]) -> None:
    """deploy/config/topology.yaml through the real CLI as `nobody` with no capability (the
    unit's empty bounding set): it connects over TLS with its own password, signs with its
    key, writes its ledger, serves its API, and stops on SIGTERM with exit 0."""
    state = _state_dir(lab, "topology")
    log = lab["work"] / "topology.log"
    env = _service_env(lab, state)
    proc = _run_as_unit(
        lab, "topology", ["topology", "serve", "--config", str(DEPLOY / "config/topology.yaml")],
        env, log,
    )  # fmt: skip
    try:
        _wait(
            lambda: (
                (_has_event(log, "bus_connected") and _has_event(log, "api_listening"))
                or proc.poll() is not None
            ),
            "the service's bus_connected and api_listening",
            60,
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        status = dict(
            ln.split(":", 1) for ln in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        )
        for field in ("CapEff", "CapPrm", "CapAmb", "CapBnd"):
            assert int(status[field], 16) == 0, (field, status[field])
        assert (state / "lib/ledger.sqlite3").exists()
        stop_s = _stop(proc)
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert stop_s < float(
        one(unit_directives(DEPLOY / "systemd" / UNITS["topology"]), "Service.TimeoutStopSec")
    )


# -- the units' seccomp and socket filters against what the processes do ----------------------


def _syscall_group(name: str) -> frozenset[str]:
    """The system calls of a systemd group (``@system-service``), nested groups expanded."""
    out: set[str] = set()
    r = subprocess.run(
        [systemd_analyze(), "syscall-filter", name], capture_output=True, text=True, check=True
    )
    for line in r.stdout.splitlines()[1:]:
        word = line.strip()
        if word and not word.startswith("#"):
            out |= _syscall_group(word) if word.startswith("@") else {word}
    return frozenset(out)


def _unit_filter(unit: str) -> tuple[frozenset[str], frozenset[str]]:
    """(system calls, address families) a unit allows: its SystemCallFilter= allow list less
    its ``~`` deny lists, and its RestrictAddressFamilies=."""
    d = unit_directives(DEPLOY / "systemd" / UNITS[unit])
    allow: set[str] = set()
    deny: set[str] = set()
    for value in d["Service.SystemCallFilter"]:
        target = deny if value.startswith("~") else allow
        for word in value.removeprefix("~").split():
            target |= _syscall_group(word) if word.startswith("@") else {word}
    return frozenset(allow - deny), frozenset(one(d, "Service.RestrictAddressFamilies").split())


def _traced(
    lab: dict[str, Any], unit: str, argv: list[str], env: dict[str, str], ready: list[str]
) -> tuple[set[str], set[str]]:
    """Run ``linkguard argv`` in the lab as ``unit`` would (its user and capabilities: some
    libraries act differently as root, SQLite chowns its journal) under strace, until its log
    has every event of ``ready``, then SIGTERM it; (system calls made, socket families), from
    the exec of `linkguard` on (what setpriv did before is not the unit's process)."""
    trace = lab["work"] / f"{unit}.strace"
    log = lab["work"] / f"{unit}-traced.log"
    d = unit_directives(DEPLOY / "systemd" / UNITS[unit])
    base = {k: v for k, v in os.environ.items() if not k.startswith("LINKGUARD_")}
    ambient = _caps(" ".join(d.get("Service.AmbientCapabilities", [])))
    cli = str(Path(sys.executable).with_name("linkguard"))
    cmd = [
        "ip", "netns", "exec", lab["ns"], require_binary("strace"), "-f", "-qq", "-o", str(trace),
        require_binary("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        f"--inh-caps={ambient}", f"--ambient-caps={ambient}",
        f"--bounding-set={_caps(' '.join(d.get('Service.CapabilityBoundingSet', [])))}",
        "--no-new-privs", "--", cli, *argv,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=base | env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(
            lambda: all(_has_event(log, e) for e in ready) or proc.poll() is not None,
            f"{ready} from the {unit} under strace",
            60,
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        os.kill(int(children[0]), signal.SIGTERM)  # setpriv exec'd linkguard; strace then exits
        proc.wait(30)
    finally:
        _stop(proc)
    text = trace.read_text(errors="replace")
    start = text.index(f'execve("{cli}"')
    text = text[text.rindex("\n", 0, start) + 1 :]
    calls = set(re.findall(r"^\d+\s+([a-z_0-9]+)\(", text, re.M))
    families = set(re.findall(r"\bsocket(?:pair)?\((AF_[A-Z0-9]+)", text))
    assert "exit_group(0)" in text.splitlines()[-1], text[-500:]  # a clean exit on SIGTERM
    return calls, families


@pytest.mark.real
def test_processes_stay_inside_the_units_filters(lab: dict[str, Any]) -> None:
    """Without systemd here, its seccomp and socket filters are checked against what the
    real processes do: agent and service, each run under strace through start-up, TLS
    connect, sysfs polling (agent), ip rule add and withdraw (agent), ledger, API and
    signing (service), and SIGTERM, call only system calls their unit's SystemCallFilter=
    allows and open only the address families of its RestrictAddressFamilies=. (Paths not
    taken in that run are not covered.)"""
    if shutil.which("strace") is None:
        missing("needs `strace` (Debian package strace)")
    runs = {
        "agent": _traced(
            lab,
            "agent",
            ["agent", "--config", str(DEPLOY / "config/agent.yaml")],
            _agent_env(lab, _state_dir(lab, "agent-traced"), LINKGUARD_SHUTDOWN_POLICY="withdraw"),
            ["bus_connected", "rule_added"],
        ),
        "topology": _traced(
            lab,
            "topology",
            ["topology", "serve", "--config", str(DEPLOY / "config/topology.yaml")],
            _service_env(lab, _state_dir(lab, "topology-traced")),
            ["bus_connected", "api_listening"],
        ),
    }
    for unit, (calls, families) in runs.items():
        allowed_calls, allowed_families = _unit_filter(unit)
        assert len(calls) > 30, f"{unit}: strace saw too little ({sorted(calls)})"
        assert calls <= allowed_calls, f"{unit}: {sorted(calls - allowed_calls)} not allowed"
        assert families, f"{unit}: no socket() seen"
        assert families <= allowed_families, f"{unit}: {sorted(families - allowed_families)}"
    assert "AF_NETLINK" in runs["agent"][1]
    assert _has_event(lab["work"] / "agent-traced.log", "agent_withdrew_routes")


# -- make-certs.sh: names checked before anything is made --------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-b", "bad name!"], "broker name 'bad name!' is not a DNS name"),
        (["-b", "-mqtt.example"], "broker name '-mqtt.example' is not a DNS name"),
        (["-b", "mqtt_1.example"], "broker name 'mqtt_1.example' is not a DNS name"),
        (["-b", "a" * 64 + ".example"], f"broker name '{'a' * 64}.example' is not a DNS name"),
        (["-b", "mqtt..example"], "broker name 'mqtt..example' is not a DNS name"),
        (["-b", ""], "broker name '' is not a DNS name"),
        (["-b", "10.0.0.256"], "broker name '10.0.0.256' is not an IPv4 address"),
        (["-b", "10.0.0"], "broker name '10.0.0' is not an IPv4 address"),
        (["-b", "fe80::1::2"], "broker name 'fe80::1::2' is not an IPv6 address"),
        (["bad name!"], "host name 'bad name!': use letters, digits"),
        (["gpu/001"], "host name 'gpu/001': use letters, digits"),
        (["-s", "svc user"], "user name 'svc user': use letters, digits"),
    ],
)
def test_make_certs_refuses_bad_names(args: list[str], message: str, tmp_path: Path) -> None:
    require_binary("openssl")
    out = tmp_path / "certs"
    r = subprocess.run(
        ["bash", str(DEPLOY / "make-certs.sh"), "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"make-certs.sh: {message}"), r.stderr
    assert not out.exists()  # refused before anything was made


def test_make_certs_puts_good_broker_names_in_the_certificate(tmp_path: Path) -> None:
    openssl = require_binary("openssl")
    out = tmp_path / "certs"
    names = ["mqtt.mgmt.example", "broker-1", "10.0.0.5", "fd00::5"]
    subprocess.run(
        ["bash", str(DEPLOY / "make-certs.sh"), "-o", str(out)]
        + [a for n in names for a in ("-b", n)]
        + ["gpu001"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = subprocess.run(
        [openssl, "x509", "-in", str(out / "broker.crt"), "-noout", "-ext", "subjectAltName"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    san = {s.strip() for s in text.splitlines()[1].split(",")}
    assert san == {
        "DNS:localhost",
        "IP Address:127.0.0.1",
        "DNS:mqtt.mgmt.example",
        "DNS:broker-1",
        "IP Address:10.0.0.5",
        "IP Address:FD00:0:0:0:0:0:0:5",
    }
