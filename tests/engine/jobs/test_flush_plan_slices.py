"""The flush pass's loop-side shortcuts give exactly what the record-by-record walks gave.

``_chunks_to_copy`` (which records a pass copies) and ``integrity.note_cold`` (the digest of what became
cold) take the usual case as array slices and bisection; the walks below are their specification, as
they were written before the shortcuts. Random streams cover what sends them the long way: a cold end
inside a record (retention released its front), records wholly cold, gaps (large bodies stored by
reference), budgets that cut a run, ends that cut a run.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

from tiered.core.record_digest import MASK
from tiered.engine.jobs.flush_plan import _chunks_to_copy
from tiered.engine.streams import integrity
from tiered.engine.streams.model import HotChunks


def walk_chunks(s: Any, end: int, budget: int) -> tuple[list[tuple[int, int, int, int, int]], int]:
    from bisect import bisect_right

    c = s.chunks
    i = max(0, bisect_right(c.starts, s.cold_end) - 1)
    chunks: list[tuple[int, int, int, int, int]] = []
    size = 0
    while i < len(c) and c.starts[i] < end and size < budget:
        start, length, pos = c.starts[i], c.lens[i], c.poss[i]
        if start < s.cold_end < start + length:
            pos += s.cold_end - start
            length -= s.cold_end - start
            start = s.cold_end
        if chunks and start != chunks[-1][0] + chunks[-1][1]:
            break
        if start >= s.cold_end:
            chunks.append((start, length, c.segs[i], pos, c.times[i]))
            size += length
        i += 1
    return chunks, size


def walk_note_cold(
    hot: list[tuple[int, int, int]], start: int, end: int
) -> tuple[tuple[int, int, int], list[Any]]:
    i = 0
    while i < len(hot) and hot[i][0] < start:
        i += 1
    j = i
    digest = size = 0
    while j < len(hot) and hot[j][1] <= end:
        digest += hot[j][2]
        size += hot[j][1] - hot[j][0]
        j += 1
    return (digest & MASK, j - i, size), hot[:i] + hot[j:]


def random_records(rng: random.Random) -> list[tuple[int, int]]:
    """(start, length) of a stream's hot records, in offset order, with the odd gap."""
    out = []
    at = rng.randrange(0, 50)
    for _ in range(rng.randrange(0, 40)):
        if rng.random() < 0.08:
            at += rng.randrange(1, 500)  # a large body stored by reference: not in the hot chunks
        length = rng.randrange(1, 200)
        out.append((at, length))
        at += length
    return out


def test_chunks_to_copy_matches_the_record_walk() -> None:
    rng = random.Random(20261204)
    fast_taken = 0
    for _ in range(4000):
        records = random_records(rng)
        chunks = HotChunks()
        for n, (start, length) in enumerate(records):
            chunks.add(start, length, n // 7, 1000 * n, 5_000 + n)
        tail = records[-1][0] + records[-1][1] if records else 10
        lo = records[0][0] if records else 0
        cold_end = rng.choice(
            [lo, *(s for s, _ in records), *(s + rng.randrange(0, ln) for s, ln in records)]
        )
        end = rng.choice([tail, tail, rng.randrange(cold_end, tail + 2)])
        # Budgets that end exactly on a record's end, or a byte either side, as well as any.
        ends_from = [st + ln - cold_end for st, ln in records if st >= cold_end] or [1]
        edge = rng.choice(ends_from) + rng.choice([-1, 0, 0, 1])
        budget = rng.choice([1 << 30, rng.randrange(1, 3000), max(edge, 1)])
        s = cast(Any, SimpleNamespace(chunks=chunks, cold_end=cold_end))
        want = walk_chunks(s, end, budget)
        got = _chunks_to_copy(s, end, budget)
        assert got == want, (records, cold_end, end, budget)
        fast_taken += bool(got[0]) and got[0][0][0] == cold_end
    assert fast_taken > 1000  # the cases above reach the slices, not only the walk


def test_note_cold_matches_the_record_walk() -> None:
    rng = random.Random(4)
    for _ in range(3000):
        records = random_records(rng)
        hot = [(start, start + length, rng.randrange(0, 1 << 64)) for start, length in records]
        if not hot:
            continue
        a = rng.randrange(len(hot))
        b = rng.randrange(a, len(hot))
        start = rng.choice([hot[a][0], hot[a][0] + rng.randrange(0, hot[a][1] - hot[a][0])])
        end = rng.choice([hot[b][1], hot[b][1] + rng.randrange(0, 300), hot[b][0]])
        want_entry, want_left = walk_note_cold(list(hot), start, end)
        integ = SimpleNamespace(hot=list(hot), cold={})
        integrity.note_cold(cast(Any, SimpleNamespace(integrity=integ)), start, end)
        assert integ.cold == {start: want_entry}
        assert integ.hot == want_left


def test_the_flushers_thread_lets_the_loop_in_every_few_hundred_records(monkeypatch: Any) -> None:
    from tiered.engine.jobs import flusher

    sleeps: list[float] = []
    monkeypatch.setattr(flusher.time, "sleep", sleeps.append)
    pause = flusher._Yielder()
    for _ in range(3 * flusher.YIELD_EVERY_RECORDS + 5):
        pause.tick()
    assert sleeps == [0, 0, 0]
