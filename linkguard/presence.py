"""Who else claims to be me: two agents with one host name (cloned machines), or two
topology services on one broker. Pure decision code.

Every process announces ``online`` with a random ``instance`` id and its ``started_at`` time.
Seeing a *live* (not retained) announcement of another instance for the same name means a
duplicate: the one that started later yields (stops with an error), the earlier one logs an
error and re-announces itself so the newcomer sees it. Seeing another instance's ``offline``
(its last will or clean exit) means our retained announcement was overwritten: re-announce.
Retained announcements are history from before we connected and are never acted on.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

__all__ = ["Announcement", "DuplicateInstanceError", "Me", "Verdict", "judge"]


class DuplicateInstanceError(RuntimeError):
    """Another process with this identity (host name, or the topology service) started first;
    this one stopped."""


class Announcement(Protocol):
    @property
    def online(self) -> bool: ...
    @property
    def instance(self) -> str | None: ...
    @property
    def started_at(self) -> float | None: ...


class Verdict(Enum):
    IGNORE = "ignore"
    YIELD = "yield"  # another instance started first: stop
    HOLD = "hold"  # I started first: log the duplicate, re-announce
    REASSERT = "reassert"  # another instance's offline overwrote mine: re-announce


@dataclass(frozen=True)
class Me:
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    started_at: float = field(default_factory=time.time)


def judge(me: Me, seen: Announcement, *, retained: bool) -> Verdict:
    """What to do about ``seen``, an announcement on my own status topic."""
    if retained or seen.instance is None or seen.instance == me.instance:
        return Verdict.IGNORE
    if not seen.online:
        return Verdict.REASSERT
    theirs = (seen.started_at if seen.started_at is not None else float("inf"), seen.instance)
    return Verdict.YIELD if theirs < (me.started_at, me.instance) else Verdict.HOLD
