"""``linkguard broker``: an embedded MQTT broker (amqtt) for single-machine trials."""

from __future__ import annotations

import argparse
import sys

from linkguard.cli.common import fail, positive


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    b = sub.add_parser(
        "broker", formatter_class=fmt, help="embedded MQTT broker (amqtt) for single-machine trials"
    )
    b.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    b.add_argument(
        "--port", type=positive(int, lo=1, hi=65535), default=1883, help="TCP port (1-65535)"
    )
    b.add_argument(
        "--log-format", choices=["json", "console"], default="console", help="log line format"
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from linkguard.broker import embedded_broker
    from linkguard.logs import configure_logging

    configure_logging(args.log_format, "info")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with embedded_broker(host=args.bind, port=args.port) as port:
            print(f"linkguard broker listening on {args.bind}:{port}", file=sys.stderr, flush=True)
            await stop.wait()

    try:
        asyncio.run(serve())
    except OSError as exc:
        return fail(str(exc), 1)
    return 0
