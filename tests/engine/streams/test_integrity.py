"""Integrity digests as journal state: equal to a model's after random appends, cold copies,
retention (cuts inside records too), deletes, re-creates, bucket erasure and restarts (journal
replay and snapshot round trips).

The model keeps every record appended to every stream incarnation and, for each, whether it is
hot or in which cold copy it went; retention releases hot records it reaches (a cut one whole) and
cold copies wholly below it. Its digests are computed with ``record_hash`` from the records' own
bytes, never from the state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.streams.test_state_machine import Harness
from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.record_digest import MASK, format_digest, record_hash
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams import integrity
from tiered.engine.streams.records import ColdCopyCommitted, CopyRange
from tiered.hot.log import LogPosition

BUCKETS = ("default", "other")
PATHS = ("a", "b/c")
INDEX = ChunkIndex(0, 0, (), ())


@dataclass
class Rec:
    start: int
    data: bytes
    group: int | None = None  # which cold copy holds it (None: hot)
    released: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.data)


@dataclass
class ModelStream:
    bucket: str
    path: str
    incarnation: int
    records: list[Rec] = field(default_factory=list)
    groups: dict[int, tuple[int, int]] = field(default_factory=dict)  # copy -> its range

    def digest(self, recs: list[Rec]) -> tuple[str, int, int]:
        total = sum(record_hash(self.bucket, self.path, self.incarnation, r.start, r.data) for r in recs)
        return format_digest(total & MASK), len(recs), sum(len(r.data) for r in recs)

    def retain(self, offset: int) -> None:
        for r in self.records:
            if r.released:
                continue
            if r.group is None and r.start < offset:
                r.released = True
            elif r.group is not None and self.groups[r.group][1] <= offset:
                r.released = True


class Run:
    def __init__(self) -> None:
        self.h = Harness()
        self.h.commit(self.h.state.decide_bucket("other", 0))
        self.model: dict[tuple[str, str], ModelStream] = {}
        self.incarnations: dict[tuple[str, str], int] = {}
        self.copies = 0

    def ensure(self, bucket: str, path: str) -> None:
        if (bucket, path) in self.model or bucket in self.h.state.erased_buckets:
            return
        self.h.create(path, bucket=bucket)
        s = self.h.stream(path, bucket)
        assert s.incarnation == self.incarnations.get((bucket, path), 0)
        self.model[(bucket, path)] = ModelStream(bucket, path, s.incarnation)

    def append(self, bucket: str, path: str, data: bytes) -> None:
        self.ensure(bucket, path)
        if (bucket, path) not in self.model:
            return
        s = self.h.stream(path, bucket)
        start = s.tail
        self.h.append(path, data, bucket=bucket)
        self.model[(bucket, path)].records.append(Rec(start, data))

    def copy(self, bucket: str, path: str, chunks: int) -> None:
        """What the flusher does: from the cold end, whole hot chunks (the first one's rest if cut)."""
        m = self.model.get((bucket, path))
        if m is None:
            return
        s = self.h.stream(path, bucket)
        c = s.chunks
        ends = [st + ln for st, ln in zip(c.starts, c.lens, strict=True) if st + ln > s.cold_end]
        if not ends:
            return
        end = ends[min(chunks, len(ends)) - 1]
        self.copies += 1
        key = f"o{self.copies}"
        r = CopyRange(s.uid, s.cold_end, end)
        self.h.commit([ColdCopyCommitted(key, 0, 1, 0, INDEX, (r,))])  # type: ignore[list-item]
        m.groups[self.copies] = (r.start, r.end)
        for rec in m.records:
            if not rec.released and rec.group is None and r.start <= rec.start and rec.end <= r.end:
                rec.group = self.copies

    def retain(self, bucket: str, path: str, fraction: float) -> None:
        m = self.model.get((bucket, path))
        if m is None:
            return
        s = self.h.stream(path, bucket)
        offset = s.retained_from + int((s.tail - s.retained_from) * fraction)
        self.h.commit(self.h.state.decide_retain(bucket, path, offset, 0))  # type: ignore[arg-type]
        m.retain(self.h.stream(path, bucket).retained_from)

    def delete(self, bucket: str, path: str) -> None:
        if (bucket, path) in self.model:
            self.h.delete(path, bucket=bucket)
            del self.model[(bucket, path)]
            self.incarnations[(bucket, path)] = self.incarnations.get((bucket, path), 0) + 1

    def erase(self) -> None:
        if "other" in self.h.state.buckets:
            self.h.commit([self.h.state.decide_erase_bucket("other", 0)])
            for key in [k for k in self.model if k[0] == "other"]:
                del self.model[key]

    def restart(self, snapshot: bool) -> None:
        if snapshot:
            self.h.state, _ = decode_snapshot(encode_snapshot(self.h.state, LogPosition(1, 0)))
        else:
            self.h.state = self.h.replay()

    def check(self) -> None:
        state = self.h.state
        for (bucket, path), m in self.model.items():
            s = self.h.stream(path, bucket)
            v = integrity.view(s)
            assert v is not None
            live = m.digest([r for r in m.records if not r.released])
            released = m.digest([r for r in m.records if r.released])
            total = m.digest(m.records)
            assert (format_digest(v.live), v.live_records, v.live_bytes) == live, (bucket, path)
            assert (format_digest(v.released), v.released_records, v.released_bytes) == released
            assert (format_digest(v.total), v.records, v.bytes) == total
        for bucket in BUCKETS:
            if bucket not in state.buckets:
                continue
            b = integrity.bucket_view(state, bucket)
            want = integrity.EMPTY
            for s, v in b.streams:
                assert v is not None and s.bucket == bucket
                want = want + v
            assert b.total == want
            assert {(bucket, s.path) for s, _ in b.streams} == {k for k in self.model if k[0] == bucket}


op = st.one_of(
    st.tuples(
        st.just("append"),
        st.sampled_from(BUCKETS),
        st.sampled_from(PATHS),
        st.binary(min_size=1, max_size=12),
    ),
    st.tuples(st.just("copy"), st.sampled_from(BUCKETS), st.sampled_from(PATHS), st.integers(1, 4)),
    st.tuples(st.just("retain"), st.sampled_from(BUCKETS), st.sampled_from(PATHS), st.floats(0, 1)),
    st.tuples(st.just("delete"), st.sampled_from(BUCKETS), st.sampled_from(PATHS)),
    st.tuples(st.just("erase")),
    st.tuples(st.just("restart"), st.booleans()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_digests_equal_the_models(ops: list[tuple[object, ...]]) -> None:
    run = Run()
    for name, *args in ops:
        getattr(run, str(name))(*args)
        run.check()
    # A replay of the whole journal and a snapshot round trip give the same digests.
    for snapshot in (False, True):
        run.restart(snapshot)
        run.check()


def test_a_retention_cut_releases_the_record_and_its_rest_counts_for_nothing() -> None:
    run = Run()
    run.append("default", "a", b"0123456789")
    run.append("default", "a", b"abc")
    run.retain("default", "a", 0.5)  # offset 6: inside the first record (a binary stream: not snapped)
    s = run.h.stream("a")
    assert s.retained_from == 6 and s.integrity is not None
    assert s.integrity.counted_from == 10 and s.integrity.released_records == 1
    run.copy("default", "a", 2)  # the flusher copies [6, 13): the first record's rest, then "abc"
    assert s.integrity.cold[6][1:] == (1, 3)
    run.check()


def test_streams_from_before_digests_are_left_alone() -> None:
    run = Run()
    run.append("default", "a", b"xyz")
    s = run.h.stream("a")
    s.integrity = None  # as a snapshot from before digests decodes
    run.h.append("a", b"more")
    run.h.commit(run.h.state.decide_retain("default", "a", 5, 0))  # type: ignore[arg-type]
    assert s.integrity is None and integrity.view(s) is None
    restored, _ = decode_snapshot(encode_snapshot(run.h.state, LogPosition(1, 0)))
    assert restored.streams[s.uid].integrity is None
