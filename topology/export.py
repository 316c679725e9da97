"""Renderings of a fabric: Graphviz DOT, JSON/YAML files and a human summary.

Consumes: a validated :class:`~linkguard.topology.fabric.Fabric` (from a file, the generator or
an importer). Produces: text, for ``linkguard fabric show`` (:func:`summary_text`) and
``linkguard fabric export`` (:func:`render`). Nothing here does I/O.

Tiers are read from the model, so imported fabrics render too: a ``leaf`` switch is a leaf; a
``spine`` switch is a core switch when it has no ``leaf-spine`` link but has ``spine-spine``
links (the generator's core tier, an imported "super spine"), else a spine. A host belongs to the
SU of the leaf its first host-leaf link reaches (None when that leaf has no ``su``).

DOT follows the Graphviz language (https://graphviz.org/doc/info/lang.html): an undirected
``graph``, one ``subgraph cluster_su<N>`` per SU, IDs always quoted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from linkguard.topology.fabric import Fabric, dump_fabric

__all__ = [
    "EXPORT_FORMATS",
    "FabricSummary",
    "format_from_suffix",
    "render",
    "summarize",
    "summary_text",
    "to_dot",
]

ExportFormat = Literal["json", "yaml", "dot"]
#: What :func:`render` writes.
EXPORT_FORMATS: tuple[str, ...] = ("json", "yaml", "dot")
_SUFFIXES = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".dot": "dot", ".gv": "dot"}

Tier = Literal["host", "leaf", "spine", "core"]


def format_from_suffix(path: str | Path) -> str | None:
    """``json`` for .json, ``yaml`` for .yaml/.yml, ``dot`` for .dot/.gv, else None."""
    return _SUFFIXES.get(Path(path).suffix.lower())


@dataclass(frozen=True, slots=True)
class SURow:
    """Counts of one SU (``su`` None: hosts and switches of no known SU)."""

    su: int | None
    hosts: int
    leaves: int
    spines: int
    host_leaf: int  #: host-leaf cables of the SU's hosts
    leaf_uplinks: int  #: leaf-spine cables of the SU's leaves


@dataclass(frozen=True, slots=True)
class FabricSummary:
    """What ``linkguard fabric show`` prints. ``links`` maps (kind, rate in Gb/s or None) to the
    number of cables."""

    name: str
    hosts: int
    gpus: int
    rails: list[int]
    leaves: int
    spines: int
    cores: int
    links: dict[tuple[str, float | None], int]
    sus: list[SURow] = field(default_factory=list)


class _Index:
    """Tiers of switches and SUs of hosts, computed once per fabric."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.switch = {s.name: s for s in fabric.switches}
        has_leaf_link: set[str] = set()
        has_spine_link: set[str] = set()
        self.host_su: dict[str, int | None] = {}
        for link in fabric.links:
            if link.kind == "leaf-spine":
                has_leaf_link.update((link.a, link.b))
            elif link.kind == "spine-spine":
                has_spine_link.update((link.a, link.b))
            elif link.kind == "host-leaf":
                host = _host_of(link.a)
                if host is not None and host not in self.host_su:
                    leaf = self.switch.get(link.b)
                    self.host_su[host] = leaf.su if leaf is not None else None
        self.tier: dict[str, Tier] = {}
        for s in fabric.switches:
            if s.role == "leaf":
                self.tier[s.name] = "leaf"
            elif s.name not in has_leaf_link and s.name in has_spine_link:
                self.tier[s.name] = "core"
            else:
                self.tier[s.name] = "spine"

    def su_of(self, end: str) -> int | None:
        """SU of a switch or of the host a ``host:hca/port`` end belongs to."""
        sw = self.switch.get(end)
        if sw is not None:
            return sw.su if self.tier[end] != "core" else None
        host = _host_of(end)
        return self.host_su.get(host) if host is not None else None


def _host_of(end: str) -> str | None:
    host, sep, _ = end.partition(":")
    return host if sep else None


def summarize(fabric: Fabric) -> FabricSummary:
    """Counts of hosts, GPUs, rails, switches per tier, cables per (kind, rate) and per SU."""
    ix = _Index(fabric)
    tiers = Counter(ix.tier.values())
    links = Counter((link.kind, link.rate_gbps) for link in fabric.links)
    su_ids = sorted(
        {ix.host_su.get(h.host) for h in fabric.hosts}
        | {s.su for s in fabric.switches if ix.tier[s.name] != "core"},
        key=lambda s: (s is None, s or 0),
    )
    hosts = Counter(ix.host_su.get(h.host) for h in fabric.hosts)
    leaves = Counter(s.su for s in fabric.switches if ix.tier[s.name] == "leaf")
    spines = Counter(s.su for s in fabric.switches if ix.tier[s.name] == "spine")
    host_leaf: Counter[int | None] = Counter()
    uplinks: Counter[int | None] = Counter()
    for link in fabric.links:
        if link.kind == "host-leaf":
            host_leaf[ix.su_of(link.a)] += 1
        elif link.kind == "leaf-spine":
            leaf = link.a if ix.tier.get(link.a) == "leaf" else link.b
            uplinks[ix.su_of(leaf)] += 1
    rows = [
        SURow(su, hosts[su], leaves[su], spines[su], host_leaf[su], uplinks[su]) for su in su_ids
    ]
    return FabricSummary(
        name=fabric.name,
        hosts=len(fabric.hosts),
        gpus=sum(len(h.endpoints) for h in fabric.hosts),
        rails=fabric.rails,
        leaves=tiers["leaf"],
        spines=tiers["spine"],
        cores=tiers["core"],
        links=dict(sorted(links.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0.0))),
        sus=rows,
    )


def _rate(gbps: float | None) -> str:
    if gbps is None:
        return "? Gb/s"
    return f"{gbps:g} Gb/s"


def _ranges(values: list[int]) -> str:
    """Sorted ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def summary_text(fabric: Fabric, *, hosts_shown: int = 8) -> str:
    """The ``fabric show`` report: totals, cables by kind and rate, a per-SU table and the first
    ``hosts_shown`` hosts (rail addresses and endpoint range). Ends with a newline."""
    s = summarize(fabric)
    lines = [
        f"fabric {s.name}",
        f"  hosts     {s.hosts} ({s.gpus} GPUs)",
        f"  rails     {len(s.rails)} ({_ranges(s.rails)})" if s.rails else "  rails     0",
        f"  SUs       {sum(1 for r in s.sus if r.su is not None)}",
        f"  switches  {s.leaves} leaves, {s.spines} spines, {s.cores} core",
        "  cables",
    ]
    lines += [f"    {kind:<12} {n:>7} x {_rate(rate)}" for (kind, rate), n in s.links.items()]
    if not s.links:
        lines.append("    none")
    lines += [
        "",
        f"  {'SU':>4} {'hosts':>6} {'leaves':>6} {'spines':>6} {'host-leaf':>9} {'leaf-up':>7}",
    ]
    for r in s.sus:
        su = "-" if r.su is None else str(r.su)
        lines.append(
            f"  {su:>4} {r.hosts:>6} {r.leaves:>6} {r.spines:>6} {r.host_leaf:>9} "
            f"{r.leaf_uplinks:>7}"
        )
    shown = fabric.hosts[: max(0, hosts_shown)]
    if shown:
        ix = _Index(fabric)
        lines += ["", f"  first {len(shown)} of {s.hosts} hosts"]
        for h in shown:
            su = ix.host_su.get(h.host)
            rails = " ".join(f"r{c.rail}={c.address}" for c in h.hcas)
            eps = f"{h.endpoints[0]}..{h.endpoints[-1]}" if h.endpoints else "-"
            lines.append(f"  {h.host:<12} SU {'-' if su is None else su:<3} {rails}  GPUs {eps}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# DOT


def _q(text: str) -> str:
    """A quoted DOT ID: backslash and double quote escaped, newlines as DOT's ``\\n``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _grate(gbps: float | None) -> str:
    return "?" if gbps is None else f"{gbps:g}G"


_NODE_STYLE: dict[str, str] = {
    "host": "shape=ellipse, fontsize=9",
    "hosts": "shape=folder, fontsize=9",
    "leaf": 'shape=box, style=filled, fillcolor="#dbe9f6"',
    "spine": 'shape=box, style=filled, fillcolor="#f6e7c8"',
    "core": 'shape=box, style=filled, fillcolor="#f3c6c6"',
}


def to_dot(fabric: Fabric, *, aggregate: bool = False) -> str:
    """Graphviz DOT of ``fabric``: switches and hosts as nodes, one edge per connected pair with
    the cable count and rate as label (``"8x400G"``; host cables ``"mlx5_3 400G"``), one
    ``cluster_su<N>`` subgraph per SU holding its hosts, leaves and spines; core switches and
    switches of no SU outside any cluster.

    ``aggregate``: one node per (SU, rail) for the hosts instead of one per host (``"su3/rail5"``,
    label with the host count), its host-leaf cables merged into one edge per leaf; hosts whose
    leaf has no SU are grouped per leaf (``"<leaf>/hosts"``). Use it for fabrics of more than a
    few SUs: 2,048 hosts give 16,384 host edges otherwise. Ends with a newline.
    """
    ix = _Index(fabric)
    nodes: dict[int | None, list[str]] = {}

    def node(su: int | None, line: str) -> None:
        nodes.setdefault(su, []).append(line)

    edges: Counter[tuple[str, str, str]] = Counter()
    group_hosts: dict[str, set[str]] = {}
    group_label: dict[str, tuple[str, int | None]] = {}  # id -> (label, SU)
    for link in fabric.links:
        if link.kind == "host-leaf" and aggregate:
            host = _host_of(link.a) or link.a
            leaf = ix.switch.get(link.b)
            if leaf is not None and leaf.su is not None and link.rail is not None:
                gid = f"su{leaf.su}/rail{link.rail}"
                group_label[gid] = (f"SU {leaf.su} rail {link.rail}", leaf.su)
            else:
                gid = f"{link.b}/hosts"
                group_label[gid] = (f"hosts on {link.b}", ix.su_of(link.b))
            group_hosts.setdefault(gid, set()).add(host)
            edges[(gid, link.b, _grate(link.rate_gbps))] += 1
        elif link.kind == "host-leaf":
            hca = link.a.partition(":")[2].partition("/")[0]
            edges[(_host_of(link.a) or link.a, link.b, f"{hca} {_grate(link.rate_gbps)}")] += 1
        else:
            edges[(link.a, link.b, _grate(link.rate_gbps))] += 1

    if aggregate:
        for gid, (text, su) in group_label.items():
            n = len(group_hosts[gid])
            label = f"{text}\n{n} host{'s' if n != 1 else ''}"
            node(su, f"{_q(gid)} [{_NODE_STYLE['hosts']}, label={_q(label)}];")
    else:
        for h in fabric.hosts:
            node(ix.host_su.get(h.host), f"{_q(h.host)} [{_NODE_STYLE['host']}];")
    for s in fabric.switches:
        tier = ix.tier[s.name]
        node(None if tier == "core" else s.su, f"{_q(s.name)} [{_NODE_STYLE[tier]}];")

    out = [
        f"graph {_q(fabric.name)} {{",
        "  graph [rankdir=BT, newrank=true, fontsize=10];",
        "  node [fontsize=10];",
        "  edge [fontsize=8];",
    ]
    for su in sorted(k for k in nodes if k is not None):
        out.append(f"  subgraph {_q(f'cluster_su{su}')} {{")
        out.append(f"    label={_q(f'SU {su}')};")
        out += [f"    {line}" for line in nodes[su]]
        out.append("  }")
    out += [f"  {line}" for line in nodes.get(None, [])]
    for (a, b, label), n in edges.items():
        text = label if n == 1 else f"{n}x{label}"
        width = "" if n == 1 else f", penwidth={min(1 + n.bit_length() / 2, 4):g}"
        out.append(f"  {_q(a)} -- {_q(b)} [label={_q(text)}{width}];")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Files


def _yaml(data: object) -> str:
    # libyaml's emitter when PyYAML has it: the pure-Python one needs ~30 s for 2,048 hosts.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False)


def render(fabric: Fabric, fmt: str, *, aggregate: bool = False) -> str:
    """``fabric`` as ``json`` (as :func:`~linkguard.topology.fabric.dump_fabric`), ``yaml``
    (same data; :func:`~linkguard.topology.fabric.load_fabric` reads both back) or ``dot``
    (:func:`to_dot`; ``aggregate`` applies to DOT only). Raises ValueError on another format."""
    if fmt == "json":
        return dump_fabric(fabric, "json")
    if fmt == "yaml":
        return _yaml(fabric.model_dump(mode="json", exclude_none=True))
    if fmt == "dot":
        return to_dot(fabric, aggregate=aggregate)
    raise ValueError(f"unknown export format {fmt!r} ({', '.join(EXPORT_FORMATS)})")
