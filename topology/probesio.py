"""The topology service's probe executors: probe targets out, probe reports and verdicts in.

Consumes: the probe settings (``probes``), the core's probe desk
(:class:`~linkguard.topology.probedesk.ProbeDesk`: targets per epoch, fresh results,
localised verdicts) and the agents' probe reports. Produces: every host's probe targets,
retained on ``probes/<host>`` at the start of each probe epoch (``epoch_s``; epoch = Unix
time // ``epoch_s``), and the effects of the verdicts localised every ``window_s`` (route
around a port or a leaf, logs, changes). Creates no task: :mod:`linkguard.topology.service`
(the wiring module) runs :meth:`ProbesIO._prober` as its ``prober`` task.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from linkguard import topics
from linkguard.models import ProbeReport, ProbeTargets, encode
from linkguard.topology.localize import Verdict as ProbeVerdict
from linkguard.topology.serviceio import ServiceIO

__all__ = ["ProbesIO"]

log = structlog.get_logger(__name__)


class ProbesIO(ServiceIO):
    """Probes of :class:`~linkguard.topology.service.TopologyService` (a base)."""

    async def _prober(self) -> None:
        """With ``probes.enabled``: publish every host's probe targets (retained) at the start
        of each probe epoch (``epoch_s``; epoch = Unix time // epoch_s), and localise faults
        from the reports every ``window_s`` (:meth:`localize_probes`)."""
        cfg = self.settings.probes
        await self.bus.connected.wait()
        await self._won.wait()
        published: int | None = None
        while True:
            epoch = int(time.time() // cfg.epoch_s)
            if epoch != published:
                msgs = await asyncio.to_thread(self.probe_targets, epoch)
                self._probe_targets_sent = [(topics.probe_targets(m.host), encode(m)) for m in msgs]
                await self._publish_retained(self._probe_targets_sent)
                published = epoch
                log.info("probe_targets_published", epoch=epoch, hosts=len(msgs))
            desk = self.core.probes
            if desk.localizer is not None:
                now = time.monotonic()
                results = desk.fresh_results(now)
                verdicts = await asyncio.to_thread(desk.localizer.update, results, now)
                self.localize_probes(now=now, verdicts=verdicts)
            await asyncio.sleep(cfg.window_s)

    # -- what other code and tests call (delegated to the core) ------------------------------

    def probe_targets(self, epoch: int) -> list[ProbeTargets]:
        """Every host's probe targets of ``epoch`` (:meth:`ProbeDesk.targets`)."""
        return self.core.probes.targets(epoch)

    def localize_probes(
        self, *, now: float, verdicts: list[ProbeVerdict] | None = None
    ) -> list[ProbeVerdict]:
        """Localise at ``now`` (monotonic s) and act on the verdicts
        (:meth:`ProbeDesk.localize`); returns the verdicts acted on."""
        acted, effects = self.core.probes.localize(now, verdicts)
        self._execute_now(effects)
        return acted

    def probe_verdicts(self, *, now: float | None = None) -> list[dict[str, object]]:
        """The probe verdicts in force (:meth:`ProbeDesk.verdicts`); ``now``: the monotonic
        clock of :meth:`localize_probes` (default ``time.monotonic()``)."""
        mono = time.monotonic() if now is None else now
        return self.core.probes.verdicts(mono, time.time())

    def _on_probe_report(self, report: ProbeReport, *, now: float) -> None:
        self._execute_now(self.core.probes.on_report(report, now))
