"""The atheris entry point: ``python -m fuzz.fuzz_<target> [libFuzzer flags] [corpus dirs]``.

Consumes: the name of a :data:`fuzz.targets.TARGETS` entry and libFuzzer's command line
(``-max_total_time=S``, ``-runs=N``, ``-timeout=S``, corpus directories: the first one
collects new inputs; see https://llvm.org/docs/LibFuzzer.html#options). Produces: libFuzzer's
output on stderr, ending with ``Done <N> runs in <S> second(s)`` and, with
``-print_final_stats=1``, ``stat::number_of_executed_units: <N>``; exit 0 when no input
crashed, else libFuzzer's crash exit code (an uncaught Python exception: 77 (``-error_exitcode``),
with the input written to ``crash-<sha1>`` under ``-artifact_prefix``).

linkguard's modules are instrumented for coverage (``atheris.instrument_imports``), the
libraries they use are not. Logging is silenced below CRITICAL (every dropped message would
log a warning). atheris is in the optional ``fuzz`` extra (``pip install -e '.[fuzz]'``;
binary wheels for CPython 3.11 on x86_64 Linux, no compiler needed).
"""

from __future__ import annotations

import logging
import sys

import structlog

__all__ = ["main", "quiet_logs"]


def quiet_logs() -> None:
    """Only CRITICAL log events (structlog and stdlib logging)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    logging.getLogger().setLevel(logging.CRITICAL)


def main(target: str, argv: list[str] | None = None) -> None:
    """Fuzz ``target`` with libFuzzer until it stops (flags in ``argv``, default sys.argv)."""
    import atheris

    quiet_logs()
    with atheris.instrument_imports(include=["linkguard", "fuzz"]):
        from fuzz import targets

        # the targets import linkguard's modules on first use: inside this block, so that
        # they are instrumented; this also builds what a target reads (sysfs trees, the live
        # fleet) before libFuzzer's clock starts
        run = targets.TARGETS[target].run
        for data in targets.seeds(target):
            run(data)
    atheris.Setup(list(sys.argv if argv is None else argv), run)
    atheris.Fuzz()
