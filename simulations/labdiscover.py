"""The lab on a discovered fabric (``linkguard sim lab --discover``): real lldpd in every host
namespace and one per leaf bridge in the fabric namespace, the agents' discovery documents on
the bus (their LLDP neighbours read with ``lldpctl``), and the topology service on
``fabric: {discover: {lldp: true}}`` instead of the generated fabric file.

Consumes: a built :class:`~linkguard.simulations.lab.Lab` and the fabric it was built from.
Produces: the running lldpd daemons (:class:`LldpdSet`), the service and agent settings that
discover, and after start the check that the fabric discovery makes from the documents on the
bus is the lab's (:func:`compare_discovered`).

lldpd (1.0.x, Debian's package): one daemon per namespace or leaf, ``-d`` (foreground), its
own control socket (``-u``), its interfaces (``-I``) and a config (``-O``) naming the system
(the host's or the leaf's name), sending every second (``tx-interval 1``), and on a leaf the
port id as the interface name (``portidsubtype ifname``). A Linux bridge does not forward
LLDP (01:80:c2:00:00:0e is link-local), so each host sees its leaf and nothing behind it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linkguard.drivers.lldp import LldpError, run_lldpctl
from linkguard.models.discovery import HostDiscovery
from linkguard.simulations.lab import Lab
from linkguard.topology.discover import Discovery, discover_fabric
from linkguard.topology.fabric import Fabric
from linkguard.topology.switchgraph import from_lldp

__all__ = ["LldpdSet", "compare_discovered", "discover_settings", "discovered_from_docs"]

#: lldpd sends every second: a neighbour is known about 1-2 s after both ends started
TX_INTERVAL_S = 1


@dataclass
class LldpdSet:
    """The lldpd daemons of one lab: ``sockets`` by host name (the agents read them) and by
    leaf name; :meth:`stop` ends them all."""

    workdir: Path
    sockets: dict[str, Path] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: where the daemons' logs go (the lab's workdir)
    logs: Path | None = None

    @classmethod
    def start(cls, lab: Lab, workdir: Path) -> LldpdSet:
        """Start one lldpd per host namespace (its rail netdevs) and one per leaf bridge (its
        ports, in the fabric namespace). Raises FileNotFoundError when lldpd is missing."""
        binary = shutil.which("lldpd") or "/usr/sbin/lldpd"
        if not os.path.exists(binary):
            raise FileNotFoundError("lldpd is not installed (Debian package lldpd)")
        # lldpd drops to its own user (_lldpd) and its lldpcli reads the config and connects
        # to the socket as that user: a directory it can reach (a lab's workdir may be 0700)
        out = cls(workdir=Path(tempfile.mkdtemp(prefix="linkguard-lldp-")))
        out.workdir.chmod(0o755)
        out.logs = workdir / "lldp"
        out.logs.mkdir(parents=True, exist_ok=True)
        Path("/run/lldpd").mkdir(parents=True, exist_ok=True)  # its chroot
        try:
            for leaf in lab.leaves:
                ports = [r.fabric_port for h in lab.hosts for r in h.rails if r.leaf == leaf]
                if leaf in lab.uplinks:
                    ports.append(lab.uplinks[leaf])
                out._run(binary, leaf, lab.fabric_netns, ports, leaf_side=True)
            for h in lab.hosts:
                out._run(binary, h.name, h.netns, [r.netdev for r in h.rails], leaf_side=False)
        except BaseException:
            out.stop()
            raise
        return out

    def _run(self, binary: str, name: str, netns: str, ifaces: list[str], *, leaf_side: bool):
        conf = self.workdir / f"{name}.conf"
        lines = [f"configure system hostname {name}", f"configure lldp tx-interval {TX_INTERVAL_S}"]
        if leaf_side:
            lines.append("configure lldp portidsubtype ifname")
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o644)
        sock = self.sockets[name] = self.workdir / f"{name}.sock"
        log = ((self.logs or self.workdir) / f"lldpd-{name}.log").open("wb")
        argv = ["ip", "netns", "exec", netns, binary, "-d", "-u", str(sock)]
        argv += ["-I", ",".join(ifaces), "-O", str(conf)]
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def command(self, name: str) -> list[str]:
        """The lldpctl command reading ``name``'s daemon (for the agent's discovery)."""
        return ["lldpctl", "-u", str(self.sockets[name]), "-f", "json"]

    def wait_neighbours(self, lab: Lab, timeout_s: float = 20.0) -> None:
        """Until every host's lldpd sees its leaf on every rail. Raises TimeoutError naming
        the hosts still missing some."""
        deadline = time.monotonic() + timeout_s
        missing: list[str] = []
        while time.monotonic() < deadline:
            missing = []
            for h in lab.hosts:
                try:
                    seen = run_lldpctl(tuple(self.command(h.name)), timeout_s=5)
                except LldpError:
                    seen = []
                if {n.netdev for n in seen if n.system} < {r.netdev for r in h.rails}:
                    missing.append(h.name)
            if not missing:
                return
            time.sleep(0.2)
        raise TimeoutError(f"lldpd: no leaf seen within {timeout_s:g} s on {missing[:5]}")

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.logs is not None:  # the socket directory is ours (made by start)
            shutil.rmtree(self.workdir, ignore_errors=True)


def discover_settings(
    lldp: LldpdSet, hosts: list[str], *, settle_s: float = 1.0
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the service's extra settings: ``fabric: {discover: {lldp: true}}``, each agent's:
    its lldpd's ``lldpctl`` command with ``lldp: on``)."""
    service = {"fabric": {"discover": {"lldp": True, "settle_s": settle_s, "name": "lab"}}}
    agents = {h: {"discovery": {"lldp": "on", "lldp_command": lldp.command(h)}} for h in hosts}
    return service, agents


def discovered_from_docs(docs: list[HostDiscovery]) -> Discovery:
    """What the service builds from ``docs`` (the same rules, the same inputs)."""
    graph = from_lldp({d.host: d.lldp for d in docs})
    return discover_fabric(docs, graph, name="lab")


def compare_discovered(discovered: Fabric | None, lab: Fabric) -> list[str]:
    """How the discovered fabric differs from the one the lab was built from, one line per
    difference in what plans depend on: hosts, each HCA port's rail, netdev and address, each
    host's endpoints, each host port's leaf (empty: the same)."""
    if discovered is None:
        return ["nothing discovered"]

    def view(f: Fabric) -> dict[str, Any]:
        leaf = {lk.a: lk.b for lk in f.links if lk.kind == "host-leaf"}
        return {
            h.host: {
                "hcas": sorted(
                    (c.key, c.rail, c.netdev, str(c.address), leaf.get(f"{h.host}:{c.key}"))
                    for c in h.hcas
                ),
                "endpoints": [str(e) for e in h.endpoints],
            }
            for h in f.hosts
        }

    got, want = view(discovered), view(lab)
    out = [f"host {h}: not discovered" for h in sorted(set(want) - set(got))]
    out += [f"host {h}: not in the lab" for h in sorted(set(got) - set(want))]
    for h in sorted(set(got) & set(want)):
        if got[h] != want[h]:
            out.append(f"host {h}: discovered {json.dumps(got[h])}, lab {json.dumps(want[h])}")
    return out
