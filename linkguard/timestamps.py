"""Times as people write them and as the ledger keeps them: Unix seconds (s since
1970-01-01T00:00:00Z) from ISO 8601 text or a number (:func:`parse_time`, for ``linkguard
report --since/--until`` and the HTTP API's queries) and back to ISO 8601 UTC (:func:`iso`).

Consumes: text or a number. Produces: a float (Unix s) or ISO 8601 text. Pure, stdlib only.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

__all__ = ["MAX_TIME", "iso", "parse_time"]


#: The latest time :func:`parse_time` accepts: 9999-12-31T23:59:59Z (Unix s), the end of what
#: ISO 8601 dates and :func:`iso` can show.
MAX_TIME = 253_402_300_799.0

#: A bare integer of fewer digits than this is refused as a time: ``20231120`` reads like the
#: date 2023-11-20 but would be 1970-08-23 in Unix seconds (s since the epoch reach 9 digits in
#: 1973).
_EPOCH_DIGITS = 9
_BARE_INT = re.compile(r"[+-]?[\d_]+")


def parse_time(text: str | float | int) -> float:
    """Seconds since the Unix epoch from a number or an ISO 8601 date/time (``2024-05-01``,
    ``2024-05-01T12:00:00+02:00``; without a zone it is UTC). A number given as text counts as
    Unix seconds only with at least 9 digits, a decimal point or an exponent (``1700000000``,
    ``1.7e9``, ``0.0``): a shorter bare integer such as ``20231120`` is ambiguous (a date?) and
    refused. The result is between 0 (1970-01-01) and :data:`MAX_TIME` (9999-12-31). Raises
    ValueError starting ``not a time: <text>`` and saying how to write one otherwise."""
    how = (
        "give an ISO 8601 date/time such as 2023-11-20 or 2023-11-20T12:00:00Z, or seconds "
        "since the Unix epoch with at least 9 digits or a decimal point, such as 1700000000"
    )
    short_int = False
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s)
            short_int = bool(_BARE_INT.fullmatch(s)) and sum(map(str.isdigit, s)) < _EPOCH_DIGITS
        except ValueError:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00") if s.endswith("Z") else s)
                if dt.tzinfo is None:
                    dt = dt.replace(tzinfo=UTC)
                value = dt.timestamp()
            except (ValueError, OverflowError):
                raise ValueError(f"not a time: {str(text)[:64]!r} ({how})") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_TIME):
        raise ValueError(
            f"not a time: {str(text)[:64]!r} (must be between 1970-01-01 and 9999-12-31, "
            f"0 .. {MAX_TIME:.0f} s since the Unix epoch)"
        )
    if short_int:
        raise ValueError(
            f"not a time: {str(text)[:64]!r} is ambiguous, a bare number of fewer than "
            f"{_EPOCH_DIGITS} digits ({how}; 0.0 for the epoch itself)"
        )
    return value


def iso(t: float) -> str:
    """``t`` (Unix s) as ISO 8601 UTC, to the second (``2023-11-14T22:13:20Z``); a value no
    date can show (negative, past year 9999, not finite) as ``<t> s``. Never raises."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError, TypeError):
        return f"{t!r} s"
