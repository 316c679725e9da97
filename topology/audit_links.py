"""The cabling part of a fleet audit (:func:`linkguard.topology.audit.audit`): the expected and
the observed links compared as multisets of cable signatures (ends, rate), with the findings a
difference makes (missing, extra, wrong rate, an HCA on another rail's leaf)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping

from linkguard.topology.audit_findings import (
    Finding,
    FindingKind,
    _finding,
    _natural,
)
from linkguard.topology.fabric import Fabric, Link, Switch

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
