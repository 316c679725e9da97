"""Run every fuzz target for a bounded time: ``python -m fuzz.run --seconds 75``.

Consumes: the targets of :data:`fuzz.targets.TARGETS` and their seed corpora. Produces: one
line per target on stdout (engine, inputs tried, seconds, inputs per second, crashes, corpus
size before -> after), then a total; exit status 0 when no input crashed, 1 when one did (its
traceback and the input file are printed), 2 for bad arguments.

Engines (``--engine``): ``atheris`` runs each target's harness (``python -m
fuzz.fuzz_<target>``, coverage-guided libFuzzer) in a subprocess with ``-max_total_time``;
the inputs tried are libFuzzer's ``stat::number_of_executed_units``. ``hypothesis`` runs the
targets in this process on inputs drawn by :func:`fuzz.strategies.inputs` (random bytes and
mutated seeds), driven by random buffers through hypothesis' ``fuzz_one_input``; the inputs
tried are the target calls. ``auto`` (default): atheris when it imports, else hypothesis.

``--seconds`` is the whole budget, shared evenly by the targets (``--per-target`` gives each
target that many seconds instead). ``--corpus DIR`` keeps each target's corpus in
``DIR/<target>`` between runs (default: a temporary directory, seeds only); crash inputs go
to ``--artifacts`` (default ``$LINKGUARD_ARTIFACTS/fuzz`` or ``tests/artifacts/fuzz``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Result", "main", "run_atheris", "run_hypothesis"]

REPO = Path(__file__).resolve().parents[1]
_UNITS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_DONE = re.compile(r"Done (\d+) runs in")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_COV = re.compile(r"^#\d+\s+(?:INITED|DONE)\s+cov: (\d+)", re.M)


@dataclass
class Result:
    """One target's run: inputs tried, wall seconds, crashes, corpus sizes, what crashed."""

    target: str
    engine: str
    inputs: int
    seconds: float
    crashes: int
    corpus_before: int = 0
    corpus_after: int = 0
    detail: str = ""
    #: libFuzzer's coverage (``cov:``, edges) after the seeds and at the end; atheris only
    coverage: tuple[int, int] | None = None

    def line(self) -> str:
        rate = self.inputs / self.seconds if self.seconds > 0 else 0.0
        corpus = f"corpus {self.corpus_before} -> {self.corpus_after}" if self.corpus_after else ""
        cov = f"  cov {self.coverage[0]} -> {self.coverage[1]}" if self.coverage else ""
        return (
            f"fuzz {self.target:<14} {self.engine:<10} {self.inputs:>10,} inputs "
            f"{self.seconds:6.1f} s {rate:>9,.0f}/s  {self.crashes} crashes  {corpus}{cov}"
        ).rstrip()


def _write_seeds(name: str, corpus: Path) -> int:
    from fuzz.targets import seeds

    corpus.mkdir(parents=True, exist_ok=True)
    for data in seeds(name):
        (corpus / f"seed-{hashlib.sha1(data).hexdigest()}").write_bytes(data)
    return sum(1 for _ in corpus.iterdir())


def run_atheris(
    name: str, seconds: float, corpus: Path, artifacts: Path, *, timeout_s: int = 20
) -> Result:
    """``python -m fuzz.fuzz_<name>`` for ``seconds`` on ``corpus`` (seeded first)."""
    before = _write_seeds(name, corpus)
    artifacts.mkdir(parents=True, exist_ok=True)
    log = artifacts / f"{name}.log"
    cmd = [
        sys.executable,
        "-m",
        f"fuzz.fuzz_{name}",
        f"-max_total_time={max(1, round(seconds))}",
        f"-timeout={timeout_s}",
        "-rss_limit_mb=3072",
        "-max_len=65536",
        "-len_control=0",  # mutate whole seeds (a dump is 45 KB) from the start
        "-print_final_stats=1",
        f"-artifact_prefix={artifacts}/{name}-",
        str(corpus),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    start = time.monotonic()
    with log.open("wb") as out:
        try:
            proc = subprocess.run(
                cmd,
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=seconds + 180,
                check=False,
            )
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    elapsed = time.monotonic() - start
    text = log.read_text(errors="replace")
    m = _UNITS.search(text) or _DONE.search(text)
    inputs = int(m.group(1)) if m else 0
    after = sum(1 for _ in corpus.iterdir())
    covs = [int(c) for c in _COV.findall(text)]
    coverage = (covs[0], covs[-1]) if covs else None
    if code == 0:
        return Result(name, "atheris", inputs, elapsed, 0, before, after, coverage=coverage)
    why = "hung (killed after the budget + 180 s)" if code is None else f"exit {code}"
    crash = (
        text[text.find("=== Uncaught Python exception") :] if "Uncaught" in text else text[-3000:]
    )
    unit = _ARTIFACT.search(text)
    detail = (
        f"{why}; log {log}" + (f"; input {unit.group(1)}" if unit else "") + "\n" + crash[:4000]
    )
    return Result(name, "atheris", inputs, elapsed, 1, before, after, detail, coverage)


def run_hypothesis(
    name: str, seconds: float, artifacts: Path, *, seed: int | None = None
) -> Result:
    """Target ``name`` in this process on :func:`fuzz.strategies.inputs` for ``seconds``."""
    from hypothesis import HealthCheck, given, settings

    from fuzz.strategies import inputs
    from fuzz.targets import TARGETS

    target = TARGETS[name]
    target.seeds()  # builds what the target reads before the clock starts
    count = 0
    last: list[bytes] = [b""]

    @settings(database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(inputs(name))
    def one(data: bytes) -> None:
        nonlocal count
        count += 1
        last[0] = data
        target.run(data)

    rng = random.Random(seed)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            one.hypothesis.fuzz_one_input(rng.randbytes(rng.choice((64, 256, 2048))))
        except Exception:
            artifacts.mkdir(parents=True, exist_ok=True)
            path = artifacts / f"{name}-crash-{hashlib.sha1(last[0]).hexdigest()}"
            path.write_bytes(last[0])
            detail = f"input {path}\n{traceback.format_exc()[-4000:]}"
            return Result(name, "hypothesis", count, time.monotonic() - start, 1, detail=detail)
    return Result(name, "hypothesis", count, time.monotonic() - start, 0)


def _atheris_available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    from fuzz.targets import TARGETS

    ap = argparse.ArgumentParser(prog="python -m fuzz.run", description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=75.0, help="total budget (s), shared")
    ap.add_argument("--per-target", type=float, help="seconds per target instead")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    ap.add_argument("--engine", choices=("auto", "atheris", "hypothesis"), default="auto")
    ap.add_argument("--corpus", type=Path, help="keep corpora in DIR/<target>")
    ap.add_argument("--artifacts", type=Path)
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take")
    args = ap.parse_args(argv)
    names = [t for t in args.targets.split(",") if t]
    unknown = [t for t in names if t not in TARGETS]
    if unknown or not names:
        print(f"fuzz: unknown target(s) {unknown}; known: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    per = args.per_target if args.per_target else args.seconds / len(names)
    if per <= 0:
        print("fuzz: the budget must be > 0 s", file=sys.stderr)
        return 2
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _atheris_available() else "hypothesis"
        if engine == "hypothesis":
            print("fuzz: atheris not installed (pip install -e '.[fuzz]'): hypothesis engine")
    elif engine == "atheris" and not _atheris_available():
        print("fuzz: atheris not installed (pip install -e '.[fuzz]')", file=sys.stderr)
        return 2
    artifacts = (
        args.artifacts
        or Path(os.environ.get("LINKGUARD_ARTIFACTS", REPO / "tests" / "artifacts")) / "fuzz"
    )
    if engine == "hypothesis":
        from fuzz.harness import quiet_logs

        quiet_logs()
    results = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="linkguard-fuzz-corpus-") as tmp:
        for name in names:
            if engine == "atheris":
                corpus = (args.corpus or Path(tmp)) / name
                r = run_atheris(name, per, corpus, artifacts, timeout_s=args.timeout)
            else:
                r = run_hypothesis(name, per, artifacts)
            results.append(r)
            print(r.line(), flush=True)
            if r.crashes:
                print(r.detail, flush=True)
    total = sum(r.inputs for r in results)
    crashes = sum(r.crashes for r in results)
    print(
        f"fuzz: {len(results)} targets, {total:,} inputs, {crashes} crashes "
        f"in {time.monotonic() - start:.0f} s ({engine})"
    )
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
