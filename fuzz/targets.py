"""Fuzz targets: ``target(data: bytes) -> None`` for each kind of untrusted input.

Consumes: any bytes. Produces: nothing when linkguard handled the input as documented; an
exception when it did not. A target feeds ``data`` to the public entry point of one input and
catches exactly the error that entry point documents; anything else escaping (KeyError,
IndexError, UnicodeDecodeError, RecursionError, OverflowError, or an AssertionError of one of
the properties below) is a bug, which the fuzzers report as a crash.

============== ================================================ ==============================
target         entry point                                      documented error
============== ================================================ ==============================
decoders       ``models.decode`` for every model the service    BadMessage (reason oversized,
               (``topology.service._DECODERS``) and the agent   not_json, invalid or
               decode; a decoded message re-encodes to the      wrong_host); expand_plan:
               same message; plans and peer routes expand       ValueError
               (``models.expand_plan``) to a plan that
               validates; ``topics.parse`` on the text
envelopes      ``signing.unwrap`` (no key, key required, key    SignatureError; the body as
               optional), as the agent opens ``plans/`` and     for decoders
               ``peers/`` messages, then the body decoded
sysfs          ``drivers.sysfs_ib.discover_hcas`` and           none: never raises for a bad
               ``read_port`` on a copy of the real sysfs trees  file (module docstring)
               with files rewritten (junk, huge values),
               removed, turned into directories or failing
               with an errno; every reading becomes a
               ``PortState`` (``agent.monitor.PortMonitor``)
               that the service decodes
ibnetdiscover  ``topology.ibnetdiscover.import_ibnetdiscover``  FabricImportError
nccl_topo      ``layout.parse_nccl_topo`` (each GPU's nearest   LayoutError (parse);
               NICs a permutation of the NICs, nearest first;   TopologyFileError (render)
               ``layoutview`` renderings) and
               ``nccl.render_topology`` with some NICs
               unusable; a rendered file renders again and, if
               the input parsed, parses to the same GPUs and a
               subset of the NICs
scenario       ``simulations.scenario.load_scenario`` +         ScenarioError
               ``expand``
config         ``config.load_settings`` (AgentSettings or       ConfigError
               ServiceSettings) from a YAML file and
               ``LINKGUARD_*`` environment variables
bus            a running topology service and two agents on an  none may escape a handler;
               in-memory broker (:mod:`fuzz.live`; plans        all keep running and count
               signed, signatures required): the payload,       every message that does not
               unsigned or sealed with the service's key, on    decode or is not signed
               one of the topics they read
============== ================================================ ==============================

Seeds (:func:`seeds`) come from the real captures in ``../shared/fixtures/real`` (or
``$LINKGUARD_FIXTURES``: sysfs trees, ibnetdiscover and ibsim dumps), the shipped scenarios,
and messages and settings built from a generated fabric; NCCL topology files from
``aws-ofi-nccl`` (p4d, p5), read as they are.
"""

from __future__ import annotations

import atexit
import errno
import functools
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BAD_MESSAGE_REASONS",
    "NCCL_TOPO_FILES",
    "SYSFS_ACTIONS",
    "SYSFS_ERRNOS",
    "SYSFS_TREES",
    "TARGETS",
    "SysfsTrees",
    "Target",
    "bus",
    "check_decode",
    "config",
    "decoder_models",
    "decoders",
    "envelopes",
    "fixtures_dir",
    "fuzz_signer",
    "ibnetdiscover",
    "linkguard_env",
    "nccl_topo",
    "read_tree",
    "samples",
    "scenario",
    "seeds",
    "sysfs",
    "sysfs_input",
    "sysfs_trees",
]

REPO = Path(__file__).resolve().parents[1]

#: ``BadMessage.reason`` values :func:`linkguard.models.decode` documents.
BAD_MESSAGE_REASONS = frozenset({"oversized", "not_json", "invalid", "wrong_host"})

#: errnos a sysfs ``show()`` fails a read with (drivers/sysfs_ib.py's module docstring).
SYSFS_ERRNOS = (errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES, errno.ENOENT, errno.EIO, errno.EBUSY)

#: Real sysfs trees (``../shared/fixtures/real``, see each directory's SOURCES.md) and the
#: devices copied from each: an H100 host (NDR IB with a saturated ``link_downed``, a RoCE
#: LAG bond), node_exporter's iWARP (``N/A (no PMA)``, ``10 Gb/sec (4X)``) and mlx4 with
#: ``counters_ext``, procfs' hfi1 (no ``hca_type``), mlx4 and mlx5 (``phys_state`` = ``4:
#: ACTIVE``, ``hw_counters``).
SYSFS_TREES: dict[str, tuple[str, tuple[str, ...]]] = {
    "leptonai-h100": (
        "leptonai-gpud/tree/sys-class-infiniband-h100.0",
        ("mlx5_1", "mlx5_bond_0"),
    ),
    "node_exporter": ("prometheus-node_exporter/tree/sys/class/infiniband", ("i40iw0", "mlx4_0")),
    "procfs": ("prometheus-procfs/tree/sys/class/infiniband", ("hfi1_0", "mlx4_0", "mlx5_0")),
}

#: What a sysfs mutation does to one path: new content, gone, a directory instead, or the
#: read fails with an errno (as the kernel's ``show()`` does).
SYSFS_ACTIONS = ("write", "remove", "dir", "errno")

#: Generated scenario fabrics are capped at this many host ports while fuzzing (the schema
#: allows 131,072: a valid but seconds-long input would only slow the search down).
FUZZ_MAX_HOST_PORTS = 256


def fixtures_dir() -> Path:
    """The real captures: ``$LINKGUARD_FIXTURES`` or ``../shared/fixtures/real`` next to the
    repository (as tests/conftest.py). FileNotFoundError naming the place when absent."""
    path = Path(os.environ.get("LINKGUARD_FIXTURES", REPO.parent / "shared" / "fixtures" / "real"))
    if not path.is_dir():
        raise FileNotFoundError(
            f"real fixtures not found at {path} (set LINKGUARD_FIXTURES to their directory)"
        )
    return path


class _Bytes:
    """Structure taken from the front of a fuzz input (libFuzzer's FuzzedDataProvider idea,
    without needing atheris): past the end every read gives zeros / nothing."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def pick(self, items: Sequence[Any]) -> Any:
        return items[self.byte() % len(items)]

    def chunk(self) -> bytes:
        """Up to 65,535 bytes, length first (2 bytes, big-endian)."""
        n = self.byte() << 8 | self.byte()
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


def _chunk(b: bytes) -> bytes:
    """The encoding :meth:`_Bytes.chunk` reads."""
    return len(b).to_bytes(2, "big") + b


# --------------------------------------------------------------------------------------------
# decoders


@functools.cache
def decoder_models() -> dict[str, type]:
    """Every bus message model by the topic kind it arrives on: the service's decoders (which
    include the agent's: plan, peers, status; and its probe_targets) and the discovery document
    (the service on a discovered fabric, ``fabric discover``), in name order."""
    from linkguard.models import HostDiscovery, HostStatus, PeerRoutes, Plan, ProbeTargets
    from linkguard.topology.service import _DECODERS

    agent = {"plan": Plan, "peers": PeerRoutes, "status": HostStatus, "probe_targets": ProbeTargets}
    return dict(sorted({**_DECODERS, **agent, "discovery": HostDiscovery}.items()))


@functools.cache
def samples() -> dict[str, Any]:
    """Valid messages of a 4-host x 2-rail fabric with gpu001's rail 0 down: ``{"fabric":
    Fabric, "compact": gpu000's compact Plan, "messages": {kind: [messages]}}`` with kinds as
    in :func:`decoder_models` (plans: gpu000's compact one and gpu001's full one; peers:
    gpu001's peer routes; one message of every other kind)."""
    from linkguard.models import (
        Ack,
        AckResult,
        CableRef,
        FabricFaults,
        HostDiscovery,
        HostStatus,
        LldpNeighbour,
        NetdevFacts,
        PlanRequest,
        PortEvent,
        PortState,
        PortStatus,
        ProbePair,
        ProbePeer,
        ProbeRail,
        ProbeReport,
        ProbeTargets,
        RdmaPortFacts,
        ServiceStatus,
    )
    from linkguard.topology.fabric import generate_rail_optimized
    from linkguard.topology.solver import Solver

    fabric = generate_rail_optimized(hosts=4, rails=2, hosts_per_su=2, spines_per_su=1)
    h0, h1 = fabric.hosts[0].host, fabric.hosts[1].host
    solver = Solver(fabric, {h1: {0}})
    leaf = next(s.name for s in fabric.switches if s.role == "leaf")
    spine = next(s.name for s in fabric.switches if s.role == "spine")
    return {
        "fabric": fabric,
        "compact": solver.compact_plan(h0, epoch=7, now=1.0),
        "messages": {
            "plan": [solver.compact_plan(h0, epoch=7, now=1.0), solver.plan(h1, epoch=7, now=1.0)],
            "peers": [solver.peer_routes(h1, epoch=7, now=1.0)],
            "port": [
                PortState(
                    host=h0,
                    hca="mlx5_0",
                    port=1,
                    rail=0,
                    state="ACTIVE",
                    phys_state="LinkUp",
                    rate_gbps=400.0,
                    status=PortStatus.UP,
                    usable=True,
                    counters={"link_downed": 255, "symbol_error": None},
                    counters_saturated=["link_downed"],
                    observed_at=1.5,
                    seq=3,
                )
            ],
            "events": [
                PortEvent(
                    host=h0, hca="mlx5_0", port=1, rail=0, previous="up", current="down", at=2.0
                )
            ],
            "ack": [Ack(host=h0, epoch=7, result=AckResult.APPLIED, applied_at=2.0, apply_ms=0.4)],
            "plan_request": [
                PlanRequest(host=h0, epoch=6, reason="reconnect", at=2.5),
                PlanRequest(host=h0, at=2.5),
            ],
            "inventory": [fabric.host(h0)],
            "discovery": [
                HostDiscovery(
                    host=h0,
                    inventory=fabric.host(h0),
                    ports=[RdmaPortFacts(hca="mlx5_0", node_guid="0c42a10300b51234")],
                    netdevs=[NetdevFacts(name="bond0", kind="bond", bond_members=["ens1f0"])],
                    lldp=[LldpNeighbour(netdev="ens1f0", system="su0-leaf0", port="swp1")],
                )
            ],
            "status": [HostStatus(host=h0, online=True, at=1.0, version="0.1.0", instance="ab12")],
            "service_status": [ServiceStatus(online=True, at=1.0, instance="cd34", started_at=1)],
            "fabric_faults": [
                FabricFaults(switches_down=[leaf], cables_down=[CableRef(a=leaf, b=spine)], at=3.0)
            ],
            "probes": [
                ProbeReport(
                    host=h0,
                    epoch=5,
                    window_end=4.0,
                    window_s=10.0,
                    pairs=[
                        ProbePair(rail=0, peer_host=h1, peer_rail=0, sent=10, lost=10),
                        ProbePair(
                            rail=1,
                            peer_host=h1,
                            peer_rail=1,
                            sent=10,
                            lost=0,
                            rtt_p50_ms=0.44,
                            rtt_p99_ms=1.2,
                        ),
                    ],
                )
            ],
            "probe_targets": [
                ProbeTargets(
                    host=h0,
                    epoch=5,
                    rails=[
                        ProbeRail(
                            rail=0,
                            address="10.100.0.1",
                            peers=[ProbePeer(host=h1, rail=0, address="10.100.0.2")],
                        )
                    ],
                )
            ],
        },
    }


def _expand(plan: Any, peers: dict[str, Any]) -> None:
    """``expand_plan`` raises ValueError only (documented); what it returns validates."""
    from linkguard.models import Plan, expand_plan

    try:
        full = expand_plan(plan, peers)
    except ValueError:
        return
    Plan.model_validate(full.model_dump())


def check_decode(model: type, payload: bytes, *, expect_host: str | None = None) -> Any:
    """Decode ``payload`` as ``model`` the way the service and the agent do: BadMessage with a
    documented reason, or a message that re-encodes to itself (and, for a plan or peer routes,
    expands). Returns the message, None when refused."""
    from linkguard.models import BadMessage, PeerRoutes, Plan, decode, encode

    try:
        obj = decode(model, payload, topic="fuzz", expect_host=expect_host)
    except BadMessage as exc:
        if exc.reason not in BAD_MESSAGE_REASONS:
            raise AssertionError(f"undocumented BadMessage reason {exc.reason!r}") from exc
        return None
    try:
        again = decode(model, encode(obj))
    except BadMessage as exc:
        raise AssertionError(f"{model.__name__} re-encoded does not decode: {exc}") from None
    if again != obj:
        raise AssertionError(f"{model.__name__} does not survive encode/decode: {obj!r}")
    if isinstance(obj, Plan):
        _expand(obj, {})
    elif isinstance(obj, PeerRoutes):
        _expand(samples()["compact"], {obj.host: obj})
    return obj


def decoders(data: bytes) -> None:
    """First byte: the model (low bits) and whether the topic names a host (>= 128); the rest
    is the payload. The payload's text is also parsed as a topic."""
    if not data:
        return
    from linkguard import topics

    models = decoder_models()
    model = list(models.values())[data[0] % len(models)]
    host = "gpu000" if data[0] >= 128 and "host" in model.model_fields else None
    check_decode(model, data[1:], expect_host=host)
    topics.parse(data[1:].decode("utf-8", "replace"))


def _decoder_seeds() -> list[bytes]:
    from linkguard.models import encode

    kinds = list(decoder_models())
    out = []
    for kind, msgs in samples()["messages"].items():
        for m in msgs:
            out.append(bytes([kinds.index(kind)]) + encode(m))
            if "host" in type(m).model_fields:
                out.append(bytes([kinds.index(kind) + 128]) + encode(m))
    out.append(bytes([0]) + b"linkguard/v1/hosts/gpu000/ports/mlx5_0/1")
    return out


# --------------------------------------------------------------------------------------------
# signed envelopes


@functools.cache
def fuzz_signer() -> Any:
    """A fixed Ed25519 key (seed 32 x 0x01): deterministic seeds, no key file."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from linkguard.signing import Signer

    return Signer(Ed25519PrivateKey.from_private_bytes(b"\1" * 32))


def envelopes(data: bytes) -> None:
    """First byte: plan or peer routes (bit 0), and the agent's key setting (bits 1-2: no
    key, key with signatures required, key with unsigned ones allowed); the rest is the
    payload, opened as the agent opens ``plans/`` and ``peers/`` messages
    (``signing.unwrap``: SignatureError only) and its body decoded (:func:`check_decode`)."""
    if not data:
        return
    from linkguard.models import PeerRoutes, Plan
    from linkguard.signing import SignatureError, unwrap

    model = (Plan, PeerRoutes)[data[0] & 1]
    mode = (data[0] >> 1) % 3
    verifier = None if mode == 0 else fuzz_signer().verifier
    try:
        opened = unwrap(data[1:], verifier, require=mode == 1)
    except SignatureError:
        return
    assert opened.verified == (verifier is not None and opened.signed), opened
    check_decode(model, opened.body)


def _envelope_seeds() -> list[bytes]:
    from linkguard.models import encode

    signer = fuzz_signer()
    out = []
    for i, kind in enumerate(("plan", "peers")):
        for msg in samples()["messages"][kind]:
            sealed = signer.seal(encode(msg))
            for mode in range(3):
                out.append(bytes([i | mode << 1]) + sealed)
            out.append(bytes([i | 1 << 1]) + encode(msg))  # unsigned, signatures required
    return out


# --------------------------------------------------------------------------------------------
# sysfs


def _failing_reader(failing: dict[str, int], path: str) -> str:
    from linkguard.drivers.sysfs_ib import read_sysfs

    code = failing.get(path)
    if code is not None:
        raise OSError(code, os.strerror(code))
    return read_sysfs(path)


def _copy(src: Path, dst: Path) -> None:
    """Copy a file or a tree, contents only, writable (the fixtures are read-only)."""
    if src.is_dir():
        dst.mkdir(mode=0o755)
        for child in src.iterdir():
            _copy(child, dst / child.name)
    else:
        shutil.copyfile(src, dst)
        dst.chmod(0o644)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class SysfsTrees:
    """Writable copies of :data:`SYSFS_TREES` in a temporary directory; :meth:`run` mutates one,
    reads it as the agent does, checks the readings and restores the copy."""

    def __init__(self, fixtures: Path | None = None) -> None:
        fixtures = fixtures or fixtures_dir()
        self.base = Path(tempfile.mkdtemp(prefix="linkguard-fuzz-sysfs-"))
        self.sources: dict[str, Path] = {}
        #: per tree: every path under it (files and directories), relative, sorted
        self.paths: dict[str, list[str]] = {}
        #: per tree: the (hca, port) pairs of the pristine copy
        self.ports: dict[str, list[tuple[str, int]]] = {}
        for name, (rel, devices) in SYSFS_TREES.items():
            src = fixtures / rel
            root = self.base / name
            root.mkdir()
            for dev in devices:
                _copy(src / dev, root / dev)
            self.sources[name] = src
            self.paths[name] = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
            self.ports[name] = sorted(
                (dev, int(p.name)) for dev in devices for p in (root / dev / "ports").iterdir()
            )

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def run(self, tree: str, mutations: Sequence[tuple[str, str, Any]]) -> list[Any]:
        """Apply ``mutations`` (``(relative path, action, argument)``; actions
        :data:`SYSFS_ACTIONS`: ``write`` bytes, ``remove``, ``dir``, ``errno`` code) to
        ``tree``, read it (:func:`read_tree`) and restore it. Returns the observations."""
        root = self.base / tree
        failing: dict[str, int] = {}
        touched: list[str] = []
        try:
            for rel, action, arg in mutations:
                path = root / rel
                if action == "errno":
                    failing[str(path)] = int(arg)
                    continue
                if not path.parent.is_dir():
                    continue  # an earlier mutation removed its directory
                touched.append(rel)
                _remove(path)
                if action == "write":
                    path.write_bytes(arg)
                elif action == "dir":
                    path.mkdir()
            devices = {rel.split("/", 1)[0] for rel, _, _ in mutations}
            ports = [(hca, port) for hca, port in self.ports[tree] if hca in devices]
            reader = functools.partial(_failing_reader, failing)
            return read_tree(root, ports, reader, devices=devices)
        finally:
            for rel in touched:  # outermost first, so a restored parent holds its children
                path = root / rel
                if not any(rel.startswith(t + "/") for t in touched if t != rel):
                    _remove(path)
                    if (self.sources[tree] / rel).exists():
                        _copy(self.sources[tree] / rel, path)


def _check_observation(o: Any) -> None:
    from linkguard.models import LinkLayer, PhysState, PortStateName

    assert o.state is None or isinstance(o.state, PortStateName), o.state
    assert o.phys_state is None or isinstance(o.phys_state, PhysState), o.phys_state
    assert o.link_layer is None or isinstance(o.link_layer, LinkLayer), o.link_layer
    assert o.rate_gbps is None or (math.isfinite(o.rate_gbps) and o.rate_gbps >= 0), o.rate_gbps
    for name, value in o.counters.items():
        assert isinstance(name, str)
        assert value is None or 0 <= value <= 2**64 - 1, (name, value)
    assert all(isinstance(e, str) for e in o.errors)


def read_tree(
    root: Path,
    ports: Sequence[tuple[str, int]],
    reader: Callable[[str], str],
    *,
    devices: set[str] | None = None,
) -> list:
    """Read ``root`` as the agent's sysfs driver does (discovery, then every port it found and
    every port in ``ports``; only those of ``devices`` when given), check the readings, and run
    them through a port monitor: each state it publishes must decode at the service
    (``decode(PortState, encode(st)) == st``)."""
    from linkguard.agent.monitor import DampingPolicy, PortMonitor
    from linkguard.drivers.sysfs_ib import discover_hcas, read_port
    from linkguard.models import PortState, decode, encode

    descs = discover_hcas(root, reader=reader)
    keys = set(ports)
    for d in descs:
        assert all(isinstance(e, str) for e in d.errors)
        if devices is None or d.hca in devices:
            keys |= {(d.hca, p) for p in d.ports}
    netdevs = {(d.hca, p): n for d in descs for p, n in d.netdevs.items()}
    obs = [
        read_port(root, hca, port, now=1.0, reader=reader, netdev=netdevs.get((hca, port)))
        for hca, port in sorted(keys)
    ]
    for o in obs:
        _check_observation(o)
    mon = PortMonitor(
        host="fuzz-host",
        policy=DampingPolicy(),
        rails={f"{hca}/{port}": i % 64 for i, (hca, port) in enumerate(sorted(keys))},
    )
    out = mon.observe(obs, now=1.0, wall=1000.0)
    for st in [*out.states, *mon.snapshot(wall=1001.0)]:
        assert decode(PortState, encode(st)) == st, st
    return obs


@functools.cache
def sysfs_trees() -> SysfsTrees:
    """The process's :class:`SysfsTrees`, removed at exit."""
    trees = SysfsTrees()
    atexit.register(trees.close)
    return trees


def sysfs(data: bytes) -> None:
    """Byte 0: the tree; byte 1: 1-4 mutations, each a path, an action and its argument (a
    2-byte length and content for ``write``, an errno index for ``errno``)."""
    trees = sysfs_trees()
    b = _Bytes(data)
    tree = b.pick(list(SYSFS_TREES))
    paths = trees.paths[tree]
    mutations = []
    for _ in range(1 + b.byte() % 4):
        rel = paths[(b.byte() << 8 | b.byte()) % len(paths)]
        action = b.pick(SYSFS_ACTIONS)
        arg: Any = b""
        if action == "write":
            arg = b.chunk()
        elif action == "errno":
            arg = b.pick(SYSFS_ERRNOS)
        mutations.append((rel, action, arg))
    trees.run(tree, mutations)


def sysfs_input(tree: str, mutations: Sequence[tuple[str, str, Any]]) -> bytes:
    """The :func:`sysfs` input that applies ``mutations`` to ``tree`` (for seeds and tests)."""
    paths = sysfs_trees().paths[tree]
    out = bytes([list(SYSFS_TREES).index(tree), len(mutations) - 1])
    for rel, action, arg in mutations:
        out += paths.index(rel).to_bytes(2, "big") + bytes([SYSFS_ACTIONS.index(action)])
        if action == "write":
            out += _chunk(arg)
        elif action == "errno":
            out += bytes([SYSFS_ERRNOS.index(arg)])
    return out


def _sysfs_seeds() -> list[bytes]:
    trees = sysfs_trees()
    edits = {
        "state": [b"1: DOWN\n", b"4: ACTIVE", b"9: BOGUS\n", b"\xff\xfe"],
        "phys_state": [b"3: Disabled\n", b"7: Phy Test\n"],
        "rate": [b"0 GB/sec\n", b"2.5 Gb/sec (1X SDR)\n", b"10 Gb/sec (4X)\n"],
        "link_layer": [b"Ethernet\n", b"InfiniBand\n\n"],
        "link_downed": [b"255\n", b"18446744073709551615\n", b"N/A (no PMA)\n"],
        "numa_node": [b"-1\n"],
    }
    out = []
    for tree, paths in trees.paths.items():
        for rel in paths:
            for content in edits.get(rel.rsplit("/", 1)[-1], []):
                out.append(sysfs_input(tree, [(rel, "write", content)]))
        state = next(p for p in paths if p.endswith("ports/1/state"))
        out.append(sysfs_input(tree, [(state, "errno", errno.EIO)]))
        out.append(sysfs_input(tree, [(state.rsplit("/", 1)[0] + "/counters", "remove", b"")]))
    return out


# --------------------------------------------------------------------------------------------
# ibnetdiscover


def ibnetdiscover(data: bytes) -> None:
    """The bytes as a dump's text (undecodable bytes as U+FFFD, as the importer reads files)."""
    from linkguard.topology.fabric import Fabric
    from linkguard.topology.ibnetdiscover import FabricImportError, import_ibnetdiscover

    text = data.decode("utf-8", "replace")
    if "\n" not in text:
        text += "\n"  # a one-line string without a newline would be taken as a path
    try:
        result = import_ibnetdiscover(text, name="fuzz")
    except FabricImportError:
        return
    Fabric.model_validate(result.fabric.model_dump())


def _ibnetdiscover_seeds() -> list[bytes]:
    from linkguard.topology.export import to_ibnetdiscover
    from linkguard.topology.fabric import generate_rail_optimized

    fx = fixtures_dir()
    out = [(fx / "ltaulell-HPC_toolset" / "X5.topofile").read_bytes()]
    out += [p.read_bytes() for p in sorted((fx / "linux-rdma-ibsim").glob("net*"))]
    gen = generate_rail_optimized(hosts=4, rails=2, hosts_per_su=2, spines_per_su=1)
    out.append(to_ibnetdiscover(gen)[0].encode())
    return out


# --------------------------------------------------------------------------------------------
# nccl_topo

#: The real NCCL topology files (``aws-ofi-nccl/topology``, see SOURCES.md there).
NCCL_TOPO_FILES = ("aws-ofi-nccl/p4d-24xl-topo.xml", "aws-ofi-nccl/p5.48xl-topo.xml")

#: Unusable ports given to ``render_topology`` when the input does not parse as a layout: names
#: and a bus id of the real files, so that mutated files still have something to remove.
_FIXED_UNUSABLE = (("rdmap79s0", 1, None), ("mlx5_0", 1, None), ("nic", 1, "0000:10:1b.0"))


def _verdict(hca: str, port: int, bdf: str | None, usable: bool) -> Any:
    from linkguard.nccl import PortVerdict

    return PortVerdict(
        hca=hca,
        port=port,
        rail=0,
        link_layer="infiniband",
        numa_node=None,
        pcie_switch=None,
        pci_address=bdf,
        usable=usable,
        why=None if usable else "down",
        rate_gbps=None,
        expected_gbps=None,
    )


def nccl_topo(data: bytes) -> None:
    """The bytes as an NCCL topology file: parsed to a host layout, and rendered without the
    NICs the input's CRC-32 picks (bit i: NIC i unusable)."""
    import zlib

    import yaml

    from linkguard.layout import LayoutError, parse_nccl_topo
    from linkguard.layoutview import fabric_fragment, layout_document, layout_text
    from linkguard.nccl import TopologyFileError, render_topology

    try:
        layout = parse_nccl_topo(data, source="fuzz")
    except LayoutError:
        layout = None
    if layout is not None:
        for g in layout.gpus:
            near = layout.nearest_nics(g)
            assert sorted(n.index for n in near) == sorted(n.index for n in layout.nics)
            ranks = [layout.affinity(g, n) for n in near]
            assert ranks == sorted(ranks), ranks
        json.dumps(layout_document(layout))
        layout_text(layout)
        try:
            yaml.safe_dump(fabric_fragment(layout))
        except LayoutError:  # a GPU index beyond a fabric file's 64
            assert max(g.index for g in layout.gpus) >= 64
        mask = zlib.crc32(data)
        verdicts = [
            _verdict(n.name or "nic", n.port or 1, n.bdf, not (mask >> (i % 32)) & 1)
            for i, n in enumerate(layout.nics)
        ]
    else:
        verdicts = [_verdict(h, p, b, False) for h, p, b in _FIXED_UNUSABLE]
    try:
        out = render_topology(data, verdicts, name="fuzz")
    except TopologyFileError:
        return
    again = render_topology(out.xml, [], name="rendered")  # what we write, we read
    assert again.removed == () and again.nics == out.nics, (again.nics, out.nics)
    if layout is not None:
        try:
            after = parse_nccl_topo(out.xml, source="rendered")
        except LayoutError as exc:
            raise AssertionError(f"a parsed file no longer parses once rendered: {exc}") from None
        assert [g.bdf for g in after.gpus] == [g.bdf for g in layout.gpus]
        before = {(n.name, n.port, n.bdf) for n in layout.nics}
        assert {(n.name, n.port, n.bdf) for n in after.nics} <= before


def _nccl_topo_seeds() -> list[bytes]:
    fx = fixtures_dir()
    return [(fx / name).read_bytes() for name in NCCL_TOPO_FILES]


# --------------------------------------------------------------------------------------------
# scenario


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="linkguard-fuzz-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@contextmanager
def _small_fabrics() -> Iterator[None]:
    from linkguard.simulations import scenario_schema as mod  # GenerateSpec reads it there

    saved = mod.MAX_HOST_PORTS
    mod.MAX_HOST_PORTS = FUZZ_MAX_HOST_PORTS
    try:
        yield
    finally:
        mod.MAX_HOST_PORTS = saved


def scenario(data: bytes) -> None:
    """The bytes as a scenario file (next to a small fabric file, ``fabric.yaml``)."""
    from linkguard.simulations.scenario import ScenarioError, expand, load_scenario, summary_text

    work = _workdir() / "scenario"
    if not work.is_dir():
        work.mkdir()
        (work / "fabric.yaml").write_text(_fabric_yaml())
    path = work / "fuzz.yaml"
    path.write_bytes(data)
    with _small_fabrics():
        try:
            loaded = load_scenario(path)
        except ScenarioError:
            return
    summary_text(loaded, expand(loaded))


def _fabric_yaml() -> str:
    from linkguard.topology.fabric import dump_fabric
    from linkguard.topology.generator import generate_rail_optimized

    return dump_fabric(generate_rail_optimized(hosts=4, rails=2, hosts_per_su=4), "yaml")


def _scenario_seeds() -> list[bytes]:
    from linkguard.simulations.scenario import shipped_scenarios

    out = [p.read_bytes() for p in shipped_scenarios()]
    out.append(
        b"schema: linkguard.scenario/v1\nname: from-file\ndescription: a fabric file\n"
        b"fabric: {file: fabric.yaml}\nduration_s: 10\n"
        b"timeline:\n  - {at_s: 1, kind: link_down, host: gpu001, rail: 1}\n"
        b"  - {at_s: 4, kind: link_up, host: gpu001, rail: 1}\n"
    )
    return out


# --------------------------------------------------------------------------------------------
# config


@contextmanager
def linkguard_env(env: dict[str, str]) -> Iterator[None]:
    """Replace every ``LINKGUARD_*`` variable by ``env`` for the block (names and values with
    NUL or a ``=`` in the name cannot be in an environment: skipped)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("LINKGUARD_")}
    for k in saved:
        del os.environ[k]
    try:
        for k, v in env.items():
            if k and "=" not in k and "\0" not in k + v:
                os.environ[k] = v
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("LINKGUARD_")]:
            del os.environ[k]
        os.environ.update(saved)


def config(data: bytes) -> None:
    """Byte 0: agent (even) or service settings, and whether there is a file (< 128); then the
    YAML file up to the first NUL; then ``NAME=value`` lines for the environment (``LINKGUARD_``
    added to names that lack it)."""
    from linkguard.config import AgentSettings, ConfigError, ServiceSettings, load_settings

    if not data:
        return
    cls = AgentSettings if data[0] % 2 == 0 else ServiceSettings
    text, _, env_part = data[1:].partition(b"\0")
    env = {}
    for line in env_part.decode("utf-8", "replace").splitlines():
        name, _, value = line.partition("=")
        name = name.strip()
        if name:
            env[name if name.startswith("LINKGUARD_") else f"LINKGUARD_{name}"] = value
    path = None
    if data[0] < 128:
        path = _workdir() / "config.yaml"
        path.write_bytes(text)
    with linkguard_env(env):
        try:
            load_settings(cls, path)
        except ConfigError:
            return


def _config_seeds() -> list[bytes]:
    import yaml

    from linkguard.agent.monitor import DampingPolicy
    from linkguard.config import BusSettings, ServiceSettings
    from linkguard.simulations.fleet import agent_settings_for

    sample = samples()
    agent = agent_settings_for(
        sample["fabric"],
        "gpu000",
        bus=BusSettings(port=1884),
        workdir=Path("/var/lib/linkguard"),
        damping=DampingPolicy(hold_down_initial_s=2),
    )
    agent_doc = yaml.safe_dump(agent.model_dump(mode="json", exclude_defaults=True)).encode()
    service_doc = yaml.safe_dump(
        ServiceSettings(solve={"short_ms": 50}, generate={"hosts": 4, "rails": 2}).model_dump(
            mode="json", exclude_defaults=True
        )
    ).encode()
    return [
        b"\0" + agent_doc,
        b"\1" + service_doc,
        b"\0" + agent_doc + b"\0BUS__PORT=1885\nPOLL_INTERVAL_MS=20\n",
        b'\x81\0ENDPOINTS=["10.200.3.1"]\nHOST=gpu007\nMETRICS_LISTEN=[::1]:9477\n',
        b"\x80\0DAMPING__MODE=penalty\nSHUTDOWN_POLICY=withdraw\n",
        b"\1log_level: debug\napi: {port: 0, token: 0123456789abcdef}\nledger: {path: l.db}\n",
    ]


# --------------------------------------------------------------------------------------------
# bus


def bus(data: bytes) -> None:
    """Byte 0: the topic (low 7 bits: :attr:`fuzz.live.LiveFleet.topics`; one past the list: a
    topic made of a 2-byte-length chunk) and whether the payload is sealed with the service's
    key (>= 128); the rest is the payload, delivered to the live (signed) fleet."""
    from fuzz.live import live_fleet

    fleet = live_fleet()
    b = _Bytes(data)
    first = b.byte()
    i = (first & 0x7F) % (len(fleet.topics) + 1)
    if i < len(fleet.topics):
        topic = fleet.topics[i]
    else:
        text = b.chunk().decode("utf-8", "replace")
        # MQTT: no wildcards in a publish topic, no U+0000 anywhere (MQTT 3.1.1, 4.7.3)
        topic = "linkguard/v1/" + text.translate({ord("+"): None, ord("#"): None, 0: None})
    fleet.deliver(topic, b.rest(), seal=first >= 0x80)


def _bus_seeds() -> list[bytes]:
    from fuzz.live import TOPIC_MODELS
    from linkguard import topics
    from linkguard.models import encode

    out = []
    for i, kind in enumerate(TOPIC_MODELS.values()):
        for msg in samples()["messages"].get(kind, []) if kind else []:
            out.append(bytes([i]) + encode(msg))
            if kind in ("plan", "peers"):
                out.append(bytes([i | 0x80]) + encode(msg))  # sealed by the service's key
        out.append(bytes([i]) + b"{}")
    port = topics.port_state("gpu000", "mlx5_0", 1).removeprefix("linkguard/v1/").encode()
    out.append(bytes([len(TOPIC_MODELS)]) + _chunk(port) + json.dumps({"host": "x"}).encode())
    return out


# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One fuzz target: its function and its seed corpus (built on demand)."""

    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    doc: str


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("decoders", decoders, _decoder_seeds, "every bus message model: models.decode"),
        Target("envelopes", envelopes, _envelope_seeds, "signed plans: signing.unwrap"),
        Target("sysfs", sysfs, _sysfs_seeds, "drivers.sysfs_ib on mutated real sysfs trees"),
        Target("ibnetdiscover", ibnetdiscover, _ibnetdiscover_seeds, "ibnetdiscover import"),
        Target("nccl_topo", nccl_topo, _nccl_topo_seeds, "NCCL topology XML: parse + render"),
        Target("scenario", scenario, _scenario_seeds, "scenario files: load_scenario + expand"),
        Target("config", config, _config_seeds, "agent/service settings: YAML + environment"),
        Target("bus", bus, _bus_seeds, "a live service and two agents on an in-memory bus"),
    )
}


def seeds(name: str) -> list[bytes]:
    """The seed corpus of target ``name``."""
    return TARGETS[name].seeds()
