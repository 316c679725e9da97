"""Print a fabric the way ``ibnetdiscover`` does: the test dumps of the importer and the audit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from linkguard.topology.fabric import Fabric, Link
from linkguard.topology.ibnetdiscover import LANE_GBPS


def _width_speed(link: Link) -> str:
    """``4xNDR`` from the link's width/speed, else from its rate (4 lanes), else 4xNDR."""
    width = link.width or "4x"
    speed = link.speed
    if speed is None and link.rate_gbps is not None:
        lanes = int(width[:-1])
        speed = next((s for s, g in LANE_GBPS.items() if g * lanes == link.rate_gbps), None)
    return f"{width}{speed or 'NDR'}"


def as_ibnetdiscover(
    f: Fabric,
    *,
    links: Iterable[Link] | None = None,
    ca_guids: Mapping[str, str] | None = None,
    switch_description: str | None = "{name}",
) -> tuple[str, dict[str, str]]:
    """Print ``f`` as ibnetdiscover would (switch records, then CA records; CA descriptions
    ``"<host> <hca>"`` as rdma-ndd sets them). Returns (text, switch node name -> fabric name).

    ``links`` replaces the fabric's links (cabling faults without a Fabric that validates);
    only cabled host ports appear. ``ca_guids`` maps ``"<host>:<hca>/<port>"`` to the node GUID
    of its CA (16 hex digits; port GUIDs stay unique). A switch's NodeDescription is
    ``switch_description`` formatted with its fabric name (``"MF0;{name}:MQM9700/U1"`` is the
    Mellanox default), or the same anonymous ``"Quantum-2 QM9700"`` for all when None.
    """
    guid = {s.name: f"{0x1000 + i:016x}" for i, s in enumerate(f.switches)}
    hca_guid: dict[str, str] = {}
    sw_ports: dict[str, list[tuple[int, str]]] = {s.name: [] for s in f.switches}
    ca_lines: dict[str, str] = {}
    fmt = switch_description or "Quantum-2 QM9700"
    desc = {s.name: fmt.format(name=s.name) for s in f.switches}
    for link in f.links if links is None else links:
        ws = _width_speed(link)
        if link.kind == "host-leaf":
            host, hca = link.a.split(":")[0], link.a.split(":")[1].split("/")[0]
            g = hca_guid.setdefault(link.a, f"{0xA0000 + 16 * len(hca_guid):016x}")
            pg = f"{int(g, 16) + 1:x}"
            g = (ca_guids or {}).get(link.a, g)
            port = len(sw_ports[link.b]) + 1
            sw_ports[link.b].append((port, f'"H-{g}"[1]({pg}) # "{host} {hca}" lid 1 {ws}'))
            ca_lines[link.a] = (
                f'Ca\t1 "H-{g}"\t\t# "{host} {hca}"\n[1]({pg}) \t'
                f'"S-{guid[link.b]}"[{port}]\t\t# lid 1 lmc 0 "{desc[link.b]}" lid 2 {ws}\n'
            )
        else:
            pa, pb = len(sw_ports[link.a]) + 1, len(sw_ports[link.b]) + 1
            da, db = desc[link.a], desc[link.b]
            sw_ports[link.a].append((pa, f'"S-{guid[link.b]}"[{pb}] # "{db}" lid 3 {ws}'))
            sw_ports[link.b].append((pb, f'"S-{guid[link.a]}"[{pa}] # "{da}" lid 3 {ws}'))
    out = []
    for s in f.switches:
        g = guid[s.name]
        n = max(64, len(sw_ports[s.name]))  # a QM9700 has 64; spines with a core tier need 128
        out.append(f'\nswitchguid=0x{g}\nSwitch\t{n} "S-{g}"\t\t# "{desc[s.name]}"')
        out.extend(f"[{p}]\t{rest}" for p, rest in sw_ports[s.name])
    text = "\n".join(out) + "\n\n" + "\n".join(ca_lines.values())
    return text, {f"S-{g}": n for n, g in guid.items()}
