"""A chaos run on the real daemon classes: the topology service and one agent per host
(:class:`~linkguard.simulations.fleet.SimulatedFleet`) over a private Mosquitto, with the
fault-injecting proxy (:mod:`linkguard.simulations.chaosproxy`) between the agents and the
broker (the service connects directly), all seeded.

Consumes: the fleet's size (hosts, rails), a loss rate, a seed, the storm's length (s), the
stated convergence time (s). Produces: a :class:`ChaosReport`: the proxy's counts (publishes
dropped, duplicated, delayed, reordered, connections cut), the per-host convergence times and
the :class:`~linkguard.simulations.chaosstorm.ChaosVerdict`.

The run: start the fleet and wait until every host acked its first plan; turn the proxy's
rules on (:func:`~linkguard.simulations.chaosstorm.chaos_rules`: ``loss`` of the publishes
dropped, some duplicated, delayed and reordered, ``cuts`` connections cut) and play the storm
(:func:`~linkguard.simulations.chaosstorm.storm_schedule`: random port flaps on random hosts,
healed at its end); clear the rules (the storm's end) and watch the service's state every
10 ms until every host has acked its current epoch (applied) or ``within_s`` plus a margin
has passed. A host's convergence time is when it last became acked, from the storm's end (0:
acked at the storm's end and never behind since). Then the ledger is compared with what the
agents journaled; when events are missing, the proxy cuts every connection once (the agents
replay what the service has not confirmed on reconnecting) and the ledger is compared again:
``missing_until_reconnect`` counts the first, ``events_lost`` the second. Every wait has a
deadline; the fleet, the proxy and the broker are stopped on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, Field

from linkguard.broker import MosquittoProcess
from linkguard.config import BusSettings
from linkguard.damping import DampingPolicy
from linkguard.models import AckResult, PortEvent
from linkguard.settings.servicesections import ConvergenceSettings, LedgerSettings
from linkguard.simulations.chaosproxy import ChaosProxy
from linkguard.simulations.chaosstorm import (
    ChaosVerdict,
    EventAudit,
    EventKey,
    StormEvent,
    audit_events,
    chaos_rules,
    storm_schedule,
    verdict,
)
from linkguard.simulations.fleet import SimulatedFleet, wait_until
from linkguard.topology.fabric import generate_rail_optimized

__all__ = ["ChaosReport", "run_chaos"]

#: how often the harness looks at the service's state (s)
POLL_S = 0.01
#: the watch after the storm lasts ``within_s`` plus this (s), to tell late from never
MARGIN_S = 5.0
#: how long the journals get to be confirmed after the hosts converged, before the ledger is
#: read (s): past the agents' timed re-send of unconfirmed events (``journal_resend_after_s``,
#: 5 s by default), so that only what that re-send did not bring counts as missing until a
#: reconnect (the wait ends as soon as every journal is confirmed)
CONFIRM_S = 8.0


class ChaosReport(BaseModel):
    """A chaos run's figures (counts of PUBLISH packets through the proxy, both directions)."""

    hosts: int
    rails: int
    loss: float = Field(description="the drop probability per publish during the storm")
    seed: int
    storm_s: float = Field(description="the storm's length (s)")
    port_events: int = Field(description="link_down/link_up in the storm (healing included)")
    forwarded: int = Field(description="MQTT packets of every kind passed on unchanged (whole run)")
    dropped: int
    duplicated: int
    delayed: int
    reordered: int
    cut: int = Field(description="connections cut by a rule")
    connections: int = Field(description="agent connections the proxy accepted (reconnects)")
    startup_s: float = Field(description="fleet start to every host's first ack (s)")
    convergence_s: dict[str, float | None] = Field(
        description="per host: its last becoming acked, s from the storm's end (None: never)"
    )
    verdict: ChaosVerdict


def _acked(fleet: SimulatedFleet, host: str) -> bool:
    state = fleet.service.state
    ack, owed = state.acks.get(host), state.acked_epoch(host)
    # as the service counts it: the epoch, and every peer routes message the ack names
    return (
        ack is not None and owed is not None and ack.result == AckResult.APPLIED
        and state.ack_covers(host, ack)
    )  # fmt: skip


async def _play(fleet: SimulatedFleet, storm: list[StormEvent]) -> None:
    """The storm's port events at their times (from now)."""
    t0 = time.monotonic()
    for e in storm:
        delay = t0 + e.t_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        (fleet.link_down if e.action == "link_down" else fleet.link_up)(e.host, e.rail)


async def _watch(fleet: SimulatedFleet, end: float, deadline_s: float) -> dict[str, float | None]:
    """Per host: when (s after ``end``) it last became acked, until every host is acked or
    ``deadline_s`` after ``end``; None for a host not acked then."""
    since: dict[str, float | None] = dict.fromkeys(fleet.agents)
    while True:
        now = time.monotonic()
        for h in fleet.agents:
            if not _acked(fleet, h):
                since[h] = None
            elif since[h] is None:
                since[h] = max(0.0, now - end)
        if all(t is not None for t in since.values()) or now - end > deadline_s:
            return since
        await asyncio.sleep(POLL_S)


def _tap_journals(fleet: SimulatedFleet) -> list[EventKey]:
    """Every event the agents' journals number from now on, as (host, journal, seq, at, hca,
    port, current): the journal's ``record`` of each agent, observed (its result unchanged)."""
    out: list[EventKey] = []
    for host, agent in fleet.agents.items():
        journal = agent.core.journal
        if journal is None:
            continue
        record = journal.record

        def observed(events: Iterable[PortEvent], *, _r=record, _h=host) -> list[PortEvent]:
            sent = _r(events)
            out.extend(
                (_h, e.journal or "", e.seq or 0, e.at, e.hca, e.port, e.current.value)
                for e in sent
            )
            return sent

        journal.record = observed  # type: ignore[method-assign]
    return out


def _confirmed(fleet: SimulatedFleet) -> bool:
    """Every agent's journal confirmed by the service up to its last event."""
    return all(
        a.core.journal is None or a.core.journal.confirmed >= a.core.journal.next_seq - 1
        for a in fleet.agents.values()
    )


async def _audit(
    fleet: SimulatedFleet, journaled: list[EventKey], workdir: Path, wait_s: float
) -> EventAudit:
    """The ledger against the journals, once every journal is confirmed or after ``wait_s``
    (what is unconfirmed then may be missing from the ledger)."""
    with contextlib.suppress(TimeoutError):
        await wait_until(lambda: _confirmed(fleet), wait_s, "journals confirmed")
    if fleet.service.ledger is not None:
        fleet.service.ledger.flush(timeout=10)
    return audit_events(journaled, _ledger_rows(workdir / "ledger.sqlite3"))


def _ledger_rows(path: Path) -> list[EventKey]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        rows = conn.execute(
            "SELECT host, journal, seq, at, hca, port, current FROM port_events"
        ).fetchall()
    return [(h, j or "", s or 0, at, hca, port, cur) for h, j, s, at, hca, port, cur in rows]


async def run_chaos(
    *,
    hosts: int = 8,
    rails: int = 2,
    loss: float = 0.1,
    seed: int = 1,
    storm_s: float = 5.0,
    events_per_s: float = 10.0,
    cuts: int = 2,
    within_s: float = 10.0,
    startup_timeout_s: float = 30.0,
    resend_after_s: float = 1.0,
    resend_max_s: float = 2.0,
    workdir: Path | None = None,
) -> ChaosReport:
    """Run the chaos run of the module docstring and return its report. ``loss``: 0..1;
    ``storm_s``, ``within_s``, ``startup_timeout_s``: s. ``workdir``: the agents' state
    dirs and the broker's files (default: a temporary directory, removed afterwards).
    Raises FileNotFoundError without a mosquitto binary, TimeoutError when the fleet's
    first plans are not all acked within ``startup_timeout_s``. ``resend_after_s``,
    ``resend_max_s``: the service's convergence re-send timers (s; production defaults 5 and
    60)."""
    fabric = generate_rail_optimized(hosts=hosts, rails=rails)
    storm = storm_schedule(
        list(fabric.host_names),
        list(range(rails)),
        seed=seed,
        duration_s=storm_s,
        events_per_s=events_per_s,
    )
    rules = chaos_rules(loss, cuts=cuts)
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lg-chaos-")))
        broker = stack.enter_context(MosquittoProcess(workdir / "broker"))
        async with ChaosProxy(broker.host, broker.port, seed=seed) as proxy:
            fleet = SimulatedFleet(
                fabric,
                bus=BusSettings(port=broker.port, reconnect_min_s=0.05, reconnect_max_s=0.5),
                agent_bus=BusSettings(port=proxy.port, reconnect_min_s=0.05, reconnect_max_s=0.5),
                workdir=workdir,
                damping=DampingPolicy(hold_down_initial_s=0.2, hold_down_max_s=0.5),
                settle_s=0.2,
                service_update={
                    "convergence": ConvergenceSettings(
                        resend_after_s=resend_after_s,
                        resend_max_s=resend_max_s,
                        request_min_interval_s=0.5,
                    ),
                    "ledger": LedgerSettings(path=workdir / "ledger.sqlite3"),
                },
            )
            journaled = _tap_journals(fleet)
            t_start = time.monotonic()
            async with fleet:
                startup = await fleet.wait_all_acked(timeout=startup_timeout_s) - t_start
                proxy.rules = list(rules)
                try:
                    await _play(fleet, storm)
                finally:
                    proxy.rules = []
                end = time.monotonic()
                convergence = await _watch(fleet, end, within_s + MARGIN_S)
                before = await _audit(fleet, journaled, workdir, CONFIRM_S)
                audit = before
                if before.lost:  # the agents replay what is unconfirmed on a reconnect
                    proxy.cut()
                    audit = await _audit(fleet, journaled, workdir, within_s)
            stats = proxy.stats
    return ChaosReport(
        hosts=hosts,
        rails=rails,
        loss=loss,
        seed=seed,
        storm_s=storm_s,
        port_events=len(storm),
        forwarded=stats[("up", "forwarded")] + stats[("down", "forwarded")],
        dropped=_both(stats, "drop"),
        duplicated=_both(stats, "duplicate"),
        delayed=_both(stats, "delay"),
        reordered=_both(stats, "reorder"),
        cut=_both(stats, "cut"),
        connections=stats[("both", "connections")],
        startup_s=round(startup, 3),
        convergence_s={h: None if t is None else round(t, 3) for h, t in convergence.items()},
        verdict=verdict(
            convergence,
            within_s=within_s,
            journaled=audit.journaled,
            missing_until_reconnect=before.lost,
            lost=audit.lost,
            duplicated=audit.duplicated,
            time_mismatch=audit.mismatched,
        ),
    )


def _both(stats: object, action: str) -> int:
    counts = stats if isinstance(stats, dict) else {}
    return int(counts.get(("up", action), 0) + counts.get(("down", action), 0))
