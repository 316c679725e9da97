"""Fleet audit: the fabric that should be against what was observed.

Consumes: the expected :class:`~linkguard.topology.fabric.Fabric` (a fabric file or the
generator); optionally an observed Fabric (what
:func:`~linkguard.topology.ibnetdiscover.import_ibnetdiscover` made of an ``ibnetdiscover`` dump,
with its ``guids``, or a fabric file read with ``load_fabric(path, observed=True)``, which may
cable an HCA to another rail's leaf), agents' :class:`~linkguard.models.HostInventory` per
host, and the names of the hosts that reported (agents online). Produces: a sorted list of
:class:`Finding` (what is missing, extra, slow, cabled to the wrong leaf, duplicated or
unknown) and its renderings, :func:`format_table` for people and :func:`format_json` for
tools. Pure: no I/O, no clock. The findings are :mod:`~linkguard.topology.audit_findings` (their
names re-exported here), the cabling comparison :mod:`~linkguard.topology.audit_links`.

:func:`inventory_problems` is the one comparison of an agent's inventory with the fabric's host;
the topology service logs its result as ``inventory_mismatch``.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

from linkguard.models import HostInventory
from linkguard.topology.audit_findings import (
    KINDS,
    SEVERITY,
    Finding,
    FindingKind,
    _finding,
    _natural,
    sort_findings,
)
from linkguard.topology.audit_links import _cables, _Links
from linkguard.topology.fabric import Fabric

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
