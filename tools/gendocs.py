"""Write the generated documentation pages, or check that the committed copies are current.

    python tools/gendocs.py          # write docs/configuration.md and docs/metrics.md
    python tools/gendocs.py --check  # exit 1, naming each stale page, when a copy differs

The pages are rendered from the code (:mod:`linkguard.configdocs`: the settings models;
:mod:`linkguard.metricsdocs`: the metric declarations), so
they cannot drift from it; ``tests/test_docs_current.py`` runs the same check in the suite.
Needs linkguard installed (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from linkguard.configdocs import render_configuration
from linkguard.metricsdocs import render_metrics

REPO = Path(__file__).resolve().parent.parent

#: each generated page (relative to the repository) -> what renders it
PAGES: dict[str, Callable[[], str]] = {
    "docs/configuration.md": render_configuration,
    "docs/metrics.md": render_metrics,
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for rel, render in PAGES.items():
        path = REPO / rel
        text = render()
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(rel)
        else:
            path.write_text(text)
            print(f"wrote {rel} ({len(text.splitlines())} lines)")
    for rel in stale:
        print(f"{rel} is stale: run python tools/gendocs.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
