"""Issue 21's combined property test: one keyed JSON stream against one model, over HTTP.

The pieces have their own property tests (``test_gc_compaction.py::test_reads_equal_the_model``
for keys, tombstones and compaction; ``test_snapshots.py::test_bootstrap_is_always_snapshot_plus_model_suffix``
for snapshots, retention and bootstrap; ``test_gc_erasure_property.py`` for erasure). This one
draws them in one sequence on one ``HttpHarness``, so their interplay is what is tested: a
``Stream-Compaction-Key: /id`` stream in the default bucket, and a plain JSON stream in a
second bucket whose appends share the cold objects (one flush packs both) until that bucket
is erased. Steps: append batches (keys 0-3 and ``"a"``, some tombstones), flush, a GC pass
(compaction and physical reclaim) at now + 0, 1 or 2 tombstone delays, a snapshot published
at the tail whose body is the model's state (newest message per key), sometimes with
``Stream-Snapshot-Retain: true``, retention (``retain_from``) to a message boundary, clean and
crash restarts, and the erasure of the second bucket (drawn, or at the end).

After every step: a read from the low-water mark answers exactly the model's messages at or
after the retained offset (newest per key once compacted, removed ones skipped); HEAD's water
marks, retained offset, snapshot offset and record count are the model's; the bootstrap read is
the snapshot's body plus the model's messages after it (no snapshot: an empty part and every
message), or 410 once retention passed the snapshot; the erased bucket's stream is 404.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.test_http_snapshots import parse_multipart
from tests.gc.test_gc_compaction import DELAY_MS, URL, Model, _append, _create, _flush_ms, _harness
from tests.gc.test_gc_compaction_reclaim import verify_errors
from tests.gc.test_gc_erasure_property import event
from tests.support.gc_support import HttpHarness
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(300)

JSON = "application/json"
OTHER_BUCKET = "other"
OTHER_URL = f"/v1/buckets/{OTHER_BUCKET}/stream/e"
ERASURE_DEADLINE_MS = 24 * 3600 * 1000  # the default ``erasure_deadline_s``


def size(message: Any) -> int:
    """A JSON message's stored bytes: compact JSON and a newline (what offsets count)."""
    return len(json.dumps(message, separators=(",", ":")).encode()) + 1


@dataclass
class World:
    """The keyed stream's ``Model`` (appends, flushes, compaction) plus what it does not know:
    offsets, the retained offset, the snapshot, and the second bucket's stream."""

    keyed: Model = field(default_factory=Model)
    retained: int = 0
    snapshot: tuple[int, bytes] | None = None
    other: list[Any] = field(default_factory=list)
    erased: bool = False
    shared_at_erasure: bool = False  # the erased bucket's rows sat in an object the keyed stream reads

    def starts(self) -> list[int]:
        out, pos = [], 0
        for m in self.keyed.messages:
            out.append(pos)
            pos += size(m)
        return out

    def tail(self) -> int:
        return sum(size(m) for m in self.keyed.messages)

    def visible_from(self, offset: int) -> list[Any]:
        """The messages a read serves from ``offset``: not removed, at or after it and the retained offset."""
        lo = max(offset, self.retained)
        return [
            m
            for i, (m, start) in enumerate(zip(self.keyed.messages, self.starts(), strict=True))
            if start >= lo and i not in self.keyed.gone
        ]

    def low_water_mark(self) -> int:
        for i, start in enumerate(self.starts()):
            if start >= self.retained and i not in self.keyed.gone:
                return start
        return self.tail()

    def state_body(self) -> bytes:
        """A snapshot's body: the newest message of every key that is not deleted (what a reader folds)."""
        state: dict[str, Any] = {}
        for m in self.keyed.messages:
            key = f"{type(m['id']).__name__}:{m['id']}"
            if m["v"] is None:
                state.pop(key, None)
            else:
                state[key] = m
        return json.dumps(state, sort_keys=True).encode()


message = st.tuples(st.one_of(st.integers(0, 3), st.just("a")), st.booleans())
append_op = st.tuples(
    st.just("append"), st.lists(st.lists(message, min_size=1, max_size=4), min_size=1, max_size=3)
)
flush_op = st.tuples(st.just("flush"), st.none())
gc_op = st.tuples(st.just("gc"), st.integers(0, 2))
# Appends, flushes and GC passes drawn more often than the rest: compaction needs all three.
ops = st.one_of(
    append_op,
    append_op,
    flush_op,
    flush_op,
    gc_op,
    gc_op,
    st.tuples(st.just("snapshot"), st.booleans()),
    st.tuples(st.just("retain"), st.integers(0, 1000)),
    st.tuples(st.just("restart"), st.booleans()),
    st.tuples(st.just("erase"), st.none()),
)


async def read_from(h: HttpHarness, path: str, offset: str) -> tuple[list[Any], str]:
    """Every message from ``offset``, following ``Stream-Next-Offset`` until up to date."""
    out: list[Any] = []
    for _ in range(1_000):
        status, headers, body = await h.http("GET", f"{path}?offset={offset}")
        assert status == 200, (status, offset, body)
        out.extend(json.loads(body) if body else [])
        offset = headers["Stream-Next-Offset"]
        if headers.get("Stream-Up-To-Date") == "true":
            return out, offset
    raise AssertionError("the read never caught up")


async def check(h: HttpHarness, w: World) -> None:
    tail = format_offset(w.tail())
    status, head, _ = await h.http("HEAD", URL)
    assert status == 200
    assert head["Stream-Next-Offset"] == head["Stream-High-Water-Mark"] == tail
    assert head["Stream-Retained-Offset"] == format_offset(w.retained)
    assert head["Stream-Low-Water-Mark"] == format_offset(w.low_water_mark())
    assert head["Stream-Record-Count"] == str(len(w.visible_from(0)))
    assert head.get("Stream-Snapshot-Offset") == (
        None if w.snapshot is None else format_offset(w.snapshot[0])
    )

    got, next_offset = await read_from(h, URL, head["Stream-Low-Water-Mark"])
    assert got == w.visible_from(0)
    assert next_offset == tail
    assert (await read_from(h, URL, "-1"))[0] == got  # from the start: the same

    status, headers, body = await h.http("GET", f"{URL}?bootstrap")
    if w.snapshot is not None and w.retained > w.snapshot[0]:  # retention passed the snapshot: no silent gap
        assert status == 410, (status, body)
        event("bootstrap: 410, retention passed the snapshot")
        assert headers["Stream-Snapshot-Offset"] == format_offset(w.snapshot[0])
        assert headers["Stream-Next-Offset"] == format_offset(w.retained)
    else:
        assert status == 200, (status, body)
        assert headers["Stream-Next-Offset"] == tail and headers["Stream-Up-To-Date"] == "true"
        (snap_headers, snap_body), (_, updates) = parse_multipart(headers, body)
        if w.snapshot is None:
            assert snap_headers["Stream-Snapshot-Offset"] == "-1" and snap_body == b""
            assert json.loads(updates or b"[]") == w.visible_from(0)
        else:
            offset, state = w.snapshot
            assert snap_headers["Stream-Snapshot-Offset"] == format_offset(offset)
            assert snap_body == state
            assert json.loads(updates or b"[]") == w.visible_from(offset)
            event("bootstrap: snapshot + suffix")

    if w.erased:
        assert (await h.http("HEAD", OTHER_URL))[0] == 404
    else:
        assert (await read_from(h, OTHER_URL, "-1"))[0] == w.other


async def gc_pass(h: HttpHarness, w: World, now: int) -> None:
    report = await h.gc(now)  # compaction, its reclaim rewrite, erasure rewrites
    assert report.errors == [] and report.integrity_errors == [], report
    w.keyed.compact(now)
    if report.messages_compacted:
        event("gc: compacted messages")
    if report.objects_rewritten:
        event("gc: erasure rewrote shared objects")
    if report.objects_compacted:
        event("gc: physical compaction rewrote objects")
    if any(m["v"] is None for i, m in enumerate(w.keyed.messages) if i in w.keyed.gone):
        event("gc: a tombstone was dropped (or superseded)")
    assert await verify_errors(h) == []
    again = await h.gc(now)
    assert again.objects_compacted == 0 and again.streams_compacted == 0, again


async def erase(h: HttpHarness, w: World) -> None:
    if h.cold_keys_of("default", "k") & h.cold_keys_of(OTHER_BUCKET, "e"):
        w.shared_at_erasure = True
        event("erase: the buckets share a cold object")
    status, _, body = await h.http("DELETE", f"/v1/buckets/{OTHER_BUCKET}")
    assert status == 204, (status, body)
    w.erased = True


async def step(h: HttpHarness, w: World, op: tuple[str, Any]) -> None:
    kind, arg = op
    if kind == "append":
        for batch in arg:
            msgs = [{"id": k, "v": None if dead else len(w.keyed.messages)} for k, dead in batch]
            assert await _append(h, msgs) == 204
            w.keyed.messages.extend(msgs)
            if not w.erased:  # the second bucket's stream: its rows land in the same objects
                other = [{"n": len(w.other)}]
                assert await _append(h, other, OTHER_URL) == 204
                w.other.extend(other)
    elif kind == "flush":
        h.clock.advance(1000)
        await h.flush()
        w.keyed.flushed_ms.extend([_flush_ms(h)] * (len(w.keyed.messages) - len(w.keyed.flushed_ms)))
    elif kind == "gc":
        await gc_pass(h, w, h.clock.advance(arg * DELAY_MS))
    elif kind == "snapshot":
        offset, state = w.tail(), w.state_body()
        headers = {"Content-Type": JSON}
        if arg:
            headers["Stream-Snapshot-Retain"] = "true"
        status, answer, body = await h.http(
            "PUT", f"{URL}?snapshot={format_offset(offset)}", body=state, headers=headers
        )
        assert status == 204, (status, body)
        w.snapshot = (offset, state)  # the same offset again has the same state: an idempotent repeat
        if arg:
            w.retained = max(w.retained, offset)
        assert answer["Stream-Snapshot-Offset"] == format_offset(offset)
        assert answer["Stream-Retained-Offset"] == format_offset(w.retained)
    elif kind == "retain":
        boundaries = [s for s in w.starts() if s >= w.retained] + [w.tail()]
        target = boundaries[arg % len(boundaries)]
        s = await h.s.streams.retain_from("default", "k", target)
        # A JSON stream retains from a record edge at or before the target, never splitting one.
        assert w.retained <= s.retained_from <= target
        assert s.retained_from in set(w.starts()) | {w.tail()}
        event("retain: to the target" if s.retained_from == target else "retain: to an earlier record edge")
        w.retained = s.retained_from
    elif kind == "restart":
        await h.restart(crash=arg)
    elif kind == "erase" and not w.erased:
        await erase(h, w)


async def run_sequence(h: HttpHarness, sequence: list[tuple[str, Any]]) -> World:
    w = World()
    await h.start()
    try:
        assert await _create(h) == 201
        assert (await h.http("PUT", f"/v1/buckets/{OTHER_BUCKET}"))[0] == 201
        status, _, _ = await h.http("PUT", OTHER_URL, headers={"Content-Type": JSON})
        assert status == 201
        await check(h, w)
        for op in sequence:
            await step(h, w, op)
            await check(h, w)
        if not w.erased:
            await erase(h, w)
            await check(h, w)
        # Past the erasure deadline and the grace: the rewrites ran, the keyed stream still reads the model.
        for delta in (0, ERASURE_DEADLINE_MS, 20_000):
            await gc_pass(h, w, h.clock.advance(delta))
            await check(h, w)
        await h.restart(crash=True)
        await check(h, w)
    finally:
        await h.stop()
    return w


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(sequence=st.lists(ops, min_size=3, max_size=16))
def test_keyed_stream_with_snapshots_retention_and_erasure_reads_the_model(
    tmp_path_factory: pytest.TempPathFactory, sequence: list[tuple[str, Any]]
) -> None:
    tmp_path = tmp_path_factory.mktemp("stream-model")
    asyncio.run(run_sequence(_harness(tmp_path), sequence))


def test_a_fixed_sequence_covering_every_step(tmp_path: Path) -> None:
    """Every kind of step at least once, in an order that makes each one matter (a compaction under a
    snapshot, retention to the snapshot, a tombstone falling due, erasure of a bucket sharing objects)."""
    sequence: list[tuple[str, Any]] = [
        ("append", [[(0, False), (1, False), ("a", False)], [(0, False), (1, True)]]),
        ("flush", None),
        ("snapshot", False),
        ("append", [[(2, False), (0, False)]]),
        ("flush", None),
        ("gc", 0),
        ("restart", True),
        ("snapshot", True),
        ("append", [[("a", True), (3, False)]]),
        ("retain", 1),
        ("flush", None),
        ("gc", 2),
        ("erase", None),
        ("gc", 1),
        ("restart", False),
        ("append", [[(3, False)]]),
        ("snapshot", False),
    ]
    w = asyncio.run(run_sequence(_harness(tmp_path), sequence))
    assert w.keyed.gone and w.snapshot is not None and w.retained > 0 and w.shared_at_erasure
