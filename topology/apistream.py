"""The change stream of the topology service's HTTP API: ``/api/v1/stream``, server-sent
events (tag ``events``).

Consumes: an :class:`~linkguard.topology.apiindex.ApiContext` (the service's change feed; the
app's ``closing`` event) and a client's ``Last-Event-ID``. Produces: the router with that route:
``retry:`` and a head comment, the changes missed since ``Last-Event-ID`` (or a ``resync``
event when they are gone), then every change as it comes, a keepalive comment every
:data:`KEEPALIVE_S`; the stream ends when ``closing`` is set.
"""

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import StreamingResponse

from linkguard.topology.apiindex import ApiContext
from linkguard.topology.changes import Change

__all__ = ["KEEPALIVE_S", "RETRY_MS", "stream_router"]

#: a comment line on an idle stream this often (s), so proxies and clients see it alive
KEEPALIVE_S = 15.0
#: what a stream client's EventSource waits before it reconnects (ms; SSE ``retry:``)
RETRY_MS = 1000


def stream_router(ctx: ApiContext) -> APIRouter:
    """The stream's route, reading ``ctx`` (a stream ends once ``ctx.state.closing`` is
    set)."""
    service, state = ctx.service, ctx.state
    router = APIRouter()

    @router.get(
        "/api/v1/stream",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
        tags=["events"],
    )
    async def stream(
        last_event_id: Annotated[
            str | None,
            Header(
                alias="Last-Event-ID",
                description="the id of the last change seen: the stream replays what came "
                "after it, or starts with a resync event when those are gone",
            ),
        ] = None,
    ) -> StreamingResponse:
        """Changes as server-sent events: ``id: <seq>``, ``event: <kind>``, ``data: {seq,
        kind, at, data}``; a ``: keepalive`` comment every 15 s; ``resync`` (reload) when
        changes were lost. Ends when the service stops."""
        return StreamingResponse(
            _changes(last_event_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _changes(last_event_id: str | None) -> AsyncIterator[str]:
        feed = service.changes
        closing: asyncio.Event = state.closing
        with feed.listen() as queue:  # first: nothing emitted from here on is missed
            head = feed.seq
            yield f"retry: {RETRY_MS}\n: linkguard changes, seq {head}\n\n"
            resume = _last_event_id(last_event_id, head)
            sent = head
            if last_event_id is not None:
                missed = feed.since(resume) if resume is not None else None
                if missed is None:
                    lost = {"reason": "the changes after Last-Event-ID are gone", "seq": head}
                    yield _sse(Change(head, "resync", time.time(), lost))
                else:
                    for c in missed:
                        yield _sse(c)
            async for item in _next(queue, closing):
                if item is None:
                    yield ": keepalive\n\n"
                elif item.kind == "resync":  # the queue overflowed; no id: a reconnect replays
                    yield _sse(item, with_id=False)
                elif item.seq > sent:
                    yield _sse(item)

    return router


def _sse(change: Change, *, with_id: bool = True) -> str:
    """One change as a server-sent event: ``id``, ``event`` (its kind), ``data`` (JSON)."""
    head = f"id: {change.seq}\n" if with_id else ""
    data = json.dumps(change.to_dict(), separators=(",", ":"))
    return f"{head}event: {change.kind}\ndata: {data}\n\n"


def _last_event_id(value: str | None, seq: int) -> int | None:
    """A client's ``Last-Event-ID`` as a change number of this service run; None when it has
    none, it is not a number, or it is above the feed's (a previous run's)."""
    if value is None or not re.fullmatch(r"[0-9]{1,19}", value.strip()):
        return None
    n = int(value.strip())
    return n if n <= seq else None


async def _next(
    queue: asyncio.Queue[Change], closing: asyncio.Event
) -> AsyncIterator[Change | None]:
    """The queue's changes, None after each :data:`KEEPALIVE_S` without one; ends once
    ``closing`` is set. Nothing is lost on the way out: a change taken is yielded."""
    stop = asyncio.ensure_future(closing.wait())
    get: asyncio.Future[Change] | None = None
    try:
        while not closing.is_set():
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, stop}, timeout=KEEPALIVE_S, return_when="FIRST_COMPLETED")
            if get.done():
                item = get.result()
                get = None
                yield item
            elif not stop.done():
                yield None
    finally:
        stop.cancel()
        if get is not None:
            get.cancel()  # an item it had not taken stays in the queue
