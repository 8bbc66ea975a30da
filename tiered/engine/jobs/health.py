"""Whether the object store answers: a periodic probe plus the outcome of the service's own calls.

``/readyz`` reports it, ``/healthz`` shows it, metrics count stalls (calls that
ran past their deadline). A probe is a HEAD of one small key, bounded by a
timeout, so a store that accepts connections and never answers reads as
unreachable within one probe interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiered.cold.objects.store import ObjectStore, ObjectStoreError
from tiered.engine.jobs.claim import CLAIM_KEY

log = logging.getLogger(__name__)

PROBE_KEY = CLAIM_KEY  # small, and there whenever this server runs


@dataclass
class StoreHealth:
    """Reachability of the object store, as last observed."""

    clock: Callable[[], float] = time.monotonic
    reachable: bool | None = None  # None until the first answer or failure
    last_ok: float | None = None
    last_error: str | None = None
    stalls: int = 0  # calls abandoned at their deadline
    probes: int = 0

    def ok(self) -> None:
        if self.reachable is False:
            log.info("the object store answers again")
        self.reachable, self.last_ok, self.last_error = True, self.clock(), None

    def failed(self, error: str, *, stalled: bool = False) -> None:
        if stalled:
            self.stalls += 1
        if self.reachable is not False:
            log.warning("the object store is unreachable: %s", error)
        self.reachable, self.last_error = False, error

    def as_json(self) -> dict[str, object]:
        age = None if self.last_ok is None else round(self.clock() - self.last_ok, 3)
        return {
            "reachable": self.reachable,
            "seconds_since_ok": age,
            "last_error": self.last_error,
            "stalls": self.stalls,
        }

    async def probe(self, store: ObjectStore, timeout_s: float) -> bool:
        """One bounded HEAD; records and returns whether the store answered."""
        self.probes += 1
        try:
            async with asyncio.timeout(timeout_s):
                await store.head(PROBE_KEY)
        except TimeoutError:
            self.failed(f"no answer within {timeout_s:g}s", stalled=True)
            return False
        except ObjectStoreError as exc:
            self.failed(str(exc))
            return False
        self.ok()
        return True

    async def probe_forever(self, store: ObjectStore, interval_s: float, timeout_s: float) -> None:
        while True:
            await self.probe(store, timeout_s)
            await asyncio.sleep(interval_s)
