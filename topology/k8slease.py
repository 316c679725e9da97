"""The Kubernetes Lease as the topology service's leader election reads and writes it, and the
pure decision on it: :func:`parse_lease` (a ``coordination.k8s.io/v1`` Lease -> a
:class:`LeaseRecord`, :class:`LeaseFormatError` for anything else), :func:`decide` (record,
identity and ``now`` in; :class:`Create`, :class:`Acquire`, :class:`Renew`, :class:`Wait` or
:class:`Lost` out) and the bodies written (:func:`lease_body`, :func:`release_spec`). No I/O,
no clock: :class:`~linkguard.topology.leader_k8s.KubernetesLease` (which re-exports these names)
talks to the API server."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping


#: the apiVersion of a Lease object
API_VERSION = "coordination.k8s.io/v1"


class LeaseFormatError(ValueError):
    """A Lease object (or one of its fields) that is not what the Kubernetes API defines;
    the message names the field and the value."""


#: RFC 3339 date-time (``metav1.Time`` has seconds, ``MicroTime`` 6 fraction digits; up to 9
#: accepted); an offset is required
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def parse_micro_time(value: object, field: str = "time") -> datetime:
    """An RFC 3339 time as the API server gives it (``2026-12-01T03:38:21.123456Z``; seconds
    only and numeric offsets accepted, digits beyond microseconds dropped) -> an aware UTC
    datetime. Raises :class:`LeaseFormatError` naming ``field`` for anything else."""
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise LeaseFormatError(f"Lease {field}: {value!r} is not an RFC 3339 time")
    text = value.upper().replace("Z", "+00:00")
    frac = re.search(r"\.(\d+)", text)
    if frac and len(frac[1]) > 6:  # nanoseconds: Python keeps microseconds
        text = text[: frac.start(1) + 6] + text[frac.end(1) :]
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError as exc:  # 2026-13-45 passes the pattern
        raise LeaseFormatError(f"Lease {field}: {value!r}: {exc}") from None


def format_micro_time(t: datetime) -> str:
    """An aware datetime -> ``MicroTime`` as client-go writes it (UTC, 6 digits, ``Z``)."""
    if t.tzinfo is None:
        raise ValueError("format_micro_time needs an aware datetime")
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease the election reads. ``holder`` None or "" = released;
    ``duration_s``/``renew_time`` None when absent (client-go leaves them unset on a fresh
    Lease); ``transitions`` 0 when absent."""

    resource_version: str
    holder: str | None
    duration_s: int | None
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int


def parse_lease(obj: object) -> LeaseRecord:
    """A Lease object as the API server returns it (JSON decoded) -> :class:`LeaseRecord`.
    Raises :class:`LeaseFormatError` naming the field when it is not a Lease, has no
    ``metadata.resourceVersion``, or a spec field has the wrong type or range (Lease spec:
    ``leaseDurationSeconds`` and ``leaseTransitions`` int32 >= 0 resp. > 0 in practice)."""
    if not isinstance(obj, dict):
        raise LeaseFormatError(f"Lease: expected an object, got {type(obj).__name__}")
    if obj.get("kind", "Lease") != "Lease":
        raise LeaseFormatError(f"Lease: kind is {obj.get('kind')!r}, not 'Lease'")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise LeaseFormatError("Lease metadata: missing or not an object")
    rv = meta.get("resourceVersion")
    if not isinstance(rv, str) or not rv:
        raise LeaseFormatError(f"Lease metadata.resourceVersion: {rv!r} is not a non-empty string")
    spec = obj.get("spec", {})
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise LeaseFormatError(f"Lease spec: expected an object, got {type(spec).__name__}")

    def integer(name: str, low: int) -> int | None:
        v = spec.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 2**31 - 1:
            raise LeaseFormatError(f"Lease spec.{name}: {v!r} is not an int32 >= {low}")
        return v

    holder = spec.get("holderIdentity")
    if holder is not None and not isinstance(holder, str):
        raise LeaseFormatError(f"Lease spec.holderIdentity: {holder!r} is not a string")

    def when(name: str) -> datetime | None:
        v = spec.get(name)
        return None if v is None else parse_micro_time(v, f"spec.{name}")

    return LeaseRecord(
        resource_version=rv,
        holder=holder or None,
        duration_s=integer("leaseDurationSeconds", 1),
        acquire_time=when("acquireTime"),
        renew_time=when("renewTime"),
        transitions=integer("leaseTransitions", 0) or 0,
    )


@dataclass(frozen=True)
class Create:
    """No Lease: POST one with ``spec`` (a 409 AlreadyExists means another was first)."""

    spec: dict[str, Any]
    term: int


@dataclass(frozen=True)
class Acquire:
    """Take the Lease (released, expired, or a previous incarnation's under this identity):
    PUT ``spec`` against ``resource_version``; ``term`` = the new ``leaseTransitions``."""

    spec: dict[str, Any]
    term: int
    resource_version: str


@dataclass(frozen=True)
class Renew:
    """This instance's Lease: PUT ``spec`` (new ``renewTime``) against ``resource_version``;
    a 409 Conflict means another wrote it: step down."""

    spec: dict[str, Any]
    term: int
    resource_version: str


@dataclass(frozen=True)
class Wait:
    """Another holds a live Lease: read it again in ``delay_s`` (s, >= 0) at the latest."""

    delay_s: float
    holder: str


@dataclass(frozen=True)
class Lost:
    """This instance led (``term``) and the Lease is not its own any more: step down."""

    why: str


Action = Create | Acquire | Renew | Wait | Lost


def _spec(identity: str, ttl_s: int, acquired: datetime, now: datetime, transitions: int) -> dict:
    return {
        "holderIdentity": identity,
        "leaseDurationSeconds": ttl_s,
        "acquireTime": format_micro_time(acquired),
        "renewTime": format_micro_time(now),
        "leaseTransitions": transitions,
    }


def decide(
    lease: Mapping[str, Any] | None,
    *,
    identity: str,
    term: int | None,
    now: datetime,
    seen_for_s: float,
    ttl_s: int,
) -> Action:
    """What to do with ``lease`` (the Lease object as the API server returned it, None when
    absent: 404). ``identity``: this instance's ``holderIdentity``; ``term``: its term while it
    leads (None while it campaigns); ``now``: this host's wall time (aware); ``seen_for_s``:
    how long (s, this host's monotonic clock) this instance has seen the very same record
    (same ``resourceVersion``) unchanged, 0 on a first sight; ``ttl_s``: the
    ``leaseDurationSeconds`` to write.

    Campaigning: absent -> :class:`Create` (term 1); released, or expired by both rules of the
    module docstring, or held under this identity by a previous incarnation (never resume
    another process's term) -> :class:`Acquire` with ``leaseTransitions + 1``; else
    :class:`Wait`. Leading: the Lease still this instance's (holder and ``leaseTransitions``
    == ``term``) -> :class:`Renew`; else :class:`Lost`.

    Raises :class:`LeaseFormatError` for a malformed Lease (campaigning: it is never taken;
    the caller reports it and keeps reading)."""
    if now.tzinfo is None:
        raise ValueError("decide: `now` must be an aware datetime")
    if lease is None:
        if term is not None:
            return Lost("the Lease was deleted")
        return Create(_spec(identity, ttl_s, now, now, 1), term=1)
    rec = parse_lease(lease)
    if term is not None:
        if rec.holder != identity:
            return Lost(f"the Lease is held by {rec.holder or 'nobody (released)'} now")
        if rec.transitions != term:
            return Lost(f"the Lease's leaseTransitions is {rec.transitions}, not this term {term}")
        acquired = rec.acquire_time or now
        return Renew(
            _spec(identity, ttl_s, acquired, now, term),
            term=term,
            resource_version=rec.resource_version,
        )
    new_term = rec.transitions + 1
    take = Acquire(
        _spec(identity, ttl_s, now, now, new_term),
        term=new_term,
        resource_version=rec.resource_version,
    )
    if rec.holder is None or rec.holder == identity:
        return take
    if rec.duration_s is None or rec.renew_time is None:
        # client-go never writes a held Lease without them: a foreign writer; not taken
        raise LeaseFormatError(
            f"Lease held by {rec.holder!r} has no "
            f"{'leaseDurationSeconds' if rec.duration_s is None else 'renewTime'}: "
            "not taken (fix or delete the Lease)"
        )
    by_wall = (rec.renew_time + timedelta(seconds=rec.duration_s) - now).total_seconds()
    by_seen = rec.duration_s - seen_for_s
    if by_wall <= 0 and by_seen <= 0:
        return take
    return Wait(max(by_wall, by_seen, 0.0), holder=rec.holder)


def release_spec(lease: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The spec client-go's ``ReleaseOnCancel`` writes when a leader stops: no holder,
    ``leaseDurationSeconds`` 1, both times ``now``, ``leaseTransitions`` kept (so the next
    holder's term is still higher)."""
    rec = parse_lease(lease)
    return {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": format_micro_time(now),
        "renewTime": format_micro_time(now),
        "leaseTransitions": rec.transitions,
    }


def lease_body(
    read: Mapping[str, Any] | None,
    spec: Mapping[str, Any],
    *,
    namespace: str,
    name: str,
) -> dict[str, Any]:
    """The object to write: ``read`` (its metadata, labels and annotations kept, including the
    ``resourceVersion`` the write is checked against) with ``spec`` merged over its spec; a new
    Lease when ``read`` is None."""
    if read is None:
        return {
            "apiVersion": API_VERSION,
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
    body = copy.deepcopy(dict(read))
    body["apiVersion"], body["kind"] = API_VERSION, "Lease"
    body["spec"] = {**(body.get("spec") or {}), **spec}
    return body
