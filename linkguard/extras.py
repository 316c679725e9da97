"""The optional dependencies: which extra of the ``linkguard`` distribution brings each one.

The base install (``pip install linkguard``) is the per-host agent's (issue 23: a GPU host
installs no web framework, graph library, plotting or packet crafting). Consumes: an exception
(a ``ModuleNotFoundError``, or an exception group holding only such errors, as a daemon's task
group raises). Produces: the one-line message a command prints for it, naming the missing
module and the extra to install, or None when the missing module is not one of ours to name
(a broken install, a typo: the error then propagates unchanged).

The extras themselves are ``[project.optional-dependencies]`` in ``pyproject.toml``;
``tests/test_extras.py`` holds :data:`EXTRAS` to them.
"""

from __future__ import annotations

__all__ = ["EXTRAS", "install_hint", "missing_extra_message"]

#: top-level import name -> the extras that install it (the first is the one a message names:
#: the smallest that brings it)
EXTRAS: dict[str, tuple[str, ...]] = {
    "networkx": ("service", "sim"),
    "fastapi": ("service",),
    "starlette": ("service",),  # fastapi's
    "uvicorn": ("service",),
    "fastapi_offline": ("service",),
    "aetcd": ("service",),
    "httpx": ("service",),
    "amqtt": ("broker",),
    "matplotlib": ("sim",),
    "scapy": ("probes",),
}


def install_hint(module: str, prefer: str | None = None) -> str:
    """``pip install 'linkguard[<extra>]'`` for an optional ``module`` (top-level import name):
    ``prefer`` when it brings the module (``all`` always does), else the smallest extra that
    does. KeyError for a module that is no extra's."""
    extras = EXTRAS[module.split(".")[0]]
    extra = prefer if prefer == "all" or prefer in extras else extras[0]
    return f"pip install 'linkguard[{extra}]'"


def _missing(exc: BaseException) -> list[str] | None:
    """The top-level names of the optional modules ``exc`` reports missing; None when it holds
    anything else."""
    if isinstance(exc, BaseExceptionGroup):
        names: list[str] = []
        for e in exc.exceptions:
            inner = _missing(e)
            if inner is None:
                return None
            names.extend(inner)
        return names
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        return [top] if top in EXTRAS else None
    return None


def missing_extra_message(exc: BaseException, what: str, prefer: str | None = None) -> str | None:
    """``what`` (e.g. ``linkguard topology serve``) needs the module ``exc`` reports missing:
    the message naming it and the extra to install (``prefer``, the command's own extra, when
    it brings the module; see :func:`install_hint`); None when ``exc`` is not (only) a missing
    optional module."""
    names = _missing(exc)
    if not names:
        return None
    name = names[0]
    return (
        f"{what} needs the Python package {name!r}, which the base install (the agent's) "
        f"leaves out: {install_hint(name, prefer)}"
    )
