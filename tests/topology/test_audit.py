"""Fleet audit: a generated fabric printed as an ibnetdiscover dump with one injected cabling
fault per test (each found exactly, nothing else), the real X5 dump, inventories, renderings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from linkguard.models import HCAInfo, HostInventory
from linkguard.topology.audit import (
    SEVERITY,
    Finding,
    audit,
    format_json,
    format_table,
    inventory_problems,
    sort_findings,
)
from linkguard.topology.export import to_ibnetdiscover
from linkguard.topology.fabric import Fabric, Link
from linkguard.topology.generator import generate_rail_optimized
from linkguard.topology.ibnetdiscover import import_ibnetdiscover
from tests.conftest import FIXTURES
from tests.readme_audit import GEN as README_GEN
from tests.readme_audit import write_observed

X5 = FIXTURES / "ltaulell-HPC_toolset"

#: 2 SUs x 8 hosts x 4 rails: leaves su{0,1}-leaf{0..3}, 8 spines, 8 uplinks per leaf (one each)
GEN = generate_rail_optimized(hosts=16, rails=4, hosts_per_su=8)
ANONYMOUS = None  # switch descriptions that name no expected switch


def _dump_audit(links: list[Link] | None = None, *, desc: str | None = ANONYMOUS, **kw):
    text, _ = to_ibnetdiscover(GEN, links=links, switch_description=desc, **kw)
    r = import_ibnetdiscover(text)
    return audit(GEN, observed=r.fabric, observed_guids=r.guids)


def _brief(findings: list[Finding]) -> list[tuple[str, str, str | None, str | None]]:
    return [(f.kind, f.subject, f.expected, f.observed) for f in findings]


def _links() -> list[Link]:
    return list(GEN.links)


def _at(links: list[Link], a: str, b: str | None = None) -> int:
    return next(i for i, x in enumerate(links) if x.a == a and (b is None or x.b == b))


def _recable(links: list[Link], port: str, **update) -> list[Link]:
    i = _at(links, port)
    links[i] = links[i].model_copy(update=update)
    return links


@pytest.mark.parametrize("desc", [ANONYMOUS, "{name}", "MF0;{name}:MQM9700/U1"])
def test_clean_dump_has_no_findings(desc: str | None) -> None:
    assert _dump_audit(desc=desc) == []


def test_missing_host_cable() -> None:
    links = _links()
    del links[_at(links, "gpu010:mlx5_1/1")]
    assert _brief(_dump_audit(links)) == [
        ("missing_link", "gpu010:mlx5_1/1", "su1-leaf1 (rail 1), 400 Gb/s", None)
    ]


@pytest.mark.parametrize(
    ("desc", "subject", "counts"),
    [
        (ANONYMOUS, "su1-leaf3 - [spine]", ("8 cables", "7 cables")),  # anonymous spines
        ("{name}", "su1-leaf3 - su0-spine2", ("1 cable", "0 cables")),  # named: the pair
    ],
)
def test_missing_leaf_spine_cable(desc: str | None, subject: str, counts: tuple) -> None:
    links = _links()
    del links[_at(links, "su1-leaf3", "su0-spine2")]
    [f] = _dump_audit(links, desc=desc)
    assert (f.kind, f.severity, f.subject, (f.expected, f.observed)) == (
        "missing_link",
        "error",
        subject,
        counts,
    )
    assert f.detail == "1 cable at 400 Gb/s missing"


def test_switch_guids_in_the_expected_fabric_match_anonymous_switches() -> None:
    """Expected switches with ``guid`` (16 hex digits, as the dump helper numbers them)."""
    switches = [
        s.model_copy(update={"guid": f"{0x1000 + i:016x}"}) for i, s in enumerate(GEN.switches)
    ]
    expected = GEN.model_copy(update={"switches": switches})
    links = _links()
    del links[_at(links, "su0-leaf1", "su1-spine3")]
    text, _ = to_ibnetdiscover(GEN, links=links, switch_description=None)
    r = import_ibnetdiscover(text)
    assert _brief(audit(expected, observed=r.fabric, observed_guids=r.guids)) == [
        ("missing_link", "su0-leaf1 - su1-spine3", "1 cable", "0 cables")
    ]


def test_edr_where_ndr_is_expected() -> None:
    edr = {"width": "4x", "speed": "EDR", "rate_gbps": 100.0}
    [f] = _dump_audit(_recable(_links(), "gpu005:mlx5_3/1", **edr))
    assert (f.kind, f.subject, f.expected, f.observed) == (
        "wrong_rate",
        "gpu005:mlx5_3/1",
        "400 Gb/s",
        "4xEDR 100 Gb/s",
    )
    assert f.detail == "runs at 25% of the expected rate"
    links = _links()  # an uplink: found on its leaf
    i = _at(links, "su0-leaf2")
    links[i] = links[i].model_copy(update=edr)
    assert _brief(_dump_audit(links)) == [
        ("wrong_rate", "su0-leaf2 - [spine]", "400 Gb/s", "4xEDR 100 Gb/s")
    ]


def test_two_hcas_swapped_between_their_rails_leaves() -> None:
    links = _recable(_links(), "gpu003:mlx5_0/1", b="su0-leaf1")
    links = _recable(links, "gpu003:mlx5_1/1", b="su0-leaf0")
    findings = _dump_audit(links)
    assert [(f.kind, f.subject, f.expected) for f in findings] == [
        ("wrong_rail", "gpu003:mlx5_0/1", "su0-leaf0 (rail 0)"),
        ("wrong_rail", "gpu003:mlx5_1/1", "su0-leaf1 (rail 1)"),
    ]
    # the dump names leaves by GUID: matched to expected leaves by the hosts cabled to them
    assert findings[0].observed == "S-0000000000001001 = su0-leaf1 (rail 1)"
    assert findings[0].detail == "HCA of rail 0 cabled to the rail-1 leaf"


def test_hca_cabled_to_another_sus_leaf() -> None:
    [f] = _dump_audit(_recable(_links(), "gpu004:mlx5_2/1", b="su1-leaf2"))
    assert (f.kind, f.severity, f.subject, f.expected, f.observed) == (
        "wrong_leaf",
        "error",
        "gpu004:mlx5_2/1",
        "su0-leaf2 (rail 2)",
        "S-0000000000001006 = su1-leaf2 (rail 2)",
    )
    assert f.detail == "cabled to another leaf of SU 1 instead of SU 0 on the same rail 2"


def test_duplicated_guid() -> None:
    text, _ = to_ibnetdiscover(GEN, switch_description=None)
    first_ca = text.split('Ca\t1 "H-')[1][:16]  # gpu000:mlx5_0
    [f] = _dump_audit(ca_guids={"gpu012:mlx5_0/1": first_ca})
    assert (f.kind, f.subject, f.expected, f.observed) == (
        "duplicate_guid",
        f"0x{first_ca}",
        "one node",
        "gpu000:mlx5_0, gpu012:mlx5_0",
    )


def test_host_absent_from_dump() -> None:
    links = [x for x in _links() if not x.a.startswith("gpu009:")]
    [f] = _dump_audit(links)
    assert (f.kind, f.subject, f.expected, f.observed) == (
        "missing_host",
        "gpu009",
        "4 HCA ports",
        None,
    )
    assert f.detail == "absent from the observed fabric"


def test_all_faults_at_once() -> None:
    links = _recable(_links(), "gpu003:mlx5_0/1", b="su0-leaf1")
    links = _recable(links, "gpu003:mlx5_1/1", b="su0-leaf0")
    links = _recable(links, "gpu004:mlx5_2/1", b="su1-leaf2")
    links = _recable(links, "gpu005:mlx5_3/1", width="4x", speed="EDR", rate_gbps=100.0)
    del links[_at(links, "gpu010:mlx5_1/1")]
    del links[_at(links, "su1-leaf3", "su0-spine2")]
    links = [x for x in links if not x.a.startswith("gpu009:")]
    findings = _dump_audit(links, ca_guids={"gpu012:mlx5_0/1": f"{0xA0000:016x}"})
    assert [(f.kind, f.subject) for f in findings] == [
        ("missing_link", "gpu010:mlx5_1/1"),
        ("missing_link", "su1-leaf3 - [spine]"),
        ("wrong_rate", "gpu005:mlx5_3/1"),
        ("wrong_rail", "gpu003:mlx5_0/1"),
        ("wrong_rail", "gpu003:mlx5_1/1"),
        ("wrong_leaf", "gpu004:mlx5_2/1"),
        ("duplicate_guid", "0x00000000000a0000"),
        ("missing_host", "gpu009"),
    ]


def test_named_leaves_win_over_the_hosts_vote() -> None:
    """All of SU 0's rail-0 and rail-1 cables swapped: a leaf that says which it is (its
    description) makes each port a wrong_rail; anonymous leaves are matched by their hosts, and
    a consistent swap of whole leaves is then no fault (documented)."""
    links = _links()
    for h in range(8):
        links = _recable(links, f"gpu{h:03d}:mlx5_0/1", b="su0-leaf1")
        links = _recable(links, f"gpu{h:03d}:mlx5_1/1", b="su0-leaf0")
    named = _dump_audit(links, desc="MF0;{name}:MQM9700/U1")
    assert [f.kind for f in named] == ["wrong_rail"] * 16
    assert named[0].observed == "S-0000000000001001 = su0-leaf1 (rail 1)"
    assert _dump_audit(links) == []


def test_observed_fabric_file_with_an_hca_on_another_rails_leaf(tmp_path: Path) -> None:
    import yaml

    from linkguard.topology.fabric import dump_fabric, load_fabric

    doc = yaml.safe_load(dump_fabric(GEN, "yaml"))
    for x in doc["links"]:
        if x["a"] == "gpu003:mlx5_0/1":
            x["b"] = "su0-leaf1"  # the rail-0 HCA cabled to the rail-1 leaf
    path = tmp_path / "observed.yaml"
    path.write_text(yaml.safe_dump(doc))
    observed = load_fabric(path, observed=True)  # a strict load refuses it
    assert _brief(audit(GEN, observed=observed)) == [
        ("wrong_rail", "gpu003:mlx5_0/1", "su0-leaf0 (rail 0)", "su0-leaf1 (rail 1)")
    ]
    # the same fault through the shipped dump writer and the importer
    text, _ = to_ibnetdiscover(observed)
    r = import_ibnetdiscover(text)
    assert _brief(audit(GEN, observed=r.fabric, observed_guids=r.guids)) == [
        (
            "wrong_rail",
            "gpu003:mlx5_0/1",
            "su0-leaf0 (rail 0)",
            "S-0000000000001001 = su0-leaf1 (rail 1)",
        )
    ]


def test_unknown_host_and_extra_cable_are_warnings() -> None:
    extra = Link(a="gpu099:mlx5_0/1", b="su1-leaf0", kind="host-leaf", rail=0, rate_gbps=400.0)
    text, _ = to_ibnetdiscover(GEN, links=[*GEN.links, extra])
    r = import_ibnetdiscover(text)
    findings = audit(GEN, observed=r.fabric, observed_guids=r.guids)
    assert [(f.kind, f.severity, f.subject, f.observed) for f in findings] == [
        ("unknown_host", "warning", "gpu099", "observed fabric")
    ]
    uplink = Link(a="su0-leaf0", b="su1-spine3", kind="leaf-spine", rail=0, rate_gbps=400.0)
    assert _brief(_dump_audit([*GEN.links, uplink], desc="{name}")) == [
        ("unexpected_link", "su0-leaf0 - su1-spine3", "1 cable", "2 cables")
    ]


# --------------------------------------------------------------------------------------------
# The real X5 dump (PSMN, ENS Lyon): 11 switches, 89 single-port HCAs, QDR and DDR


@pytest.fixture(scope="module")
def x5():
    return import_ibnetdiscover(X5 / "X5.topofile", guid_map=X5 / "X5.map")


def test_x5_against_itself_is_clean(x5) -> None:
    assert audit(x5.fabric, observed=x5.fabric, observed_guids=x5.guids) == []
    again = import_ibnetdiscover(X5 / "X5.topofile", guid_map=X5 / "X5.map")
    assert audit(x5.fabric, observed=again.fabric, observed_guids=again.guids) == []


def _line(text: str, start: str) -> str:
    lines = [x for x in text.splitlines(keepends=True) if x.startswith(start)]
    assert len(lines) == 1, start
    return lines[0]


def _sub(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_x5_mutated_copy(x5, tmp_path: Path) -> None:
    text = (X5 / "X5.topofile").read_text()
    host = {guid: name.split(":")[0] for name, guid in x5.guids.items() if "/" not in name}
    leaf_a, leaf_b, spine = "S-0008f10500200b50", "S-0002c90200417670", "S-0008f10500108c5c"
    # 1. a host gone: its CA record and the leaf's line to it
    gone = "003048c749cd0000"
    text = _sub(text, _line(text, f'[4]\t"H-{gone}"'), "")
    text = "\n\n".join(b for b in text.split("\n\n") if f'Ca\t1 "H-{gone}"' not in b)
    # 2. a DDR host link trained at SDR (both ends say so)
    slow = "003048c74ea50000"
    for start in (f'[8]\t"H-{slow}"', f"[1]({slow[2:-4]}0001)"):
        line = _line(text, start)
        text = _sub(text, line, line.replace("4xDDR", "4xSDR"))
    # 3. a host moved from leaf B port 1 to the free port 25 of leaf A (same rail: one rail)
    moved = "78e7d10300229794"
    line = _line(text, f'[1]\t"H-{moved}"')
    text = _sub(text, line, "")
    anchor = _line(text, '[24]\t"H-003048c747c60000"')
    text = _sub(text, anchor, anchor + line.replace("[1]", "[25]", 1))
    text = _sub(text, f'"{leaf_b}"[1]\t', f'"{leaf_a}"[25]\t')
    # 4. one of the six leaf A - spine cables unplugged
    text = _sub(text, _line(text, f'[1]\t"{spine}"[15]'), "")
    text = _sub(text, _line(text, f'[15]\t"{leaf_a}"[1]'), "")
    path = tmp_path / "X5-mutated.topofile"
    path.write_text(text)
    seen = import_ibnetdiscover(path, guid_map=X5 / "X5.map")
    findings = audit(x5.fabric, observed=seen.fabric, observed_guids=seen.guids)
    assert _brief(findings) == [
        ("missing_link", f"{leaf_a} - {spine}", "6 cables", "5 cables"),
        ("wrong_rate", f"{host[slow]}:hca0/1", "4xDDR 20 Gb/s", "4xSDR 10 Gb/s"),
        ("wrong_leaf", f"{host[moved]}:hca0/1", f"{leaf_b} (rail 0)", f"{leaf_a} (rail 0)"),
        ("missing_host", host[gone], "1 HCA port", None),
    ]
    assert (host[slow], host[moved], host[gone]) == ("r422node70", "sl390lin25", "r422node2")


# --------------------------------------------------------------------------------------------
# Agents: inventories and reports


def _inventory(host: str, *hcas: tuple[str, int, str | None]) -> HostInventory:
    return HostInventory(host=host, hcas=[HCAInfo(hca=h, rail=r, netdev=n) for h, r, n in hcas])


def test_inventory_problems_lines() -> None:
    want = GEN.host("gpu001")
    assert inventory_problems(want, want) == []
    have = _inventory(
        "gpu001",
        ("mlx5_0", 1, "rail0"),
        ("mlx5_1", 0, "rail1"),
        ("mlx5_2", 2, "ib2"),
        ("mlx5_9", 3, None),
    )
    assert inventory_problems(want, have) == [
        "mlx5_3/1: in the fabric, not on the host",
        "mlx5_9/1: on the host, not in the fabric",
        "mlx5_0/1: rail 1 on the host, 0 in the fabric",
        "mlx5_1/1: rail 0 on the host, 1 in the fabric",
        "mlx5_2/1: netdev ib2 on the host, rail2 in the fabric",
    ]


def test_reports_and_inventories() -> None:
    reported = [h for h in GEN.host_names if h != "gpu015"] + ["stranger"]
    swapped = _inventory("gpu001", *[(f"mlx5_{r}", r ^ 1, f"rail{r}") for r in range(4)])
    findings = audit(GEN, reported_hosts=reported, inventories={"gpu001": swapped})
    assert _brief(findings) == [
        ("missing_host", "gpu015", "4 HCA ports", None),
        ("inventory_mismatch", "gpu001:mlx5_0/1", "rail 0", "rail 1"),
        ("inventory_mismatch", "gpu001:mlx5_1/1", "rail 1", "rail 0"),
        ("inventory_mismatch", "gpu001:mlx5_2/1", "rail 2", "rail 3"),
        ("inventory_mismatch", "gpu001:mlx5_3/1", "rail 3", "rail 2"),
        ("unknown_host", "stranger", None, "reported"),
    ]
    assert findings[0].detail == "absent from the hosts that reported and the agents' inventories"
    assert audit(GEN) == []  # nothing observed, nothing to say


def test_reported_host_absent_from_the_dump_misses_its_cables() -> None:
    text, _ = to_ibnetdiscover(GEN, links=[x for x in GEN.links if not x.a.startswith("gpu002:")])
    r = import_ibnetdiscover(text)
    findings = audit(GEN, observed=r.fabric, reported_hosts=["gpu002"])
    assert [(f.kind, f.subject) for f in findings] == [
        ("missing_link", f"gpu002:mlx5_{r}/1") for r in range(4)
    ]
    assert findings[0].detail == "the host reported but is absent from the observed fabric"


# --------------------------------------------------------------------------------------------
# Renderings


def test_table_and_json() -> None:
    links = _recable(_links(), "gpu003:mlx5_0/1", b="su0-leaf1")
    links = _recable(links, "gpu003:mlx5_1/1", b="su0-leaf0")
    extra = Link(a="gpu099:mlx5_0/1", b="su1-leaf0", kind="host-leaf", rail=0, rate_gbps=400.0)
    findings = _dump_audit([*links, extra])
    table = format_table(findings)
    lines = table.splitlines()
    assert lines[0].split() == ["SEVERITY", "KIND", "SUBJECT", "EXPECTED", "OBSERVED", "DETAIL"]
    assert lines[1].startswith("error     wrong_rail    gpu003:mlx5_0/1  su0-leaf0 (rail 0)  ")
    assert lines[3].startswith("warning   unknown_host  gpu099           -  ")
    assert lines[-1] == "3 findings (2 errors, 1 warning): wrong_rail 2, unknown_host 1"
    data = json.loads(format_json(findings))
    assert (data["errors"], data["warnings"], data["counts"]) == (
        2,
        1,
        {"wrong_rail": 2, "unknown_host": 1},
    )
    assert data["findings"][0] == findings[0].as_dict()
    assert data["findings"][2]["expected"] is None
    assert format_table([]) == "no findings: the observed fabric matches the expected one\n"


def test_fabric_file_as_observed_compares_by_name() -> None:
    """An observed fabric file with the expected names: every switch pair is compared."""
    links = _links()
    del links[_at(links, "su0-leaf1", "su1-spine0")]
    observed = Fabric(name="seen", hosts=GEN.hosts, switches=GEN.switches, links=links)
    assert _brief(audit(GEN, observed=observed)) == [
        ("missing_link", "su0-leaf1 - su1-spine0", "1 cable", "0 cables")
    ]


# --------------------------------------------------------------------------------------------
# Several sources


def test_a_fault_seen_by_two_sources_is_one_finding() -> None:
    """A dump names the leaf by GUID (``S-... = su0-leaf1``) and adds width and lane speed; a
    fabric file names it ``su0-leaf1``: the same kind, subject, expected and observed thing."""

    def f(kind, subject: str, expected: str | None, observed: str | None, detail: str):
        return Finding(kind, SEVERITY[kind], subject, expected, observed, detail)

    port, leaf0 = "gpu003:mlx5_0/1", "su0-leaf0 (rail 0)"
    extra, absent = "gpu007:mlx5_1/1", "gpu002:mlx5_0/1"
    dump = [
        f("wrong_rail", port, leaf0, "S-0000000000001001 = su0-leaf1 (rail 1)", "rail 1 leaf"),
        f("wrong_rate", "gpu005:mlx5_3/1", "400 Gb/s", "4xEDR 100 Gb/s", "25%"),
        f("unexpected_link", extra, None, "S-01 = su0-leaf2 (rail 2), 4xNDR 400 Gb/s", "extra"),
        f("missing_link", absent, f"{leaf0}, 400 Gb/s", None, "the host reported but is absent"),
    ]
    fabric_file = [
        f("wrong_rail", port, leaf0, "su0-leaf1 (rail 1)", "rail 1 leaf"),
        f("wrong_rate", "gpu005:mlx5_3/1", "400 Gb/s", "100 Gb/s", "25%"),
        f("unexpected_link", extra, None, "su0-leaf2 (rail 2), 400 Gb/s", "extra"),
        f("missing_link", absent, f"{leaf0}, 400 Gb/s", None, "no cable on this port"),
        # not the same: another leaf, another rate
        f("wrong_rail", port, leaf0, "su0-leaf3 (rail 3)", "rail 3 leaf"),
        f("wrong_rate", "gpu005:mlx5_3/1", "400 Gb/s", "200 Gb/s", "50%"),
    ]
    combined = sort_findings([*dump, *fabric_file])
    # the first of each (the dump's: both names, width and speed) is kept
    assert combined == sort_findings([*dump, *fabric_file[4:]])
    assert len(combined) == 6
    assert sort_findings([*dump, *dump]) == sort_findings(dump)


def test_cli_audit_of_a_dump_and_a_fabric_file_reports_each_fault_once(
    tmp_path: Path, capsys
) -> None:
    """The example of docs/fabric.md, audited with its dump and its fabric file together."""
    from linkguard.cli import main

    observed = write_observed(tmp_path)
    dump = tmp_path / "ib.topo"
    assert main(["fabric", "export", "--fabric", str(observed), "-o", str(dump)]) == 0
    argv = ["fabric", "audit", "--expected-generate", *README_GEN, "--ibnetdiscover", str(dump)]
    assert main([*argv, "--format", "json"]) == 1
    alone = json.loads(capsys.readouterr().out)
    assert main([*argv, "--fabric", str(observed), "--format", "json"]) == 1
    both = json.loads(capsys.readouterr().out)
    brief = [{k: v for k, v in f.items() if k != "detail"} for f in both["findings"]]
    assert brief == [{k: v for k, v in f.items() if k != "detail"} for f in alone["findings"]]
    assert (both["errors"], both["warnings"], both["counts"]) == (4, 0, alone["counts"])
    assert [(f["kind"], f["subject"], f["observed"]) for f in both["findings"]] == [
        ("wrong_rate", "gpu005:mlx5_3/1", "4xEDR 100 Gb/s"),
        ("wrong_rail", "gpu003:mlx5_0/1", "S-0000000000001001 = su0-leaf1 (rail 1)"),
        ("wrong_rail", "gpu003:mlx5_1/1", "S-0000000000001000 = su0-leaf0 (rail 0)"),
        ("missing_host", "gpu009", None),
    ]
