"""Keyed streams and their compaction, decided with no I/O: keys, tombstones, holes, water marks.

A JSON stream created with ``Stream-Compaction-Key: /id`` (an RFC 6901 JSON
pointer) names each message's key: the value at that pointer, a string or an
integer. A *tombstone* deletes its key: an object message holding the key
whose every other member is ``null`` (``{"id": 7, "value": null}``; a bare
``null`` at the pointer could not say which key it deletes). Once compacted (``tiered.gc.compaction``) the stream keeps only the
newest message per key, and a tombstone is itself dropped once it is older
than the configured delay, so a late reader still sees the delete for that long.

Offsets are stable: a removed message keeps its offsets and becomes a *hole*
(``Stream.holes``: sorted, merged ``[start, end)`` ranges). Reads skip the
holes (``live_pieces``); one ``StreamCompacted`` record carries every hole a
pass adds to a stream, so a reader sees a range compacted all at once or not
at all. The *low-water mark* is the first offset still readable (at or above
the retained offset, outside every hole); the *high-water mark* is the tail.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import msgspec

from tiered.core.errors import ErrorCode, TieredError

if TYPE_CHECKING:
    from tiered.engine.streams.model import Stream
    from tiered.engine.streams.records import StreamCompacted, StreamKeyed
    from tiered.engine.streams.state import StreamState

MAX_POINTER_LEN = 256
_decoder = msgspec.json.Decoder()


def parse_pointer(raw: str) -> tuple[str, ...]:
    """An RFC 6901 JSON pointer's reference tokens; BAD_REQUEST if it is not one that names a member."""
    if not raw.startswith("/") or len(raw) > MAX_POINTER_LEN:
        raise TieredError(
            ErrorCode.BAD_REQUEST,
            f"Stream-Compaction-Key must be a JSON pointer such as /id (at most {MAX_POINTER_LEN} characters)",
        )
    tokens = raw[1:].split("/")
    for t in tokens:
        if "~" in t.replace("~0", "").replace("~1", ""):
            raise TieredError(ErrorCode.BAD_REQUEST, f"Stream-Compaction-Key {raw!r}: a ~ must be ~0 or ~1")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens)


def check_key_config(pointer: str | None, json: bool) -> None:
    """A compaction key is a JSON pointer, on a JSON stream only."""
    if pointer is None:
        return
    parse_pointer(pointer)
    if not json:
        raise TieredError(
            ErrorCode.BAD_REQUEST,
            "Stream-Compaction-Key needs a JSON stream (Content-Type: application/json)",
        )


def message_key(tokens: Sequence[str], message: bytes) -> tuple[str, bool]:
    """(key, is a tombstone) of one stored message; the key as canonical text (``s:<string>``, ``i:<int>``).

    A tombstone is an object message that holds its key and whose every other
    member is ``null`` (at least one: ``{"id": 7, "value": null}``). Raises
    BAD_REQUEST when the pointer names nothing there or a value that is not a key.
    """
    root: object = _decoder.decode(message)
    value = root
    for t in tokens:
        if isinstance(value, dict) and t in value:
            value = value[t]
        elif isinstance(value, list) and t.isdigit() and int(t) < len(value):
            value = value[int(t)]
        else:
            raise TieredError(ErrorCode.BAD_REQUEST, "a message of a keyed stream has no value at its key")
    if isinstance(value, str):
        key = "s:" + value
    elif isinstance(value, int) and not isinstance(value, bool):
        key = "i:" + str(value)
    else:
        raise TieredError(ErrorCode.BAD_REQUEST, "a keyed stream's key must be a string or an integer")
    top = tokens[0] if tokens else ""
    tombstone = (
        isinstance(root, dict) and len(root) > 1 and all(v is None for k, v in root.items() if k != top)
    )
    return key, tombstone


def check_messages(pointer: str, stored: bytes) -> None:
    """Every stored message (one per line) has a key or is a tombstone; BAD_REQUEST otherwise."""
    tokens = parse_pointer(pointer)
    for _, _, message in split_messages(0, stored):
        message_key(tokens, message)


def split_messages(offset: int, stored: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, message) of each stored message in ``stored`` (which begins at ``offset``)."""
    pos = 0
    while pos < len(stored):
        nl = stored.find(b"\n", pos)
        end = len(stored) if nl < 0 else nl + 1
        yield offset + pos, offset + end, stored[pos:end]
        pos = end


# ------------------------------------------------------------------ compaction


def plan_removals(
    tokens: Sequence[str],
    messages: Iterable[tuple[int, int, bytes, int]],
    now_ms: int,
    tombstone_delay_ms: int,
) -> list[tuple[int, int]]:
    """The message ranges to remove, merged: every message but the newest of its key, and a newest
    one that is a tombstone stored at least ``tombstone_delay_ms`` ago.

    ``messages``: (start, end, bytes, stored_ms) of the live messages of a range, in offset order.
    """
    newest: dict[str, tuple[int, int, bool, int]] = {}
    removed: list[tuple[int, int]] = []
    for start, end, message, stored_ms in messages:
        key, tombstone = message_key(tokens, message)
        older = newest.get(key)
        if older is not None:
            removed.append((older[0], older[1]))
        newest[key] = (start, end, tombstone, stored_ms)
    for start, end, tombstone, stored_ms in newest.values():
        if tombstone and stored_ms + tombstone_delay_ms <= now_ms:
            removed.append((start, end))
    return merge(removed)


def merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching ranges joined, empty ones dropped."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def apply_keyed(state: StreamState, record: StreamKeyed) -> None:
    s = state.streams.get(record.uid)
    if s is not None:
        s.compaction_key = record.compaction_key


def check_recreate(existing: Stream, pointer: str | None) -> None:
    """A create matching an existing stream must ask for its compaction key too: 409 otherwise."""
    if existing.compaction_key != pointer:
        raise TieredError(
            ErrorCode.STREAM_EXISTS, "the stream exists with another Stream-Compaction-Key (or none)"
        )


def apply_compacted(state: StreamState, record: StreamCompacted) -> None:
    """Add a pass's holes to its stream (a stream gone meanwhile: nothing to do). Order-independent
    and idempotent, so a release racing the compaction (retention, a delete, an erasure) stays as it is."""
    s = state.streams.get(record.uid)
    if s is None:
        return
    s.holes = tuple(merge([*s.holes, *record.removed]))


# ------------------------------------------------------------------ reads


def live_pieces(holes: Sequence[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` without the holes: the ranges a read serves, in order."""
    out: list[tuple[int, int]] = []
    pos = start
    for a, b in holes:
        if b <= pos:
            continue
        if a >= end:
            break
        if a > pos:
            out.append((pos, a))
        pos = max(pos, b)
    if pos < end:
        out.append((pos, end))
    return out


def skip_hole(holes: Sequence[tuple[int, int]], offset: int) -> int:
    """``offset``, or the end of the hole it falls in."""
    for a, b in holes:
        if a <= offset < b:
            return b
        if a > offset:
            break
    return offset


def within_hole(holes: Iterable[tuple[int, int]], start: int, end: int) -> bool:
    """Whether ``[start, end)`` lies wholly inside one hole (holes are merged, so one is enough)."""
    return any(a <= start and end <= b for a, b in holes)


def continues(holes: Iterable[tuple[int, int]], pos: int, start: int) -> bool:
    """Whether stored rows that reached ``pos`` go on at ``start`` (a row's start, or the range's end):
    right there, or past a gap wholly inside one hole (rows a compaction rewrite dropped).

    The tiling check of a rewrite's rows (``rewrite_plan.select_rows``) and of ``tiered verify``.
    """
    return start == pos or (start > pos and within_hole(holes, pos, start))


def hole_read(state: StreamState, s: Stream, start: int, end: int) -> tuple[int, int] | None:
    """The first hole ``[start, end)`` overlaps: of ``s``, or of a fork source it reads below its fork point.

    A read never asks for removed bytes (it reads ``live_pieces``): one that does is refused before
    any byte is fetched, since a rewritten cold object no longer holds them (and reading them
    there would look like damage).
    """
    cur: Stream | None = s
    hi = end
    while cur is not None and start < hi:
        for a, b in cur.holes:
            if a >= hi:
                break
            if b > start:
                return a, b
        if cur.fork_source is None:
            return None
        hi = min(hi, cur.fork_offset)
        cur = state.streams.get(cur.fork_source)
    return None


def low_water_mark(s: Stream, tail: int) -> int:
    """The first offset still readable: the retained offset, past any hole it falls in (at most the tail)."""
    return min(tail, skip_hole(s.holes, s.retained_from))


def removed_bytes(s: Stream) -> int:
    return sum(b - max(a, s.retained_from) for a, b in s.holes if b > s.retained_from)


ReadBytes = Callable[[int, int], Awaitable[bytes]]


async def read_live_chunk(
    read: ReadBytes, holes: Sequence[tuple[int, int]], offset: int, tail: int, chunk_bytes: int
) -> tuple[bytes, int, bool]:
    """(stored messages, next offset, up to date) of a read at ``offset`` of a stream with holes."""
    offset = min(tail, skip_hole(holes, offset))
    end = min(tail, offset + chunk_bytes)
    pieces = live_pieces(holes, offset, end)
    parts = [await read(a, b) for a, b in pieces]
    if end < tail and pieces and pieces[-1][1] == end:
        a, _ = pieces[-1]
        last = parts[-1]
        cut = last.rfind(b"\n") + 1
        if cut == 0 and len(parts) > 1:  # the last message does not fit: the next read starts with it
            parts.pop()
            end = a
        elif cut == 0:  # one message larger than a chunk: send it whole (it cannot span a hole)
            stop = min(tail, next((h for h, _ in holes if h > a), tail))
            rest = await read(end, stop)
            parts[-1] = last + rest[: rest.find(b"\n") + 1]
            end = a + len(parts[-1])
        else:
            parts[-1] = last[:cut]
            end = a + cut
    end = min(tail, skip_hole(holes, end))
    return b"".join(parts), end, end >= tail


async def after_messages(
    read: ReadBytes, holes: Sequence[tuple[int, int]], offset: int, tail: int, count: int
) -> int | None:
    """The offset ``count`` live messages after ``offset`` (None: fewer remain before ``tail``).

    Removed messages (in holes) are not counted and not read: a fork's ``Stream-Fork-Sub-Offset``
    counts the messages a reader of the source sees. A message never spans a hole.
    """
    for a, b in live_pieces(holes, offset, tail):
        data = await read(a, b)
        pos = 0
        while count:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            pos = nl + 1
            count -= 1
        if count == 0:
            return a + pos
    return None if count else offset


# ------------------------------------------------------------------ keyed reads

KEY_SCAN_CHUNK = 1 << 20


def parse_key_query(raw: str) -> str:
    """``?key=`` as the key's JSON text (``"abc"`` or ``7``) -> its canonical key; BAD_REQUEST otherwise."""
    try:
        value = _decoder.decode(raw.encode())
    except msgspec.DecodeError:
        raise TieredError(
            ErrorCode.BAD_REQUEST, 'key must be the key as JSON: a string ("abc") or an integer (7)'
        ) from None
    if isinstance(value, str):
        return "s:" + value
    if isinstance(value, int) and not isinstance(value, bool):
        return "i:" + str(value)
    raise TieredError(ErrorCode.BAD_REQUEST, "a key is a string or an integer")
