"""The steps of a namespace-lab replay (:mod:`linkguard.simulations.labrun`): a scenario's
expanded events grouped by instant.

Consumes: the expanded events (:func:`~linkguard.simulations.scenario.expand`). Produces:
:class:`Step` (the events of one instant, what they touch, a one-line description) and, for a
step that takes something down, the later step that brings it back (:func:`return_at`). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from linkguard.simulations.scenario import Event, LoadedScenario

__all__ = ["CONTROL", "Step", "res_key", "return_at", "steps_of"]

#: The control-plane resources a step can take down (the rest is the fabric: ports, switches,
#: cables).
CONTROL = {"broker", "service", "agent"}


@dataclass
class Step:
    """The events of one instant."""

    at_s: float
    events: list[Event]

    @property
    def is_down(self) -> bool:
        return any(e.kind.endswith("_down") for e in self.events)

    @property
    def port_host(self) -> str | None:
        """The host whose ports every event of this step takes down (a host link fault), else
        None (a switch, a cable, a process, or ports of more than one host)."""
        hosts = {e.host for e in self.events if e.kind == "port_down" and e.port is not None}
        only_ports = all(e.kind == "port_down" for e in self.events)
        return next(iter(hosts)) if only_ports and len(hosts) == 1 else None

    @property
    def resources(self) -> set[str]:
        return {e.kind.rsplit("_", 1)[0] for e in self.events}

    def what(self, loaded: LoadedScenario) -> str:
        """E.g. ``link_down gpu001 rail 1``, ``leaf_reboot su0-leaf2 down``, ``uplink_loss
        down: su1-leaf3/su0-spine0, su1-leaf3/su0-spine1``."""
        groups: dict[str, list[str]] = {}
        for i in sorted({e.entry for e in self.events}):
            f = loaded.scenario.timeline[i]
            mine = [e for e in self.events if e.entry == i]
            first = mine[0]
            down = any(e.kind.endswith("_down") for e in mine)
            if first.switch is not None:
                key, item = f"{f.kind} {'down' if down else 'up'}", first.switch
            elif first.cable is not None:
                c = first.cable
                key = f"{f.kind} {'down' if down else 'up'}"
                item = f"{c.a}/{c.b}" + ("" if c.count is None else f" ({c.count})")
            elif first.rail is not None:
                key, item = f.kind, f"{first.host} rail {first.rail}"
                if f.kind in ("flap", "port_cycle"):
                    item += f" {first.state}/{first.phys_state}"
            elif first.host is not None:
                key, item = f"{f.kind} {'down' if down else 'up'}", str(first.host)
            else:
                key, item = f"{f.kind} {'down' if down else 'up'}", ""
            groups.setdefault(key, []).append(item)
        parts = []
        for key, items in groups.items():
            items = [i for i in items if i]
            if len(items) > 1:
                parts.append(f"{key}: {', '.join(items)}")
            else:
                parts.append(" ".join([key.split(" ")[0], *items, *key.split(" ")[1:]]))
        return "; ".join(parts)


def steps_of(events: list[Event]) -> list[Step]:
    """``events`` (in time order) grouped by ``at_s``: one step per instant."""
    out: list[Step] = []
    for e in events:
        if out and out[-1].at_s == e.at_s:
            out[-1].events.append(e)
        else:
            out.append(Step(e.at_s, [e]))
    return out


def res_key(e: Event) -> tuple[object, ...]:
    """What ``e`` takes down or brings back: ``("port", host, rail)``, ``("switch", name)``,
    ``("cables", pair)``, or ``(resource, host)`` for the broker, service and agents."""
    kind = e.kind.rsplit("_", 1)[0]
    if kind == "port":
        return (kind, e.host, e.rail)
    if kind == "switch":
        return (kind, e.switch)
    if kind == "cables":
        return (kind, e.cable_ref.pair)
    return (kind, e.host)


def return_at(step: Step, steps: list[Step]) -> float | None:
    """``at_s`` of the first later step that brings back something ``step`` took down, None
    when nothing comes back."""
    downs = {res_key(e) for e in step.events if e.kind.endswith("_down")}
    for later in steps:
        if later.at_s <= step.at_s:
            continue
        ups = {res_key(e) for e in later.events if e.kind.endswith("_up")}
        if downs & ups:
            return later.at_s
    return None
