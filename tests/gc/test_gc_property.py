"""Property-based test of GC safety and completeness, on the real service.

Hypothesis draws short sequences of operations and runs them against a real
``StreamService`` (journal, segment log, local-dir object store) on a fresh data dir,
with the flusher and GC driven by hand and a virtual clock:

    create (in a few buckets, some with a TTL), append, fork (across buckets, at any byte
    offset), flush, retain (admin, any offset), retention policy (bucket or stream, by age
    and/or bytes), time passing (TTL expiry, grace delays), delete, bucket erasure, GC
    pass, GC pass with reconciliation, restart (clean or crash).

After every step (safety): every stream the model says is live is found, has the model's
tail and retained offset, and every byte from its retained offset to its tail reads back
byte-exact; a stream the model says is gone is not found. After a GC pass the retained
offsets the policies moved are checked against the policies: never backwards, only to a
record boundary, never past a record younger than the age limit, and exactly to the greatest
record boundary that keeps at least the byte limit.

At the end (no leaks): every bucket erased and every default-bucket stream deleted, the
grace delay passed, GC plus reconciliation leaves ZERO objects under the data prefix, no
cold object or stream in the metadata, and no hot segment but the active one.

Two known bugs are kept out of the random sequences, each with its own strict-xfail test:
re-creating a path whose expired stream still has live forks (below), and forking a stream
whose retained offset has moved (``test_gc_retention.py``). Everything else the operations
can reach is fair game.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as _event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tests.support.error_helpers import http_status
from tests.support.gc_support import (
    Harness,
    VirtualClock,
    make_config,
    object_files,
    segment_ids,
)
from tiered.core.errors import ErrorCode
from tiered.core.errors import TieredError as StreamError

pytestmark = pytest.mark.timeout(300)


def event(text: str) -> None:
    """hypothesis.event, but harmless in the fixed-sequence test (outside @given)."""
    try:
        _event(text)
    except InvalidArgument:
        pass


BUCKETS = ["default", "red", "green", "blue"]
PATHS = ["p0", "p1", "dir/p2", "p3"]
GRACE_MS = 10_000


@dataclass
class Rec:
    start: int
    end: int
    ts: int


@dataclass
class MStream:
    bucket: str
    path: str
    data: bytearray  # the bytes from offset ``base`` on
    ttl_s: int | None
    last_access: int
    created: int
    records: list[Rec] = field(default_factory=list)  # a fork's inherited range is its first "record"
    retained: int = 0
    policy: tuple[int | None, int | None] = (None, None)
    base: int = 0  # the first offset: above every offset its path issued before (a fork: its source's)

    @property
    def tail(self) -> int:
        return self.base + len(self.data)

    def at(self, offset: int) -> int:
        """The index in ``data`` of a stream offset."""
        return offset - self.base


class Model:
    def __init__(self) -> None:
        self.streams: list[MStream] = []  # live (not deleted, not erased; may be expired)
        self.gone: list[tuple[str, str]] = []  # (bucket, path) of streams that went away
        self.erased: set[str] = set()
        self.bucket_policy: dict[str, tuple[int | None, int | None]] = {}
        self.counter = 0
        self.fence: dict[tuple[str, str], int] = {}  # the highest offset each path issued before

    def next_base(self, bucket: str, path: str) -> int:
        """Where a plain stream created at the path starts: one above every offset it issued before."""
        fence = self.fence.get((bucket, path))
        return 0 if fence is None else fence + 1

    def live(self, now: int) -> list[MStream]:
        return [s for s in self.streams if not self.expired(s, now)]

    @staticmethod
    def expired(s: MStream, now: int) -> bool:
        return s.ttl_s is not None and now >= s.last_access + s.ttl_s * 1000

    def find(self, bucket: str, path: str) -> MStream | None:
        for s in self.streams:
            if (s.bucket, s.path) == (bucket, path):
                return s
        return None

    def drop(self, s: MStream) -> None:
        self.streams.remove(s)
        self.gone.append((s.bucket, s.path))
        key = (s.bucket, s.path)
        self.fence[key] = max(self.fence.get(key, -1), s.tail)

    def payload(self, n: int) -> bytes:
        self.counter += 1
        unit = f"<{self.counter}:".encode() + bytes([self.counter % 256]) * 3
        return (unit * (n // len(unit) + 1))[:n]

    def effective_policy(self, s: MStream) -> tuple[int | None, int | None]:
        if s.policy != (None, None):
            return s.policy
        return self.bucket_policy.get(s.bucket, (None, None))


sizes = st.one_of(st.integers(1, 300), st.integers(1, 300), st.integers(60_000, 200_000))
pick = st.integers(0, 63)
create_op = st.tuples(
    st.just("create"),
    st.integers(0, 3),
    st.integers(0, 3),
    st.one_of(st.just(0), sizes),
    st.sampled_from([None, None, 5, 60]),
)
append_op = st.tuples(st.just("append"), pick, sizes)
ops = st.one_of(
    create_op,
    append_op,
    append_op,
    append_op,
    st.tuples(st.just("fork"), pick, st.integers(0, 3), st.integers(0, 3), st.integers(0, 1000)),
    st.tuples(st.just("fork"), pick, st.integers(0, 3), st.integers(0, 3), st.integers(0, 1000)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("flush")),
    st.tuples(st.just("retain"), pick, st.integers(0, 1000)),
    st.tuples(
        st.just("policy"),
        st.integers(0, 3),
        st.one_of(st.none(), pick),
        st.sampled_from([None, 2_000, 30_000]),
        st.sampled_from([None, 0, 100, 5_000, 150_000]),
    ),
    st.tuples(st.just("advance"), st.sampled_from([1_000, 4_000, 11_000, 70_000])),
    st.tuples(st.just("advance"), st.sampled_from([1_000, 4_000, 11_000, 70_000])),
    st.tuples(st.just("bulk"), pick),
    st.tuples(st.just("delete"), pick),
    st.tuples(st.just("erase"), st.integers(1, 3)),
    st.tuples(st.just("gc"), st.booleans()),
    st.tuples(st.just("gc-after-grace"), st.booleans()),
    st.tuples(st.just("restart"), st.booleans()),
)


class Run:
    def __init__(self, data_dir: Path, clock: VirtualClock) -> None:
        self.config = make_config(data_dir, gc_grace_s=GRACE_MS / 1000)
        self.clock = clock
        self.h = Harness(self.config, clock=clock)
        self.m = Model()
        self.log: list[str] = []
        self.done: list[str] = []  # kinds of operations that changed something (for statistics)

    # ------------------------------------------------------------------ checks

    async def check(self) -> None:
        now = self.clock.ms
        svc = self.h.s
        for ms in self.m.live(now):
            s = svc.streams.lookup(ms.bucket, ms.path)
            assert s.tail == ms.tail, (ms.bucket, ms.path, s.tail, ms.tail)
            assert s.retained_from == ms.retained, (ms.bucket, ms.path, s.retained_from, ms.retained)
            got = await svc.streams.read(s, ms.retained, svc.streams.view(s).tail)
            assert got == bytes(ms.data[ms.at(ms.retained) :]), (ms.bucket, ms.path, "bytes differ")
        live = {(s.bucket, s.path) for s in self.m.live(now)}
        for bucket, path in self.m.gone + [
            (s.bucket, s.path) for s in self.m.streams if self.m.expired(s, now)
        ]:
            if (bucket, path) in live:
                continue
            with pytest.raises(StreamError) as err:
                svc.streams.lookup(bucket, path)
            assert http_status(err.value) in (404, 410)

    def check_policy_moves(self, now: int) -> None:
        """Retained offsets a GC pass moved: by the policies' rules only."""
        for ms in self.m.live(now):
            old = ms.retained
            s = self.h.s.streams.lookup(ms.bucket, ms.path)
            new = s.retained_from
            assert old <= new <= ms.tail, (ms.path, old, new)
            age, size = self.m.effective_policy(ms)
            if new != old:
                assert age is not None or size is not None, (ms.path, "moved without a policy")
                boundaries = {old, ms.tail} | {r.start for r in ms.records} | {r.end for r in ms.records}
                assert new in boundaries, (ms.path, new, "not a record boundary")
            if age is not None and size is None:  # (with both, the byte limit may release more)
                cutoff = now - age
                for r in ms.records:
                    if r.ts >= cutoff and r.start >= old:
                        assert new <= r.start, (ms.path, "released a record younger than the age limit")
            if size is not None:
                # At least the newest `size` bytes stay: the greatest record boundary at or below the target.
                target = ms.tail - size
                boundaries = {old, ms.tail} | {r.start for r in ms.records} | {r.end for r in ms.records}
                want = old if target <= old else max(b for b in boundaries if old <= b <= target)
                if age is None:
                    assert new == want, (
                        ms.path,
                        new,
                        want,
                        "size retention must keep at least the limit, exactly",
                    )
                else:
                    assert new >= want, (ms.path, new, want, "the byte limit releases at least this much")
            ms.retained = new

    # ------------------------------------------------------------------ ops

    def pick(self, i: int) -> MStream | None:
        live = self.m.live(self.clock.ms)
        return live[i % len(live)] if live else None

    def path_free(self, bucket: str, path: str) -> bool:
        """Whether a create at (bucket, path) can make a new stream (and stays clear of a known bug)."""
        if self.m.find(bucket, path) is not None and not self.m.expired(
            self.m.find(bucket, path), self.clock.ms
        ):
            return False
        held = self.h.s.state.find(bucket, path)
        if held is None:
            return True
        if held.soft_deleted:
            return False  # 409: a deleted stream with live forks holds the path
        # Expired, not yet collected. With live forks, re-creating it hits the known bug below.
        return held.forks == 0

    async def op(self, op: tuple) -> None:  # type: ignore[type-arg]
        if await self._op(op):
            self.done.append(
                op[0] if op[0] not in ("gc", "gc-after-grace", "restart") else f"{op[0]} {op[1]}"
            )

    async def _op(self, op: tuple) -> bool | None:  # type: ignore[type-arg]
        svc, m, now = self.h.s, self.m, self.clock.ms
        kind = op[0]
        self.log.append(repr(op))
        if kind == "create":
            _, b, p, n, ttl = op
            bucket, path = BUCKETS[b], PATHS[p]
            if bucket in m.erased:
                with pytest.raises(StreamError) as err:
                    await self.h.create(bucket, path, b"x")
                assert http_status(err.value) == 409
                return
            if not self.path_free(bucket, path):
                return
            old = m.find(bucket, path)
            if old is not None:
                m.drop(old)  # expired; the create journals its expiry first
            data = m.payload(n) if n else b""
            s = await self.h.create(bucket, path, data, ttl_s=ttl)
            base = m.next_base(bucket, path)
            assert s.fork_offset == base, (bucket, path, s.fork_offset, base)
            ms = MStream(bucket, path, bytearray(data), ttl, now, now, retained=base, base=base)
            if data:
                ms.records.append(Rec(base, base + len(data), now))
            m.streams.append(ms)
        elif kind == "append":
            _, i, n = op
            ms = self.pick(i)
            if ms is None:
                return
            data = m.payload(n)
            start = ms.tail
            await self.h.append(ms.bucket, ms.path, data)
            ms.data += data
            ms.records.append(Rec(start, ms.tail, now))
            ms.last_access = now
        elif kind == "bulk":  # enough data to roll hot segments (1 MiB each)
            ms = self.pick(op[1])
            if ms is None:
                return
            for _ in range(5):
                data = m.payload(250_000)
                start = ms.tail
                await self.h.append(ms.bucket, ms.path, data)
                ms.data += data
                ms.records.append(Rec(start, ms.tail, now))
            ms.last_access = now
        elif kind == "fork":
            _, i, b, p, permille = op
            src = self.pick(i)
            bucket, path = BUCKETS[b], PATHS[p]
            if src is None or bucket in m.erased or not self.path_free(bucket, path):
                return
            if src.retained > src.base:
                return  # the known bug of test_fork_below_the_source_retention_* (test_gc_retention.py)
            old = m.find(bucket, path)
            if old is src:
                return
            fence = m.fence.get((bucket, path))
            if old is not None:
                fence = max(old.tail, -1 if fence is None else fence)
            offset = src.base + len(src.data) * permille // 1000
            if fence is not None and src.base <= fence:
                # The fork would serve offsets the path issued before: refused, nothing changes.
                with pytest.raises(StreamError) as err:
                    await self.h.create(bucket, path, fork_from=(src.bucket, src.path), fork_offset=offset)
                assert err.value.code is ErrorCode.PATH_OFFSETS_USED
                return
            if old is not None:
                m.drop(old)
            await self.h.create(bucket, path, fork_from=(src.bucket, src.path), fork_offset=offset)
            inherited = src.data[: src.at(offset)]
            ms = MStream(
                bucket, path, bytearray(inherited), src.ttl_s, now, now, retained=src.base, base=src.base
            )
            if offset > src.base:
                ms.records.append(Rec(src.base, offset, now))  # inherited: one unit, as old as the fork
            m.streams.append(ms)
        elif kind == "flush":
            await self.h.flush()
        elif kind == "retain":
            _, i, permille = op
            ms = self.pick(i)
            if ms is None:
                return
            offset = ms.base + len(ms.data) * permille // 1000
            s = await svc.streams.retain_from(ms.bucket, ms.path, offset)
            ms.retained = max(ms.retained, offset)
            assert s.retained_from == ms.retained
        elif kind == "policy":
            _, b, i, age, size = op
            bucket = BUCKETS[b]
            if i is None:
                if bucket in m.erased:
                    return
                await svc.streams.set_retention(bucket, None, age, size)
                m.bucket_policy[bucket] = (age, size)
            else:
                ms = self.pick(i)
                if ms is None:
                    return
                await svc.streams.set_retention(ms.bucket, ms.path, age, size)
                ms.policy = (age, size)
        elif kind == "advance":
            self.clock.advance(op[1])
        elif kind == "delete":
            ms = self.pick(op[1])
            if ms is None:
                return
            await svc.streams.delete(ms.bucket, ms.path)
            m.drop(ms)
        elif kind == "erase":
            bucket = BUCKETS[op[1]]
            if bucket in m.erased:
                with pytest.raises(StreamError) as err:
                    await svc.streams.erase_bucket(bucket)
                assert http_status(err.value) == 410
                return
            await svc.streams.erase_bucket(bucket)
            m.erased.add(bucket)
            m.bucket_policy.pop(bucket, None)
            for ms in [s for s in m.streams if s.bucket == bucket]:
                m.drop(ms)
        elif kind == "gc":
            await self.gc(now, reconcile=op[1])
        elif kind == "gc-after-grace":
            await self.gc(self.clock.advance(GRACE_MS + 1), reconcile=op[1])
        elif kind == "restart":
            await self.h.restart(crash=op[1])
        else:  # pragma: no cover
            raise AssertionError(kind)
        return True

    async def gc(self, now: int, *, reconcile: bool) -> None:
        for ms in [s for s in self.m.streams if self.m.expired(s, now)]:
            self.m.drop(ms)  # the pass journals their expiry
        report = await self.h.gc(now, reconcile=reconcile)
        assert report.errors == [] and report.integrity_errors == [], report
        if report.objects_deleted:
            self.done.append("gc deleting objects")
        if report.retention_advanced:
            self.done.append("gc advancing retention")
        if report.streams_expired:
            self.done.append("gc expiring streams")
        self.check_policy_moves(now)

    # ------------------------------------------------------------------ the end: no leaks

    async def finish(self) -> None:
        svc, m = self.h.s, self.m
        event(f"segments before the end: {min(len(segment_ids(self.config.data_path)), 3)}")
        event(f"objects before the end: {min(len(svc.state.cold_objects), 5)}")
        for bucket in BUCKETS[1:]:
            if bucket not in m.erased:
                await svc.streams.erase_bucket(bucket)
                m.erased.add(bucket)
        now = self.clock.ms
        for ms in list(m.streams):
            if ms.bucket == "default" and not m.expired(ms, now):
                await svc.streams.delete(ms.bucket, ms.path)
        for ms in list(m.streams):
            m.drop(ms)
        report = await self.h.gc(self.clock.ms)  # journals the expiry of streams whose TTL ran out
        assert report.errors == [] and report.integrity_errors == [], report
        self.clock.advance(GRACE_MS + 1)
        for _ in range(3):
            report = await self.h.gc(self.clock.ms, reconcile=True)
            assert report.errors == [] and report.integrity_errors == [], report
            await svc.journal.snapshot(svc.state)  # moves the replay floor past old segments
            svc.reaper._last_snapshot = float("-inf")
            assert svc.flusher is not None
            await svc.flusher.release_hot_copies()
        state = svc.state
        leaked = [s for s in state.streams.values()]
        assert leaked == [], [(s.bucket, s.path, s.soft_deleted, s.forks) for s in leaked]
        assert state.cold_objects == {} and state.copies_in_flight == {} and state.hot_bytes == 0
        assert object_files(self.config.data_path) == set()
        assert {i.key async for i in svc.store.list("data/")} == set()  # type: ignore[union-attr]
        active = svc.journal.log.end.segment
        assert segment_ids(self.config.data_path) == [active]
        await self.h.restart()
        assert self.h.s.state.streams == {} and self.h.s.state.cold_objects == {}
        await self.h.stop()


async def run_sequence(data_dir: Path, sequence: list[tuple]) -> None:  # type: ignore[type-arg]
    clock = VirtualClock()
    r = Run(data_dir, clock)
    await r.h.start()
    try:
        for b in BUCKETS[1:]:
            await r.h.bucket(b)
        for op in sequence:
            await r.op(op)
            await r.check()
        for name in sorted(set(r.done)):
            event(f"ran {name}")
        await r.finish()
    except BaseException:
        print("steps:\n  " + "\n  ".join(r.log))
        if r.h.node is not None:
            await r.h.crash()
        raise


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(prelude=st.lists(create_op, min_size=2, max_size=4), sequence=st.lists(ops, min_size=8, max_size=24))
def test_gc_never_loses_a_live_byte_and_leaves_nothing_behind(
    prelude: list[tuple], sequence: list[tuple]
) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run_sequence(Path(d) / "data", prelude + sequence))


def test_a_fixed_sequence_covering_every_operation(tmp_path: Path) -> None:
    """Every operation at least once, in an order that exercises forks across erased buckets."""
    sequence = [
        ("create", 1, 0, 500, None),
        ("create", 2, 1, 300, 60),
        ("append", 0, 70_000),
        ("flush",),
        ("fork", 0, 2, 2, 400),
        ("append", 2, 200),
        ("create", 0, 3, 100, 5),
        ("flush",),
        ("retain", 0, 300),
        ("policy", 2, None, None, 100),
        ("policy", 1, 0, 2_000, None),
        ("gc", False),
        ("advance", 4_000),
        ("append", 1, 150_000),
        ("gc", True),
        ("flush",),
        ("erase", 1),
        ("advance", 11_000),
        ("gc", True),
        ("restart", True),
        ("delete", 0),
        ("advance", 70_000),
        ("gc", True),
        ("restart", False),
        ("create", 1, 0, 10, None),
    ]
    asyncio.run(run_sequence(tmp_path / "data", sequence))


def test_recreated_path_of_an_expired_stream_with_a_live_fork_still_flushes(tmp_path: Path) -> None:
    clock = VirtualClock()
    h = Harness(make_config(tmp_path / "data"), clock=clock)

    async def body() -> None:
        await h.start()
        try:
            await h.create("default", "s", b"old-data-0123456789", ttl_s=5)
            await h.create("default", "f", fork_from=("default", "s"), ttl_s=3600)
            clock.advance(6_000)  # s expired; GC has not run yet
            await h.create("default", "s", b"new")
            await h.flush()  # raises ValueError: default/s: records not contiguous
            assert h.s.state.hot_bytes == 0
            assert await h.read("default", "f") == b"old-data-0123456789"
            assert await h.read("default", "s") == b"new"
        finally:
            await h.stop()

    asyncio.run(body())
