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
(host names, leaf/spine roles, rails, HCA names, rail addresses).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import structlog
from pydantic import ValidationError

from linkguard.models import LANE_GBPS, HCAInfo, HostInventory
from linkguard.topology.fabric import Fabric, FabricError, Link, Switch, switch_tiers
from linkguard.topology.generator import _rail_subnet_size, rail_subnets

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

#: Per-lane signalling rate in Gb/s (IBTA InfiniBand Architecture Specification vol. 2, physical
#: layer: SDR 2.5, DDR 5, QDR 10 with 8b/10b coding; FDR10 10.3125, FDR 14.0625, EDR 25.78125 with
#: 64b/66b; HDR 53.125 and NDR 106.25 with PAM4). Line rate including coding, for reference; the
#: nominal :data:`LANE_GBPS` is what ``rate_gbps`` carries.
SIGNALING_GBPS_PER_LANE: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.3125,
    "FDR": 14.0625,
    "EDR": 25.78125,
    "HDR": 53.125,
    "NDR": 106.25,
}

_WIDTHS = ("1x", "2x", "4x", "8x", "12x")
#: IBA PortInfo.LinkWidthEnabled / Active bits (ibsim/sim.h LINKWIDTH_*), widest first.
_WIDTH_BITS = ((8, "12x"), (4, "8x"), (2, "4x"), (16, "2x"), (1, "1x"))
#: IBA PortInfo.LinkSpeedEnabled / Active bits (ibsim/sim.h LINKSPEED_*), fastest first.
_SPEED_BITS = ((4, "QDR"), (2, "DDR"), (1, "SDR"))

NodeKind = Literal["switch", "ca", "router"]
_KINDS: dict[str, NodeKind] = {"Switch": "switch", "Ca": "ca", "Hca": "ca", "Rt": "router"}
_PREFIX_KIND: dict[str, NodeKind] = {"S": "switch", "H": "ca", "R": "router"}

# numbers: at most 20 digits (int() refuses more than 4,300, with a ValueError)
_HEADER = re.compile(
    r'^(?P<type>Switch|Ca|Hca|Rt)\s+(?P<n>\d{1,20})\s+"(?P<name>[^"]*)"(?P<rest>.*)$'
)
_PORT = re.compile(
    r"^\[(?P<port>\d{1,20})\](?:\[ext \d+\])?"
    r"(?:\((?P<pguid>[0-9a-fA-F]{1,16})\))?\s*"
    r'"(?P<rname>[^"]*)"'
    r"(?:\[(?P<rport>\d{1,20})\](?:\[ext \d+\])?)?"
    r"(?:\s*\((?P<rguid>[0-9a-fA-F]{1,16})\))?"
    r"(?P<rest>.*)$"
)
_STANZA = re.compile(
    r"^(?P<key>vendid|devid|sysimgguid|switchguid|caguid|rtguid|hcaguids)\s*(?P<op>[=+])\s*"
    r"(?P<val>0x[0-9a-fA-F]+|\d+)(?:\((?P<pguid>[0-9a-fA-F]+)\))?\s*(?:#.*)?$"
)
_IBSIM_SETTING = re.compile(r"^(?:width|speed|module|pdebug)\s*=")
_IBSIM_EXT = re.compile(r"^(?P<kw>include|do)\b")
_GROUPING = re.compile(r"^(?:Chassis \d+|Non-Chassis Nodes\s*$|Hostname: )")
_IBND_NAME = re.compile(r"^(?P<kind>[SHR])-(?P<guid>[0-9a-fA-F]{16})$")
_WIDTH_SPEED = re.compile(r"^(?P<w>\d+x|\?\?)(?P<s>[A-Z0-9]+|\?\?\?)$")
# Comment of a switch port line: # "<remote desc>" lid N <width><speed>[ s= w= v=][ slot N|(scp)]
_SW_COMMENT = re.compile(r'^#\s*"(?P<desc>.*)"\s+lid\s+\d+\s+(?P<ws>\S+)(?P<tail>.*)$')
# Comment of a CA port line: # lid N lmc N "<remote desc>" lid N <width><speed>[ s= w= v=]
_CA_COMMENT = re.compile(
    r'^#\s*lid\s+\d+\s+lmc\s+\d+\s+"(?P<desc>.*)"\s+lid\s+\d+\s+(?P<ws>\S+)(?P<tail>.*)$'
)
_OPTION = re.compile(r"^(?P<k>[ws])=(?P<v>0x[0-9a-fA-F]{1,16}|\d{1,20})$")
_HEADER_DESC = re.compile(r'^#\s*"(?P<desc>.*)"(?P<tail>.*)$')
_UNQUOTED_END = re.compile(r"\s(?:enhanced port|base port|lid|lmc)\s")

_HOST_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_NOT_HOST = re.compile(r"^MT\d+$")  # Mellanox part numbers: the firmware's default description
# Kernel RDMA device names as rdma-ndd's default "%h %d" description carries them: mlx5_0,
# mlx4_1, hfi1_0, mthca0, qib0, irdma0, bnxt_re0.
_DEVICE = re.compile(r"^[a-z][a-z0-9_]*\d$")
_HCA_NAME_OK = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


class FabricImportError(FabricError):
    """An ``ibnetdiscover`` / ibsim file or GUID map that cannot be imported.

    ``source`` is the file path (``"<text>"`` for text input) and ``line`` the 1-based line
    number, or None for problems of the whole file; both are in the message
    (``"X5.topofile:17: ..."``). A :class:`FabricError`, hence a ``ValueError``.
    """

    def __init__(self, source: str, line: int | None, message: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")
        self.source = source
        self.line = line


# --------------------------------------------------------------------------------------------
# Parse


@dataclass(frozen=True)
class IBNode:
    """One node of the file. ``index`` is its position in :attr:`IBTopology.nodes` (nodes are
    in order of first appearance, header or link). ``guid`` is 16 lowercase hex digits or None
    (ibsim names without a guid stanza). ``ports``/``line`` are None for a node only known from
    links to it (truncated file)."""

    index: int
    kind: NodeKind
    name: str
    guid: str | None
    ports: int | None
    description: str | None
    line: int | None


@dataclass(frozen=True)
class IBLink:
    """One cable between ``a``:``a_port`` and ``b``:``b_port`` (node indices); ``a`` is the end
    whose line came first. ``width``/``speed`` as ibnetdiscover prints them (``4x``, ``QDR``),
    ``rate_gbps`` = lanes x :data:`LANE_GBPS`; all None when the file does not say.
    ``both_ends`` is False when only one end listed it."""

    a: int
    a_port: int
    b: int
    b_port: int
    width: str | None
    speed: str | None
    rate_gbps: float | None
    line: int
    both_ends: bool


@dataclass(frozen=True)
class IBTopology:
    """What :func:`parse_ibnetdiscover` read. ``port_guids`` maps (node index, port) to the
    port GUID (16 hex digits) where the file gives one (CA and router ports)."""

    source: str
    nodes: list[IBNode]
    links: list[IBLink]
    port_guids: dict[tuple[int, int], str]
    notes: list[str]
    warnings: list[str]
    truncated: bool


@dataclass
class _PortLine:
    line: int
    port: int
    remote: str
    rport: int
    width: str | None
    speed: str | None
    remote_desc: str | None
    pguid: str | None
    rguid: str | None


@dataclass
class _Rec:
    uid: int
    kind: NodeKind
    name: str
    nports: int | None
    desc: str | None
    guid: str | None
    line: int | None
    ports: dict[int, _PortLine] = field(default_factory=dict)


def _guid16(text: str) -> str:
    return f"{int(text, 16):016x}"


def _width_speed(token: str) -> tuple[str | None, str | None, str | None]:
    """``4xQDR`` -> ("4x", "QDR", None); an unknown part is None with a complaint."""
    m = _WIDTH_SPEED.match(token)
    if not m:
        return None, None, f"unreadable width/speed {token!r}"
    w = m["w"] if m["w"] in _WIDTHS else None
    s = m["s"] if m["s"] in LANE_GBPS else None
    problem = None if (w and s) else f"unknown width/speed {token!r}"
    return w, s, problem


def _from_mask(mask: int, bits: tuple[tuple[int, str], ...]) -> str | None:
    return next((name for bit, name in bits if mask & bit), None)


def _rate(width: str | None, speed: str | None) -> float | None:
    if width is None or speed is None:
        return None
    return int(width[:-1]) * LANE_GBPS[speed]


def _header_desc(rest: str) -> str | None:
    """Description from what follows a header's quoted name (``# "desc" enhanced port 0 ...``)."""
    rest = rest.strip()
    if not rest.startswith("#"):
        return None
    m = _HEADER_DESC.match(rest)
    if m:
        return m["desc"]
    body = rest[1:].strip()
    cut = _UNQUOTED_END.search(f"{body} ")
    return (body[: cut.start()] if cut else body).strip() or None


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.recs: list[_Rec] = []
        self.first_seen: dict[str, int] = {}
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.truncated = False
        self.pending: dict[str, tuple[int, str]] = {}  # stanza key -> (line, value)

    def fail(self, line: int | None, message: str) -> FabricImportError:
        return FabricImportError(self.source, line, message)

    def seen(self, name: str, line: int) -> None:
        self.first_seen.setdefault(name, line)

    # -- lines -------------------------------------------------------------------------------

    def run(self) -> IBTopology:
        lines = self.text.splitlines()
        ends_cleanly = self.text.endswith(("\n", "\r"))
        current: _Rec | None = None
        ignored: list[str] = []
        for no, raw in enumerate(lines, start=1):
            s = raw.strip()
            last_partial = no == len(lines) and not ends_cleanly
            try:
                current = self.line(no, s, current, ignored)
            except FabricImportError:
                if not last_partial:
                    raise
                self.truncated = True
                self.warnings.append(
                    f"line {no}: file ends in the middle of a line ({s[:60]!r}): ignored "
                    "(truncated file?)"
                )
        if self.pending:
            first = min(line for line, _ in self.pending.values())
            self.truncated = True
            self.warnings.append(
                f"line {first}: the file ends after the stanza of a node without its "
                "Switch/Ca header (truncated file?)"
            )
        if ignored:
            self.notes.append("ignored lines: " + "; ".join(ignored[:5]) + _more(ignored, 5))
        if not self.recs:
            raise self.fail(None, "no Switch or Ca record (empty or not ibnetdiscover output)")
        return self.resolve()

    def line(self, no: int, s: str, current: _Rec | None, ignored: list[str]) -> _Rec | None:
        if not s:
            return None  # a blank line ends a record
        if s.startswith("#"):
            return current  # comment (also inside records, as ibsim reads them)
        if s.startswith("["):
            if current is None:
                raise self.fail(no, f"port line outside a Switch/Ca record: {s[:60]!r}")
            self.port_line(no, s, current)
            return current
        if s.startswith("@"):
            ignored.append(f"line {no}: ibsim port alias {s[:40]!r}")
            return current
        m = _HEADER.match(s)
        if m:
            return self.header(no, m)
        m = _STANZA.match(s)
        if m:
            if m["op"] == "+" or m["key"] == "hcaguids":
                ignored.append(f"line {no}: ibsim guid base {s[:40]!r}")
            else:
                self.pending[m["key"]] = (no, m["val"])
            return None
        if _IBSIM_SETTING.match(s):
            ignored.append(f"line {no}: ibsim setting {s[:40]!r}")
            return None
        m = _IBSIM_EXT.match(s)
        if m:
            what = "included file not read" if m["kw"] == "include" else "console command"
            ignored.append(f"line {no}: ibsim '{m['kw']}' extension ({what}): {s[:60]!r}")
            return None
        if _GROUPING.match(s):
            ignored.append(f"line {no}: ibnetdiscover -g grouping {s[:40]!r}")
            return None
        raise self.fail(no, f"unrecognized line {s[:80]!r}")

    def header(self, no: int, m: re.Match[str]) -> _Rec:
        kind = _KINDS[m["type"]]
        name = m["name"]
        nports = int(m["n"])
        if not name:
            raise self.fail(no, "empty node name")
        if not 1 <= nports <= 255:
            raise self.fail(no, f"{m['type']} {name!r}: {nports} ports (1..255)")
        rest = m["rest"].strip()
        if rest and not rest.startswith("#"):
            raise self.fail(no, f"unexpected text after the node name: {rest[:60]!r}")
        desc = _header_desc(rest)
        guid = None
        ib = _IBND_NAME.match(name)
        if ib:
            guid = ib["guid"].lower()
            if _PREFIX_KIND[ib["kind"]] != kind:
                raise self.fail(no, f"{m['type']} record named {name!r} (prefix says otherwise)")
        key = {"switch": "switchguid", "ca": "caguid", "router": "rtguid"}[kind]
        if key in self.pending:
            sline, val = self.pending[key]
            sg = _guid16(val)
            if guid is None:
                guid = sg
            elif sg != guid:
                self.warnings.append(
                    f"line {sline}: {key} {sg} differs from the GUID in the name {name!r}"
                )
        self.pending.clear()
        rec = _Rec(len(self.recs), kind, name, nports, desc, guid, no)
        self.recs.append(rec)
        self.seen(name, no)
        return rec

    def port_line(self, no: int, s: str, rec: _Rec) -> None:
        m = _PORT.match(s)
        if not m:
            raise self.fail(no, f"malformed port line {s[:80]!r}")
        port = int(m["port"])
        if not 1 <= port <= (rec.nports or 255):
            raise self.fail(no, f"port {port} of {rec.name!r}, which has {rec.nports} ports")
        if port in rec.ports:
            raise self.fail(
                no, f"port {port} of {rec.name!r} listed twice (lines {rec.ports[port].line}, {no})"
            )
        remote = m["rname"]
        if not remote:
            raise self.fail(no, "empty remote node name")
        rport = int(m["rport"]) if m["rport"] is not None else 1  # ibsim's default
        if not 1 <= rport <= 255:
            raise self.fail(no, f"remote port {rport} (1..255)")
        width = speed = desc = None
        rest = m["rest"].strip()
        hash_at = rest.find("#")
        options, comment = (rest, "") if hash_at < 0 else (rest[:hash_at], rest[hash_at:])
        wmask = smask = None
        for tok in options.split():
            o = _OPTION.match(tok)
            if not o:
                raise self.fail(no, f"unexpected {tok!r} after the remote port")
            v = o["v"]
            value = int(v, 16) if v.startswith("0x") else int(v)  # base 0 refuses "04"
            if o["k"] == "w":
                wmask = value
            else:
                smask = value
        if comment:
            c = _CA_COMMENT.match(comment) or _SW_COMMENT.match(comment)
            if c:
                desc = c["desc"]
                width, speed, problem = _width_speed(c["ws"])
                if problem:
                    self.warnings.append(f"line {no}: {problem}")
        if width is None and wmask is not None:
            width = _from_mask(wmask, _WIDTH_BITS)
        if speed is None and smask is not None:
            speed = _from_mask(smask, _SPEED_BITS)
        pguid = _guid16(m["pguid"]) if m["pguid"] else None
        rguid = _guid16(m["rguid"]) if m["rguid"] else None
        rec.ports[port] = _PortLine(no, port, remote, rport, width, speed, desc, pguid, rguid)
        self.seen(remote, no)

    # -- links -------------------------------------------------------------------------------

    def resolve(self) -> IBTopology:
        by_name: dict[str, list[_Rec]] = defaultdict(list)
        for r in self.recs:
            by_name[r.name].append(r)
        for name, recs in by_name.items():
            if len(recs) > 1:
                lines = ", ".join(str(r.line) for r in recs)
                self.warnings.append(
                    f"duplicate node {name!r} (lines {lines}): two nodes with one GUID; "
                    "links to it go to the record whose port points back"
                )
        guid_owner: dict[str, str] = {}
        for r in self.recs:
            if r.guid and not _IBND_NAME.match(r.name):
                other = guid_owner.setdefault(r.guid, r.name)
                if other != r.name:
                    self.warnings.append(f"duplicate GUID {r.guid}: nodes {other!r} and {r.name!r}")

        synthesized: list[str] = []
        dropped: list[str] = []
        links: dict[frozenset[tuple[int, int]], dict] = {}
        used: dict[tuple[int, int], frozenset[tuple[int, int]]] = {}
        port_guids: dict[tuple[int, int], str] = {}
        conflicts: list[str] = []

        def guid_of(uid: int, port: int, g: str | None, line: int) -> None:
            if g is None:
                return
            old = port_guids.setdefault((uid, port), g)
            if old != g:
                conflicts.append(f"line {line}: port GUID {g} vs {old}")

        for rec in list(self.recs):
            for pl in sorted(rec.ports.values(), key=lambda p: p.port):
                cands = by_name.get(pl.remote)
                if not cands:
                    ib = _IBND_NAME.match(pl.remote)
                    if ib:
                        kind = _PREFIX_KIND[ib["kind"]]
                        guid = ib["guid"].lower()
                        new = _Rec(
                            len(self.recs), kind, pl.remote, None, pl.remote_desc, guid, None
                        )
                        self.recs.append(new)
                        by_name[pl.remote].append(new)
                        cands = by_name[pl.remote]
                        synthesized.append(pl.remote)
                    elif self.truncated:
                        dropped.append(f"line {pl.line}: {pl.remote!r}")
                        continue
                    else:
                        raise self.fail(
                            pl.line, f"link to {pl.remote!r}, which no Switch/Ca record declares"
                        )
                remote = _pick(cands, rec, pl)
                if remote.nports is not None and pl.rport > remote.nports:
                    raise self.fail(
                        pl.line,
                        f"remote port {pl.rport} of {remote.name!r}, which has "
                        f"{remote.nports} ports",
                    )
                here, there = (rec.uid, pl.port), (remote.uid, pl.rport)
                if here == there:
                    raise self.fail(pl.line, f"port {pl.port} of {rec.name!r} cabled to itself")
                key = frozenset((here, there))
                guid_of(rec.uid, pl.port, pl.pguid, pl.line)
                guid_of(remote.uid, pl.rport, pl.rguid, pl.line)
                for end in (here, there):
                    prev = used.get(end)
                    if prev is not None and prev != key:
                        first = links[prev]["line"]
                        name = self.recs[end[0]].name
                        raise self.fail(
                            pl.line,
                            f"port {end[1]} of {name!r} is cabled twice "
                            f"(lines {first} and {pl.line} disagree)",
                        )
                if key in links:
                    entry = links[key]
                    entry["both"] = True
                    for attr in ("width", "speed"):
                        mine = getattr(pl, attr)
                        if entry[attr] is None:
                            entry[attr] = mine
                        elif mine is not None and mine != entry[attr]:
                            self.warnings.append(
                                f"line {pl.line}: {attr} {mine} but line {entry['line']} "
                                f"says {entry[attr]} for the same link"
                            )
                    continue
                used[here] = used[there] = key
                links[key] = {
                    "a": here,
                    "b": there,
                    "width": pl.width,
                    "speed": pl.speed,
                    "line": pl.line,
                    "both": False,
                }
        if synthesized:
            self.warnings.append(
                f"{len(synthesized)} nodes are only known from links to them (no record; "
                f"truncated file?): {', '.join(synthesized[:5])}{_more(synthesized, 5)}"
            )
        if dropped:
            self.warnings.append(
                f"{len(dropped)} links to undeclared nodes dropped (truncated file): "
                f"{'; '.join(dropped[:5])}{_more(dropped, 5)}"
            )
        if conflicts:
            self.warnings.append(
                f"{len(conflicts)} conflicting port GUIDs: {'; '.join(conflicts[:5])}"
                f"{_more(conflicts, 5)}"
            )
        synth = set(synthesized)
        one_sided = [
            f"line {e['line']}"
            for e in links.values()
            if not e["both"] and self.recs[e["b"][0]].name not in synth
        ]
        if one_sided:
            self.warnings.append(
                f"{len(one_sided)} links are listed by one end only: "
                f"{', '.join(one_sided[:5])}{_more(one_sided, 5)}"
            )
        seen_pguid: dict[str, tuple[int, int]] = {}
        for where, g in port_guids.items():
            first = seen_pguid.setdefault(g, where)
            if first != where:
                a, b = self.recs[first[0]].name, self.recs[where[0]].name
                self.warnings.append(
                    f"duplicate port GUID {g}: {a!r} port {first[1]} and {b!r} port {where[1]}"
                )
        return self.build(links, port_guids)

    def build(self, links: dict, port_guids: dict[tuple[int, int], str]) -> IBTopology:
        # Nodes in order of first appearance (header or link line); uid -> index.
        order = sorted(
            self.recs, key=lambda r: (self.first_seen.get(r.name, 1 << 30), r.line or 1 << 30)
        )
        index = {r.uid: i for i, r in enumerate(order)}
        nodes = [
            IBNode(index[r.uid], r.kind, r.name, r.guid, r.nports, r.desc, r.line) for r in order
        ]
        out = []
        for e in sorted(links.values(), key=lambda e: e["line"]):
            (au, ap), (bu, bp) = e["a"], e["b"]
            out.append(
                IBLink(
                    a=index[au],
                    a_port=ap,
                    b=index[bu],
                    b_port=bp,
                    width=e["width"],
                    speed=e["speed"],
                    rate_gbps=_rate(e["width"], e["speed"]),
                    line=e["line"],
                    both_ends=e["both"],
                )
            )
        pg = {(index[u], p): g for (u, p), g in port_guids.items()}
        return IBTopology(self.source, nodes, out, pg, self.notes, self.warnings, self.truncated)


def _pick(cands: list[_Rec], rec: _Rec, pl: _PortLine) -> _Rec:
    """Among records sharing a name (duplicate GUID), the one whose port points back here."""
    if len(cands) == 1:
        return cands[0]
    for c in cands:
        back = c.ports.get(pl.rport)
        if back is not None and back.remote == rec.name and back.rport == pl.port:
            return c
    return cands[0]


def _more(items: list, shown: int) -> str:
    return f" (+{len(items) - shown} more)" if len(items) > shown else ""


def parse_ibnetdiscover(text: str, *, source: str = "<text>") -> IBTopology:
    """Read ibnetdiscover / ibsim topology text (nothing inferred yet).

    Every link appears from both ends in the file: it is returned once; parallel cables between
    the same two nodes stay separate (they differ in ports). Ignored with a note: ibsim's
    ``include``/``do``/settings/alias lines and ``ibnetdiscover -g`` grouping lines. Warnings
    (not errors): duplicate node GUIDs, one-sided links, ends that disagree on width/speed, and a
    truncated file (last line cut, stanza without header, nodes only referenced), which still
    yields everything read before the cut.

    Raises :class:`FabricImportError` naming ``source`` and the line for a malformed header,
    stanza or port line, a port number beyond the node's port count, a port listed or cabled
    twice, a link to an undeclared node (unless its ``S-``/``H-`` name says what it is, or the
    file is truncated), or a file without any record.
    """
    return _Parser(text, source).run()


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
