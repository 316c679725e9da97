"""The pyroute2 names the drivers use, imported from the modules that define them, without
running pyroute2's package ``__init__`` until something asks it for one of its own names.

Consumes: the installed pyroute2 (0.9.x). Produces: :class:`AsyncIPRoute`,
:class:`NetlinkError`, the rtnetlink constants below and pyroute2's ``config`` module.

Why (issue 23, a lean agent): ``pyroute2/__init__.py`` re-exports every socket family it has
(IPDB, NDB, nftables, nl80211, WireGuard, Plan 9, ...): importing it is 200 modules, 10.6 MiB of
RSS and ~0.1 s (measured on the base install, Python 3.11, pyroute2 0.9.7:
``benchmarks/agent.py``), of which the agent uses one socket class and a few constants (about
half of that memory and time). Its ``__init__`` only imports and re-exports (pyroute2 0.9.7,
checked), so the package module is created here without running it: a submodule import
(``pyroute2.iproute.linux``, ``from pyroute2 import config``) works as usual, and the first
lookup of any other name on the package (``from pyroute2 import NDB`` in a test, a simulation,
another library) runs the real ``__init__`` in place, once, after which the package is
pyroute2's own. When pyroute2 was imported before this module, nothing is changed.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading


def _lazy_package(name: str = "pyroute2") -> None:
    """Put ``name``'s package module in ``sys.modules`` without executing its ``__init__``
    (see the module docstring); a no-op when it is imported already or cannot be found (the
    import below then fails as it would have)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    # __init__ runs once: another thread asking meanwhile waits for it to finish
    init_lock = threading.RLock()
    ran: list[bool] = []

    def __getattr__(attr: str) -> object:  # PEP 562: only for names not set on the module
        if importlib.util.find_spec(f"{name}.{attr}") is not None:  # a submodule: just that
            return importlib.import_module(f"{name}.{attr}")
        with init_lock:  # one of the package's own names: run __init__ (once)
            if not ran:
                ran.append(True)
                loader.exec_module(module)
                del module.__dict__["__getattr__"]  # the package is pyroute2's own now
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    module.__dict__["__getattr__"] = __getattr__
    sys.modules[name] = module


_lazy_package()

from pyroute2 import config  # noqa: E402
from pyroute2.iproute.linux import AsyncIPRoute  # noqa: E402
from pyroute2.netlink.exceptions import NetlinkError  # noqa: E402
from pyroute2.netlink.rtnl import RTMGRP_LINK  # noqa: E402
from pyroute2.netlink.rtnl.fibmsg import FR_ACT_TO_TBL  # noqa: E402
from pyroute2.netlink.rtnl.ifinfmsg import IFF_LOWER_UP, IFF_UP  # noqa: E402

__all__ = [
    "FR_ACT_TO_TBL",
    "IFF_LOWER_UP",
    "IFF_UP",
    "RTMGRP_LINK",
    "AsyncIPRoute",
    "NetlinkError",
    "config",
]
