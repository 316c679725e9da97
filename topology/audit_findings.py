"""What a fleet audit reports (:mod:`linkguard.topology.audit`): a :class:`Finding` of one of
the :data:`KINDS`, its :data:`SEVERITY`, and the stable order findings are printed in
(:func:`sort_findings`)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal, get_args

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
#: width and lane speed before a rate (``4xEDR 100 Gb/s``), as
#: :func:`linkguard.topology.audit_links._sig_text` writes them
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
