"""The features of issues 21 and 22 together: large bodies, digests, ordinals, conditions, snapshots, erasure.

Each feature has its own tests; these combine them, on a real ``Engine``
(``tests/support/gc_support.Harness``: nothing in the background, passes when
the test asks) over the local store, with a low large-body threshold:

* a large body stored by reference is one record of the stream's integrity
  digest (hashed as it streams, for the offset it lands at, even when another
  append moved the tail during the upload), and ``tiered verify``'s digest
  check recomputes it from the object's bytes: a clean data dir passes,
  damage to the body is named with its stream;
* it is one message for ordinals (``Stream-Record-Match``, ``?record=N``) and
  honours ``Stream-Expected-Offset`` before any byte is stored;
* snapshots and bootstrap with a large body after the snapshot; retention to
  the snapshot releases the digests of what it passes;
* erasure rewrites of a shared Parquet object keep the other bucket's digests
  (keyed by reference start) and verify passes; the erased bucket's payload
  object is released and deleted, never rewritten as Parquet; snapshot objects
  are never rewritten either;
* a ``PayloadAppended`` journaled before bodies were hashed decodes and counts
  nothing (as verify then expects).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.gc_support import Harness, VirtualClock, journal_records, make_config
from tests.support.s3_backends import backend_for
from tiered.cli import verify_digests
from tiered.cli.verify import verify_cold, verify_erasure
from tiered.cold.objects.keys import is_payload_key, is_snapshot_key
from tiered.cold.objects.payload import PAYLOAD_BLOCK_BYTES, digest_of
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.record_digest import MASK, digest_bytes, record_hash
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.jobs.rewrite_plan import AWAITING_DELETE, INHERITED, erasure_report, plan_rewrite
from tiered.engine.streams import integrity
from tiered.engine.streams.model import AppendRequest
from tiered.engine.streams.records import ColdRewriteCommitted, PayloadAppended

pytestmark = pytest.mark.timeout(120)

GRACE_MS = 10_000
OCTET = "application/octet-stream"
THRESHOLD = 64 * 1024


def cfg(tmp_path: Path, **settings: Any) -> Config:
    return make_config(
        tmp_path / "data",
        gc_grace_s=GRACE_MS / 1000,
        large_body_threshold_bytes=THRESHOLD,
        large_body_max_bytes=64 * 1024 * 1024,
        erasure_deadline_s=3600.0,
        **settings,
    )


def big(size: int, fill: int) -> bytes:
    return bytes((i * 7 + fill) & 0xFF for i in range(256)) * (size // 256) + bytes([fill]) * (size % 256)


async def chunked(data: bytes, chunk: int = 100_003) -> AsyncIterator[bytes]:
    for i in range(0, len(data), chunk):
        await asyncio.sleep(0)
        yield data[i : i + chunk]


async def large_append(h: Harness, bucket: str, path: str, data: bytes, **req: Any) -> Any:
    return await h.s.large_bodies.append(
        bucket, path, AppendRequest(OCTET, b"", False, **req), len(data), chunked(data)
    )


def model_digest(bucket: str, path: str, records: list[tuple[int, bytes]]) -> tuple[int, int, int]:
    """What a client appending ``records`` (start, bytes) to a first incarnation sums them to."""
    total = sum(record_hash(bucket, path, 0, start, data) for start, data in records) & MASK
    return total, len(records), sum(len(data) for _, data in records)


def live_of(h: Harness, bucket: str, path: str) -> tuple[int, int, int]:
    v = integrity.view(h.s.streams.lookup(bucket, path))
    assert v is not None
    return v.live, v.live_records, v.live_bytes


async def verify_errors(h: Harness) -> list[str]:
    """``tiered verify``'s cold, erasure and digest checks, in process, over the engine's own state."""
    state = h.s.state
    assert h.s.store is not None
    tally = verify_digests.DigestTally()
    report = await verify_cold(state, h.s.store, None, tally)
    for s in state.streams.values():
        verify_digests.check_stream(s, h.config.data_path / "hot", tally)
    assert tally.streams_unchecked == 0
    return report.errors + verify_erasure(state, h.config, h.clock.now_ms()) + tally.errors


def payload_keys(h: Harness) -> set[str]:
    return {k for k in h.s.state.cold_objects if is_payload_key(k)}


async def stored_keys(h: Harness) -> set[str]:
    assert h.s.store is not None
    return {info.key async for info in h.s.store.list("data/")}


# --------------------------------------------------------------------------- digests


def test_a_large_body_is_one_record_of_the_digest_and_verify_recomputes_it(tmp_path: Path) -> None:
    config = cfg(tmp_path)
    h = Harness(config)
    body = big(PAYLOAD_BLOCK_BYTES + 12_345, 3)
    first, after = b"first;", b"after;"
    records = [(0, first), (len(first), body), (len(first) + len(body), after)]

    async def run() -> None:
        await h.start()
        await h.create("default", "s", first)
        await large_append(h, "default", "s", body)
        await h.append("default", "s", after)
        assert live_of(h, "default", "s") == model_digest("default", "s", records)
        assert await verify_errors(h) == []
        # Through a flush (the hot records go cold around the payload), a crash and a snapshot.
        assert await h.flush() >= 1
        assert live_of(h, "default", "s") == model_digest("default", "s", records)
        assert await verify_errors(h) == []
        await h.restart(crash=True)
        assert live_of(h, "default", "s") == model_digest("default", "s", records)
        await h.s.journal.snapshot(h.s.state)
        await h.restart()
        assert live_of(h, "default", "s") == model_digest("default", "s", records)
        assert await verify_errors(h) == []
        # One flipped bit of the body: verify names the object and the stream's range.
        [key] = payload_keys(h)
        path = config.data_path / "cold" / key
        raw = bytearray(path.read_bytes())
        raw[PAYLOAD_BLOCK_BYTES + 7] ^= 0x10
        path.write_bytes(bytes(raw))
        errors = await verify_errors(h)
        assert any(key in e and "block 1" in e for e in errors), errors
        assert any(
            e.startswith(f"default/s [{len(first)}, {len(first) + len(body)}) in {key}") for e in errors
        )
        raw[PAYLOAD_BLOCK_BYTES + 7] ^= 0x10
        path.write_bytes(bytes(raw))
        assert await verify_errors(h) == []
        # Retention past the body releases it from the live digest, whole.
        await h.s.streams.retain_from("default", "s", records[2][0])
        v = integrity.view(h.s.streams.lookup("default", "s"))
        assert v is not None
        assert (v.live, v.live_records, v.live_bytes) == model_digest("default", "s", records[2:])
        assert (v.released, v.released_records) == model_digest("default", "s", records[:2])[:2]
        assert v.total == model_digest("default", "s", records)[0]
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())


@pytest.mark.parametrize("backend", ["local", "moto"])
def test_a_tail_moved_during_the_upload_is_hashed_for_the_offset_the_body_lands_at(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "local":
        moved(cfg(tmp_path))
        return
    with backend_for(backend, request, monkeypatch) as store:  # multipart upload, ranged reads back
        moved(cfg(tmp_path, **store.config()))


def moved(config: Config) -> None:
    h = Harness(config)
    body = big(3 * PAYLOAD_BLOCK_BYTES // 2, 5)
    racer = b"racer;"

    async def racing_body() -> AsyncIterator[bytes]:
        sent = False
        async for chunk in chunked(body):
            yield chunk
            if not sent:  # another writer appends while the body is on its way
                sent = True
                await h.append("default", "s", racer)

    async def run() -> None:
        await h.start()
        await h.create("default", "s", b"m0;")
        result = await h.s.large_bodies.append(
            "default", "s", AppendRequest(OCTET, b"", False), len(body), racing_body()
        )
        assert result.tail == 3 + len(racer) + len(body)
        assert await h.read("default", "s") == b"m0;" + racer + body
        records = [(0, b"m0;"), (3, racer), (3 + len(racer), body)]
        assert live_of(h, "default", "s") == model_digest("default", "s", records)
        [ref] = [r for r in journal_records(config.data_path) if isinstance(r, PayloadAppended)]
        assert ref.offset == 3 + len(racer)
        assert ref.record_hash == digest_bytes(record_hash("default", "s", 0, ref.offset, body))
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())


def test_a_reference_journaled_before_bodies_were_hashed_counts_nothing(tmp_path: Path) -> None:
    """Old journals: a ``PayloadAppended`` without ``record_hash`` decodes; the body is outside the digest."""
    record = PayloadAppended(
        uid=1, offset=0, ts_ms=1, producer=None, epoch=0, seq=0, stream_seq=None, close=False, data=b"",
        key="data/x.payload", digest=digest_of(b"abc"),
    )  # fmt: skip
    fields = msgspec.msgpack.decode(encode_record(record))
    old = msgspec.msgpack.encode(fields[:-1])  # as written before the field existed
    assert decode_record(old) == record
    assert decode_record(encode_record(record)).record_hash == b""


# --------------------------------------------------------------------------- ordinals, conditions


@pytest.mark.parametrize("condition", ["expected_offset", "expected_record"])
def test_a_condition_broken_during_the_upload_is_412_and_stores_nothing(
    tmp_path: Path, condition: str
) -> None:
    config = cfg(tmp_path)
    h = Harness(config)
    body = big(THRESHOLD + 1, 4)

    async def racing_body() -> AsyncIterator[bytes]:
        async for chunk in chunked(body):
            yield chunk
        await h.append("default", "s", b"racer;")  # another writer wins while the body is stored

    async def run() -> None:
        await h.start()
        await h.create("default", "s", b"m0;")
        req = AppendRequest(OCTET, b"", False, **{condition: 3 if condition == "expected_offset" else 1})
        with pytest.raises(TieredError) as err:
            await h.s.large_bodies.append("default", "s", req, len(body), racing_body())
        assert err.value.code is ErrorCode.TAIL_MISMATCH
        assert await h.read("default", "s") == b"m0;racer;"
        assert payload_keys(h) == set() and await stored_keys(h) == set()  # the upload was deleted
        assert h.s.state.copies_in_flight == {}
        assert live_of(h, "default", "s") == model_digest("default", "s", [(0, b"m0;"), (3, b"racer;")])
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())


def test_a_large_body_is_one_message_and_honours_expected_offsets(tmp_path: Path) -> None:
    config = cfg(tmp_path)
    h = Harness(config)
    body = big(THRESHOLD + 1, 9)

    def ordinals() -> tuple[int, list[int]]:
        uid = h.s.streams.lookup("default", "s").uid
        index = h.s.state.extensions["records"].indexes[uid]  # type: ignore[attr-defined]
        return index.next, list(index.offs)

    async def run() -> None:
        await h.start()
        await h.create("default", "s", b"m0")
        # Stream-Expected-Offset / Stream-Record-Match refused before a byte is stored.
        for wrong in ({"expected_offset": 0}, {"expected_record": 0}, {"expected_record": 2}):
            with pytest.raises(TieredError) as err:
                await large_append(h, "default", "s", body, **wrong)
            assert err.value.code is ErrorCode.TAIL_MISMATCH, wrong
        assert payload_keys(h) == set() and await stored_keys(h) == set()
        await large_append(h, "default", "s", body, expected_offset=2)
        assert ordinals() == (2, [0, 2])
        await large_append(h, "default", "s", body, expected_record=2)
        await h.append("default", "s", b"m3")
        end = 2 + 2 * len(body)
        assert ordinals() == (4, [0, 2, 2 + len(body), end])
        await h.restart(crash=True)
        assert ordinals() == (4, [0, 2, 2 + len(body), end])
        await h.s.journal.snapshot(h.s.state)
        await h.restart()
        assert ordinals() == (4, [0, 2, 2 + len(body), end])
        # Retention past the first body: ordinals of what it passed are not reused.
        await h.s.streams.retain_from("default", "s", 2 + len(body))
        assert ordinals() == (4, [2 + len(body), end])
        await large_append(h, "default", "s", body, expected_record=4)
        assert ordinals() == (5, [2 + len(body), end, end + 2])
        await h.stop()

    asyncio.run(run())


# --------------------------------------------------------------------------- snapshots


def test_bootstrap_and_retention_to_a_snapshot_with_a_large_body_after_it(tmp_path: Path) -> None:
    config = cfg(tmp_path)
    h = Harness(config)
    body = big(THRESHOLD + 100, 1)

    async def run() -> None:
        await h.start()
        await h.create("default", "s", b"m0;")
        await h.append("default", "s", b"m1;")
        await h.s.snapshots.publish("default", "s", 6, b"state@6", OCTET)
        await large_append(h, "default", "s", body)
        await h.append("default", "s", b"m3;")
        boot = await h.s.snapshots.bootstrap("default", "s")
        assert (boot.body, boot.start, boot.updates) == (b"state@6", 6, body + b"m3;")
        [snap_key] = [k for k in h.s.state.cold_objects if is_snapshot_key(k)]
        [payload_key] = payload_keys(h)
        # Neither a snapshot nor a payload object is Parquet: the rewrite machinery leaves them be.
        assert plan_rewrite(h.s.state, snap_key) is None
        assert plan_rewrite(h.s.state, payload_key) is None
        assert await verify_errors(h) == []
        await h.s.snapshots.retain_to_snapshot("default", "s")
        records = [(0, b"m0;"), (3, b"m1;"), (6, body), (6 + len(body), b"m3;")]
        v = integrity.view(h.s.streams.lookup("default", "s"))
        assert v is not None
        assert (v.live, v.live_records, v.live_bytes) == model_digest("default", "s", records[2:])
        assert (v.released, v.released_records, v.released_bytes) == model_digest("default", "s", records[:2])
        assert await verify_errors(h) == []
        await h.flush()
        await h.gc(h.clock.now_ms() + 2 * GRACE_MS)
        assert await verify_errors(h) == []
        await h.restart(crash=True)
        boot = await h.s.snapshots.bootstrap("default", "s")
        assert (boot.body, boot.start, boot.updates) == (b"state@6", 6, body + b"m3;")
        assert await h.read("default", "s") == body + b"m3;"
        assert live_of(h, "default", "s") == model_digest("default", "s", records[2:])
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())


# --------------------------------------------------------------------------- erasure


def test_erasure_rewrite_keeps_the_other_buckets_digests_and_releases_payloads(tmp_path: Path) -> None:
    config = cfg(tmp_path)
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    a_body, b_body = big(THRESHOLD + 10, 0xA1), big(THRESHOLD + 20, 0xB2)

    async def run() -> None:
        await h.start()
        for bucket in ("alpha", "beta"):
            await h.bucket(bucket)
        await h.create("alpha", "a", b"ALPHA-SECRET-1;")
        await h.create("beta", "b", b"beta-1;")
        await h.append("beta", "b", b"beta-2;")
        assert await h.flush() == 1
        [shared] = h.s.state.cold_objects
        await large_append(h, "alpha", "a", a_body)
        await large_append(h, "beta", "b", b_body)
        [a_payload] = h.cold_keys_of("alpha", "a") & payload_keys(h)
        [b_payload] = h.cold_keys_of("beta", "b") & payload_keys(h)
        beta_records = [(0, b"beta-1;"), (7, b"beta-2;"), (14, b_body)]
        assert live_of(h, "beta", "b") == model_digest("beta", "b", beta_records)
        assert await verify_errors(h) == []

        await h.s.streams.erase_bucket("alpha")
        now = clock.now_ms()
        for at in (now, now + GRACE_MS + 1, now + 2 * GRACE_MS + 2, now + 3 * GRACE_MS + 3):
            report = await h.gc(at)
            assert report.errors == [] and report.integrity_errors == [], report
        rewrites = [r for r in journal_records(config.data_path) if isinstance(r, ColdRewriteCommitted)]
        assert [r.old_key for r in rewrites] == [shared]  # the payloads were never rewritten
        assert set(h.s.state.cold_objects) == {rewrites[0].new_key, b_payload}
        assert await stored_keys(h) == {rewrites[0].new_key, b_payload}  # alpha's payload deleted
        assert a_payload not in await stored_keys(h)
        assert live_of(h, "beta", "b") == model_digest("beta", "b", beta_records)
        assert await h.read("beta", "b") == b"beta-1;beta-2;" + b_body
        clock.advance(4 * GRACE_MS)
        assert await verify_errors(h) == []
        await h.restart(crash=True)
        assert live_of(h, "beta", "b") == model_digest("beta", "b", beta_records)
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())


def test_erasure_releases_the_erased_buckets_snapshots_and_keeps_the_others(tmp_path: Path) -> None:
    config = cfg(tmp_path)
    clock = VirtualClock()
    h = Harness(config, clock=clock)

    async def run() -> None:
        await h.start()
        for bucket in ("alpha", "beta"):
            await h.bucket(bucket)
        await h.create("alpha", "a", b"ALPHA-SECRET-1;")
        await h.create("beta", "b", b"beta-1;")
        assert await h.flush() == 1
        await h.s.snapshots.publish("alpha", "a", 15, b"ALPHA-SECRET-STATE", OCTET)
        await h.s.snapshots.publish("beta", "b", 7, b"beta-state", OCTET)
        snaps = {k for k in h.s.state.cold_objects if is_snapshot_key(k)}
        [beta_snap] = [k for k in snaps if h.s.streams.lookup("beta", "b").snapshot.key == k]  # type: ignore[union-attr]
        await h.append("beta", "b", b"beta-2;")
        assert await verify_errors(h) == []
        await h.s.streams.erase_bucket("alpha")
        [alpha_snap] = snaps - {beta_snap}
        pending = erasure_report(h.s.state, clock.now_ms(), 3_600_000, GRACE_MS)
        assert {o.key: o.status for b in pending.buckets for o in b.objects}[alpha_snap] == AWAITING_DELETE
        now = clock.now_ms()
        for at in (now, now + GRACE_MS + 1, now + 2 * GRACE_MS + 2, now + 3 * GRACE_MS + 3):
            report = await h.gc(at)
            assert report.errors == [] and report.integrity_errors == [], report
        assert erasure_report(h.s.state, clock.now_ms(), 3_600_000, GRACE_MS).buckets[0].objects == []
        left = await stored_keys(h)
        assert {k for k in left if is_snapshot_key(k)} == {beta_snap}  # alpha's snapshot deleted
        assert h.s.store is not None
        for key in left:
            assert b"ALPHA" not in await h.s.store.get(key), key
        boot = await h.s.snapshots.bootstrap("beta", "b")
        assert (boot.body, boot.updates) == (b"beta-state", b"beta-2;")
        clock.advance(4 * GRACE_MS)
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())


def test_a_fork_in_another_bucket_keeps_reading_an_erased_buckets_large_body(tmp_path: Path) -> None:
    """The payload object a fork inherited stays while the fork reads it (as Parquet rows forks inherited)."""
    config = cfg(tmp_path)
    clock = VirtualClock()
    h = Harness(config, clock=clock)
    body = big(THRESHOLD + 33, 0x5A)

    async def run() -> None:
        await h.start()
        for bucket in ("alpha", "beta"):
            await h.bucket(bucket)
        await h.create("alpha", "a", b"a0;")
        await large_append(h, "alpha", "a", body)
        await h.create("beta", "f", fork_from=("alpha", "a"))
        await h.append("beta", "f", b"own;")
        [payload] = payload_keys(h)
        fork_live = live_of(h, "beta", "f")  # a fork's digest counts its own records only
        assert fork_live == model_digest("beta", "f", [(3 + len(body), b"own;")])
        await h.s.streams.erase_bucket("alpha")
        now = clock.now_ms()
        for at in (now, now + GRACE_MS + 1, now + 2 * GRACE_MS + 2):
            report = await h.gc(at)
            assert report.errors == [] and report.integrity_errors == [], report
        assert payload in await stored_keys(h)
        assert await h.read("beta", "f") == b"a0;" + body + b"own;"
        # The erasure report names the object as still holding alpha's bytes, for the fork (no deadline).
        report = erasure_report(h.s.state, clock.now_ms(), 3_600_000, GRACE_MS)
        [(bucket, held)] = [(b.bucket, o) for b in report.buckets for o in b.objects]
        assert (bucket, held.key, held.status, held.bytes, held.overdue) == (
            "alpha",
            payload,
            INHERITED,
            len(body),
            False,
        )
        assert live_of(h, "beta", "f") == fork_live
        clock.advance(4 * GRACE_MS)
        assert await verify_errors(h) == []
        await h.stop()

    asyncio.run(run())
