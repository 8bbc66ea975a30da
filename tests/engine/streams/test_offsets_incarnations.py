"""Offsets are never reused: a stream deleted (or expired) and created again at the same path
starts above every offset the path ever issued, so a reader holding an old offset is refused
(410 ``OFFSET_GONE``), never pointed at the new stream's bytes (protocol section 4: a new
stream SHOULD NOT be created at a deleted one's URL; issue 18, defect 10).

* HTTP (in-process server on 127.0.0.1, virtual clock): catch-up, long-poll and SSE refuse
  every old offset with the same 410; HEAD shows the new offsets; ``-1`` reads the new stream;
  a fork offset of an earlier stream at the source's path is 400.
* Re-creation after TTL expiry (replaced by the create itself, or expired by a GC pass).
* After restarts: journal replay (SIGKILL) and snapshot.
* The cold tier: each Parquet row names its incarnation (pyarrow tells the rows of a path's
  streams apart), reads stitch cold and hot byte-exact, objects written before the column
  existed (format 1) still read, ``tiered verify`` stays clean and catches mislabelled rows.
* Consumer groups: a stream with no committed cursor (``-1``) is read from its first offset.
* Forks at a path with history: refused (409 ``PATH_OFFSETS_USED``) when the fork would serve
  one of the path's old offsets; allowed, with old offsets refused, when it cannot.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.gc_support import HttpHarness, VirtualClock, make_config
from tests.support.http_helpers import create, request, stream_url
from tests.support.server_process import ServerProcess
from tiered.cli.verify import verify_cold
from tiered.cold.objects.keys import new_object_key
from tiered.cold.parquet.chunk import FORMAT_KEY, LEGACY_SCHEMA, ColdRecord, encode_chunk, rebuild_index
from tiered.core.ids import format_offset, parse_offset
from tiered.engine.streams.records import ColdCopyCommitted, ColdCopyStarted, CopyRange
from tiered.hot.segment import crc32c
from tiered_client.groups import GroupConsumer

pytestmark = pytest.mark.timeout(120)

OLD_TAIL = 22  # what ``write_history`` leaves: "old data more old data"
FIRST = OLD_TAIL + 1  # where the path's next stream starts: above every offset the first one issued
OCTET = {"Content-Type": "application/octet-stream"}
TEXT = {"Content-Type": "text/plain"}
URL = "/v1/stream/hello"

Body = Callable[[HttpHarness, VirtualClock], Awaitable[None]]


def run(tmp_path: Path, body: Body, **overrides: Any) -> None:
    config = make_config(tmp_path / "data", **overrides)
    clock = VirtualClock()

    async def main() -> None:
        h = HttpHarness(config, clock=clock)
        await h.start()
        try:
            await body(h, clock)
        finally:
            await h.stop()

    asyncio.run(main())


def code_of(raw: bytes) -> str:
    return str(json.loads(raw)["error"]["code"])


def message_of(raw: bytes) -> str:
    return str(json.loads(raw)["error"]["message"])


async def write_history(h: HttpHarness, url: str = URL) -> list[str]:
    """Create a stream, append twice: every offset a reader may hold (the last is the tail)."""
    status, headers, _ = await h.http("PUT", url, headers=TEXT, body="old data")
    assert status == 201
    offsets = [format_offset(0), headers["Stream-Next-Offset"]]
    for more in (" more", " old data"):
        status, headers, _ = await h.http("POST", url, headers=TEXT, body=more)
        assert status == 204
        offsets.append(headers["Stream-Next-Offset"])
    status, _, raw = await h.http("GET", f"{url}?offset=-1")
    assert (status, raw) == (200, b"old data more old data")
    assert parse_offset(offsets[-1]) == OLD_TAIL
    return offsets


async def sse_first_control(h: HttpHarness, url: str, offset: str) -> tuple[int, dict[str, Any] | None, str]:
    """(status, the first control event, the data before it) of a ``live=sse`` read."""
    async with h.session.get(f"{h.url}{url}?offset={offset}&live=sse") as resp:
        if resp.status != 200:
            return resp.status, None, (await resp.read()).decode()
        buf = b""
        async with asyncio.timeout(10):
            while b"event: control" not in buf or not buf.endswith(b"\n\n"):
                buf += await resp.content.readany()
    data, control = "", None
    for event in buf.decode().split("\n\n"):
        lines = event.split("\n")
        if lines[0] == "event: data":
            data += "\n".join(line[len("data:") :] for line in lines[1:])
        elif lines[0] == "event: control" and control is None:
            control = json.loads(lines[1][len("data:") :])
    return 200, control, data


async def assert_refused_everywhere(h: HttpHarness, url: str, old: list[str], first: str) -> None:
    """Every old offset: 410 OFFSET_GONE in catch-up, long-poll and SSE, pointing at ``first``."""
    for offset in old:
        for query in (f"offset={offset}", f"offset={offset}&live=long-poll"):
            status, headers, raw = await h.http("GET", f"{url}?{query}")
            assert (status, code_of(raw)) == (410, "OFFSET_GONE"), (query, status, raw)
            assert headers["Stream-Next-Offset"] == first
            assert "earlier stream at this path" in message_of(raw)
        status, _, text = await sse_first_control(h, url, offset)
        assert status == 410 and code_of(text.encode()) == "OFFSET_GONE", (offset, status, text)


# --------------------------------------------------------------------------- the reproduction


def test_delete_and_create_again_never_reuses_an_offset(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        old = await write_history(h)
        old_etag = (await h.http("GET", URL))[1]["ETag"]
        assert (await h.http("DELETE", URL))[0] == 204

        status, headers, _ = await h.http("PUT", URL, headers=TEXT, body="new")
        assert status == 201
        first = format_offset(FIRST)
        assert headers["Stream-Next-Offset"] == format_offset(FIRST + 3)
        status, headers, _ = await h.http("HEAD", URL)
        assert status == 200
        assert headers["Stream-Next-Offset"] == format_offset(FIRST + 3)
        assert headers["Stream-Retained-Offset"] == first
        assert all(o < first for o in old)  # lexicographic, as clients compare them

        await assert_refused_everywhere(h, URL, old, first)

        # The new stream reads from its own start, in every mode.
        status, headers, raw = await h.http("GET", f"{URL}?offset=-1")
        assert (status, raw) == (200, b"new")
        assert headers["Stream-Next-Offset"] == format_offset(FIRST + 3)
        assert headers["ETag"] != old_etag
        status, headers, raw = await h.http("GET", f"{URL}?offset={first}&live=long-poll")
        assert (status, raw) == (200, b"new")
        status, control, data = await sse_first_control(h, URL, "-1")
        assert (status, data) == (200, "new")
        assert control is not None and control["streamNextOffset"] == format_offset(FIRST + 3)
        status, headers, _ = await h.http("POST", URL, headers=TEXT, body="!")
        assert headers["Stream-Next-Offset"] == format_offset(FIRST + 4)
        status, _, raw = await h.http("GET", f"{URL}?offset={format_offset(FIRST + 3)}")
        assert (status, raw) == (200, b"!")

        # A third incarnation starts above the second.
        assert (await h.http("DELETE", URL))[0] == 204
        status, headers, _ = await h.http("PUT", URL, headers=TEXT)
        assert (status, headers["Stream-Next-Offset"]) == (201, format_offset(FIRST + 5))
        await assert_refused_everywhere(
            h, URL, [*old, first, format_offset(FIRST + 4)], format_offset(FIRST + 5)
        )

    run(tmp_path, body)


def test_a_fork_offset_of_an_earlier_stream_at_the_source_path_is_400(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        old = await write_history(h)
        assert (await h.http("DELETE", URL))[0] == 204
        assert (await h.http("PUT", URL, headers=TEXT, body="new"))[0] == 201
        for offset in old:
            status, _, raw = await h.http(
                "PUT",
                "/v1/stream/fork-of-hello",
                headers={**TEXT, "Stream-Forked-From": URL, "Stream-Fork-Offset": offset},
            )
            assert (status, code_of(raw)) == (400, "BAD_REQUEST"), (offset, raw)
            assert "earlier stream" in message_of(raw)
        assert (await h.http("HEAD", "/v1/stream/fork-of-hello"))[0] == 404
        status, headers, _ = await h.http(
            "PUT",
            "/v1/stream/fork-of-hello",
            headers={**TEXT, "Stream-Forked-From": URL, "Stream-Fork-Offset": format_offset(FIRST + 1)},
        )
        assert status == 201 and headers["Stream-Next-Offset"] == format_offset(FIRST + 1)
        status, _, raw = await h.http("GET", "/v1/stream/fork-of-hello?offset=-1")
        assert (status, raw) == (200, b"n")

    run(tmp_path, body)


# --------------------------------------------------------------------------- TTL expiry


def test_create_again_after_ttl_expiry_starts_above_the_expired_stream(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        # Expired but not yet journaled gone: the create itself replaces it.
        status, headers, _ = await h.http("PUT", URL, headers={**TEXT, "Stream-TTL": "1"}, body="short")
        assert status == 201
        old = [format_offset(0), headers["Stream-Next-Offset"]]
        clock.advance(1500)
        assert (await h.http("HEAD", URL))[0] == 404
        status, headers, _ = await h.http("PUT", URL, headers={**TEXT, "Stream-TTL": "60"}, body="fresh")
        assert (status, headers["Stream-Next-Offset"]) == (201, format_offset(6 + 5))
        await assert_refused_everywhere(h, URL, old, format_offset(6))

        # Expired by a GC pass first, then created again.
        clock.advance(61_000)
        report = await h.gc(clock.now_ms())
        assert report.streams_expired == 1
        status, headers, _ = await h.http("PUT", URL, headers=TEXT, body="third")
        assert (status, headers["Stream-Next-Offset"]) == (201, format_offset(12 + 5))
        await assert_refused_everywhere(h, URL, [*old, format_offset(11)], format_offset(12))

    run(tmp_path, body)


# --------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("crash", [True, False], ids=["replay-after-sigkill", "snapshot"])
def test_incarnations_survive_restarts(tmp_path: Path, crash: bool) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        old = await write_history(h)
        assert (await h.http("DELETE", URL))[0] == 204
        await h.restart(crash=crash)
        # Nothing at the path now; only its history says where the next stream starts.
        status, headers, _ = await h.http("PUT", URL, headers=TEXT, body="new")
        assert (status, headers["Stream-Next-Offset"]) == (201, format_offset(FIRST + 3))
        await h.restart(crash=crash)
        assert (await h.http("HEAD", URL))[1]["Stream-Next-Offset"] == format_offset(FIRST + 3)
        await assert_refused_everywhere(h, URL, old, format_offset(FIRST))
        assert (await h.http("GET", f"{URL}?offset=-1"))[2] == b"new"
        assert (await h.http("DELETE", URL))[0] == 204
        await h.restart(crash=crash)
        status, headers, _ = await h.http("PUT", URL, headers=TEXT)
        assert (status, headers["Stream-Next-Offset"]) == (201, format_offset(FIRST + 4))

    run(tmp_path, body)


# --------------------------------------------------------------------------- the cold tier


def test_cold_rows_carry_the_incarnation_and_reads_stitch_both_tiers(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await write_history(h)
        assert await h.flush() == 1
        assert (await h.http("DELETE", URL))[0] == 204
        assert (await h.http("PUT", URL, headers=TEXT, body="new"))[0] == 201
        assert (await h.http("POST", URL, headers=TEXT, body=" cold"))[0] == 204
        assert await h.flush() == 1
        assert (await h.http("POST", URL, headers=TEXT, body=" hot"))[0] == 204
        assert h.slice_kinds("default", "hello") == ["ColdSlice", "HotSlice"]
        status, headers, raw = await h.http("GET", f"{URL}?offset=-1")
        assert (status, raw) == (200, b"new cold hot")
        status, _, raw = await h.http("GET", f"{URL}?offset={format_offset(FIRST + 2)}")
        assert (status, raw) == (200, b"w cold hot")
        await assert_refused_everywhere(h, URL, [format_offset(0), format_offset(8)], format_offset(FIRST))

        # Any Parquet reader tells the two streams that held default/hello apart.
        rows = []
        for path in sorted((h.config.data_path / "cold" / "data").glob("*.parquet")):
            t = pq.read_table(path)
            assert t.schema.field("incarnation").type == "int64"
            rows += t.select(["bucket", "stream", "incarnation", "start_offset", "end_offset"]).to_pylist()
        by_incarnation: dict[int, list[tuple[int, int]]] = {}
        for r in rows:
            assert (r["bucket"], r["stream"]) == ("default", "hello")
            by_incarnation.setdefault(r["incarnation"], []).append((r["start_offset"], r["end_offset"]))
        assert by_incarnation == {0: [(0, 8), (8, 13), (13, 22)], 1: [(23, 26), (26, 31)]}
        report = await verify_cold(h.s.state, h.s.store)
        assert report.ok and report.objects == 2 and report.ranges == 1, report.errors

    run(tmp_path, body)


# --------------------------------------------------------------------------- forks at a reused path


def test_a_fork_that_would_serve_an_old_offset_of_its_path_is_refused(tmp_path: Path) -> None:
    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        assert (await h.http("PUT", "/v1/stream/src", headers=TEXT, body="source bytes"))[0] == 201
        fork = {**TEXT, "Stream-Forked-From": "/v1/stream/src"}
        status, headers, _ = await h.http(
            "PUT", URL, headers={**fork, "Stream-Fork-Offset": format_offset(6)}
        )
        assert status == 201
        assert (await h.http("POST", URL, headers=TEXT, body=" mine"))[0] == 204
        old = [format_offset(0), format_offset(6), format_offset(11)]
        assert (await h.http("DELETE", URL))[0] == 204

        # Forking src again at the same path would serve offsets 0..11 again: refused, nothing created.
        for offset in (format_offset(0), format_offset(6), format_offset(12)):
            status, _, raw = await h.http("PUT", URL, headers={**fork, "Stream-Fork-Offset": offset})
            assert (status, code_of(raw)) == (409, "PATH_OFFSETS_USED"), (offset, raw)
        assert (await h.http("HEAD", URL))[0] == 404

        # A plain stream may take the path (above its old offsets), and so may a fork of it elsewhere.
        assert (await h.http("PUT", URL, headers=TEXT, body="plain"))[0] == 201
        await assert_refused_everywhere(h, URL, old, format_offset(12))

        # A fork whose offsets all lie above the path's history may take a reused path.
        assert (await h.http("PUT", "/v1/stream/other", headers=TEXT, body="x"))[0] == 201
        assert (await h.http("DELETE", "/v1/stream/other"))[0] == 204
        status, headers, _ = await h.http(
            "PUT", "/v1/stream/other", headers={**TEXT, "Stream-Forked-From": URL}
        )
        assert (status, headers["Stream-Next-Offset"]) == (201, format_offset(12 + 5))
        assert (await h.http("GET", "/v1/stream/other?offset=-1"))[2] == b"plain"
        await assert_refused_everywhere(
            h, "/v1/stream/other", [format_offset(0), format_offset(1)], format_offset(12)
        )

    run(tmp_path, body)


# --------------------------------------------------------------------------- consumer groups


def test_a_consumer_group_reads_a_re_created_stream_from_its_start(tmp_path: Path) -> None:
    """No cursor committed: the view shows the re-created stream's first offset, and the client reads from it."""
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "2").start()
    try:
        url = stream_url(srv.url, "g/s")
        assert create(url, "text/plain", "old\n")[0] == 201
        assert request("DELETE", url)[0] == 204
        assert create(url, "text/plain", "new\n")[0] == 201
        body = json.dumps({"streams": ["g/s"]})
        status, _, raw = request(
            "PUT", f"{srv.url}/v1/groups/grp", {"Content-Type": "application/json"}, body
        )
        assert status == 201, raw
        assert [t["cursor"] for t in json.loads(raw)["targets"]] == [format_offset(5)]

        async def consume() -> None:
            async with GroupConsumer(srv.url, "grp", "m1", wait_ms=500) as consumer:
                batch = await asyncio.wait_for(consumer.__anext__(), 20)
                assert (batch.offset, batch.next_offset, batch.data) == (
                    format_offset(5),
                    format_offset(9),
                    b"new\n",
                )
                assert consumer.commit(batch)  # sent with the next heartbeat
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while loop.time() < deadline:
                    _, _, raw = await asyncio.to_thread(request, "GET", f"{srv.url}/v1/groups/grp")
                    if json.loads(raw)["targets"][0]["cursor"] == format_offset(9):
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"the commit never landed: {raw!r}")

        asyncio.run(consume())
    finally:
        srv.stop()


# --------------------------------------------------------------------------- objects of both formats, verify


async def commit_object(h: HttpHarness, path: str, blob_of: Callable[[list[ColdRecord]], bytes]) -> str:
    """Copy the stream's hot records into an object made by ``blob_of`` and commit it (as a flusher)."""
    s = h.s.state.find("default", path)
    assert s is not None
    c = s.chunks
    records = [
        ColdRecord(s.bucket, s.path, start, start + n, ts, h.s.log.read(seg, pos, n), s.incarnation)
        for start, n, seg, pos, ts in zip(c.starts, c.lens, c.segs, c.poss, c.times, strict=True)
    ]
    blob = blob_of(records)
    now = h.clock.now_ms()
    key = new_object_key(now)
    ranges = (CopyRange(s.uid, records[0].start_offset, records[-1].end_offset),)
    await h.s.store.put(key, blob)
    started = ColdCopyStarted(key=key, ts_ms=now, ranges=ranges)
    index = rebuild_index(blob)
    committed = ColdCopyCommitted(
        key=key, ts_ms=now, size=len(blob), crc32c=crc32c(blob), index=index, ranges=ranges
    )
    await h.s.committer.commit([started, committed])
    assert s.cold_end == records[-1].end_offset
    return key


def format_1(records: list[ColdRecord]) -> bytes:
    """An object as servers wrote them before incarnations were recorded (no ``incarnation`` column)."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, LEGACY_SCHEMA, compression="zstd", write_page_checksum=True) as writer:
        columns = {name: [getattr(r, name) for r in records] for name in LEGACY_SCHEMA.names}
        writer.write_table(pa.table(columns, schema=LEGACY_SCHEMA), row_group_size=len(records))
        writer.add_key_value_metadata({FORMAT_KEY: b"1"})
    return bytes(sink.getvalue().to_pybytes())


def test_objects_of_both_formats_are_read_and_verified(tmp_path: Path) -> None:
    """A stream whose older data is in a format-1 object (no incarnation column) and newer data in
    format-2 ones reads byte-exact across both and the hot tier; verify is clean, and catches rows
    that name another incarnation than their stream's."""

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        assert (await h.http("PUT", URL, headers=TEXT, body="legacy "))[0] == 201
        await commit_object(h, "hello", format_1)  # as an old server flushed it
        assert (await h.http("POST", URL, headers=TEXT, body="new-format "))[0] == 204
        assert await h.flush() == 1
        assert (await h.http("POST", URL, headers=TEXT, body="hot"))[0] == 204
        assert h.slice_kinds("default", "hello") == ["ColdSlice", "ColdSlice", "HotSlice"]
        assert (await h.http("GET", f"{URL}?offset=-1"))[2] == b"legacy new-format hot"
        assert (await h.http("GET", f"{URL}?offset={format_offset(3)}"))[2] == b"acy new-format hot"
        report = await verify_cold(h.s.state, h.s.store)
        assert report.ok and report.ranges == 2, report.errors

        # A second incarnation, and an object whose rows claim another one: verify names it.
        assert (await h.http("DELETE", URL))[0] == 204
        assert (await h.http("PUT", URL, headers=TEXT, body="second"))[0] == 201
        assert h.s.state.find("default", "hello").incarnation == 1  # type: ignore[union-attr]

        def mislabelled(records: list[ColdRecord]) -> bytes:
            return encode_chunk([msgspec.structs.replace(r, incarnation=7) for r in records])[0]

        key = await commit_object(h, "hello", mislabelled)
        assert (await h.http("GET", f"{URL}?offset=-1"))[2] == b"second"  # the bytes themselves are fine
        report = await verify_cold(h.s.state, h.s.store)
        assert report.errors == [
            f"{key}: default/hello [22, 28): rows are of incarnation 7, the stream is incarnation 1"
        ]

    run(tmp_path, body)
