"""What an ``ibnetdiscover`` dump describes, as parsed (:mod:`linkguard.topology.ibnetdiscover`
has the format): :class:`IBNode` and :class:`IBLink` in an :class:`IBTopology`, the IBA link
widths and speeds, and :class:`FabricImportError` for a file that cannot be imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from linkguard.topology.fabric import FabricError

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
