"""The reachability oracle of a namespace-lab replay (:mod:`linkguard.simulations.labrun`):
UDP echo probes in the kernel against the model.

Consumes: the lab's hosts (one ``probe`` process each, :mod:`linkguard.simulations.udpflow`,
echoing on :data:`PROBE_PORT`), the rails physically unusable now (host -> rails), the pairs of
hosts to check and the running flows. Produces: one sentence per probe whose answer differs
from the model (reachable iff some rail is usable at both hosts), and how many probes were
sent (:meth:`Probers.reach`). A probe not answered within :data:`PROBE_TIMEOUT_MS` counts as
unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterable
from ipaddress import IPv4Address

from linkguard.simulations.lab import Lab
from linkguard.simulations.labprocs import UDPFLOW, Flow, LabProcessError
from linkguard.topology.fabric import Fabric

__all__ = ["PROBE_PORT", "PROBE_TIMEOUT_MS", "Prober", "Probers"]

#: UDP port of the probe echo (flows use labflows' FLOW_PORT_BASE on).
PROBE_PORT = 47999
#: A probe not answered within this long (ms, sent again every 50 ms) counts as unreachable.
PROBE_TIMEOUT_MS = 300.0


class Prober:
    """The ``probe`` process of one host (:mod:`linkguard.simulations.udpflow`)."""

    def __init__(self, host: str, proc: asyncio.subprocess.Process) -> None:
        self.host = host
        self.proc = proc

    @classmethod
    async def start(cls, lab: Lab, host: str) -> Prober:
        lh = lab.host(host)
        proc = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", lh.netns, sys.executable, str(UDPFLOW), "probe",
            str(PROBE_PORT), *(str(e) for e in lh.endpoints),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        async with asyncio.timeout(15):
            line = await proc.stdout.readline()
        if line.strip() != b"ready":
            raise LabProcessError(f"prober of {host} did not start: {line!r}")
        return cls(host, proc)

    async def probe(self, probes: list[tuple[str, IPv4Address, IPv4Address]]) -> dict[str, bool]:
        """id -> answered, for probes (id, src, dst) sent from this host."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        lines = [f"p {pid} {src} {dst}\n" for pid, src, dst in probes]
        self.proc.stdin.write(("".join(lines) + f"go {PROBE_TIMEOUT_MS:g}\n").encode())
        await self.proc.stdin.drain()
        out: dict[str, bool] = {}
        while True:
            async with asyncio.timeout(30):
                line = (await self.proc.stdout.readline()).decode().split()
            if not line:
                raise LabProcessError(f"prober of {self.host} exited")
            if line[0] == "done":
                return out
            out[line[1]] = line[2] == "1"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class Probers:
    """The probers of a lab's hosts (started by :meth:`start`) and the probe ids they used."""

    def __init__(self) -> None:
        self.by_host: dict[str, Prober] = {}
        self.seq = 0

    async def start(self, lab: Lab, names: list[str]) -> None:
        """One prober per host of ``names``, started together. Raises
        :class:`~linkguard.simulations.labprocs.LabProcessError` when one does not start."""
        self.by_host = dict(
            zip(names, await asyncio.gather(*(Prober.start(lab, h) for h in names)), strict=True)
        )

    async def reach(
        self,
        label: str,
        fabric: Fabric,
        truth: dict[str, set[int]],
        pairs: Iterable[tuple[str, str]],
        flows: Iterable[Flow],
    ) -> tuple[list[str], int]:
        """Probe from endpoint to endpoint, for every pair of ``pairs`` GPU g to GPU g, and the
        flows' endpoints, and compare with the model (``truth``: rails physically unusable per
        host). Returns (one ``"<label>: ..."`` sentence per mismatch, probes sent)."""
        usable = {h.host: {c.rail for c in h.hcas} - truth.get(h.host, set()) for h in fabric.hosts}
        wanted: dict[tuple[IPv4Address, IPv4Address], tuple[str, str]] = {}
        for a, b in pairs:
            src_eps, dst_eps = fabric.host(a).endpoints, fabric.host(b).endpoints
            for g, dst in enumerate(dst_eps):
                wanted[(src_eps[g % len(src_eps)], dst)] = (a, b)
        for fl in flows:
            s = fl.spec
            assert s is not None
            wanted[(s.src, s.dst)] = (s.src_host, s.dst_host)
        by_host: dict[str, list[tuple[str, IPv4Address, IPv4Address]]] = {}
        ids: dict[str, tuple[IPv4Address, IPv4Address]] = {}
        for (src, dst), (a, _) in wanted.items():
            self.seq += 1
            pid = str(self.seq)
            ids[pid] = (src, dst)
            by_host.setdefault(a, []).append((pid, src, dst))
        results: dict[str, bool] = {}
        for part in await asyncio.gather(
            *(self.by_host[h].probe(probes) for h, probes in by_host.items())
        ):
            results.update(part)
        found: list[str] = []
        for pid, (src, dst) in ids.items():
            a, b = wanted[(src, dst)]
            expect = bool(usable[a] & usable[b])
            got = results.get(pid, False)
            if expect != got:
                kind = "unreachable" if expect else "reachable against the model"
                found.append(
                    f"{label}: {kind}: {a} {src} -> {b} {dst} (usable at both: "
                    f"{sorted(usable[a] & usable[b])})"
                )
        return found, len(ids)

    def kill(self) -> None:
        """Kill every prober (reap them with :meth:`reap`)."""
        for p in self.by_host.values():
            p.kill()

    async def reap(self) -> None:
        """Wait (at most 5 s each) for the killed probers to exit."""
        for p in self.by_host.values():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await p.proc.wait()
