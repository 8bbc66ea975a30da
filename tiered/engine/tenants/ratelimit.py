"""Token buckets for per-bucket rate quotas, on integer milliseconds from the injected clock (pure).

A bucket of rate ``r`` per second holds up to ``r * burst_s`` tokens and
starts full; a request of cost ``c`` passes when ``c`` tokens are there and
takes them. A cost larger than the whole bucket passes when the bucket is full
and leaves it in debt (a 10 MiB append under a 1 MiB/s quota waits for a full
bucket, then the next appends wait for the debt to be paid back). Levels are
kept in thousandths of a token, so with whole-millisecond times every
refill is exact: a test on a ``VirtualClock`` sees the boundary exactly.
"""

from __future__ import annotations


class TokenBucket:
    __slots__ = ("rate", "capacity", "level", "last_ms")

    def __init__(self, rate_per_s: int, now_ms: int, burst_s: int = 1) -> None:
        if rate_per_s < 0 or burst_s <= 0:
            raise ValueError("rates are not negative, bursts are positive")
        self.rate = rate_per_s
        self.capacity = rate_per_s * 1000 * burst_s  # in thousandths of a token
        self.level = self.capacity
        self.last_ms = now_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self.last_ms:  # a clock that steps back refills nothing
            self.level = min(self.capacity, self.level + (now_ms - self.last_ms) * self.rate)
            self.last_ms = now_ms

    def wait_ms(self, cost: int, now_ms: int) -> int:
        """0 if ``cost`` tokens may be taken now, else how many ms until they may."""
        if self.rate == 0:
            return -1  # never
        self._refill(now_ms)
        need = min(cost * 1000, self.capacity)
        if self.level >= need:
            return 0
        return -(-(need - self.level) // self.rate)

    def take(self, cost: int, now_ms: int) -> None:
        self._refill(now_ms)
        self.level -= cost * 1000


def retry_after_s(wait_ms: int) -> int:
    """Whole seconds to wait before retrying (at least 1; a zero rate says an hour)."""
    if wait_ms < 0:
        return 3600
    return max(1, -(-wait_ms // 1000))
