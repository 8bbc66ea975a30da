"""Capped exponential backoff with full jitter.

Kept free of I/O and of any S3 knowledge so the policy can be unit-tested
with an injected random source and sleep. "Full jitter" (delay drawn
uniformly from [0, min(cap, base * 2**n))) spreads retries from many clients
over the whole window, which is what keeps a throttled bucket from being hit
by synchronized retry waves (see the AWS Architecture Blog, "Exponential
Backoff and Jitter").
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["RetryPolicy"]

T = TypeVar("T")

# 2**62 * any sane base already exceeds any sane cap; avoids float overflow.
_MAX_EXPONENT = 62


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times to try an operation and how long to wait in between.

    attempts: total tries including the first (1 = never retry).
    base: ceiling of the first backoff window, in seconds.
    cap: upper bound of any backoff window, in seconds.
    """

    # Defaults: up to ~6 s of total backoff, enough to ride out S3 SlowDown bursts.
    attempts: int = 5
    base: float = 0.2
    cap: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.base < 0 or self.cap < 0:
            raise ValueError("base and cap must be non-negative")

    def window(self, retry: int) -> float:
        """Upper bound of the backoff before retry number `retry` (0-based)."""
        if retry < 0:
            raise ValueError(f"retry index must be >= 0, got {retry}")
        return float(min(self.cap, self.base * 2 ** min(retry, _MAX_EXPONENT)))

    def delay(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """Full-jitter delay before retry number `retry`; rand() is in [0, 1)."""
        return rand() * self.window(retry)

    async def run(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        retryable: Callable[[Exception], bool],
        on_retry: Callable[[Exception, int, float], None] | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
    ) -> T:
        """Await op() until it succeeds, fails non-retryably, or attempts run out.

        The final exception propagates unchanged so callers can classify it.
        on_retry(exc, retry_number, delay) is called before each backoff sleep;
        callers use it to log and to remember that an earlier attempt failed
        ambiguously. Cancellation is never retried (it is not an Exception).
        """
        for attempt in range(self.attempts):
            try:
                return await op()
            except Exception as exc:
                if attempt + 1 >= self.attempts or not retryable(exc):
                    raise
                wait = self.delay(attempt, rand)
                if on_retry is not None:
                    on_retry(exc, attempt + 1, wait)
                await sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")
