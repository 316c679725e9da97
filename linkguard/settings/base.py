"""What every settings section shares: the errors, the section base, listen addresses.

Consumes: nothing of linkguard's but the settings model base. Produces: :class:`ConfigError`
(a value or file that cannot be used), :class:`DeprecatedSetting` (a flat key that moved into
a section), :class:`Section` (refuses unknown keys, NaN and infinities) and
:func:`listen_address`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import ConfigDict

from linkguard.models import SettingsModel

__all__ = ["ConfigError", "DeprecatedSetting", "Section", "listen_address"]


class ConfigError(ValueError):
    """A configuration value or file that cannot be used. ``errors``: every bad value as
    ``field.path: message`` when the settings failed validation (the message names the first
    five), else empty."""

    def __init__(self, message: str, errors: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.errors = list(errors)


class DeprecatedSetting(DeprecationWarning):
    """A setting given under its old flat name (``route_table``) that moved into a section
    (``routes.table``): still read, for one release, with this warning ``"X is deprecated;
    use Y"`` (:mod:`linkguard.settings.deprecations`)."""


class Section(SettingsModel):
    """A section of the settings: an unknown key is an error."""

    # NaN and infinities are refused in every section ("must be a finite number"), before any
    # bound is checked: NaN compares false with every bound and would otherwise pass ge/le
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_LISTEN = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*)):(?P<port>\d{1,5})$"
)


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` (port 0-65535; 0: any free port) as ``(host, port)``.
    Raises ValueError naming the accepted forms."""
    m = _LISTEN.match(text.strip())
    if m is None or int(m["port"]) > 65535:
        raise ValueError(
            f"{text!r} is not an address to listen on: use HOST:PORT or [IPV6]:PORT with a "
            "port 0-65535 (0: any free port), e.g. 127.0.0.1:9477; null or '' for none"
        )
    return (m["v6"] or m["host"], int(m["port"]))
