"""The verbs async event reader: a small process that streams RDMA async events as JSON lines.

Run it with the *system* Python, which is the one Debian's ``python3-pyverbs`` (rdma-core's
Cython bindings) is built for::

    /usr/bin/python3 -I /path/to/linkguard/drivers/verbs_reader.py

It needs only the standard library and ``pyverbs``; it imports nothing from linkguard (the
agent's virtualenv is not on its path). The agent (:mod:`linkguard.drivers.verbs_events`)
spawns it, reads its stdout and restarts it with back-off when it exits.

Why a process, and one per device: ``pyverbs.device.Context.get_async_event()`` blocks in
``ibv_get_async_event(3)`` *holding the GIL* (rdma-core ``pyverbs/device.pyx`` calls it without
``nogil``; Debian's 44.0 build never releases the GIL in ``device.so``). In one process with one
thread per device, the first blocked call would freeze every other thread. So the top process
lists the devices (``get_device_list()``) and starts one worker process per device
(``--hca NAME``) that opens its context and blocks on its events; all share the one stdout pipe
(each line is one ``write`` far below PIPE_BUF, so lines never interleave).

Output, one JSON object per line on stdout (UTF-8, ``\\n``-terminated, < 1 KiB):

- ``{"hca": "mlx5_0", "event": "PORT_ERR", "code": 10, "at": <wall s>, "mono": <monotonic s>}``
  per event, after it was acknowledged (``ibv_ack_async_event``). ``event`` is the name in
  rdma-core's ``enum ibv_event_type`` (``infiniband/verbs.h``) without ``IBV_EVENT_``, or
  ``"UNKNOWN"`` for a code this table does not know (``code`` is always the raw number).
  ``mono`` is ``CLOCK_MONOTONIC`` (system-wide, comparable with the agent's ``time.monotonic``).
  pyverbs' ``AsyncEvent`` exposes only ``event_type`` (no ``element.port_num``): events name the
  device, never a port.
- ``{"status": "started", "hcas": [...]}`` once the workers run.
- ``{"status": "no_devices"}`` then exit 0: ``get_device_list()`` raised (pyverbs raises
  ``PyverbsRDMAError("Failed to get devices list")`` when there is no device) or returned [].
- ``{"status": "unavailable", "error": "..."}`` then exit 0: ``pyverbs`` cannot be imported.
- ``{"status": "hca_error", "hca": ..., "error": ...}`` from a worker whose device cannot be
  opened or whose event call failed; the worker exits 1, the top process then stops the others
  and exits 1 (the agent restarts the whole reader).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

#: ``enum ibv_event_type`` of rdma-core ``libibverbs/verbs.h`` (values implicit, from 0), also
#: ``pyverbs.enums.IBV_EVENT_*`` in rdma-core 44.
EVENT_NAMES: dict[int, str] = {
    0: "CQ_ERR",
    1: "QP_FATAL",
    2: "QP_REQ_ERR",
    3: "QP_ACCESS_ERR",
    4: "COMM_EST",
    5: "SQ_DRAINED",
    6: "PATH_MIG",
    7: "PATH_MIG_ERR",
    8: "DEVICE_FATAL",
    9: "PORT_ACTIVE",
    10: "PORT_ERR",
    11: "LID_CHANGE",
    12: "PKEY_CHANGE",
    13: "SM_CHANGE",
    14: "SRQ_ERR",
    15: "SRQ_LIMIT_REACHED",
    16: "QP_LAST_WQE_REACHED",
    17: "CLIENT_REREGISTER",
    18: "GID_CHANGE",
    19: "WQ_FATAL",
}

_MAX_ERROR = 300  # characters of an error text in a status line


def emit(doc: dict[str, object]) -> None:
    """Write ``doc`` as one JSON line to stdout in one ``write`` and flush it."""
    os.write(1, (json.dumps(doc, separators=(",", ":")) + "\n").encode())


def event_line(hca: str, code: int, *, at: float, mono: float) -> dict[str, object]:
    """The output object of one event (see the module docstring)."""
    return {
        "hca": hca,
        "event": EVENT_NAMES.get(code, "UNKNOWN"),
        "code": code,
        "at": at,
        "mono": mono,
    }


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]


def _die_with_parent() -> None:
    """Linux prctl(PR_SET_PDEATHSIG, SIGKILL): never outlive the parent (best effort)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def worker(hca: str) -> int:
    """Open ``hca`` and stream its async events until the call fails (exit status 1)."""
    _die_with_parent()
    try:
        from pyverbs.device import Context

        ctx = Context(name=hca)
    except Exception as exc:  # PyverbsRDMAError (no such device, EACCES), ImportError
        emit({"status": "hca_error", "hca": hca, "error": _error(exc)})
        return 1
    while True:
        try:
            ev = ctx.get_async_event()  # blocks, holding the GIL
        except Exception as exc:  # PyverbsRDMAError: the device went away
            emit({"status": "hca_error", "hca": hca, "error": _error(exc)})
            return 1
        try:
            code = int(ev.event_type)
        except (TypeError, ValueError):
            code = -1
        ack = getattr(ev, "ack", None)  # pyverbs AsyncEvent.ack(): ibv_ack_async_event
        if ack is not None:
            ack()
        else:  # newer bindings ack through the context
            ctx.ack_async_event(ev)
        emit(event_line(hca, code, at=time.time(), mono=time.monotonic()))


def device_names() -> list[str] | None:
    """Names of the RDMA devices; None when pyverbs is missing (``unavailable`` said)."""
    try:
        from pyverbs.device import get_device_list
    except Exception as exc:  # ImportError, or a broken build (OSError from the .so)
        emit({"status": "unavailable", "error": _error(exc)})
        return None
    try:
        devices = get_device_list()
    except Exception:  # PyverbsRDMAError "Failed to get devices list": no devices
        return []
    names = []
    for d in devices:
        name = d.name.decode() if isinstance(d.name, bytes) else str(d.name)
        names.append(name)
    return names


def supervise() -> int:
    """List devices, run one worker per device, exit when one of them does."""
    _die_with_parent()  # the agent killed outright: no reader left blocking on events
    names = device_names()
    if names is None:
        return 0
    if not names:
        emit({"status": "no_devices"})
        return 0
    argv = [sys.executable, *(["-I"] if sys.flags.isolated else []), os.path.abspath(__file__)]
    children = {subprocess.Popen([*argv, "--hca", n]).pid: n for n in names}

    def kill_others(but: int | None) -> None:
        for other in children:
            if other != but:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other, signal.SIGTERM)

    def stop(*_: object) -> None:
        kill_others(None)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    emit({"status": "started", "hcas": names})
    pid, status = os.wait()
    rc = os.waitstatus_to_exitcode(status)
    emit({"status": "hca_exit", "hca": children.get(pid, "?"), "rc": rc})
    kill_others(pid)
    return 1


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--hca":
        return worker(argv[1])
    if argv:
        emit({"status": "unavailable", "error": f"usage: verbs_reader.py [--hca NAME], got {argv}"})
        return 2
    return supervise()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
