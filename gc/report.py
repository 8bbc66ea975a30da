"""What a GC pass did (or, dry, would do), and lifetime totals for metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GcReport:
    dry_run: bool = False
    started_ms: int = 0
    finished_ms: int = 0
    streams_expired: int = 0
    producer_states_expired: int = 0  # idempotent producers idle past --producer-ttl-s
    retention_advanced: int = 0
    bytes_released: int = 0  # stream bytes no reader can reach any more
    objects_released: int = 0  # objects with no owner, waiting out the grace delay
    objects_deleted: int = 0
    bytes_deleted: int = 0
    orphans_found: int = 0
    orphans_deleted: int = 0
    segments_deleted: int = 0
    would_delete: list[dict[str, Any]] = field(default_factory=list)  # dry run: key, bytes, reason
    errors: list[str] = field(default_factory=list)
    integrity_errors: list[str] = field(default_factory=list)
    objects_rewritten: int = 0  # shared objects rewritten without an erased bucket's rows (``erasure``)
    would_rewrite: list[dict[str, Any]] = field(default_factory=list)  # dry run: key, bytes, reason
    # Keyed compaction (``compaction``): streams compacted, messages removed; dry run: what would be.
    streams_compacted: int = 0
    messages_compacted: int = 0
    would_compact: list[dict[str, Any]] = field(default_factory=list)
    # Physical keyed compaction (``compaction-reclaim``): objects rewritten without hole bytes, bytes gone.
    objects_compacted: int = 0
    compaction_bytes_reclaimed: int = 0
    key_indexes_written: int = 0  # issue 21: key indexes of streams keyed by header (``key_index``)
    # Keyed compaction: streams a pass (or a dry run alike) read but left alone, having changed meanwhile
    # (deleted, erased, forked): bucket, path, reason.
    compaction_skipped: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GcTotals:
    """Counters for metrics, over the process lifetime."""

    passes: int = 0
    bytes_reclaimed: int = 0
    objects_deleted: int = 0
    orphans_found: int = 0
    producer_states_expired: int = 0
    integrity_errors: int = 0
    errors: int = 0
    last_pass_ms: int = 0
