"""One ranged read of a cold object, under the rules every reader of the object store follows.

Used by this engine's reads (``reader``) and by a cluster node answering a
catch-up read of another node's stream from the object store
(``tiered.cluster.gateway.cold_reads``), so a client sees the same answer
whichever node serves it:

* the read is bounded by a deadline: no answer in time is ``STORE_UNAVAILABLE``
  (a stall, reported to the store's health);
* bytes that fail the object index's digests or the page checksums are
  ``DATA_DAMAGED``: counted, logged with where they are, never served;
* an object missing from the store is damage too where the state says it
  must be there (the owner's read); a peer serving from a locator lets the
  caller decide (``missing_is_damage=False`` re-raises ``ObjectNotFound``);
* any other store error is ``STORE_UNAVAILABLE`` (the HTTP layer adds when to retry).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tiered.cold.objects.store import ObjectNotFound, ObjectStoreError
from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ports import StoreHealth
from tiered.engine.streams.model import ColdSlice

log = logging.getLogger(__name__)


def damaged(message: str) -> TieredError:
    return TieredError(ErrorCode.DATA_DAMAGED, message)


class _Unobserved:
    """A ``StoreHealth`` that notes nothing: for readers whose calls are not the store's health."""

    def ok(self) -> None:
        pass

    def failed(self, error: str, *, stalled: bool = False) -> None:
        pass


UNOBSERVED: StoreHealth = _Unobserved()


async def read_cold(
    fetch: Callable[[], Awaitable[bytes]],
    sl: ColdSlice,
    *,
    timeout_s: float,
    on_damaged: Callable[[], None],
    health: StoreHealth = UNOBSERVED,
    missing_is_damage: bool = True,
    whose: str = "",
) -> bytes:
    """``await fetch()`` (the bytes of ``sl``), with the error handling above.

    ``on_damaged`` counts a read refused for damage; ``whose`` ends the
    integrity log line (" for a peer's stream"). The error messages name the
    object by ``sl.key``.
    """
    try:
        async with asyncio.timeout(timeout_s):
            data = await fetch()
    except TimeoutError:
        health.failed(f"a cold read of {sl.key} got no answer within {timeout_s:g}s", stalled=True)
        raise TieredError(
            ErrorCode.STORE_UNAVAILABLE,
            f"the object store did not answer within {timeout_s:g}s; retry shortly",
        ) from None
    except ColdDataDamaged as exc:
        on_damaged()
        log.error(
            "integrity: cold read of %s/%s [%d, %d)%s: %s", sl.bucket, sl.path, sl.start, sl.end, whose, exc
        )
        raise damaged(
            f"stored data of this stream is damaged (cold object {sl.key}); it will not be served"
        ) from None
    except ObjectNotFound:
        if not missing_is_damage:
            raise
        on_damaged()
        log.error(
            "integrity: cold object %s is missing from the store (read of %s/%s)", sl.key, sl.bucket, sl.path
        )
        raise damaged(f"cold object {sl.key} is missing from the object store") from None
    except ObjectStoreError as exc:
        log.warning("cold read of %s failed: %s", sl.key, exc)
        health.failed(str(exc))
        raise TieredError(
            ErrorCode.STORE_UNAVAILABLE, "the object store is unavailable; retry shortly"
        ) from None
    health.ok()
    return data
