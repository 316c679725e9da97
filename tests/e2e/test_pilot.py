"""The pilot walk-through of docs/pilot.md, step by step, on the namespace lab: 3 hosts x 2
rails, a real Mosquitto, ``linkguard topology serve`` and one ``linkguard agent`` per host,
started from ``deploy/examples/`` with only what the lab needs rewritten (each host's name,
netns, netdev driver, ports and endpoints, the broker's address and port, file locations, free
ports for the exporters and the API). Root; skips without it or without Mosquitto (fails
under LINKGUARD_REQUIRE_REAL=1).

1. install: the installed ``linkguard`` answers ``--version``;
2. discover: the lab is built from a generated layout (the hosts as cabled; RoCE, its ports
   are veths) with lldpd in every host namespace and on every leaf; the agents start (dry
   run) and publish their discovery documents, ``linkguard fabric discover --broker ...
   --lldp`` writes the fabric with no unknowns, and it is the lab's;
3. dry run: both configs pass ``config check``; every host acks its plan, its exporter shows
   the dry run (``linkguard_routes_dry_run`` 1), the plan's epoch applied and the ports up,
   the service's ``/metrics`` every host online and none owing an ack; a link goes down: the
   host takes its fast path and every host acks its new plan (metrics, the ``plan_applied``
   log line with the routes it would have added), while no host namespace has a linkguard
   route or rule and the endpoints stay unroutable;
4. enable routes: ``routes.apply: true``, agents restarted (SIGTERM, exit 0): the plan in
   place is in the kernel at once (rule and table; the down link's endpoint via the other
   rail; ``linkguard_routes_dry_run`` 0); a second link down moves its endpoint in the peers'
   kernel tables;
5. signing: ``linkguard keys generate``; the service restarted with ``signing_key`` first (the
   agents, still without a key, apply its signed plans: ``signed_plan_not_verified``), then
   the agents with ``service_public_key`` (signed plans required): each logs
   ``plans_verified`` and ``reconciled_with_last_plan`` (the signed plan it kept), applies a
   newer epoch than before the restart, drops nothing as unsigned, refuses no state file; the
   service sees every host online and none unprotected (health 200), the kernel routes stay.
   TLS to the broker is not run here: tests/test_deploy.py and tests/test_bus_security.py run
   the agent and the service over deploy/make-certs.sh's certificates.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from linkguard.simulations.lab import Lab
from linkguard.simulations.labdiscover import LldpdSet, compare_discovered
from linkguard.simulations.labprocs import roce_fabric
from linkguard.topology.fabric import Fabric, load_fabric
from tests.e2e.harness import Observer, Procs, observer_bus, until
from tests.support import free_ports, require_root

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "examples"
CLI = Path(sys.executable).with_name("linkguard")
TABLE = 4242  # the examples' routes.table


def cli(*argv: str) -> str:
    """``linkguard ARGV`` (the installed command); its stdout. Fails the test on exit != 0."""
    out = subprocess.run([str(CLI), *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"linkguard {' '.join(argv)}: {out.returncode}\n{out.stderr}"
    return out.stdout


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET http://127.0.0.1:PORT/metrics: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def metric(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def http_status(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def linkguard_rules(netns: str) -> list[dict[str, Any]]:
    rules = json.loads(subprocess.check_output(["ip", "-n", netns, "-j", "rule"], text=True))
    return [r for r in rules if str(r.get("table")) == str(TABLE)]


def table(netns: str) -> list[dict[str, Any]]:
    """The routes of linkguard's table in ``netns`` (empty: none, or no such table yet)."""
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "route", "show", "table", str(TABLE)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        assert "FIB table does not exist" in out.stderr, out.stderr
        return []
    return json.loads(out.stdout or "[]")


def route_to(netns: str, dst: str) -> tuple[str | None, str | None] | None:
    """(gateway, dev) the host's kernel picks for ``dst`` (ip rules included); None when it
    has no route (``Network is unreachable``)."""
    out = subprocess.run(
        ["ip", "-n", netns, "-j", "route", "get", dst], capture_output=True, text=True
    )
    if out.returncode != 0:
        assert "unreachable" in out.stderr, out.stderr
        return None
    (r,) = json.loads(out.stdout)
    return r.get("gateway"), r.get("dev")


def agent_config(fabric: Fabric, lab: Lab, i: int, port: int, work: Path, metrics: int) -> dict:
    """deploy/examples/agent.yaml with what the lab needs: host i's name, namespace, netdev
    driver, ports and endpoints, the broker, file locations, a free exporter port."""
    cfg = yaml.safe_load((EXAMPLES / "agent.yaml").read_text())
    inv, lh = fabric.hosts[i], lab.hosts[i]
    cfg |= {
        "host": inv.host,
        "driver": "netlink",  # the lab's ports are veths: no /sys/class/infiniband
        "netns": lh.netns,
        "ports": [
            {
                "hca": h.hca,
                "port": h.port,
                "rail": h.rail,
                "netdev": h.netdev,
                "address": str(h.address),
                "link_layer": "Ethernet",
            }
            for h in inv.hcas
        ],
        "endpoints": [str(e) for e in inv.endpoints],
        "state_dir": str(work / inv.host),
        "rail_map_path": str(work / inv.host / "rail-map.json"),
        "metrics_listen": f"127.0.0.1:{metrics}",
    }
    cfg["bus"] |= {"host": "127.0.0.1", "port": port}
    return cfg


def current_acked(obs: Observer, names: list[str]) -> bool:
    """Every host applied the latest plan the observer saw for it."""
    plans = [obs.latest_plan(n) for n in names]
    return all(p is not None and obs.acked(n, p.epoch) for n, p in zip(names, plans, strict=True))


def write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.real
async def test_the_pilot_walk_through_dry_run_then_routes_then_signing(
    mosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_root()
    # the example's API is on (on a free port here); the suite turns it off by default
    monkeypatch.delenv("LINKGUARD_API__ENABLED", raising=False)

    # -- 1. install ------------------------------------------------------------------------
    assert cli("--version").startswith("linkguard ")

    # the hosts as cabled: the lab is built from a generated layout (RoCE: its ports are
    # veths), with lldpd in every host namespace and on every leaf; step 2 discovers it
    cli("fabric", "generate", "--hosts", "3", "--rails", "2", "-o", str(tmp_path / "gen.yaml"))
    fabric = roce_fabric(load_fabric(tmp_path / "gen.yaml"))
    names = [h.host for h in fabric.hosts]

    with Lab.from_fabric(fabric) as lab, contextlib.ExitStack() as stops:
        lldp = LldpdSet.start(lab, tmp_path)
        stops.callback(lldp.stop)  # before the lab's namespaces go
        lldp.wait_neighbours(lab)
        ns = {h.name: h.netns for h in lab.hosts}
        # the endpoints (GPU 0 of gpu000, home rail 0; GPU 0 of gpu001) and rail addresses
        ep0, ep1 = str(fabric.hosts[0].endpoints[0]), str(fabric.hosts[1].endpoints[0])
        rail1 = {h.host: str(h.hcas[1].address) for h in fabric.hosts}
        api_port, *metrics_ports = free_ports(1 + len(names))
        svc = yaml.safe_load((EXAMPLES / "topology.yaml").read_text())
        svc["fabric"] = str(tmp_path / "fabric.yaml")
        svc["bus"] |= {"host": "127.0.0.1", "port": mosquitto.port}
        svc["api"]["port"] = api_port
        svc["ledger"]["path"] = str(tmp_path / "ledger.sqlite3")
        cfgs = {"service": write(tmp_path / "topology.yaml", svc)}
        agents = {
            n: agent_config(fabric, lab, i, mosquitto.port, tmp_path, metrics_ports[i])
            for i, n in enumerate(names)
        }
        for n in names:  # the lab's lldpd has its own socket per host
            agents[n]["discovery"] = {"lldp": "on", "lldp_command": lldp.command(n)}
            cfgs[n] = write(tmp_path / f"agent-{n}.yaml", agents[n])
        mport = dict(zip(names, metrics_ports, strict=True))
        checked = yaml.safe_load(cli("config", "check", str(cfgs[names[0]]), "--role", "agent"))
        assert checked["routes"]["apply"] is False
        procs, obs = Procs(tmp_path), Observer()
        try:
            async with observer_bus(mosquitto.port, obs) as bus:
                await bus.wait_connected(10)
                # -- 2. discover the fabric: the agents first (dry run), then the command ----
                procs.seen = lambda: obs.summary(names)
                for n in names:
                    procs.start(n, ["agent", "-c", str(cfgs[n])])
                await until(
                    lambda: set(names) <= set(obs.discovery), 20, "discovery documents", procs
                )
                unknowns = tmp_path / "unknowns.json"
                broker = f"127.0.0.1:{mosquitto.port}"
                out = str(tmp_path / "fabric.yaml")
                done = subprocess.run(
                    [
                        str(CLI),
                        "fabric",
                        "discover",
                        "--broker",
                        broker,
                        "--lldp",
                        "-o",
                        out,
                        "--unknowns",
                        str(unknowns),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert done.returncode == 0, done.stderr
                assert "discovered 3 hosts, 2 rails, 2 switches" in done.stderr, done.stderr
                assert json.loads(unknowns.read_text()) == []
                found = load_fabric(tmp_path / "fabric.yaml")
                assert compare_discovered(found, fabric) == []  # the lab, as cabled
                cli("fabric", "show", "--fabric", str(tmp_path / "fabric.yaml"))

                # -- 3. dry run with metrics ---------------------------------------------
                cli("config", "check", str(cfgs["service"]), "--role", "service")
                procs.start("service", ["topology", "serve", "-c", str(cfgs["service"])])
                await until(lambda: current_acked(obs, names), 30, "initial plans acked", procs)
                for n in names:
                    plan = obs.latest_plan(n)
                    assert plan is not None
                    await until(
                        lambda n=n, e=plan.epoch: (
                            metric(scrape(mport[n]), "linkguard_plan_epoch_applied") == e
                        ),
                        10,
                        f"{n}'s exporter to show epoch {plan.epoch} applied",
                        procs,
                    )
                    m = scrape(mport[n])
                    assert metric(m, "linkguard_plans_applied_total") >= 1
                    assert metric(m, "linkguard_port_state", hca="mlx5_0", port="1", rail="0")
                    assert metric(m, "linkguard_port_state", hca="mlx5_1", port="1", rail="1")
                    assert metric(m, "linkguard_fast_path_total") == 0
                    assert metric(m, "linkguard_routes_dry_run") == 1
                status, health = http_status(f"http://127.0.0.1:{api_port}/api/v1/health")
                assert status == 200, health
                await until(
                    lambda: metric(scrape(api_port), "linkguard_hosts_pending_ack") == 0,
                    10,
                    "the service to see every host's ack",
                    procs,
                )
                s = scrape(api_port)
                assert metric(s, "linkguard_hosts", state="online") == len(names)
                assert metric(s, "linkguard_ports", status="up") == 2 * len(names)

                # a link goes down: decided, acked, not applied
                epoch = obs.max_epoch()
                lab.link_down(0, 0)
                await until(
                    lambda: obs.max_epoch() > epoch and current_acked(obs, names),
                    15,
                    "every host to ack its plan after the reroute",
                    procs,
                )
                m0 = scrape(mport[names[0]])
                assert metric(m0, "linkguard_fast_path_total") == 1
                assert metric(m0, "linkguard_port_state", hca="mlx5_0", port="1", rail="0") == 0
                for n in names:
                    plan = obs.latest_plan(n)
                    assert plan is not None
                    assert metric(scrape(mport[n]), "linkguard_plan_epoch_applied") == plan.epoch
                    assert table(ns[n]) == [], f"{n}: dry run, yet table {TABLE} has routes"
                    assert linkguard_rules(ns[n]) == [], f"{n}: dry run, yet an ip rule"
                assert route_to(ns[names[2]], ep0) is None
                assert route_to(ns[names[0]], ep1) is None
                await until(
                    lambda: metric(scrape(api_port), "linkguard_ports", status="down") == 1,
                    10,
                    "the service's metrics to show the port down",
                    procs,
                )
                applied = [
                    json.loads(line)
                    for line in (tmp_path / f"{names[2]}.log").read_text().splitlines()
                    if '"plan_applied"' in line
                ]
                assert applied and applied[0]["added"] > 0, applied  # would have added routes
                changed = [a["added"] + a["replaced"] + a["deleted"] for a in applied[1:]]
                assert any(changed), applied  # and changed some for the reroute

                # -- 4. enable routes --------------------------------------------------------
                for n in names:
                    agents[n]["routes"]["apply"] = True
                    write(cfgs[n], agents[n])
                    procs.killed.add(n)  # stopped on purpose while its config changes
                    procs.procs[n].send_signal(signal.SIGTERM)
                    assert procs.procs[n].wait(15) == 0, procs.tails()
                for n in names:
                    procs.start(n, ["agent", "-c", str(cfgs[n])])
                # the plan in place reaches the kernel: gpu000's GPU 0 endpoint over rail 1
                await until(
                    lambda: route_to(ns[names[2]], ep0) == (rail1[names[0]], "rail1"),
                    15,
                    f"{names[2]}'s kernel to route {ep0} over rail 1",
                    procs,
                )
                for n in names:
                    await until(
                        lambda n=n: linkguard_rules(ns[n]) and table(ns[n]),
                        10,
                        f"{n}'s ip rule and routes in table {TABLE}",
                        procs,
                    )
                    # its exporter started before it touched the kernel
                    assert metric(scrape(mport[n]), "linkguard_routes_dry_run") == 0, n
                assert route_to(ns[names[2]], ep1) == (None, "rail0") or route_to(
                    ns[names[2]], ep1
                ) == (str(fabric.hosts[1].hcas[0].address), "rail0")
                epoch = obs.max_epoch()
                lab.link_down(1, 0)  # gpu001's rail 0: its GPU 0 moves to rail 1 in the kernel
                await until(
                    lambda: route_to(ns[names[2]], ep1) == (rail1[names[1]], "rail1"),
                    15,
                    f"{names[2]}'s kernel to route {ep1} over rail 1",
                    procs,
                )
                await until(
                    lambda: obs.max_epoch() > epoch and current_acked(obs, names),
                    15,
                    "every host to ack its plan after the second reroute",
                    procs,
                )

                # -- 5. signing (TLS: tests/test_deploy.py, tests/test_bus_security.py) ------
                # the service first: agents without the key apply its signed plans meanwhile
                keys = tmp_path / "keys"
                cli("keys", "generate", "--out", str(keys))
                before = {
                    n: metric(scrape(mport[n]), "linkguard_plan_epoch_applied") for n in names
                }
                svc["signing_key"] = str(keys / "service.key")
                write(cfgs["service"], svc)
                procs.killed.add("service")
                procs.procs["service"].send_signal(signal.SIGTERM)
                assert procs.procs["service"].wait(15) == 0, procs.tails()
                procs.start("service", ["topology", "serve", "-c", str(cfgs["service"])])

                def signed_applied() -> bool:
                    return (
                        all(
                            metric(scrape(mport[n]), "linkguard_plan_epoch_applied") > before[n]
                            for n in names
                        )
                        and '"signed_plan_not_verified"'
                        in (tmp_path / f"{names[0]}.log").read_text()
                    )

                await until(signed_applied, 20, "every host to apply a signed plan", procs)
                # then the agents, with the service's public key (signed plans required)
                for n in names:
                    agents[n]["service_public_key"] = str(keys / "service.pub")
                    write(cfgs[n], agents[n])
                    procs.killed.add(n)
                    procs.procs[n].send_signal(signal.SIGTERM)
                    assert procs.procs[n].wait(15) == 0, procs.tails()
                    procs.start(n, ["agent", "-c", str(cfgs[n])])

                def verified(n: str) -> bool:
                    try:
                        m = scrape(mport[n])
                    except OSError:  # the restarted agent's exporter is not up yet
                        return False
                    return bool(
                        metric(m, "linkguard_bus_connected") == 1
                        and (metric(m, "linkguard_plan_epoch_applied") or 0) > before[n]
                    )

                for n in names:
                    await until(lambda n=n: verified(n), 15, f"{n} to verify its plan", procs)
                    # what the agent said since its restart
                    log = (tmp_path / f"{n}.log").read_text().split('"agent_starting"')[-1]
                    assert '"plans_verified"' in log and '"reconciled_with_last_plan"' in log, n
                    assert '"state_file_refused"' not in log and '"message_dropped"' not in log, n
                    m = scrape(mport[n])
                    assert not metric(m, "linkguard_messages_dropped_total", reason="unsigned")
                await until(
                    lambda: metric(scrape(api_port), "linkguard_hosts", state="online") == 3,
                    15,
                    "every host online again",
                    procs,
                )
                assert metric(scrape(api_port), "linkguard_hosts_unprotected") == 0
                assert route_to(ns[names[2]], ep1) == (rail1[names[1]], "rail1")
                status, health = http_status(f"http://127.0.0.1:{api_port}/api/v1/health")
                assert status == 200, health
        finally:
            codes = procs.stop()
        assert all(c == 0 for c in codes.values()), (codes, procs.tails())
