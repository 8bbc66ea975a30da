"""``tiered verify``'s digest check: every stream's live integrity digest, recomputed from the bytes read.

The journal keeps, per stream, the hash of each record not yet cold and the
sum of each cold reference (``tiered.engine.streams.integrity``). This reads
the records where they are (hot segment bytes as stored, cold objects' rows as
decoded) and recomputes the same values with the same hash
(``tiered.core.record_digest``), so:

* a flipped bit in a hot segment changes its record's hash (named: stream,
  range, segment);
* a flipped bit, a lost row or a doubled row in a cold object changes the sum
  of the reference it falls in (named: stream, range, object); a row of the
  stream outside the range the stream reads from that object is named too;
* a row whose bytes do not hash to the contribution the writer put in the
  object's footer (``tiered.integrity.v1``) is named with its row group;
* a large body stored by reference (a payload object) is one record: its
  bytes, read whole, hash to the contribution its reference journaled
  (``PayloadHashes``), or its reference's sum differs and is named.

Finally each stream's live digest, as recomputed, is compared with the
journal's. Streams from before digests were kept are counted as unchecked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tiered.cold.parquet.chunk import row_groups
from tiered.core.record_digest import MASK, HashState, RecordHasher, format_digest, hash_value
from tiered.engine.streams.integrity import StreamIntegrity
from tiered.engine.streams.model import ColdRef, Stream
from tiered.engine.streams.state import StreamState
from tiered.hot.segment import segment_name

Sum = tuple[int, int, int]  # digest, records, bytes


@dataclass
class DigestTally:
    """What the bytes read add up to: per (stream uid, cold reference start), and per hot record."""

    cold: dict[tuple[int, int], Sum] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    streams_checked: int = 0
    streams_unchecked: int = 0


def _add(a: Sum, b: Sum) -> Sum:
    return ((a[0] + b[0]) & MASK, a[1] + b[1], a[2] + b[2])


def _describe(value: Sum) -> str:
    return f"{format_digest(value[0])} ({value[1]} records, {value[2]} bytes)"


def refs_by_object(state: StreamState) -> dict[str, dict[tuple[str, str], tuple[Stream, ColdRef]]]:
    """Object key -> (bucket, path) -> the stream (with digests) reading from it, and its reference."""
    out: dict[str, dict[tuple[str, str], tuple[Stream, ColdRef]]] = {}
    for s in state.streams.values():
        if s.integrity is None:
            continue
        for ref in s.cold_refs:
            out.setdefault(ref.key, {})[(s.bucket, s.path)] = (s, ref)
    return out


def tally_object(
    key: str, data: bytes, readers: dict[tuple[str, str], tuple[Stream, ColdRef]], tally: DigestTally
) -> None:
    """Hash every row of one object: check it against its footer contribution, add it to its reference."""
    try:
        footer, groups = row_groups(data)
        hashers: dict[tuple[str, str, int], RecordHasher] = {}
        for g, rows in groups:
            for i, r in enumerate(rows):
                ident = (r.bucket, r.stream, r.incarnation)
                hasher = hashers.get(ident)
                if hasher is None:
                    hasher = hashers[ident] = RecordHasher(*ident)
                h = hasher(r.start_offset, r.payload)
                where = f"{r.bucket}/{r.stream} [{r.start_offset}, {r.end_offset})"
                if footer is not None and footer[g][i] != h:
                    tally.errors.append(
                        f"{key}: row group {g} row {i}, {where}: its bytes do not hash to the digest "
                        "written with it"
                    )
                reader = readers.get((r.bucket, r.stream))
                if reader is None:
                    continue
                s, ref = reader
                integ = s.integrity
                if integ is None or r.incarnation != s.incarnation or r.start_offset < integ.counted_from:
                    continue
                if not (ref.start <= r.start_offset and r.end_offset <= ref.end):
                    tally.errors.append(
                        f"{key}: {where}: the row lies outside the range [{ref.start}, {ref.end}) the "
                        "stream reads from this object (a doubled or foreign row)"
                    )
                slot = (s.uid, ref.start)
                tally.cold[slot] = _add(tally.cold.get(slot, (0, 0, 0)), (h, 1, len(r.payload)))
    except Exception as exc:  # damage the main check reports in full; here: what it means for digests
        tally.errors.append(f"{key}: rows cannot be read for their digests ({type(exc).__name__}: {exc})")


class PayloadHashes:
    """The digest contributions of one payload object, for each stream that counts it, as its bytes are read.

    A stream counts a payload when it journaled the body's hash (its digests
    hold a cold sum at the reference's start, which is where the body begins):
    forks reading an inherited payload, and bodies journaled before payloads
    were counted, count nothing here as in the journal.
    """

    def __init__(self, base: int, size: int, readers: dict[tuple[str, str], tuple[Stream, ColdRef]]) -> None:
        self.size = size
        self.slots: list[tuple[tuple[int, int], HashState]] = []
        for s, ref in readers.values():
            integ = s.integrity
            if integ is None or ref.start != base or ref.start not in integ.cold:
                continue
            state = RecordHasher(s.bucket, s.path, s.incarnation).begin(ref.start, size)
            self.slots.append(((s.uid, ref.start), state))

    def update(self, data: bytes) -> None:
        for _, state in self.slots:
            state.update(data)

    def add_to(self, tally: DigestTally) -> None:
        """Once every byte was read: each stream's reference sums the body as one record."""
        for slot, state in self.slots:
            tally.cold[slot] = _add(tally.cold.get(slot, (0, 0, 0)), (hash_value(state), 1, self.size))


def _hot_records(
    s: Stream, integ: StreamIntegrity, hot_dir: Path, tally: DigestTally
) -> Iterable[tuple[int, int, int]]:
    """(start, end, hash) of the stream's records the hot tier holds (not yet cold), from the bytes stored."""
    hasher = RecordHasher(s.bucket, s.path, s.incarnation)
    floor = max(s.cold_end, integ.counted_from)
    c = s.chunks
    for start, length, seg, pos in zip(c.starts, c.lens, c.segs, c.poss, strict=True):
        if start < floor:
            continue
        try:
            fd = os.open(hot_dir / segment_name(seg), os.O_RDONLY)
            try:
                data = os.pread(fd, length, pos)
            finally:
                os.close(fd)
        except OSError as exc:
            tally.errors.append(f"{s.bucket}/{s.path} [{start}, {start + length}): segment {seg}: {exc}")
            continue
        yield start, start + length, hasher(start, data)


def check_stream(s: Stream, hot_dir: Path, tally: DigestTally) -> None:
    """Compare one stream's digests with what its bytes add up to; name every range that differs."""
    integ = s.integrity
    if integ is None:
        tally.streams_unchecked += 1
        return
    tally.streams_checked += 1
    name = f"{s.bucket}/{s.path}"
    live: Sum = (0, 0, 0)
    for ref in s.cold_refs:
        got = tally.cold.get((s.uid, ref.start), (0, 0, 0))
        want = integ.cold.get(ref.start)
        if want is not None and got != want:
            tally.errors.append(
                f"{name} [{ref.start}, {ref.end}) in {ref.key}: its rows add up to {_describe(got)}, "
                f"the journal's digest is {_describe(want)}"
            )
        live = _add(live, got)
    kept = {start: (end, h) for start, end, h in integ.hot}
    for start, end, h in _hot_records(s, integ, hot_dir, tally):
        want_hot = kept.pop(start, None)
        if want_hot is None:
            tally.errors.append(f"{name} [{start}, {end}) (hot): a record the journal's digests do not hold")
        elif want_hot != (end, h):
            tally.errors.append(
                f"{name} [{start}, {end}) (hot): its bytes do not hash to the digest the journal kept"
            )
        live = _add(live, (h, 1, end - start))
    for start, (end, _) in sorted(kept.items()):
        tally.errors.append(
            f"{name} [{start}, {end}) (hot): a record the journal holds is not in the hot tier"
        )
    want_live = (integ.live, integ.live_records, integ.live_bytes)
    if live != want_live:
        tally.errors.append(
            f"{name}: live digest recomputed from the bytes read is {_describe(live)}, "
            f"the journal's is {_describe(want_live)}"
        )
