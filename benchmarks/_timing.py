"""Timing helper shared by the benchmark scripts (run as `python benchmarks/<name>.py`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_s(fn: Callable[[], object], runs: int) -> float:
    """Median wall time of ``runs`` calls of ``fn`` (s)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
