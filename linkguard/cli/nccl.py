"""``linkguard nccl env``: the NCCL settings for jobs starting now (the agent's ``nccl.json``
or a rendering from the service's API), and the parser of ``linkguard exec`` (run by
:func:`linkguard.jobenv.main` before this package builds any parser)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from linkguard.cli.common import fail, nonempty


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    nc = sub.add_parser("nccl", help="NCCL settings for jobs from the host's current plan")
    ncsub = nc.add_subparsers(dest="nccl_command", required=True, metavar="SUBCOMMAND")
    ne = ncsub.add_parser(
        "env",
        help="NCCL_IB_HCA of the usable ports (and the fused-NIC failover settings)",
        description="Print the NCCL settings for jobs starting now on a host: NCCL_IB_HCA "
        "with the usable ports only (held-down, suppressed, down and degraded ones left out; "
        "exact names, =mlx5_0:1,...), NCCL_TOPO_FILE when the agent renders one, or with "
        "--profile failover the fused-NIC layout for NCCL >= 2.29.7's port failover. Without "
        "--host: what this host's agent wrote next to its rail map (nccl.json). With --host: "
        "rendered from the topology service's API (its plan and port states of that host).",
        epilog="Exit codes: 0 done, 1 nothing rendered yet, no agent running (its files may "
        "be stale: --allow-stale) or the service unreachable, 2 bad "
        "arguments or configuration, an unknown host. Warnings (a fused NIC that already lost "
        "a port) go to stderr with --format env/shell. Use: set -a; . /run/linkguard/nccl.env; "
        'or eval "$(linkguard nccl env --format shell)".',
    )
    ne.add_argument(
        "-c", "--config", type=Path, help="the agent's YAML config (where its files are)"
    )
    ne.add_argument("--host", type=nonempty, help="ask the topology service about host H")
    ne.add_argument(
        "--api",
        default="http://127.0.0.1:8470",
        metavar="URL",
        help="the topology service's API (with --host; default http://127.0.0.1:8470)",
    )
    ne.add_argument("--format", choices=["env", "json", "shell"], default="env")
    ne.add_argument(
        "--profile",
        choices=["plain", "failover"],
        default="plain",
        help="plain: NCCL_IB_HCA (+ NCCL_TOPO_FILE); failover: fused NICs with port failover",
    )
    ne.add_argument(
        "--allow-stale",
        action="store_true",
        help="print the agent's files though no agent holds agent.lock (the agent is not "
        "running: they may name a lost rail; without this, exit 1 as linkguard exec's 75)",
    )


def add_exec_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from linkguard.jobenv import add_arguments as exec_arguments

    ex = sub.add_parser(
        "exec",
        help="run a job's worker with the host's NCCL settings of this moment (usable rails)",
    )
    exec_arguments(ex)


def run(args: argparse.Namespace) -> int:
    """``nccl env``: this host's agent's ``nccl.json`` (:class:`linkguard.nccl.NcclFiles`), or
    with ``--host`` a rendering from the service's ``GET /api/v1/hosts/{host}``; printed as
    KEY=VALUE lines, ``export`` lines or the JSON document."""
    import json

    from linkguard.config import AgentSettings, ConfigError, load_settings
    from linkguard.jobenv import AGENT_LOCK, agent_running
    from linkguard.nccl import NcclFiles, env_lines

    if args.host is None:
        try:
            settings = load_settings(AgentSettings, args.config)
        except ConfigError as exc:
            return fail(f"nccl env: {exc}", 2)
        path = settings.rail_map_path.parent / NcclFiles.JSON
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return fail(
                f"nccl env: {path} does not exist: is the agent running? (it writes it with "
                "its first plan or port state)",
                1,
            )
        except (OSError, ValueError) as exc:
            return fail(f"nccl env: cannot read {path}: {exc}", 1)
        if not args.allow_stale and agent_running(path.parent) is False:
            return fail(
                f"nccl env: no agent holds {path.parent / AGENT_LOCK} (the agent is not "
                f"running), so {path.name} may be stale; --allow-stale prints it anyway",
                1,
            )
    else:
        try:
            if not args.api.startswith(("http://", "https://")):
                return fail(f"nccl env: --api {args.api!r}: give an http:// or https:// URL", 2)
            doc = _nccl_from_api(args.api, args.host)
        except LookupError as exc:
            return fail(f"nccl env: {exc}", 2)
        except (OSError, ValueError) as exc:
            return fail(f"nccl env: {exc}", 1)
    if args.format == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    try:
        env = doc["env"] if args.profile == "plain" else doc["failover"]["env"]
        warnings = doc["failover"]["warnings"] if args.profile == "failover" else []
    except (KeyError, TypeError):
        return fail("nccl env: the rendering has no env: written by another version?", 1)
    for w in warnings:
        print(f"linkguard: warning: {w}", file=sys.stderr)
    sys.stdout.write(env_lines(env, export=args.format == "shell"))
    return 0


def _nccl_from_api(api: str, host: str) -> dict:
    """The NCCL rendering of ``host`` from the service's host view (its HCAs, their states,
    its plan). LookupError: unknown host; OSError: unreachable;
    ValueError: an answer that is not a host view."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    from pydantic import ValidationError

    from linkguard.models import HCAInfo, HostInventory, LinkLayer, Plan, PortState
    from linkguard.nccl import render

    url = f"{api.rstrip('/')}/api/v1/hosts/{urllib.parse.quote(host, safe='')}"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--api {api!r}: give an http:// or https:// URL")
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # scheme checked above
            body = resp.read(16 * 1024 * 1024)
    except urllib.error.HTTPError as exc:
        detail = exc.read(2000).decode("utf-8", "replace")
        if exc.code == 404:
            raise LookupError(f"{host}: {detail}") from None
        raise OSError(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise OSError(f"{url}: {exc.reason}") from None
    try:
        view = json.loads(body)
        states = [PortState.model_validate(h["state"]) for h in view["hcas"] if h["state"]]
        layers = {s.key: s.link_layer for s in states if s.link_layer is not None}
        inv = HostInventory(
            host=view["host"],
            hcas=[
                HCAInfo(
                    hca=h["hca"],
                    port=h["port"],
                    rail=h["rail"],
                    netdev=h.get("netdev"),
                    link_layer=layers.get(f"{h['hca']}/{h['port']}", LinkLayer.INFINIBAND),
                )
                for h in view["hcas"]
            ],
        )
        plan = Plan.model_validate(view["plan"]) if view.get("plan") else None
    except (KeyError, TypeError, ValidationError, json.JSONDecodeError) as exc:
        raise ValueError(f"{url}: not a host view: {exc}") from None
    # the agent's own rule on the agent's own states (status, rate against the host's other
    # ports), not the dashboard's "degraded" mark (a rate below the fabric's cable rate): the
    # same answer as the host's nccl.env
    return render(inv, states, plan).to_dict()
