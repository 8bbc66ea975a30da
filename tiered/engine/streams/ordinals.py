"""Record ordinals: every message of a stream numbered 0, 1, 2, ... per incarnation (pure).

A *message* is one JSON value of a JSON stream (an array body is a batch of
them), and one append's body of any other stream (a create's body counts as
one). Ordinals are dense: the n-th message a stream incarnation stored is
ordinal n; a stream created again at its path starts again at 0 (its offsets
do not, see the README on incarnations). ``GET ...?record=N`` reads from the
N-th message, every read answers ``Stream-Record`` (the ordinal of the
message its first byte belongs to), ``HEAD`` shows the count.

Journal state, with no record of its own: ``RecordsState`` is a state
extension that *observes* the stream records the state applies
(``StreamCreated``, ``Appended``, retention, deletes) and derives the index
from them, so replaying the journal (or a cluster shard's WAL, on takeover)
rebuilds exactly the same ordinals, and snapshots carry it (its own section,
``"records"``). A snapshot written before ordinals existed has no section:
streams it holds keep working but have no ordinals (``None`` below: no
``Stream-Record`` header, ``?record=`` refused with 400), while every stream
created afterwards has them.

The index of a stream (``RecordIndex``) keeps, per message it still holds,
its ordinal and its start offset (two packed ``array('q')``, 16 bytes a
message): the same per-message records Ursula keeps
(``message_records``/``record_index``). Entries below the retained offset go
when retention advances, and the first retained ordinal is reported from
what is left. Compaction (which removes messages from the middle) drops
entries with ``remove_range``: the ordinals of the messages it removes are
skipped, never handed out again (``next`` only grows), and a ``?record=`` of a
removed ordinal reads from the next message that survives.

A fork continues its source's numbering: its first own message's ordinal is
the number of source messages that start below the fork point (``base``),
and ordinals below ``base`` are looked up in the source (which lives on,
soft-deleted if need be, while a fork reads it). A fork copied from another
shard (cluster mode) numbers the bytes it copied as its own messages, from 0.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import msgspec

from tiered.core.content import is_json
from tiered.engine.streams.records import (
    Appended,
    BucketErased,
    PayloadAppended,
    RetentionAdvanced,
    StreamCompacted,
    StreamCreated,
    StreamDeleted,
    StreamExpired,
)

__all__ = ["NAME", "RecordIndex", "RecordsState", "RecordView", "changes", "message_starts"]

NAME = "records"  # the extension's name: its section of the snapshot


def message_starts(offset: int, data: bytes, json: bool) -> list[int]:
    """Where each message of a stored append starts: one per JSON line, else the append itself."""
    if not data:
        return []
    if not json:
        return [offset]
    lines = data.split(b"\n")  # each message ends with a newline: the last piece is empty
    return list(accumulate((len(line) + 1 for line in lines[:-2]), initial=offset))


class RecordIndex:
    """One stream's messages still held: ordinals and start offsets, in order; ``next``: the next ordinal."""

    __slots__ = ("ords", "offs", "next", "base", "json")

    def __init__(self, base: int = 0, json: bool = False) -> None:
        self.ords = array("q")
        self.offs = array("q")
        self.base = base  # the first ordinal of the stream's own messages (a fork's: its source's count)
        self.next = base
        self.json = json  # a JSON stream (its content type never changes): how its messages are found

    def add(self, starts: list[int]) -> None:
        n = len(starts)
        if n == 1:
            self.ords.append(self.next)
            self.offs.append(starts[0])
        else:
            self.ords.extend(range(self.next, self.next + n))
            self.offs.extend(starts)
        self.next += n

    def trim_below(self, offset: int) -> None:
        """Forget the messages that start below ``offset`` (retention: whole messages only)."""
        n = bisect_left(self.offs, offset)
        if n:
            del self.ords[:n]
            del self.offs[:n]

    def remove_range(self, start: int, end: int) -> int:
        """Forget the messages that start in ``[start, end)`` (compaction); their ordinals are never reused."""
        lo, hi = bisect_left(self.offs, start), bisect_left(self.offs, end)
        del self.ords[lo:hi]
        del self.offs[lo:hi]
        return hi - lo

    def remove_ranges(self, ranges: Sequence[tuple[int, int]]) -> int:
        """``remove_range`` of many sorted, disjoint ranges in one pass over the index (issue 21: one
        compaction pass of a large key space removes tens of thousands; one at a time is quadratic)."""
        if len(ranges) <= 8:
            return sum(self.remove_range(a, b) for a, b in ranges)
        ords, offs = array("q"), array("q")
        pos = removed = 0
        for a, b in sorted(ranges):
            lo = bisect_left(self.offs, a, pos)
            hi = bisect_left(self.offs, b, lo)
            ords.extend(self.ords[pos:lo])
            offs.extend(self.offs[pos:lo])
            removed += hi - lo
            pos = hi
        ords.extend(self.ords[pos:])
        offs.extend(self.offs[pos:])
        self.ords, self.offs = ords, offs
        return removed

    def first_at_or_after(self, offset: int) -> int:
        """The ordinal of the first message held that starts at or after ``offset`` (``next`` if none)."""
        i = bisect_left(self.offs, offset)
        return self.ords[i] if i < len(self.ords) else self.next

    def containing(self, offset: int) -> int | None:
        """The ordinal of the held message ``offset`` falls in (None: below the first held)."""
        i = bisect_right(self.offs, offset) - 1
        return self.ords[i] if i >= 0 else None

    def offset_of(self, ordinal: int) -> int | None:
        """The start of the first held message whose ordinal is at least ``ordinal`` (None: past the last)."""
        i = bisect_left(self.ords, ordinal)
        return self.offs[i] if i < len(self.offs) else None

    def count_from(self, start: int, end: int) -> int:
        """How many held messages start in ``[start, end)``."""
        return max(0, bisect_left(self.offs, end) - bisect_left(self.offs, start))

    def packed(self) -> tuple[int, int, bool, bytes, bytes]:
        return self.base, self.next, self.json, self.ords.tobytes(), self.offs.tobytes()

    @classmethod
    def unpacked(cls, base: int, next_: int, json: bool, ords: bytes, offs: bytes) -> RecordIndex:
        index = cls(base, json)
        index.next = next_
        index.ords = array("q", ords)
        index.offs = array("q", offs)
        if len(index.ords) != len(index.offs):
            raise ValueError("record index: ordinals and offsets differ in length")
        return index


class _Snapshot(msgspec.Struct, array_like=True):
    version: int
    indexes: dict[int, tuple[int, int, bool, bytes, bytes]]
    parents: dict[int, int]


class RecordsState:
    """The state extension that keeps every stream's ``RecordIndex`` (see the module docstring)."""

    name = NAME
    record_types: tuple[type, ...] = ()
    observed_types: tuple[type, ...] = (
        StreamCreated,
        Appended,
        RetentionAdvanced,
        StreamDeleted,
        StreamExpired,
        BucketErased,
        PayloadAppended,
        StreamCompacted,
    )

    def __init__(self) -> None:
        self.indexes: dict[int, RecordIndex] = {}
        self.parents: dict[int, int] = {}  # a fork's uid -> its source's (to forget both once gone)

    def apply(self, record: Any) -> None:
        raise TypeError(f"the record index applies no record of its own ({type(record).__name__})")

    def observe(self, record: Any, state: Any) -> None:
        """A stream record was applied to ``state`` (a ``StreamState``): the index follows."""
        if type(record) is Appended:
            index = self.indexes.get(record.uid)
            if index is not None and record.data:
                index.add(message_starts(record.offset, record.data, index.json))
        elif type(record) is PayloadAppended:  # a large body stored by reference: one message
            index = self.indexes.get(record.uid)
            if index is not None and record.digest.size:
                index.add([record.offset])
        elif type(record) is StreamCreated:
            self._created(record, state)
        elif type(record) is RetentionAdvanced:
            for advanced, _ in record.advances:
                index = self.indexes.get(advanced)
                s = state.streams.get(advanced)
                if index is not None and s is not None:
                    index.trim_below(s.retained_from)
        elif type(record) is StreamCompacted:  # keyed compaction: removed messages lose their ordinals
            if record.uid in self.indexes:
                self.indexes[record.uid].remove_ranges(record.removed)
        elif type(record) is BucketErased:
            for gone in [u for u in self.indexes if u not in state.streams]:
                self._forget(gone)
        else:  # deleted or expired: the stream, and sources only it still read, may be gone
            uid: int | None = record.uid
            while uid is not None and uid not in state.streams and uid in self.indexes:
                parent = self.parents.get(uid)
                self._forget(uid)
                uid = parent

    def _created(self, record: StreamCreated, state: Any) -> None:
        base = 0
        if record.fork_source is not None:
            source = self.indexes.get(record.fork_source)
            if source is None:  # a source from before ordinals were kept: its forks have none either
                return
            base = source.first_at_or_after(record.fork_offset)
            self.parents[record.uid] = record.fork_source
        json = is_json(record.content_type)
        index = self.indexes[record.uid] = RecordIndex(base, json)
        index.add(message_starts(record.fork_offset, record.data, json))

    def _forget(self, uid: int) -> None:
        self.indexes.pop(uid, None)
        self.parents.pop(uid, None)

    def snapshot(self) -> bytes:
        indexes = {uid: index.packed() for uid, index in sorted(self.indexes.items())}
        return msgspec.msgpack.encode(_Snapshot(1, indexes, dict(sorted(self.parents.items()))))

    def restore(self, data: bytes) -> None:
        snap = msgspec.msgpack.decode(data, type=_Snapshot)
        self.indexes = {uid: RecordIndex.unpacked(*packed) for uid, packed in snap.indexes.items()}
        self.parents = dict(snap.parents)


@dataclass(frozen=True, slots=True)
class RecordView:
    """A stream's ordinals as of a visible tail: what reads and ``HEAD`` report."""

    first: int  # the first retained message's ordinal (``next`` when none is retained)
    next: int  # the ordinal the next message will get: how many the incarnation stored
    count: int  # messages readable now (retained, not removed by compaction)


IndexOf = Callable[[int], "tuple[RecordIndex, int | None, int] | None"]
"""uid -> (its index, its fork source's uid, its fork offset), None when it keeps no ordinals."""


def view(index_of: IndexOf, uid: int, retained_from: int, tail: int) -> RecordView | None:
    """``RecordView`` of the stream ``uid`` whose readable bytes are ``[retained_from, tail)``."""
    found = index_of(uid)
    if found is None:
        return None
    index = found[0]
    first = ordinal_containing(index_of, uid, retained_from, tail)
    next_ = index.first_at_or_after(tail)
    return RecordView(first, next_, _count(index_of, uid, retained_from, tail))


def _count(index_of: IndexOf, uid: int, start: int, end: int) -> int:
    found = index_of(uid)
    if found is None:
        return 0
    index, source, fork_offset = found
    own = index.count_from(start, end)
    if source is not None and start < fork_offset:
        own += _count(index_of, source, start, min(end, fork_offset))
    return own


def ordinal_containing(index_of: IndexOf, uid: int, offset: int, tail: int) -> int:
    """The ordinal of the message the byte at ``offset`` belongs to (at the tail: the next ordinal)."""
    found = index_of(uid)
    assert found is not None
    index, source, fork_offset = found
    if offset >= tail:
        return index.first_at_or_after(tail)
    if source is not None and offset < fork_offset:
        return ordinal_containing(index_of, source, offset, fork_offset)
    at = index.containing(offset)
    return index.first_at_or_after(offset) if at is None else at


def offset_of(index_of: IndexOf, uid: int, ordinal: int, tail: int) -> int | None:
    """Where the first message with at least ``ordinal`` starts (the tail when it is not stored yet).

    None: ``ordinal`` is beyond the next one (no such message yet, nor the one after the last).
    """
    found = index_of(uid)
    assert found is not None
    index, source, fork_offset = found
    if source is not None and ordinal < index.base:
        inherited = offset_of(index_of, source, ordinal, fork_offset)
        return fork_offset if inherited is None else min(inherited, fork_offset)
    if ordinal > index.first_at_or_after(tail):
        return None
    at = index.offset_of(ordinal)
    return tail if at is None or at > tail else at


def changes(index_of: IndexOf, uid: int, start: int, end: int, tail: int) -> list[tuple[int, int]]:
    """Where ``ordinal_containing`` changes in ``(start, end)``: (offset, the ordinal from there on), in order.

    With ``ordinal_containing(start)`` this answers ``ordinal_containing(x)`` for
    every ``x`` in ``[start, end)`` (``end <= tail``): the ordinal of the last
    change at or below ``x``, else the one at ``start``. What a cold locator
    carries so a node that does not own the stream answers ``Stream-Record``.
    """
    found = index_of(uid)
    assert found is not None
    index, source, fork_offset = found
    out: list[tuple[int, int]] = []
    if source is not None and start < fork_offset:
        out = changes(index_of, source, start, min(end, fork_offset), fork_offset)
        if end <= fork_offset:
            return out
        start = fork_offset
        if start not in index.offs[:1]:  # the fork's own bytes start without an own message there
            out.append((start, ordinal_containing(index_of, uid, start, tail)))
    lo, hi = bisect_left(index.offs, start), bisect_left(index.offs, end)
    out.extend(zip(index.offs[lo:hi], index.ords[lo:hi], strict=True))
    return out
