"""LLDP neighbours from lldpd: ``lldpctl -f json`` output parsed into
:class:`~linkguard.models.discovery.LldpNeighbour` records.

Format (lldpd 1.0.x, checked against ``lldpctl -f json`` of lldpd 1.0.16 on veth pairs in
network namespaces; captures in ``tests/fixtures/lldp/``)::

    {"lldp": {"interface": {"<ifname>": {"chassis": {"<sysname>": {"id": {"type": "mac",
      "value": "..."}, "descr": "..."}}, "port": {"id": {"type": "ifname", "value": "swp1"},
      "descr": "swp1"}}}}}

``interface`` is one mapping with one interface, a list of one-key mappings with several, and
absent with none; a chassis without a system name is the ``{"id": ...}`` mapping itself. The
neighbour's port is its ``id`` when the id is an interface name (``ifname``/``local``), else its
``descr`` (lldpd on Linux sends the MAC as id and the interface name as description).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from linkguard.models.discovery import LldpNeighbour

__all__ = ["LldpError", "parse_lldpctl_json", "read_lldp_file", "run_lldpctl"]

_NETDEV = re.compile(r"^[A-Za-z0-9_.\-@:]{1,15}$")


class LldpError(ValueError):
    """lldpctl output that cannot be read; the message names the source."""


def _text(v: Any) -> str | None:
    return v.strip()[:256] or None if isinstance(v, str) else None


def _chassis(c: Any) -> tuple[str | None, str | None, list[str]]:
    """(system name, chassis id value, enabled capabilities) of one ``chassis`` mapping."""
    if not isinstance(c, dict) or not c:
        return None, None, []
    name: str | None = None
    body: Any = c
    if not ("id" in c and isinstance(c["id"], dict)):  # keyed by the system name
        name, body = next(iter(c.items()))
    if not isinstance(body, dict):
        return _text(name), None, []
    ident = body.get("id")
    caps = body.get("capability") or []
    enabled = [
        str(x["type"])[:32]
        for x in (caps if isinstance(caps, list) else [caps])
        if isinstance(x, dict) and x.get("enabled") is True and isinstance(x.get("type"), str)
    ]
    return _text(name), _text(ident.get("value")) if isinstance(ident, dict) else None, enabled


def parse_lldpctl_json(text: str | bytes, *, source: str = "<lldpctl>") -> list[LldpNeighbour]:
    """Neighbours in ``lldpctl -f json`` output, one per (local interface, neighbour), in file
    order. Interfaces whose name is no valid netdev name are skipped.

    Raises :class:`LldpError` naming ``source`` when the text is not JSON or has no ``lldp``
    mapping (an empty ``{"lldp": {}}`` is no neighbour, not an error)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise LldpError(f"{source}: not lldpctl JSON: {exc}") from None
    lldp = data.get("lldp") if isinstance(data, dict) else None
    if not isinstance(lldp, dict):
        raise LldpError(f"{source}: no 'lldp' mapping (is it `lldpctl -f json` output?)")
    raw = lldp.get("interface") or []
    items: list[tuple[str, Any]] = []
    for entry in raw if isinstance(raw, list) else [raw]:
        if isinstance(entry, dict):
            items += list(entry.items())
    out = []
    for ifname, body in items:
        if not isinstance(body, dict) or not _NETDEV.match(str(ifname)):
            continue
        system, chassis_id, caps = _chassis(body.get("chassis"))
        raw_port = body.get("port")
        port: dict[str, Any] = raw_port if isinstance(raw_port, dict) else {}
        raw_id = port.get("id")
        pid: dict[str, Any] = raw_id if isinstance(raw_id, dict) else {}
        descr = _text(port.get("descr"))
        named = pid.get("type") in ("ifname", "local") and _text(pid.get("value"))
        try:
            out.append(
                LldpNeighbour(
                    netdev=ifname,
                    system=system,
                    chassis_id=chassis_id,
                    port=named or descr or _text(pid.get("value")),
                    port_descr=descr,
                    capabilities=caps[:16],
                )
            )
        except ValidationError:
            continue
    return out


def read_lldp_file(path: str | Path) -> list[LldpNeighbour]:
    """:func:`parse_lldpctl_json` of a file; :class:`LldpError` naming it when it cannot be
    read or parsed."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise LldpError(f"{p}: cannot read: {exc}") from None
    return parse_lldpctl_json(text, source=str(p))


def run_lldpctl(
    command: tuple[str, ...] = ("lldpctl", "-f", "json"), *, timeout_s: float = 5.0
) -> list[LldpNeighbour]:
    """Run lldpctl (blocking: call it off the event loop) and parse its output.

    Raises :class:`LldpError` when lldpctl is not installed, fails (lldpd not running: "unable
    to connect to socket"), times out after ``timeout_s`` (s) or prints no lldpctl JSON."""
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise LldpError(f"{command[0]}: not installed (lldpd's client)") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LldpError(f"{' '.join(command)}: {exc}") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise LldpError(
            f"{' '.join(command)}: exit {done.returncode}: {err[-1] if err else 'no output'}"
        )
    return parse_lldpctl_json(done.stdout, source=" ".join(command))
