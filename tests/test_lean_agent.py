"""Issue 23, a lean agent: ``pip install`` of linkguard without extras, in a fresh venv, is the
per-host agent, and it runs on a real H100's sysfs tree against a real Mosquitto with none of
the service's, simulator's, broker's or probes' packages installed; the commands that need an
extra say which one and exit 2.

The venv is built once for the module (``python -m venv``, then pip with this machine's own
configuration: find-links / index, offline here; ~15 s) from a copy of the source (so the
build leaves nothing in the checkout). The agent's copy of
``../shared/fixtures/real/leptonai-gpud`` (8 InfiniBand NDR HCAs, all ACTIVE / LinkUp at
400 Gb/s) is read through the sysfs driver, routes kept in memory (``routes.apply: false``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from linkguard import topics
from linkguard.models import PortState
from tests.conftest import Broker
from tests.support import H100, H100_IB_HCAS, free_ports, retained

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parents[1]
#: import names of every extra's packages (pyproject.toml [project.optional-dependencies]):
#: none may be installed by the base install
EXTRA_ONLY = [
    "fastapi",
    "starlette",
    "uvicorn",
    "fastapi_offline",
    "networkx",
    "aetcd",
    "httpx",
    "amqtt",
    "matplotlib",
    "scapy",
]
HOST = "gpu001"


#: benchmarks/agent.py, whose base install this test runs (one recipe for both)
_BENCH_SPEC = importlib.util.spec_from_file_location("agent_bench", REPO / "benchmarks/agent.py")
assert _BENCH_SPEC is not None and _BENCH_SPEC.loader is not None
bench = sys.modules["agent_bench"] = importlib.util.module_from_spec(_BENCH_SPEC)  # dataclasses
_BENCH_SPEC.loader.exec_module(bench)
_env = bench.clean_env


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding ``pip install <source>`` (no extra); its directory."""
    try:
        return bench.base_install_venv(tmp_path_factory.mktemp("lean-agent"))
    except RuntimeError as exc:
        pytest.fail(f"the base install of the agent failed: {exc}")


def run_in(venv: Path, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_env(),
        timeout=timeout,
        check=False,
    )


def test_the_base_install_holds_no_extra_package(agent_venv: Path, tmp_path: Path) -> None:
    probe = (
        "import importlib.util, json, linkguard; print(json.dumps({'linkguard': "
        f"linkguard.__file__, 'found': [m for m in {EXTRA_ONLY!r} "
        "if importlib.util.find_spec(m)]}))"
    )
    out = run_in(agent_venv, "python", "-c", probe, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["linkguard"].startswith(str(agent_venv)), got  # the venv's, not the checkout's
    assert got["found"] == []


async def test_the_agent_alone_publishes_real_port_states(
    agent_venv: Path, tmp_path: Path, mosquitto: Broker, fixtures_real: Path
) -> None:
    tree = tmp_path / "sys-class-infiniband"
    shutil.copytree(fixtures_real / H100, tree)
    (metrics_port,) = free_ports(1)
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "host": HOST,
                "driver": "sysfs",
                "sysfs_root": str(tree),
                "bus": {"host": "127.0.0.1", "port": mosquitto.port},
                "ports": [{"hca": h, "port": 1, "rail": r} for r, h in enumerate(H100_IB_HCAS)],
                "routes": {"apply": False},
                "state_dir": str(tmp_path / "state"),
                "rail_map_path": str(tmp_path / "run/rail-map.json"),
                "metrics_listen": f"127.0.0.1:{metrics_port}",
            }
        )
    )
    # -X importtime: the modules the agent's process loaded, one "import time:" line each
    python = str(agent_venv / "bin/python")
    agent = subprocess.Popen(
        [python, "-X", "importtime", "-m", "linkguard.cli", "agent", "--config", str(config)],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        topic = topics.port_state(HOST, "mlx5_4", 1)
        payload = await retained(mosquitto.port, topic, until_payload=b'"status"', timeout=30)
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=20)
    assert agent.returncode == 0, err[-3000:]
    state = PortState.model_validate_json(payload)
    # the capture's values (sys-class-infiniband-h100.0/mlx5_4/ports/1): 4: ACTIVE, 5: LinkUp,
    # 400 Gb/sec (4X NDR), InfiniBand; mlx5_4 is the third HCA: rail 2
    assert (state.host, state.hca, state.port, state.rail) == (HOST, "mlx5_4", 1, 2)
    assert (state.state, state.phys_state) == ("ACTIVE", "LinkUp")
    assert (state.link_layer, state.rate_gbps) == ("InfiniBand", 400.0)
    assert (state.status, state.usable) == ("up", True)
    lines = err.splitlines()
    loaded = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    assert "linkguard.agent.daemon" in loaded  # the importtime lines are there
    ours = {m for m in loaded if m.startswith(("linkguard.topology", "linkguard.simulations"))}
    assert ours == set()
    # pyroute2's package __init__ (IPDB, NDB, ...) is not run (linkguard.drivers.rtnl)
    assert "pyroute2.iproute.linux" in loaded  # (the package itself is not "imported")
    assert "pyroute2" not in loaded
    assert not {"pyroute2.ipdb", "pyroute2.ndb.main"} & loaded


@pytest.mark.parametrize(
    ("command", "module", "extra"),
    [
        (["topology", "serve"], "networkx", "service"),
        (["quickstart"], "networkx", "all"),
        (["broker"], "amqtt", "broker"),
        (["sim", "run", "single-link-down.yaml"], "networkx", "sim"),
    ],
)
def test_a_command_without_its_extra_names_it(
    agent_venv: Path, tmp_path: Path, command: list[str], module: str, extra: str
) -> None:
    shutil.copy(REPO / "simulations/scenarios/single-link-down.yaml", tmp_path)
    out = run_in(agent_venv, "linkguard", *command, cwd=tmp_path)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"linkguard: linkguard {' '.join(command[:2])} "
        f"needs the Python package {module!r}, which the base install (the agent's) leaves out: "
        f"pip install 'linkguard[{extra}]'\n"
    )


def test_the_agent_with_probes_but_no_scapy_names_the_extra(
    agent_venv: Path, tmp_path: Path
) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "host": HOST,
                "driver": "sysfs",
                "sysfs_root": str(tmp_path / "none"),
                "ports": [{"hca": "mlx5_0", "port": 1, "rail": 0}],
                "routes": {"apply": False},
                "state_dir": str(tmp_path / "state"),
                "rail_map_path": str(tmp_path / "run/rail-map.json"),
                "metrics_listen": "",
                "probes": {"enabled": True},
            }
        )
    )
    out = run_in(agent_venv, "linkguard", "agent", "--config", str(config), cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.splitlines()[-1] == (
        "linkguard: linkguard agent needs the Python package 'scapy', which the base install "
        "(the agent's) leaves out: pip install 'linkguard[probes]'"
    )
