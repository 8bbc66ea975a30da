"""Property test: erasure rewrites against a model, with appends, flushes, retention, GC and restarts.

Hypothesis draws sequences over three buckets (two streams each) on the real engine (journal,
segment log, local-dir store, virtual clock; flusher and GC driven by hand): append, flush,
retain (any offset), erase a bucket, a GC pass at some time (the erasure rewrite runs in it),
a GC pass with reconciliation, time passing, a restart (clean or crash). After every step
every live stream reads exactly the model's bytes from its retained offset to its tail, and
an erased bucket's streams are gone. At the end, past the erasure deadline and the grace
delay: the erasure report has nothing overdue, every object left opened with pyarrow holds
no row of an erased bucket, ``tiered verify``'s cold checks pass, and the store holds
exactly the objects the metadata knows, each owned by some stream (no leak).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as _event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tests.support.gc_support import Harness, VirtualClock, make_config, object_files
from tiered.cli.verify import verify_cold, verify_erasure
from tiered.engine.jobs.rewrite_plan import erasure_report

pytestmark = pytest.mark.timeout(300)

BUCKETS = ("b0", "b1", "b2")
PATHS = ("s0", "s1")
GRACE_MS = 5_000
DEADLINE_MS = 600_000


def event(text: str) -> None:
    """hypothesis.event, but harmless in the fixed-sequence test (outside @given)."""
    try:
        _event(text)
    except InvalidArgument:
        pass


ops = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(BUCKETS), st.sampled_from(PATHS), st.integers(1, 700)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("retain"), st.sampled_from(BUCKETS), st.sampled_from(PATHS), st.floats(0, 1)),
    st.tuples(st.just("erase"), st.sampled_from(BUCKETS)),
    st.tuples(st.just("gc"), st.integers(0, 2 * GRACE_MS)),
    st.tuples(st.just("reconcile")),
    st.tuples(st.just("restart"), st.booleans()),
)


class Run:
    def __init__(self, data_dir: Path) -> None:
        self.clock = VirtualClock()
        self.config = make_config(data_dir, gc_grace_s=GRACE_MS / 1000, erasure_deadline_s=DEADLINE_MS / 1000)
        self.h = Harness(self.config, clock=self.clock)
        self.model: dict[tuple[str, str], bytearray] = {}
        self.retained: dict[tuple[str, str], int] = {}
        self.erased: set[str] = set()
        self.n = 0
        self.rewritten = 0  # objects the erasure rewrite rewrote (the fixed sequence checks it ran)

    def payload(self, size: int) -> bytes:
        self.n += 1
        return (f"<{self.n}:".encode() + bytes(range(256)) * 3)[:size]

    async def start(self) -> None:
        await self.h.start()
        for b in BUCKETS:
            await self.h.bucket(b)
            for p in PATHS:
                first = self.payload(100)
                await self.h.create(b, p, first)
                self.model[(b, p)] = bytearray(first)
                self.retained[(b, p)] = 0

    async def op(self, op: tuple) -> None:  # type: ignore[type-arg]
        h, kind = self.h, op[0]
        self.clock.advance(100)
        if kind == "append" and op[1] not in self.erased:
            data = self.payload(op[3])
            await h.append(op[1], op[2], data)
            self.model[(op[1], op[2])] += data
        elif kind == "flush":
            await h.flush()
        elif kind == "retain" and op[1] not in self.erased:
            want = int(len(self.model[(op[1], op[2])]) * op[3])
            s = await h.s.streams.retain_from(op[1], op[2], want)
            self.retained[(op[1], op[2])] = s.retained_from
        elif kind == "erase" and op[1] not in self.erased:
            await h.s.streams.erase_bucket(op[1])
            self.erased.add(op[1])
        elif kind == "gc":
            report = await h.gc(self.clock.ms + op[1], reconcile=False)
            self.rewritten += report.objects_rewritten
            assert report.errors == [] and report.integrity_errors == [], report
        elif kind == "reconcile":
            report = await h.gc(self.clock.ms, reconcile=True)
            self.rewritten += report.objects_rewritten
            assert report.errors == [] and report.integrity_errors == [], report
        elif kind == "restart":
            await h.restart(crash=op[1])
        await self.check()

    async def check(self) -> None:
        for (b, p), data in self.model.items():
            if b in self.erased:
                assert self.h.s.state.find(b, p) is None
                continue
            lo = self.retained[(b, p)]
            assert await self.h.read(b, p) == bytes(data[lo:]), (b, p)

    async def finish(self) -> None:
        h = self.h
        await h.flush()
        end = self.clock.ms + DEADLINE_MS
        for at in (self.clock.ms, self.clock.ms + GRACE_MS, end, end + GRACE_MS):
            report = await h.gc(at, reconcile=True)
            self.rewritten += report.objects_rewritten
            assert report.errors == [] and report.integrity_errors == [], report
        self.clock.ms = end + GRACE_MS
        await self.check()
        state = h.s.state
        assert erasure_report(state, self.clock.ms, DEADLINE_MS, GRACE_MS).overdue == []
        assert verify_erasure(state, self.config, self.clock.ms) == []
        assert (await verify_cold(state, h.s.store)).errors == []
        assert object_files(self.config.data_path) == set(state.cold_objects)
        assert all(o.refs > 0 for o in state.cold_objects.values())
        for key in object_files(self.config.data_path):
            buckets = set(pq.read_table(self.config.data_path / "cold" / key).column("bucket").to_pylist())
            assert not buckets & self.erased, (key, buckets)
        await h.restart(crash=True)
        await self.check()
        await h.stop()


async def run_sequence(data_dir: Path, sequence: list[tuple]) -> Run:  # type: ignore[type-arg]
    run = Run(data_dir)
    await run.start()
    try:
        for op in sequence:
            await run.op(op)
        await run.finish()
    finally:
        await run.h.stop()
    event(f"objects rewritten: {min(run.rewritten, 3)}")
    return run


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(ops, min_size=6, max_size=24))
def test_erasure_rewrites_keep_every_live_byte_and_leave_no_erased_byte(sequence: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run_sequence(Path(tmp) / "data", sequence))


def test_a_fixed_sequence_covering_every_operation(tmp_path: Path) -> None:
    sequence = [
        ("append", "b0", "s0", 500),
        ("append", "b1", "s1", 300),
        ("flush",),
        ("retain", "b1", "s0", 0.5),
        ("erase", "b0"),
        ("restart", True),
        ("append", "b1", "s0", 200),
        ("gc", 0),
        ("flush",),
        ("erase", "b2"),
        ("restart", False),
        ("gc", GRACE_MS),
        ("reconcile",),
        ("append", "b1", "s1", 50),
    ]
    run = asyncio.run(run_sequence(tmp_path / "data", sequence))
    assert run.rewritten >= 2  # b0's and b2's rows shared objects with b1's
