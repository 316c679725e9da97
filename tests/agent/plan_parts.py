"""Small builders of plan parts shared by the agent's plan and applier tests."""

from __future__ import annotations

from linkguard.models import PrefixRoute, RouteAssignment


def prefix_route(prefix: str, home: int, *rails: int) -> PrefixRoute:
    """``prefix`` on-link out of ``rail<r>`` for each of ``rails`` (none: unreachable)."""
    return PrefixRoute(
        prefix=prefix, home_rail=home, rails=list(rails), netdevs=[f"rail{r}" for r in rails]
    )


def route(dest: str, rail: int, home: int) -> RouteAssignment:
    """A /32 exception to ``dest`` (peer "b" GPU 0) via 10.100.<rail>.2 out of ``rail<rail>``."""
    return RouteAssignment(
        destination=dest,
        peer="b",
        peer_gpu=0,
        rail=rail,
        home_rail=home,
        netdev=f"rail{rail}",
        gateway=f"10.100.{rail}.2",
    )
