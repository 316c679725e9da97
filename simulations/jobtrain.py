"""One rank of the lab's training job: PyTorch DDP over Gloo (CPU), bound to GPU endpoints.

A standalone script, started by path inside a lab host's namespace (``ip netns exec NS python
jobtrain.py ...``, as :mod:`linkguard.simulations.udpflow` is); it imports nothing from
linkguard, and torch only in :func:`run`, so ``linkguard`` itself never needs torch and the
argument handling (:func:`parse_args`) works without it::

  jobtrain.py --rank R --world N --store ADDR:PORT --devices EP[,EP...] --out FILE
              [--compute-ms 50] [--width 256] [--layers 8] [--batch 32] [--timeout-s 10]
              [--stop-file PATH] [--max-steps N] [--seed 0] [--threads 1]

What it does: rank 0 serves the rendezvous store (a ``TCPStore`` on ADDR:PORT; ADDR is the
lab's management address, on no rail, so no fault cuts the rendezvous); every rank builds a
``ProcessGroupGloo`` with one Gloo device per address in ``--devices`` (GPU g's endpoint, device
g bound to it). Gloo keeps one context per device and picks the context of a collective by its
tag, which counts up, so successive all-reduces rotate over the devices: GPU g talks to GPU g
of every peer, over rail g, through the host's routing table (linkguard's, or the baseline's
static routes). The model is ``--layers`` x ``Linear(width, width)`` under
``DistributedDataParallel`` with one bucket per layer (``bucket_cap_mb`` = one layer's
weights), so a step makes ``layers`` gradient all-reduces plus one for the stop flag: with
``layers >= devices`` every rail carries traffic every step. Each step sleeps ``--compute-ms``
(standing for the GPU's compute, without burning the lab's CPU), runs forward and backward on
random data and all-reduces a stop flag (MAX over ranks: 1 once ``--stop-file`` exists or
``--max-steps`` is reached), so all ranks stop after the same step.

``--timeout-s`` is the Gloo collective timeout: a collective that cannot complete within it
raises in every rank still waiting (the job fails, as a job whose NCCL/Gloo timeout fires).

Output, one line each, appended to ``--out`` as they happen (times: CLOCK_MONOTONIC seconds,
system-wide, so they compare with the lab runner's ``time.monotonic()``)::

  start T pid P torch VERSION devices N
  ready T params P                    # process group and DDP built (first broadcast done)
  step K T MS                         # step K (1-based) ended at T, MS since the last one
  buckets B                           # after step 2: DDP's gradient all-reduces in step 2
  done T steps K                      # stopped cleanly after K steps (exit 0)
  error T STEPS TYPE: MESSAGE         # a collective failed after STEPS steps (exit 1)

Exit codes: 0 stopped cleanly, 1 a collective or the rendezvous failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

#: The name the lab's Gloo backend (one device per endpoint) is registered under.
BACKEND = "lgloo"


@dataclass(frozen=True)
class JobArgs:
    """The parsed command line (module docstring); times in ms and s as named."""

    rank: int
    world: int
    store_host: str
    store_port: int
    devices: tuple[str, ...]
    out: str
    compute_ms: float
    width: int
    layers: int
    batch: int
    timeout_s: float
    stop_file: str | None
    max_steps: int | None
    seed: int
    threads: int

    @property
    def bucket_cap_mb(self) -> float:
        """One layer's weights (MiB of float32): DDP then makes one bucket per layer."""
        return self.width * self.width * 4 / 2**20


def _store(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected ADDR:PORT, got {text!r}")
    try:
        ipaddress.IPv4Address(host)
        p = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IPv4 ADDR:PORT, got {text!r}") from None
    if not 1 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"port {p} is not 1..65535")
    return host, p


def _devices(text: str) -> tuple[str, ...]:
    out = tuple(a.strip() for a in text.split(",") if a.strip())
    if not out:
        raise argparse.ArgumentTypeError("at least one endpoint address")
    for a in out:
        try:
            ipaddress.IPv4Address(a)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{a!r} is not an IPv4 address") from None
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"an endpoint appears twice in {text!r}")
    return out


def bounded(kind: type, lo: float, hi: float) -> Any:
    """An argparse type: ``kind(text)`` within ``lo..hi``, else argparse's exit 2 with the
    reason (also the lab benchmark's: benchmarks/job_stall.py)."""

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is not within {lo:g}..{hi:g}")
        return v

    return parse


def parse_args(argv: list[str]) -> JobArgs:
    """The command line as :class:`JobArgs`; a bad one exits 2 with argparse's message."""
    ap = argparse.ArgumentParser(prog="jobtrain.py", description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=bounded(int, 0, 1023), required=True)
    ap.add_argument("--world", type=bounded(int, 1, 1024), required=True)
    ap.add_argument("--store", type=_store, required=True, metavar="ADDR:PORT")
    ap.add_argument("--devices", type=_devices, required=True, metavar="EP[,EP...]")
    ap.add_argument("--out", required=True, metavar="FILE")
    ap.add_argument("--compute-ms", type=bounded(float, 0, 10_000), default=50.0)
    ap.add_argument("--width", type=bounded(int, 1, 4096), default=256)
    ap.add_argument("--layers", type=bounded(int, 1, 64), default=8)
    ap.add_argument("--batch", type=bounded(int, 1, 4096), default=32)
    ap.add_argument("--timeout-s", type=bounded(float, 0.1, 3600), default=10.0)
    ap.add_argument("--stop-file", default=None, metavar="PATH")
    ap.add_argument("--max-steps", type=bounded(int, 1, 10**9), default=None)
    ap.add_argument("--seed", type=bounded(int, 0, 2**31 - 1), default=0)
    ap.add_argument("--threads", type=bounded(int, 1, 64), default=1)
    ns = ap.parse_args(argv)
    if ns.rank >= ns.world:
        ap.error(f"--rank {ns.rank} must be below --world {ns.world}")
    if ns.stop_file is None and ns.max_steps is None:
        ap.error("give --stop-file or --max-steps (or both): the job must know when to stop")
    host, port = ns.store
    return JobArgs(
        rank=ns.rank,
        world=ns.world,
        store_host=host,
        store_port=port,
        devices=ns.devices,
        out=ns.out,
        compute_ms=ns.compute_ms,
        width=ns.width,
        layers=ns.layers,
        batch=ns.batch,
        timeout_s=ns.timeout_s,
        stop_file=ns.stop_file,
        max_steps=ns.max_steps,
        seed=ns.seed,
        threads=ns.threads,
    )


class _Log:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 - closed by the process exit

    def __call__(self, *parts: object) -> None:
        self.f.write(" ".join(str(p) for p in parts) + "\n")


def run(a: JobArgs) -> int:
    """Train until told to stop (module docstring); 0 clean stop, 1 a collective failed."""
    log = _Log(a.out)
    import datetime

    # lazy: torch is the lab's optional extra; --help and arg checks run without it
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(a.threads)  # steady step times on a small shared machine
    log("start", f"{time.monotonic():.6f}", "pid", os.getpid(), "torch", torch.__version__,
        "devices", len(a.devices))  # fmt: skip
    timeout = datetime.timedelta(seconds=a.timeout_s)
    steps = 0
    try:

        def gloo(store: Any, rank: int, size: int, tmo: datetime.timedelta) -> Any:
            # torch's stub lacks the private _Options (its Options is Backend.Options at run time)
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=d) for d in a.devices]
            opts._timeout = tmo
            return dist.ProcessGroupGloo(store, rank, size, opts)

        dist.Backend.register_backend(BACKEND, gloo, devices=["cpu"])
        store = dist.TCPStore(
            a.store_host,
            a.store_port,
            a.world,
            is_master=a.rank == 0,
            timeout=datetime.timedelta(seconds=max(60.0, a.timeout_s)),
        )
        dist.init_process_group(
            BACKEND, store=store, rank=a.rank, world_size=a.world, timeout=timeout
        )
        torch.manual_seed(a.seed)
        model = nn.Sequential(*(nn.Linear(a.width, a.width) for _ in range(a.layers)))
        ddp = DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)
        reduced = [0]  # gradient all-reduces (DDP buckets) so far

        def counting_allreduce(state, bucket):
            # unannotated: DDP checks a hook's annotations against its own (string ones fail)
            reduced[0] += 1
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting_allreduce)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(a.seed * 1024 + a.rank)
        flag = torch.zeros(1)
        params = sum(p.numel() for p in model.parameters())
        log("ready", f"{time.monotonic():.6f}", "params", params)
        last = time.monotonic()
        while True:
            before = reduced[0]
            if a.compute_ms:
                time.sleep(a.compute_ms / 1000)
            x = torch.randn(a.batch, a.width, generator=gen)
            opt.zero_grad(set_to_none=True)
            ddp(x).square().mean().backward()  # the gradient all-reduces, one per bucket
            opt.step()
            steps += 1
            stop = (a.max_steps is not None and steps >= a.max_steps) or (
                a.stop_file is not None and os.path.exists(a.stop_file)
            )
            flag.fill_(1.0 if stop else 0.0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            now = time.monotonic()
            log("step", steps, f"{now:.6f}", f"{(now - last) * 1000:.3f}")
            last = now
            if steps == 2:  # DDP rebuilt its buckets in the order gradients became ready
                log("buckets", reduced[0] - before)
            if flag.item() > 0:
                break
    except Exception as exc:  # a timed-out or broken collective, a failed rendezvous
        msg = " ".join(str(exc).split())[:500]
        log("error", f"{time.monotonic():.6f}", steps, f"{type(exc).__name__}: {msg}")
        os._exit(1)  # no destroy_process_group: it would wait on the dead peers
    log("done", f"{time.monotonic():.6f}", "steps", steps)
    # every rank agreed to stop after this step (the flag's all-reduce): nothing more is
    # needed of the peers or of rank 0's store. No destroy_process_group: Gloo's teardown
    # with peers and the store leaving at once aborted a rank now and then (SIGABRT, after
    # its "done"), which would count as a rank failure that no fault caused
    log.f.flush()
    os._exit(0)


def main(argv: list[str]) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
