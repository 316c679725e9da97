"""Import ``ibnetdiscover`` output (and the ibsim net files that share its format) into a Fabric.

Consumes: the topology text ``ibnetdiscover`` prints (infiniband-diags, rdma-core
``infiniband-diags/ibnetdiscover.c``; man page ibnetdiscover(8)) or an ibsim net file
(linux-rdma/ibsim ``ibsim/sim_net.c``), optionally a GUID map (``H-<guid> <hostname>`` or
node-name-map ``0x<guid> "<host> <device>"`` lines).
Produces: an :class:`ImportResult`: a validated :class:`~linkguard.topology.fabric.Fabric`, the
GUID of every switch / HCA / HCA port, and what was inferred (``notes``) or looked wrong
(``warnings``).

Two stages: :func:`parse_ibnetdiscover` reads the format into an :class:`IBTopology` (nodes and
de-duplicated links, nothing inferred); :func:`import_ibnetdiscover` turns that into a Fabric
(host names, leaf/spine roles, rails, HCA names, rail addresses). The first stage is
:mod:`~linkguard.topology.ibnetdiscover_parse`, the parsed records
:mod:`~linkguard.topology.ibnetdiscover_records`; their public names are re-exported here.

The format, per node record (fields as rdma-core prints them)::

    vendid=0x8f1                       stanza lines before the header (ibsim: guid bases)
    devid=0x5a5a
    sysimgguid=0x8f10500200b51
    switchguid=0x8f10500200b50(8f10500200b50)      or caguid= / rtguid=
    Switch  36 "S-0008f10500200b50"  # "<NodeDescription>" enhanced port 0 lid 9 lmc 0
    [1]     "S-0008f10500108c5c"[15]   # "<remote desc>" lid 16 4xQDR
    [4]     "H-003048c749cd0000"[1](3048c749cd0001)  # "<remote desc>" lid 72 4xDDR

    Ca  1 "H-003048c707b60000"  # "MT25408 ConnectX Mellanox Technologies"
    [1](3048c707b60001)  "S-0008f10500200b50"[32]  # lid 93 lmc 0 "<remote desc>" lid 9 4xDDR

Node names are ``S-``/``H-``/``R-`` + the 16-hex-digit node GUID; ibsim uses any quoted name
(``"Switch1"``), ``Hca`` for ``Ca``, may omit the remote port (default 1) and gives widths and
speeds as IBA PortInfo enable masks (``w=2`` is 4x, ``w=4`` 8x, ``w=8`` 12x; ``s=1`` SDR, ``s=2``
DDR, ``s=4`` QDR), as ``ibsim/sim.h`` defines them. Descriptions may contain ``#`` and quotes:
they are taken greedily up to the fields that follow them.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
from pydantic import ValidationError

from linkguard.models import LANE_GBPS, HCAInfo, HostInventory
from linkguard.topology.fabric import Fabric, Link, Switch, switch_tiers
from linkguard.topology.generator import _rail_subnet_size, rail_subnets
from linkguard.topology.ibnetdiscover_parse import (
    _guid16,
    _more,
    parse_ibnetdiscover,
)
from linkguard.topology.ibnetdiscover_records import (
    SIGNALING_GBPS_PER_LANE,
    FabricImportError,
    IBLink,
    IBNode,
    IBTopology,
)

__all__ = [
    "LANE_GBPS",
    "SIGNALING_GBPS_PER_LANE",
    "FabricImportError",
    "IBLink",
    "IBNode",
    "IBTopology",
    "ImportResult",
    "import_ibnetdiscover",
    "load_guid_map",
    "parse_ibnetdiscover",
]

log = structlog.get_logger(__name__)

_HOST_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_NOT_HOST = re.compile(r"^MT\d+$")  # Mellanox part numbers: the firmware's default description
# Kernel RDMA device names as rdma-ndd's default "%h %d" description carries them: mlx5_0,
# mlx4_1, hfi1_0, mthca0, qib0, irdma0, bnxt_re0.
_DEVICE = re.compile(r"^[a-z][a-z0-9_]*\d$")
_HCA_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


# --------------------------------------------------------------------------------------------
# Import


@dataclass(frozen=True)
class ImportResult:
    """An imported fabric. ``guids`` maps names in ``fabric`` to GUIDs (16 lowercase hex
    digits): switch name -> node GUID, ``"<host>:<hca>"`` -> CA node GUID,
    ``"<host>:<hca>/<port>"`` -> port GUID where the file gives it. ``notes`` say what was
    inferred, ``warnings`` what looks wrong in the input."""

    fabric: Fabric
    guids: dict[str, str]
    notes: list[str]
    warnings: list[str]


def load_guid_map(path: str | Path) -> dict[str, str]:
    """Read a GUID -> host name map: one ``<guid> <name>`` per line, ``<guid>`` as ``H-<16 hex>``
    (the X5.map format of ltaulell/HPC_toolset), ``S-``/``R-<16 hex>`` or ``0x<hex>`` (the
    ibnetdiscover node-name-map format, name optionally in double quotes); ``#`` comments and
    blank lines skipped. A name of several words is a node description, ``"gpu001 mlx5_1"`` as
    a node-name-map gives it: its first word is the host. Returns {16-hex GUID: host name}.

    Raises :class:`FabricImportError` naming the file and line on a malformed line, an unreadable
    file, or one GUID mapped to two names.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FabricImportError(str(p), None, f"cannot read GUID map: {exc}") from exc
    out: dict[str, str] = {}
    pat = re.compile(
        r'^(?:[SHR]-(?P<g>[0-9a-fA-F]{16})|0x(?P<x>[0-9a-fA-F]{1,16}))\s+"?(?P<n>[^"]+?)"?$'
    )
    for no, raw in enumerate(text.splitlines(), start=1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        m = pat.match(s)
        if not m:
            raise FabricImportError(str(p), no, f"not '<guid> <name>': {s[:60]!r}")
        guid = _guid16(m["g"] or m["x"])
        name = m["n"].split()[0]  # "<host> <device>": the host
        if out.setdefault(guid, name) != name:
            raise FabricImportError(str(p), no, f"GUID {guid} mapped to {out[guid]!r} and {name!r}")
    return out


def _host_from_description(desc: str | None) -> tuple[str | None, str | None]:
    """(host, device) from a CA NodeDescription such as rdma-ndd's default ``"<host> <device>"``
    (``"node042 mlx5_0"``) or older OFED's ``"node042 HCA-1"``; None where it does not look so
    (``"MT25408 ConnectX Mellanox Technologies"``: the firmware default)."""
    if not desc:
        return None, None
    words = desc.split()
    if len(words) < 2:
        return None, None
    host, dev = words[0], words[1]
    is_dev = bool(_DEVICE.match(dev)) or bool(re.match(r"^HCA-\d+$", dev))
    if not is_dev or not _HOST_OK.match(host) or _NOT_HOST.match(host) or len(host) > 253:
        return None, None
    return host, (dev if _DEVICE.match(dev) and _HCA_NAME_OK.match(dev) else None)


def _safe_name(name: str, fallback: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_.\-]", "-", name).lstrip("-_.")[:128]
    return out or fallback


def _read(path_or_text: str | Path) -> tuple[str, str, str | None]:
    """(text, source label, default fabric name)."""
    if isinstance(path_or_text, str) and (not path_or_text or "\n" in path_or_text):
        return path_or_text, "<text>", None
    p = Path(path_or_text)
    try:  # undecodable bytes (a node description in another charset) become U+FFFD
        return p.read_bytes().decode("utf-8", errors="replace"), str(p), p.stem or p.name
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise FabricImportError(str(p), None, f"cannot read topology file: {exc}") from exc


def import_ibnetdiscover(
    path_or_text: str | Path,
    *,
    host_of: Callable[[str, str], str] | None = None,
    guid_map: str | Path | None = None,
    name: str | None = None,
    rail_prefix: str = "10.100.0.0/16",
) -> ImportResult:
    """Build a :class:`Fabric` from ibnetdiscover output or an ibsim net file.

    ``path_or_text``: a :class:`~pathlib.Path`, a path string, or the text itself (a string that
    is empty or contains a newline is text). ``name`` defaults to the file stem.

    Inference (each recorded in ``notes``):

    - host of a CA: ``guid_map`` entry for its GUID if given (:func:`load_guid_map`), else
      ``host_of(guid, description)`` if given (guid "" when the file has none), else the first
      word of a description shaped ``"<host> <device>"``, else the CA's node name
      (``H-003048c749cd0000``). CAs with one host name form one host with several HCAs.
    - role: a switch (or router) with a CA cabled to it is a ``leaf``, the others ``spine``;
      link kinds follow (``host-leaf``, ``leaf-spine``, ``leaf-leaf``, ``spine-spine``).
    - rails (the dump has none): per host, its cabled CA ports ordered by the leaf they hang off
      (leaves in order of first appearance in the file), then CA, then port; each position
      votes for its leaf's rail, a leaf's rail is its most common vote, and each HCA port takes
      its leaf's rail (see ``_Builder.infer_rails``: a host with one cable missing or moved
      keeps its other HCAs on their leaves' rails). A port whose leaf's rail its host already
      uses gets a free rail, with a warning naming that port; its leaf then gets no ``rail``
      (the others keep theirs). The note on roles counts leaves, spines and core switches as
      ``fabric show`` does.
    - HCA names: the device in the description (``mlx5_3``) when every CA of the host has a
      distinct one, else ``hca0``, ``hca1``... in leaf order.
    - addresses: the layout of :func:`~linkguard.topology.generator.generate_rail_optimized`
      in ``rail_prefix``: rail r, host h (fabric order) -> ``10.100.r.(h+1)`` for <= 254 hosts,
      larger per-rail subnets beyond. No GPU endpoints (the dump has no GPUs).

    Dropped with a warning: CA-to-CA cables (no switch: the model has no such link), cables
    between two ports of one switch (a loopback: no link joins a switch to itself) and CAs
    with no cable to a switch. ``rate_gbps`` is lanes x :data:`LANE_GBPS` (sysfs units).

    Raises :class:`FabricImportError` (file, line) for what :func:`parse_ibnetdiscover` refuses,
    a bad GUID map, a file without any CA cabled to a switch, or a fabric that fails validation.
    """
    text, source, stem = _read(path_or_text)
    topo = parse_ibnetdiscover(text, source=source)
    if "\ufffd" in text:
        topo.warnings.append("bytes that are not UTF-8 were replaced by U+FFFD")
    gmap = load_guid_map(guid_map) if guid_map is not None else None
    return _Builder(topo, host_of, gmap, rail_prefix, name or stem or "ibnetdiscover").run()


_Port = tuple[int, int, int, int, IBLink]  # CA node, CA port, switch node, switch port, cable


class _Builder:
    """Inference from an :class:`IBTopology` to a :class:`Fabric`, one step per method."""

    def __init__(
        self,
        topo: IBTopology,
        host_of: Callable[[str, str], str] | None,
        gmap: dict[str, str] | None,
        rail_prefix: str,
        name: str,
    ) -> None:
        self.topo = topo
        self.nodes = topo.nodes
        self.host_of = host_of
        self.gmap = gmap
        self.rail_prefix = rail_prefix
        self.rail_subnets: dict[int, ipaddress.IPv4Network] = {}
        self.name = name
        self.notes = list(topo.notes)
        self.warnings = list(topo.warnings)
        self.is_sw = [n.kind != "ca" for n in topo.nodes]
        self.guids: dict[str, str] = {}
        self.sw_name: dict[int, str] = {}
        self.host_name: dict[int, str] = {}
        self.taken: set[str] = set()
        self.renamed: list[str] = []

    def fail(self, message: str) -> FabricImportError:
        return FabricImportError(self.topo.source, None, message)

    def warn(self, what: str, items: list[str], sep: str = ", ") -> None:
        if items:
            self.warnings.append(f"{len(items)} {what}: {sep.join(items[:5])}{_more(items, 5)}")

    def run(self) -> ImportResult:
        routers = [n.name for n in self.nodes if n.kind == "router"]
        if routers:
            self.notes.append(f"{len(routers)} routers treated as switches: {routers[:3]}")
        host_ports, isls = self.classify()
        leaves = {sw for _, _, sw, _, _ in host_ports}
        self.name_nodes({ca for ca, *_ in host_ports})
        hosts, links, leaf_rails = self.hosts(host_ports)
        switch_rail = self.leaf_rails(leaf_rails)
        switches = self.switches(leaves, switch_rail)
        links += self.isls(isls, leaves, switch_rail)
        unknown = sum(1 for link in self.topo.links if link.width is None or link.speed is None)
        if unknown:
            self.notes.append(
                f"{unknown} links carry no width/speed in the file (rate unknown; ibsim would "
                "run them at its default 4x SDR)"
            )
        try:
            fabric = Fabric(
                name=self.name,
                hosts=hosts,
                switches=switches,
                links=links,
                rail_subnets=self.rail_subnets,
            )
        except ValidationError as exc:
            errs = "; ".join(e["msg"] for e in exc.errors()[:3])
            raise self.fail(f"imported fabric does not validate: {errs}") from None
        tiers = Counter(switch_tiers(fabric).values())
        self.notes.append(
            f"roles: {tiers['leaf']} leaves (switches with a CA cabled), {tiers['spine']} "
            f"spines, {tiers['core']} core (spines cabled to spines only), as `fabric show` "
            "counts them"
        )
        log.info(
            "ibnetdiscover_imported",
            source=self.topo.source,
            switches=len(switches),
            hosts=len(hosts),
            links=len(links),
            warnings=len(self.warnings),
        )
        return ImportResult(fabric, self.guids, self.notes, self.warnings)

    def classify(self) -> tuple[list[_Port], list[IBLink]]:
        """Cables into CA-switch (host ports) and switch-switch; CA-CA and switch loopback
        ones are dropped."""
        host_ports: list[_Port] = []
        isls: list[IBLink] = []
        ca_ca = []
        loops = []
        for link in self.topo.links:
            sa, sb = self.is_sw[link.a], self.is_sw[link.b]
            if sa and sb and link.a == link.b:
                loops.append(f"line {link.line}")
            elif sa and sb:
                isls.append(link)
            elif sa:
                host_ports.append((link.b, link.b_port, link.a, link.a_port, link))
            elif sb:
                host_ports.append((link.a, link.a_port, link.b, link.b_port, link))
            else:
                ca_ca.append(f"line {link.line}")
        self.warn("CA-to-CA cables dropped (no switch between them)", ca_ca)
        self.warn("cables between two ports of one switch dropped (loopback)", loops)
        cabled = {ca for ca, *_ in host_ports}
        lonely = [n.name for n in self.nodes if n.kind == "ca" and n.index not in cabled]
        self.warn("CAs without a cable to a switch left out", lonely)
        if not host_ports:
            raise self.fail("no CA cabled to a switch: a fabric needs at least one host")
        return host_ports, isls

    def name_nodes(self, cabled: set[int]) -> None:
        """Switch names (valid, unique), then the host name of every cabled CA."""
        for n in self.nodes:
            if self.is_sw[n.index]:
                nm = _unique(_safe_name(n.name, f"switch{n.index}"), self.taken)
                if nm != n.name:
                    self.renamed.append(f"{n.name!r} -> {nm}")
                self.sw_name[n.index] = nm
        switch_names = set(self.taken)
        origin: defaultdict[str, set[str]] = defaultdict(set)  # how -> host names so named
        unmapped = []
        clash: dict[str, str] = {}  # host name taken by a switch -> its replacement
        for n in self.nodes:
            if n.index not in cabled:
                continue
            raw, how = self.raw_host(n)
            if self.gmap is not None and how != "from the GUID map":
                unmapped.append(n.name)
            name = _safe_name(raw, n.name)
            if name in switch_names:
                name = clash.setdefault(name, _unique(name, self.taken))
            if name != raw:
                self.renamed.append(f"{raw!r} -> {name}")
            self.host_name[n.index] = name
            origin[how].add(name)
        self.warn("names changed to fit the fabric's name rules or stay unique", self.renamed)
        counts = (f"{len(v)} {k}" for k, v in sorted(origin.items()))
        self.notes.append("host names: " + ", ".join(counts))
        if self.gmap is not None:
            self.warn("CAs are not in the GUID map", unmapped)
            known = {self.nodes[i].guid for i in cabled}
            absent = [name for g, name in self.gmap.items() if g not in known]
            self.warn("GUID map entries name no CA of this fabric", absent)

    def raw_host(self, n: IBNode) -> tuple[str, str]:
        if self.gmap is not None and n.guid in self.gmap:
            return self.gmap[n.guid], "from the GUID map"
        if self.host_of is not None:
            return str(self.host_of(n.guid or "", n.description or "")), "from host_of"
        host, _ = _host_from_description(n.description)
        return (host, "from descriptions") if host else (n.name, "from the CA node name")

    def hosts(
        self, host_ports: list[_Port]
    ) -> tuple[list[HostInventory], list[Link], dict[int, set[int]]]:
        """Inventories and host-leaf links; rails by leaf order per host, generator addresses."""
        per_host: dict[str, list[_Port]] = defaultdict(list)
        for port in host_ports:
            per_host[self.host_name[port[0]]].append(port)
        order = sorted(per_host, key=lambda h: min(ca for ca, *_ in per_host[h]))
        for h in order:  # leaf (first appearance), then CA, then port
            per_host[h].sort(key=lambda t: (t[2], t[0], t[1]))
        n_rails = max(len(v) for v in per_host.values())
        if n_rails > 64:
            raise self.fail(f"a host has {n_rails} cabled HCA ports (at most 64 rails)")
        self.notes.append(
            "no rail information in the dump: rails inferred from the leaf each HCA hangs off "
            "(a leaf's rail: the position its HCAs most often have among their host's ports, "
            "ordered by leaf in order of first appearance; each HCA takes its leaf's rail)"
        )
        names = {host: self.hca_names(host, per_host[host]) for host in order}
        rail_of = self.infer_rails(order, per_host, n_rails, names)
        try:
            prefix = ipaddress.IPv4Network(self.rail_prefix)
            size = _rail_subnet_size(prefix, len(order), n_rails)
        except ValueError as exc:
            raise self.fail(f"rail addresses: {exc}") from None
        base = int(prefix.network_address)
        self.rail_subnets = rail_subnets(prefix, size, n_rails)
        self.notes.append(
            f"rail addresses assigned with the generator's layout in {prefix} (rail r, host h "
            f"-> {prefix.network_address} + r*{size} + h + 1); no GPU endpoints"
        )
        hosts: list[HostInventory] = []
        links: list[Link] = []
        leaf_rails: dict[int, set[int]] = defaultdict(set)
        for pos, host in enumerate(order):
            hcas = []
            for ca, cp, sw, sp, cable in per_host[host]:
                rail = rail_of[(ca, cp)]
                hca = names[host][ca]
                address = ipaddress.IPv4Address(base + rail * size + pos + 1)
                hcas.append(HCAInfo(hca=hca, port=cp, rail=rail, address=address))
                leaf_rails[sw].add(rail)
                guid = self.nodes[ca].guid
                if guid:
                    self.guids[f"{host}:{hca}"] = guid
                if (ca, cp) in self.topo.port_guids:
                    self.guids[f"{host}:{hca}/{cp}"] = self.topo.port_guids[(ca, cp)]
                links.append(
                    _link(f"{host}:{hca}/{cp}", cp, self.sw_name[sw], sp, "host-leaf", rail, cable)
                )
            hcas.sort(key=lambda c: c.rail)
            hosts.append(HostInventory(host=host, hcas=hcas))
        return hosts, links, leaf_rails

    def infer_rails(
        self,
        order: list[str],
        per_host: dict[str, list[_Port]],
        n_rails: int,
        names: dict[str, dict[int, str]],
    ) -> dict[tuple[int, int], int]:
        """Rail of every cabled CA port, (CA node, port) -> rail.

        A port's position among its host's ports (sorted by leaf) votes for its leaf's rail;
        a leaf's rail is its most common vote (the lowest on a tie). Then, per host, ports take
        their leaf's rail: first those whose own position says so, then the others while that
        rail is free on the host; a port whose leaf's rail its host already uses (two HCAs of a
        host on one leaf, or on two leaves of one rail) takes its position if free, else the
        lowest free rail, and is named in a warning: only the HCAs that disagree, not the
        ports of a host shifted by one missing or moved cable.
        """
        votes: dict[int, Counter[int]] = defaultdict(Counter)
        for host in order:
            for pos, (_, _, sw, _, _) in enumerate(per_host[host]):
                votes[sw][pos] += 1
        leaf_rail = {sw: min(c, key=lambda r: (-c[r], r)) for sw, c in votes.items()}
        rail_of: dict[tuple[int, int], int] = {}
        stray: list[str] = []
        for host in order:
            ports = list(enumerate(per_host[host]))
            used: set[int] = set()
            for first in (True, False):
                for pos, (ca, cp, sw, _, _) in ports:
                    want = leaf_rail[sw]
                    if (ca, cp) in rail_of or want in used or (first and pos != want):
                        continue
                    rail_of[(ca, cp)] = want
                    used.add(want)
            for pos, (ca, cp, sw, _, _) in ports:
                if (ca, cp) in rail_of:
                    continue
                rail = pos if pos not in used else min(set(range(n_rails)) - used)
                rail_of[(ca, cp)] = rail
                used.add(rail)
                stray.append(
                    f"{host}:{names[host][ca]}/{cp} on {self.sw_name[sw]} (the leaf's rail "
                    f"{leaf_rail[sw]}; given rail {rail})"
                )
        self.warn(
            "HCA ports cannot have the inferred rail of their leaf: another port of their host "
            "has it (a cabling fault, or several ports of a host on one leaf; such a leaf gets "
            "no rail)",
            stray,
            "; ",
        )
        return rail_of

    def hca_names(self, host: str, ports: list[_Port]) -> dict[int, str]:
        """The devices the descriptions name (mlx5_3) when distinct for every CA, else hcaN."""
        cas = list(dict.fromkeys(ca for ca, *_ in ports))
        devs = [_host_from_description(self.nodes[ca].description)[1] for ca in cas]
        if all(devs) and len(set(devs)) == len(devs):
            return {ca: str(dev) for ca, dev in zip(cas, devs, strict=True)}
        if any(devs):
            self.warnings.append(
                f"host {host}: CA descriptions name devices {devs}: not distinct for every CA, "
                "HCAs named hca0.. instead"
            )
        return {ca: f"hca{i}" for i, ca in enumerate(cas)}

    def leaf_rails(self, leaf_rails: dict[int, set[int]]) -> dict[int, int | None]:
        """A leaf's rail when all its HCAs have it (:meth:`infer_rails` warned of the others)."""
        return {sw: next(iter(r)) if len(r) == 1 else None for sw, r in leaf_rails.items()}

    def switches(self, leaves: set[int], switch_rail: dict[int, int | None]) -> list[Switch]:
        out = []
        for n in self.nodes:
            if not self.is_sw[n.index]:
                continue
            leaf = n.index in leaves
            out.append(
                Switch(
                    name=self.sw_name[n.index],
                    role="leaf" if leaf else "spine",
                    rail=switch_rail.get(n.index) if leaf else None,
                    guid=n.guid,
                    description=n.description[:256] if n.description else None,
                )
            )
            if n.guid:
                self.guids[self.sw_name[n.index]] = n.guid
        return out

    def isls(
        self, isls: list[IBLink], leaves: set[int], switch_rail: dict[int, int | None]
    ) -> list[Link]:
        """Switch-switch links, leaf end first; rail = the leaf's (both leaves' if equal)."""
        out = []
        for cable in isls:
            a, ap, b, bp = cable.a, cable.a_port, cable.b, cable.b_port
            if a not in leaves and b in leaves:
                a, ap, b, bp = b, bp, a, ap
            la, lb = a in leaves, b in leaves
            kind = "leaf-leaf" if la and lb else "leaf-spine" if la else "spine-spine"
            rail = switch_rail.get(a) if la else None
            if lb and switch_rail.get(b) != rail:
                rail = None
            out.append(_link(self.sw_name[a], ap, self.sw_name[b], bp, kind, rail, cable))
        return out


def _link(a: str, ap: int, b: str, bp: int, kind: str, rail: int | None, cable: IBLink) -> Link:
    # the dump's width and speed text as parsed: Link's validation checks them
    return Link.model_validate(
        {
            "a": a,
            "b": b,
            "kind": kind,
            "rail": rail,
            "rate_gbps": cable.rate_gbps,
            "a_port": ap,
            "b_port": bp,
            "width": cable.width,
            "speed": cable.speed,
        }
    )


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 2
    while out in taken:
        out = f"{name}-{k}"
        k += 1
    taken.add(out)
    return out
