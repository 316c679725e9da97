"""The first stage of the ``ibnetdiscover`` import: :func:`parse_ibnetdiscover` reads the text
``ibnetdiscover`` prints (or an ibsim net file) into an :class:`IBTopology`: nodes and
de-duplicated links, nothing inferred. The format is in :mod:`linkguard.topology.ibnetdiscover`'s
docstring; a line that cannot be read raises :class:`FabricImportError` naming it."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from linkguard.models import LANE_GBPS
from linkguard.topology.ibnetdiscover_records import (
    _KINDS,
    _PREFIX_KIND,
    _SPEED_BITS,
    _WIDTH_BITS,
    _WIDTHS,
    FabricImportError,
    IBLink,
    IBNode,
    IBTopology,
    NodeKind,
)

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
