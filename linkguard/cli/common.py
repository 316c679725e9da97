"""What the command groups share: argparse types (``HOST:PORT``, bounded numbers, non-empty
text), the daemons' common options, pydantic errors as one line, and the output helpers (exit
codes: 1 runtime failure, 2 bad usage or configuration)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_BROKER = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)):"
    r"(?P<port>\d{1,5})$"
)


def broker_address(text: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[IPv6]:PORT`` (argparse type; ValueError on anything else)."""
    m = _BROKER.match(text)
    port = int(m["port"]) if m else 0
    if not m or not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be HOST:PORT or [IPV6]:PORT with port 1-65535, got {text!r}"
        )
    return (m["v6"] or m["host"], port)


def positive(kind: type, *, lo: float, hi: float):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not lo <= v <= hi:
            show = str if kind is int else "{:g}".format  # 1000000, not 1e+06
            raise argparse.ArgumentTypeError(
                f"must be between {show(lo)} and {show(hi)}, got {text}"
            )
        return v

    return parse


def nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def first_error(exc, options: dict[str, str] | None = None) -> str:
    """The first error of a pydantic ``ValidationError`` as a command-line message: the
    option (``options`` maps field names to options), the value when short, what is wrong."""
    e = exc.errors()[0]
    field = str(e["loc"][0]) if e["loc"] else ""
    where = (options or {}).get(field, field)
    value = e.get("input")
    if where and isinstance(value, str) and len(value) <= 60:
        where += f" {value!r}"
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "string_pattern_mismatch":
        msg = "a switch name is letters, digits, '.', '_' and '-', starting with a letter or digit"
    return f"{where}: {msg}" if where else msg


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-c",
        "--config",
        type=Path,
        help="YAML config file (LINKGUARD_* environment variables override it)",
    )
    p.add_argument("--log-format", choices=["json", "console"], help="default: json")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    p.add_argument(
        "--broker",
        metavar="HOST:PORT",
        type=broker_address,
        help="MQTT broker (default 127.0.0.1:1883)",
    )


def daemon_overrides(args: argparse.Namespace) -> dict:
    out: dict = {}
    if args.log_format:
        out["log_format"] = args.log_format
    if args.log_level:
        out["log_level"] = args.log_level
    if args.broker:
        out["bus"] = {"host": args.broker[0], "port": args.broker[1]}
    return out


def fail(msg: str, code: int) -> int:
    print(f"linkguard: {msg}", file=sys.stderr)
    return code


def write(output: Path | None, text: str) -> int:
    """``text`` to ``output`` or stdout; 0, or 1 when the file cannot be written."""
    if not output:
        sys.stdout.write(text)
        return 0
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        return fail(f"cannot write {output}: {exc.strerror or exc}", 1)
    return 0


class Stopped(Exception):
    """A run cancelled by SIGTERM or SIGINT (:func:`run_stoppable`); ``code`` is the shell's
    exit code for it (128 + the signal: 143 SIGTERM, 130 SIGINT)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stopped ({signal_name})")
        self.signal_name = signal_name
        self.code = 143 if signal_name == "SIGTERM" else 130


def run_stoppable(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` where SIGTERM (systemd, ``timeout``, CI) and SIGINT (Ctrl-C) both
    cancel the run, so its ``finally`` and ``async with`` teardown (a private broker, temporary
    directories, namespaces) runs before the process exits. Raises :class:`Stopped` naming the
    signal."""
    import asyncio
    import signal

    stopped_by: list[str] = []

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):

            def stop(name: str = sig.name) -> None:
                stopped_by.append(name)
                task.cancel()

            loop.add_signal_handler(sig, stop)
        return await coro

    try:
        return asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise Stopped(stopped_by[0] if stopped_by else "SIGINT") from None
