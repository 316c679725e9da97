"""NCCL renderings of a host's current plan: what a job starting now should tell NCCL.

Consumes: the host's :class:`~linkguard.models.HostInventory` (its HCA ports and rails), the
latest :class:`~linkguard.models.PortState` of each port, and the applied
:class:`~linkguard.models.Plan` (None: no plan yet). Produces (:func:`render`) an
:class:`NcclRendering`: a verdict per port (:class:`PortVerdict`), the ``NCCL_IB_HCA`` value of
the usable ports (:func:`ib_hca`), a fused-NIC layout for NCCL's port failover
(:func:`fused_layout`), and (:func:`render_topology`) an NCCL topology XML with the unusable
NICs taken out. :class:`NcclFiles` writes them next to the rail map, atomically; it is the one
part with I/O. ``linkguard nccl env`` prints them (:mod:`linkguard.cli`). The port verdicts and
the fused layout are :mod:`linkguard.ncclports` (re-exported here).

Why a job needs this (NCCL facts, with the versions they hold for):

* NCCL reads ``NCCL_IB_HCA`` once per process, when its IB transport first initializes
  (``src/transport/net_ib/init.cc``): a value only steers jobs started after it was written.
  Syntax: a comma-separated list of ``name[:port]``; a leading ``^`` excludes the listed devices
  instead; a leading ``=`` (after ``^`` when both) makes every entry an exact name, otherwise
  each entry is a *prefix* (``mlx5_1`` also selects ``mlx5_10`` .. ``mlx5_19``). linkguard
  always writes ``=`` and the port. NCCL only considers ports in state ACTIVE at that moment.
  An empty list selects every device, so a host with no usable port gets
  ``NCCL_IB_DISABLE=1`` instead of an empty ``NCCL_IB_HCA``. :func:`hca_selects` is the same
  matching rule in Python.
* An RDMA queue pair does not follow a kernel route. A connection on a port that dies stalls
  until the retry budget is spent (4.096 us x 2^``NCCL_IB_TIMEOUT`` per try x
  ``NCCL_IB_RETRY_CNT`` retries: ~30 s at 20 and 7), then the communicator fails, unless:
* NCCL 2.29.7+ with ``NCCL_IB_RESILIENCY_PORT_FAILOVER=1`` (``p2p_resiliency.cc``): inside a
  *fused* virtual NIC, queue pairs on a failed device are replaced by ones on a surviving member
  and unacknowledged requests are replayed. It acts on the error completions the retry budget
  ends in (``RETRY_EXC_ERR``, ``WR_FLUSH_ERR``), so the stall before it is still that budget;
  and it is fatal when more than one device of the group has failed. A lone (unfused) device
  has nothing to fail over to.
* Fusion ("NIC fusion", NCCL 2.24.3+, the net plugin API's ``makeVDevice``): NCCL merges
  physical devices into one virtual NIC named ``a+b`` whose speed is the sum of the members'.
  ``NCCL_NET_MERGE_LEVEL`` (a path type of ``src/graph/topo.cc``: default ``PORT``, only the
  ports of one NIC; ``PIX``: same PCIe switch; ``PXB``, ``P2C``, ``PXN``, ``PHB``, ``SYS``
  farther; ``LOC``: no automatic merging) and
  ``NCCL_NET_FORCE_MERGE`` (groups separated by ``;``, members by ``,``, each ``name[:port]``
  matched exactly) choose the groups; ``NCCL_IB_MERGE_NICS=0`` forbids it; members must share
  a link layer; at most 4 devices per virtual NIC (``NCCL_NET_MAX_DEVS_PER_NIC`` of net API
  v9-v11; v12 allows 8).

"degraded" here: a port that is up and usable but slower than it should be (it came back at a
lower rate, e.g. 200 of 400 Gb/s: fewer lanes or a lower speed after retraining): its
``rate_gbps`` is below the expected rate. The expected rate is given (the fabric's cable rate,
as the service's API uses for its ``degraded`` view) or, on the host, the highest rate among
the host's ports of the same link layer.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import structlog

from linkguard.atomicfile import atomic_write
from linkguard.jobwatch import selects as hca_selects
from linkguard.models import HostInventory, Plan, PortState
from linkguard.ncclports import (
    FAILOVER_MIN_VERSION,
    FUSION_MIN_VERSION,
    MAX_DEVS_PER_VNIC,
    FusedLayout,
    FusedNic,
    PortVerdict,
    fused_layout,
    ib_hca,
    port_verdicts,
)

__all__ = [
    "FAILOVER_MIN_VERSION",
    "FUSION_MIN_VERSION",
    "MAX_DEVS_PER_VNIC",
    "MAX_TOPOLOGY_BYTES",
    "MAX_TOPOLOGY_DEPTH",
    "FusedLayout",
    "FusedNic",
    "NcclFiles",
    "NcclRendering",
    "PortVerdict",
    "TopologyFileError",
    "TopologyRendering",
    "env_lines",
    "fused_layout",
    "hca_selects",
    "ib_hca",
    "port_verdicts",
    "render",
    "render_topology",
]

log = structlog.get_logger(__name__)

#: Largest NCCL topology file read (bytes): real ones are 4-10 KB (aws-ofi-nccl p4d / p5).
MAX_TOPOLOGY_BYTES = 1 << 20
#: Deepest element nesting accepted: real files nest ``system > cpu > pci (switch) > pci >
#: nic > net``, 6 levels; PCIe trees a few switches deep stay far below this.
MAX_TOPOLOGY_DEPTH = 32
#: A PCI class code of a network controller (0x02xxxx: Ethernet 0x0200, InfiniBand 0x0207).
_NIC_CLASS_PREFIX = "0x02"


# -- fused NICs for NCCL's port failover ---------------------------------------------------------


# -- topology XML --------------------------------------------------------------------------------


class TopologyFileError(ValueError):
    """An NCCL topology file that cannot be used: unreadable, too large, not well-formed,
    hostile (a DTD, entities, external references, nesting deeper than
    :data:`MAX_TOPOLOGY_DEPTH`), or not rooted at ``<system>``."""


@dataclass(frozen=True, slots=True)
class TopologyRendering:
    """An NCCL topology XML with the unusable NICs removed. ``removed``: the ports taken out
    (``hca/port``); ``not_found``: unusable ports the file does not list; ``gpus``: GPUs in the
    result; ``nics``: the NICs left (``<net name>``, or the bus id of a bare NIC ``<pci>``)."""

    xml: str
    removed: tuple[str, ...]
    not_found: tuple[str, ...]
    gpus: int
    nics: tuple[str, ...]


class _Builder(ET.TreeBuilder):
    """A tree builder that keeps comments, including those before the root element."""

    def __init__(self) -> None:
        super().__init__(insert_comments=True)
        self.prolog: list[str] = []
        self._started = False
        self._depth = 0

    def start(self, tag: Any, attrs: Any) -> ET.Element:
        self._started = True
        self._depth += 1
        if self._depth > MAX_TOPOLOGY_DEPTH:
            raise TopologyFileError(f"elements nested deeper than {MAX_TOPOLOGY_DEPTH}")
        return super().start(tag, attrs)

    def end(self, tag: Any) -> ET.Element:
        self._depth -= 1
        return super().end(tag)

    def comment(self, text: str | None, /) -> ET.Element:
        if not self._started and text is not None:  # expat always passes the text
            self.prolog.append(text)
        return super().comment(text)


def _parse(data: str | bytes, source: str) -> tuple[ET.Element, list[str]]:
    # lazy: only a topology file (NCCL_TOPO_FILE) needs the XML parser
    import defusedxml
    from defusedxml.ElementTree import DefusedXMLParser

    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_TOPOLOGY_BYTES:
        raise TopologyFileError(f"{source}: larger than {MAX_TOPOLOGY_BYTES} bytes")
    builder = _Builder()
    parser = DefusedXMLParser(target=builder, forbid_dtd=True)
    try:
        parser.feed(raw)
        root = parser.close()
    except defusedxml.DefusedXmlException as exc:
        raise TopologyFileError(f"{source}: refused: {type(exc).__name__}: {exc}") from None
    except ET.ParseError as exc:
        raise TopologyFileError(f"{source}: not well-formed XML: {exc}") from None
    except TopologyFileError as exc:
        raise TopologyFileError(f"{source}: {exc}") from None
    if not isinstance(root, ET.Element) or root.tag != "system":
        tag = getattr(root, "tag", None)
        raise TopologyFileError(f"{source}: root element <{tag}>, expected <system>")
    return root, builder.prolog


def _remove(parent: ET.Element, child: ET.Element) -> None:
    """Remove ``child`` keeping the whitespace around it right, and a comment that follows it
    on the same line (``<pci .../> <!-- NIC 0 -->``)."""
    kids = list(parent)
    i = kids.index(child)
    nxt = kids[i + 1] if i + 1 < len(kids) else None
    tail = child.tail
    if nxt is not None and nxt.tag is ET.Comment and "\n" not in (child.tail or ""):
        tail = nxt.tail
        parent.remove(nxt)
    if i > 0:  # the first child's indentation is the parent's text: it stays
        kids[i - 1].tail = tail
    parent.remove(child)


#: the child elements that make a ``<pci>`` more than a bare device; NCCL's reader (xml.cc,
#: ``ncclTopoXmlLoadPci``) and :func:`~linkguard.layout.parse_nccl_topo` skip any other
_DEVICE_TAGS = frozenset({"pci", "gpu", "nic", "cpu"})


def _empty(el: ET.Element) -> bool:
    """No ``<pci>``/``<gpu>``/``<nic>``/``<cpu>`` child, only comments or elements NCCL skips:
    how :func:`~linkguard.layout.parse_nccl_topo` and NCCL read it (a bare device)."""
    return not any(c.tag in _DEVICE_TAGS for c in el)


def _prune(el: ET.Element, parents: dict[ET.Element, ET.Element]) -> None:
    """Remove ``el`` when it is a ``<pci>`` a removal left empty, and so on upwards: an empty
    ``<pci>`` of a NIC class would read as a bare NIC (the p4d form), an empty bridge says
    nothing."""
    while el.tag == "pci" and _empty(el) and el in parents:
        parent = parents[el]
        _remove(parent, el)
        el = parent


def render_topology(
    source: str | bytes, verdicts: Sequence[PortVerdict], *, name: str = "<nccl topology>"
) -> TopologyRendering:
    """``source`` (an NCCL topology XML, the format ``NCCL_TOPO_FILE`` names: ``<system>`` >
    ``<cpu>`` > nested ``<pci>`` > ``<gpu>`` / ``<nic><net .../></nic>``, as in aws-ofi-nccl's
    p4d and p5 files) without the unusable ports of ``verdicts``: a ``<net>`` whose ``name`` is
    the HCA (and ``port``, when given, the port) is removed, then its ``<nic>`` and the
    ``<pci>`` elements around it that are left empty; a bare NIC ``<pci>`` (class 0x02xxxx, no
    children, as in the p4d file) is removed when its ``busid`` is the HCA's PCI address and
    the HCA has one port. Everything else is kept in order, attributes and comments included.

    Removing a NIC from the file does not stop NCCL from using it (NCCL adds devices it finds);
    ``NCCL_IB_HCA`` does. The file keeps what a job is told consistent. Raises
    :class:`TopologyFileError` (naming ``name``) for a file that cannot be used."""
    root, prolog = _parse(source, name)
    parents = {c: p for p in root.iter() for c in p}
    unusable = [v for v in verdicts if not v.usable]
    ports_per_bdf: dict[str, int] = {}
    for v in verdicts:
        if v.pci_address:
            b = v.pci_address.lower()
            ports_per_bdf[b] = ports_per_bdf.get(b, 0) + 1
    removed: list[str] = []
    not_found: list[str] = []
    for v in unusable:
        nets = [
            n
            for n in root.iter("net")
            if n.get("name") == v.hca and n.get("port", str(v.port)).strip() == str(v.port)
        ]
        bare = [
            p
            for p in root.iter("pci")
            if v.pci_address
            and (p.get("busid") or "").lower() == v.pci_address.lower()
            and (p.get("class") or "").lower().startswith(_NIC_CLASS_PREFIX)
            and _empty(p)
            and ports_per_bdf.get(v.pci_address.lower()) == 1
        ]
        if not nets and not bare:
            not_found.append(v.key)
            continue
        for n in nets:
            nic = parents[n]
            _remove(nic, n)
            if nic.tag == "nic" and len(nic) == 0:
                pci = parents[nic]
                _remove(pci, nic)
                _prune(pci, parents)
        for p in bare:
            _remove(parents[p], p)
            _prune(parents[p], parents)
        removed.append(v.key)
    gpus = sum(
        1
        for p in root.iter("pci")
        if p.find("gpu") is not None
        or ((p.get("class") or "").lower().startswith("0x0302") and _empty(p))
    )
    nics = [n.get("name") or "" for n in root.iter("net")]
    nics += [
        p.get("busid") or ""
        for p in root.iter("pci")
        if (p.get("class") or "").lower().startswith(_NIC_CLASS_PREFIX) and _empty(p)
    ]
    head = "".join(f"<!--{c}-->\n" for c in prolog)
    note = ""
    if removed:
        said = ", ".join(f"{v.nccl_name} ({v.why})" for v in unusable if v.key in removed)
        note = f"<!-- linkguard: removed {said} -->\n"
    # ElementTree writes empty elements as "<x a="1" />"; NCCL and the vendor files write
    # "<x a="1"/>" (xml.cc). " />" cannot come from text or attributes ('>' is escaped there).
    body = ET.tostring(root, encoding="unicode").replace(" />", "/>")
    return TopologyRendering(
        xml=head + note + body + "\n",
        removed=tuple(removed),
        not_found=tuple(not_found),
        gpus=gpus,
        nics=tuple(nics),
    )


# -- the whole rendering --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NcclRendering:
    """Everything ``linkguard nccl env`` shows for one host. ``env``: the plain settings
    (``NCCL_IB_HCA``, ``NCCL_TOPO_FILE`` when a topology file was rendered); ``failover``: the
    fused-NIC settings (:meth:`FusedLayout.env`). JSON-ready through :meth:`to_dict`."""

    host: str
    epoch: int | None
    ports: tuple[PortVerdict, ...]
    ib_hca: str | None
    env: dict[str, str]
    layout: FusedLayout
    failover_env: dict[str, str]
    topology: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``nccl.json``, ``--format json``)."""
        return {
            "host": self.host,
            "epoch": self.epoch,
            "ib_hca": self.ib_hca,
            "env": self.env,
            "ports": [
                {
                    **{k: v for k, v in asdict(p).items()},
                    "nccl_name": p.nccl_name,
                }
                for p in self.ports
            ],
            "failover": {
                "min_nccl_version": FAILOVER_MIN_VERSION,
                "env": self.failover_env,
                "groups": [
                    {
                        "name": g.name,
                        "members": [m.nccl_name for m in g.members],
                        "rails": [m.rail for m in g.members],
                        "basis": g.basis,
                        "state": g.state,
                        "lost": [m.nccl_name for m in g.lost],
                    }
                    for g in self.layout.groups
                ],
                "warnings": self.layout.warnings,
                "tradeoff": self.layout.tradeoff(),
            },
            "topology": self.topology,
        }


def render(
    inventory: HostInventory,
    states: Iterable[PortState],
    plan: Plan | None,
    *,
    expected_gbps: Mapping[str, float] | float | None = None,
    degraded: Collection[str] = (),
    fused_size: int = 2,
    topology: TopologyRendering | None = None,
    topology_path: str | None = None,
) -> NcclRendering:
    """The :class:`NcclRendering` of a host (:func:`port_verdicts` for the arguments).
    ``topology``/``topology_path``: a rendered topology file and where it is written (added as
    ``NCCL_TOPO_FILE``). Pure."""
    verdicts = port_verdicts(
        inventory, states, plan, expected_gbps=expected_gbps, degraded=degraded
    )
    hca = ib_hca(verdicts)
    env = {"NCCL_IB_HCA": hca} if hca is not None else {"NCCL_IB_DISABLE": "1"}
    layout = fused_layout(verdicts, size=fused_size)
    failover = layout.env(verdicts)
    topo_doc = None
    if topology is not None:
        topo_doc = {
            "path": topology_path,
            "removed": list(topology.removed),
            "not_found": list(topology.not_found),
            "gpus": topology.gpus,
            "nics": list(topology.nics),
        }
        if topology_path is not None:
            env["NCCL_TOPO_FILE"] = topology_path
            failover["NCCL_TOPO_FILE"] = topology_path
    return NcclRendering(
        host=inventory.host,
        epoch=plan.epoch if plan is not None else None,
        ports=tuple(verdicts),
        ib_hca=hca,
        env=env,
        layout=layout,
        failover_env=failover,
        topology=topo_doc,
    )


def env_lines(env: Mapping[str, str], *, export: bool = False) -> str:
    """``KEY=VALUE`` lines (values shell-quoted only where needed: ``;``, ``^``, spaces), for
    ``set -a; . file`` or ``eval``; ``export``: ``export KEY=VALUE``."""
    pre = "export " if export else ""
    return "".join(f"{pre}{k}={shlex.quote(v)}\n" for k, v in env.items())


# -- the agent's files ---------------------------------------------------------------------------


class NcclFiles:
    """The renderings the agent keeps current in ``directory`` (next to the rail map, readable
    by jobs): ``nccl.json`` (the whole :meth:`NcclRendering.to_dict`, what ``linkguard nccl
    env`` reads), ``nccl.env`` (plain settings), ``nccl-failover.env`` (fused-NIC settings) and,
    when ``topology_file`` is set, ``nccl-topo.xml``. Each is written atomically (temporary file
    and rename) and only when the settings or port verdicts changed: a new plan epoch that
    changes nothing for NCCL writes nothing, so the files' ``epoch`` is that of the plan that
    last changed them. :meth:`update` never raises: a failure is logged
    (``nccl_render_failed``) and the next update tries again."""

    JSON = "nccl.json"
    ENV = "nccl.env"
    FAILOVER_ENV = "nccl-failover.env"
    TOPOLOGY = "nccl-topo.xml"

    def __init__(self, directory: Path, *, topology_file: Path | None = None) -> None:
        self.directory = directory
        self.topology_file = topology_file
        self._written: dict[str, str] = {}
        self._said: str | None = None  # the last rendering written, its epoch aside

    def update(
        self,
        inventory: HostInventory,
        states: Iterable[PortState],
        plan: Plan | None,
        *,
        expected_gbps: Mapping[str, float] | float | None = None,
    ) -> NcclRendering | None:
        """Render and write; the rendering, or None when it failed (logged)."""
        try:
            return self._update(inventory, list(states), plan, expected_gbps=expected_gbps)
        except Exception as exc:  # never the agent's problem: its routes are applied already
            log.warning(
                "nccl_render_failed",
                directory=str(self.directory),
                error=f"{type(exc).__name__}: {exc}"[:500],
                hint="jobs read the previous files; fixed at the next plan or port change",
            )
            return None

    def _update(
        self,
        inventory: HostInventory,
        states: list[PortState],
        plan: Plan | None,
        *,
        expected_gbps: Mapping[str, float] | float | None,
    ) -> NcclRendering:
        topo: TopologyRendering | None = None
        topo_path: str | None = None
        if self.topology_file is not None:
            verdicts = port_verdicts(inventory, states, plan, expected_gbps=expected_gbps)
            try:
                with self.topology_file.open("rb") as f:
                    data = f.read(MAX_TOPOLOGY_BYTES + 1)
            except OSError as exc:
                raise TopologyFileError(f"{self.topology_file}: cannot read: {exc}") from exc
            topo = render_topology(data, verdicts, name=str(self.topology_file))
            topo_path = str(self.directory / self.TOPOLOGY)
        r = render(
            inventory,
            states,
            plan,
            expected_gbps=expected_gbps,
            topology=topo,
            topology_path=topo_path,
        )
        doc = r.to_dict()
        said = json.dumps({**doc, "epoch": None}, sort_keys=True)
        if said == self._said and all((self.directory / n).exists() for n in self._written):
            return r  # a new epoch that changes nothing for NCCL: no writes
        head = f"# linkguard NCCL settings for {r.host}, plan epoch {r.epoch}\n"
        for v in r.ports:
            if not v.usable:
                head += f"# left out: {v.nccl_name} rail {v.rail} ({v.why})\n"
        files = {
            self.JSON: json.dumps(doc, indent=2) + "\n",
            self.ENV: head + env_lines(r.env),
            self.FAILOVER_ENV: head
            + f"# needs NCCL >= {FAILOVER_MIN_VERSION}\n"
            + "".join(f"# warning: {w}\n" for w in r.layout.warnings)
            + env_lines(r.failover_env),
        }
        if topo is not None:
            files[self.TOPOLOGY] = topo.xml
        # the topology file before the env files that name it, the JSON last
        for name in (self.TOPOLOGY, self.ENV, self.FAILOVER_ENV, self.JSON):
            text = files.get(name)
            if text is None or (
                self._written.get(name) == text and (self.directory / name).exists()
            ):
                continue
            atomic_write(self.directory / name, text)
            self._written[name] = text
        self._said = said
        return r
