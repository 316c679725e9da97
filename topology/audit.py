"""Fleet audit: the fabric that should be against what was observed.

Consumes: the expected :class:`~linkguard.topology.fabric.Fabric` (a fabric file or the
generator); optionally an observed Fabric (what
:func:`~linkguard.topology.ibnetdiscover.import_ibnetdiscover` made of an ``ibnetdiscover`` dump,
with its ``guids``, or a fabric file read with ``load_fabric(path, observed=True)``, which may
cable an HCA to another rail's leaf), agents' :class:`~linkguard.models.HostInventory` per
host, and the names of the hosts that reported (agents online). Produces: a sorted list of
:class:`Finding` (what is missing, extra, slow, cabled to the wrong leaf, duplicated or
unknown) and its renderings, :func:`format_table` for people and :func:`format_json` for
tools. Pure: no I/O, no clock.

:func:`inventory_problems` is the one comparison of an agent's inventory with the fabric's host;
the topology service logs its result as ``inventory_mismatch``.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Literal, get_args

from linkguard.models import HostInventory
from linkguard.topology.fabric import Fabric, Link, Switch

__all__ = [
    "KINDS",
    "SEVERITY",
    "Finding",
    "FindingKind",
    "audit",
    "format_json",
    "format_table",
    "inventory_problems",
    "sort_findings",
]

FindingKind = Literal[
    "missing_link",
    "unexpected_link",
    "wrong_rate",
    "wrong_rail",
    "wrong_leaf",
    "duplicate_guid",
    "missing_host",
    "unknown_host",
    "inventory_mismatch",
    "layout_mismatch",
]
Severity = Literal["error", "warning"]

#: Finding kinds in the order findings are sorted (within a severity).
KINDS: tuple[FindingKind, ...] = get_args(FindingKind)

#: Severity of each kind. Errors cost capacity or correctness (a missing or slow cable, a port
#: on the wrong leaf, a GUID the subnet manager sees twice, a host that never reported, an agent
#: whose HCAs differ from the fabric's); warnings are things the expected fabric does not describe
#: (an extra cable, a host nobody planned for) or describes differently without costing capacity
#: (a PCIe layout other than the host's: alternates are then ranked less well).
SEVERITY: dict[str, Severity] = {
    "missing_link": "error",
    "unexpected_link": "warning",
    "wrong_rate": "error",
    "wrong_rail": "error",
    "wrong_leaf": "error",
    "duplicate_guid": "error",
    "missing_host": "error",
    "unknown_host": "warning",
    "inventory_mismatch": "error",
    "layout_mismatch": "warning",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One difference between the expected and the observed fabric.

    ``subject`` names what differs: a host port ``"gpu003:mlx5_2/1"``, a host ``"gpu007"``, a
    pair of switch link ends ``"su0-leaf3 - [spine]"`` (``[spine]``: any spine that could not be
    matched to an expected one by name, GUID or description), or a GUID ``"0x..."``.
    ``expected``/``observed`` are short texts (``"400 Gb/s"``, ``"4xEDR 100 Gb/s"``,
    ``"su0-leaf1 (rail 1)"``), None where that side has nothing. ``detail`` says it in a sentence.
    """

    kind: FindingKind
    severity: Severity
    subject: str
    expected: str | None
    observed: str | None
    detail: str = ""

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def _finding(
    kind: FindingKind, subject: str, expected: str | None, observed: str | None, detail: str
) -> Finding:
    return Finding(kind, SEVERITY[kind], subject, expected, observed, detail)


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> tuple:
    """Sort key with numbers compared as numbers (gpu2 before gpu10)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(_DIGITS.split(text)))


def _order(f: Finding) -> tuple:
    return (
        f.severity != "error",
        KINDS.index(f.kind),
        _natural(f.subject),
        f.expected or "",
        f.observed or "",
        f.detail,
    )


#: ``"<observed switch> = "`` before the expected switch it was matched to (a dump's GUID name)
_ALIAS = re.compile(r"^\S+ = ")
#: width and lane speed before a rate (``4xEDR 100 Gb/s``), as :func:`_sig_text` writes them
_WIDTH_SPEED = re.compile(r"(?:\d+x|\?)(?:[A-Z][A-Z0-9]*|\?) (?=[0-9.]+ Gb/s$)")


def _identity(f: Finding) -> tuple[str, str, str | None, str | None]:
    """What makes two findings the same one: kind, subject, expected, and what was observed,
    whichever source saw it: a switch by the expected switch it was matched to (a dump names it
    ``S-<GUID> = su0-leaf1``, a fabric file ``su0-leaf1``), a rate without the width and lane
    speed only a dump gives (``4xEDR 100 Gb/s``, ``100 Gb/s``). The detail is not compared."""
    seen = f.observed
    if seen is not None:
        seen = _WIDTH_SPEED.sub("", _ALIAS.sub("", seen))
    return (f.kind, f.subject, f.expected, seen)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Without duplicates, errors first, then by kind in :data:`KINDS` order, then subject with
    numbers compared as numbers (gpu2 before gpu10), then the texts: the order :func:`audit`
    returns, for combining the findings of several audits. Of findings that are the same
    (:func:`_identity`: kind, subject, expected, observed, e.g. one fault in a dump and in a
    fabric file) the first given is kept."""
    first: dict[tuple[str, str, str | None, str | None], Finding] = {}
    for f in findings:
        first.setdefault(_identity(f), f)
    return sorted(first.values(), key=_order)


_NO_INVENTORIES: Mapping[str, HostInventory] = MappingProxyType({})


# --------------------------------------------------------------------------------------------
# Inventories


def _inventory_diffs(
    expected: HostInventory, have: HostInventory
) -> list[tuple[str, str | None, str | None, str]]:
    """(HCA port key, expected text, observed text, problem) per difference."""
    want = {h.key: h for h in expected.hcas}
    got = {h.key: h for h in have.hcas}
    out: list[tuple[str, str | None, str | None, str]] = [
        (k, f"rail {want[k].rail}", None, f"{k}: in the fabric, not on the host")
        for k in sorted(want.keys() - got.keys())
    ]
    out += [
        (k, None, f"rail {got[k].rail}", f"{k}: on the host, not in the fabric")
        for k in sorted(got.keys() - want.keys())
    ]
    for k in sorted(want.keys() & got.keys()):
        w, h = want[k], got[k]
        if w.rail != h.rail:
            problem = f"{k}: rail {h.rail} on the host, {w.rail} in the fabric"
            out.append((k, f"rail {w.rail}", f"rail {h.rail}", problem))
        if h.netdev and w.netdev and h.netdev != w.netdev:
            problem = f"{k}: netdev {h.netdev} on the host, {w.netdev} in the fabric"
            out.append((k, f"netdev {w.netdev}", f"netdev {h.netdev}", problem))
    return out


def inventory_problems(expected: HostInventory, have: HostInventory) -> list[str]:
    """How an agent's inventory ``have`` differs from the fabric's ``expected`` host, one line
    per problem: HCA ports missing on the host (sorted), ports the fabric lacks (sorted), then per
    common port a different rail, and a different netdev when both name one
    (``"mlx5_0/1: rail 1 on the host, 0 in the fabric"``). Empty when they agree. Endpoints,
    addresses, NUMA nodes and PCIe switches are not compared (a PCIe layout other than the
    fabric's is :func:`audit`'s ``layout_mismatch`` warning, not a mismatch of HCAs)."""
    return [problem for *_, problem in _inventory_diffs(expected, have)]


_BUS_ID = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _layout_diffs(
    expected: HostInventory, have: HostInventory
) -> list[tuple[str, str | None, str | None, str]]:
    """(device, expected switch, observed switch, problem) per HCA port (``mlx5_0/1``) or GPU
    (``gpu3``) whose PCIe switch in the fabric disagrees with the one its agent reports.

    Compared only where both sides name a switch: a fabric without switch ids does not use
    PCIe affinity, and an agent that could not read its layout reports none. Switch ids are
    labels within one host (the solver only asks whether two devices share one), so a fabric
    may say ``pcie0`` where the host says ``0000:01:00.0``. Each fabric switch is matched to
    the host switch most of its devices are on (one-to-one, larger groups first); a device
    disagrees when it is on another host switch than its fabric switch's match (all of a
    fabric switch's devices when its host switch went to a larger group), or when the fabric's
    id is a PCI bus id (as ``linkguard layout --format fabric`` writes) other than the host's."""
    got = {h.key: h for h in have.hcas}
    pairs: list[tuple[str, str, str]] = []
    for c in expected.hcas:
        h = got.get(c.key)
        if h is not None and c.pcie_switch is not None and h.pcie_switch is not None:
            pairs.append((c.key, c.pcie_switch, h.pcie_switch))
    for g, want in enumerate(expected.gpu_pcie_switch):
        seen = have.gpu_pcie_switch[g] if g < len(have.gpu_pcie_switch) else None
        if want is not None and seen is not None:
            pairs.append((f"gpu{g}", want, seen))
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for _, want, seen in pairs:
        counts[want][seen] += 1
    # each fabric switch stands for the host switch most of its devices are on, one-to-one
    # (larger groups choose first); its devices elsewhere, or all of them when that host switch
    # is taken by another fabric switch, disagree; a bus id in the fabric stands for itself
    mapped: dict[str, str | None] = {w: w.lower() for w in counts if _BUS_ID.match(w)}
    taken = {w for w in mapped.values() if w is not None}
    for want in sorted(counts.keys() - mapped.keys(), key=lambda w: (-max(counts[w].values()), w)):
        free = [(-n, seen) for seen, n in counts[want].items() if seen.lower() not in taken]
        match = min(free)[1].lower() if free else None
        mapped[want] = match
        if match is not None:
            taken.add(match)
    out: list[tuple[str, str | None, str | None, str]] = []
    for device, want, seen in pairs:
        if mapped[want] != seen.lower():
            problem = (
                f"{device}: PCIe switch {seen} on the host, {want} in the fabric "
                "(alternates are ranked by the fabric's layout)"
            )
            out.append((device, f"pcie_switch {want}", f"pcie_switch {seen}", problem))
    return out


# --------------------------------------------------------------------------------------------
# Links

_Sig = tuple[float | None, str | None, str | None]  # rate in Gb/s, width, speed
_End = tuple[int, int, str]  # tier (leaf 0, spine 1), 1 for an unmatched switch, label
_MF0 = re.compile(r"^MF0;(?P<name>[^:;]+):")  # Mellanox switch NodeDescription "MF0;<name>:<model>"


def _sig(link: Link) -> _Sig:
    return (link.rate_gbps, link.width, link.speed)


def _masked(s: _Sig, known: list[bool]) -> _Sig:
    """``s`` with each attribute that ``known`` says is not compared set to None."""
    rate, width, speed = s
    return (
        rate if known[0] else None,
        width if known[1] else None,
        speed if known[2] else None,
    )


def _compatible(a: _Sig, b: _Sig) -> bool:
    """Equal where both sides say (rate, width and speed each compared only when both know)."""
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def _sig_key(s: _Sig) -> tuple:
    return (s[0] if s[0] is not None else -1.0, s[1] or "", s[2] or "")


def _sig_text(s: _Sig) -> str:
    rate, width, speed = s
    parts = []
    if width or speed:
        parts.append(f"{width or '?'}{speed or '?'}")
    if rate is not None:
        parts.append(f"{rate:g} Gb/s")
    return " ".join(parts) or "rate unknown"


def _rate_detail(want: _Sig, got: _Sig) -> str:
    if want[0] and got[0] is not None and want[0] != got[0]:
        return f"runs at {100 * got[0] / want[0]:.0f}% of the expected rate"
    if want[0] != got[0] and None not in (want[0], got[0]):
        return "different rate"
    return "same rate, different width or lane speed"


def _cables(n: int) -> str:
    return f"{n} cable{'' if n == 1 else 's'}"


def _host_links(f: Fabric) -> dict[str, list[tuple[str, Link]]]:
    """Host port ``"<host>:<hca>/<port>"`` -> [(switch, link)] of its host-leaf links."""
    out: dict[str, list[tuple[str, Link]]] = defaultdict(list)
    for link in f.links:
        if link.kind == "host-leaf":
            port, sw = (link.a, link.b) if ":" in link.a else (link.b, link.a)
            out[port].append((sw, link))
    return out


def _described_name(desc: str | None) -> str | None:
    if not desc:
        return None
    m = _MF0.match(desc.strip())
    return m["name"] if m else desc.strip()


class _Links:
    """The link comparison of one observed fabric with the expected one."""

    def __init__(self, expected: Fabric, observed: Fabric, guids: Mapping[str, str]) -> None:
        self.exp, self.obs, self.guids = expected, observed, guids
        self.exp_sw: dict[str, Switch] = {s.name: s for s in expected.switches}
        self.obs_sw: dict[str, Switch] = {s.name: s for s in observed.switches}
        self.exp_ports = _host_links(expected)
        self.obs_ports = _host_links(observed)
        self.ident: dict[str, str] = {}  # observed switch -> expected switch
        self.matched: set[str] = set()  # expected switches some observed switch is
        self.out: list[Finding] = []

    def run(self, skip_hosts: set[str]) -> list[Finding]:
        self.identify()
        if self.exp_ports:
            self.host_links(skip_hosts)
        if any(link.kind != "host-leaf" for link in self.exp.links):
            self.switch_links()
        return self.out

    # -- which observed switch is which expected one --------------------------------------

    def identify(self) -> None:
        """Explicit matches first (name, GUID, description), then leaves by their hosts."""
        by_guid = {s.guid: s.name for s in self.exp.switches if s.guid}
        for s in self.obs.switches:
            name = self.explicit(s, by_guid)
            if name is not None and name not in self.matched:
                self.claim(s.name, name)
        votes: dict[str, Counter[str]] = defaultdict(Counter)
        for port, ends in self.obs_ports.items():
            want = self.exp_ports.get(port)
            if not want:
                continue
            for sw, _ in ends:
                if sw not in self.ident:
                    votes[sw][want[0][0]] += 1
        ranked = sorted(
            ((n, o, e) for o, c in votes.items() for e, n in c.items()),
            key=lambda t: (-t[0], _natural(t[1]), _natural(t[2])),
        )
        for _, o, e in ranked:
            if o not in self.ident and e not in self.matched:
                self.claim(o, e)

    def explicit(self, s: Switch, by_guid: dict[str, str]) -> str | None:
        """The expected switch ``s`` says it is: same name, node GUID or description."""
        if s.name in self.exp_sw:
            return s.name
        guid = s.guid or self.guids.get(s.name)
        if guid and guid in by_guid:
            return by_guid[guid]
        described = _described_name(s.description)
        return described if described in self.exp_sw else None

    def claim(self, observed: str, expected: str) -> None:
        self.ident[observed] = expected
        self.matched.add(expected)

    # -- host links -------------------------------------------------------------------------

    def leaf_text(self, name: str, rail: int | None) -> str:
        return name if rail is None else f"{name} (rail {rail})"

    def observed_leaf_text(self, sw: str) -> str:
        e = self.ident.get(sw)
        if e is None:
            return f"{sw} (no expected switch)"
        shown = e if e == sw else f"{sw} = {e}"
        return self.leaf_text(shown, self.exp_sw[e].rail)

    def expected_rail(self, sw: str, link: Link) -> int | None:
        leaf = self.exp_sw.get(sw)
        return leaf.rail if leaf is not None and leaf.rail is not None else link.rail

    def host_links(self, skip_hosts: set[str]) -> None:
        exp_hosts = set(self.exp.host_names)
        obs_hosts = set(self.obs.host_names)
        for port in self.exp_ports.keys() | self.obs_ports.keys():
            host = port.partition(":")[0]
            if host in skip_hosts or host not in exp_hosts:
                continue  # reported as missing_host / unknown_host
            have = list(self.obs_ports.get(port, ()))
            for sw, link in self.exp_ports.get(port, ()):
                match = next((h for h in have if self.ident.get(h[0]) == sw), None)
                match = match or (have[0] if have else None)
                if match is None:
                    why = (
                        "no cable on this port in the observed fabric"
                        if host in obs_hosts
                        else "the host reported but is absent from the observed fabric"
                    )
                    want = f"{self.leaf_text(sw, self.expected_rail(sw, link))}, "
                    self.add("missing_link", port, want + _sig_text(_sig(link)), None, why)
                    continue
                have.remove(match)
                self.compare_port(port, sw, link, *match)
            for sw, link in have:
                self.add(
                    "unexpected_link",
                    port,
                    None,
                    f"{self.observed_leaf_text(sw)}, {_sig_text(_sig(link))}",
                    "a cable the expected fabric does not have",
                )

    def compare_port(self, port: str, sw: str, link: Link, osw: str, olink: Link) -> None:
        got = self.ident.get(osw)
        if got != sw:
            rail = self.expected_rail(sw, link)
            orail = self.exp_sw[got].rail if got is not None else None
            want = self.leaf_text(sw, rail)
            seen = self.observed_leaf_text(osw)
            if rail is not None and orail is not None and rail != orail:
                why = f"HCA of rail {rail} cabled to the rail-{orail} leaf"
                self.add("wrong_rail", port, want, seen, why)
            elif got is None:
                why = f"cabled to {osw}, which matches no expected leaf"
                self.add("wrong_leaf", port, want, seen, why)
            else:
                su, osu = self.exp_sw[sw].su, self.exp_sw[got].su
                where = f" of SU {osu} instead of SU {su}" if su is not None else ""
                same = f" on the same rail {rail}" if rail is not None and rail == orail else ""
                why = f"cabled to another leaf{where}{same}"
                self.add("wrong_leaf", port, want, seen, why)
        want_sig, have_sig = _sig(link), _sig(olink)
        if not _compatible(want_sig, have_sig):
            detail = _rate_detail(want_sig, have_sig)
            self.add("wrong_rate", port, _sig_text(want_sig), _sig_text(have_sig), detail)

    # -- switch-switch links ------------------------------------------------------------------

    def end(self, name: str, *, observed: bool) -> _End:
        if observed:
            e = self.ident.get(name)
            sw = self.exp_sw[e] if e is not None else self.obs_sw[name]
            known, label = e is not None, e or name
        else:
            sw = self.exp_sw[name]
            known, label = name in self.matched, name
        tier = 0 if sw.role == "leaf" else 1
        return (tier, 0, label) if known else (tier, 1, f"[{sw.role}]")

    def switch_links(self) -> None:
        links = [[x for x in f.links if x.kind != "host-leaf"] for f in (self.exp, self.obs)]
        sigs = [{_sig(x) for x in side} for side in links]
        # an attribute that no cable of one side has is never compared: masked once, here
        known = [all(any(s[i] is not None for s in side) for side in sigs) for i in range(3)]
        masks = [{s: _masked(s, known) for s in side} for side in sigs]
        tallies: tuple[dict, dict] = ({}, {})
        for side, fabric in ((0, self.exp), (1, self.obs)):
            ends = {s.name: self.end(s.name, observed=bool(side)) for s in fabric.switches}
            tally, mask = tallies[side], masks[side]
            for link in links[side]:
                a, b = ends[link.a], ends[link.b]
                key = ((a, b) if a <= b else (b, a), mask[(link.rate_gbps, link.width, link.speed)])
                tally[key] = tally.get(key, 0) + 1
        # masked -> a full signature, for the texts
        full = ({m: s for s, m in masks[0].items()}, {m: s for s, m in masks[1].items()})
        groups: dict[tuple[_End, _End], tuple[dict[_Sig, int], dict[_Sig, int]]] = {}
        for side, tally in enumerate(tallies):
            for (pair, sig), n in tally.items():
                groups.setdefault(pair, ({}, {}))[side][sig] = n
        for (a, b), (want, have) in groups.items():
            if want != have:
                self.compare_group(f"{a[2]} - {b[2]}", Counter(want), Counter(have), full)

    def compare_group(
        self,
        subject: str,
        want: Counter[_Sig],
        have: Counter[_Sig],
        full: tuple[dict[_Sig, _Sig], dict[_Sig, _Sig]],
    ) -> None:
        """Cables between the same two ends (counts per rate, width, speed): equal ones, then
        compatible ones (an unknown rate matches any), then pairs of different rates
        (wrong_rate), then the rest missing/extra. ``full`` gives each side's texts."""

        def text(sig: _Sig, side: int) -> str:
            return _sig_text(full[side].get(sig, sig))

        total_e, total_o = want.total(), have.total()
        same = want & have
        e, o = want - same, have - same
        for pairing in (True, False):
            for es in sorted(e, key=_sig_key):
                for os_ in sorted(o, key=_sig_key):
                    n = min(e[es], o[os_])
                    if n == 0 or (pairing and not _compatible(es, os_)):
                        continue
                    e[es] -= n
                    o[os_] -= n
                    if not pairing:
                        detail = f"{n} of {_cables(total_e)}: {_rate_detail(es, os_)}"
                        self.add("wrong_rate", subject, text(es, 0), text(os_, 1), detail)
        counts = (_cables(total_e), _cables(total_o))
        for es, n in sorted(e.items(), key=lambda t: _sig_key(t[0])):
            if n:
                self.add("missing_link", subject, *counts, f"{_cables(n)} at {text(es, 0)} missing")
        for os_, n in sorted(o.items(), key=lambda t: _sig_key(t[0])):
            if n:
                detail = f"{_cables(n)} at {text(os_, 1)} the expected fabric does not have"
                self.add("unexpected_link", subject, *counts, detail)

    def add(self, kind: FindingKind, subject: str, exp: str | None, obs: str | None, why: str):
        self.out.append(_finding(kind, subject, exp, obs, why))


# --------------------------------------------------------------------------------------------
# GUIDs


def _duplicate_guids(observed: Fabric | None, guids: Mapping[str, str]) -> list[Finding]:
    """Node GUIDs (switches, CAs) and port GUIDs each claimed by more than one name. The two
    are checked apart: a ConnectX port GUID may equal its own node GUID."""
    first: dict[tuple[str, str], str] = {}  # (what, GUID) -> first name with it
    tables: dict[str, dict[str, set[str]]] = {"node": defaultdict(set), "port": defaultdict(set)}
    switches = observed.switches if observed is not None else []
    named = [(s.name, s.guid) for s in switches if s.guid]
    for name, guid in [*named, *guids.items()]:
        what, g = "port" if "/" in name else "node", guid.lower()
        seen = first.setdefault((what, g), name)
        if seen != name:
            tables[what][g].update((seen, name))
    out = []
    for what, table in tables.items():
        for guid, names in table.items():
            if len(names) > 1:  # a switch's GUID is in both observed and observed_guids
                out.append(
                    _finding(
                        "duplicate_guid",
                        f"0x{guid}",
                        f"one {what}",
                        ", ".join(sorted(names, key=_natural)),
                        f"{what} GUID of {len(names)} {what}s: the subnet manager can address "
                        "only one of them",
                    )
                )
    return out


# --------------------------------------------------------------------------------------------
# The audit


def audit(
    expected: Fabric,
    *,
    observed: Fabric | None = None,
    observed_guids: Mapping[str, str] | None = None,
    inventories: Mapping[str, HostInventory] = _NO_INVENTORIES,
    reported_hosts: Collection[str] | None = None,
    reported_as: str = "the hosts that reported",
) -> list[Finding]:
    """Compare ``expected`` with what was observed; the findings in :func:`sort_findings` order
    (errors first, then by kind, then subject).

    ``observed``: a fabric as found, imported from ``ibnetdiscover`` (``observed_guids`` = that
    import's ``guids``: names -> GUIDs) or a fabric file read with
    ``load_fabric(path, observed=True)`` (validated without the HCA-vs-leaf rail check, so that
    an HCA on another rail's leaf loads and is reported as ``wrong_rail``). ``inventories``: agents'
    inventories by host name. ``reported_hosts``: hosts that reported (e.g. agents online),
    named ``reported_as`` in a ``missing_host`` finding's detail.

    Hosts (by name): ``missing_host`` for an expected host that never reported, i.e. is neither in
    ``reported_hosts`` (when given), nor in ``observed``, nor in ``inventories`` (checked only
    when at least one of them is given; offline, with only a dump: the hosts absent from the
    dump); ``unknown_host`` for a host of any of those the expected fabric lacks (its cables are
    not compared). ``inventory_mismatch`` per :func:`inventory_problems` line;
    ``layout_mismatch`` (a warning) per HCA port or GPU whose PCIe switch in ``expected``
    disagrees with its agent's (:func:`_layout_diffs`; never for a fabric without switch ids).

    Switches: each observed switch is matched to at most one expected switch, the first that
    applies: the same name; the same node GUID (``Switch.guid`` or ``observed_guids``); its
    NodeDescription is an expected switch's name (as is or in the Mellanox form
    ``MF0;<name>:<model>``); for a leaf, the expected leaf most of its host ports should reach
    (largest vote first, one-to-one). Explicit identity wins over the hosts' vote: a leaf whose
    description says ``su0-leaf2`` is that leaf, whatever is cabled to it.

    Host links (expected has host-leaf links, observed has links), per host port
    ``"<host>:<hca>/<port>"``: ``missing_link`` / ``unexpected_link``; ``wrong_rail`` when the
    leaf reached has another rail than the expected leaf; ``wrong_leaf`` when it is another leaf
    of the same (or an unknown) rail, e.g. another SU's, or matches no expected leaf;
    ``wrong_rate`` when rate (Gb/s), width or lane speed differ where both sides give them (EDR
    4x = 100 where NDR 4x = 400 is expected).

    Switch-switch links (expected has some, observed has links): cables are counted per pair of
    ends, an end being the matched expected switch, or for an unmatched one its tier
    (``[leaf]``, ``[spine]``), and compared in count (``missing_link``, ``unexpected_link``) and
    rate (``wrong_rate``). With every switch matched (fabric files; dumps of switches named by
    GUID map, GUID or description) every leaf-spine and spine-core pair is checked. A dump whose
    spines have anonymous names and descriptions still has its leaves matched by their hosts:
    then each leaf's uplinks are checked in count and rate but not which spine they reach, and
    spine-core cables as one count per rate for the whole tier.

    GUIDs (``observed`` switches and ``observed_guids``): ``duplicate_guid`` for a node GUID or a
    port GUID that more than one name has.

    Not compared: an import's inferred rails and assigned addresses (a dump has neither), port
    numbers, GPU endpoints, and the observed fabric's own host inventories (pass those as
    ``inventories``).
    """
    out: list[Finding] = []
    guids = observed_guids or {}
    exp_hosts = {h.host: h for h in expected.hosts}
    reported: set[str] = set(inventories)
    sources = []
    if observed is not None:
        reported.update(observed.host_names)
        sources.append("the observed fabric")
    if reported_hosts is not None:
        reported.update(reported_hosts)
        sources.append(reported_as)
    if inventories:
        sources.append("the agents' inventories")
    missing: set[str] = set()
    if sources:
        missing = {h for h in exp_hosts if h not in reported}
        where = " and ".join(sources)
        for h in missing:
            want = _cables(len(exp_hosts[h].hcas)).replace("cable", "HCA port")
            out.append(_finding("missing_host", h, want, None, f"absent from {where}"))
        for h in reported - exp_hosts.keys():
            seen = [
                what
                for what, there in (
                    ("observed fabric", observed is not None and h in observed.host_names),
                    ("reported", reported_hosts is not None and h in reported_hosts),
                    ("inventory", h in inventories),
                )
                if there
            ]
            out.append(
                _finding(
                    "unknown_host",
                    h,
                    None,
                    ", ".join(seen),
                    "not in the expected fabric: nothing is planned for it",
                )
            )
    for h, inv in inventories.items():
        if h in exp_hosts:
            for key, exp_text, obs_text, problem in _inventory_diffs(exp_hosts[h], inv):
                out.append(
                    _finding("inventory_mismatch", f"{h}:{key}", exp_text, obs_text, problem)
                )
            for key, exp_text, obs_text, problem in _layout_diffs(exp_hosts[h], inv):
                out.append(_finding("layout_mismatch", f"{h}:{key}", exp_text, obs_text, problem))
    if observed is not None and observed.links and expected.links:
        out += _Links(expected, observed, guids).run(missing)
    out += _duplicate_guids(observed, guids)
    return sort_findings(out)


# --------------------------------------------------------------------------------------------
# Renderings


def _summary(findings: Sequence[Finding]) -> str:
    errors = sum(1 for f in findings if f.severity == "error")
    kinds = Counter(f.kind for f in findings)
    per_kind = ", ".join(f"{k} {kinds[k]}" for k in KINDS if kinds[k])
    return (
        f"{len(findings)} finding{'' if len(findings) == 1 else 's'} ({errors} error"
        f"{'' if errors == 1 else 's'}, {len(findings) - errors} warning"
        f"{'' if len(findings) - errors == 1 else 's'}): {per_kind}"
    )


def format_table(findings: Sequence[Finding]) -> str:
    """A fixed-width table (severity, kind, subject, expected, observed, detail; ``-`` for an
    absent value), one finding per line, then a summary line; a one-line "no findings" when
    empty."""
    if not findings:
        return "no findings: the observed fabric matches the expected one\n"
    head = ("SEVERITY", "KIND", "SUBJECT", "EXPECTED", "OBSERVED", "DETAIL")
    rows = [head] + [
        (f.severity, f.kind, f.subject, f.expected or "-", f.observed or "-", f.detail)
        for f in findings
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n\n" + _summary(findings) + "\n"


def format_json(findings: Sequence[Finding]) -> str:
    """``{"findings": [{kind, severity, subject, expected, observed, detail}, ...], "errors": N,
    "warnings": N, "counts": {kind: N}}`` as indented JSON."""
    errors = sum(1 for f in findings if f.severity == "error")
    data = {
        "findings": [f.as_dict() for f in findings],
        "errors": errors,
        "warnings": len(findings) - errors,
        "counts": dict(Counter(f.kind for f in findings)),
    }
    return json.dumps(data, indent=1) + "\n"
