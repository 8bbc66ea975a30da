"""Large bodies stored by reference in the pure state machine: a model-based property test.

Random histories of hot appends, payload appends (``PayloadAppended``), flush
passes (planned by ``plan_flush``, committed as the flusher does), retention
and snapshot round trips. After every step every byte from the retained
offset to the tail reads back through ``plan_read`` as the model says, the
cold references stay sorted and contiguous up to ``cold_end``, and the hot
byte count and the objects' reference counts are what a fresh count gives.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered.cold.objects.payload import digest_of
from tiered.cold.parquet.chunk_index import ChunkIndex
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.jobs.flush_plan import plan_flush
from tiered.engine.snapshot import decode_snapshot, encode_snapshot
from tiered.engine.streams.model import AppendRequest, ColdSlice, CreateRequest, HotSlice
from tiered.engine.streams.records import (
    Appended,
    ColdCopyCommitted,
    CopyRange,
    PayloadAppended,
    RetentionAdvanced,
)
from tiered.engine.streams.release import hot_contribution
from tiered.engine.streams.state import StreamState
from tiered.hot.log import LogPosition

B = DEFAULT_BUCKET
OP = st.one_of(
    st.tuples(st.just("hot"), st.integers(1, 40)),
    st.tuples(st.just("payload"), st.integers(1, 120)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("retain"), st.integers(0, 100)),
    st.tuples(st.just("snapshot"), st.just(0)),
)


class World:
    def __init__(self) -> None:
        self.state = StreamState()
        self.disk = bytearray()  # hot record payloads, at (1, position)
        self.objects: dict[str, tuple[int, bytes]] = {}  # key -> (stream offset of byte 0, bytes)
        self.model = bytearray()
        self.now = 1_000
        self.n = 0
        created, _ = self.state.decide_create(
            B, "s", CreateRequest("application/octet-stream", None, None, None, False, b""), self.now
        )
        for r in created:
            self.state.apply(r)
        self.uid = self.state.find(B, "s").uid  # type: ignore[union-attr]

    def tick(self) -> int:
        self.now += 1
        return self.now

    def hot(self, size: int) -> None:
        data = os.urandom(size)
        record = self.state.decide_append(B, "s", AppendRequest(None, data, False), self.tick())
        assert isinstance(record, Appended)
        self.state.apply(record, (1, len(self.disk)))
        self.disk += data
        self.model += data

    def payload(self, size: int) -> None:
        data = os.urandom(size)
        s = self.state.streams[self.uid]
        self.n += 1
        key = f"data/p{self.n}.payload"
        self.objects[key] = (s.tail, data)
        record = PayloadAppended(
            uid=self.uid, offset=s.tail, ts_ms=self.tick(), producer=None, epoch=0, seq=0, stream_seq=None,
            close=False, data=b"", key=key, digest=digest_of(data, 16),
        )  # fmt: skip
        self.state.apply(record)
        self.model += data

    def flush(self) -> None:
        plans = plan_flush(self.state, lambda s: s.tail, target_bytes=1 << 20, max_pass_bytes=1 << 30)
        for pieces in plans:
            self.n += 1
            key = f"data/o{self.n}.parquet"
            [p] = pieces
            data = b"".join(bytes(self.disk[pos : pos + length]) for _, length, _, pos, _ in p.chunks)
            assert len(data) == p.end - p.start
            self.objects[key] = (p.start, data)
            index = ChunkIndex(file_size=len(data), footer_length=0, row_groups=(), streams=())
            self.state.apply(
                ColdCopyCommitted(
                    key=key, ts_ms=self.tick(), size=len(data), crc32c=0, index=index,
                    ranges=(CopyRange(self.uid, p.start, p.end),),
                )
            )  # fmt: skip

    def retain(self, percent: int) -> None:
        s = self.state.streams[self.uid]
        offset = s.retained_from + (s.tail - s.retained_from) * percent // 100
        if offset > s.retained_from:
            self.state.apply(RetentionAdvanced(ts_ms=self.tick(), advances=((self.uid, offset),)))

    def snapshot(self) -> None:
        self.state, _ = decode_snapshot(encode_snapshot(self.state, LogPosition(1, 0)))

    def check(self) -> None:
        state = self.state
        s = state.streams[self.uid]
        out = bytearray()
        for sl in state.plan_read(s, s.retained_from, s.tail):
            if isinstance(sl, HotSlice):
                out += self.disk[sl.position : sl.position + sl.length]
            else:
                assert isinstance(sl, ColdSlice)
                base, data = self.objects[sl.key]
                obj = state.cold_objects[sl.key]
                assert (obj.payload is not None) == sl.key.endswith(".payload")
                out += data[sl.start - base : sl.end - base]
        assert bytes(out) == bytes(self.model[s.retained_from :])
        starts = [r.start for r in s.cold_refs]
        assert starts == sorted(starts)
        below = [r for r in s.cold_refs if r.start < s.cold_end]
        for a, b in zip(below, below[1:], strict=False):
            assert a.end == b.start  # the cold prefix has no hole
        assert state.hot_bytes == sum(hot_contribution(x) for x in state.streams.values())
        refs: dict[str, int] = {}
        for ref in s.cold_refs:
            refs[ref.key] = refs.get(ref.key, 0) + 1
        assert {k: o.refs for k, o in state.cold_objects.items() if o.refs} == refs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OP, min_size=1, max_size=30))
def test_reads_and_accounting_follow_the_model(ops: list[tuple[str, int]]) -> None:
    w = World()
    for name, arg in ops:
        if name in ("flush", "snapshot"):
            getattr(w, name)()
        else:
            getattr(w, name)(arg)
        w.check()
    # A pass flushes the hot run up to the next body stored by reference (the cold prefix then settles
    # past that body): one pass per body, plus one, flushes everything; a payload never blocks the prefix.
    for _ in range(sum(1 for name, _ in ops if name == "payload") + 1):
        w.flush()
    w.check()
    s = w.state.streams[w.uid]
    assert s.cold_end == s.tail
