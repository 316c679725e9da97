"""Renderings of a fabric: Graphviz DOT, JSON/YAML files, ibnetdiscover output and a summary.

Consumes: a validated :class:`~linkguard.topology.fabric.Fabric` (from a file, the generator or
an importer). Produces: text, for ``linkguard fabric show`` (:func:`summary_text`) and
``linkguard fabric export`` (:func:`render`). Nothing here does I/O.

Tiers are read from the model (:func:`~linkguard.topology.fabric.switch_tiers`), so imported
fabrics render too. A host belongs to the SU of the leaf its first host-leaf link reaches (None
when that leaf has no ``su``).

The ibnetdiscover writer (:func:`to_ibnetdiscover`) prints what
:func:`~linkguard.topology.ibnetdiscover.import_ibnetdiscover` reads back: switches, HCAs,
cables, ports and rates survive the round trip.

DOT follows the Graphviz language (https://graphviz.org/doc/info/lang.html): an undirected
``graph``, one ``subgraph cluster_su<N>`` per SU, IDs always quoted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from linkguard.topology.fabric import Fabric, Link, dump_fabric, switch_tiers
from linkguard.topology.ibnetdiscover import LANE_GBPS

__all__ = [
    "EXPORT_FORMATS",
    "FabricSummary",
    "format_from_suffix",
    "render",
    "summarize",
    "summary_text",
    "to_dot",
    "to_ibnetdiscover",
]

ExportFormat = Literal["json", "yaml", "dot", "ibnetdiscover"]
#: What :func:`render` writes.
EXPORT_FORMATS: tuple[str, ...] = ("json", "yaml", "dot", "ibnetdiscover")
_SUFFIXES = {
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".dot": "dot",
    ".gv": "dot",
    ".topo": "ibnetdiscover",
}


def format_from_suffix(path: str | Path) -> str | None:
    """``json`` for .json, ``yaml`` for .yaml/.yml, ``dot`` for .dot/.gv, ``ibnetdiscover``
    for .topo, else None."""
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
        self.host_su: dict[str, int | None] = {}
        for link in fabric.links:
            if link.kind == "host-leaf":
                host = _host_of(link.a)
                if host is not None and host not in self.host_su:
                    leaf = self.switch.get(link.b)
                    self.host_su[host] = leaf.su if leaf is not None else None
        self.tier: dict[str, str] = dict(switch_tiers(fabric))

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
            host_su = ix.host_su.get(h.host)
            rails = " ".join(f"r{c.rail}={c.address}" for c in h.hcas)
            eps = f"{h.endpoints[0]}..{h.endpoints[-1]}" if h.endpoints else "-"
            su_text = "-" if host_su is None else host_su
            lines.append(f"  {h.host:<12} SU {su_text:<3} {rails}  GPUs {eps}")
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


def _core_groups(fabric: Fabric, ix: _Index) -> dict[str, tuple[str, list[str]]]:
    """Core switches cabled to the same set of switches, for ``to_dot(aggregate=True)``: core
    name -> (group node ID, the group's members in fabric order), for groups of two or more
    (the generator's core group k: every core of it reaches spine k of every SU)."""
    reach: dict[str, set[str]] = {}
    for link in fabric.links:
        for here, there in ((link.a, link.b), (link.b, link.a)):
            if ix.tier.get(here) == "core":
                reach.setdefault(here, set()).add(there)
    groups: dict[frozenset[str], list[str]] = {}
    for s in fabric.switches:
        if s.name in reach:
            groups.setdefault(frozenset(reach[s.name]), []).append(s.name)
    out: dict[str, tuple[str, list[str]]] = {}
    for members in groups.values():
        if len(members) > 1:
            gid = f"{members[0]}..{members[-1]}"
            out.update((m, (gid, members)) for m in members)
    return out


def to_dot(fabric: Fabric, *, aggregate: bool = False) -> str:
    """Graphviz DOT of ``fabric``: switches and hosts as nodes, one edge per connected pair and
    rate with the cable count and rate as label (``"8x400G"``; host cables ``"mlx5_3 400G"``;
    parallel cables are one edge whichever end a link names first), one ``cluster_su<N>``
    subgraph per SU holding its hosts, leaves and spines; core switches and switches of no SU
    outside any cluster.

    ``aggregate``, for fabrics of more than a few SUs (2,048 hosts give 16,384 host edges and
    16,384 spine-core edges otherwise):

    - one node per (SU, rail) for the hosts instead of one per host (``"su3/rail5"``, label with
      the host count), its host-leaf cables merged into one edge per leaf; hosts whose leaf has
      no SU are grouped per leaf (``"<leaf>/hosts"``);
    - one node per group of core switches cabled to the same switches (the generator's core
      group: ``"cg0-core0..cg0-core63"``, label with the switch count), its cables merged into
      one edge per (spine, group). A core switch with no such twin stays a node of its own.

    At 2,048 hosts x 8 rails that is 1,284 nodes and 2,816 edges. Ends with a newline.
    """
    ix = _Index(fabric)
    nodes: dict[int | None, list[str]] = {}

    def node(su: int | None, line: str) -> None:
        nodes.setdefault(su, []).append(line)

    core_group = _core_groups(fabric, ix) if aggregate else {}
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
            a = core_group.get(link.a, (link.a,))[0]
            b = core_group.get(link.b, (link.b,))[0]
            label = _grate(link.rate_gbps)
            edges[(b, a, label) if (b, a, label) in edges else (a, b, label)] += 1

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
        group = core_group.get(s.name)
        if group is None:
            node(None if tier == "core" else s.su, f"{_q(s.name)} [{_NODE_STYLE[tier]}];")
        elif group[1][0] == s.name:
            gid, members = group
            label = f"{gid}\n{len(members)} core switches"
            node(None, f"{_q(gid)} [{_NODE_STYLE['core']}, label={_q(label)}];")

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
# ibnetdiscover

#: Synthesized GUIDs (for switches without ``guid``, and every CA: the model keeps no CA GUID):
#: switch i of the fabric gets ``0x1000 + i``, the k-th CA ``0xA0000 + 16 k`` (its port p: + p).
_SWITCH_GUID_BASE = 0x1000
_CA_GUID_BASE = 0xA0000
_WIDTH_ORDER = ("4x", "1x", "2x", "8x", "12x")


def _width_speed(link: Link) -> str:
    """``4xNDR``: the link's width and speed; a missing one from its rate (4x first), ``??`` /
    ``???`` where neither says (the importer then leaves the rate unknown)."""
    if link.width and link.speed:
        return f"{link.width}{link.speed}"
    if link.rate_gbps is not None:
        for width in (link.width,) if link.width else _WIDTH_ORDER:
            lanes = int(width[:-1])
            for speed, gbps in LANE_GBPS.items():
                if (link.speed or speed) == speed and gbps * lanes == link.rate_gbps:
                    return f"{width}{speed}"
    return f"{link.width or '??'}{link.speed or '???'}"


def _host_end(end: str) -> tuple[str, str, int] | None:
    """``"gpu003:mlx5_2/1"`` -> ("gpu003", "mlx5_2", 1); None for a switch name."""
    host, sep, rest = end.partition(":")
    if not sep:
        return None
    hca, _, port = rest.rpartition("/")
    return host, hca, int(port)


def to_ibnetdiscover(
    fabric: Fabric,
    *,
    links: Iterable[Link] | None = None,
    ca_guids: Mapping[str, str] | None = None,
    switch_description: str | None = "{name}",
) -> tuple[str, dict[str, str]]:
    """``fabric`` as ``ibnetdiscover`` prints it (rdma-core infiniband-diags; what
    :func:`~linkguard.topology.ibnetdiscover.import_ibnetdiscover` reads): one ``Switch``
    record per switch, then one ``Ca`` record per cabled HCA, each port line naming the node and
    port at the other end, its description, LID and width/speed (``4xNDR``; from the rate when
    the link has none: 400 Gb/s is 4xNDR, 100 is 4xEDR). Returns (text, node name ->
    fabric switch name), node names being ``S-<guid>``.

    - GUIDs: ``Switch.guid`` where set, else synthesized (``0x1000`` + the switch's index); CA
      ``k`` (in order of first cable) ``0xA0000 + 16 k``, its port p that + p, unless
      ``ca_guids`` maps ``"<host>:<hca>"`` or ``"<host>:<hca>/<port>"`` to its node GUID (16 hex
      digits; duplicates for tests of the audit).
    - Descriptions: a switch's NodeDescription is ``Switch.description`` where set, else
      ``switch_description`` formatted with its name (``"MF0;{name}:MQM9700/U1"`` is the
      Mellanox form; None: the same anonymous ``"Quantum-2 QM9700"`` for all); a CA's is
      ``"<host> <hca>"`` as rdma-ndd sets it, so the importer recovers host and HCA names.
    - Ports: a link's ``a_port``/``b_port`` where set, else the switch's next free port; a
      switch's port count is its highest port. LIDs: switch i ``i + 1``, CA ports after them.
    - Only cabled HCA ports appear (a host without cables is absent, as from a real dump).
      ``links`` replaces the fabric's links (a cabling fault a validated Fabric cannot hold).

    Raises ValueError when a port is cabled twice or a node would need more than 255 ports.
    """
    links = list(fabric.links if links is None else links)
    taken = {s.guid for s in fabric.switches if s.guid}
    guid: dict[str, str] = {}
    for i, s in enumerate(fabric.switches):
        g = s.guid or f"{_SWITCH_GUID_BASE + i:016x}"
        while s.guid is None and g in taken:
            g = f"{int(g, 16) + 0x10000:016x}"
        taken.add(g)
        guid[s.name] = g
    fmt = switch_description or "Quantum-2 QM9700"
    desc = {s.name: s.description or fmt.format(name=s.name) for s in fabric.switches}
    lid = {s.name: i + 1 for i, s in enumerate(fabric.switches)}

    # ports: explicit ones first, then the next free port of each switch
    used: dict[str, set[int]] = {s.name: set() for s in fabric.switches}
    ends: list[list[int | None]] = []
    for i, link in enumerate(links):
        row: list[int | None] = []
        for end, port in ((link.a, link.a_port), (link.b, link.b_port)):
            host_end = _host_end(end)
            if host_end is not None:
                port = host_end[2]
            elif end not in used:
                raise ValueError(f"links[{i}]: unknown switch {end!r}")
            elif port is not None:
                if port in used[end]:
                    raise ValueError(f"links[{i}]: port {port} of {end} is cabled twice")
                used[end].add(port)
            row.append(port)
        ends.append(row)
    port_pairs: list[tuple[int, int]] = []  # (a's port, b's port) per link, all given now
    for link, row in zip(links, ends, strict=True):
        filled: list[int] = []
        for k, end in enumerate((link.a, link.b)):
            free = row[k]
            if free is None:
                free = 1
                while free in used[end]:
                    free += 1
                used[end].add(free)
            filled.append(free)
        port_pairs.append((filled[0], filled[1]))
    for name, ports in used.items():
        if ports and max(ports) > 255:
            raise ValueError(f"switch {name} needs {max(ports)} ports (InfiniBand allows 255)")

    # CAs in order of first cable: synthesized node GUIDs (port GUIDs), or the ones asked for
    ca_guid: dict[tuple[str, str], tuple[str, int]] = {}  # (host, hca) -> (node GUID, base)
    for link in links:
        for end in (link.a, link.b):
            h = _host_end(end)
            if h is not None and (h[0], h[1]) not in ca_guid:
                base = _CA_GUID_BASE + 16 * len(ca_guid)
                want = (ca_guids or {}).get(f"{h[0]}:{h[1]}") or (ca_guids or {}).get(end)
                ca_guid[(h[0], h[1])] = (want or f"{base:016x}", base)
    ca_ports: dict[tuple[str, str], dict[int, str]] = {key: {} for key in ca_guid}
    sw_lines: dict[str, dict[int, str]] = {s.name: {} for s in fabric.switches}
    ca_lid = len(fabric.switches)
    for link, (pa, pb) in zip(links, port_pairs, strict=True):
        ws = _width_speed(link)
        ha, hb = _host_end(link.a), _host_end(link.b)
        if ha is not None:
            (host, hca, cp), sw, sp = ha, link.b, pb
        elif hb is not None:
            (host, hca, cp), sw, sp = hb, link.a, pa
        else:  # switch - switch
            ga, gb = guid[link.a], guid[link.b]
            sw_lines[link.a][pa] = f'"S-{gb}"[{pb}]\t\t# "{desc[link.b]}" lid {lid[link.b]} {ws}'
            sw_lines[link.b][pb] = f'"S-{ga}"[{pa}]\t\t# "{desc[link.a]}" lid {lid[link.a]} {ws}'
            continue
        g, base = ca_guid[(host, hca)]
        if cp in ca_ports[(host, hca)]:
            raise ValueError(f"{host}:{hca}/{cp} is cabled twice")
        pg = f"{base + cp:x}"
        ca_lid += 1
        sw_lines[sw][sp] = f'"H-{g}"[{cp}]({pg}) \t\t# "{host} {hca}" lid {ca_lid} {ws}'
        ca_ports[(host, hca)][cp] = (
            f'[{cp}]({pg}) \t"S-{guid[sw]}"[{sp}]\t\t# lid {ca_lid} lmc 0 "{desc[sw]}" '
            f"lid {lid[sw]} {ws}"
        )

    out = ["#\n# Topology file: written by linkguard fabric export\n#"]
    for s in fabric.switches:
        g = guid[s.name]
        sw_ports = sw_lines[s.name]
        out.append(
            f"\nswitchguid=0x{g}({g})\n"
            f'Switch\t{max(sw_ports, default=1)} "S-{g}"\t\t# "{desc[s.name]}" enhanced port 0 '
            f"lid {lid[s.name]} lmc 0"
        )
        for p in sorted(sw_ports):
            out.append(f"[{p}]\t{sw_ports[p]}")
    for (host, hca), hca_ports in ca_ports.items():
        g = ca_guid[(host, hca)][0]
        out.append(f'\ncaguid=0x{g}\nCa\t{max(hca_ports)} "H-{g}"\t\t# "{host} {hca}"')
        out.extend(hca_ports[p] for p in sorted(hca_ports))
    return "\n".join(out) + "\n", {f"S-{g}": name for name, g in guid.items()}


# --------------------------------------------------------------------------------------------
# Files


def _yaml(data: object) -> str:
    # libyaml's emitter when PyYAML has it: the pure-Python one needs ~30 s for 2,048 hosts.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False)


def render(fabric: Fabric, fmt: str, *, aggregate: bool = False) -> str:
    """``fabric`` as ``json`` (as :func:`~linkguard.topology.fabric.dump_fabric`), ``yaml``
    (same data; :func:`~linkguard.topology.fabric.load_fabric` reads both back), ``dot``
    (:func:`to_dot`; ``aggregate`` applies to DOT only) or ``ibnetdiscover``
    (:func:`to_ibnetdiscover`). Raises ValueError on another format, and as
    :func:`to_ibnetdiscover` does."""
    if fmt == "json":
        return dump_fabric(fabric, "json")
    if fmt == "yaml":
        return _yaml(fabric.model_dump(mode="json", exclude_none=True))
    if fmt == "dot":
        return to_dot(fabric, aggregate=aggregate)
    if fmt == "ibnetdiscover":
        return to_ibnetdiscover(fabric)[0]
    raise ValueError(f"unknown export format {fmt!r} ({', '.join(EXPORT_FORMATS)})")
