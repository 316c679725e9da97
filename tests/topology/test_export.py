"""Fabric renderings: DOT structure (and Graphviz itself when installed), summary, JSON/YAML."""

from __future__ import annotations

import re
import subprocess
from collections import Counter

import pytest

from linkguard.topology.export import (
    format_from_suffix,
    render,
    summarize,
    summary_text,
    to_dot,
)
from linkguard.topology.fabric import Fabric, load_fabric
from linkguard.topology.generator import generate_rail_optimized
from tests.support import require_binary

NODE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)" \[(.*)\];$')
EDGE = re.compile(r'^\s*"((?:[^"\\]|\\.)*)" -- "((?:[^"\\]|\\.)*)" \[label="([^"]*)"[^\]]*\];$')
CLUSTER = re.compile(r'^\s*subgraph "cluster_su(\d+)" \{$')


def parse(dot: str) -> tuple[dict[str, int | None], list[tuple[str, str, str]]]:
    """Line-based reading of what to_dot writes: node -> SU cluster (None: top level), edges.
    Fails on any line it does not expect, and on unbalanced braces."""
    lines = dot.splitlines()
    assert re.match(r'^graph "(?:[^"\\]|\\.)*" \{$', lines[0]), lines[0]
    assert lines[-1] == "}"
    nodes: dict[str, int | None] = {}
    edges: list[tuple[str, str, str]] = []
    cluster: int | None = None
    for line in lines[1:-1]:
        if m := CLUSTER.match(line):
            assert cluster is None, "nested cluster"
            cluster = int(m[1])
        elif line.strip() == "}":
            assert cluster is not None, "unbalanced }"
            cluster = None
        elif m := EDGE.match(line):
            edges.append((m[1], m[2], m[3]))
        elif m := NODE.match(line):
            assert m[1] not in nodes, f"node {m[1]} twice"
            nodes[m[1]] = cluster
        else:
            assert re.match(r'^\s*(graph|node|edge) \[.*\];$|^\s*label=".*";$', line), line
    assert cluster is None
    return nodes, edges


def cables_of(label: str) -> int:
    n, x, _ = label.partition("x")
    return int(n) if x and n.isdigit() else 1


@pytest.fixture(scope="module")
def two_su() -> Fabric:
    # 2 SUs of 16 hosts, 2 rails, 2 spines per SU: two tiers, 16 uplinks per leaf over 4 spines
    return generate_rail_optimized(hosts=32, rails=2, hosts_per_su=16, spines_per_su=2)


@pytest.fixture(scope="module")
def cored() -> Fabric:
    return generate_rail_optimized(hosts=12, rails=2, hosts_per_su=4, spines_per_su=2, core=True)


def test_dot_per_host(two_su: Fabric) -> None:
    nodes, edges = parse(to_dot(two_su))
    assert nodes["gpu000"] == 0 and nodes["gpu031"] == 1
    assert nodes["su1-leaf1"] == 1 and nodes["su0-spine1"] == 0
    assert len(nodes) == 32 + 4 + 4
    assert all(a in nodes and b in nodes for a, b, _ in edges)
    labels = {(a, b): label for a, b, label in edges}
    assert labels[("gpu017", "su1-leaf1")] == "mlx5_1 400G"
    assert labels[("su0-leaf0", "su1-spine1")] == "4x400G"  # 16 uplinks over 4 spines
    assert sum(cables_of(label) for *_, label in edges) == len(two_su.links)


def test_dot_aggregate_one_node_per_su_and_rail(two_su: Fabric) -> None:
    dot = to_dot(two_su, aggregate=True)
    nodes, edges = parse(dot)
    assert not any(n.startswith("gpu") for n in nodes)
    assert {n: su for n, su in nodes.items() if "/" in n} == {
        "su0/rail0": 0,
        "su0/rail1": 0,
        "su1/rail0": 1,
        "su1/rail1": 1,
    }
    assert '"su1/rail0" [shape=folder, fontsize=9, label="SU 1 rail 0\\n16 hosts"];' in dot
    labels = {(a, b): label for a, b, label in edges}
    assert labels[("su1/rail0", "su1-leaf0")] == "16x400G"
    assert sum(cables_of(label) for *_, label in edges) == len(two_su.links)


def test_dot_core_tier_outside_clusters(cored: Fabric) -> None:
    nodes, edges = parse(to_dot(cored, aggregate=True))
    cores = {n: su for n, su in nodes.items() if "core" in n}
    assert cores == {"cg0-core0": None, "cg1-core0": None}
    assert Counter(b for a, b, _ in edges if b in cores) == {"cg0-core0": 3, "cg1-core0": 3}


def test_dot_aggregate_groups_core_switches_cabled_alike() -> None:
    # 16 SUs: 64 spines, 4 core groups of 16; each spine has 64 core cables, 4 to each core
    f = generate_rail_optimized(hosts=512)
    nodes, edges = parse(to_dot(f, aggregate=True))
    groups = {n: su for n, su in nodes.items() if "core" in n}
    assert groups == {f"cg{k}-core0..cg{k}-core15": None for k in range(4)}
    core_edges = [(a, b, label) for a, b, label in edges if b in groups]
    # one edge per (spine, core group), not one per (spine, core switch): 64, not 1,024
    assert len(core_edges) == 64
    assert {(a, b) for a, b, _ in core_edges} == {
        (f"su{s}-spine{k}", f"cg{k}-core0..cg{k}-core15") for s in range(16) for k in range(4)
    }
    assert {label for *_, label in core_edges} == {"64x400G"}
    assert sum(cables_of(label) for *_, label in edges) == len(f.links)
    # without --aggregate every core switch stays a node
    nodes, _ = parse(to_dot(f))
    assert sum("core" in n for n in nodes) == 64


def test_dot_merges_parallel_cables_named_either_way(two_su: Fabric) -> None:
    flipped = [
        x.model_copy(update={"a": x.b, "b": x.a}) if x.kind == "leaf-spine" and i % 2 else x
        for i, x in enumerate(two_su.links)
    ]
    _, edges = parse(to_dot(two_su.model_copy(update={"links": flipped}), aggregate=True))
    _, want = parse(to_dot(two_su, aggregate=True))
    assert sorted(edges) == sorted(want)


def test_dot_aggregate_of_2048_hosts_renders_quickly() -> None:
    """The fleet-size case: 2,048 hosts x 8 rails, 64 SUs with the core tier (49,152 cables).
    Before core groups: 18,944 edges and ~4 min of `dot`; now ~2 s."""
    dot_bin = require_binary("dot")
    f = generate_rail_optimized(hosts=2048)
    dot = to_dot(f, aggregate=True)
    nodes, edges = parse(dot)
    # 512 (SU, rail) host groups, 512 leaves, 256 spines, 4 core groups
    assert len(nodes) == 512 + 512 + 256 + 4
    # 512 host-group edges, 4 per leaf to its SU's spines, 1 per spine to its core group
    assert len(edges) == 512 + 512 * 4 + 256
    assert sum(cables_of(label) for *_, label in edges) == len(f.links) == 49_152
    out = subprocess.run([dot_bin, "-Tsvg"], input=dot, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert out.stdout.count('class="cluster"') == 64


def test_dot_quotes_names() -> None:
    f = generate_rail_optimized(hosts=2, rails=1, name='lab "A" \\ 1')
    dot = to_dot(f)
    assert dot.splitlines()[0] == 'graph "lab \\"A\\" \\\\ 1" {'
    parse(dot)


@pytest.mark.parametrize("aggregate", [False, True])
def test_graphviz_reads_it(two_su: Fabric, cored: Fabric, aggregate: bool) -> None:
    dot_bin = require_binary("dot")
    for fabric in (two_su, cored):
        out = subprocess.run(
            [dot_bin, "-Tsvg"],
            input=to_dot(fabric, aggregate=aggregate),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and not out.stderr, out.stderr
        assert out.stdout.count('class="cluster"') == (3 if fabric is cored else 2)
        assert "<title>su0&#45;leaf1</title>" in out.stdout


def test_summary_counts(cored: Fabric, two_su: Fabric) -> None:
    s = summarize(cored)
    assert (s.hosts, s.gpus, s.rails) == (12, 24, [0, 1])
    assert (s.leaves, s.spines, s.cores) == (6, 6, 2)
    # 4 uplinks per leaf (max(4 slots, 2 spines)); each spine 4 down, 4 up to its one core
    assert s.links == {
        ("host-leaf", 400.0): 24,
        ("leaf-spine", 400.0): 24,
        ("spine-spine", 400.0): 24,
    }
    assert [(r.su, r.hosts, r.leaves, r.spines, r.host_leaf, r.leaf_uplinks) for r in s.sus] == [
        (su, 4, 2, 2, 8, 8) for su in range(3)
    ]
    text = summary_text(two_su, hosts_shown=2)
    assert "  switches  4 leaves, 4 spines, 0 core\n" in text
    assert "    leaf-spine        64 x 400 Gb/s\n" in text
    assert "  first 2 of 32 hosts\n" in text
    assert "gpu001       SU 0   r0=10.100.0.2 r1=10.100.1.2  GPUs 10.200.0.2..10.200.1.2" in text
    assert "gpu002" not in text


def test_summary_of_a_fabric_without_sus() -> None:
    f = Fabric.model_validate(
        {
            "name": "bare",
            "hosts": [
                {
                    "host": "h0",
                    "hcas": [{"hca": "mlx5_0", "rail": 0, "address": "10.1.0.1"}],
                    "endpoints": ["10.2.0.1"],
                }
            ],
            "switches": [{"name": "sw", "role": "leaf"}],
            "links": [{"a": "h0:mlx5_0/1", "b": "sw", "kind": "host-leaf"}],
        }
    )
    s = summarize(f)
    assert s.links == {("host-leaf", None): 1}
    assert [(r.su, r.hosts, r.leaves) for r in s.sus] == [(None, 1, 1)]
    assert "host-leaf          1 x ? Gb/s" in summary_text(f)
    nodes, edges = parse(to_dot(f, aggregate=True))
    assert nodes == {"sw/hosts": None, "sw": None} and edges == [("sw/hosts", "sw", "?")]


def test_json_and_yaml_round_trip(tmp_path, cored: Fabric) -> None:
    for fmt, suffix in (("json", ".json"), ("yaml", ".yaml")):
        path = tmp_path / f"f{suffix}"
        path.write_text(render(cored, fmt))
        assert load_fabric(path) == cored
    with pytest.raises(ValueError, match="unknown export format 'svg'"):
        render(cored, "svg")


def test_format_from_suffix() -> None:
    assert [
        format_from_suffix(p) for p in ("a.json", "b.YML", "c.gv", "d.dot", "e.txt", "f.topo")
    ] == ["json", "yaml", "dot", "dot", None, "ibnetdiscover"]
