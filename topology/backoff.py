"""When the topology service solves: the SPF back-off delay algorithm of RFC 8405, applied to
plan computation.

Consumes: "a state change arrived at ``now``" and "a solve started at ``now``" (monotonic s).
Produces: the time the next solve is due. Pure: no clock, no I/O; the service's solver task
and the simulation engine drive the same object.

RFC 8405 (section 5) keeps three states. QUIET: the network was stable for ``holddown_ms``;
the first change is solved after ``initial_ms`` (short: a single failed link is rerouted at
once; a port back from hold-down is not urgent and waits ``short_ms``). SHORT_WAIT, for
``time_to_learn_ms`` after that first change: later changes are batched for ``short_ms`` (a
leaf failure, whose hosts report over one agent poll interval, costs at most two plans per
host: the first port, then the rest together). LONG_WAIT, once the churn outlasts
``time_to_learn_ms``: changes are batched for ``long_ms``, so a storm costs a solve per
``long_ms``, not one per change. ``holddown_ms`` without any change returns to QUIET.
A change never postpones a solve already scheduled (RFC 8405: "if the SPF_TIMER is not
already running"), so a steady trickle cannot starve the solver.
"""

from __future__ import annotations

import enum

from linkguard.backoffpolicy import BackoffPolicy

__all__ = ["BackoffPolicy", "BackoffState", "SolveBackoff"]


class BackoffState(enum.StrEnum):
    """RFC 8405 section 5.1 states."""

    QUIET = "quiet"
    SHORT_WAIT = "short_wait"
    LONG_WAIT = "long_wait"


class SolveBackoff:
    """The state machine. :meth:`on_change` for every state change that needs a solve,
    :meth:`started` when a solve begins; :attr:`due` is when the pending solve should run
    (monotonic s; None: nothing pending). Times are seconds, never decreasing."""

    def __init__(self, policy: BackoffPolicy | None = None) -> None:
        self.policy = policy or BackoffPolicy()
        self.state = BackoffState.QUIET
        self.due: float | None = None
        self._learn_until = 0.0
        self._holddown_until = 0.0

    def _age(self, now: float) -> None:
        """Apply the timers that expired by ``now`` (HOLDDOWN first: it resets everything)."""
        if self.state is not BackoffState.QUIET and now >= self._holddown_until:
            self.state = BackoffState.QUIET
        elif self.state is BackoffState.SHORT_WAIT and now >= self._learn_until:
            self.state = BackoffState.LONG_WAIT

    def on_change(self, now: float, *, urgent: bool = True) -> float:
        """A change arrived at ``now``: returns :attr:`due` (scheduled now, or already).
        ``urgent``: the change takes something out of use (a port down); a return to use
        (re-admission after hold-down) is never urgent and waits ``short_ms`` even after a
        quiet period, so ports re-admitted together are solved together."""
        self._age(now)
        p = self.policy
        if self.state is BackoffState.QUIET:
            delay_ms = p.initial_ms if urgent else p.short_ms
            self.state = BackoffState.SHORT_WAIT
            self._learn_until = now + p.time_to_learn_ms / 1000
        elif self.state is BackoffState.SHORT_WAIT:
            delay_ms = p.short_ms
        else:
            delay_ms = p.long_ms
        self._holddown_until = now + p.holddown_ms / 1000
        if self.due is None:
            self.due = now + delay_ms / 1000
        return self.due

    def started(self, now: float) -> None:
        """A solve began at ``now``: it takes every change so far; later ones schedule anew."""
        self._age(now)
        self.due = None
