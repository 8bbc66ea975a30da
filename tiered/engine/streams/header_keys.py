"""Streams keyed by header (issue 21), decided with no I/O: ``Stream-Key`` per append, tombstones, the key index.

A stream of any content type created with ``Stream-Compaction-Key: header``
takes its keys from each append's ``Stream-Key`` header, as the community fork
``durable-streams-keyed`` does (docs/compaction.md compares the two). The key
names the whole append: compaction keeps only the newest append of each key.
``Stream-Key-Tombstone: true`` with ``Stream-Key`` and an empty body deletes
the key: a zero-length append (it moves no offset and no reader that knows
nothing of keys sees it) that ``?key=`` answers as deleted until it is dropped,
``compaction_tombstone_delay_s`` after it was appended.

Where the keys live: each keyed append is journaled with an ``AppendKeyed``
record right after its ``Appended`` (one batch), and kept in the stream's
``pending_keys`` (journal and snapshot state) until the compactor has folded
it into the stream's **key index**: a cold object (``key_index_file``) holding
the newest append of every key below ``KeyIndexRef.covers_to``, owned by the
stream and released like a snapshot's object. So ``pending_keys`` holds only
the appends not compacted yet (the hot tail and the cold range since the last
pass), and a keyed read is the newest pending append of the key, else the
index's entry.

Invariant: every keyed append that is still readable and starts at or above
``covers_to`` is in ``pending_keys``; every key's newest append below it is in
the index (tombstones until their delay passed), and every older one is a hole.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.engine.streams.keyed import merge
from tiered.engine.streams.model import AppendRequest, ColdObject, KeyedAppend, KeyIndexRef, Stream
from tiered.engine.streams.records import Appended, AppendKeyed, KeyIndexCommitted
from tiered.engine.streams.release import unref

if TYPE_CHECKING:
    from tiered.engine.streams.state import StreamState

#: ``Stream-Compaction-Key: header``: the stream's keys are its appends' ``Stream-Key`` headers.
HEADER_MODE = "header"
#: The longest ``Stream-Key``, in bytes (printable ASCII; kept per append until compacted, then in the index).
MAX_KEY_BYTES = 256
KEY_HEADER = "Stream-Key"
_MAX = sys.maxsize
TOMBSTONE_HEADER = "Stream-Key-Tombstone"


def is_header_keyed(s: Stream) -> bool:
    return s.compaction_key == HEADER_MODE


def _invalid(message: str) -> TieredError:
    return TieredError(ErrorCode.STREAM_KEY_INVALID, message)


def check_key(key: str, what: str = KEY_HEADER) -> str:
    """A key as sent: 1 to ``MAX_KEY_BYTES`` printable ASCII characters (space included); STREAM_KEY_INVALID
    otherwise. ASCII only: a header's bytes and a query's percent-decoded text must name the same key,
    and HTTP stacks disagree on how they decode non-ASCII header bytes (a client encodes such keys itself)."""
    if not key:
        raise _invalid(f"{what} must not be empty")
    if len(key) > MAX_KEY_BYTES:
        raise _invalid(f"{what} is longer than its limit of {MAX_KEY_BYTES} bytes")
    if not (key.isascii() and key.isprintable()):
        raise _invalid(f"{what} must be printable ASCII (no control characters)")
    return key


def parse_key_headers(headers: Mapping[str, str]) -> tuple[str | None, bool]:
    """(``Stream-Key``, whether ``Stream-Key-Tombstone`` is ``true``) of an append; 400 when malformed.

    The tombstone header is ``true`` or ``false`` (any case), and ``true`` needs a key.
    """
    key = headers.get(KEY_HEADER)
    raw = headers.get(TOMBSTONE_HEADER)
    tombstone = False
    if raw is not None:
        if raw.lower() not in ("true", "false"):
            raise _invalid(f"{TOMBSTONE_HEADER} must be true or false")
        tombstone = raw.lower() == "true"
    if key is None:
        if tombstone:
            raise _invalid(f"{TOMBSTONE_HEADER}: true needs the {KEY_HEADER} it deletes")
        return None, False
    return check_key(key), tombstone


def check_create(mode: str | None, has_data: bool, is_fork: bool) -> None:
    """A stream keyed by header is created empty and is not a fork (its keys come only from appends)."""
    if mode != HEADER_MODE:
        return
    if has_data:
        raise _invalid(f"a stream keyed by header is created empty: append its messages with {KEY_HEADER}")
    if is_fork:
        raise _invalid("a fork cannot be keyed by header (its inherited messages carry no keys)")


def check_append(s: Stream, req: AppendRequest) -> None:
    """The key rules of an append, before the append rules (nothing is stored on a refusal).

    On a stream keyed by header every append with a body has a ``Stream-Key``; an empty one holds a key
    only as a tombstone (a close-only append holds none). Any other stream refuses ``Stream-Key``:
    a JSON stream keyed by a pointer takes its keys from its messages, and an unkeyed stream would
    ignore it, which would lose the key in silence.
    """
    if not is_header_keyed(s):
        if req.key is not None:
            why = (
                f"takes its keys from its messages ({s.compaction_key})"
                if s.compaction_key is not None
                else "is not keyed (create it with Stream-Compaction-Key: header)"
            )
            raise TieredError(ErrorCode.STREAM_KEY_NOT_ALLOWED, f"{KEY_HEADER} refused: this stream {why}")
        return
    if req.tombstone and req.data:
        raise _invalid(f"a tombstone ({TOMBSTONE_HEADER}: true) has an empty body")
    if req.key is None and req.data:
        raise TieredError(
            ErrorCode.STREAM_KEY_REQUIRED,
            f"every append to a stream keyed by header needs a {KEY_HEADER}",
        )
    if req.key is not None and not req.data and not req.tombstone:
        raise _invalid(
            f"an empty append carries a {KEY_HEADER} only as a tombstone ({TOMBSTONE_HEADER}: true)"
        )


def keyed_record(req: AppendRequest, appended: Appended) -> AppendKeyed | None:
    """The ``AppendKeyed`` journaled right after ``appended`` (None: the append carries no key)."""
    if req.key is None:
        return None
    return AppendKeyed(
        uid=appended.uid,
        start=appended.offset,
        end=appended.offset + len(appended.data),
        key=req.key,
        tombstone=req.tombstone,
        ts_ms=appended.ts_ms,
    )


# ------------------------------------------------------------------ apply


def apply_append_keyed(state: StreamState, record: AppendKeyed) -> None:
    s = state.streams.get(record.uid)
    if s is None or not is_header_keyed(s):
        return
    s.pending_keys.append(KeyedAppend(record.start, record.end, record.key, record.tombstone, record.ts_ms))


def apply_index_committed(state: StreamState, record: KeyIndexCommitted) -> None:
    """The stream's key index is the new object; what it covers leaves ``pending_keys``; the old one is released.

    A stream gone meanwhile: nobody owns the object, GC deletes it after the grace delay.
    """
    state.copies_in_flight.pop(record.key, None)
    s = state.streams.get(record.uid)
    obj = state.cold_objects.get(record.key)
    if obj is None:
        index = ChunkIndex(file_size=record.size, footer_length=0, row_groups=(), streams=())
        owner = s.bucket if s is not None else None
        obj = ColdObject(record.key, record.size, record.crc32c, record.ts_ms, index, owner_bucket=owner)
        state.cold_objects[record.key] = obj
    if s is None or s.soft_deleted or s.compaction_key is None:
        if obj.refs == 0 and obj.released_ms is None:
            obj.released_ms = record.ts_ms
        return
    old = s.key_index
    s.key_index = KeyIndexRef(
        record.key,
        record.size,
        record.crc32c,
        record.footer_length,
        record.covers_to,
        record.keys,
        record.ts_ms,
    )
    obj.refs += 1
    obj.released_ms = None
    # The pass folded the first ``folded`` pending appends; appends since then only came after them.
    del s.pending_keys[: record.folded]
    if old is not None:
        unref(state, old.key, record.ts_ms)


def drop(state: StreamState, s: Stream, ts_ms: int) -> None:
    """``s`` is removed or soft-deleted: nobody reads its key index, whose object is released.

    Only the records of ``footprint._RELEASING`` may end here: the quota totals
    (``tiered/engine/tenants/footprint.py``) follow an index by difference at ``KeyIndexCommitted`` and
    recompute after those records, so an index changed anywhere else would be miscounted."""
    if s.key_index is not None:
        unref(state, s.key_index.key, ts_ms)
        s.key_index = None
    s.pending_keys = []


def index_bytes(s: Stream) -> int:
    return s.key_index.size if s.key_index is not None else 0


# ------------------------------------------------------------------ reads


def in_hole(holes: Sequence[tuple[int, int]], offset: int) -> bool:
    """Whether ``offset`` is in one of ``holes`` (sorted, merged): a binary search, as a compacted stream
    has about one hole per superseded append."""
    i = bisect_right(holes, (offset, _MAX)) - 1
    return i >= 0 and holes[i][0] <= offset < holes[i][1]


def readable(s: Stream, entry: KeyedAppend) -> bool:
    """Whether a read still reaches ``entry``: not below the retained offset, not in a hole."""
    if entry.start < s.retained_from:
        return False
    return entry.start == entry.end or not in_hole(s.holes, entry.start)


def newest_pending(s: Stream, key: str) -> KeyedAppend | None:
    """The newest append of ``key`` not in the index yet (None: the index answers, if anything does)."""
    for entry in reversed(s.pending_keys):
        if entry.key == key:
            return entry
    return None


def not_found(entry: KeyedAppend | None) -> TieredError:
    """KEY_NOT_FOUND; for a key whose newest append is a tombstone, its offset in the context."""
    if entry is not None and entry.tombstone:
        return TieredError(
            ErrorCode.KEY_NOT_FOUND,
            "the key was deleted (its newest append is a tombstone)",
            key_offset=format_offset(entry.start),
        )
    return TieredError(ErrorCode.KEY_NOT_FOUND, "the stream holds no message of that key")


# ------------------------------------------------------------------ compaction


@dataclass(slots=True)
class IndexPlan:
    """What one compaction pass does to a header-keyed stream: the holes it adds and what the new index
    covers. ``removed``, ``superseded``, ``changed``, ``keys`` and ``tombstone_due_ms`` are final once the
    entries ``plan_index`` returns with it have all been taken (the new index streams out of the merge)."""

    covers_to: int
    folded: int  # how many of the stream's pending appends (from the first) the index now covers
    removed: list[tuple[int, int]]  # superseded appends, merged at the end (the pass's ``StreamCompacted``)
    superseded: int = 0  # how many appends with bytes the holes remove
    changed: bool = False  # False: the index as it is stays right (nothing to write)
    keys: int = 0  # entries in the new index
    tombstone_due_ms: int | None = None  # when the earliest tombstone kept may go (None: none kept)


def plan_index(
    s: Stream,
    old: Iterable[KeyedAppend],
    now_ms: int,
    tombstone_delay_ms: int,
) -> tuple[IndexPlan, Iterator[KeyedAppend]]:
    """Fold ``s``'s pending appends that are in the cold range into the index entries ``old`` (in key
    order, as the index object holds them): the plan, and the new index's entries in key order.

    Only appends wholly below ``s.cold_end`` are folded (compaction follows the flusher); an append
    superseded by a newer one of its key becomes a hole; a newest one that is a tombstone at least
    ``tombstone_delay_ms`` old leaves the index; appends no read reaches (retention passed them, or
    a hole of a pass whose index was not committed) are dropped. The old index is merged as it
    streams by, so a pass holds the folded appends and one block of the index, not every key.
    Nothing may change ``s`` until the entries are all taken (a shell takes them with no ``await``).
    """
    covered = s.key_index.covers_to if s.key_index is not None else 0
    batch = folded(s)
    plan = IndexPlan(max(batch[-1].end, covered) if batch else covered, len(batch), [])
    plan.changed = bool(batch)
    newest: dict[str, KeyedAppend] = {}
    for entry in batch:
        if not readable(s, entry):
            continue
        prev = newest.get(entry.key)
        if prev is not None and prev.end > prev.start:
            plan.removed.append((prev.start, prev.end))
        newest[entry.key] = entry
    return plan, _merged(s, plan, old, newest, now_ms, tombstone_delay_ms)


def _merged(
    s: Stream,
    plan: IndexPlan,
    old: Iterable[KeyedAppend],
    newest: dict[str, KeyedAppend],
    now_ms: int,
    delay_ms: int,
) -> Iterator[KeyedAppend]:
    """The old entries and the folded newest ones, merged by key (a folded one supersedes an old one)."""
    new_keys = sorted(newest)
    i = 0

    def keep(entry: KeyedAppend) -> bool:
        if not entry.tombstone:
            return True
        if entry.ts_ms + delay_ms <= now_ms:  # a tombstone past its delay leaves
            plan.changed = True
            if entry.end > entry.start:
                plan.removed.append((entry.start, entry.end))
            return False
        at = entry.ts_ms + delay_ms
        plan.tombstone_due_ms = at if plan.tombstone_due_ms is None else min(plan.tombstone_due_ms, at)
        return True

    for entry in old:
        while i < len(new_keys) and new_keys[i] < entry.key:
            if keep(folded_entry := newest[new_keys[i]]):
                plan.keys += 1
                yield folded_entry
            i += 1
        if i < len(new_keys) and new_keys[i] == entry.key:
            if readable(s, entry) and entry.end > entry.start:
                plan.removed.append((entry.start, entry.end))  # superseded by a folded append
            elif not readable(s, entry):
                plan.changed = True
            continue  # the folded one is yielded when the walk passes it
        if not readable(s, entry):
            plan.changed = True
            continue
        if keep(entry):
            plan.keys += 1
            yield entry
    for key in new_keys[i:]:
        if keep(entry := newest[key]):
            plan.keys += 1
            yield entry
    plan.superseded = len(plan.removed)
    plan.removed = merge(plan.removed)


def folded(s: Stream) -> Sequence[KeyedAppend]:
    """The pending appends a pass may fold now (wholly in the cold range)."""
    out: list[KeyedAppend] = []
    for entry in s.pending_keys:
        if entry.end > s.cold_end or entry.start > s.cold_end:
            break
        out.append(entry)
    return out
