"""linkguard.drivers.rtnl: the agent's pyroute2 names without pyroute2's package ``__init__``
(issue 23), and the whole package on the first use of any other of its names. Each check runs
in a fresh interpreter: this test process has imported pyroute2 one way or the other already."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import asyncio, json, sys
import linkguard.agent.daemon  # the agent's imports, pyroute2's through linkguard.drivers.rtnl
from linkguard.drivers import rtnl

def heavy():
    return sorted(m for m in ("pyroute2.ipdb", "pyroute2.ndb.main", "pyroute2.ipset")
                  if m in sys.modules)

out = {"agent": heavy()}
from pyroute2 import netns  # a submodule: imported alone
out["netns"] = heavy()

async def links():
    async with rtnl.AsyncIPRoute() as ipr:  # a real rtnetlink dump of this namespace's links
        return [link.get("ifname") async for link in await ipr.get_links()]

out["links"] = asyncio.run(links())
import pyroute2
out["version"] = pyroute2.__version__  # set by pyroute2.config.version, not by __init__
from pyroute2 import NDB, IPRoute  # the package's own names: its __init__ runs now
out["full"] = heavy()
out["same_class"] = pyroute2.AsyncIPRoute is rtnl.AsyncIPRoute
out["iproute"] = IPRoute.__module__
out["all"] = len(pyroute2.__all__)
print(json.dumps(out))
"""


def test_the_agent_loads_pyroute2_without_its_package_init_and_the_rest_on_demand(
    tmp_path,
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path, timeout=150
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["agent"] == []  # none of IPDB, NDB, ipset
    assert got["netns"] == []
    assert "lo" in got["links"]
    assert got["full"] == ["pyroute2.ipdb", "pyroute2.ipset", "pyroute2.ndb.main"]
    assert got["same_class"] is True
    assert got["iproute"] == "pyroute2.iproute.linux"
    assert got["all"] > 60  # pyroute2 0.9.7's __init__ exports 70 names
