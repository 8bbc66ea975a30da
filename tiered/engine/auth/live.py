"""Live reads held by credentials: they end when the credential expires or is revoked.

Each long-poll or SSE read made with a credential gets a ``Lease``: the read
path asks it, between waits, whether the credential still holds, caps every
wait at its expiry, and has it ``watch`` the stream it waits on. Revoking (or
rotating) a token calls ``LiveLeases.end(token_id)``, which wakes every
reader holding it at once, so revocation ends live reads well within a second.
"""

from __future__ import annotations

from collections.abc import Callable

from tiered.core.clock import Clock
from tiered.engine.auth.credentials import MAX_TIME_MS, Principal

# What a lease asks about its credential now: (still valid, expiry in ms or None).
CredentialStatus = Callable[[], tuple[bool, int | None]]


class Lease:
    __slots__ = ("principal", "_status", "_clock", "watching")

    def __init__(self, principal: Principal, status: CredentialStatus, clock: Clock) -> None:
        self.principal = principal
        self._status = status
        self._clock = clock
        self.watching: set[int] = set()

    def end_reason(self) -> str | None:
        valid, expires_ms = self._status()
        if not valid:
            return "revoked"
        if expires_ms is not None and self._clock.now_ms() >= expires_ms:
            return "expired"
        return None

    def seconds_left(self) -> float | None:
        _, expires_ms = self._status()
        if expires_ms is None:
            return None
        # Credentials end by MAX_TIME_MS (refused beyond it); clamped anyway, so no expiry can overflow a float.
        return max(0, min(expires_ms - self._clock.now_ms(), MAX_TIME_MS)) / 1000

    def watch(self, uid: int) -> None:
        self.watching.add(uid)

    def unwatch(self, uid: int) -> None:
        self.watching.discard(uid)


class LiveLeases:
    """Every lease by credential id; ``wake(uid)`` wakes the readers parked on a stream."""

    def __init__(self, clock: Clock, wake: Callable[[int], None]) -> None:
        self._clock = clock
        self._wake = wake
        self._by_id: dict[str, set[Lease]] = {}

    def open(self, principal: Principal, status: CredentialStatus) -> Lease:
        lease = Lease(principal, status, self._clock)
        self._by_id.setdefault(principal.id, set()).add(lease)
        return lease

    def close(self, lease: Lease) -> None:
        leases = self._by_id.get(lease.principal.id)
        if leases is not None:
            leases.discard(lease)
            if not leases:
                del self._by_id[lease.principal.id]

    def end(self, credential_id: str) -> int:
        """Wake every live read of a credential that changed (revoked, expiry moved); returns how many."""
        leases = self._by_id.get(credential_id, ())
        for lease in list(leases):
            for uid in list(lease.watching):
                self._wake(uid)
        return len(leases)

    def count(self) -> int:
        return sum(len(v) for v in self._by_id.values())
