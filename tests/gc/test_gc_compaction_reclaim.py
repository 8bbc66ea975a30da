"""Physical keyed compaction (issue 21): cold objects rewritten without the records compaction removed.

* A keyed stream sharing a cold object with another stream: after a GC pass the object is
  rewritten without the keyed stream's removed records (one message per append: each removed
  message is a whole record), the other stream's rows byte-exact; a record that still holds a
  live message is kept whole. The old object goes after the grace; pyarrow finds no removed
  message in what is left; reads are the same before, after and across restarts; the
  integrity digests follow storage (the dropped records move from live to released, the total
  stays) and ``tiered verify``'s checks (rows tile the ranges outside holes, index, digests)
  pass.
* An object whose every range lies in holes is released without a copy (``ColdHolesReleased``).
* A fork of a physically compacted stream inherits its holes below the fork point and reads.
* Idempotent: a second pass rewrites nothing; an object whose hole bytes sit in records still
  partly live is read once, then left alone.
* A crash between every two steps of the rewrite (compaction journaled / intent journaled /
  uploaded / committed / old object's delete journaled / deleted), on the local store and on
  moto: nothing acknowledged lost, nothing served twice, no object left after reconciliation.
* A release racing the rewrite (retention, the stream's delete, its bucket's erasure) between
  the upload and the commit wins; both objects go.
* ``tiered serve`` SIGKILLed right after the rewrite or while the GC request runs: the stream
  reads compacted or not at all (never a part), then GC converges to one object; ``tiered
  verify`` (the CLI) passes.
* A raw read across removed bytes is refused before any fetch (``OFFSET_GONE``, the next offset
  past the hole), never served short nor counted as damage; a fork's ``Stream-Fork-Sub-Offset``
  counts the live messages only, before and after the rewrite; a snapshot at a hole's end is at
  a boundary, one inside a hole is refused.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.gc.test_gc_erasure_rewrite import StepStore
from tests.gc.test_gc_faults import SimulatedCrash, die_here
from tests.support.gc_support import Harness, VirtualClock, journal_records, make_config
from tests.support.s3_backends import backend_for
from tiered.cli import verify_digests
from tiered.cli.verify import verify_cold
from tiered.cold.objects.keys import is_key_index_key
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.engine.streams import integrity
from tiered.engine.streams.model import CreateRequest, ForkRequest
from tiered.engine.streams.records import (
    ColdCopyAborted,
    ColdHolesReleased,
    ColdRewriteCommitted,
    StreamCompacted,
)

pytestmark = pytest.mark.timeout(180)

JSON = "application/json"
GRACE_S = 10.0
GRACE_MS = int(GRACE_S * 1000)
OTHER = [b"other-" + bytes(range(256)) * 3, b"other-second", b"\x00" * 700]


def _config(tmp_path: Path, **extra: Any) -> Config:
    return make_config(tmp_path / "data", gc_grace_s=GRACE_S, **extra)


def line(m: dict[str, Any]) -> bytes:
    return json.dumps(m, separators=(",", ":")).encode() + b"\n"


async def create_keyed(h: Harness, bucket: str, path: str) -> None:
    created, _ = await h.s.streams.create(
        bucket, path, CreateRequest(JSON, None, None, None, False, b"", None, compaction_key="/id")
    )
    assert created


async def append(h: Harness, bucket: str, path: str, *messages: dict[str, Any]) -> None:
    await h.append(bucket, path, json.dumps(list(messages)).encode(), JSON)


async def read_messages(h: Harness, bucket: str, path: str) -> list[Any]:
    """The stream's live messages, read as a client reads them (holes skipped)."""
    from tiered.engine.streams.keyed import read_live_chunk

    streams = h.s.streams
    s = streams.lookup(bucket, path)
    tail = streams.view(s).tail
    offset, out = s.retained_from, []
    for _ in range(1000):
        if offset >= tail:
            return out
        data, offset, _ = await read_live_chunk(
            lambda a, b: streams.read(s, a, b), s.holes, offset, tail, 1 << 16
        )
        out.extend(json.loads(m) for m in data.splitlines())
    raise AssertionError("the read never caught up")


async def verify_errors(h: Harness) -> list[str]:
    """``tiered verify``'s cold checks and digests, in process, over the engine's own state."""
    assert h.s.store is not None
    tally = verify_digests.DigestTally()
    report = await verify_cold(h.s.state, h.s.store, None, tally)
    for s in h.s.state.streams.values():
        verify_digests.check_stream(s, h.config.data_path / "hot", tally)
    return report.errors + tally.errors


async def stored(h: Harness) -> dict[str, bytes]:
    store = h.s.store
    assert store is not None
    return {info.key: await store.get(info.key) async for info in store.list("data/")}


async def converge(h: Harness, now: int) -> None:
    """GC passes until nothing is left: compaction and its rewrite, deletes past the grace, reconciliation."""
    for at in (now, now + GRACE_MS + 1, now + 2 * GRACE_MS + 2, now + 3 * GRACE_MS + 3):
        report = await h.gc(at, reconcile=True)
        assert report.errors == [] and report.integrity_errors == [], report


def data_objects(h: Harness) -> set[str]:
    """The cold data objects (the pass also writes the stream's key index, ``gc/key_index.py``)."""
    return {k for k in h.s.state.cold_objects if not is_key_index_key(k)}


async def no_leak(h: Harness) -> None:
    state = h.s.state
    assert set(await stored(h)) == set(state.cold_objects)
    assert all(obj.refs > 0 for obj in state.cold_objects.values())
    assert state.copies_in_flight == {}


def keyed_rows(raw: bytes, path: str = "k") -> list[bytes]:
    table = pq.read_table(pa.BufferReader(raw))
    return [
        p
        for s, p in zip(table.column("stream").to_pylist(), table.column("payload").to_pylist(), strict=True)
        if s == path
    ]


# Three objects: A holds only records compaction removes; B (shared with "other") holds a removed
# record and a live one; C holds the newest of key 0.
A_MSGS = [{"id": 0, "v": "a0"}]
B_MSGS = [[{"id": 0, "v": "b1"}], [{"id": 1, "v": "b2"}]]
C_MSGS = [{"id": 0, "v": "c3"}]
LIVE = [{"id": 1, "v": "b2"}, {"id": 0, "v": "c3"}]


async def three_objects(h: Harness, bucket: str = "default") -> None:
    await create_keyed(h, bucket, "k")
    await append(h, bucket, "k", *A_MSGS)
    assert await h.flush() == 1
    await h.create(bucket, "other", OTHER[0])
    for msgs in B_MSGS:
        await append(h, bucket, "k", *msgs)
    for data in OTHER[1:]:
        await h.append(bucket, "other", data)
    assert await h.flush() == 1
    await append(h, bucket, "k", *C_MSGS)
    assert await h.flush() == 1
    assert len(h.s.state.cold_objects) == 3


async def reads_ok(h: Harness, bucket: str = "default") -> None:
    assert await read_messages(h, bucket, "k") == LIVE
    assert await h.read(bucket, "other") == b"".join(OTHER)


# --------------------------------------------------------------------------- the rewrite


def test_compaction_rewrites_objects_without_removed_records(tmp_path: Path) -> None:
    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)

    async def body() -> None:
        await h.start()
        await three_objects(h)
        before = data_objects(h)
        s = h.s.streams.lookup("default", "k")
        digest_before = integrity.view(s)
        assert digest_before is not None and digest_before.live_records == 4
        report = await h.gc(clock.ms)
        assert report.errors == [] and report.integrity_errors == [], report
        assert report.streams_compacted == 1 and report.messages_compacted == 2
        assert report.objects_compacted == 2  # A released, B rewritten; C holds no hole
        assert report.compaction_bytes_reclaimed > 0
        await reads_ok(h)
        [new] = data_objects(h) - before
        # The stream's digests follow storage: two records released, the total as appended.
        after = integrity.view(h.s.streams.lookup("default", "k"))
        assert after is not None
        assert (after.live_records, after.released_records) == (2, 2)
        assert after.total == digest_before.total and after.bytes == digest_before.bytes
        assert await verify_errors(h) == []
        # Old objects go after the grace; the new one holds no removed message, "other" byte-exact.
        await converge(h, clock.ms + 1)
        await no_leak(h)
        objects = {k: raw for k, raw in (await stored(h)).items() if not is_key_index_key(k)}
        assert new in objects and len(objects) == 2
        assert keyed_rows(objects[new]) == [line(m) for m in B_MSGS[1]]
        assert b"".join(keyed_rows(objects[new], "other")) == b"".join(OTHER)
        for raw in objects.values():
            for m in A_MSGS + B_MSGS[0]:
                assert line(m) not in raw
        for crash in (True, False):
            await h.restart(crash=crash)
            await reads_ok(h)
            assert await verify_errors(h) == []
        # Idempotent: nothing left to reclaim.
        again = await h.gc(clock.ms + 4 * GRACE_MS)
        assert again.objects_compacted == 0 and again.streams_compacted == 0 and again.errors == []
        await h.stop()

    asyncio.run(body())


def test_an_object_released_without_a_copy_is_not_paced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pace (``rewrite_bytes_per_s``) counts bytes read plus written: an object whose every
    range lies in holes (A) is released with no read and no upload, so it adds nothing to pace;
    the rewritten one (B) adds what it read and wrote."""
    import tiered.gc.reclaim as reclaim

    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)
    paced: list[int] = []
    inner_pace = reclaim.pace

    async def pace(ctx: Any, moved: int, started: float) -> None:
        paced.append(moved)
        await inner_pace(ctx, moved, started)

    monkeypatch.setattr(reclaim, "pace", pace)

    async def body() -> None:
        await h.start()
        await three_objects(h)
        sizes = {k: o.size for k, o in h.s.state.cold_objects.items()}
        [b_key] = h.cold_keys_of("default", "other")  # B: shared with "other", rewritten
        report = await h.gc(clock.ms)
        assert report.objects_compacted == 2 and report.errors == [], report
        [new] = data_objects(h) - set(sizes)
        assert sorted(paced) == [0, sizes[b_key] + h.s.state.cold_objects[new].size], (paced, sizes)
        await h.stop()

    asyncio.run(body())


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_stream_forked_while_the_pass_reads_it_is_skipped_alike_dry_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dry_run: bool
) -> None:
    """A fork created while compaction decides (in the worker) makes the pass leave the stream
    alone; a dry run says the same (no ``would_compact``), and both leave a trace
    (``compaction_skipped``, a log line) instead of skipping in silence."""
    import tiered.gc.compaction as compaction

    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)
    inner = compaction.decide_in_worker

    async def decide_then_fork(*args: Any) -> Any:
        decision = await inner(*args)
        src = h.s.streams.lookup("default", "k")
        fork = ForkRequest(source_uid=src.uid, offset=src.tail, spec=f"default/k@{src.tail}")
        created, _ = await h.s.streams.create(
            "default", "f", CreateRequest(JSON, None, None, None, False, b"", fork)
        )
        assert created
        return decision

    async def body() -> None:
        await h.start()
        await three_objects(h)
        monkeypatch.setattr(compaction, "decide_in_worker", decide_then_fork)
        report = await h.s.gc.run_pass(dry_run=dry_run, now_ms=clock.ms)
        assert report.would_compact == [] and report.streams_compacted == 0, report
        assert report.messages_compacted == 0 and report.errors == [], report
        assert [(e["path"], e["reason"].split()[0]) for e in report.compaction_skipped] == [("k", "forked")]
        assert h.s.streams.lookup("default", "k").holes == ()
        await h.stop()

    asyncio.run(body())


def test_records_partly_live_stay_whole_and_are_read_once(tmp_path: Path) -> None:
    """An append of two messages, one removed later: its record stays whole (it still holds a
    live message); the rewrite finds nothing to drop and the object is not read again."""
    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)

    async def body() -> None:
        await h.start()
        await create_keyed(h, "default", "k")
        await append(h, "default", "k", {"id": 0, "v": 1}, {"id": 1, "v": 2})
        await append(h, "default", "k", {"id": 0, "v": 3})
        assert await h.flush() == 1
        [key] = h.s.state.cold_objects
        gets: list[str] = []
        store = h.s.gc.ctx.store
        inner_get = store.get

        async def get(k: str, **kwargs: Any) -> bytes:
            if kwargs.get("start") is None:  # a whole object (a rewrite's), not a ranged read
                gets.append(k)
            return await inner_get(k, **kwargs)

        store.get = get  # type: ignore[method-assign]
        report = await h.gc(clock.ms)
        assert report.streams_compacted == 1 and report.objects_compacted == 0 and report.errors == []
        assert gets == [key]  # read once for the rewrite that found nothing to drop
        gets.clear()
        report = await h.gc(clock.ms + 1)
        assert report.objects_compacted == 0 and gets == []
        assert data_objects(h) == {key}
        assert await read_messages(h, "default", "k") == [{"id": 1, "v": 2}, {"id": 0, "v": 3}]
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(body())


def test_a_fork_of_a_compacted_stream_inherits_its_holes(tmp_path: Path) -> None:
    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)

    async def body() -> None:
        await h.start()
        await three_objects(h)
        await converge(h, clock.ms)
        src = h.s.streams.lookup("default", "k")
        created, fork = await h.s.streams.create(
            "default",
            "f",
            CreateRequest(
                JSON,
                None,
                None,
                None,
                False,
                b"",
                __import__("tiered.engine.streams.model", fromlist=["ForkRequest"]).ForkRequest(
                    source_uid=src.uid, offset=src.tail, spec=f"default/k@{src.tail}"
                ),
            ),
        )
        assert created and fork.holes == src.holes
        await append(h, "default", "f", {"id": 9, "v": "fork"})
        assert await read_messages(h, "default", "f") == [*LIVE, {"id": 9, "v": "fork"}]
        await h.restart(crash=True)
        assert await read_messages(h, "default", "f") == [*LIVE, {"id": 9, "v": "fork"}]
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(body())


# --------------------------------------------------------------------------- crashes and races


@pytest.fixture(params=["local", "moto"])
def store_config(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Config]:
    """The node's config on the local store, or on moto's S3 server (real HTTP) under a fresh prefix."""
    if request.param == "local":
        yield _config(tmp_path)
        return
    with backend_for(request.param, request, monkeypatch) as backend:
        yield make_config(tmp_path / "data", gc_grace_s=GRACE_S, **backend.config())


CRASH_POINTS = ["compacted", "intent-journaled", "uploaded", "committed", "delete-journaled", "deleted"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_between_any_two_steps_loses_nothing_and_leaks_nothing(
    store_config: Config, point: str
) -> None:
    config = store_config
    clock = VirtualClock()
    h = Harness(config, StepStore, clock=clock)

    def die() -> None:
        die_here(h.s, point)

    async def crash_now() -> None:
        die()

    async def body() -> None:
        await h.start()
        await three_objects(h)
        first = set(h.s.state.cold_objects)
        store = h.s.gc.ctx.store
        assert isinstance(store, StepStore)
        store.hooked = lambda key: (
            not is_key_index_key(key)
        )  # the crash is the rewrite's, not the key index's
        if point == "compacted":  # the holes journaled, the process dies before any rewrite
            committer = h.s.gc.ctx.committer
            inner_commit = committer.commit

            async def commit(records: Any) -> None:
                await inner_commit(records)
                if any(isinstance(r, StreamCompacted) for r in records):
                    die()

            committer.commit = commit  # type: ignore[method-assign]
        elif point == "intent-journaled":
            store.before_put = crash_now
        elif point == "uploaded":
            store.after_put = crash_now
        if point in ("compacted", "intent-journaled", "uploaded"):
            with pytest.raises(SimulatedCrash):
                await h.gc(clock.ms)
        else:
            report = await h.gc(clock.ms)
            assert report.objects_compacted == 2 and report.errors == []
            if point != "committed":
                store.before_delete = crash_now
                if point == "deleted":

                    async def delete_then_die() -> None:
                        gone = [
                            k
                            for k in first
                            if h.s.state.cold_objects.get(k) and h.s.state.cold_objects[k].refs == 0
                        ]
                        await store.inner.delete_many(gone)
                        die()

                    store.before_delete = delete_then_die
                with pytest.raises(SimulatedCrash):
                    await h.gc(clock.ms + GRACE_MS + 1)
        await h.restart(crash=True)
        await reads_ok(h)
        clock.advance(1)
        await converge(h, clock.ms)
        await reads_ok(h)
        await no_leak(h)
        assert len(data_objects(h)) == 2  # the rewritten B and C
        assert await verify_errors(h) == []
        for raw in (await stored(h)).values():
            for m in A_MSGS + B_MSGS[0]:
                assert line(m) not in raw
        await h.restart(crash=True)
        await reads_ok(h)
        await h.stop()

    asyncio.run(body())
    records = journal_records(config.data_path)
    assert len([r for r in records if isinstance(r, ColdRewriteCommitted)]) == 1
    assert len([r for r in records if isinstance(r, ColdHolesReleased)]) == 1
    if point in ("intent-journaled", "uploaded"):
        assert len([r for r in records if isinstance(r, ColdCopyAborted)]) == 1


@pytest.mark.parametrize("release", ["retention", "delete", "erasure"])
def test_a_release_racing_the_rewrite_wins_and_both_objects_go(store_config: Config, release: str) -> None:
    """The release lands between the rewrite's upload and its commit."""
    config = store_config
    clock = VirtualClock()
    h = Harness(config, StepStore, clock=clock)
    bucket = "keyed" if release == "erasure" else "default"

    async def body() -> None:
        await h.start()
        if bucket != "default":
            await h.bucket(bucket)
        await three_objects(h, bucket)
        store = h.s.gc.ctx.store
        assert isinstance(store, StepStore)

        async def release_now() -> None:
            if release == "retention":
                s = h.s.streams.lookup(bucket, "k")
                await h.s.streams.retain_from(bucket, "k", s.tail)
            elif release == "delete":
                await h.s.streams.delete(bucket, "k")
            else:
                await h.s.streams.erase_bucket(bucket)

        store.after_put = release_now
        report = await h.gc(clock.ms)
        assert report.errors == [] and report.integrity_errors == [], report
        await converge(h, clock.ms + 1)
        await no_leak(h)
        if release == "retention":
            assert await read_messages(h, bucket, "k") == []
        if release != "erasure":
            assert await h.read(bucket, "other") == b"".join(OTHER)
        assert await verify_errors(h) == []
        for crash in (True, False):
            await h.restart(crash=crash)
            await no_leak(h)
            if release != "erasure":
                assert await h.read(bucket, "other") == b"".join(OTHER)
        await h.stop()

    asyncio.run(body())


def test_reads_of_removed_bytes_are_refused_and_snapshots_at_hole_ends_accepted(tmp_path: Path) -> None:
    """Bytes compaction removed are never served short nor read: a raw read across them is
    OFFSET_GONE before any fetch, not an integrity error (no route asks: reads skip holes). A snapshot at a hole's end is at a message
    boundary (the byte before it is gone); one inside a hole is refused."""
    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)

    async def body() -> None:
        await h.start()
        await three_objects(h)
        await converge(h, clock.ms)
        s = h.s.streams.lookup("default", "k")
        [(hole_start, hole_end)] = s.holes  # a0 and b1: adjacent, merged
        store = h.s.store
        assert store is not None
        fetched: list[str] = []
        inner_get = store.get

        async def get(k: str, **kwargs: Any) -> bytes:
            fetched.append(k)
            return await inner_get(k, **kwargs)

        store.get = get  # type: ignore[method-assign]
        with pytest.raises(TieredError) as refused:
            await h.s.streams.read(s, s.retained_from, h.s.streams.view(s).tail)
        # Removed, not damaged: refused before any fetch, with where the live bytes resume.
        assert refused.value.code == ErrorCode.OFFSET_GONE
        assert refused.value.context["next_offset"] == format_offset(hole_end)
        assert fetched == [] and h.s.streams.reader.integrity_errors == {"hot": 0, "cold": 0}
        with pytest.raises(TieredError) as across:  # from live bytes into the hole
            await h.s.streams.read(s, hole_start, hole_end + 1)
        assert across.value.code == ErrorCode.OFFSET_GONE and fetched == []
        assert await h.s.streams.read(s, hole_end, h.s.streams.view(s).tail) == b"".join(map(line, LIVE))
        assert h.s.streams.reader.integrity_errors == {"hot": 0, "cold": 0}
        with pytest.raises(TieredError) as inside:
            await h.s.snapshots.publish("default", "k", hole_start + 3, b"S", "text/plain")
        assert inside.value.code == ErrorCode.SNAPSHOT_NOT_AT_BOUNDARY
        await h.s.snapshots.publish("default", "k", hole_end, b"S", "text/plain")
        assert h.s.streams.lookup("default", "k").snapshot is not None
        await h.stop()

    asyncio.run(body())


@pytest.mark.parametrize("reclaimed", [False, True])
def test_a_fork_sub_offset_counts_only_the_live_messages_of_a_compacted_source(
    tmp_path: Path, reclaimed: bool
) -> None:
    """``Stream-Fork-Sub-Offset`` counts the messages a reader of the source sees. Before the
    rewrite the removed messages' bytes are still stored and must not be counted; after it they
    are gone and must not be read (no integrity error, no 502)."""
    clock = VirtualClock()
    h = Harness(_config(tmp_path), clock=clock)

    async def body() -> None:
        await h.start()
        await three_objects(h)
        s = h.s.streams.lookup("default", "k")
        hole_end = len(line(A_MSGS[0])) + len(line(B_MSGS[0][0]))  # a0 and b1: removed
        if reclaimed:
            await converge(h, clock.ms)
        else:  # the holes journaled, the objects not rewritten yet (a pass stopped after its first step)
            record = StreamCompacted(uid=s.uid, ts_ms=clock.ms, removed=((0, hole_end),))
            await h.s.gc.ctx.committer.commit([record])
        s = h.s.streams.lookup("default", "k")
        assert s.holes == ((0, hole_end),)
        streams = h.s.streams
        first = await streams.fork_request("default", "k", 0, 1, "default/k")
        assert first.offset == hole_end + len(line(LIVE[0]))  # after b2, not inside the hole
        assert (await streams.fork_request("default", "k", 0, 2, "default/k")).offset == s.tail
        with pytest.raises(TieredError) as past:
            await streams.fork_request("default", "k", 0, 3, "default/k")
        assert past.value.code == ErrorCode.BAD_REQUEST
        inside = await streams.fork_request("default", "k", 5, 1, "default/k")  # from inside the hole
        assert inside.offset == first.offset
        created, _ = await streams.create(
            "default",
            "f",
            CreateRequest(JSON, None, None, None, False, b"", ForkRequest(s.uid, first.offset, "default/k")),
        )
        assert created and await read_messages(h, "default", "f") == LIVE[:1]
        assert streams.reader.integrity_errors == {"hot": 0, "cold": 0}
        await h.stop()

    asyncio.run(body())


def test_a_client_forks_a_compacted_stream_by_sub_offset_over_http(tmp_path: Path, caplog: Any) -> None:
    """The client path: ``PUT`` with ``Stream-Forked-From`` and ``Stream-Fork-Sub-Offset`` of a
    physically compacted JSON stream is a 201 whose fork reads the first live message (was: 502
    and an ``integrity:`` error logged); the source reads as before; no integrity error counted."""
    from tests.support.gc_support import HttpHarness

    clock = VirtualClock()
    h = HttpHarness(_config(tmp_path), clock=clock)

    async def body() -> None:
        await h.start()
        await three_objects(h)
        await converge(h, clock.ms)
        headers = {
            "Stream-Forked-From": "/v1/stream/k",
            "Stream-Fork-Offset": format_offset(0),
            "Stream-Fork-Sub-Offset": "1",
            "Content-Type": JSON,
        }
        status, _, raw = await h.http("PUT", "/v1/stream/f", headers=headers)
        assert status == 201, raw
        status, _, raw = await h.http("GET", "/v1/stream/f?offset=-1")
        assert status == 200 and json.loads(raw) == LIVE[:1]
        status, _, raw = await h.http("GET", "/v1/stream/k?offset=-1")
        assert status == 200 and json.loads(raw) == LIVE
        assert h.s.streams.reader.integrity_errors == {"hot": 0, "cold": 0}
        assert "integrity" not in caplog.text
        await h.stop()

    asyncio.run(body())


def _swallow(call: Any) -> None:
    try:
        call()
    except Exception:
        pass  # the server was killed under it


@pytest.mark.parametrize("kill", ["after-rewrite", "during-gc"])
def test_sigkill_of_a_real_server_around_the_compaction_rewrite(tmp_path: Path, kill: str) -> None:
    """``tiered serve`` SIGKILLed right after the compaction rewrite (old object not yet deleted), or
    while the GC request is in flight: after a restart both streams read as before, GC and
    reconciliation leave exactly one object without the removed record, and ``tiered verify`` passes."""
    import subprocess
    import sys
    import threading
    import time

    from tests.support.deadlines import Deadline, wait_for
    from tests.support.gc_support import object_files
    from tests.support.http_helpers import request as http
    from tests.support.server_process import ServerProcess

    data = tmp_path / "data"
    args = (
        *("--flush-interval-s", "3600", "--flush-bytes", "4096", "--hot-retention-s", "0"),
        *("--gc-grace-s", "1", "--gc-interval-s", "3600"),
    )
    env = {"TIERED_ADMIN_TOKEN": ""}
    js = {"Content-Type": JSON}
    other = b"o" * 5000
    updates = [[{"id": 0, "v": "old"}], [{"id": 1, "v": "kept"}], [{"id": 0, "v": "new"}]]
    live = [{"id": 1, "v": "kept"}, {"id": 0, "v": "new"}]

    def wait(cond: Any) -> None:
        deadline = Deadline(15)
        while not cond():
            assert not deadline.expired(), "timed out"
            time.sleep(0.05)

    def reads_ok(url: str, *allowed: list[Any]) -> None:
        assert json.loads(http("GET", f"{url}/v1/stream/k?offset=-1")[2]) in (allowed or (live,))
        assert http("GET", f"{url}/v1/stream/o?offset=-1")[2] == other

    # During the GC request: its rewrite paced slow enough (bytes read plus written) that the pass
    # is still running well after the rewrite's commit.
    paced = ("--rewrite-bytes-per-s", "100") if kill == "during-gc" else ()
    srv = ServerProcess(data, *args, *paced, env=env).start()
    try:
        assert http("PUT", f"{srv.url}/v1/stream/k", {**js, "Stream-Compaction-Key": "/id"})[0] == 201
        assert http("PUT", f"{srv.url}/v1/stream/o", {"Content-Type": "application/octet-stream"})[0] == 201
        for batch in updates:
            assert http("POST", f"{srv.url}/v1/stream/k", js, json.dumps(batch).encode())[0] == 204
        assert (
            http("POST", f"{srv.url}/v1/stream/o", {"Content-Type": "application/octet-stream"}, other)[0]
            == 204
        )
        wait(lambda: len(object_files(data)) == 1)
        [old] = object_files(data)
        if kill == "after-rewrite":
            status, _, raw = http("POST", srv.url + "/v1/admin/gc")
            report = json.loads(raw)
            assert status == 200 and report["streams_compacted"] == 1 and report["objects_compacted"] == 1, (
                report
            )
            assert len(object_files(data)) == 2
        else:
            answered: list[Any] = []
            threading.Thread(
                target=lambda: _swallow(lambda: answered.append(http("POST", srv.url + "/v1/admin/gc"))),
                daemon=True,
            ).start()
            # The rewrite is journaled and logged; the pass then paces itself (minutes at the
            # --rewrite-bytes-per-s given) before deleting or reconciling: the kill lands inside it.
            wait_for(lambda: "rewritten as" in srv.log(), 30, "the GC pass's rewrite", explain=srv.log)
            assert answered == [], answered  # the GC request is still in flight
    finally:
        srv.kill()
    srv = ServerProcess(data, *args, env=env).start()
    try:
        reads_ok(
            srv.url, live, [m for batch in updates for m in batch]
        )  # compacted, or not yet: never a part
        deadline = Deadline(30)
        while True:
            status, _, raw = http("POST", srv.url + "/v1/admin/gc")
            report = json.loads(raw)
            assert status == 200 and report["errors"] == [] and report["integrity_errors"] == [], report
            if len(object_files(data)) == 1 and old not in object_files(data):
                break
            assert not deadline.expired(), (object_files(data), report)
            time.sleep(0.3)  # the grace delay (1 s) passes in real time
        reads_ok(srv.url)
    finally:
        srv.stop()
    [new] = object_files(data)
    rows = keyed_rows((data / "cold" / new).read_bytes())
    assert rows == [line(m) for batch in updates[1:] for m in batch]  # the removed record is gone
    done = subprocess.run(
        [sys.executable, "-m", "tiered.cli", "verify", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
