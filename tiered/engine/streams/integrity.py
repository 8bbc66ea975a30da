"""Integrity digests of streams (journal state): which records a stream holds, as a multiset hash.

Each record (an append with bytes, or a create's body) adds its 256-bit hash
(``tiered.core.record_digest``) to its stream's *live* digest as it is applied;
releasing it moves it to *released*. ``total`` (live + released) is what the
writers appended, whatever was released since, so a client keeping the same
sum of what it appended can compare it. Per bucket, the sum of its streams.

What counts as released follows what storage lets go of, so ``tiered verify``
can recompute the live digest from the bytes it actually reads:

* a record not yet in the cold tier is released when retention (or a
  soft-deleted source's shrinking needs) passes it; one retention cuts in the
  middle is released whole, and its remaining bytes (which the flusher may
  still copy as a shorter row) count for nothing: ``counted_from`` is the
  offset below which no row counts;
* records in the cold tier are counted per cold reference (one stream range
  in one object): the reference's sum is released when the stream drops the
  reference (its end falls below retention, or no reader reaches it).

So this module keeps, per stream, the hashes of its records not yet cold (in
offset order) and the sum of each cold reference. Streams from data written
before digests existed have none (``Stream.integrity`` is None): nothing here
touches them, HEAD shows no digest and verify says it cannot check them.

Pure: no I/O, no clock. The hooks (``note_record``, ``note_cold``,
``note_release``) are called by the apply rules in ``appends``, ``lifecycle``,
``cold_refs`` and ``release``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar

from tiered.core.record_digest import MASK, RecordHasher, digest_bytes, format_digest

if TYPE_CHECKING:
    from tiered.engine.streams.model import ColdRef, Stream
    from tiered.engine.streams.state import StreamState

_START, _END, _HASH = itemgetter(0), itemgetter(1), itemgetter(2)  # of a ``hot`` record: (start, end, hash)


class StreamIntegrity:
    """One stream's digests and counts, and what it needs to release records later.

    ``hot``: records not yet cold, in offset order: (start, end, hash).
    ``cold``: per cold reference (keyed by its start offset): (digest, records, bytes).
    """

    # Not journal state: the stream's record hasher (its hash prefix), built on first use.
    SOFT_STATE: ClassVar[tuple[str, ...]] = ("hasher",)

    __slots__ = (
        "live",
        "live_records",
        "live_bytes",
        "released",
        "released_records",
        "released_bytes",
        "counted_from",
        "hot",
        "cold",
        "hasher",
    )

    def __init__(self) -> None:
        self.live = 0
        self.live_records = 0
        self.live_bytes = 0
        self.released = 0
        self.released_records = 0
        self.released_bytes = 0
        self.counted_from = 0
        self.hot: list[tuple[int, int, int]] = []
        self.cold: dict[int, tuple[int, int, int]] = {}
        self.hasher: RecordHasher | None = None  # soft: built on first use

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StreamIntegrity):
            return NotImplemented
        return self.packed() == other.packed()

    __hash__ = None  # type: ignore[assignment]

    # -------------------------------------------------------------- snapshots

    def packed(self) -> list[Any]:
        """The msgspec-encodable form (256-bit values as 32 big-endian bytes)."""
        return [
            digest_bytes(self.live),
            self.live_records,
            self.live_bytes,
            digest_bytes(self.released),
            self.released_records,
            self.released_bytes,
            self.counted_from,
            array("q", [r[0] for r in self.hot]).tobytes(),
            array("q", [r[1] for r in self.hot]).tobytes(),
            b"".join(digest_bytes(r[2]) for r in self.hot),
            [[start, digest_bytes(d), n, size] for start, (d, n, size) in self.cold.items()],
        ]

    @classmethod
    def unpacked(cls, obj: Sequence[Any]) -> StreamIntegrity:
        """From ``packed()``; ValueError if it is not that shape."""
        if len(obj) < 11:
            raise ValueError("integrity: too few fields")
        out = cls()
        out.live = int.from_bytes(obj[0], "big")
        out.live_records, out.live_bytes = int(obj[1]), int(obj[2])
        out.released = int.from_bytes(obj[3], "big")
        out.released_records, out.released_bytes = int(obj[4]), int(obj[5])
        out.counted_from = int(obj[6])
        starts, ends, raw = array("q", obj[7]), array("q", obj[8]), bytes(obj[9])
        hashes = [int.from_bytes(raw[i : i + 32], "big") for i in range(0, len(raw), 32)]
        if not len(starts) == len(ends) == len(hashes):
            raise ValueError("integrity: hot records of unequal lengths")
        out.hot = list(zip(starts, ends, hashes, strict=True))
        out.cold = {int(s): (int.from_bytes(d, "big"), int(n), int(b)) for s, d, n, b in obj[10]}
        return out

    # -------------------------------------------------------------- moves

    def _release(self, digest: int, records: int, size: int) -> None:
        self.live = (self.live - digest) & MASK
        self.live_records -= records
        self.live_bytes -= size
        self.released = (self.released + digest) & MASK
        self.released_records += records
        self.released_bytes += size

    @property
    def total(self) -> int:
        return (self.live + self.released) & MASK


def fresh(s: Stream) -> None:
    """A new stream starts with empty digests (called once its incarnation is known)."""
    s.integrity = StreamIntegrity()
    s.integrity.counted_from = s.fork_offset


def note_record(s: Stream, start: int, data: bytes) -> None:
    """A record ``data`` at ``start`` was applied: it is live."""
    integ = s.integrity
    if integ is None or not data:
        return
    hasher = integ.hasher
    if hasher is None:
        hasher = integ.hasher = RecordHasher(s.bucket, s.path, s.incarnation)
    h = hasher(start, data)
    integ.live = (integ.live + h) & MASK
    integ.live_records += 1
    integ.live_bytes += len(data)
    integ.hot.append((start, start + len(data), h))


def note_payload(s: Stream, start: int, size: int, record_hash: bytes) -> None:
    """A large body stored by reference (``payloads``) was applied at ``start``: one live record, cold at once.

    Its hash was computed as the body streamed and journaled with it (a body is
    never in memory whole); it is counted under its cold reference's start, so
    dropping the reference releases it like any other.
    """
    integ = s.integrity
    if integ is None or not record_hash or not size:
        return
    h = int.from_bytes(record_hash, "big")
    integ.live = (integ.live + h) & MASK
    integ.live_records += 1
    integ.live_bytes += size
    integ.cold[start] = (h, 1, size)


def hot_records(s: Stream) -> list[tuple[int, int, int]]:
    """A copy of each record not yet cold, ``(start, end, hash)`` in offset order (empty without digests).

    What the flusher takes on the loop (one list copy, no per-record work there) and matches to the
    records it copies on its worker thread (``digests_of``).
    """
    integ = s.integrity
    return [] if integ is None else list(integ.hot)


def digests_of(hot: Sequence[tuple[int, int, int]], ranges: Iterable[tuple[int, int]]) -> list[int | None]:
    """The hash of each record ``(start, end)`` of ``ranges`` (in offset order) in ``hot`` (``hot_records``),
    None for one it does not hold: one walk over both, as ``note_cold`` walks them."""
    out: list[int | None] = []
    i, n = 0, len(hot)
    for start, end in ranges:
        while i < n and hot[i][0] < start:
            i += 1
        out.append(hot[i][2] if i < n and hot[i][0] == start and hot[i][1] == end else None)
    return out


def note_cold(s: Stream, start: int, end: int) -> None:
    """The stream's range ``[start, end)`` is now served by a cold reference: sum its records there."""
    integ = s.integrity
    if integ is None:
        return
    hot = integ.hot
    # In offset order, records apart: starts and ends both ascend. A flush pass notes a second's records at
    # once, on the loop: found by bisection and summed in C rather than walked one by one.
    i = bisect_left(hot, start, key=_START)
    j = bisect_right(hot, end, lo=i, key=_END)
    taken = hot[i:j]
    digest = sum(map(_HASH, taken))
    size = sum(map(_END, taken)) - sum(map(_START, taken))
    integ.cold[start] = (digest & MASK, j - i, size)
    del hot[i:j]


def note_release(s: Stream, before: Iterable[ColdRef], kept: Sequence[ColdRef]) -> None:
    """``release`` dropped cold references (those of ``before`` not ``kept``): their records are released."""
    integ = s.integrity
    if integ is None:
        return
    kept_starts = {ref.start for ref in kept}
    for ref in before:
        if ref.start not in kept_starts:
            entry = integ.cold.pop(ref.start, None)
            if entry is not None:
                integ._release(*entry)


def note_dropped(s: Stream, ref_start: int, digest: int, records: int, size: int) -> None:
    """A compaction rewrite moved the cold reference at ``ref_start`` to an object without some of its
    records (all in the stream's holes): those are released, and the reference's sum keeps the rest."""
    integ = s.integrity
    if integ is None:
        return
    entry = integ.cold.get(ref_start)
    if entry is None:
        return
    d, n, b = entry
    integ.cold[ref_start] = ((d - digest) & MASK, n - records, b - size)
    integ._release(digest & MASK, records, size)


def note_hot_release(s: Stream) -> None:
    """``release`` moved ``keep_start`` (or ``keep_end``): records not yet cold outside them are released.

    Those below ``keep_start`` go, one it cuts too (its rest counts for nothing:
    ``counted_from``); so do those starting at or past ``keep_end``.
    """
    integ = s.integrity
    if integ is None:
        return
    hot = integ.hot
    n = 0
    while n < len(hot) and hot[n][0] < s.keep_start:
        start, end, h = hot[n]
        integ._release(h, 1, end - start)
        integ.counted_from = max(integ.counted_from, end)
        n += 1
    if n:
        del hot[:n]
    if s.keep_end is not None:
        m = len(hot)
        while m > 0 and hot[m - 1][0] >= s.keep_end:
            m -= 1
            start, end, h = hot[m]
            integ._release(h, 1, end - start)
        del hot[m:]


# ------------------------------------------------------------------ views


@dataclass(frozen=True, slots=True)
class IntegrityView:
    """What HEAD and the admin route show: digests as hex, with record and byte counts."""

    live: int
    live_records: int
    live_bytes: int
    released: int
    released_records: int
    released_bytes: int

    @property
    def total(self) -> int:
        return (self.live + self.released) & MASK

    @property
    def records(self) -> int:
        return self.live_records + self.released_records

    @property
    def bytes(self) -> int:
        return self.live_bytes + self.released_bytes

    def __add__(self, other: IntegrityView) -> IntegrityView:
        return IntegrityView(
            (self.live + other.live) & MASK,
            self.live_records + other.live_records,
            self.live_bytes + other.live_bytes,
            (self.released + other.released) & MASK,
            self.released_records + other.released_records,
            self.released_bytes + other.released_bytes,
        )

    def header(self) -> str:
        """The ``Stream-Integrity`` header value."""
        return (
            f"live={format_digest(self.live)};live-records={self.live_records};live-bytes={self.live_bytes};"
            f"released={format_digest(self.released)};released-records={self.released_records};"
            f"released-bytes={self.released_bytes};"
            f"total={format_digest(self.total)};records={self.records};bytes={self.bytes}"
        )

    def as_json(self) -> dict[str, object]:
        return {
            "live": format_digest(self.live),
            "live_records": self.live_records,
            "live_bytes": self.live_bytes,
            "released": format_digest(self.released),
            "released_records": self.released_records,
            "released_bytes": self.released_bytes,
            "total": format_digest(self.total),
            "records": self.records,
            "bytes": self.bytes,
        }


EMPTY = IntegrityView(0, 0, 0, 0, 0, 0)


def view(s: Stream) -> IntegrityView | None:
    """A stream's digests; None for a stream from before digests were kept."""
    integ = s.integrity
    if integ is None:
        return None
    return IntegrityView(
        integ.live,
        integ.live_records,
        integ.live_bytes,
        integ.released,
        integ.released_records,
        integ.released_bytes,
    )


@dataclass(frozen=True, slots=True)
class BucketIntegrity:
    """A bucket's digests: the sum of its streams', and each stream's."""

    bucket: str
    total: IntegrityView
    streams: list[tuple[Stream, IntegrityView | None]]


def bucket_json(b: BucketIntegrity) -> dict[str, object]:
    """The admin route's body: the bucket's sums, then each stream's (``integrity`` null: no digests)."""
    return {
        "bucket": b.bucket,
        "integrity": b.total.as_json(),
        "streams": [
            {
                "path": s.path,
                "incarnation": s.incarnation,
                "soft_deleted": s.soft_deleted,
                "integrity": v.as_json() if v is not None else None,
            }
            for s, v in b.streams
        ],
    }


def bucket_view(state: StreamState, bucket: str) -> BucketIntegrity:
    """Every stream the state holds in ``bucket`` (soft-deleted sources too: they hold data), by path."""
    rows = sorted(
        ((s, view(s)) for s in state.streams.values() if s.bucket == bucket),
        key=lambda row: (row[0].path, row[0].uid),
    )
    total = EMPTY
    for _, v in rows:
        if v is not None:
            total = total + v
    return BucketIntegrity(bucket, total, rows)
