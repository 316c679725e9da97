"""Time the rail-optimized generator and the fabric renderings at fleet scale.

Usage: ``python benchmarks/fabric_bench.py [--runs 3] [--sizes 32,256,2048,4000] [--rails 8]``.
Prints, per host count: SUs, tiers (leaves/spines/cores), cables per kind, and the median wall
time of generating + validating the fabric (``generate_rail_optimized``, which builds a
validated ``Fabric``), of ``fabric show`` (summary), DOT (aggregated), JSON and YAML rendering,
and of loading the JSON back (``load_fabric``). No I/O besides stdout and a temporary file.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

from _timing import median_s

from linkguard.topology.export import render, summary_text, to_dot
from linkguard.topology.fabric import load_fabric
from linkguard.topology.generator import generate_rail_optimized, rail_optimized_shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="32,256,2048,4000", help="comma-separated host counts")
    ap.add_argument("--rails", type=int, default=8)
    ap.add_argument("--yaml", action="store_true", help="also time YAML (seconds at 2,048 hosts)")
    args = ap.parse_args()
    print(
        f"{'hosts':>6} {'SUs':>4} {'leaf/spine/core':>15} {'host-leaf':>9} {'leaf-spine':>10} "
        f"{'spine-core':>10} {'generate':>9} {'show':>8} {'dot-agg':>8} {'json':>8} "
        f"{'load':>8}" + (f" {'yaml':>8}" if args.yaml else "")
    )
    for hosts in (int(x) for x in args.sizes.split(",")):
        shape = rail_optimized_shape(hosts=hosts, rails=args.rails)

        def gen(hosts=hosts):
            return generate_rail_optimized(hosts=hosts, rails=args.rails)

        t_gen = median_s(gen, args.runs)
        fabric = gen()
        kinds = Counter(link.kind for link in fabric.links)
        t_show = median_s(lambda f=fabric: summary_text(f), args.runs)
        t_dot = median_s(lambda f=fabric: to_dot(f, aggregate=True), args.runs)
        t_json = median_s(lambda f=fabric: render(f, "json"), args.runs)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "fabric.json"
            path.write_text(render(fabric, "json"))
            t_load = median_s(lambda p=path: load_fabric(p), args.runs)
        t_yaml = median_s(lambda f=fabric: render(f, "yaml"), 1) if args.yaml else None
        tiers = f"{shape.leaves}/{shape.spines}/{shape.cores}"
        ms = lambda s: f"{s * 1000:>6.0f} ms"  # noqa: E731
        print(
            f"{hosts:>6} {shape.sus:>4} {tiers:>15} {kinds['host-leaf']:>9} "
            f"{kinds['leaf-spine']:>10} {kinds['spine-spine']:>10} {ms(t_gen):>9} "
            f"{ms(t_show):>8} {ms(t_dot):>8} {ms(t_json):>8} {ms(t_load):>8}"
            + (f" {ms(t_yaml):>8}" if t_yaml is not None else "")
        )


if __name__ == "__main__":
    main()
