"""Stream snapshots on a real engine: the objects' lifecycle, crashes between every journaled step of a
publish, and a property test against a model.

* Lifecycle: a snapshot's object is owned by its stream; replacing the snapshot or deleting
  the stream releases it, GC deletes it once the grace delay has passed (never before), a
  restart (snapshot file or journal replay) recounts its owner.
* Crashes (the journal stops, then a restart on the same data dir, as in
  ``tests/gc/test_gc_faults.py``) after the intent, after the upload and after the
  commit: nothing acknowledged is lost, an unacknowledged publish leaves no snapshot, and
  after reconciliation no object is left that the metadata does not own.
* Property: random appends, snapshots (some retaining), retention, flushes to the cold tier,
  GC passes and restarts (clean or crash); after every step the bootstrap read equals the
  model's snapshot plus the model's suffix, and a read from the retained offset the model's bytes.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gc_support import JSON, OCTET, T0, Harness, VirtualClock, make_config
from tiered.cold.objects.keys import is_snapshot_key
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.engine import Engine
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted, SnapshotPublished

pytestmark = pytest.mark.timeout(300)

GRACE_MS = 10_000
B, P = "default", "doc"


def snapshot_files(data_dir: Path) -> set[str]:
    root = data_dir / "cold" / "data"
    return {f"data/{p.name}" for p in root.glob("*.snapshot")} if root.exists() else set()


def owned_snapshot_keys(node: Engine) -> set[str]:
    return {k for k, o in node.state.cold_objects.items() if is_snapshot_key(k) and o.refs > 0}


async def publish(h: Harness, offset: int, body: bytes, *, retain: bool = False) -> None:
    await h.s.snapshots.publish(B, P, offset, body, "application/x-state", retain=retain)


# ------------------------------------------------------------- the objects' lifecycle


def test_replaced_and_deleted_snapshots_are_collected_after_the_grace_delay(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def run() -> None:
        clock = VirtualClock(T0)
        h = Harness(make_config(data, gc_grace_s=GRACE_MS / 1000), clock=clock)
        await h.start()
        await h.create(B, P, b"0123")
        await publish(h, 4, b"first")
        [first] = owned_snapshot_keys(h.s)
        assert snapshot_files(data) == {first}
        await h.append(B, P, b"4567")
        await publish(h, 8, b"second")
        [second] = owned_snapshot_keys(h.s)
        assert h.s.state.cold_objects[first].refs == 0  # released by the replacement
        report = await h.gc(clock.now_ms(), reconcile=True)
        assert snapshot_files(data) == {first, second}  # within the grace delay: kept
        assert not report.integrity_errors
        # A restart recounts the owners (from the shutdown snapshot, then from the journal alone).
        await h.restart()
        assert owned_snapshot_keys(h.s) == {second}
        await h.restart(crash=True)
        assert owned_snapshot_keys(h.s) == {second}
        clock.advance(GRACE_MS + 1)
        await h.gc(clock.now_ms(), reconcile=True)
        assert snapshot_files(data) == {second}
        assert first not in h.s.state.cold_objects
        # The stream goes: so does its snapshot, after the grace delay.
        await h.s.streams.delete(B, P)
        await h.gc(clock.now_ms(), reconcile=True)
        assert snapshot_files(data) == {second}
        clock.advance(GRACE_MS + 1)
        report = await h.gc(clock.now_ms(), reconcile=True)
        assert snapshot_files(data) == set() and not report.integrity_errors
        await h.stop()

    asyncio.run(run())


# ------------------------------------------------------------- crashes between the steps


class SimulatedCrash(Exception):
    """The process 'dies' here: raised after the journal stopped accepting records."""


@pytest.mark.parametrize("step", ["intent", "upload", "commit"])
def test_crash_after_each_step_of_a_publish(tmp_path: Path, step: str) -> None:
    data = tmp_path / "data"

    async def run() -> None:
        clock = VirtualClock(T0)
        h = Harness(make_config(data, gc_grace_s=GRACE_MS / 1000), clock=clock)
        await h.start()
        await h.create(B, P, b"history|")
        await publish(h, 8, b"acknowledged")
        [acked] = owned_snapshot_keys(h.s)
        await h.append(B, P, b"more")

        async def die(name: str) -> None:
            if name == step:
                h.s.journal.failed = SimulatedCrash(f"process died after {name}")
                raise SimulatedCrash(name)

        h.s.snapshots.steps = die
        with pytest.raises(SimulatedCrash):
            await publish(h, 12, b"in flight")
        await h.crash()
        await h.start()  # the flusher's start aborts interrupted copies (as serve's does)
        s = h.s.streams.lookup(B, P)
        snap = s.snapshot
        assert snap is not None
        if step == "commit":  # journaled before the crash: it survives (a retry of the publish matches it)
            assert (snap.offset, await h.s.snapshots.body(snap)) == (12, b"in flight")
            again = await h.s.snapshots.publish(B, P, 12, b"in flight", "application/x-state")
            assert again.created is False
        else:  # never acknowledged: the acknowledged one is still the newest
            assert (snap.offset, snap.key) == (8, acked)
            assert await h.s.snapshots.body(snap) == b"acknowledged"
            assert not h.s.state.copies_in_flight
        assert await h.read(B, P) == b"history|more"
        # Reconciliation: once the grace delay has passed nothing is left that the metadata does not own.
        clock.advance(GRACE_MS + 1)
        report = await h.gc(clock.now_ms(), reconcile=True)
        assert not report.integrity_errors, report.integrity_errors
        clock.advance(GRACE_MS + 1)
        await h.gc(clock.now_ms(), reconcile=True)
        newest = h.s.streams.lookup(B, P).snapshot
        assert newest is not None
        assert snapshot_files(data) == owned_snapshot_keys(h.s) == {newest.key}
        if step != "commit":  # and the stream takes the publish the crash interrupted
            await publish(h, 12, b"after the restart")
        await h.stop()

    asyncio.run(run())


def test_a_failed_upload_stores_nothing_and_aborts_its_intent(tmp_path: Path) -> None:
    from tests.support.gc_support import ControlledStore

    async def run() -> None:
        h = Harness(make_config(tmp_path / "data"))
        await h.start()
        await h.create(B, P, b"abc")
        store = ControlledStore(h.s.snapshots.store)
        store.fail_put = "error"
        h.s.snapshots.store = store
        with pytest.raises(TieredError) as refused:
            await publish(h, 3, b"S")
        assert refused.value.code is ErrorCode.STORE_UNAVAILABLE
        assert h.s.streams.lookup(B, P).snapshot is None and not h.s.state.copies_in_flight
        await h.stop()

    asyncio.run(run())


def test_the_journal_holds_intent_then_commit(tmp_path: Path) -> None:
    from tests.support.gc_support import journal_records

    async def run() -> None:
        h = Harness(make_config(tmp_path / "data"))
        await h.start()
        await h.create(B, P, b"abc")
        await publish(h, 3, b"S")
        await h.crash()

    asyncio.run(run())
    kinds = [
        type(r).__name__
        for r in journal_records(tmp_path / "data")
        if isinstance(r, (ColdCopyStarted, ColdCopyAborted, SnapshotPublished))
    ]
    assert kinds == ["ColdCopyStarted", "SnapshotPublished"]


# ------------------------------------------------------------- the property


@dataclass
class Model:
    json: bool = False
    data: bytearray = field(default_factory=bytearray)  # every byte ever stored (offsets from 0)
    boundaries: list[int] = field(default_factory=lambda: [0])  # message boundaries (JSON: where one ends)
    retained: int = 0
    snapshot: tuple[int, bytes] | None = None


Op = tuple[str, int]
ops = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 40)),
    st.tuples(st.just("snapshot"), st.integers(0, 100)),
    st.tuples(st.just("snapshot-retain"), st.integers(0, 100)),
    st.tuples(st.just("retain"), st.integers(0, 100)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("gc"), st.just(0)),
    st.tuples(st.just("restart"), st.integers(0, 1)),
)


async def check(h: Harness, model: Model) -> None:
    s = h.s.streams.lookup(B, P)
    assert s.retained_from == model.retained
    assert await h.read(B, P) == bytes(model.data[model.retained :])
    b = await h.s.snapshots.bootstrap(B, P)
    if model.snapshot is None:
        assert b.snapshot is None and b.body == b""
        assert b.start == model.retained
    else:
        assert b.snapshot is not None
        assert (b.snapshot.offset, b.body) == model.snapshot
    assert b.updates == bytes(model.data[b.start : b.end])
    assert b.end == len(model.data) and b.up_to_date  # the limit is far above these streams


async def step(h: Harness, clock: VirtualClock, model: Model, op: Op) -> None:
    kind, n = op
    if kind == "append":
        if model.json:  # 1 to 3 messages per append: boundaries inside an append too
            messages = [{"i": len(model.boundaries), "pad": "x" * (n + k)} for k in range(1 + n % 3)]
            await h.append(B, P, json.dumps(messages, separators=(",", ":")).encode())
            for m in messages:
                model.data += json.dumps(m, separators=(",", ":")).encode() + b"\n"
                model.boundaries.append(len(model.data))
        else:
            chunk = bytes((len(model.data) + i) % 251 for i in range(n))
            await h.append(B, P, chunk)
            model.data += chunk
    elif kind.startswith("snapshot"):
        offset = model.retained + n * (len(model.data) - model.retained) // 100
        if model.json:  # the greatest message boundary at or below it (never below the retained offset)
            offset = max(b for b in model.boundaries if b <= offset and b >= model.retained)
        body = f"state@{offset}:{n}".encode()
        retain = kind == "snapshot-retain"
        try:
            await publish(h, offset, body, retain=retain)
        except TieredError as exc:
            assert model.snapshot is not None
            if model.snapshot[0] == offset:
                assert exc.code is ErrorCode.SNAPSHOT_CONFLICT and model.snapshot[1] != body
            else:
                assert exc.code is ErrorCode.SNAPSHOT_STALE and offset < model.snapshot[0]
            return
        if model.snapshot is not None and model.snapshot[0] == offset:
            assert model.snapshot[1] == body  # an idempotent repeat
        model.snapshot = (offset, body)
        if retain:
            model.retained = max(model.retained, offset)
    elif kind == "retain":
        if model.snapshot is None:
            return
        await h.s.snapshots.retain_to_snapshot(B, P)
        model.retained = max(model.retained, model.snapshot[0])
    elif kind == "flush":
        await h.flush()
    elif kind == "gc":
        clock.advance(GRACE_MS + 1)
        await h.gc(clock.now_ms(), reconcile=True)
    else:
        await h.restart(crash=bool(n))


async def run_sequence(data: Path, sequence: list[Op], content_type: str = OCTET) -> None:
    clock = VirtualClock(T0)
    h = Harness(make_config(data, gc_grace_s=GRACE_MS / 1000), clock=clock)
    await h.start()
    await h.create(B, P, content_type=content_type)
    model = Model(json=content_type == JSON)
    try:
        for op in sequence:
            await step(h, clock, model, op)
            await check(h, model)
        # No leaks: after the grace delay and a reconciliation, the store holds the one snapshot owned.
        clock.advance(GRACE_MS + 1)
        await h.gc(clock.now_ms(), reconcile=True)
        clock.advance(GRACE_MS + 1)
        report = await h.gc(clock.now_ms(), reconcile=True)
        assert not report.integrity_errors
        assert snapshot_files(data) == owned_snapshot_keys(h.s)
        assert len(owned_snapshot_keys(h.s)) == (0 if model.snapshot is None else 1)
    finally:
        await h.stop()


@pytest.mark.parametrize("content_type", [OCTET, JSON])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(ops, min_size=4, max_size=20))
def test_bootstrap_is_always_snapshot_plus_model_suffix(content_type: str, sequence: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run_sequence(Path(d) / "data", sequence, content_type))


@pytest.mark.parametrize("content_type", [OCTET, JSON])
def test_a_fixed_sequence_covering_every_operation(tmp_path: Path, content_type: str) -> None:
    sequence: list[Op] = [
        ("append", 30),
        ("snapshot", 50),
        ("append", 10),
        ("flush", 0),
        ("snapshot", 50),  # stale or the same: refused or idempotent
        ("snapshot-retain", 100),
        ("restart", 1),
        ("append", 5),
        ("gc", 0),
        ("retain", 0),
        ("restart", 0),
        ("snapshot", 100),
        ("flush", 0),
        ("gc", 0),
    ]
    asyncio.run(run_sequence(tmp_path / "data", sequence, content_type))


# ------------------------------------------------------------- damage, verify, erasure


def test_a_damaged_snapshot_is_an_integrity_error_never_a_200(tmp_path: Path) -> None:
    from tiered.cli.verify import verify_cold

    data = tmp_path / "data"

    async def run() -> None:
        h = Harness(make_config(data))
        await h.start()
        await h.create(B, P, b"abc")
        await publish(h, 3, b"the state")
        report = await verify_cold(h.s.state, h.s.snapshots.store)
        assert report.errors == [] and report.objects == 1
        [path] = (data / "cold" / "data").glob("*.snapshot")
        path.write_bytes(b"the stale")  # same size, other bytes
        snap = h.s.streams.lookup(B, P).snapshot
        assert snap is not None
        with pytest.raises(TieredError) as damaged:
            await h.s.snapshots.body(snap)
        assert damaged.value.code is ErrorCode.DATA_DAMAGED
        with pytest.raises(TieredError):
            await h.s.snapshots.bootstrap(B, P)
        report = await verify_cold(h.s.state, h.s.snapshots.store)
        assert report.errors == [f"{snap.key}: checksum mismatch (the object changed after upload)"]
        path.unlink()
        with pytest.raises(TieredError) as missing:
            await h.s.snapshots.body(snap)
        assert missing.value.code is ErrorCode.DATA_DAMAGED
        await h.stop()

    asyncio.run(run())


def test_erasing_the_bucket_releases_its_snapshots(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def run() -> None:
        clock = VirtualClock(T0)
        h = Harness(make_config(data, gc_grace_s=GRACE_MS / 1000), clock=clock)
        await h.start()
        await h.bucket("acme")
        await h.create("acme", "a", b"1234")
        await h.s.snapshots.publish("acme", "a", 4, b"S", "text/plain")
        assert len(snapshot_files(data)) == 1
        await h.s.streams.erase_bucket("acme")
        clock.advance(GRACE_MS + 1)
        report = await h.gc(clock.now_ms(), reconcile=True)
        assert not report.integrity_errors
        assert snapshot_files(data) == set()
        await h.stop()

    asyncio.run(run())


def test_retention_past_the_snapshot_refuses_bootstrap_instead_of_a_silent_gap(tmp_path: Path) -> None:
    async def run() -> None:
        h = Harness(make_config(tmp_path / "data"))
        await h.start()
        await h.create(B, P, b"0123456789")
        await publish(h, 4, b"S@4")
        await h.s.streams.retain_from(B, P, 6)  # age/size retention, or an operator, passed the snapshot
        with pytest.raises(TieredError) as gone:
            await h.s.snapshots.bootstrap(B, P)
        assert gone.value.code is ErrorCode.OFFSET_GONE
        assert gone.value.context["snapshot_offset"].endswith("_0000000000000004")
        assert gone.value.context["next_offset"].endswith("_0000000000000006")
        await publish(h, 8, b"S@8")  # a newer snapshot: bootstrap works again
        b = await h.s.snapshots.bootstrap(B, P)
        assert (b.body, b.updates) == (b"S@8", b"89")
        await h.stop()

    asyncio.run(run())


@pytest.mark.parametrize("content_type", [OCTET, JSON])
def test_an_idempotent_repeat_that_asks_for_retention_gets_it(tmp_path: Path, content_type: str) -> None:
    """The same snapshot published again with ``Stream-Snapshot-Retain: true`` is a success, and retains
    (found by the property test: the repeat answered 204 and left the retained offset where it was)."""
    asyncio.run(
        run_sequence(tmp_path, [("append", 20), ("snapshot", 90), ("snapshot-retain", 90)], content_type)
    )
