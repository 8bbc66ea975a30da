"""Deadlines for tests that wait on a condition, stretched by how loaded this machine is.

CI machines and developers' laptops run the suite at load averages of 5-8 on
2 cores, beside other jobs and beside the suite's own parallel workers: a wait
that is ample on an idle machine is several times too short there, and a test
that fails for it says nothing about the code. So a test never sleeps a fixed
time hoping a thing happened: it polls the condition (``wait_for``) until a
deadline, and states that deadline as the time the condition takes on an idle
machine; ``scaled`` stretches it by the load per CPU measured when the wait
starts (the larger of the 1- and 5-minute averages, so a load that just rose
or just fell still counts). The deadline only bounds a run that is really
stuck, so a generous one costs nothing when the condition holds early.

``TIERED_TEST_TIME_SCALE`` sets the factor instead (``1``: the idle budgets,
to see how much slack a test really needs). The factor is capped so that a
broken condition still fails within minutes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ENV = "TIERED_TEST_TIME_SCALE"
MAX_FACTOR = 8.0


def cpus() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def load_factor() -> float:
    """How many times slower than on an idle machine a wait may be now: 1 to ``MAX_FACTOR``."""
    override = os.environ.get(ENV)
    if override:
        return min(MAX_FACTOR, max(1.0, float(override)))
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return 1.0
    return min(MAX_FACTOR, max(1.0, max(one, five) / cpus()))


def scaled(seconds: float) -> float:
    """``seconds`` (what a wait takes at most on an idle machine) stretched by the current load."""
    return seconds * load_factor()


class Deadline:
    """A point in time ``scaled(seconds)`` from now, for loops that do more than poll one condition."""

    def __init__(self, seconds: float) -> None:
        self.budget = scaled(seconds)
        self.at = time.monotonic() + self.budget

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def __str__(self) -> str:
        return f"{self.budget:.1f} s (load factor {load_factor():.1f})"


def wait_for(
    condition: Callable[[], T],
    seconds: float,
    what: str,
    *,
    interval: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns a true value (returned); fail naming ``what`` after
    ``scaled(seconds)``, with ``explain()`` (the state that was waited on) in the message."""
    deadline = Deadline(seconds)
    while True:
        value = condition()
        if value:
            return value
        if deadline.expired():
            detail = f": {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {deadline} waiting for {what}{detail}")
        time.sleep(interval)
