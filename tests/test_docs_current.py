"""The generated pages of docs/ are current: each committed copy is exactly what the code
renders today (tools/gendocs.py writes them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from linkguard.config import AgentSettings, ServiceSettings
from linkguard.configdocs import render_configuration
from linkguard.metricsdocs import render_metrics

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize(
    ("page", "render"),
    [("configuration.md", render_configuration), ("metrics.md", render_metrics)],
)
def test_generated_page_is_current(page: str, render) -> None:
    assert (DOCS / page).read_text() == render(), f"docs/{page} is stale: python tools/gendocs.py"


def _keys(model, prefix: str = "") -> set[str]:
    keys = set()
    for name, info in model.model_fields.items():
        keys.add(prefix + name)
        ann = info.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            keys |= _keys(ann, f"{prefix}{name}.")
    return keys


def test_configuration_lists_every_key_of_both_roles() -> None:
    text = render_configuration()
    agent, service = text.split("\n## Topology service", 1)
    listed = re.compile(r"^\| `([a-z_.\[\]]+)` \|", re.M)
    assert _keys(AgentSettings) <= set(listed.findall(agent))
    assert _keys(ServiceSettings) <= set(listed.findall(service))
    # a section's keys carry its environment name; a computed default names its function
    assert "| `bus.port` | int | 1883 | >= 1, <= 65535 | `LINKGUARD_BUS__PORT` |" in agent
    assert "| `host` | str | `socket.gethostname()` |" in agent
    assert "| `ports[].hca` | str | (required) | len >= 1, len <= 64 |  |" in agent
