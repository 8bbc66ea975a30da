"""Reading a large body stored by reference (``payloads``): stream offsets to object bytes, checked.

The object's bytes are checked block by block against the digest its
reference keeps (``tiered.cold.objects.payload``); a mismatch is the cold
tier's damage (``ColdDataDamaged``), so ``cold_read`` answers it as every
other damaged cold read: ``DATA_DAMAGED``, counted and logged, never served.
"""

from __future__ import annotations

from tiered.cold.objects.payload import PayloadDamaged, read_payload
from tiered.cold.objects.store import ObjectStore
from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.engine.streams.model import ColdObject


async def read_payload_slice(store: ObjectStore, obj: ColdObject, start: int, end: int) -> bytes:
    """Stream bytes ``[start, end)`` of the payload object ``obj``."""
    assert obj.payload is not None
    lo, hi = start - obj.payload_base, end - obj.payload_base
    try:
        return await read_payload(store, obj.key, obj.payload, lo, hi)
    except PayloadDamaged as exc:
        raise ColdDataDamaged(obj.key, str(exc)) from None
