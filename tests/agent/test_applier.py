"""The applier against an in-memory table: acks, refusals, the fast path and saved plans."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from structlog.testing import capture_logs

from linkguard.agent.applier import Applier
from linkguard.drivers.simulated import MemoryRouteTable
from linkguard.topology.fabric import generate_rail_optimized
from linkguard.topology.solver import solve

FABRIC = generate_rail_optimized(hosts=3, rails=2)
HOST = "gpu000"


def _applier(tmp: Path, table: MemoryRouteTable, prefix: str = "10.200.0.0/16") -> Applier:
    return Applier(
        host=HOST,
        table=table,
        netdevs={"rail0", "rail1"},
        prefixes=[ipaddress.IPv4Network(prefix)],
        rail_map_path=tmp / "rail-map.json",
        state_dir=tmp,
    )


async def test_apply_fast_path_and_withdraw(tmp_path: Path) -> None:
    table = MemoryRouteTable()
    a = _applier(tmp_path, table)
    await a.start()
    plan = solve(FABRIC, {}, epoch=3, now=0.0)[HOST]
    ack = await a.apply(plan)
    assert (ack.result, ack.epoch, ack.fast_path) == ("applied", 3, False)
    assert {r.netdev for r in table.routes.values()} == {"rail0", "rail1"}
    changes = table.changes
    fast = await a.port_down("mlx5_0/1")
    assert fast is not None and fast.fast_path and fast.epoch == 3
    assert {r.netdev for r in table.routes.values()} == {"rail1"}
    # the fast path touches only the backup's entries (each differs from the plan; /32 routes
    # for a plan of /32s, the rail-0 prefix route for a compact one), no full reconcile
    (backup,) = [b for b in plan.backups if b.hca == "mlx5_0"]
    assert not backup.withdraw  # nothing is lost with one rail left
    touched = len(backup.prefix_routes) + len(backup.routes)
    assert (table.reconciles, table.updates, table.changes - changes) == (1, 1, touched)
    assert '"nccl_ib_hca": "=mlx5_1:1"' in (tmp_path / "rail-map.json").read_text()
    assert (tmp_path / "rail-map.json").stat().st_mode & 0o777 == 0o644  # jobs are not root
    await a.withdraw()
    assert table.routes == {} and not (tmp_path / "rail-map.json").exists()


async def test_saved_plan_outside_a_narrowed_scope_is_discarded(tmp_path: Path) -> None:
    first = _applier(tmp_path, MemoryRouteTable())
    await first.start()
    await first.apply(solve(FABRIC, {}, epoch=3, now=0.0)[HOST])
    # restart with endpoint_prefixes narrowed so the saved plan's routes are out of scope
    table = MemoryRouteTable()
    again = _applier(tmp_path, table, prefix="10.200.0.0/24")
    with capture_logs() as logs:
        await again.start()
    assert again.applied_epoch is None and table.routes == {}
    assert [e["reason"] for e in logs if e["event"] == "last_plan_discarded"] == ["out_of_scope"]
    # the service's plans for the old scope keep being refused until the fabric matches
    assert (await again.apply(solve(FABRIC, {}, epoch=4, now=0.0)[HOST])).result == "refused"
