"""Retention, expiry and what they release, over HTTP on an in-process server (virtual clock).

* Retention by bytes and by age, as a bucket policy and as a stream policy that overrides
  it, moves a stream's retained offset only to record boundaries (hot appends, cold ranges),
  on both tiers: JSON streams keep whole messages. Reads from ``-1`` start at the retained
  offset, reads below it get 410 with the earliest offset in ``Stream-Next-Offset``, and
  ``HEAD`` shows ``Stream-Retained-Offset``.
* What retention and TTL expiry release is deleted after the grace delay (objects nobody
  needs any more), while what a fork still inherits stays readable.
* Regressions: an admin retain to a mid-record offset keeps the stream flushing; on a JSON
  stream it lands on a message boundary; a fork created below its source's retained offset
  starts at that offset; cold ranges between a source's retained offset and what its
  forks inherit are released even while the forks live.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.gc_support import JSON, OCTET, HttpHarness, VirtualClock, make_config, object_files
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(120)

GRACE_MS = 10_000
CT = {"Content-Type": OCTET}
CT_JSON = {"Content-Type": JSON}


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)


def run(tmp_path: Path, body: Any, **config: Any) -> None:
    clock = VirtualClock()
    cfg = make_config(tmp_path / "data", gc_grace_s=GRACE_MS / 1000, **config)

    async def main() -> None:
        h = HttpHarness(cfg, clock=clock)
        await h.start()
        try:
            await body(h, clock)
        finally:
            await h.stop()

    asyncio.run(main())


async def gc(h: HttpHarness, **expect: Any) -> dict[str, Any]:
    status, _, raw = await h.http("POST", "/v1/admin/gc")
    assert status == 200, raw
    report = json.loads(raw)
    assert report["errors"] == [] and report["integrity_errors"] == [], report
    for k, v in expect.items():
        assert report[k] == v, (k, report)
    return report


async def policy(h: HttpHarness, target: str, ms: int | None = None, size: int | None = None) -> None:
    status, _, raw = await h.http(
        "PUT", f"/v1/admin/retention/{target}", json_body={"retention_ms": ms, "retention_bytes": size}
    )
    assert status == 200, raw


async def retained(h: HttpHarness, url: str) -> int:
    status, headers, _ = await h.http("HEAD", url)
    assert status == 200
    return int(headers["Stream-Retained-Offset"].replace("_", ""))


async def check_reads(h: HttpHarness, url: str, data: bytes) -> None:
    """What readers see with retained offset R: -1 starts at R, below R is 410 -> R."""
    r = await retained(h, url)
    status, headers, raw = await h.http("GET", url + "?offset=-1")
    while status == 200 and headers.get("Stream-Up-To-Date") != "true":  # follow chunked reads to the tail
        status, headers, more = await h.http("GET", f"{url}?offset={headers['Stream-Next-Offset']}")
        raw += more
    assert status == 200 and raw == data[r:], (r, raw[:40])
    if r > 0:
        status, headers, raw = await h.http("GET", f"{url}?offset={format_offset(r - 1)}")
        assert status == 410 and headers["Stream-Next-Offset"] == format_offset(r)
        status, headers, raw = await h.http("GET", f"{url}?offset={format_offset(0)}")
        assert status == 410 and headers["Stream-Next-Offset"] == format_offset(r)


# --------------------------------------------------------------------------- by bytes


@pytest.mark.parametrize("tier", ["hot", "cold", "mixed"])
def test_retention_by_bytes_moves_to_record_boundaries(tmp_path: Path, tier: str) -> None:
    records = [b"a" * 100, b"b" * 100, b"c" * 100, b"d" * 100, b"e" * 100]

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.bucket("sized")
        url = "/v1/buckets/sized/stream/s"
        assert (await h.http("PUT", url, headers=CT))[0] == 201
        for i, r in enumerate(records):
            assert (await h.http("POST", url, headers=CT, body=r))[0] == 204
            if tier == "cold" or (tier == "mixed" and i < 2):
                await h.flush()  # one cold range per record (or the first two only)
        data = b"".join(records)
        await policy(h, "sized", size=250)  # at least 250 bytes: the boundary at or below 500-250 is 200
        await gc(h, retention_advanced=1, bytes_released=200)
        assert await retained(h, url) == 200
        await check_reads(h, url, data)
        await gc(h, retention_advanced=0)  # idempotent
        await policy(h, "sized", size=100)  # exactly one record
        await gc(h, retention_advanced=1, bytes_released=200)
        assert await retained(h, url) == 400
        await check_reads(h, url, data)
        await policy(h, "sized", size=0)  # nothing kept; the stream itself lives on
        await gc(h, retention_advanced=1)
        assert await retained(h, url) == 500
        status, headers, raw = await h.http("GET", url + "?offset=-1")
        assert (status, raw, headers["Stream-Up-To-Date"]) == (200, b"", "true")
        assert (await h.http("POST", url, headers=CT, body=b"new"))[0] == 204
        assert (await h.http("GET", url + "?offset=-1"))[2] == b"new"

    run(tmp_path, body)


def test_retention_bytes_on_json_stream_keeps_whole_messages(tmp_path: Path) -> None:
    messages = [{"n": i, "pad": "x" * (7 * i)} for i in range(8)]

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        url = "/v1/stream/events.json"
        assert (await h.http("PUT", url, headers=CT_JSON))[0] == 201
        for i in range(0, 8, 2):  # two messages per append: a record holds several messages
            assert (await h.http("POST", url, headers=CT_JSON, json_body=messages[i : i + 2]))[0] == 204
            if i == 2:
                await h.flush()
        for size in (200, 90, 10):
            await policy(h, "default/events.json", size=size)
            await gc(h)
            status, _, raw = await h.http("GET", url + "?offset=-1")
            assert status == 200
            got = json.loads(raw)  # valid JSON: whole messages only
            assert got == messages[len(messages) - len(got) :], (size, got)
            s = h.s.streams.lookup("default", "events.json")
            assert s.tail - s.retained_from >= size, "retention keeps at least retention_bytes"
        # 10 bytes: the last record (two messages) is the least that keeps them.
        assert json.loads((await h.http("GET", url + "?offset=-1"))[2]) == messages[6:]

    run(tmp_path, body)


def test_size_retention_inside_one_cold_range_keeps_at_least_the_limit(tmp_path: Path) -> None:
    """20 records of 100 KB flushed into one cold range: keeping 1,900,000 bytes releases the first
    record only (the boundary is found inside the object); the range stays referenced."""
    records = [bytes([65 + i]) * 100_000 for i in range(20)]

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        url = "/v1/stream/one"
        assert (await h.http("PUT", url, headers=CT))[0] == 201
        for r in records:
            assert (await h.http("POST", url, headers=CT, body=r))[0] == 204
        await h.flush()
        s = h.s.streams.lookup("default", "one")
        assert [(r.start, r.end) for r in s.cold_refs] == [(0, 2_000_000)] and h.s.state.hot_bytes == 0
        await policy(h, "default/one", size=1_900_000)
        await gc(h, retention_advanced=1, bytes_released=100_000)
        assert await retained(h, url) == 100_000
        assert [(r.start, r.end) for r in s.cold_refs] == [(0, 2_000_000)], "a partly retained range stays"
        await check_reads(h, url, b"".join(records))
        await policy(h, "default/one", size=1_850_000)  # 150,000 out: still only the first record
        await gc(h, retention_advanced=0)
        await policy(h, "default/one", size=50_000)  # at least 50,000: the last record
        await gc(h, retention_advanced=1, bytes_released=1_800_000)
        assert await retained(h, url) == 1_900_000
        await check_reads(h, url, b"".join(records))
        clock.advance(GRACE_MS)
        await gc(h, objects_deleted=0)  # the object still serves the last record
        await h.restart(crash=True)
        await check_reads(h, url, b"".join(records))

    run(tmp_path, body, max_body_bytes=200_000, segment_bytes=4 << 20)


def test_size_retention_of_mebibyte_records_keeps_the_limit_exactly(tmp_path: Path) -> None:
    records = [bytes([48 + i]) * (1 << 20) for i in range(10)]

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        url = "/v1/stream/big"
        assert (await h.http("PUT", url, headers=CT))[0] == 201
        for i, r in enumerate(records):
            assert (await h.http("POST", url, headers=CT, body=r))[0] == 204
            if i == 5:
                await h.flush()  # some cold, some hot
        await policy(h, "default/big", size=9 << 20)
        await gc(h, retention_advanced=1, bytes_released=1 << 20)
        assert await retained(h, url) == 1 << 20
        await check_reads(h, url, b"".join(records))

    run(tmp_path, body, max_body_bytes=(1 << 20) + 1024, segment_bytes=8 << 20)


# --------------------------------------------------------------------------- by age


def test_retention_by_age_on_both_tiers(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.bucket("aged")
        url = "/v1/buckets/aged/stream/s"
        t0 = clock.ms
        assert (await h.http("PUT", url, headers=CT, body=b"at-t0|"))[0] == 201
        clock.advance(10_000)
        assert (await h.http("POST", url, headers=CT, body=b"at-t10|"))[0] == 204
        await h.flush()  # cold range [0, 13), object written at t0+10 s
        clock.advance(10_000)
        assert (await h.http("POST", url, headers=CT, body=b"at-t20|"))[0] == 204  # hot, t0+20 s
        clock.advance(10_000)
        assert (await h.http("POST", url, headers=CT, body=b"at-t30|"))[0] == 204  # hot, t0+30 s
        data = b"at-t0|at-t10|at-t20|at-t30|"
        await policy(h, "aged", ms=25_000)  # now t0+30: cutoff t0+5 s; the cold range is as old as its object
        await gc(h, retention_advanced=0)
        assert await retained(h, url) == 0
        clock.ms = t0 + 36_000  # cutoff t0+11: the object (t0+10) is older; the t20 record is not
        await gc(h, retention_advanced=1, bytes_released=13)
        assert await retained(h, url) == 13
        await check_reads(h, url, data)
        clock.ms = t0 + 50_000  # cutoff t0+25: the t20 record goes, the t30 record stays
        await gc(h, retention_advanced=1)
        assert await retained(h, url) == 20
        await check_reads(h, url, data)
        clock.ms = t0 + 1_000_000
        await gc(h, retention_advanced=1)
        assert await retained(h, url) == len(data)

    run(tmp_path, body)


def test_stream_policy_overrides_the_bucket_policy(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.bucket("mixed")
        urls = {name: f"/v1/buckets/mixed/stream/{name}" for name in ("follows", "own")}
        for url in urls.values():
            assert (await h.http("PUT", url, headers=CT))[0] == 201
            for i in range(4):
                assert (await h.http("POST", url, headers=CT, body=bytes([65 + i]) * 50))[0] == 204
        await policy(h, "mixed", size=60)  # bucket: keep >= 60 bytes (whole records: 100)
        await policy(h, "mixed/own", ms=3_600_000)  # own: by age only, and nothing is that old
        await gc(h, retention_advanced=1)
        assert await retained(h, urls["follows"]) == 100
        assert await retained(h, urls["own"]) == 0  # the bucket's byte limit does not apply to it
        await policy(h, "mixed/own", size=120)  # own, by bytes: keep 150
        await gc(h, retention_advanced=1)
        assert await retained(h, urls["own"]) == 50
        await policy(h, "mixed/own")  # cleared: follows the bucket again
        await gc(h, retention_advanced=1)
        assert await retained(h, urls["own"]) == 100
        await policy(h, "mixed")  # the bucket's cleared too: nothing moves, nothing goes back
        clock.advance(10**9)
        await gc(h, retention_advanced=0)
        for url in urls.values():
            assert await retained(h, url) == 100
            await check_reads(h, url, b"".join(bytes([65 + i]) * 50 for i in range(4)))

    run(tmp_path, body)


# --------------------------------------------------------------------------- what is released goes


def test_released_objects_are_deleted_after_grace_but_inherited_data_stays(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        src, fork = "/v1/stream/src", "/v1/stream/fork"
        data = b"0" * 100 + b"1" * 100 + b"2" * 100
        assert (await h.http("PUT", src, headers=CT, body=data[:100]))[0] == 201
        await h.flush()  # object A: src [0, 100)
        assert (await h.http("POST", src, headers=CT, body=data[100:200]))[0] == 204
        await h.flush()  # object B: src [100, 200)
        assert (await h.http("POST", src, headers=CT, body=data[200:]))[0] == 204
        await h.flush()  # object C: src [200, 300)
        a, b, c = sorted(h.s.state.cold_objects, key=lambda k: h.s.state.cold_objects[k].created_ms)
        headers = {"Stream-Forked-From": src, "Stream-Fork-Offset": format_offset(200)}
        assert (await h.http("PUT", fork, headers=headers, body=b"own"))[0] == 201  # inherits A and B
        state = h.s.state

        def refs() -> tuple[int, ...]:
            return tuple(state.cold_objects[k].refs if k in state.cold_objects else -1 for k in (a, b, c))

        # The source is deleted: only what the fork inherits stays needed; C is released.
        assert (await h.http("DELETE", src))[0] == 204
        released = clock.ms
        assert refs() == (1, 1, 0)
        await gc(h, objects_deleted=0, objects_released=1)
        clock.ms = released + GRACE_MS
        await gc(h, objects_deleted=1)
        assert object_files(h.config.data_path) == {a, b}
        await check_reads(h, fork, data[:200] + b"own")
        # The fork's retention moves past A: A goes, B stays.
        await h.http("POST", "/v1/admin/retain/default/fork", json_body={"offset": format_offset(100)})
        assert refs() == (0, 1, -1)
        clock.advance(GRACE_MS)
        await gc(h, objects_deleted=1)
        assert object_files(h.config.data_path) == {b}
        await h.restart(crash=True)
        await check_reads(h, fork, data[:200] + b"own")
        # Past everything it inherits: B goes too; the fork's own bytes stay.
        await h.http("POST", "/v1/admin/retain/default/fork", json_body={"offset": format_offset(200)})
        clock.advance(GRACE_MS)
        await gc(h, objects_deleted=1)
        assert object_files(h.config.data_path) == set()
        await check_reads(h, fork, data[:200] + b"own")

    run(tmp_path, body)


def test_unreachable_gap_between_fork_point_and_source_retention_is_released(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        src, fork = "/v1/stream/src", "/v1/stream/fork"
        assert (await h.http("PUT", src, headers=CT, body=b"0" * 100))[0] == 201
        await h.flush()  # object A: src [0, 100)
        assert (await h.http("POST", src, headers=CT, body=b"1" * 100))[0] == 204
        await h.flush()  # object B: src [100, 200)
        assert (await h.http("POST", src, headers=CT, body=b"2" * 100))[0] == 204
        await h.flush()  # object C: src [200, 300)
        a, b, c = sorted(h.s.state.cold_objects, key=lambda k: h.s.state.cold_objects[k].created_ms)
        headers = {"Stream-Forked-From": src, "Stream-Fork-Offset": format_offset(100)}
        assert (await h.http("PUT", fork, headers=headers))[0] == 201  # reads src [0, 100): A
        await h.http("POST", "/v1/admin/retain/default/src", json_body={"offset": format_offset(200)})
        # Nobody can read src [100, 200) any more: the source reads from 200, the fork below 100.
        clock.advance(GRACE_MS)
        await gc(h)
        assert object_files(h.config.data_path) == {a, c}

    run(tmp_path, body)


def test_ttl_expiry_releases_objects_and_forks_keep_what_they_inherit(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        short, fork, lone = "/v1/stream/short", "/v1/stream/fork", "/v1/stream/lone"
        assert (await h.http("PUT", short, headers={**CT, "Stream-TTL": "5"}, body=b"s" * 100))[0] == 201
        assert (await h.http("PUT", lone, headers={**CT, "Stream-TTL": "5"}, body=b"l" * 100))[0] == 201
        await h.flush()  # one object, both streams
        [shared] = h.s.state.cold_objects
        assert (await h.http("POST", short, headers=CT, body=b"t" * 50))[0] == 204
        await h.flush()  # an object only "short" owns
        [tail_obj] = set(h.s.state.cold_objects) - {shared}
        hdrs = {"Stream-Forked-From": short, "Stream-Fork-Offset": format_offset(100), "Stream-TTL": "3600"}
        assert (await h.http("PUT", fork, headers=hdrs))[0] == 201
        clock.advance(6_000)
        assert (await h.http("GET", short + "?offset=-1"))[0] == 404  # expired for readers at once
        report = await gc(h, streams_expired=2)
        expired_at = report["started_ms"]
        state = h.s.state
        assert state.cold_objects[shared].refs == 1  # the fork still inherits short's [0, 100)
        assert state.cold_objects[tail_obj].refs == 0
        clock.ms = expired_at + GRACE_MS - 1
        await gc(h, objects_deleted=0)
        clock.ms = expired_at + GRACE_MS
        await gc(h, objects_deleted=1)
        assert object_files(h.config.data_path) == {shared}
        assert (await h.http("GET", fork + "?offset=-1"))[2] == b"s" * 100
        assert (await h.http("DELETE", fork))[0] == 204
        clock.advance(GRACE_MS)
        await gc(h, objects_deleted=1)
        assert object_files(h.config.data_path) == set() and h.s.state.streams == {}

    run(tmp_path, body)


# --------------------------------------------------------------------------- regressions


def test_retain_inside_a_record_does_not_stall_flushing(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        url = "/v1/stream/s"
        assert (await h.http("PUT", url, headers=CT, body=b"0123456789"))[0] == 201
        assert (await h.http("POST", url, headers=CT, body=b"abcdefghij"))[0] == 204
        status, headers, _ = await h.http(
            "POST", "/v1/admin/retain/default/s", json_body={"offset": format_offset(5)}
        )
        # A binary stream's offsets are bytes: any offset may be the retained one.
        assert (status, headers["Stream-Retained-Offset"]) == (204, format_offset(5))
        assert (await h.http("POST", url, headers=CT, body=b"KLMNOP"))[0] == 204
        await h.flush()
        assert h.s.state.hot_bytes == 0, "the stream's data never goes cold"
        await check_reads(h, url, b"0123456789abcdefghijKLMNOP")

    run(tmp_path, body)


def test_retain_inside_a_json_message_keeps_whole_messages(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        url = "/v1/stream/j"
        assert (await h.http("PUT", url, headers=CT_JSON, body=b'[{"a":1},{"b":2}]'))[0] == 201
        status, headers, _ = await h.http(
            "POST", "/v1/admin/retain/default/j", json_body={"offset": format_offset(3)}
        )
        # Inside the first message of the only record: rounded down to the record boundary, 0.
        assert (status, headers["Stream-Retained-Offset"]) == (204, format_offset(0))
        status, _, raw = await h.http("GET", url + "?offset=-1")
        assert (status, json.loads(raw)) == (200, [{"a": 1}, {"b": 2}])

    run(tmp_path, body)


def test_fork_below_the_source_retention_does_not_claim_released_bytes(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        src, fork = "/v1/stream/src", "/v1/stream/fork"
        assert (await h.http("PUT", src, headers=CT, body=b"A" * 10))[0] == 201
        assert (await h.http("POST", src, headers=CT, body=b"B" * 10))[0] == 204
        assert (await h.http("POST", src, headers=CT, body=b"C" * 10))[0] == 204
        await h.http("POST", "/v1/admin/retain/default/src", json_body={"offset": format_offset(10)})
        status, _, _ = await h.http(
            "PUT", fork, headers={"Stream-Forked-From": src, "Stream-Fork-Offset": format_offset(20)}
        )
        assert status == 201
        r = await retained(h, fork)
        assert r == 10  # what the source no longer retains, its fork never had
        status, headers, raw = await h.http("GET", fork + "?offset=-1")
        assert status == 200
        assert int(headers["Stream-Next-Offset"].replace("_", "")) - r == len(raw), (
            "body shorter than its range"
        )
        assert raw == (b"A" * 10 + b"B" * 10)[r:]

    run(tmp_path, body)
