"""The command line: help, the quick start, fabric generation and configuration errors."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from linkguard.cli import main
from linkguard.config import AgentSettings, ConfigError, load_settings
from linkguard.quickstart import run_quickstart
from linkguard.topology.fabric import load_fabric
from tests.readme_audit import write_observed


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "linkguard.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_every_command() -> None:
    out = _cli("--help")
    assert out.returncode == 0
    for cmd in ("quickstart", "agent", "topology", "fabric", "broker"):
        assert cmd in out.stdout


async def test_quickstart_moves_the_rail_and_brings_it_back() -> None:
    out = io.StringIO()
    res = await run_quickstart(hosts=4, rails=4, hold_down_s=1.0, out=out)
    text = out.getvalue()
    assert "local fast path" in text and "re-admitted after hold-down" in text
    # Counted per (host, peer endpoint) whose egress changed: 3 peers of the victim each get a
    # /32 exception for its rail-1 endpoint, and the victim's rail-1 prefix route (the peers'
    # 3 rail-1 endpoints) goes multipath over its 3 surviving rails: 6. Its busiest NIC then
    # carries 3 + 3/3 = 4 peer endpoints instead of 3.
    assert res["routes_moved"] == 6
    assert res["victim_busiest_nic_load"] == pytest.approx(4 / 3)
    assert res["readmit_ms"] >= 1000
    assert res["routes_restored"] is True


def test_fabric_generate_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "fabric.yaml"
    assert main(["fabric", "generate", "--hosts", "3", "--rails", "2", "-o", str(path)]) == 0
    fabric = load_fabric(path)
    assert [h.host for h in fabric.hosts] == ["gpu000", "gpu001", "gpu002"]
    assert str(fabric.hosts[1].hcas[1].address) == "10.100.1.2"


def test_bad_config_value_names_the_field(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({"host": "h", "routes": {"table": 254}}))
    with pytest.raises(ConfigError, match=r"routes\.table"):
        load_settings(AgentSettings, cfg)
    out = _cli("agent", "-c", str(cfg))
    assert out.returncode == 2
    assert "routes.table" in out.stderr and "reserved" in out.stderr


def test_config_file_errors_exit_2(tmp_path: Path) -> None:
    assert _cli("agent", "-c", str(tmp_path / "missing.yaml")).returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("host: [unclosed\n")
    out = _cli("agent", "-c", str(bad))
    assert out.returncode == 2 and "bad.yaml" in out.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("hots: typo\n")
    out = _cli("agent", "-c", str(unknown))
    assert out.returncode == 2 and "hots" in out.stderr


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({"host": "h", "bus": {"port": 1884, "host": "broker"}}))
    monkeypatch.setenv("LINKGUARD_BUS__PORT", "1999")
    s = load_settings(AgentSettings, cfg)
    assert (s.bus.host, s.bus.port) == ("broker", 1999)


def test_bad_fabric_file_exits_2(tmp_path: Path) -> None:
    fab = tmp_path / "fabric.yaml"
    fab.write_text("name: x\nhosts: [{host: a}]\n")
    out = _cli("topology", "serve", "--fabric", str(fab), "--broker", "127.0.0.1:9")
    assert out.returncode == 2
    assert "fabric.yaml" in out.stderr


def test_env_typo_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_POLL_INTERVALL_MS", "50")
    with pytest.raises(ConfigError, match="LINKGUARD_POLL_INTERVALL_MS"):
        load_settings(AgentSettings)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- host: a\n", "must be a mapping"),
        ("endpoint_prefixes: [0.0.0.0/0]\n", "too wide"),
        ("host: 'a b'\n", "letters, digits"),
        ("log_level: loud\n", "log_level"),
    ],
)
def test_agent_config_mistakes(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(AgentSettings, cfg)


def test_config_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_settings(AgentSettings, tmp_path)


def test_service_needs_exactly_one_fabric_source(tmp_path: Path) -> None:
    from linkguard.config import ServiceSettings
    from linkguard.topology.service import fabric_from_settings

    with pytest.raises(ConfigError, match="no fabric"):
        fabric_from_settings(load_settings(ServiceSettings))
    cfg = tmp_path / "svc.yaml"
    cfg.write_text("fabric: f.yaml\ngenerate: {hosts: 2}\n")
    with pytest.raises(ConfigError, match="not both"):
        load_settings(ServiceSettings, cfg)
    cfg.write_text("generate: {hosts: 3, rails: 2}\n")
    fabric = fabric_from_settings(load_settings(ServiceSettings, cfg))
    assert (len(fabric.hosts), fabric.rails) == (3, [0, 1])


def test_service_generate_takes_the_generators_parameters(tmp_path: Path) -> None:
    """The service's generate: takes what `fabric generate` and a scenario's generate: take
    (spines_per_su, management_hosts_per_su, core) and builds the same fabric; a combination
    the generator cannot build is a ConfigError naming generate:."""
    from linkguard.config import ServiceSettings
    from linkguard.topology.fabric import load_fabric, switch_tiers
    from linkguard.topology.service import fabric_from_settings

    cfg = tmp_path / "svc.yaml"
    cfg.write_text(
        "generate: {hosts: 8, rails: 2, hosts_per_su: 4, spines_per_su: 2, "
        "management_hosts_per_su: 1}\n"
    )
    fabric = fabric_from_settings(load_settings(ServiceSettings, cfg))
    out = tmp_path / "cli.yaml"
    argv = ["--hosts", "8", "--rails", "2", "--hosts-per-su", "4", "--spines-per-su", "2"]
    argv += ["--management-hosts-per-su", "1", "-o", str(out)]
    assert main(["fabric", "generate", *argv]) == 0
    assert fabric == load_fabric(out)
    # 8 hosts at 3 per SU (one slot of 4 left for management): 3 SUs, 2 spines each
    assert {s.su for s in fabric.switches if s.role == "leaf"} == {0, 1, 2}
    assert list(switch_tiers(fabric).values()).count("spine") == 6
    cfg.write_text("generate: {hosts: 8, rails: 2, hosts_per_su: 4, spines_per_su: 0}\n")
    with pytest.raises(ConfigError, match=r"^generate: .*spines_per_su >= 1"):
        fabric_from_settings(load_settings(ServiceSettings, cfg))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["quickstart", "--rails", "1"], "between 2 and 16"),
        (["quickstart", "--rail", "7"], "--rail 7"),
        (["quickstart", "--hosts", "500"], "between 2 and 64"),
        (["agent", "--broker", "localhost"], "HOST:PORT"),
        (["agent", "--broker", "mqtt://10.0.0.1:1883"], "HOST:PORT"),
        (["agent", "--broker", "127.0.0.1:70000"], "1-65535"),
        (["agent", "--host", ""], "must not be empty"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_broker_option_accepts_ipv6() -> None:
    from linkguard.cli import broker_address

    assert broker_address("[::1]:1884") == ("::1", 1884)
    assert broker_address("mqtt-0.fabric:1883") == ("mqtt-0.fabric", 1883)


def test_fabric_generate_format_follows_suffix(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    assert main(["fabric", "generate", "--hosts", "2", "--rails", "2", "-o", str(out)]) == 0
    assert out.read_text().lstrip().startswith("{")
    assert main(["fabric", "generate", "-o", str(tmp_path / "no" / "dir.yaml")]) == 1


# --- fabric show / export ----------------------------------------------------------------------

SMALL = ["--hosts", "40", "--rails", "2", "--hosts-per-su", "16", "--spines-per-su", "2"]


def test_fabric_show_from_generator_and_from_file(tmp_path: Path, capsys) -> None:
    assert main(["fabric", "show", "--generate", *SMALL, "--show-hosts", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("fabric rail-optimized-40x2\n  hosts     40 (80 GPUs)\n")
    assert "  SUs       3\n" in text and "  switches  6 leaves, 6 spines, 0 core\n" in text
    assert "    host-leaf         80 x 400 Gb/s\n    leaf-spine        96 x 400 Gb/s\n" in text
    assert "     2      8      2      2        16      32\n" in text  # the half-full last SU
    assert "gpu000       SU 0 " in text and "gpu001" not in text
    path = tmp_path / "f.json"
    assert main(["fabric", "generate", *SMALL, "-o", str(path)]) == 0
    out = tmp_path / "show.txt"
    assert main(["fabric", "show", "--fabric", str(path), "--show-hosts", "1", "-o", str(out)]) == 0
    assert out.read_text() == text


def test_fabric_show_core_tier_and_management_slots(capsys) -> None:
    argv = ["fabric", "show", "--generate", "--hosts", "496", "--management-hosts-per-su", "1"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "  SUs       16\n" in text and "128 leaves, 64 spines, 64 core" in text
    assert "    spine-spine     4096 x 400 Gb/s\n" in text
    assert "    15     31      8      4       248     256\n" in text


def test_fabric_export_formats(tmp_path: Path, capsys) -> None:
    dot = tmp_path / "f.gv"
    assert main(["fabric", "export", "--generate", *SMALL, "--aggregate", "-o", str(dot)]) == 0
    text = dot.read_text()
    assert text.startswith('graph "rail-optimized-40x2" {') and '"su2/rail1"' in text
    js = tmp_path / "f.json"
    assert main(["fabric", "export", "--fabric", str(_generated(tmp_path)), "-o", str(js)]) == 0
    assert load_fabric(js) == load_fabric(_generated(tmp_path))
    assert main(["fabric", "export", "--fabric", str(js), "--format", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["name"] == "rail-optimized-3x2"
    assert main(["fabric", "export", "--generate", "-o", str(tmp_path / "no" / "f.dot")]) == 1


def _generated(tmp_path: Path) -> Path:
    path = tmp_path / "gen.yaml"
    if not path.exists():
        assert main(["fabric", "generate", "--hosts", "3", "--rails", "2", "-o", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fabric", "show"], "--fabric --ibnetdiscover --generate is required"),
        (["fabric", "export", "--fabric", "f.yaml", "--generate"], "not allowed with"),
        (["fabric", "show", "--fabric", "f.yaml", "--hosts", "4"], "--hosts: generator options"),
        (["fabric", "export", "--generate", "--format", "json", "--aggregate"], "DOT only"),
        (
            ["fabric", "export", "--generate", "-o", "f.svg"],
            "give --format json, yaml, dot or ibnetdiscover",
        ),
        (["fabric", "show", "--generate", "--spines-per-su", "-1"], "between 0 and 64"),
        # integers print as integers, not 1e+06
        (["fabric", "show", "--generate", "--show-hosts", "-1"], "between 0 and 1000000, got -1"),
    ],
)
def test_fabric_usage_errors_exit_2(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and f"linkguard fabric {argv[1]}" in err


def test_fabric_bad_parameters_and_files_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["fabric", "show", "--generate", "--hosts", "300", "--no-core"]) == 2
    assert "two tiers cannot be cabled" in capsys.readouterr().err
    assert main(["fabric", "generate", "--management-hosts-per-su", "32"]) == 2
    assert "below hosts_per_su" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhosts: []\n")
    assert main(["fabric", "export", "--fabric", str(bad), "--format", "dot"]) == 2
    assert "bad.yaml" in capsys.readouterr().err
    assert main(["fabric", "show", "--fabric", str(tmp_path / "absent.json")]) == 2


def test_fabric_show_imports_ibnetdiscover(fixtures_real: Path, capsys) -> None:
    x5 = fixtures_real / "ltaulell-HPC_toolset"
    assert (
        main(
            [
                "fabric",
                "show",
                "--ibnetdiscover",
                str(x5 / "X5.topofile"),
                "--guid-map",
                str(x5 / "X5.map"),
                "--show-hosts",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "hosts     89" in out.out and "6 leaves" in out.out
    assert "rails inferred" in out.err
    with pytest.raises(SystemExit):
        main(["fabric", "show", "--generate", "--guid-map", str(x5 / "X5.map")])


def test_fabric_option_with_generate_in_config_is_refused(tmp_path: Path) -> None:
    """Two fabric sources, one from the config and one from the command line: refused (as a
    LINKGUARD_FABRIC variable with the same config is), never one silently picked."""
    cfg = tmp_path / "svc.yaml"
    cfg.write_text("generate: {hosts: 2}\n")
    fabric = tmp_path / "fabric.yaml"
    assert main(["fabric", "generate", "--hosts", "2", "-o", str(fabric)]) == 0
    out = _cli(
        "topology", "serve", "-c", str(cfg), "--fabric", str(fabric), "--broker", "127.0.0.1:9"
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"linkguard: bad ServiceSettings value (from {cfg}, LINKGUARD_* variables or options): "
        f"fabric '{fabric}' (the fabric: key, LINKGUARD_FABRIC or --fabric) and generate: "
        "(generator parameters) are both given: give either, not both"
    )
    # a fabric: key in the config is simply replaced by --fabric
    cfg.write_text(f"fabric: {tmp_path / 'absent.yaml'}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhosts: []\n")
    out = _cli("topology", "serve", "-c", str(cfg), "--fabric", str(bad), "--broker", "127.0.0.1:9")
    assert out.returncode == 2
    assert "bad.yaml: invalid fabric" in out.stderr and "absent.yaml" not in out.stderr
    help_text = _cli("topology", "serve", "--help").stdout
    assert "an error (exit 2) when the config has generate:" in " ".join(help_text.split())


def test_fabric_generate_help_states_each_default_once() -> None:
    out = _cli("fabric", "generate", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    # no second copy of the defaults from argparse's ArgumentDefaultsHelpFormatter
    assert "(default 32) (default: 32)" not in text and "(default: None)" not in text
    assert not re.search(r"\(default [^)]*\) \(default: ", text)
    assert "compute hosts (default 32)" in text and "spine switches per SU (default 4)" in text
    # the core tier's default says what the generator does: from 9 SUs at the default sizes
    assert "from 9 SUs at the default sizes; and always from 16 SUs" in text


def test_generator_needs_spines_for_several_sus(capsys) -> None:
    assert main(["fabric", "generate", "--hosts", "64", "--spines-per-su", "0"]) == 2
    assert capsys.readouterr().err == (
        "linkguard: 64 hosts need 2 SUs of 32, and SUs without spines cannot reach each other: "
        "use spines_per_su >= 1, or at most one SU (hosts <= hosts_per_su - "
        "management_hosts_per_su)\n"
    )
    # one SU needs no spine: every host reaches every other on each rail's leaf
    argv = ["fabric", "show", "--generate", "--hosts", "32", "--spines-per-su", "0"]
    assert main([*argv, "--show-hosts", "0"]) == 0
    assert "  switches  8 leaves, 0 spines, 0 core\n" in capsys.readouterr().out


def test_env_list_must_be_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_ENDPOINTS", "10.200.3.1")
    with pytest.raises(ConfigError, match=r"environment value.*JSON"):
        load_settings(AgentSettings)
    monkeypatch.setenv("LINKGUARD_ENDPOINTS", '["10.200.3.1"]')
    assert [str(e) for e in load_settings(AgentSettings).endpoints] == ["10.200.3.1"]


# --- fabric audit ------------------------------------------------------------------------------

AUDIT_GEN = ["--expected-generate", "--hosts", "16", "--rails", "4", "--hosts-per-su", "8"]


def _dump(tmp_path: Path, swap: bool = False, extra: bool = False) -> Path:
    from linkguard.topology.export import to_ibnetdiscover
    from linkguard.topology.fabric import Link
    from linkguard.topology.generator import generate_rail_optimized

    gen = generate_rail_optimized(hosts=16, rails=4, hosts_per_su=8)
    links = list(gen.links)
    if swap:  # gpu003's rail-0 and rail-1 HCAs on each other's leaves
        links = [
            x.model_copy(update={"b": {"su0-leaf0": "su0-leaf1", "su0-leaf1": "su0-leaf0"}[x.b]})
            if x.a in ("gpu003:mlx5_0/1", "gpu003:mlx5_1/1")
            else x
            for x in links
        ]
    if extra:
        links.append(Link(a="gpu099:mlx5_0/1", b="su1-leaf0", kind="host-leaf", rail=0))
    path = tmp_path / f"dump{int(swap)}{int(extra)}.topo"
    path.write_text(to_ibnetdiscover(gen, links=links, switch_description=None)[0])
    return path


def test_fabric_audit_exit_codes_and_table(tmp_path: Path, capsys) -> None:
    clean = ["fabric", "audit", *AUDIT_GEN, "--ibnetdiscover"]
    assert main([*clean, str(_dump(tmp_path))]) == 0
    assert capsys.readouterr().out == "no findings: the observed fabric matches the expected one\n"
    assert main([*clean, str(_dump(tmp_path, swap=True))]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["SEVERITY", "KIND", "SUBJECT", "EXPECTED", "OBSERVED"]
    assert [line.split()[:3] for line in lines[1:3]] == [
        ["error", "wrong_rail", "gpu003:mlx5_0/1"],
        ["error", "wrong_rail", "gpu003:mlx5_1/1"],
    ]
    assert lines[-1] == "2 findings (2 errors, 0 warnings): wrong_rail 2"
    # warnings only (a host the expected fabric lacks): reported, exit 0
    assert main([*clean, str(_dump(tmp_path, extra=True)), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["subject"]) for f in data["findings"]] == [("unknown_host", "gpu099")]


def test_fabric_audit_expected_file_and_both_sources(tmp_path: Path, capsys) -> None:
    expected = tmp_path / "expected.yaml"
    assert main(["fabric", "generate", *AUDIT_GEN[1:], "-o", str(expected)]) == 0
    observed = tmp_path / "observed.json"
    dump = _dump(tmp_path, swap=True)
    out = tmp_path / "audit.json"
    assert main(["fabric", "export", "--ibnetdiscover", str(dump), "-o", str(observed)]) == 0
    argv = ["fabric", "audit", "--expected", str(expected), "--ibnetdiscover", str(dump)]
    assert main([*argv, "--fabric", str(observed), "--format", "json", "-o", str(out)]) == 1
    findings = json.loads(out.read_text())["findings"]
    # both sources show the same two faults: reported once
    assert [(f["kind"], f["subject"]) for f in findings] == [
        ("wrong_rail", "gpu003:mlx5_0/1"),
        ("wrong_rail", "gpu003:mlx5_1/1"),
    ]
    capsys.readouterr()


def test_fabric_audit_real_x5_dump_against_its_export(
    fixtures_real: Path, tmp_path: Path, capsys
) -> None:
    x5 = fixtures_real / "ltaulell-HPC_toolset"
    dump = ["--ibnetdiscover", str(x5 / "X5.topofile"), "--guid-map", str(x5 / "X5.map")]
    expected = tmp_path / "x5.yaml"
    assert main(["fabric", "export", *dump, "-o", str(expected)]) == 0
    assert main(["fabric", "audit", "--expected", str(expected), *dump]) == 0
    assert "no findings" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--expected-generate"], "nothing observed"),
        (["--ibnetdiscover", "d"], "one of the arguments --expected --expected-generate"),
        (["--expected", "f.yaml", "--fabric", "o.yaml", "--hosts", "4"], "need --expected-gen"),
        (["--expected", "f.yaml", "--fabric", "o.yaml", "--guid-map", "m"], "--guid-map goes"),
        (["--expected-generate", "--fabric", "o", "--format", "dot"], "invalid choice: 'dot'"),
    ],
)
def test_fabric_audit_usage_errors_exit_2(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["fabric", "audit", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "linkguard fabric audit" in err


def test_fabric_audit_bad_inputs_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.topo"
    bad.write_text('Switch 2 "sw"\nhello world\n')
    assert main(["fabric", "audit", *AUDIT_GEN, "--ibnetdiscover", str(bad)]) == 2
    assert "bad.topo:2: unrecognized line" in capsys.readouterr().err
    missing = ["--expected", str(tmp_path / "absent.yaml"), "--ibnetdiscover", str(bad)]
    assert main(["fabric", "audit", *missing]) == 2
    assert "absent.yaml" in capsys.readouterr().err


#: The fleet-audit example of docs/fabric.md (once the README's), as `fabric audit
#: --ibnetdiscover` prints it.
README_AUDIT = """\
SEVERITY  KIND          SUBJECT          EXPECTED            OBSERVED                                 DETAIL
error     wrong_rate    gpu005:mlx5_3/1  400 Gb/s            4xEDR 100 Gb/s                           runs at 25% of the expected rate
error     wrong_rail    gpu003:mlx5_0/1  su0-leaf0 (rail 0)  S-0000000000001001 = su0-leaf1 (rail 1)  HCA of rail 0 cabled to the rail-1 leaf
error     wrong_rail    gpu003:mlx5_1/1  su0-leaf1 (rail 1)  S-0000000000001000 = su0-leaf0 (rail 0)  HCA of rail 1 cabled to the rail-0 leaf
error     missing_host  gpu009           4 HCA ports         -                                        absent from the observed fabric

4 findings (4 errors, 0 warnings): wrong_rate 1, wrong_rail 2, missing_host 1
"""  # noqa: E501


def test_readme_audit_example_with_shipped_commands(tmp_path: Path, capsys) -> None:
    """generate -> edit the copy as docs/fabric.md says -> export --format ibnetdiscover -> audit,
    and the same edited copy audited directly as an observed fabric file."""
    observed = write_observed(tmp_path)
    # an expected fabric (show, the service) must not have an HCA on another rail's leaf
    assert main(["fabric", "show", "--fabric", str(observed)]) == 2
    assert "Only an observed fabric may be" in capsys.readouterr().err
    dump = tmp_path / "ib.topo"  # .topo: --format ibnetdiscover from the suffix
    assert main(["fabric", "export", "--fabric", str(observed), "-o", str(dump)]) == 0
    assert main(["fabric", "audit", *AUDIT_GEN, "--ibnetdiscover", str(dump)]) == 1
    assert capsys.readouterr().out == README_AUDIT
    readme = (Path(__file__).parents[1] / "docs" / "fabric.md").read_text()
    assert README_AUDIT.rstrip("\n") in readme
    # the edited file itself, read as observed: the same findings under fabric names
    assert main(["fabric", "audit", *AUDIT_GEN, "--fabric", str(observed), "--format", "json"]) == 1
    found = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["kind"], f["subject"], f["observed"]) for f in found] == [
        ("wrong_rate", "gpu005:mlx5_3/1", "100 Gb/s"),
        ("wrong_rail", "gpu003:mlx5_0/1", "su0-leaf1 (rail 1)"),
        ("wrong_rail", "gpu003:mlx5_1/1", "su0-leaf0 (rail 0)"),
        ("missing_host", "gpu009", None),
    ]


def test_fabric_export_ibnetdiscover_reads_back(tmp_path: Path, capsys) -> None:
    dump = tmp_path / "f.txt"
    argv = ["fabric", "export", "--generate", *SMALL, "--format", "ibnetdiscover"]
    assert main([*argv, "-o", str(dump)]) == 0
    assert main(["fabric", "show", "--ibnetdiscover", str(dump), "--show-hosts", "0"]) == 0
    out = capsys.readouterr()
    assert "  hosts     40 (0 GPUs)\n" in out.out
    assert "  switches  6 leaves, 6 spines, 0 core\n" in out.out
    assert "    host-leaf         80 x 400 Gb/s\n    leaf-spine        96 x 400 Gb/s\n" in out.out
    assert "warning" not in out.err


# --- fabrics the service cannot serve, formats that contradict the file name ----------------


def test_serve_refuses_a_fabric_without_netdevs_or_endpoints(
    fixtures_real: Path, tmp_path: Path, capsys
) -> None:
    """An imported fabric validates but gives plans agents cannot apply (no netdevs) or that
    delete their routes (no endpoints): `topology serve` exits 2 before connecting, and
    `fabric show` warns."""
    x5 = fixtures_real / "ltaulell-HPC_toolset"
    imported = tmp_path / "x5.yaml"
    dump = ["--ibnetdiscover", str(x5 / "X5.topofile"), "--guid-map", str(x5 / "X5.map")]
    assert main(["fabric", "export", *dump, "-o", str(imported)]) == 0
    capsys.readouterr()
    out = _cli("topology", "serve", "--fabric", str(imported), "--broker", "127.0.0.1:9")
    assert out.returncode == 2
    assert out.stderr == (
        f"linkguard: {imported}: the topology service cannot serve this fabric: 89 HCA port(s) "
        "without a netdev (r422node2:hca0/1, r422node8:hca0/1, r422node36:hca0/1 and 86 "
        "more): set each HCA's netdev (the interface its rail's routes leave by, e.g. ib0 or "
        "ens3np0); 89 host(s) without GPU endpoints (r422node2, r422node8, r422node36 and 86 "
        "more): set each host's endpoints (one address per GPU, index = GPU). A fabric imported "
        "from ibnetdiscover has neither: fill in the netdevs and endpoints (or generate one "
        "with `linkguard fabric generate`)\n"
    )
    assert main(["fabric", "show", "--fabric", str(imported), "--show-hosts", "0"]) == 0
    err = capsys.readouterr().err
    assert [x.split(" (")[0] for x in err.splitlines()] == [
        "linkguard: note: `topology serve` would refuse it: 89 HCA port(s) without a netdev",
        "linkguard: note: `topology serve` would refuse it: 89 host(s) without GPU endpoints",
    ]
    # one host without endpoints is enough to refuse; the rest of a generated fabric is fine
    doc = yaml.safe_load(_generated(tmp_path).read_text())
    doc["hosts"][2]["endpoints"], doc["hosts"][2]["gpu_numa"] = [], []
    del doc["endpoint_subnets"]
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump(doc))
    from linkguard.config import ServiceSettings
    from linkguard.topology.fabric import FabricError
    from linkguard.topology.service import fabric_from_settings

    with pytest.raises(FabricError, match=r"1 host\(s\) without GPU endpoints \(gpu002\)"):
        fabric_from_settings(ServiceSettings(fabric=partial))
    assert main(["fabric", "show", "--fabric", str(_generated(tmp_path))]) == 0
    assert "would refuse" not in capsys.readouterr().err
    assert len(fabric_from_settings(ServiceSettings(fabric=_generated(tmp_path))).hosts) == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["generate", "--hosts", "4", "-o", "x.json", "--format", "yaml"],
            "--format yaml contradicts -o x.json, whose suffix means json: make them agree, or "
            "leave --format out",
        ),
        (
            ["generate", "-o", "x.yml", "--format", "json"],
            "--format json contradicts -o x.yml, whose suffix means yaml: make them agree, or "
            "leave --format out",
        ),
        (
            ["generate", "-o", "x.dot"],
            "-o x.dot: its suffix means dot, but this subcommand writes json or yaml (`fabric "
            "export` writes dot)",
        ),
        (
            ["export", "--generate", "-o", "x.yaml", "--format", "json"],
            "--format json contradicts -o x.yaml, whose suffix means yaml: make them agree, or "
            "leave --format out",
        ),
        (
            ["export", "--generate", "-o", "x.topo", "--format", "dot"],
            "--format dot contradicts -o x.topo, whose suffix means ibnetdiscover: make them "
            "agree, or leave --format out",
        ),
    ],
)
def test_format_contradicting_the_output_suffix_exits_2(
    tmp_path: Path, argv: list[str], message: str, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["fabric", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: linkguard fabric {argv[0]} ")
    assert err.endswith(f"linkguard fabric {argv[0]}: error: {message}\n")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_format_agreeing_with_the_suffix_or_an_unknown_suffix_is_fine(tmp_path: Path) -> None:
    for name, fmt in (("a.json", "json"), ("b.yml", "yaml"), ("c.txt", "json")):
        argv = ["fabric", "generate", "--hosts", "2", "-o", str(tmp_path / name), "--format", fmt]
        assert main(argv) == 0
    assert load_fabric(tmp_path / "a.json") == load_fabric(tmp_path / "b.yml")
    assert json.loads((tmp_path / "c.txt").read_text())["name"] == "rail-optimized-2x8"
    assert main(["fabric", "export", "--generate", "-o", str(tmp_path / "d.gv")]) == 0


def test_quickstart_rail_error_shows_the_quickstart_usage(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["quickstart", "--rail", "9"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: linkguard quickstart [-h] [--hosts HOSTS]")
    assert err.endswith("linkguard quickstart: error: --rail 9 is not one of the 4 rails (0-3)\n")


def test_cable_count_below_one_says_so(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["fabric", "faults", "--cable-down", "a,b,-1"])
    assert e.value.code == 2
    assert (
        "argument --cable-down: COUNT must be a whole number >= 1, got '-1'"
        in capsys.readouterr().err
    )
