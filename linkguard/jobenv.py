"""The environment a job's worker starts with: the host's NCCL settings of this moment merged
into the worker's own environment, or a refusal (``linkguard exec``).

Consumes: the files the agent keeps next to its rail map (:class:`linkguard.nccl.NcclFiles`):
``nccl.env`` (profile ``plain``) or ``nccl-failover.env`` (profile ``failover``), and the
agent's liveness lock ``agent.lock`` in the same directory (:class:`AgentLock`, held by a
running agent). Produces: the worker's environment (:func:`merge`) and the command executed
in place of this process (:func:`main`, ``os.execvpe``), or a :class:`Refusal` with its exit
code.

Why per worker: NCCL reads ``NCCL_IB_HCA`` once per process, and an RDMA queue pair never
follows a route change, so the only moment a worker can be given the rails usable now is its
start. Run as the command of every start and every elastic restart (``torchrun --no-python
... linkguard exec -- python train.py``, ``srun linkguard exec -- python train.py``), each
worker gets the rails of its own start; a process already running keeps what it read.

Standard library only (``argparse``, ``fcntl``, ``shlex``, ``struct``): a worker's start pays
for this module, not for pydantic or the agent (``linkguard exec -- true``: about 40 ms on a
2-core machine). ``--config`` alone loads the agent's settings to find the directory, as
``linkguard nccl env -c`` does (pydantic: about 300 ms in all).

Exit codes (before the command runs; after ``exec`` the command's own code is the process's):

* :data:`EXIT_USAGE` 2: bad arguments, an agent config that does not load, no command.
* :data:`EXIT_NO_USABLE_RAIL` 69 (``EX_UNAVAILABLE``): the agent says no port of the host is
  usable (its file sets ``NCCL_IB_DISABLE=1``). ``--allow-no-usable-rail`` runs the command
  anyway with ``NCCL_IB_DISABLE=1`` (NCCL over sockets, i.e. IP, which the routes move).
* :data:`EXIT_NO_PLAN` 75 (``EX_TEMPFAIL``, try again later): no current plan: the file is
  missing, unreadable or malformed, or no agent holds ``agent.lock`` (the agent is not
  running, so nothing keeps the file current). ``--allow-no-plan`` runs the command with its
  environment unchanged.
* 126 / 127: the command cannot be executed / is not found (as a shell says).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import re
import shlex
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "AGENT_LOCK",
    "DEFAULT_DIR",
    "EXIT_NOT_EXECUTABLE",
    "EXIT_NOT_FOUND",
    "EXIT_NO_PLAN",
    "EXIT_NO_USABLE_RAIL",
    "EXIT_USAGE",
    "FUSION_KEYS",
    "PROFILES",
    "AgentLock",
    "HostNccl",
    "Merged",
    "Refusal",
    "add_arguments",
    "agent_running",
    "main",
    "merge",
    "parse_env_file",
    "prepare",
    "read_host_nccl",
]

EXIT_USAGE = 2
#: sysexits.h EX_UNAVAILABLE: the host has no usable rail
EXIT_NO_USABLE_RAIL = 69
#: sysexits.h EX_TEMPFAIL: no current plan (missing, unreadable, malformed, agent not running)
EXIT_NO_PLAN = 75
#: as a POSIX shell reports a command it found but cannot execute / did not find
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

#: where the agent writes by default: the parent of ``rail_map_path``'s default
#: (``/run/linkguard/rail-map.json``, :class:`linkguard.config.AgentSettings`)
DEFAULT_DIR = Path("/run/linkguard")
#: the lock file a running agent holds (an open-file-description read lock) in that directory
AGENT_LOCK = "agent.lock"
#: profile -> the file of :class:`linkguard.nccl.NcclFiles` it reads
PROFILES = {"plain": "nccl.env", "failover": "nccl-failover.env"}
#: NCCL's fused-NIC variables (``nccl-failover.env``): with the failover profile the file owns
#: them, so one the file leaves out (the group lost a port) is removed from the job's
#: environment too: a stale fusion of a broken pair would be fatal at its next loss
FUSION_KEYS = (
    "NCCL_IB_MERGE_NICS",
    "NCCL_NET_MERGE_LEVEL",
    "NCCL_NET_FORCE_MERGE",
    "NCCL_IB_RESILIENCY_PORT_FAILOVER",
)
#: the largest file read: the agent's are about 100 bytes per port plus comments
MAX_FILE_BYTES = 64 * 1024

_KEY = re.compile(r"^NCCL_[A-Z0-9_]{1,64}$")
_HEADER = re.compile(r"^# linkguard NCCL settings for (?P<host>\S+), plan epoch (?P<epoch>\S+)$")
# struct flock on Linux (x86-64, arm64): short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid, padded to 32 bytes
_FLOCK = struct.Struct("hhqqi4x")


class Refusal(Exception):
    """``linkguard exec`` will not start the command: ``code`` is the exit code (one of the
    ``EXIT_*`` constants), the message says why and what overrides it."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- the agent's liveness ------------------------------------------------------------------------


class AgentLock:
    """The lock a running agent holds on ``directory/agent.lock``: an open-file-description
    read lock (``F_OFD_SETLK``), released by the kernel when the agent exits however it exits,
    so a lock nobody holds means no agent keeps the files current. A reader cannot take a write
    lock on a root-owned 0644 file, so no job can keep the agent from taking it. OSError when
    the file cannot be created or locked."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / AGENT_LOCK
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            os.fchmod(fd, 0o644)  # readable by jobs whatever the umask
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def agent_running(directory: Path) -> bool | None:
    """Whether an agent holds ``directory/agent.lock`` (:class:`AgentLock`): True / False, or
    None when it cannot be told (the file is not readable by this user, or the kernel has no
    open-file-description locks: Linux < 3.15). Tests for a conflicting write lock
    (``F_OFD_GETLK``) without taking one."""
    try:
        fd = os.open(directory / AGENT_LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        held = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0]
    except (OSError, AttributeError):
        return None
    finally:
        os.close(fd)
    return held != fcntl.F_UNLCK


# -- the agent's files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HostNccl:
    """One of the agent's env files, read: ``env`` (``NCCL_*`` -> value, in file order),
    ``host`` and plan ``epoch`` of its header (None before the agent's first plan: port states
    only), the ports it left out (``"mlx5_3:1 rail 3 (down)"``) and its warnings (fused NICs
    that lost a port)."""

    path: Path
    host: str
    epoch: int | None
    env: dict[str, str]
    left_out: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """False when the agent found no usable port (``NCCL_IB_DISABLE=1``, no HCA list)."""
        return self.env.get("NCCL_IB_DISABLE") != "1" and bool(self.env.get("NCCL_IB_HCA"))


def parse_env_file(text: str, source: str = "nccl.env") -> HostNccl:
    """Parse the text of an agent's env file (:class:`linkguard.nccl.NcclFiles`: the header
    ``# linkguard NCCL settings for HOST, plan epoch N``, ``# left out: ...`` and ``#
    warning: ...`` comments, then ``KEY=VALUE`` lines, values shell-quoted). Only ``NCCL_*``
    keys are taken: anything else (``LD_PRELOAD=...``) is refused, never put into a job's
    environment. Raises ValueError naming ``source`` and the line."""
    lines = text.splitlines()
    head = _HEADER.match(lines[0]) if lines else None
    if head is None:
        raise ValueError(
            f"{source}: line 1 is not the agent's header ('# linkguard NCCL settings for HOST, "
            "plan epoch N'): not written by the linkguard agent"
        )
    epoch_text = head["epoch"]
    if epoch_text == "None":
        epoch = None
    elif epoch_text.isdigit():
        epoch = int(epoch_text)
    else:
        raise ValueError(f"{source}: line 1: plan epoch {epoch_text!r} is not a number")
    env: dict[str, str] = {}
    left_out: list[str] = []
    warnings: list[str] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        if line.startswith("#"):
            for tag, into in (("# left out: ", left_out), ("# warning: ", warnings)):
                if line.startswith(tag):
                    into.append(line[len(tag) :])
            continue
        try:
            words = shlex.split(line, posix=True)
        except ValueError as exc:  # an unterminated quote
            raise ValueError(f"{source}: line {n}: {exc}: {line[:120]!r}") from None
        if len(words) != 1 or "=" not in words[0]:
            raise ValueError(f"{source}: line {n}: expected KEY=VALUE, got {line[:120]!r}")
        key, value = words[0].split("=", 1)
        if not _KEY.match(key):
            raise ValueError(f"{source}: line {n}: {key[:70]!r} is not an NCCL_* variable: refused")
        if "\0" in value:
            raise ValueError(f"{source}: line {n}: {key} holds a NUL byte")
        env[key] = value
    if not env:
        raise ValueError(f"{source}: no NCCL_* setting in it")
    return HostNccl(
        path=Path(source),
        host=head["host"],
        epoch=epoch,
        env=env,
        left_out=tuple(left_out),
        warnings=tuple(warnings),
    )


def read_host_nccl(directory: Path, profile: str = "plain", *, need_agent: bool = True) -> HostNccl:
    """The agent's current settings for ``profile`` (``plain``: ``nccl.env``; ``failover``:
    ``nccl-failover.env``) in ``directory``. Raises :class:`Refusal` with
    :data:`EXIT_NO_PLAN` when the file is missing, unreadable or malformed, or (``need_agent``)
    no agent holds ``agent.lock``."""
    path = directory / PROFILES[profile]
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise Refusal(
            EXIT_NO_PLAN,
            f"no current plan: {path} does not exist (is the agent running with its "
            "rail_map_path in this directory? --dir / -c say where)",
        ) from None
    except OSError as exc:
        raise Refusal(EXIT_NO_PLAN, f"no current plan: cannot read {path}: {exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise Refusal(EXIT_NO_PLAN, f"no current plan: {path} is over {MAX_FILE_BYTES} bytes")
    try:
        doc = parse_env_file(raw.decode("utf-8"), str(path))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refusal(EXIT_NO_PLAN, f"no current plan: malformed file: {exc}") from None
    if need_agent and agent_running(directory) is False:
        raise Refusal(
            EXIT_NO_PLAN,
            f"no current plan: no agent holds {directory / AGENT_LOCK} (the agent is not "
            f"running), so {path.name} (plan epoch {doc.epoch}) may be stale",
        )
    return doc


# -- the merge ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Merged:
    """The worker's environment and what the merge did to the job's own values: ``replaced``
    (key, job's value, linkguard's), ``kept`` (key, job's value, linkguard's: ``keep_env``),
    ``removed`` (fusion keys the failover file no longer sets)."""

    env: dict[str, str]
    replaced: list[tuple[str, str, str]] = field(default_factory=list)
    kept: list[tuple[str, str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def merge(
    environ: Mapping[str, str],
    settings: Mapping[str, str],
    *,
    keep_env: bool = False,
    profile: str = "plain",
) -> Merged:
    """``environ`` with linkguard's ``settings`` (a :attr:`HostNccl.env`) merged in. Every
    key the settings set replaces the job's value (they are the rails usable now; the job's
    value was fixed when the job was written), unless ``keep_env``: then a key the job set
    explicitly keeps the job's value. Keys the settings do not set are left as the job has
    them, except (profile ``failover``) the :data:`FUSION_KEYS`, which the failover file
    owns: one it does not set is removed, or with ``keep_env`` kept and listed in ``kept``
    with linkguard's value ``""`` (unset). Pure."""
    env = dict(environ)
    out = Merged(env)
    for key, ours in settings.items():
        theirs = environ.get(key)
        if theirs is not None and keep_env:
            if theirs != ours:
                out.kept.append((key, theirs, ours))
            continue
        if theirs is not None and theirs != ours:
            out.replaced.append((key, theirs, ours))
        env[key] = ours
    if profile == "failover":
        for key in FUSION_KEYS:
            if key not in settings and key in env:
                if keep_env:  # kept, and said: its fusion may be of a pair that lost a port
                    out.kept.append((key, env[key], ""))
                    continue
                del env[key]
                out.removed.append(key)
    return out


# -- the command ----------------------------------------------------------------------------------

_DESCRIPTION = (
    "Run COMMAND (replacing this process: os.execvpe) with the host's NCCL settings of this "
    "moment merged into its environment, as the agent wrote them next to its rail map: "
    "NCCL_IB_HCA of the usable ports and NCCL_TOPO_FILE without the unusable NICs (profile "
    "plain: nccl.env), or the fused-NIC variables for NCCL >= 2.29.7's port failover (profile "
    "failover: nccl-failover.env). NCCL reads them once per process, so run this as the "
    "command of every worker start: torchrun --no-python ... linkguard exec -- python "
    "train.py; srun ... linkguard exec -- python train.py. Linkguard's values replace the "
    "job's own (a NCCL_IB_HCA fixed when the job was written would put a lost rail back); "
    "--keep-env keeps every value the job sets explicitly."
)
_EPILOG = (
    f"Exit codes before COMMAND runs: {EXIT_USAGE} bad arguments or agent config; "
    f"{EXIT_NO_USABLE_RAIL} no usable rail on this host (NCCL_IB_DISABLE=1 in the file; "
    f"--allow-no-usable-rail runs over IP); {EXIT_NO_PLAN} no current plan: the file is "
    "missing, unreadable or malformed, or the agent is not running (nobody holds agent.lock; "
    f"--allow-no-plan runs with the environment unchanged); {EXIT_NOT_EXECUTABLE} COMMAND "
    f"cannot be executed; {EXIT_NOT_FOUND} COMMAND not found. Otherwise COMMAND's own exit "
    "code. The directory: --dir, else the parent of -c's rail_map_path, else of "
    f"$LINKGUARD_RAIL_MAP_PATH, else {DEFAULT_DIR}."
)


def _profile(text: str) -> str:
    text = {"default": "plain"}.get(text, text)
    if text not in PROFILES:
        raise argparse.ArgumentTypeError(f"{text!r}: choose plain (alias default) or failover")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``linkguard exec`` (shared by its own parser and ``linkguard --help``)."""
    p.usage = (
        "%(prog)s [-h] [--dir DIR | -c CONFIG] [--profile {plain,failover}] [--keep-env]\n"
        "       [--allow-no-plan] [--allow-no-usable-rail] [-q] -- COMMAND [ARGS...]"
    )
    p.description = _DESCRIPTION
    p.epilog = _EPILOG
    where = p.add_mutually_exclusive_group()
    where.add_argument("--dir", type=Path, metavar="DIR", help="the directory of the agent's files")
    where.add_argument(
        "-c", "--config", type=Path, help="the agent's YAML config (its rail_map_path's directory)"
    )
    p.add_argument(
        "--profile",
        type=_profile,
        default="plain",
        metavar="{plain,failover}",
        help="plain (alias default): nccl.env; failover: nccl-failover.env (default plain)",
    )
    p.add_argument(
        "--keep-env",
        action="store_true",
        help="a variable the job sets explicitly keeps the job's value (default: linkguard's "
        "value replaces it, noted on stderr)",
    )
    p.add_argument(
        "--allow-no-plan",
        action="store_true",
        help=f"run COMMAND unchanged instead of exiting {EXIT_NO_PLAN} when there is no "
        "current plan",
    )
    p.add_argument(
        "--allow-no-usable-rail",
        action="store_true",
        help=f"run COMMAND with NCCL_IB_DISABLE=1 instead of exiting {EXIT_NO_USABLE_RAIL}",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no notes on stderr")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="what to run"
    )


def _directory(args: argparse.Namespace, environ: Mapping[str, str]) -> Path:
    if args.dir is not None:
        return args.dir
    if args.config is not None:
        # lazy: a worker's exec path must not load the settings (pydantic); only --config does
        from linkguard.config import AgentSettings, ConfigError, load_settings

        try:
            return load_settings(AgentSettings, args.config).rail_map_path.parent
        except ConfigError as exc:
            raise Refusal(EXIT_USAGE, str(exc)) from None
    rail_map = environ.get("LINKGUARD_RAIL_MAP_PATH")
    return Path(rail_map).parent if rail_map else DEFAULT_DIR


def prepare(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    note: Callable[[str], None] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command and the environment to execute it with, for parsed ``args``; ``note``
    (a callable taking one line) hears what was replaced, left out or allowed. Raises
    :class:`Refusal`."""
    note = note or (lambda _line: None)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise Refusal(EXIT_USAGE, "no command: linkguard exec [OPTIONS] -- COMMAND [ARGS...]")
    directory = _directory(args, environ)
    try:
        doc = read_host_nccl(directory, args.profile)
    except Refusal as exc:
        if exc.code != EXIT_NO_PLAN or not args.allow_no_plan:
            raise
        note(f"{exc}; running without linkguard's settings (--allow-no-plan)")
        return command, dict(environ)
    if not doc.usable:
        if not args.allow_no_usable_rail:
            lost = "; ".join(doc.left_out) or "no port"
            raise Refusal(
                EXIT_NO_USABLE_RAIL,
                f"no usable rail on {doc.host} (plan epoch {doc.epoch}): {lost}; "
                "--allow-no-usable-rail runs it with NCCL_IB_DISABLE=1 (NCCL over IP)",
            )
        note(f"no usable rail on {doc.host}: NCCL_IB_DISABLE=1 (--allow-no-usable-rail)")
    for line in doc.left_out:
        note(f"{doc.host} plan epoch {doc.epoch}: left out {line}")
    for line in doc.warnings:
        note(f"warning: {line}")
    merged = merge(environ, doc.env, keep_env=args.keep_env, profile=args.profile)
    for key, theirs, ours in merged.replaced:
        note(f"{key}={theirs} replaced by {ours} (rails usable now; --keep-env keeps the job's)")
    for key, theirs, ours in merged.kept:
        if ours:
            note(f"{key}={theirs} kept (--keep-env), linkguard's is {ours}")
        else:
            note(
                f"{key}={theirs} kept (--keep-env), though {doc.path.name} does not set it: a "
                "fusion of a pair that lost a port is fatal at its next loss"
            )
    for key in merged.removed:
        note(f"{key} removed: {doc.path.name} fuses no group that lost a port")
    return command, merged.env


def main(argv: Sequence[str] | None = None) -> int:
    """``linkguard exec``: never returns when the command starts (``os.execvpe``); else the
    exit code of the refusal."""
    p = argparse.ArgumentParser(prog="linkguard exec")
    add_arguments(p)
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))

    def note(line: str) -> None:
        if not args.quiet:
            print(f"linkguard exec: {line}", file=sys.stderr)

    try:
        command, env = prepare(args, os.environ, note)
    except Refusal as exc:
        print(f"linkguard exec: {exc}", file=sys.stderr)
        return exc.code
    with contextlib.suppress(ValueError, OSError):
        sys.stderr.flush()
        sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"linkguard exec: {command[0]}: command not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:
        code = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_NOT_EXECUTABLE
        print(f"linkguard exec: {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return code
    return EXIT_NOT_EXECUTABLE  # not reached: execvpe returns only by raising
