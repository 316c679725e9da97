"""A small rail-optimized fabric built from network namespaces, where the real kernel forwards.

Shape (DESIGN.md, "A lab on one machine")::

    <prefix>h<H>  one namespace per host: lo up with one /32 endpoint per GPU
                  (host h, GPU g -> 10.200.h.(g+1); rail-major: 10.200.(128+g%R).(h+1)
                  for one GPU per rail), one veth per rail named ``rail<r>``
                  with 10.100.r.(h+1)/24; rp_filter=0 (all, default, every interface)
    <prefix>fab   the fabric: one Linux bridge per rail (``leaf<r>``, the rail-r leaf) with the
                  fabric ends of the rail-r veths (``h<h>r<r>``) enslaved to it

:meth:`Lab.from_fabric` builds the same from a fabric model (generated, rail-optimized): its host
names, HCA addresses, endpoints and netdevs; one leaf bridge per leaf switch (``l<su>r<rail>``)
and, when a rail has several leaves (several SUs), one spine bridge per rail (``sp<rail>``)
joined to each of that rail's leaves by one veth (``l<su>r<rail>u`` on the leaf,
``l<su>r<rail>d`` on the spine): a tree, no L2 loop. The spine bridge stands for the whole
spine layer of its rail; :meth:`Lab.uplink_down` cuts a leaf off it. With ``management=True``
it adds a management network beside the fabric: a bridge ``mgmt`` in the fabric namespace and
one veth per host (``mgmt0``, 10.99.0.(h+1)/24; :meth:`Lab.management_address`), on no rail and
cut by no fault, as the frontend Ethernet of a real cluster that carries a job's rendezvous.

The main table of a host starts with only the connected /24s: no routes to peer endpoints
(putting them in is linkguard's job). Both ends of every veth get explicit, distinct ifindexes
(host end ``10 + r``, fabric end ``1000 + h * rails + r``): with equal ifindexes carrier-down
reaches the other end about 1 s late (measured here: ~1000 ms vs ~3 ms).

The kernel's ARP table is shared by all namespaces and capped by
``net.ipv4.neigh.default.gc_thresh3`` (1024): a lab raises the cap to what its hosts may need
(hosts^2 x (GPUs + rails)) while it exists, or ARP fails past the cap ("neighbor table
overflow").

Built with ``ip`` (iproute2) subprocess calls: each step is one readable command, and a
failure names the command and its stderr. Needs root. ``destroy()`` removes every namespace the
lab made (which removes its veths and bridges), also after a partial ``create``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import secrets
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from linkguard.topology.fabric import Fabric

__all__ = [
    "Lab",
    "LabError",
    "LabHost",
    "LabRail",
    "endpoint_address",
    "rail_address",
    "rail_major_endpoint",
]

log = structlog.get_logger(__name__)

#: Limits of the address plan: 10.100.<rail>.<host+1> and 10.200.<host>.<gpu+1>.
MAX_HOSTS = 200
MAX_RAILS = 64
MAX_GPUS = 64
HOST_IFINDEX_BASE = 10
FABRIC_IFINDEX_BASE = 1000
#: The management network (``management=True``): subnet, host-end netdev and ifindexes (host
#: end 9, below the rails' 10 + r; fabric end ``m<h>`` 60000 + h, above every rail port's).
MGMT_SUBNET = ipaddress.IPv4Network("10.99.0.0/24")
MGMT_NETDEV = "mgmt0"
MGMT_HOST_IFINDEX = 9
MGMT_FABRIC_IFINDEX_BASE = 60000


class LabError(RuntimeError):
    """An ``ip`` command failed while building or changing the lab (message has its stderr)."""


def endpoint_address(host: int, gpu: int) -> IPv4Address:
    """The /32 endpoint of GPU ``gpu`` on host ``host``: 10.200.host.(gpu+1)."""
    return IPv4Address(f"10.200.{host}.{gpu + 1}")


#: Rail-major endpoints: rail r's endpoint subnet is 10.200.(RAIL_MAJOR_BASE + r).0/24.
RAIL_MAJOR_BASE = 128


def rail_major_endpoint(host: int, gpu: int, rails: int, gpus: int) -> IPv4Address:
    """GPU ``gpu`` of host ``host`` with rail-major addressing: home rail r = gpu % rails, rank
    j = gpu // rails, k = GPUs per rail and host -> 10.200.(128 + r).(host * k + j + 1)."""
    k = -(-gpus // rails)
    r, j = gpu % rails, gpu // rails
    return IPv4Address(f"10.200.{RAIL_MAJOR_BASE + r}.{host * k + j + 1}")


def rail_address(host: int, rail: int) -> IPv4Address:
    """Host ``host``'s address on rail ``rail`` (subnet 10.100.rail.0/24): 10.100.rail.(host+1)."""
    return IPv4Address(f"10.100.{rail}.{host + 1}")


@dataclass(frozen=True)
class LabRail:
    """One rail NIC of a lab host: ``netdev`` in the host namespace, ``fabric_port`` its peer
    veth end in the fabric namespace (a port of bridge ``leaf<rail>``)."""

    rail: int
    netdev: str
    address: IPv4Address
    fabric_port: str
    prefixlen: int = 24
    leaf: str = ""

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The rail's subnet (a /24 in :meth:`Lab.create` labs)."""
        return ipaddress.IPv4Network(f"{self.address}/{self.prefixlen}", strict=False)


@dataclass(frozen=True)
class LabHost:
    """One lab host: its namespace, its GPUs' endpoints (index = GPU) and its rails."""

    name: str
    netns: str
    endpoints: list[IPv4Address]
    rails: list[LabRail]


@dataclass(frozen=True)
class _PortSpec:
    rail: int
    netdev: str
    address: IPv4Address
    prefixlen: int
    leaf: str  # leaf switch name (a key of Lab.leaves)


@dataclass(frozen=True)
class _HostSpec:
    name: str
    endpoints: list[IPv4Address]
    ports: list[_PortSpec]


def _check_prefix(prefix: str) -> None:
    if not prefix.replace("-", "").isalnum() or len(prefix) > 40:
        raise ValueError(f"bad namespace prefix {prefix!r}")


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ip_json(*args: str) -> list[dict[str, Any]]:
    return json.loads(_run(["ip", "-j", *args]).stdout or "[]")


@dataclass
class Lab:
    """A built lab. Use :meth:`create`; tear down with :meth:`destroy` or ``with``."""

    prefix: str
    fabric_netns: str
    rails: int
    gpus_per_host: int
    hosts: list[LabHost] = field(default_factory=list)
    #: every namespace this lab created (or tried to), in creation order
    namespaces: list[str] = field(default_factory=list)
    #: rail -> endpoint subnet with ``rail_major`` addressing, else empty
    endpoint_subnets: dict[int, ipaddress.IPv4Network] = field(default_factory=dict)
    #: leaf name -> its bridge in :attr:`fabric_netns` (``leaf<r>`` in :meth:`create` labs)
    leaves: dict[str, str] = field(default_factory=dict)
    #: leaf name -> the leaf end of its uplink veth to its rail's spine bridge (multi-SU only)
    uplinks: dict[str, str] = field(default_factory=dict)
    #: host name -> its address on the management network (empty: none built)
    management: dict[str, IPv4Address] = field(default_factory=dict)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)
    _neigh_restore: list[tuple[Path, int, int]] = field(default_factory=list, repr=False)

    # -- building -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        hosts: int,
        rails: int,
        gpus_per_host: int | None = None,
        prefix: str | None = None,
        rail_major: bool = False,
    ) -> Lab:
        """Build ``hosts`` host namespaces with ``rails`` rails each and one fabric namespace.

        ``gpus_per_host`` defaults to ``rails``. ``rail_major``: endpoints are addressed per
        home rail (:func:`rail_major_endpoint`; :attr:`endpoint_subnets` lists the subnets), so
        a fabric built on the lab gets prefix-route plans. ``prefix`` names the namespaces
        (``<prefix>h0``, ..., ``<prefix>fab``); default ``lg`` + 6 random hex digits, unique per
        run. Raises ValueError for a shape outside the address plan and :class:`LabError` when
        a command fails (everything created so far is removed first).
        """
        gpus = rails if gpus_per_host is None else gpus_per_host
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts must be 1..{MAX_HOSTS}, got {hosts}")
        if not 1 <= rails <= MAX_RAILS:
            raise ValueError(f"rails must be 1..{MAX_RAILS}, got {rails}")
        if not 0 <= gpus <= MAX_GPUS:
            raise ValueError(f"gpus_per_host must be 0..{MAX_GPUS}, got {gpus}")
        prefix = prefix or f"lg{secrets.token_hex(3)}"
        _check_prefix(prefix)
        if rail_major and (hosts * -(-gpus // rails) > 254 or rails > 127):
            raise ValueError("rail-major lab addresses fit 254 endpoints per rail, 127 rails")
        lab = cls(prefix=prefix, fabric_netns=f"{prefix}fab", rails=rails, gpus_per_host=gpus)
        if rail_major:
            lab.endpoint_subnets = {
                r: ipaddress.IPv4Network(f"10.200.{RAIL_MAJOR_BASE + r}.0/24") for r in range(rails)
            }
        specs = []
        for h in range(hosts):
            endpoints = [
                rail_major_endpoint(h, g, rails, gpus) if rail_major else endpoint_address(h, g)
                for g in range(gpus)
            ]
            ports = [
                _PortSpec(r, f"rail{r}", rail_address(h, r), 24, f"leaf{r}") for r in range(rails)
            ]
            specs.append(_HostSpec(f"host{h}", endpoints, ports))
        lab.leaves = {f"leaf{r}": f"leaf{r}" for r in range(rails)}
        lab._create(specs, spines={})
        return lab

    @classmethod
    def from_fabric(
        cls, fabric: Fabric, *, prefix: str | None = None, management: bool = False
    ) -> Lab:
        """Build the lab of ``fabric`` (module docstring): its hosts with their names, HCA
        addresses (prefix length from ``rail_subnets``, else /24), netdevs and endpoints
        (:attr:`endpoint_subnets` = the fabric's), its leaves, and a spine bridge per rail
        that has several leaves; with ``management`` also the management network (module
        docstring). Raises ValueError when the fabric does not fit a lab: more
        than :data:`MAX_HOSTS` hosts or :data:`MAX_RAILS` rails, an HCA without address or
        netdev, a host port not cabled to a leaf; :class:`LabError` when a command fails
        (everything created so far is removed first)."""
        if len(fabric.hosts) > MAX_HOSTS:
            raise ValueError(
                f"a lab holds at most {MAX_HOSTS} hosts, the fabric has {len(fabric.hosts)}"
            )
        if len(fabric.rails) > MAX_RAILS:
            raise ValueError(
                f"a lab holds at most {MAX_RAILS} rails, the fabric has {len(fabric.rails)}"
            )
        leaf_of: dict[str, str] = {}
        for link in fabric.links:
            if link.kind == "host-leaf":
                port, leaf = (link.a, link.b) if ":" in link.a else (link.b, link.a)
                leaf_of[port] = leaf
        switches = {s.name: s for s in fabric.switches if s.role == "leaf"}
        bridges: dict[str, str] = {}
        for i, name in enumerate(sorted(switches)):
            sw = switches[name]
            bridges[name] = (
                f"l{sw.su}r{sw.rail}" if sw.su is not None and sw.rail is not None else f"lf{i}"
            )
        specs = []
        for inv in fabric.hosts:
            ports = []
            for c in inv.hcas:
                if c.address is None or not c.netdev:
                    raise ValueError(
                        f"{inv.host} {c.hca}: a lab port needs an address and a netdev"
                    )
                port_leaf = leaf_of.get(f"{inv.host}:{c.key}")
                if port_leaf is None or port_leaf not in bridges:
                    raise ValueError(f"{inv.host} {c.hca}/{c.port} is not cabled to a leaf")
                net = fabric.rail_subnets.get(c.rail)
                plen = net.prefixlen if net is not None else 24
                ports.append(_PortSpec(c.rail, c.netdev, c.address, plen, port_leaf))
            specs.append(_HostSpec(inv.host, list(inv.endpoints), ports))
        by_rail: dict[int, list[str]] = {}
        for name in sorted(switches):
            sw_rail = switches[name].rail
            if sw_rail is not None:
                by_rail.setdefault(sw_rail, []).append(name)
        spines = {r: leaves for r, leaves in by_rail.items() if len(leaves) > 1}
        prefix = prefix or f"lg{secrets.token_hex(3)}"
        _check_prefix(prefix)
        lab = cls(
            prefix=prefix,
            fabric_netns=f"{prefix}fab",
            rails=max(fabric.rails) + 1,
            gpus_per_host=max(len(h.endpoints) for h in fabric.hosts),
        )
        lab.endpoint_subnets = dict(fabric.endpoint_subnets)
        lab.leaves = bridges
        lab._create(specs, spines=spines, management=management)
        return lab

    def _create(
        self, specs: list[_HostSpec], *, spines: dict[int, list[str]], management: bool = False
    ) -> None:
        started = time.monotonic()
        try:
            n = len(specs)
            self._raise_neigh_limit(n * n * (self.gpus_per_host + self.rails + management))
            self._build(specs, spines)
            if management:
                self._build_management()
        except BaseException:
            self.destroy()
            raise
        log.info(
            "lab_created",
            prefix=self.prefix,
            hosts=len(specs),
            rails=self.rails,
            gpus_per_host=self.gpus_per_host,
            leaves=len(self.leaves),
            spines=len(spines),
            ms=round((time.monotonic() - started) * 1000, 1),
        )

    def _raise_neigh_limit(self, need: int) -> None:
        """The kernel's ARP table is one table for all namespaces, limited by
        ``net.ipv4.neigh.default.gc_thresh3`` (1024 by default): a lab of 16 hosts whose
        peers resolve each other's endpoints on several rails needs more, and past the limit
        ARP silently fails ("neighbor table overflow"). Raise gc_thresh2/3 to ``need`` when
        they are below it; :meth:`destroy` puts the old values back (unless someone changed
        them meanwhile)."""
        for key in ("gc_thresh2", "gc_thresh3"):
            path = Path(f"/proc/sys/net/ipv4/neigh/default/{key}")
            try:
                old = int(path.read_text())
                if old < need:
                    path.write_text(f"{need}\n")
                    self._neigh_restore.append((path, old, need))
                    log.info("lab_neigh_limit_raised", key=key, old=old, new=need)
            except (OSError, ValueError) as exc:
                log.warning("lab_neigh_limit_unchanged", key=key, error=str(exc))

    def _restore_neigh_limit(self) -> None:
        for path, old, mine in reversed(self._neigh_restore):
            with contextlib.suppress(OSError, ValueError):
                if int(path.read_text()) == mine:
                    path.write_text(f"{old}\n")
        self._neigh_restore.clear()

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _build(self, specs: list[_HostSpec], spines: dict[int, list[str]]) -> None:
        fab = self.fabric_netns
        self._add_netns(fab)
        for bridge in self.leaves.values():
            _run(["ip", "-n", fab, "link", "add", bridge, "type", "bridge"])
            _run(["ip", "-n", fab, "link", "set", bridge, "up"])
        for rail, leaves in sorted(spines.items()):
            spine = f"sp{rail}"
            _run(["ip", "-n", fab, "link", "add", spine, "type", "bridge"])
            _run(["ip", "-n", fab, "link", "set", spine, "up"])
            for leaf in leaves:
                up, down = f"{self.leaves[leaf]}u", f"{self.leaves[leaf]}d"
                _run(["ip", "-n", fab, "link", "add", up, "type", "veth", "peer", "name", down])
                _run(["ip", "-n", fab, "link", "set", up, "master", self.leaves[leaf], "up"])
                _run(["ip", "-n", fab, "link", "set", down, "master", spine, "up"])
                self.uplinks[leaf] = up
        for h, spec in enumerate(specs):
            ns = f"{self.prefix}h{h}"
            self._add_netns(ns)
            # before the veths exist, so they inherit it from "default" as well
            self._sysctl(ns, ["all", "default", "lo"])
            for ep in spec.endpoints:
                _run(["ip", "-n", ns, "addr", "add", f"{ep}/32", "dev", "lo"])
            lab_rails = []
            for p in spec.ports:
                port = f"h{h}r{p.rail}"
                _run(
                    [
                        "ip", "-n", ns, "link", "add", p.netdev,
                        "index", str(HOST_IFINDEX_BASE + p.rail),
                        "type", "veth", "peer", "name", port, "netns", fab,
                        "index", str(FABRIC_IFINDEX_BASE + h * self.rails + p.rail),
                    ]
                )  # fmt: skip
                _run(["ip", "-n", fab, "link", "set", port, "master", self.leaves[p.leaf], "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{p.address}/{p.prefixlen}", "dev", p.netdev])
                _run(["ip", "-n", ns, "link", "set", p.netdev, "up"])
                lab_rails.append(
                    LabRail(
                        rail=p.rail,
                        netdev=p.netdev,
                        address=p.address,
                        fabric_port=port,
                        prefixlen=p.prefixlen,
                        leaf=p.leaf,
                    )
                )
            self._sysctl(ns, [lr.netdev for lr in lab_rails])
            self.hosts.append(
                LabHost(name=spec.name, netns=ns, endpoints=list(spec.endpoints), rails=lab_rails)
            )
        self._check_ifindexes()

    def _build_management(self) -> None:
        fab = self.fabric_netns  # MAX_HOSTS (200) fits the /24
        _run(["ip", "-n", fab, "link", "add", "mgmt", "type", "bridge"])
        _run(["ip", "-n", fab, "link", "set", "mgmt", "up"])
        for h, host in enumerate(self.hosts):
            ns, port = host.netns, f"m{h}"
            addr = MGMT_SUBNET.network_address + h + 1
            _run(
                [
                    "ip", "-n", ns, "link", "add", MGMT_NETDEV, "index", str(MGMT_HOST_IFINDEX),
                    "type", "veth", "peer", "name", port, "netns", fab,
                    "index", str(MGMT_FABRIC_IFINDEX_BASE + h),
                ]
            )  # fmt: skip
            _run(["ip", "-n", fab, "link", "set", port, "master", "mgmt", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/{MGMT_SUBNET.prefixlen}", "dev",
                  MGMT_NETDEV])  # fmt: skip
            _run(["ip", "-n", ns, "link", "set", MGMT_NETDEV, "up"])
            self.management[host.name] = addr

    def management_address(self, host: int | str) -> IPv4Address:
        """``host``'s address on the management network; KeyError when the lab has none."""
        return self.management[self.host(host).name]

    def _check_ifindexes(self) -> None:
        """Both ends of every veth are peers of each other and have distinct ifindexes."""
        fabric = {link["ifname"]: link for link in _ip_json("-n", self.fabric_netns, "link")}
        for host in self.hosts:
            links = {link["ifname"]: link for link in _ip_json("-n", host.netns, "link")}
            for rail in host.rails:
                a, b = links[rail.netdev], fabric[rail.fabric_port]
                if a["ifindex"] == b["ifindex"] or a.get("link_index") != b["ifindex"]:
                    raise LabError(f"veth {host.netns}/{rail.netdev}: bad ifindexes {a} {b}")

    @staticmethod
    def _sysctl(netns: str, ifaces: Sequence[str]) -> None:
        keys = [f"net.ipv4.conf.{i}.rp_filter=0" for i in ifaces]
        _run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", *keys])

    # -- queries and faults ---------------------------------------------------------------

    def host(self, host: int | str) -> LabHost:
        """A host by index or by name (``host0``)."""
        if isinstance(host, int):
            return self.hosts[host]
        for h in self.hosts:
            if host in (h.name, h.netns):
                return h
        raise KeyError(host)

    def rail(self, host: int | str, rail: int) -> LabRail:
        """The :class:`LabRail` of ``rail`` on ``host``; KeyError when it has none."""
        for lr in self.host(host).rails:
            if lr.rail == rail:
                return lr
        raise KeyError((host, rail))

    def fabric_port(self, host: int | str, rail: int) -> str:
        """Name of the fabric-side veth end of (host, rail), in :attr:`fabric_netns`."""
        return self.rail(host, rail).fabric_port

    def set_links(self, changes: Sequence[tuple[str, bool]]) -> None:
        """Set fabric-namespace links (names: :meth:`fabric_port`, :attr:`uplinks` values)
        down (False) or up (True), all in one ``ip -batch`` call. Raises :class:`LabError`."""
        if not changes:
            return
        script = "".join(f"link set {n} {'up' if up else 'down'}\n" for n, up in changes)
        proc = subprocess.run(
            ["ip", "-n", self.fabric_netns, "-batch", "-"],
            input=script,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if proc.returncode != 0:
            raise LabError(f"`ip -batch` ({script.strip()!r}) failed: {proc.stderr.strip()}")

    def uplink_down(self, leaf: str) -> None:
        """Cut ``leaf`` (a leaf switch name) off its rail's spine bridge: traffic between its
        hosts and other leaves' hosts stops, traffic through the leaf itself still flows.
        KeyError when the lab has no spine for it (a single-SU rail)."""
        self.set_links([(self.uplinks[leaf], False)])

    def uplink_up(self, leaf: str) -> None:
        """Undo :meth:`uplink_down`."""
        self.set_links([(self.uplinks[leaf], True)])

    def link_down(self, host: int | str, rail: int) -> None:
        """Set the fabric end of (host, rail) down: the host's ``rail<r>`` loses carrier
        (IFF_LOWER_UP clears; its admin state stays up)."""
        _run(["ip", "-n", self.fabric_netns, "link", "set", self.fabric_port(host, rail), "down"])

    def link_up(self, host: int | str, rail: int) -> None:
        """Undo :meth:`link_down`: carrier returns on the host's ``rail<r>``."""
        _run(["ip", "-n", self.fabric_netns, "link", "set", self.fabric_port(host, rail), "up"])

    def exec(self, host: int | str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the host's namespace (``ip netns exec``). Extra keyword
        arguments go to :class:`subprocess.Popen`. The lab kills it on :meth:`destroy` if it
        is still running."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.host(host).netns, *argv], **popen)
        self._procs.append(proc)
        return proc

    def ifindex(self, netns: str, netdev: str) -> int:
        """ifindex of ``netdev`` in ``netns`` (from sysfs seen through ``ip netns exec``)."""
        out = _run(["ip", "-n", netns, "-o", "link", "show", "dev", netdev]).stdout
        return int(out.split(":", 1)[0])

    # -- teardown -------------------------------------------------------------------------

    def destroy(self) -> None:
        """Kill processes started with :meth:`exec` and delete every namespace of the lab
        (their veths and bridges go with them). Safe to call twice and after a partial
        create; never raises for something already gone."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        for ns in reversed(self.namespaces):
            res = _run(["ip", "netns", "del", ns], check=False)
            if res.returncode != 0 and "No such file" not in res.stderr:
                log.warning("lab_netns_delete_failed", netns=ns, stderr=res.stderr.strip())
        self.namespaces.clear()
        self._restore_neigh_limit()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
