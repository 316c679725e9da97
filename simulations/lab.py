"""A small rail-optimized fabric built from network namespaces, where the real kernel forwards.

Shape (DESIGN.md, "A lab on one machine")::

    <prefix>h<H>  one namespace per host: lo up with one /32 endpoint per GPU
                  (host h, GPU g -> 10.200.h.(g+1); rail-major: 10.200.(128+g%R).(h+1)
                  for one GPU per rail), one veth per rail named ``rail<r>``
                  with 10.100.r.(h+1)/24; rp_filter=0 (all, default, every interface)
    <prefix>fab   the fabric: one Linux bridge per rail (``leaf<r>``, the rail-r leaf) with the
                  fabric ends of the rail-r veths (``h<h>r<r>``) enslaved to it

The main table of a host starts with only the connected /24s: no routes to peer endpoints
(putting them in is linkguard's job). Both ends of every veth get explicit, distinct ifindexes
(host end ``10 + r``, fabric end ``1000 + h * rails + r``): with equal ifindexes carrier-down
reaches the other end about 1 s late (measured here: ~1000 ms vs ~3 ms).

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
from typing import Any

import structlog

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

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The rail's /24."""
        return ipaddress.IPv4Network(f"{self.address}/24", strict=False)


@dataclass(frozen=True)
class LabHost:
    """One lab host: its namespace, its GPUs' endpoints (index = GPU) and its rails."""

    name: str
    netns: str
    endpoints: list[IPv4Address]
    rails: list[LabRail]


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
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

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
        if not prefix.replace("-", "").isalnum() or len(prefix) > 40:
            raise ValueError(f"bad namespace prefix {prefix!r}")
        if rail_major and (hosts * -(-gpus // rails) > 254 or rails > 127):
            raise ValueError("rail-major lab addresses fit 254 endpoints per rail, 127 rails")
        lab = cls(prefix=prefix, fabric_netns=f"{prefix}fab", rails=rails, gpus_per_host=gpus)
        if rail_major:
            lab.endpoint_subnets = {
                r: ipaddress.IPv4Network(f"10.200.{RAIL_MAJOR_BASE + r}.0/24") for r in range(rails)
            }
        started = time.monotonic()
        try:
            lab._build(hosts)
        except BaseException:
            lab.destroy()
            raise
        log.info(
            "lab_created",
            prefix=prefix,
            hosts=hosts,
            rails=rails,
            gpus_per_host=gpus,
            ms=round((time.monotonic() - started) * 1000, 1),
        )
        return lab

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _build(self, hosts: int) -> None:
        fab = self.fabric_netns
        self._add_netns(fab)
        for r in range(self.rails):
            _run(["ip", "-n", fab, "link", "add", f"leaf{r}", "type", "bridge"])
            _run(["ip", "-n", fab, "link", "set", f"leaf{r}", "up"])
        for h in range(hosts):
            ns = f"{self.prefix}h{h}"
            self._add_netns(ns)
            # before the veths exist, so they inherit it from "default" as well
            self._sysctl(ns, ["all", "default", "lo"])
            g_n = self.gpus_per_host
            endpoints = [
                rail_major_endpoint(h, g, self.rails, g_n)
                if self.endpoint_subnets
                else endpoint_address(h, g)
                for g in range(g_n)
            ]
            for ep in endpoints:
                _run(["ip", "-n", ns, "addr", "add", f"{ep}/32", "dev", "lo"])
            lab_rails = []
            for r in range(self.rails):
                netdev, port = f"rail{r}", f"h{h}r{r}"
                _run(
                    [
                        "ip", "-n", ns, "link", "add", netdev,
                        "index", str(HOST_IFINDEX_BASE + r),
                        "type", "veth", "peer", "name", port, "netns", fab,
                        "index", str(FABRIC_IFINDEX_BASE + h * self.rails + r),
                    ]
                )  # fmt: skip
                _run(["ip", "-n", fab, "link", "set", port, "master", f"leaf{r}", "up"])
                addr = rail_address(h, r)
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", netdev])
                _run(["ip", "-n", ns, "link", "set", netdev, "up"])
                lab_rails.append(LabRail(rail=r, netdev=netdev, address=addr, fabric_port=port))
            self._sysctl(ns, [lr.netdev for lr in lab_rails])
            self.hosts.append(
                LabHost(name=f"host{h}", netns=ns, endpoints=endpoints, rails=lab_rails)
            )
        self._check_ifindexes()

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

    def fabric_port(self, host: int | str, rail: int) -> str:
        """Name of the fabric-side veth end of (host, rail), in :attr:`fabric_netns`."""
        return self.host(host).rails[rail].fabric_port

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
            proc = _run(["ip", "netns", "del", ns], check=False)
            if proc.returncode != 0 and "No such file" not in proc.stderr:
                log.warning("lab_netns_delete_failed", netns=ns, stderr=proc.stderr.strip())
        self.namespaces.clear()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
