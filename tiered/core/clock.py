"""The one clock: wall time for what the journal records, monotonic time for deadlines.

Every module that needs the time is handed a ``Clock``; nothing reads
``time.time()`` itself. The server runs on ``SystemClock``; tests drive a
``VirtualClock`` (advance it and expiry, retention, grace delays and leases
see the new time), with no monkeypatching.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the Unix epoch (what records carry)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for deadlines and intervals)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class VirtualClock:
    """A clock a test sets: wall time starts at ``start_ms`` and moves only when told.

    Its monotonic time is the real one plus every ``advance``, so deadlines the
    code computes from it pass when the test advances time, while asyncio's own
    timers (real time) keep the event loop working.
    """

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.ms = start_ms
        self._skew = 0.0

    def now_ms(self) -> int:
        return self.ms

    def monotonic(self) -> float:
        return time.monotonic() + self._skew

    def advance(self, ms: int) -> int:
        """Move time forward by ``ms``; returns the new wall time."""
        if ms < 0:
            raise ValueError("time does not go back")
        self.ms += ms
        self._skew += ms / 1000
        return self.ms

    def set(self, ms: int) -> None:
        """Jump the wall clock to ``ms`` (forward only)."""
        self.advance(ms - self.ms)
