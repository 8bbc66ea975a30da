"""What each bucket holds: its streams and retained bytes (hot, cold, producer state), for quotas and gauges.

A stream's retained bytes are its own data still held: from
``max(fork_offset, keep_start)`` (what retention and deletes released is
gone) to its tail (or ``keep_end`` for a soft-deleted fork source). Bytes
below ``cold_end`` are in cold objects, the rest only hot. A fork's inherited
data is held (and counted) by its source's bucket. Streams count while they
exist and are not soft-deleted (an expired stream counts until GC journals
its expiry). Idempotent producers' state counts too: ``Stream.producer_bytes``
(``tiered/engine/streams/producers.py``: each state's id plus 24 bytes), so a bucket
cannot grow without bound through producer ids. So do a stream's snapshot object and a keyed stream's
key index object (``header_keys``; by header or JSON pointer): cold objects its streams own, written for them.

``footprints`` walks every stream (gauges, the usage API). The quota checks
on the write path use ``FootprintCache``: per-bucket totals kept up to date by
the records that add bytes or streams, and recomputed with one walk after a
record that releases any (deletes, expiry, erasure, retention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tiered.engine.streams import header_keys
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import (
    Appended,
    BucketErased,
    KeyIndexCommitted,
    ProducersExpired,
    RetentionAdvanced,
    SnapshotPublished,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
)
from tiered.engine.streams.snapshots import snapshot_bytes
from tiered.engine.streams.state import StreamState

_RELEASING = (StreamDeleted, StreamExpired, BucketErased, RetentionAdvanced, SnapshotPublished)


def retained_bytes(s: Stream) -> tuple[int, int]:
    """(hot, cold) bytes of a stream's own data still held."""
    lo = max(s.fork_offset, s.keep_start)
    hi = s.tail if s.keep_end is None else min(s.tail, s.keep_end)
    if hi <= lo:
        return 0, 0
    cold = max(0, min(s.cold_end, hi) - lo)
    return hi - lo - cold, cold


@dataclass(slots=True)
class Footprint:
    streams: int = 0
    hot_bytes: int = 0
    cold_bytes: int = 0
    producer_bytes: int = 0  # idempotent producers' state
    snapshot_bytes: int = 0  # stream snapshots' bodies (``tiered/engine/streams/snapshots.py``)
    key_index_bytes: int = 0  # keyed streams' key index objects (``header_keys``)

    @property
    def retained_bytes(self) -> int:
        return (
            self.hot_bytes
            + self.cold_bytes
            + self.producer_bytes
            + self.snapshot_bytes
            + self.key_index_bytes
        )

    def by_tier(self) -> dict[str, int]:
        """The retained bytes by tier, as the usage API and ``/metrics`` name them (one list for both)."""
        return {
            "hot": self.hot_bytes,
            "cold": self.cold_bytes,
            "producers": self.producer_bytes,
            "snapshots": self.snapshot_bytes,
            "key_index": self.key_index_bytes,
        }

    def add(self, other: Footprint) -> None:
        """Sum ``other`` into this one (buckets folded under one metrics label)."""
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def footprints(state: StreamState) -> dict[str, Footprint]:
    """Every bucket's footprint, by one walk over the streams (buckets without streams included)."""
    out = {b: Footprint() for b in state.buckets}
    for s in state.streams.values():
        fp = out.get(s.bucket)
        if fp is None:
            fp = out[s.bucket] = Footprint()
        if not s.soft_deleted:
            fp.streams += 1
        hot, cold = retained_bytes(s)
        fp.hot_bytes += hot
        fp.cold_bytes += cold
        fp.producer_bytes += s.producer_bytes
        fp.snapshot_bytes += snapshot_bytes(s)
        fp.key_index_bytes += header_keys.index_bytes(s)
    return out


class FootprintCache:
    """Per-bucket (streams, retained bytes) for quota checks; a commit observer keeps it current."""

    def __init__(self, state: StreamState) -> None:
        self.state = state
        self._totals: dict[str, list[int]] | None = None  # bucket -> [streams, retained bytes]
        self.recomputed = 0  # walks so far (a metric of how often releases force one)

    def totals(self, bucket: str) -> tuple[int, int]:
        if self._totals is None:
            self._totals = {b: [fp.streams, fp.retained_bytes] for b, fp in footprints(self.state).items()}
            self.recomputed += 1
        row = self._totals.get(bucket)
        return (row[0], row[1]) if row is not None else (0, 0)

    def all_totals(self) -> dict[str, tuple[int, int]]:
        """Every bucket's (streams, retained bytes) here: what a cluster shard publishes for quotas."""
        self.totals("")  # computed if a release dropped them
        assert self._totals is not None
        return {b: (row[0], row[1]) for b, row in self._totals.items()}

    def _row(self, bucket: str) -> list[int] | None:
        if self._totals is None:
            return None
        return self._totals.setdefault(bucket, [0, 0])

    # The committer's observer protocol.
    def before_apply(self, record: Any) -> object:
        """Producer-state bytes of the stream(s) an append or a producer expiry is about to change."""
        if self._totals is None:
            return None
        streams = self.state.streams
        if isinstance(record, Appended):
            return streams[record.uid].producer_bytes
        if isinstance(record, ProducersExpired):
            return [(s, s.producer_bytes) for uid in record.uids if (s := streams.get(uid)) is not None]
        if isinstance(record, KeyIndexCommitted):
            # The new index replaces the old one (or none): the bucket's bytes move by the difference. Once
            # per keyed stream per compaction pass, so no walk over every stream for it.
            s = streams.get(record.uid)
            return header_keys.index_bytes(s) if s is not None else 0
        return None

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        if self._totals is None:
            return ()
        if isinstance(record, Appended):
            s = self.state.streams[record.uid]
            if not isinstance(token, int):  # the totals were computed in between: walk again
                self._totals = None
                return ()
            grown = record.length + s.producer_bytes - token
            if grown:
                row = self._row(s.bucket)
                assert row is not None
                row[1] += grown
        elif isinstance(record, ProducersExpired):
            if not isinstance(token, list):
                self._totals = None
                return ()
            for s, before in token:
                row = self._row(s.bucket)
                assert row is not None
                row[1] += s.producer_bytes - before
        elif isinstance(record, KeyIndexCommitted):
            if not isinstance(token, int):
                self._totals = None
                return ()
            keyed = self.state.streams.get(record.uid)
            if keyed is not None and (grown := header_keys.index_bytes(keyed) - token):
                row = self._row(keyed.bucket)
                assert row is not None
                row[1] += grown
        elif isinstance(record, StreamCreated):
            row = self._row(record.bucket)
            assert row is not None
            row[0] += 1
            row[1] += len(record.data)
        elif isinstance(record, _RELEASING):
            self._totals = None
        return ()

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        return None
