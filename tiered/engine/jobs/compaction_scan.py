"""Keyed compaction's decision, in the rewrite worker process: off the event loop and its GIL.

Which messages a compaction pass removes (``tiered.engine.streams.keyed``:
every message but the newest of its key, tombstones past their delay) is pure
Python over every message of a keyed stream's cold range: a million messages
took six seconds of the event loop, and appends beside it fell to two fifths
(docs/benchmarks.md). The GC task (``tiered.gc.compaction``) reads the live
pieces (I/O, on the loop) and hands their bytes here; splitting them into
messages, parsing each key and deciding run in the worker process the
cold-object rewrites use (``tiered.engine.jobs.rewrite``), so the loop keeps
serving appends. The decision is the same function either way (``decide``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.jobs.rewrite import in_worker
from tiered.engine.streams.keyed import message_key, parse_pointer, plan_removals, split_messages
from tiered.engine.streams.model import KeyedAppend

Message = tuple[int, int, bytes, int]
Piece = tuple[int, bytes, int]  # a live piece's first offset, its bytes, when its object was written


class Decision(NamedTuple):
    removed: list[tuple[int, int]]  # the ranges to remove (sorted, merged)
    gone: int  # how many messages they hold
    due: int | None  # when the earliest tombstone kept falls due
    newest: list[KeyedAppend]  # the newest message kept per key, in key order: the key index (``key_index``)
    covers_to: int  # the end of the last message scanned (0: none)


async def decide_in_worker(pointer: str, pieces: list[Piece], now_ms: int, delay_ms: int) -> Decision:
    """``decide`` in the worker process; a refusal (a message without a key) raised as the ``TieredError``
    it is, and ``BrokenProcessPool`` if the worker died (the next call starts another)."""
    outcome, value = await in_worker(decide, pointer, pieces, now_ms, delay_ms)
    if outcome != "ok":
        code, message = value
        raise TieredError(ErrorCode(code), message)
    decision: Decision = value
    return decision


def decide(pointer: str, pieces: list[Piece], now_ms: int, delay_ms: int) -> tuple[str, Any]:
    """("ok", ``Decision``) or ("refused", (code, message)): refusals cross the process boundary as
    values."""
    try:
        tokens = parse_pointer(pointer)
        messages: list[Message] = [
            (m0, m1, m, stored_ms)
            for start, data, stored_ms in pieces
            for m0, m1, m in split_messages(start, data)
        ]
        removed = plan_removals(tokens, messages, now_ms, delay_ms)
        gone = removed_flags(messages, removed)
        due = tombstone_due(tokens, messages, gone, delay_ms)
        newest = newest_per_key(tokens, messages, gone)
    except TieredError as exc:
        return "refused", (exc.code.value, exc.message)
    return "ok", Decision(removed, sum(gone), due, newest, messages[-1][1] if messages else 0)


def newest_per_key(tokens: tuple[str, ...], messages: list[Message], gone: list[bool]) -> list[KeyedAppend]:
    """The newest message kept of each key (a tombstone included), in key order: what the key index holds."""
    newest: dict[str, KeyedAppend] = {}
    for (start, end, message, stored_ms), removed in zip(messages, gone, strict=True):
        if not removed:
            key, tombstone = message_key(tokens, message)
            newest[key] = KeyedAppend(start, end, key, tombstone, stored_ms)
    return [newest[k] for k in sorted(newest)]


def removed_flags(messages: list[Message], removed: list[tuple[int, int]]) -> list[bool]:
    """Per message (in offset order), whether ``removed`` (sorted, merged) covers it: one merge walk."""
    out: list[bool] = []
    i = 0
    for start, *_ in messages:
        while i < len(removed) and removed[i][1] <= start:
            i += 1
        out.append(i < len(removed) and removed[i][0] <= start)
    return out


def tombstone_due(
    tokens: tuple[str, ...], messages: list[Message], gone: list[bool], delay_ms: int
) -> int | None:
    """When the earliest tombstone a pass kept may go (None: it kept none)."""
    due: int | None = None
    for (_, _, message, stored_ms), removed in zip(messages, gone, strict=True):
        if removed:
            continue
        if message_key(tokens, message)[1]:
            due = stored_ms + delay_ms if due is None else min(due, stored_ms + delay_ms)
    return due
