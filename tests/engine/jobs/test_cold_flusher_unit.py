"""In-process tests of the cold flusher: planning, keys, and the journaled copy lifecycle.

* ``plan_flush`` / ``plan_hot_trims`` are pure functions of ``StreamState``; the
  states here are built by applying ``StreamCreated``/``Appended`` records with
  fake ``(segment, position)`` locations, exactly as journal replay would.
* ``new_object_key`` / ``key_time_ms``: ULID-style keys that sort by time.
* The lifecycle tests run a real ``Engine`` (journal, segment log,
  LocalDirStore) on a temporary data dir with ``asyncio.run``: a copy started
  but never committed (a crash between ``ColdCopyStarted`` and the commit) is
  aborted by the next start and the data is flushed again under a new key; an
  upload failure journals ``ColdCopyAborted``, keeps the hot data readable, and
  a later pass succeeds.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.support.deadlines import scaled
from tiered.cold.objects.keys import key_time_ms, new_object_key
from tiered.cold.objects.store import ObjectInfo, ObjectStoreUnavailable
from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.config import Config
from tiered.core.errors import ErrorCode
from tiered.core.errors import TieredError as StreamError
from tiered.engine.codec import Record, decode_record
from tiered.engine.engine import Engine
from tiered.engine.jobs.flush_plan import PieceToCopy, plan_flush, plan_hot_trims
from tiered.engine.streams.model import AppendRequest, ColdSlice, CreateRequest, HotSlice, Stream
from tiered.engine.streams.records import (
    Appended,
    ColdCopyAborted,
    ColdCopyCommitted,
    ColdCopyStarted,
    CopyRange,
    HotTrimmed,
    StreamCreated,
)
from tiered.engine.streams.state import StreamState
from tiered.hot.log import SegmentLog

OCTET = "application/octet-stream"
EMPTY_INDEX = ChunkIndex(0, 0, (), ())

# --------------------------------------------------------------------------- state builders

_positions = itertools.count(1000, 4096)
_key_randomness = itertools.count(1)


def _created(
    uid: int,
    path: str,
    *,
    ts_ms: int = 1_000,
    fork_source: int | None = None,
    fork_offset: int = 0,
    bucket: str = "default",
) -> StreamCreated:
    return StreamCreated(
        uid=uid,
        bucket=bucket,
        path=path,
        content_type=OCTET,
        ttl_s=None,
        expires_at=None,
        expires_at_ms=None,
        closed=False,
        ts_ms=ts_ms,
        fork_source=fork_source,
        fork_offset=fork_offset,
        fork_spec=None if fork_source is None else f"src@{fork_offset}",
        data=b"",
    )


def _append(state: StreamState, uid: int, size: int, *, ts_ms: int = 1_000, segment: int = 1) -> None:
    s = state.streams[uid]
    record = Appended(
        uid=uid,
        offset=s.tail,
        ts_ms=ts_ms,
        producer=None,
        epoch=0,
        seq=0,
        stream_seq=None,
        close=False,
        data=b"x" * size,
    )
    state.apply(record, (segment, next(_positions)))


def build_state(streams: dict[str, Iterable[int]], *, ts_ms: int = 1_000) -> StreamState:
    """A state with one stream per entry (uids 1, 2, ... in order), appended the given record sizes."""
    state = StreamState()
    for uid, (path, sizes) in enumerate(streams.items(), start=1):
        state.apply(_created(uid, path, ts_ms=ts_ms))
        for size in sizes:
            _append(state, uid, size, ts_ms=ts_ms, segment=1 + uid % 3)
    return state


def tail(s: Stream) -> int:
    return s.tail


def committed(key: str, ts_ms: int, ranges: tuple[CopyRange, ...]) -> ColdCopyCommitted:
    """A commit record for a (fake) object; fills optional integrity fields with dummies."""
    extra = {"crc32c": 0} if "crc32c" in ColdCopyCommitted.__struct_fields__ else {}
    return ColdCopyCommitted(key=key, ts_ms=ts_ms, size=1, index=EMPTY_INDEX, ranges=ranges, **extra)


def commit(state: StreamState, plan: list[list[PieceToCopy]], ts_ms: int = 2_000) -> None:
    """Apply what a successful pass would journal for ``plan``."""
    for pieces in plan:
        key = new_object_key(ts_ms, next(_key_randomness).to_bytes(10, "big"))
        ranges = tuple(CopyRange(p.stream.uid, p.start, p.end) for p in pieces)
        state.apply(ColdCopyStarted(key=key, ts_ms=ts_ms, ranges=ranges))
        state.apply(committed(key, ts_ms, ranges))


def object_bytes(pieces: list[PieceToCopy]) -> int:
    return sum(p.end - p.start for p in pieces)


def record_boundaries(s: Stream) -> set[int]:
    c = s.chunks
    return {c.starts[i] for i in range(len(c))} | {s.tail}


def check_piece(p: PieceToCopy) -> None:
    """A piece is a run of whole, contiguous records of one stream, with their hot locations."""
    assert p.chunks, p
    assert p.start == p.chunks[0][0] and p.end == p.chunks[-1][0] + p.chunks[-1][1]
    for (start, length, *_), (nxt, *_) in itertools.pairwise(p.chunks):
        assert start + length == nxt
    c = p.stream.chunks
    hot = {(c.starts[i], c.lens[i], c.segs[i], c.poss[i], c.times[i]) for i in range(len(c))}
    assert set(p.chunks) <= hot


# --------------------------------------------------------------------------- plan_flush


def test_big_stream_gets_its_own_objects_split_at_record_boundaries() -> None:
    state = build_state({"big": [300] * 10, "small-a": [100], "small-b": [50, 50]})
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    big = [o for o in plan if any(p.stream.path == "big" for p in o)]
    small = [o for o in plan if o not in big]
    # The big stream is alone in each of its objects, cut at record boundaries, each <= target.
    assert [[(p.start, p.end) for p in o] for o in big] == [
        [(0, 900)],
        [(900, 1800)],
        [(1800, 2700)],
        [(2700, 3000)],
    ]
    assert all(len(o) == 1 and object_bytes(o) <= 1_000 for o in big)
    s = state.find("default", "big")
    assert s is not None
    for o in big:
        check_piece(o[0])
        assert {o[0].start, o[0].end} <= record_boundaries(s)
    # The small streams share one object.
    assert len(small) == 1
    assert sorted((p.stream.path, p.start, p.end) for p in small[0]) == [
        ("small-a", 0, 100),
        ("small-b", 0, 100),
    ]
    for p in small[0]:
        check_piece(p)


def test_half_a_target_makes_a_stream_big() -> None:
    state = build_state({"exactly-half": [250, 250], "just-under": [250, 249]})
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert sorted([(p.stream.path, p.start, p.end) for p in o] for o in plan) == [
        [("exactly-half", 0, 500)],  # its own object
        [("just-under", 0, 499)],  # packed (alone, as nothing else is waiting)
    ]
    state.apply(_created(3, "tiny"))
    _append(state, 3, 10)
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert sorted(sorted(p.stream.path for p in o) for o in plan) == [
        ["exactly-half"],
        ["just-under", "tiny"],
    ]


def test_oversized_record_gets_an_object_of_its_own() -> None:
    state = build_state({"big": [400, 1_500, 400, 400]})
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert [[(p.start, p.end) for p in o] for o in plan] == [[(0, 400)], [(400, 1_900)], [(1_900, 2_700)]]


def test_many_small_streams_are_packed_into_few_objects() -> None:
    state = build_state({f"s{i:03d}": [100] for i in range(25)})
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert len(plan) == 3  # ceil(2500 / 1000), not 25
    assert [len(o) for o in plan] == [10, 10, 5]
    assert all(object_bytes(o) <= 1_000 for o in plan)
    covered = sorted((p.stream.uid, p.start, p.end) for o in plan for p in o)
    assert covered == [(uid, 0, 100) for uid in range(1, 26)]
    for o in plan:
        for p in o:
            check_piece(p)


def test_pass_budget_bounds_the_plan_and_later_passes_continue() -> None:
    sizes = [200] * 5  # 1,000 bytes per stream, all "small" against the target
    state = build_state({f"s{i}": sizes for i in range(10)})
    budget = 2_500
    passes = 0
    copied: dict[int, list[tuple[int, int]]] = {}
    while plan := plan_flush(state, tail, target_bytes=10_000, max_pass_bytes=budget):
        passes += 1
        planned = sum(object_bytes(o) for o in plan)
        # The budget is checked before each record: at most one record past it.
        assert planned <= budget + max(sizes), planned
        assert planned >= budget or passes > 1
        for o in plan:
            for p in o:
                check_piece(p)
                assert p.start == p.stream.cold_end  # always continues exactly where cold data ends
                copied.setdefault(p.stream.uid, []).append((p.start, p.end))
        commit(state, plan)
        assert passes < 20
    assert passes == 4  # 10,000 bytes at ~2,600 per pass
    for ranges in copied.values():
        assert ranges[0][0] == 0 and ranges[-1][1] == 1_000
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert sorted(copied) == list(range(1, 11))
    assert all(s.cold_end == s.tail for s in state.streams.values())
    assert state.hot_bytes == 0


def test_first_pass_under_budget_takes_streams_in_uid_order() -> None:
    state = build_state({f"s{i}": [200] * 5 for i in range(10)})
    plan = plan_flush(state, tail, target_bytes=10_000, max_pass_bytes=2_500)
    ranges = sorted((p.stream.uid, p.start, p.end) for o in plan for p in o)
    assert ranges == [(1, 0, 1_000), (2, 0, 1_000), (3, 0, 600)]


def test_only_durable_data_is_planned() -> None:
    state = build_state({"a": [100, 100, 100], "b": [100]})
    visible = {1: 200, 2: 0}  # a's last append and all of b are not durable yet
    plan = plan_flush(state, lambda s: visible[s.uid], target_bytes=1_000, max_pass_bytes=1 << 30)
    assert [[(p.stream.path, p.start, p.end) for p in o] for o in plan] == [[("a", 0, 200)]]


def test_nothing_to_flush_and_already_cold_streams_are_skipped() -> None:
    assert plan_flush(StreamState(), tail, target_bytes=1_000, max_pass_bytes=1_000) == []
    state = build_state({"a": [100], "empty": []})
    commit(state, plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30))
    assert plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30) == []
    _append(state, 1, 7)
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert [[(p.start, p.end) for p in o] for o in plan] == [[(100, 107)]]


def test_fork_plans_only_its_own_data_from_the_fork_point() -> None:
    state = build_state({"src": [100, 100, 100]})
    state.apply(_created(2, "fork", fork_source=1, fork_offset=200))
    _append(state, 2, 50)
    _append(state, 2, 60)
    fork = state.streams[2]
    assert fork.cold_end == 200
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert sorted((p.stream.path, p.start, p.end) for o in plan for p in o) == [
        ("fork", 200, 310),
        ("src", 0, 300),
    ]
    commit(state, plan)
    assert fork.cold_end == 310 and [(r.start, r.end) for r in fork.cold_refs] == [(200, 310)]


def test_aborted_copy_leaves_no_trace_in_the_state() -> None:
    state = build_state({"a": [100, 100]})
    key = new_object_key(2_000)
    state.apply(ColdCopyStarted(key=key, ts_ms=2_000, ranges=(CopyRange(1, 0, 200),)))
    assert key in state.copies_in_flight
    state.apply(ColdCopyAborted(key=key, ts_ms=2_100, reason="upload failed"))
    assert state.copies_in_flight == {} and state.cold_objects == {}
    s = state.streams[1]
    assert (s.cold_end, len(s.chunks), state.hot_bytes) == (0, 2, 200)
    # The same data is planned again (under a new key when the flusher copies it).
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    assert [[(p.start, p.end) for p in o] for o in plan] == [[(0, 200)]]


def test_commit_of_a_stale_range_is_ignored() -> None:
    """A range that does not extend the cold prefix exactly (e.g. replayed twice) is not taken."""
    state = build_state({"a": [100, 100]})
    plan = plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30)
    commit(state, plan)
    s = state.streams[1]
    assert (s.cold_end, state.hot_bytes) == (200, 0)
    commit(state, plan, ts_ms=3_000)  # the same ranges again, under new keys
    assert (s.cold_end, state.hot_bytes, len(s.cold_refs)) == (200, 0, 1)


# --------------------------------------------------------------------------- plan_hot_trims


def test_hot_trims_wait_for_the_cold_commit() -> None:
    state = build_state({"a": [100, 100, 100]}, ts_ms=1_000)
    assert plan_hot_trims(state, now_ms=10**12, retention_ms=0) == []
    # Commit only the first two records.
    s = state.streams[1]
    key = new_object_key(2_000)
    ranges = (CopyRange(1, 0, 200),)
    state.apply(ColdCopyStarted(key=key, ts_ms=2_000, ranges=ranges))
    assert state.copies_in_flight == {key: 2_000}
    assert s.cold_end == 0 and state.hot_bytes == 300  # a started copy changes nothing readers see
    assert plan_hot_trims(state, now_ms=10**12, retention_ms=0) == []  # started is not committed
    state.apply(committed(key, 2_000, ranges))
    assert state.copies_in_flight == {} and key in state.cold_objects and state.hot_bytes == 100
    assert plan_hot_trims(state, now_ms=10**12, retention_ms=0) == [(1, 200)]  # never past cold_end
    assert s.cold_end == 200


def test_hot_trims_respect_retention_per_record() -> None:
    state = StreamState()
    state.apply(_created(1, "a"))
    for ts in (1_000, 2_000, 3_000):
        _append(state, 1, 100, ts_ms=ts)
    commit(state, plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30), ts_ms=3_500)
    assert plan_hot_trims(state, now_ms=1_499, retention_ms=500) == []
    assert plan_hot_trims(state, now_ms=1_500, retention_ms=500) == [(1, 100)]
    assert plan_hot_trims(state, now_ms=2_700, retention_ms=500) == [(1, 200)]
    assert plan_hot_trims(state, now_ms=3_500, retention_ms=500) == [(1, 300)]
    assert plan_hot_trims(state, now_ms=3_000, retention_ms=0) == [(1, 300)]


def test_applied_trims_drop_hot_chunks_and_reads_go_cold() -> None:
    state = build_state({"a": [100, 100], "b": [50]})
    commit(state, plan_flush(state, tail, target_bytes=1_000, max_pass_bytes=1 << 30))
    trims = plan_hot_trims(state, now_ms=10**12, retention_ms=0)
    assert sorted(trims) == [(1, 200), (2, 50)]
    a = state.streams[1]
    assert all(isinstance(sl, HotSlice) for sl in state.plan_read(a, 0, 200))  # hot preferred while kept
    state.apply(HotTrimmed(ts_ms=10**12, trims=tuple(trims)))
    assert plan_hot_trims(state, now_ms=10**12, retention_ms=0) == []
    assert len(a.chunks) == 0 and state.referenced_segments() == set()
    slices = state.plan_read(a, 50, 200)
    assert slices == [ColdSlice(a.cold_refs[0].key, "default", "a", 50, 200)]
    # New data after the trim is hot again; reads stitch cold + hot.
    _append(state, 1, 30)
    slices = state.plan_read(a, 150, 230)
    assert isinstance(slices[0], ColdSlice) and (slices[0].start, slices[0].end) == (150, 200)
    assert isinstance(slices[1], HotSlice) and slices[1].length == 30


# --------------------------------------------------------------------------- object keys

_KEY_RE = re.compile(r"data/[0-9A-HJKMNP-TV-Z]{26}\.parquet")


@pytest.mark.parametrize(
    "now_ms",  # "now" by name: xdist's workers must collect the same test ids
    [0, 1, 1_733_140_000_000, pytest.param(int(time.time() * 1000), id="now"), 2**48 - 1],
)
def test_object_key_round_trips_its_time(now_ms: int) -> None:
    key = new_object_key(now_ms)
    assert _KEY_RE.fullmatch(key), key
    assert key_time_ms(key) == now_ms
    assert key_time_ms(key.removeprefix("data/")) == now_ms
    assert key_time_ms("prefix/" + key) == now_ms


def test_object_keys_sort_by_time() -> None:
    times = [0, 1, 2, 999, 1_000, 1_733_140_000_000, 1_733_140_000_001, 2**48 - 2, 2**48 - 1]
    keys = []
    for t in times:
        # Worst case for ordering: high randomness at an earlier ms, low at a later one.
        keys += [new_object_key(t, b"\xff" * 10), new_object_key(t, b"\x00" * 10), new_object_key(t)]
    assert sorted(keys) == sorted(keys, key=lambda k: (key_time_ms(k), k))
    assert [key_time_ms(k) for k in sorted(keys)] == sorted(key_time_ms(k) for k in keys)
    assert (
        new_object_key(5, b"\x00" * 10)
        < new_object_key(5, b"\x00" * 9 + b"\x01")
        < new_object_key(6, b"\x00" * 10)
    )


def test_object_keys_are_unique_and_randomness_is_used() -> None:
    now = int(time.time() * 1000)
    keys = {new_object_key(now) for _ in range(1_000)}
    assert len(keys) == 1_000
    assert new_object_key(now, b"\x01" * 10) == new_object_key(now, b"\x01" * 10)
    assert new_object_key(now, b"\x01" * 10) != new_object_key(now, b"\x02" * 10)


@pytest.mark.parametrize(
    "key",
    [
        "data/short.parquet",
        "data/" + "0" * 25 + "U.parquet",
        "data/" + "0" * 27 + ".parquet",
        "",
        "data/" + "0" * 25 + "-.parquet",
    ],
)
def test_key_time_of_foreign_keys_is_none(key: str) -> None:
    assert key_time_ms(key) is None


# --------------------------------------------------------------------------- lifecycle (real service)


def journal_records(data_dir: Path) -> list[Record]:
    """Every record still in the hot log of a stopped service, in order."""
    log = SegmentLog(data_dir / "hot")
    try:
        return [decode_record(body) for _, body in log.open(read_only=True)]
    finally:
        log.close()


def make_config(data_dir: Path, **overrides: Any) -> Config:
    values: dict[str, Any] = {
        "data_dir": str(data_dir),
        "segment_bytes": 1 << 20,
        "max_body_bytes": 256 * 1024,
        "flush_interval_s": 30.0,  # passes run only when a test asks (kick / flush_once)
        "hot_retention_s": 0.0,
    }
    values.update(overrides)
    config = Config(**values)
    config.validate()
    return config


async def run_service(
    config: Config,
    body: Callable[[Engine], Awaitable[None]],
    *,
    run_flusher: bool = True,
    crash: bool = False,
) -> None:
    svc = Engine(config)
    await svc.start(jobs=False)
    if run_flusher:
        svc.start_jobs({"cold-flusher"})
    try:
        await body(svc)
    finally:
        if crash:
            await simulate_crash(svc)
        else:
            await svc.stop()


async def simulate_crash(svc: Engine) -> None:
    """Stop like a SIGKILL after the last fsync: no shutdown snapshot, no flusher cleanup."""
    await svc.supervisor.stop()
    await svc.deliveries.close()
    await svc.journal.close(None)  # everything acknowledged is already durable; no snapshot
    if svc.store is not None:
        await svc.store.close()


async def write_streams(svc: Engine, contents: dict[str, list[bytes]]) -> dict[str, bytes]:
    for path, records in contents.items():
        await svc.streams.create("default", path, CreateRequest(OCTET, None, None, None, False, b""))
        for data in records:
            await svc.streams.append("default", path, AppendRequest(OCTET, data, False))
    return {path: b"".join(records) for path, records in contents.items()}


async def read_stream(svc: Engine, path: str) -> bytes:
    s = svc.streams.lookup("default", path)
    return await svc.streams.read(s, 0, svc.streams.view(s).tail)


def slice_kinds(svc: Engine, path: str) -> set[str]:
    s = svc.streams.lookup("default", path)
    return {type(sl).__name__ for sl in svc.state.plan_read(s, 0, s.tail)}


async def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


CONTENTS = {
    "alpha": [bytes(range(256)) * 40, b"\x00", b"tail of alpha"],
    "beta/nested": [b"b" * 70_000, bytes(range(255, -1, -1)) * 3],
    "gamma": [b"\xff\x00" * 5],
}


@pytest.mark.parametrize("shutdown", ["crash", "clean"])
def test_copy_interrupted_before_commit_is_aborted_and_redone_under_a_new_key(
    tmp_path: Path, shutdown: str
) -> None:
    config = make_config(tmp_path / "data")
    orphan = new_object_key(int(time.time() * 1000))
    expected: dict[str, bytes] = {}

    async def first_life(svc: Engine) -> None:
        expected.update(await write_streams(svc, CONTENTS))
        ranges = tuple(CopyRange(s.uid, s.cold_end, s.tail) for s in svc.state.streams.values())
        await svc.committer.commit(
            [ColdCopyStarted(key=orphan, ts_ms=int(time.time() * 1000), ranges=ranges)]
        )
        assert orphan in svc.state.copies_in_flight
        # The upload itself landed before the "crash": an orphan object with the same key.
        await svc.store.put(orphan, b"an upload that was never committed")

    asyncio.run(run_service(config, first_life, run_flusher=False, crash=shutdown == "crash"))

    # Replay (crash: from the journal; clean: from the shutdown snapshot) remembers the copy in flight.
    recovered = Engine(config)
    state = recovered.journal.recover()
    recovered.journal.log.close()
    assert list(state.copies_in_flight) == [orphan]
    assert all(s.cold_end == 0 and not s.cold_refs for s in state.streams.values())

    new_keys: list[str] = []

    async def second_life(svc: Engine) -> None:
        # Startup aborts the interrupted copy before any flush pass (the interval is 30 s).
        await wait_for(lambda: not svc.state.copies_in_flight, what="the interrupted copy to be aborted")
        assert svc.state.cold_objects == {}
        for path, data in expected.items():
            assert slice_kinds(svc, path) == {"HotSlice"}
            assert await read_stream(svc, path) == data
        svc.flusher.kick()
        await wait_for(
            lambda: all(s.cold_end == s.tail and not len(s.chunks) for s in svc.state.streams.values()),
            what="a fresh flush and hot trim",
        )
        new_keys.extend(svc.state.cold_objects)
        assert new_keys and orphan not in new_keys
        for path, data in expected.items():
            assert slice_kinds(svc, path) == {"ColdSlice"}
            assert await read_stream(svc, path) == data
        assert svc.flusher.failures == 0

    asyncio.run(run_service(config, second_life))

    records = journal_records(config.data_path)
    aborted = [r for r in records if isinstance(r, ColdCopyAborted)]
    assert [r.key for r in aborted] == [orphan]
    assert "restart" in aborted[0].reason
    committed = [r.key for r in records if isinstance(r, ColdCopyCommitted)]
    assert committed == new_keys
    started = [r.key for r in records if isinstance(r, ColdCopyStarted)]
    assert started == [orphan, *new_keys]
    assert records.index(aborted[0]) < min(
        i for i, r in enumerate(records) if isinstance(r, ColdCopyCommitted)
    )

    async def third_life(svc: Engine) -> None:
        assert not svc.state.copies_in_flight
        assert sorted(svc.state.cold_objects) == sorted(new_keys)
        for path, data in expected.items():
            assert await read_stream(svc, path) == data
        assert await svc.store.head(orphan) is not None  # left for reconciliation, never served

    asyncio.run(run_service(config, third_life, run_flusher=False))


class FlakyStore:
    """Wraps a store; ``put`` (and optionally ``get``) raise ObjectStoreUnavailable while ``down``."""

    def __init__(self, inner: Any, *, fail_gets: bool = False) -> None:
        self.inner = inner
        self.down = True
        self.fail_gets = fail_gets
        self.failed_puts: list[str] = []
        self.puts: list[str] = []

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        if self.down:
            self.failed_puts.append(key)
            raise ObjectStoreUnavailable(f"injected outage for {key}")
        self.puts.append(key)
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        if self.down and self.fail_gets:
            raise ObjectStoreUnavailable(f"injected outage for {key}")
        return await self.inner.get(key, start=start, end=end)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_upload_failure_journals_abort_keeps_hot_data_and_a_later_pass_succeeds(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data")
    expected: dict[str, bytes] = {}
    seen: list[Record] = []

    async def body(svc: Engine) -> None:
        flusher = svc.flusher
        expected.update(await write_streams(svc, CONTENTS))
        commit_records = svc.committer.commit

        async def spy(records: list[Record]) -> None:
            seen.extend(records)
            await commit_records(records)

        svc.committer.commit = spy  # type: ignore[method-assign]  # the flusher commits through it
        flaky = FlakyStore(flusher.store)
        flusher.store = flaky

        with pytest.raises(ObjectStoreUnavailable):
            await flusher.flush_once()
        assert len(flaky.failed_puts) == 1
        key = flaky.failed_puts[0]
        assert [type(r).__name__ for r in seen] == ["ColdCopyStarted", "ColdCopyAborted"]
        assert seen[1].key == key and "upload failed" in seen[1].reason  # type: ignore[union-attr]
        assert svc.state.copies_in_flight == {} and svc.state.cold_objects == {}
        assert all(s.cold_end == 0 for s in svc.state.streams.values())
        assert svc.state.hot_bytes == sum(len(v) for v in expected.values())
        for path, data in expected.items():
            assert slice_kinds(svc, path) == {"HotSlice"}
            assert await read_stream(svc, path) == data

        flaky.down = False
        assert await flusher.flush_once() >= 1
        await flusher.release_hot_copies()
        assert key not in flaky.puts and key not in svc.state.cold_objects  # a new key, not a reuse
        assert sorted(svc.state.cold_objects) == sorted(flaky.puts)
        assert svc.state.hot_bytes == 0
        for path, data in expected.items():
            assert slice_kinds(svc, path) == {"ColdSlice"}
            assert await read_stream(svc, path) == data

    asyncio.run(run_service(config, body, run_flusher=False))
    records = journal_records(config.data_path)
    kinds = [type(r).__name__ for r in records if type(r).__name__.startswith(("Cold", "Hot"))]
    assert kinds[:2] == ["ColdCopyStarted", "ColdCopyAborted"]
    assert "ColdCopyCommitted" in kinds and "HotTrimmed" in kinds


def test_background_flusher_backs_off_and_recovers_from_an_outage(tmp_path: Path) -> None:
    """The run loop survives failed passes (counted, last_error kept) and flushes once the store is back."""
    config = make_config(tmp_path / "data", flush_interval_s=0.05)

    async def body(svc: Engine) -> None:
        flusher = svc.flusher
        flaky = FlakyStore(flusher.store)
        flusher.store = flaky
        svc.supervisor.start("cold-flusher", flusher.run)  # stop() cancels it
        expected = await write_streams(svc, CONTENTS)
        await wait_for(lambda: flusher.failures >= 1, what="a failed pass")
        assert flusher.last_error and "injected outage" in flusher.last_error
        assert svc.state.copies_in_flight == {}  # aborted, not left dangling
        for path, data in expected.items():
            assert await read_stream(svc, path) == data
        flaky.down = False
        await wait_for(
            lambda: svc.state.hot_bytes == 0 and flusher.last_error is None,
            timeout=15,
            what="the flusher to recover",
        )
        for path, data in expected.items():
            assert slice_kinds(svc, path) == {"ColdSlice"}
            assert await read_stream(svc, path) == data

    asyncio.run(run_service(config, body, run_flusher=False))


def test_cold_read_during_an_outage_is_a_prompt_503(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data", read_cache_bytes=0)

    async def body(svc: Engine) -> None:
        flusher = svc.flusher
        expected = await write_streams(svc, CONTENTS)
        await flusher.flush_once()
        await flusher.release_hot_copies()
        flaky = FlakyStore(svc.cold_reader.store, fail_gets=True)
        svc.cold_reader.store = flaky
        for path in expected:
            started = time.monotonic()
            with pytest.raises(StreamError) as err:
                await read_stream(svc, path)
            assert err.value.code is ErrorCode.STORE_UNAVAILABLE
            assert time.monotonic() - started < 1
        flaky.down = False
        for path, data in expected.items():
            assert await read_stream(svc, path) == data

    asyncio.run(run_service(config, body, run_flusher=False))


def test_idle_server_frees_sealed_segments_once_their_data_is_cold(tmp_path: Path) -> None:
    """Hot segments whose data is all cold (and trimmed) must eventually be deleted, even when
    no more writes arrive. Two snapshots taken while writing (as the periodic snapshots do)
    put the replay floor in the middle of the data; later snapshots on an idle server land
    on the same log position."""
    config = make_config(tmp_path / "data")
    hot = config.data_path / "hot"

    async def body(svc: Engine) -> None:
        flusher = svc.flusher
        for i in range(4):
            await svc.streams.create("default", f"s{i}", CreateRequest(OCTET, None, None, None, False, b""))
        for n in range(32):
            await svc.streams.append(
                "default", f"s{n % 4}", AppendRequest(OCTET, bytes([n]) * 200_000, False)
            )
            if n in (8, 24):
                await svc.journal.snapshot(svc.state)  # what --snapshot-every-bytes does under load
        active = svc.journal.log.end.segment
        await flusher.flush_once()
        for _ in range(5):
            await flusher.release_hot_copies()
            svc.reaper._last_snapshot = float("-inf")  # skip the 10 s throttle between floor-moving snapshots
        assert svc.state.hot_bytes == 0 and svc.state.referenced_segments() == set()
        sealed = sorted(int(p.stem) for p in hot.glob("*.seg") if int(p.stem) < active)
        assert sealed == [], f"sealed segments {sealed} hold only cold, trimmed data but are never deleted"

    asyncio.run(run_service(config, body, run_flusher=False))


class GatedGets:
    """Wraps a store; ``get`` waits for ``gate`` (an S3 GET that takes a while)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.waiting = 0

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        self.waiting += 1
        await self.gate.wait()
        return await self.inner.get(key, start=start, end=end)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_read_stitching_cold_and_hot_survives_the_hot_segment_being_deleted_meanwhile(tmp_path: Path) -> None:
    config = make_config(tmp_path / "data", read_cache_bytes=0)

    async def body(svc: Engine) -> None:
        flusher = svc.flusher
        first, second = bytes(range(256)) * 400, bytes(range(255, -1, -1)) * 400
        await write_streams(svc, {"s": [first], "filler": []})
        await flusher.flush_once()
        await flusher.release_hot_copies()  # "s" [0, 102400) is cold only
        await svc.streams.append("default", "s", AppendRequest(OCTET, second, False))  # hot, in segment 1
        while svc.journal.log.end.segment == 1:  # seal segment 1
            await svc.streams.append("default", "filler", AppendRequest(OCTET, b"f" * 200_000, False))
        s = svc.streams.lookup("default", "s")
        kinds = [type(sl).__name__ for sl in svc.state.plan_read(s, 0, s.tail)]
        assert kinds == ["ColdSlice", "HotSlice"]

        gated = GatedGets(svc.cold_reader.store)
        svc.cold_reader.store = gated
        reader = asyncio.create_task(svc.streams.read(s, 0, s.tail))
        await wait_for(lambda: gated.waiting > 0, what="the read to wait on the object store")
        # Meanwhile the flusher moves the hot part cold (retention 0) and frees segment 1.
        await flusher.flush_once()
        await flusher.release_hot_copies()
        await svc.journal.snapshot(svc.state)  # as --snapshot-every-bytes would under load
        await flusher.release_hot_copies()
        assert not (config.data_path / "hot" / "00000000000000000001.seg").exists()
        gated.gate.set()
        assert await reader == first + second

    asyncio.run(run_service(config, body, run_flusher=False))
