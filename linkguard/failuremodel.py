"""The job model: published failure rates and what an outage costs a training job, each number
with its source.

Consumes: nothing (a frozen dataclass of defaults; override fields with
:func:`dataclasses.replace`). Produces: :class:`FailureModel`, read by the fleet simulator
(:mod:`linkguard.simulations.failures` draws faults at its rates) and by the per-transport
pricing (:mod:`linkguard.transportcost`) that both ``linkguard sim fleet`` and ``linkguard report``
use. It lives in ``linkguard/`` (not in the simulations package) because the ledger and its
report read it too, and nothing but the CLI imports the simulations.

The transport-specific constants below are module-level so tests and the README can cite them:

- :data:`IP_STALL_S`: the job stall charged to an IP job (Gloo, NCCL's socket transport,
  IPoIB) for an outage linkguard reroutes;
- :data:`TCP_RTO_MIN_S` / :data:`TCP_RTO_MAX_S`: Linux's retransmission timeout bounds;
- :data:`FAIL_FAST_DETECT_S`: how long the job-side fail-fast helper takes to fail a job once
  linkguard's agent saw its rail go.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

__all__ = [
    "FAIL_FAST_DETECT_S",
    "IP_STALL_KEY",
    "IP_STALL_MAX_MS",
    "IP_STALL_S",
    "IP_STALL_SOURCE",
    "TCP_RTO_MAX_S",
    "TCP_RTO_MIN_S",
    "FailureModel",
    "ip_stall_from_json",
]

_MONTH_S = 30 * 86400.0
_DAY_S = 86400.0

#: Linux TCP's minimum and maximum retransmission timeout (s): ``TCP_RTO_MIN`` = HZ/5 (200 ms)
#: and ``TCP_RTO_MAX`` = 120*HZ (include/net/tcp.h). On a path whose RTT is far below 200 ms
#: (a rail: microseconds) the first RTO is the minimum, and each unanswered retransmission
#: doubles it up to the maximum (RFC 6298 section 5.5): retransmissions 0.2, 0.6, 1.4, 3.0, 6.2,
#: 12.6, 25.4, 51.0, 102.2, 204.6, 324.6, ... s after the segment was first sent.
TCP_RTO_MIN_S = 0.2
TCP_RTO_MAX_S = 120.0

#: The job stall (s) an IP job (Gloo, NCCL's socket transport, IPoIB) takes when linkguard
#: reroutes its link, measured: the p99 of a real PyTorch DDP job's stalls over Gloo through 20
#: host link faults on a 4 x 4 namespace lab (``benchmarks/job_stall.py``, its output kept in
#: ``benchmarks/results/job_stall.json``: p50 29.2 ms, p99 253.4 ms, 0 rank failures; the
#: 2-core CI machine, 2026-12-04; the agents' default routes settings). About one TCP
#: retransmission timeout (:data:`TCP_RTO_MIN_S`) when a fault catches a segment on the wire,
#: tens of ms when it does not. Replace it with ``--ip-stall-from FILE`` (that benchmark's JSON)
#: or ``--ip-stall-ms``, or ``FailureModel(ip_stall_s=...)``; with ``routes.rto_min_ms: 20`` the
#: same benchmark measured p99 99.2 ms (``benchmarks/results/job_stall_rto_min_20.json``).
IP_STALL_S = 0.2534
#: Where :data:`IP_STALL_S` comes from, printed next to every figure that uses it.
IP_STALL_SOURCE = (
    "measured: p99 of a PyTorch DDP job's stalls over Gloo through 20 host link faults on a "
    "4x4 namespace lab (benchmarks/job_stall.py, benchmarks/results/job_stall.json, 2-core "
    "machine)"
)

#: Where ``--ip-stall-from FILE`` reads the measured stall: the lab job benchmark's JSON output
#: (``benchmarks/job_stall.py``) must carry ``{"with_linkguard": {"stall_ms": {"p99": <ms>}}}``,
#: the p99 of the job's stalls (ms, a finite number >= 0) over the faults linkguard rerouted.
#: Other keys are ignored.
IP_STALL_KEY = ("with_linkguard", "stall_ms", "p99")
#: the largest IP stall accepted (ms, an hour: --ip-stall-ms and --ip-stall-from alike)
IP_STALL_MAX_MS = 3_600_000.0

#: Seconds from an RDMA port going down to the fail-fast helper failing the job (s). The
#: agent's sysfs reader puts a port that went DOWN on the bus 84 ms later (README "Agent
#: footprint", ``benchmarks/agent.py``: one real agent, 100 ms polls, 2 cores), and the helper
#: hears it from the agent's local socket (``linkguard rails follow``) at about the same time:
#: rounded up to 100 ms. Assumes the helper aborts the communicator from its own thread, not at
#: the next step boundary (a job stuck in a collective reaches no step boundary).
FAIL_FAST_DETECT_S = 0.1


@dataclass(frozen=True)
class FailureModel:
    """Failure rates and job costs. Times in seconds. Every field says where it comes from;
    "assumption" marks the ones no cited source gives (change them for your fleet)."""

    llama3_gpus: int = 16384
    """Llama 3 training cluster size (GPUs). Meta, "The Llama 3 Herd of Models" (2024), 3.3.4."""
    llama3_days: float = 54.0
    """Length of the Llama 3 snapshot period (days). Meta 2024, 3.3.4 / Table 5."""
    llama3_interruptions: int = 419
    """Unexpected job interruptions in that period (all causes). Meta 2024, Table 5."""
    llama3_network: int = 35
    """Of those, "Network Switch/Cable". Meta 2024, Table 5."""
    llama3_nic: int = 7
    """Of those, "NIC". Meta 2024, Table 5."""
    link_failures_per_link_month: float = 0.00057
    """Fraction of NIC-ToR links that fail per month (0.057 %). Alibaba, "Alibaba HPN: A Data
    Center Network for Large Language Model Training", SIGCOMM 2024, section 2."""
    flap_fraction: float = 0.5
    """Share of the host link faults (at HPN's rate) that are flaps, short downs that come back
    by themselves, rather than downs that wait for a repair. Assumption: HPN (section 2) reports
    link flaps as frequent and each halting training (> 9 s), without a per-link rate."""
    flap_period_s: tuple[float, float] = (1.0, 6.0)
    """A flap's down/up period, uniform in this range (down half of it: 0.5-3 s per down).
    Assumption (an IB port retrains in seconds, OpenSM sweeps every 10 s)."""
    flap_cycles: tuple[int, int] = (1, 5)
    """Down/up cycles per flap, uniform integers in this range. Assumption."""
    repair_median_s: float = 1800.0
    """A host link down that is not a flap stays down for a lognormal time with this median
    (30 min: reseat or swap a cable/transceiver). Assumption."""
    repair_sigma: float = 1.2
    """Sigma of that lognormal (p10 6.4 min, p90 2.6 h). Assumption."""
    nic_repair_median_s: float = 4 * 3600.0
    """A lost NIC (its rail port down) comes back after a lognormal time with this median (4 h:
    drain the host, swap the card). Assumption."""
    nic_repair_sigma: float = 0.8
    """Sigma of that lognormal. Assumption."""
    leaf_reboot_down_s: float = 300.0
    """How long a rebooting leaf keeps its host ports down (5 min). Assumption (a switch
    reload takes minutes)."""
    nccl_ib_timeout: int = 20
    """``NCCL_IB_TIMEOUT`` (NCCL's default): one RC retransmit timeout is
    4.096 us * 2**timeout = 4.29 s. NCCL environment variable docs."""
    nccl_ib_retry_cnt: int = 7
    """``NCCL_IB_RETRY_CNT`` (NCCL's default): retries before the QP errors and the job fails.
    NCCL environment variable docs. Budget: retry_cnt * 4.29 s = 30.1 s."""
    restart_s: float = 750.0
    """Time to restart the job after an interruption, mid-point of the issue's 5-20 min
    (reschedule, reload, re-init NCCL). Assumption within the issue's range."""
    checkpoint_interval_s: float = 1800.0
    """Checkpoint interval; a restart loses half of it on average. Assumption (30 min)."""
    blip_stall_floor_s: float = 0.0
    """Without linkguard, a down shorter than NCCL's budget stalls the job for
    max(its duration, this). HPN (SIGCOMM 2024, section 2) measured > 9 s of halted training per
    single-ToR flap; 0 (the blip's own duration, as the issue's model says) keeps the
    comparison conservative. Set 9 for HPN's figure."""
    reroute_floor_s: float = 0.05
    """With linkguard, a rerouted outage stalls the job for max(the engine's time to reroute,
    this). The engine's time is the service's solve schedule only (its plans apply at once);
    this is the data-plane gap measured end to end on real kernels: p99 48.4 ms of the flow into
    the failed rail over 50 single link faults (``benchmarks/lab_gap.py``, 4 hosts x 4 rails,
    real agents, service and Mosquitto, 2 cores), rounded up to 50 ms."""
    collective_timeout_s: float = 1800.0
    """How long a collective may wait before the framework fails the job (s). PyTorch's default
    process-group timeout for non-NCCL backends (Gloo), ``torch.distributed.constants.
    default_pg_timeout`` = 30 min; ProcessGroupNCCL's own default is 10 min
    (``default_pg_nccl_timeout``): set 600 for a job on NCCL's socket transport. Used by the
    ``ip`` transport: a stall past it is a restart."""
    tcp_retries2: int = 15
    """Linux ``net.ipv4.tcp_retries2`` (default 15): retransmissions of an unacknowledged
    segment before the connection times out. With :data:`TCP_RTO_MIN_S` doubling to
    :data:`TCP_RTO_MAX_S` the 15th goes out 804.6 s after the first send and the connection
    times out at 924.6 s (Documentation/networking/ip-sysctl.rst: "a hypothetical timeout of
    924.6 seconds"). Used by the ``ip`` transport."""
    ip_stall_s: float = IP_STALL_S
    """With linkguard, an IP job's stall per rerouted outage (s): :data:`IP_STALL_S` unless
    measured (``--ip-stall-from``, ``--ip-stall-ms``)."""
    ip_stall_source: str = IP_STALL_SOURCE
    """Where ``ip_stall_s`` comes from (printed next to the figures that use it)."""
    fail_fast_detect_s: float = FAIL_FAST_DETECT_S
    """With linkguard, seconds from an RDMA port's loss (once the fail-fast policy fires) to the
    job failing: :data:`FAIL_FAST_DETECT_S`."""
    fail_fast_grace_s: float | None = None
    """The fail-fast policy (``nccl-ib``, and a fused NIC's last member for
    ``nccl-ib-failover``): fail the job once its port has stayed down this long (s). None: one RC
    retransmit timeout (:attr:`retransmit_timeout_s`, 4.29 s at ``NCCL_IB_TIMEOUT=20``): a down
    the QP's first retransmission finds over costs no more than that one timeout's stall, as
    without linkguard, while a port still down then has a median repair of minutes
    (``repair_median_s``): the flaps this model draws last 0.5-3 s. 0 fails the job on every
    loss; the report prices both (:mod:`linkguard.transportcost`)."""
    other_restarts: bool = True
    """The job also restarts for causes other than links (GPUs, hosts, software): at Llama 3's
    rate of its other unexpected interruptions (419 - 35 switch/cable - 7 NIC = 377 in 54 days
    on 16,384 GPUs; Meta 2024, Table 5), evenly spaced every :meth:`other_restart_interval_s`
    (3.4 h for 16,384 GPUs). Not charged to either side: such a restart only ends the job's
    life as the RDMA transports track it (ports it left out, fused members that failed over).
    False: the job restarts only for the outages priced."""

    def __post_init__(self) -> None:
        if not 0 <= self.flap_fraction <= 1:
            raise ValueError(f"flap_fraction must be in [0, 1], got {self.flap_fraction}")
        lo, hi = self.flap_period_s
        if not 0.02 < lo <= hi:
            raise ValueError(f"flap_period_s must be 0.02 < lo <= hi, got {self.flap_period_s}")
        if not 1 <= self.flap_cycles[0] <= self.flap_cycles[1]:
            raise ValueError(f"flap_cycles must be 1 <= lo <= hi, got {self.flap_cycles}")
        positive = {
            "repair_median_s": self.repair_median_s,
            "nic_repair_median_s": self.nic_repair_median_s,
            "leaf_reboot_down_s": self.leaf_reboot_down_s,
            "llama3_gpus": self.llama3_gpus,
            "llama3_days": self.llama3_days,
        }
        bad = [k for k, v in positive.items() if not (math.isfinite(v) and v > 0)]
        bad += [
            k
            for k, v in {
                "repair_sigma": self.repair_sigma,
                "nic_repair_sigma": self.nic_repair_sigma,
                "link_failures_per_link_month": self.link_failures_per_link_month,
                "restart_s": self.restart_s,
                "checkpoint_interval_s": self.checkpoint_interval_s,
                "blip_stall_floor_s": self.blip_stall_floor_s,
                "reroute_floor_s": self.reroute_floor_s,
                "ip_stall_s": self.ip_stall_s,
                "fail_fast_detect_s": self.fail_fast_detect_s,
                "fail_fast_grace_s": 0.0
                if self.fail_fast_grace_s is None
                else self.fail_fast_grace_s,
            }.items()
            if not (math.isfinite(v) and v >= 0)
        ]
        if not (math.isfinite(self.collective_timeout_s) and self.collective_timeout_s > 0):
            bad.append("collective_timeout_s")
        if bad:
            raise ValueError(f"must be finite and positive: {', '.join(bad)}")
        for name in ("nccl_ib_timeout", "nccl_ib_retry_cnt", "tcp_retries2"):
            v = getattr(self, name)
            lo, hi = _INT_BOUNDS[name]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {v!r}")

    # -- derived rates -------------------------------------------------------------------------
    @property
    def retransmit_timeout_s(self) -> float:
        """One RC retransmit timeout, 4.096 us * 2**NCCL_IB_TIMEOUT (4.29 s at 20)."""
        return 4.096e-6 * 2**self.nccl_ib_timeout

    @property
    def nccl_budget_s(self) -> float:
        """How long a link may stay down before NCCL fails the job:
        NCCL_IB_RETRY_CNT retransmit timeouts (30.1 s at 20 / 7)."""
        return self.nccl_ib_retry_cnt * self.retransmit_timeout_s

    @property
    def ride_out_s(self) -> float:
        """A down shorter than one retransmit timeout is recovered by RC's own retry; moving
        traffic off it was needless (the report's ``needless_reroutes``)."""
        return self.retransmit_timeout_s

    @property
    def restart_cost_s(self) -> float:
        """Job time lost per interruption: detection + restart + half a checkpoint interval
        (30.1 + 750 + 900 = 1680 s by default)."""
        return self.nccl_budget_s + self.restart_s + self.checkpoint_interval_s / 2

    @property
    def link_fault_rate(self) -> float:
        """Host link faults (downs and flaps) per host link per second (HPN)."""
        return self.link_failures_per_link_month / _MONTH_S

    @property
    def nic_loss_rate(self) -> float:
        """NIC losses per GPU per second: Llama 3's NIC interruptions per GPU-second."""
        return self.llama3_nic / (self.llama3_gpus * self.llama3_days * _DAY_S)

    @property
    def leaf_reboot_rate(self) -> float:
        """Leaf reboots per GPU per second, derived: Llama 3's switch/cable interruptions minus
        the cable failures HPN's rate predicts on its cluster (one NIC-ToR link per GPU:
        16,384 * 0.057 % * 54/30 = 16.8 of 35), per GPU-second. A leaf reboot stands for every
        switch failure (a rail-optimized leaf serves a fixed number of GPUs, so per GPU is per
        leaf). Never negative."""
        cables = self.llama3_gpus * self.link_failures_per_link_month * self.llama3_days * 86400
        cables /= _MONTH_S
        return max(self.llama3_network - cables, 0.0) / (
            self.llama3_gpus * self.llama3_days * _DAY_S
        )

    # -- derived: the transports' timers ---------------------------------------------------------
    @property
    def grace_s(self) -> float:
        """The fail-fast policy's wait (s): ``fail_fast_grace_s``, or one RC retransmit timeout."""
        return (
            self.retransmit_timeout_s if self.fail_fast_grace_s is None else self.fail_fast_grace_s
        )

    def rc_stall_s(self, down_s: float) -> float:
        """An RDMA job's stall (s) for a port down ``down_s`` s, no longer than NCCL's budget: the
        QP retransmits every :attr:`retransmit_timeout_s` and resumes at the first retransmission
        at or after the link's return, ceil(down / 4.29 s) x 4.29 s (the model assumes a segment
        in flight when the link went: a training job always has one), at least
        ``blip_stall_floor_s``."""
        t = self.retransmit_timeout_s
        k = max(1, math.ceil(down_s / t - 1e-9))
        return max(min(k * t, self.nccl_budget_s), self.blip_stall_floor_s)

    @property
    def tcp_retransmissions_s(self) -> tuple[float, ...]:
        """When Linux retransmits a segment lost as the link went (s after it was sent): RTO
        :data:`TCP_RTO_MIN_S` doubling up to :data:`TCP_RTO_MAX_S`, ``tcp_retries2`` times:
        0.2, 0.6, 1.4, 3.0, 6.2, 12.6, 25.4, 51.0, 102.2, 204.6, 324.6, ..., 804.6."""
        out, t, rto = [], 0.0, TCP_RTO_MIN_S
        for _ in range(self.tcp_retries2):
            t += rto
            out.append(round(t, 6))
            rto = min(2 * rto, TCP_RTO_MAX_S)
        return tuple(out)

    @property
    def tcp_give_up_s(self) -> float:
        """When the connection times out (s): the last retransmission plus its RTO (924.6 s at
        ``tcp_retries2`` = 15)."""
        last = self.tcp_retransmissions_s
        rto = min(TCP_RTO_MIN_S * 2**self.tcp_retries2, TCP_RTO_MAX_S)
        return round((last[-1] if last else 0.0) + rto, 6)

    def tcp_stall_s(self, down_s: float) -> float | None:
        """An IP job's stall (s) when its path is broken for ``down_s`` s: until the first TCP
        retransmission at or after the path is back (5 s -> 6.2 s, 40 s -> 51.0 s, 300 s -> 324.6
        s); None when the path comes back after the last retransmission (the connection times
        out at :attr:`tcp_give_up_s`) or the stall would outlast ``collective_timeout_s``: the
        job fails (at :attr:`ip_fail_s`). The lab measured 5.1 s for a 5 s outage and 54.5 s for
        40 s (an RTO starting a little above the 200 ms minimum: 0.2137 s x 255 = 54.5 s)."""
        for t in self.tcp_retransmissions_s:
            if t >= down_s - 1e-9:
                return t if t <= self.collective_timeout_s else None
        return None

    @property
    def ip_fail_s(self) -> float:
        """When an IP job whose path stays broken fails (s after the down): the connection's
        timeout or the collective timeout, whichever comes first (924.6 s by default)."""
        return min(self.tcp_give_up_s, self.collective_timeout_s)

    def other_restart_interval_s(self, gpus: int) -> float | None:
        """Seconds between the job's restarts for other causes (``other_restarts``) when it
        runs on ``gpus`` GPUs: 1 / (377 / (16,384 GPUs x 54 days) x gpus); None when off."""
        other = self.llama3_interruptions - self.llama3_network - self.llama3_nic
        if not self.other_restarts or other <= 0 or gpus <= 0:
            return None
        return self.llama3_gpus * self.llama3_days * _DAY_S / (other * gpus)


#: Bounds of the integer fields (NCCL's documented ranges; Linux accepts tcp_retries2 0..255,
#: but 0 would drop a connection at its first loss).
_INT_BOUNDS = {"nccl_ib_timeout": (1, 31), "nccl_ib_retry_cnt": (0, 7), "tcp_retries2": (1, 255)}


def ip_stall_from_json(text: str, *, source: str) -> tuple[float, str]:
    """The IP job stall from the lab job benchmark's JSON output (``text``, read from
    ``source``): ``(seconds, source note)`` for ``FailureModel(ip_stall_s=..., ip_stall_source=
    ...)``, from the key :data:`IP_STALL_KEY` (ms). Raises ValueError naming the file and the
    key when the text is not JSON, the key is missing, or its value is not a finite number
    >= 0 (booleans refused)."""
    path = ".".join(IP_STALL_KEY)
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{source}: not JSON ({exc})") from None
    node: object = doc
    for k in IP_STALL_KEY:
        if not isinstance(node, dict) or k not in node:
            raise ValueError(
                f"{source}: no {path} (the p99 job stall in ms, as benchmarks/job_stall.py "
                'writes it: {"with_linkguard": {"stall_ms": {"p99": 312.5}}})'
            )
        node = node[k]
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise ValueError(f"{source}: {path} is {node!r}, not a number of ms")
    if not math.isfinite(node) or not 0 <= node <= IP_STALL_MAX_MS:
        raise ValueError(f"{source}: {path} is {node!r}, must be 0..{IP_STALL_MAX_MS:.0f} ms")
    return node / 1000, f"p99 job stall {node:g} ms, {path} of {source}"
