"""The metadata journal (group commit over SegmentLog) and state snapshots.

Each test drives the journal the way the service does: decide against the
state, ``journal.append`` the record, apply it with the returned location,
then await durability. The commit loop runs under ``asyncio.run``; recovery
is checked by building a fresh Journal over the same directory.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.state_fingerprint import fingerprint
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.codec import RECORDS, Record, data_location, encode_record
from tiered.engine.journal.journal import Journal, JournalFailed
from tiered.engine.journal.snapshot import SnapshotError, SnapshotStore
from tiered.engine.snapshot import SNAPSHOT_VERSION, SNAPSHOTS, decode_snapshot, encode_snapshot
from tiered.engine.streams.model import AppendRequest, CreateRequest, ForkRequest
from tiered.engine.streams.records import Appended, StreamCreated, StreamDeleted
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition, SegmentLog
from tiered.hot.segment import FRAME_SIZE, MARKER_FRAME_SIZE, crc32c, frame, marker_frame, segment_name

B = "default"

# --------------------------------------------------------------------------- helpers


def make_journal(root: Path, **kw: Any) -> Journal:
    segment_bytes = kw.pop("segment_bytes", 1 << 20)
    return Journal(
        SegmentLog(root / "hot", segment_bytes=segment_bytes),
        SnapshotStore(root / "snapshots", SNAPSHOTS),
        RECORDS,
        **kw,
    )


def read_all(journal: Journal, state: StreamState, bucket: str, path: str) -> bytes:
    s = state.find(bucket, path)
    assert s is not None
    return b"".join(
        journal.log.read(sl.segment, sl.position, sl.length) for sl in state.plan_read(s, 0, s.tail)
    )


class Writer:
    """decide -> journal.append -> apply, with no await in between (like the service)."""

    def __init__(self, journal: Journal, state: StreamState) -> None:
        self.j = journal
        self.state = state
        self.records: list[Record] = []

    def commit(
        self, records: list[Record], on_durable: Callable[[], None] | None = None
    ) -> asyncio.Future[None] | None:
        fut = None
        for r in records:
            fut, loc = self.j.append(r, on_durable)
            self.state.apply(r, loc)
            self.records.append(r)
        return fut

    def bucket(self, name: str, now: int = 0) -> asyncio.Future[None] | None:
        return self.commit(self.state.decide_bucket(name, now))

    def create(
        self, path: str, data: bytes = b"", now: int = 0, bucket: str = B, **kw: Any
    ) -> asyncio.Future[None] | None:
        kw.setdefault("content_type", None)
        kw.setdefault("ttl_s", None)
        kw.setdefault("expires_at", None)
        kw.setdefault("expires_at_ms", None)
        kw.setdefault("closed", False)
        records, _ = self.state.decide_create(bucket, path, CreateRequest(data=data, **kw), now)
        return self.commit(records)

    def append(
        self, path: str, data: bytes, now: int = 0, on_durable: Callable[[], None] | None = None, **kw: Any
    ) -> asyncio.Future[None] | None:
        kw.setdefault("content_type", None)
        kw.setdefault("close", False)
        decided = self.state.decide_append(B, path, AppendRequest(data=data, **kw), now)
        assert isinstance(decided, Appended)
        return self.commit([decided], on_durable)

    def delete(self, path: str, now: int = 0) -> asyncio.Future[None] | None:
        return self.commit([self.state.decide_delete(B, path, now)])

    def fork(
        self, path: str, src: str, offset: int, data: bytes = b"", now: int = 0
    ) -> asyncio.Future[None] | None:
        s = self.state.lookup(B, src, now)
        return self.create(path, data, now, fork=ForkRequest(s.uid, offset, f"{src}@{offset}"))


def history_one(w: Writer) -> None:
    w.bucket("tenant-a", 1)
    w.create("orders", b"o1;", now=1, content_type="text/plain", ttl_s=3600)
    w.append("orders", b"o2;", now=2, producer="p", epoch=0, seq=0, stream_seq="0001")
    w.create("events", b"", now=3, bucket="tenant-a")
    w.create("scratch", b"tmp", now=3)
    w.delete("scratch", now=4)


def history_two(w: Writer) -> None:
    w.append("orders", b"o3;", now=5, producer="p", epoch=0, seq=1)
    w.fork("branch", "orders", 3, b"b1;", now=6)
    w.delete("orders", now=7)  # soft: the branch reads through it
    w.create("json", b'{"a":1}\n', now=8, content_type="application/json")


def history_three(w: Writer) -> None:
    w.append("branch", b"b2;", now=9, close=True)
    for i in range(20):
        w.append("json", b'{"i":%d}\n' % i, now=10 + i)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def snapshot_files(root: Path) -> list[Path]:
    d = root / "snapshots"
    return sorted(d.glob("snapshot-*.bin")) if d.exists() else []


# --------------------------------------------------------------------------- recovery basics


def test_recover_from_an_empty_directory(tmp_path: Path) -> None:
    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        assert fingerprint(state) == fingerprint(StreamState())
        assert j.bytes_since_snapshot == 0
        j.start()
        await j.close()

    run(main())
    assert (tmp_path / "hot" / segment_name(1)).exists()
    assert snapshot_files(tmp_path) == []
    # And again: an empty log replays to an empty state.
    j2 = make_journal(tmp_path)
    assert fingerprint(j2.recover()) == fingerprint(StreamState())
    j2.log.close()


def test_append_group_commit_durable_futures_and_callbacks(tmp_path: Path) -> None:
    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        order: list[int] = []
        await asyncio.shield(w.create("s", b"start"))  # type: ignore[arg-type]

        futures = []
        for i in range(25):
            futures.append(w.append("s", b"%02d" % i, now=i, on_durable=lambda i=i: order.append(i)))
        # Everything appended in one tick shares one batch (one write, one sync).
        assert len({id(f) for f in futures}) == 1
        batch_future = futures[0]
        assert batch_future is not None and not batch_future.done()
        assert order == []  # nothing runs before it is durable
        await batch_future
        assert order == list(range(25))

        # Across batches the callbacks still run in log order, each before its future resolves.
        seen_done: list[bool] = []
        f1 = w.append("s", b"x", on_durable=lambda: (order.append(100), seen_done.append(f1.done())))  # type: ignore[union-attr]
        await asyncio.sleep(0)
        f2 = w.append("s", b"y", on_durable=lambda: order.append(101))
        assert f1 is not None and f2 is not None
        await asyncio.gather(f1, f2)
        assert order[-2:] == [100, 101]
        assert seen_done == [False]

        # Payload locations point at the bytes in the log.
        assert read_all(j, state, B, "s") == b"start" + b"".join(b"%02d" % i for i in range(25)) + b"xy"
        await j.flushed()
        await j.close()

    run(main())


def test_flushed_waits_for_everything_appended(tmp_path: Path) -> None:
    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        await j.flushed()  # nothing pending: returns at once
        w = Writer(j, state)
        futs = [w.create(f"s{i}", b"d") for i in range(5)]
        await j.flushed()
        assert all(f is not None and f.done() for f in futs)
        assert j.log.pending_bytes == 0
        await j.close()

    run(main())


def test_recover_after_close_replays_everything(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        history_one(w)
        await j.flushed()
        history_two(w)
        history_three(w)
        await j.flushed()
        final["fp"] = fingerprint(state)
        final["json"] = read_all(j, state, B, "json")
        final["branch"] = read_all(j, state, B, "branch")
        final["n"] = len(w.records)
        await j.close()  # no state: no snapshot

    run(main())
    assert snapshot_files(tmp_path) == []
    j2 = make_journal(tmp_path)
    recovered = j2.recover()
    assert fingerprint(recovered) == final["fp"]
    assert read_all(j2, recovered, B, "json") == final["json"]
    assert read_all(j2, recovered, B, "branch") == b"o1;b1;b2;"
    assert final["branch"] == b"o1;b1;b2;"
    j2.log.close()


def test_recovery_across_rolled_segments(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(tmp_path, segment_bytes=256)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        w.create("s")
        for i in range(60):
            w.append("s", b"record-%03d|" % i, now=i)
            if i % 7 == 0:
                await j.flushed()
        await j.flushed()
        final["fp"] = fingerprint(state)
        final["data"] = read_all(j, state, B, "s")
        await j.close()

    run(main())
    assert len(list((tmp_path / "hot").glob("*.seg"))) > 5
    j2 = make_journal(tmp_path, segment_bytes=256)
    recovered = j2.recover()
    assert fingerprint(recovered) == final["fp"]
    assert (
        read_all(j2, recovered, B, "s") == final["data"] == b"".join(b"record-%03d|" % i for i in range(60))
    )
    j2.log.close()


def test_torn_tail_after_crash_loses_only_the_unacknowledged_record(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        history_one(w)
        await j.flushed()
        final["fp"] = fingerprint(state)
        await j.close()

    run(main())
    # A crash in the middle of writing the next batch: its marker, then the record, cut short.
    seg = tmp_path / "hot" / segment_name(1)
    record = frame(encode_record(StreamDeleted(uid=1, ts_ms=99)))
    torn = (marker_frame(MARKER_FRAME_SIZE + len(record)) + record)[:-2]
    with open(seg, "ab") as f:
        f.write(torn)
    j2 = make_journal(tmp_path)
    assert fingerprint(j2.recover()) == final["fp"]
    j2.log.close()


def test_data_location_is_the_payload_tail_of_the_body() -> None:
    rec = Appended(
        uid=1, offset=0, ts_ms=0, producer=None, epoch=0, seq=0, stream_seq=None, close=False, data=b"PAYLOAD"
    )
    body = encode_record(rec)
    loc = data_location(rec, LogPosition(3, 100), len(body))
    assert loc == (3, 100 + len(body) - 7)
    assert body[loc[1] - 100 :] == b"PAYLOAD"
    empty = Appended(
        uid=1, offset=0, ts_ms=0, producer=None, epoch=0, seq=0, stream_seq=None, close=True, data=b""
    )
    assert data_location(empty, LogPosition(3, 100), 10) is None
    assert data_location(StreamDeleted(uid=1, ts_ms=0), LogPosition(3, 100), 10) is None
    created = StreamCreated(2, B, "p", "a/b", None, None, None, False, 0, None, 0, None, b"xyz")
    body = encode_record(created)
    assert data_location(created, LogPosition(1, 8 + FRAME_SIZE), len(body)) == (
        1,
        8 + FRAME_SIZE + len(body) - 3,
    )


# --------------------------------------------------------------------------- snapshots + journal


def test_snapshot_then_more_appends_then_recover(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        history_one(w)
        history_two(w)
        pos = j.log.end
        await j.snapshot(state)
        assert j.bytes_since_snapshot == 0
        final["pos"] = pos
        history_three(w)
        await j.flushed()
        final["tail_bytes"] = j.bytes_since_snapshot
        final["fp"] = fingerprint(state)
        final["json"] = read_all(j, state, B, "json")
        await j.close()

    run(main())
    files = snapshot_files(tmp_path)
    assert len(files) == 1
    assert SnapshotStore(tmp_path / "snapshots", SNAPSHOTS).floor_position() == final["pos"]
    j2 = make_journal(tmp_path)
    recovered = j2.recover()
    assert fingerprint(recovered) == final["fp"]
    # Only the records after the snapshot were replayed.
    assert j2.bytes_since_snapshot == final["tail_bytes"] > 0
    assert read_all(j2, recovered, B, "json") == final["json"]
    j2.log.close()


def test_close_with_state_snapshots_so_recovery_replays_nothing(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        history_one(w)
        history_two(w)
        final["fp"] = fingerprint(state)
        await j.close(state)

    run(main())
    assert len(snapshot_files(tmp_path)) == 1
    j2 = make_journal(tmp_path)
    recovered = j2.recover()
    assert j2.bytes_since_snapshot == 0
    assert fingerprint(recovered) == final["fp"]
    j2.log.close()


def test_recovered_journal_keeps_appending(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def session(extra: Callable[[Writer], None], snapshot: bool) -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        extra(w)
        await j.flushed()
        final["fp"] = fingerprint(state)
        await j.close(state if snapshot else None)

    run(session(history_one, True))
    run(session(history_two, False))
    run(session(history_three, True))
    j = make_journal(tmp_path)
    recovered = j.recover()
    assert fingerprint(recovered) == final["fp"]
    assert read_all(j, recovered, B, "branch") == b"o1;b1;b2;"
    j.log.close()


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _two_snapshot_history(root: Path) -> dict[str, Any]:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(root)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        history_one(w)
        await j.snapshot(state)
        history_two(w)
        await j.snapshot(state)
        history_three(w)
        await j.flushed()
        final["fp"] = fingerprint(state)
        await j.close()

    run(main())
    assert len(snapshot_files(root)) == 2
    return final


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "empty file", "bad magic"])
def test_corrupt_newest_snapshot_falls_back_to_the_older(tmp_path: Path, damage: str) -> None:
    final = _two_snapshot_history(tmp_path)
    newest = snapshot_files(tmp_path)[-1]
    if damage == "flip a byte":
        _flip_last_byte(newest)
    elif damage == "truncate":
        newest.write_bytes(newest.read_bytes()[:20])
    elif damage == "empty file":
        newest.write_bytes(b"")
    else:
        newest.write_bytes(b"XXXX" + newest.read_bytes()[4:])
    j = make_journal(tmp_path)
    recovered = j.recover()
    assert fingerprint(recovered) == final["fp"]
    j.log.close()


def test_all_snapshots_corrupt_raises(tmp_path: Path) -> None:
    _two_snapshot_history(tmp_path)
    for f in snapshot_files(tmp_path):
        _flip_last_byte(f)
    j = make_journal(tmp_path)
    with pytest.raises(SnapshotError, match="no snapshot verifies"):
        j.recover()


# --------------------------------------------------------------------------- durability modes and failure


def test_interval_fsync_mode_acknowledges_and_syncs(tmp_path: Path) -> None:
    final: dict[str, Any] = {}

    async def main() -> None:
        j = make_journal(tmp_path, fsync="interval", fsync_interval_ms=5)
        assert not j.fsync_always
        state = j.recover()
        j.start()
        w = Writer(j, state)
        acked: list[str] = []
        w.create("s", b"a")
        fut = w.append("s", b"b", on_durable=lambda: acked.append("b"))
        assert fut is not None
        await fut
        assert acked == ["b"]
        # The periodic sync catches up with the written-but-unsynced batch.
        for _ in range(200):
            if not j._dirty_since_sync:
                break
            await asyncio.sleep(0.005)
        assert not j._dirty_since_sync
        final["fp"] = fingerprint(state)
        await j.close()

    run(main())
    j2 = make_journal(tmp_path)
    assert fingerprint(j2.recover()) == final["fp"]
    j2.log.close()


def test_unknown_fsync_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        make_journal(tmp_path, fsync="sometimes")


def test_write_failure_fails_the_batch_and_the_journal(tmp_path: Path) -> None:
    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover()
        j.start()
        w = Writer(j, state)
        await w.create("s", b"ok")  # type: ignore[misc]

        def broken(batch: Any, *, sync: bool) -> None:
            raise OSError(28, "No space left on device")

        j.log.write_batch = broken  # type: ignore[method-assign]
        called: list[int] = []
        fut = w.append("s", b"lost", on_durable=lambda: called.append(1))
        assert fut is not None
        with pytest.raises(JournalFailed, match="No space left"):
            await fut
        assert called == []
        assert isinstance(j.failed, OSError)
        with pytest.raises(JournalFailed):
            j.append(StreamDeleted(uid=1, ts_ms=0))
        await j.close(state)  # must not hang or try to snapshot

    run(main())
    assert snapshot_files(tmp_path) == []


# --------------------------------------------------------------------------- SnapshotStore and the format


def _state_with_data() -> StreamState:
    state = StreamState()
    records, _ = state.decide_create(B, "s", CreateRequest(None, 60, None, None, False, b"abc"), 5)
    state.apply(records[0], (1, 40))
    state.apply(Appended(1, 3, 6, "p", 2, 7, "q", True, b"de"), (1, 90))
    return state


def test_snapshot_round_trip_of_one_state() -> None:
    state = _state_with_data()
    data = encode_snapshot(state, LogPosition(4, 512))
    restored, pos = decode_snapshot(data)
    assert pos == LogPosition(4, 512)
    assert fingerprint(restored) == fingerprint(state)
    s = restored.streams[1]
    assert s.closed_by == ("p", 2, 7) and isinstance(s.closed_by, tuple)
    assert s.touch_journaled_ms == s.last_access_ms
    assert restored.hot_bytes == 5


def test_incarnations_and_path_history_round_trip_through_a_snapshot() -> None:
    state = StreamState()
    for now, data in ((1, b"abc"), (2, b"defgh")):
        records, _ = state.decide_create(B, "s", CreateRequest(None, None, None, None, False, data), now)
        state.apply(records[0], (1, 40 * now))
        state.apply(state.decide_delete(B, "s", now))
    records, _ = state.decide_create(B, "s", CreateRequest(None, None, None, None, False, b"xy"), 3)
    state.apply(records[0], (1, 200))
    s = state.find(B, "s")
    assert s is not None and (s.incarnation, s.fork_offset, s.tail) == (2, 10, 12)  # above 0..3, then 4..9
    assert state.path_history == {(B, "s"): (2, 9)}
    restored, _ = decode_snapshot(encode_snapshot(state, LogPosition(1, 8)))
    assert fingerprint(restored) == fingerprint(state)


#: A stream's fields in a version-3 snapshot: ``uid`` to ``last_access_ms`` (version 4 added ``incarnation``).
V3_STREAM_FIELDS = 27


def _as_version_3(data: bytes) -> bytes:
    """A snapshot as a version-3 server wrote it: no incarnations, no path history."""
    body = msgspec.msgpack.decode(data[12:])
    body[4] = [stream[:V3_STREAM_FIELDS] for stream in body[4]]  # StreamSnap without ``incarnation``
    del body[-1]  # StateSnap without ``path_history``
    raw = msgspec.msgpack.encode(body)
    return data[:4] + (3).to_bytes(4, "little") + crc32c(raw).to_bytes(4, "little") + raw


def test_a_version_3_snapshot_still_loads_as_first_incarnations() -> None:
    state = _state_with_data()
    old = _as_version_3(encode_snapshot(state, LogPosition(4, 512)))
    restored, pos = decode_snapshot(old)
    assert pos == LogPosition(4, 512)
    assert all(s.integrity is None for s in restored.streams.values())  # nor integrity digests, then
    for s in state.streams.values():
        s.integrity = None
    assert fingerprint(restored) == fingerprint(state)  # every stream its path's first, no history
    assert restored.streams[1].incarnation == 0 and restored.path_history == {}


def test_a_journal_written_before_incarnations_replays_with_its_offsets(tmp_path: Path) -> None:
    """Old servers created a stream again at offset 0: replay keeps those offsets (the record says so),
    counts the incarnation, and the next stream at the path starts above all of them."""

    async def main() -> None:
        journal = make_journal(tmp_path)
        state = journal.recover()
        journal.start()
        legacy = [
            StreamCreated(1, B, "s", "text/plain", None, None, None, False, 1, None, 0, None, b"first"),
            StreamDeleted(1, 2),
            StreamCreated(2, B, "s", "text/plain", None, None, None, False, 3, None, 0, None, b"again"),
        ]
        fut = None
        for r in legacy:
            fut, loc = journal.append(r)
            state.apply(r, loc)
        assert fut is not None
        await fut
        await journal.close(None)

        journal = make_journal(tmp_path)
        state = journal.recover()
        journal.start()
        s = state.find(B, "s")
        assert s is not None and (s.uid, s.fork_offset, s.tail, s.incarnation) == (2, 0, 5, 1)
        assert read_all(journal, state, B, "s") == b"again"
        w = Writer(journal, state)
        w.delete("s", now=4)
        w.create("s", b"third", now=5)
        s = state.find(B, "s")
        assert s is not None and (s.fork_offset, s.incarnation) == (6, 2)  # above both streams' 0..5
        await journal.close(None)

    run(main())


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: b"NOPE" + d[4:],
        lambda d: d[:4] + (SNAPSHOT_VERSION + 1).to_bytes(4, "little") + d[8:],
        lambda d: d[:-1] + bytes([d[-1] ^ 1]),
    ],
    ids=["magic", "version", "checksum"],
)
def test_decode_snapshot_rejects_damage(mangle: Callable[[bytes], bytes]) -> None:
    data = encode_snapshot(_state_with_data(), LogPosition(1, 8))
    with pytest.raises(ValueError):
        decode_snapshot(mangle(data))


def test_snapshot_store_keeps_the_newest_two(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps", SNAPSHOTS, keep=2)
    assert store.load_latest() is None
    assert store.floor_position() is None
    state = _state_with_data()
    for seg, off in [(1, 100), (1, 900), (2, 50)]:
        path = store.write(encode_snapshot(state, LogPosition(seg, off)), LogPosition(seg, off))
        assert path.exists()
    names = [p.name for p in sorted((tmp_path / "snaps").iterdir())]
    assert names == [
        "snapshot-00000000000000000001-000000000900.bin",
        "snapshot-00000000000000000002-000000000050.bin",
    ]
    # Replay starts at the newest (verified at write) snapshot.
    assert store.floor_position() == LogPosition(2, 50)
    loaded = store.load_latest()
    assert loaded is not None and loaded[1] == LogPosition(2, 50)
    # Leftover temp files from a crash mid-write are ignored.
    (tmp_path / "snaps" / "snapshot-00000000000000000009-000000000000.bin.tmp").write_bytes(b"partial")
    loaded = store.load_latest()
    assert loaded is not None and loaded[1] == LogPosition(2, 50)


def test_snapshot_store_on_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "snaps").mkdir()
    store = SnapshotStore(tmp_path / "snaps", SNAPSHOTS)
    assert store.load_latest() is None
    os.rmdir(tmp_path / "snaps")
    assert store.load_latest() is None


def test_snapshot_round_trip_keeps_a_freed_path_free() -> None:
    state = StreamState()
    loc = iter(range(100, 10_000, 100))

    def commit(records: list[Record]) -> None:
        for r in records:
            state.apply(r, (1, next(loc)) if getattr(r, "data", b"") else None)

    def create(path: str, now: int, **kw: Any) -> None:
        req = CreateRequest(
            kw.get("content_type"), kw.get("ttl_s"), None, None, False, kw.get("data", b""), kw.get("fork")
        )
        records, _ = state.decide_create(B, path, req, now)
        commit(records)

    create("a", 0, ttl_s=10, data=b"abc")
    a = state.find(B, "a")
    assert a is not None
    create("fork", 1, fork=ForkRequest(a.uid, 2, "a@2"), ttl_s=1000)
    create("a", 20_000, data=b"new")  # StreamExpired(old a: soft, has a fork) + StreamCreated
    commit([state.decide_delete(B, "a", 20_001)])
    assert (B, "a") not in state.paths
    with pytest.raises(TieredError) as live:
        state.lookup(B, "a", 20_002)
    assert live.value.code is ErrorCode.STREAM_NOT_FOUND

    restored, _ = decode_snapshot(encode_snapshot(state, LogPosition(1, 8)))
    assert restored.paths == state.paths


def test_producer_expiry_and_cap_survive_snapshots_and_replay(tmp_path: Path) -> None:
    """Producer states (their order, times and cost), expiries and evictions: the same after recovery.

    Half the history is in the snapshot, half replayed after it; the GC's ``ProducersExpired``
    record is replayed too. Recovery needs the same limits (they are configuration).
    """
    from tiered.engine.streams.producers import ProducerLimits
    from tiered.engine.streams.records import ProducersExpired

    limits = ProducerLimits(ttl_ms=1_000, max_per_stream=3)
    final: dict[str, Any] = {}

    def order(state: StreamState) -> dict[str, list[tuple[str, int, int, int]]]:
        return {
            s.path: [(k, p.epoch, p.last_seq, p.last_ms) for k, p in s.producers.items()]
            for s in state.streams.values()
        }

    async def main() -> None:
        j = make_journal(tmp_path)
        state = j.recover(new_state=lambda: StreamState(producer_limits=limits))
        j.start()
        w = Writer(j, state)
        w.create("a", now=0)
        w.create("idle", now=0)
        for t, pid in enumerate(("p1", "p2", "p3")):
            w.append("a", b"x", now=t, producer=pid, epoch=0, seq=0)
        w.append("idle", b"x", now=0, producer="q", epoch=0, seq=0)
        await j.snapshot(state)
        w.append("a", b"x", now=10, producer="p1", epoch=0, seq=1)  # p1 is the most recent
        w.append("a", b"x", now=20, producer="p4", epoch=0, seq=0)  # evicts p2 (the longest idle)
        w.append("a", b"x", now=1_005, producer="p5", epoch=0, seq=0)  # p3 expired
        idle = state.find(B, "idle")
        assert idle is not None
        record = ProducersExpired(ts_ms=1_000, uids=(idle.uid,))
        w.commit([record])
        await j.flushed()
        final["order"] = order(state)
        final["fp"] = fingerprint(state)
        await j.close()

    run(main())
    assert final["order"] == {
        "a": [("p1", 0, 1, 10), ("p4", 0, 0, 20), ("p5", 0, 0, 1_005)],
        "idle": [],
    }
    j2 = make_journal(tmp_path)
    recovered = j2.recover(new_state=lambda: StreamState(producer_limits=limits))
    assert order(recovered) == final["order"]
    assert fingerprint(recovered) == final["fp"]
    a = recovered.find(B, "a")
    assert a is not None and a.producer_bytes == 3 * (2 + 24)
    j2.log.close()
