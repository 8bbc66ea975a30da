"""Streams keyed by header (issue 21): ``Stream-Key`` per append, tombstones, the key index the compactor keeps.

* A stream of any content type created with ``Stream-Compaction-Key: header`` needs a
  ``Stream-Key`` on every append with a body; malformed keys, a key on another stream, a
  tombstone with a body are refused with their 400 codes and store nothing.
* ``GET {stream}?key=K`` answers the newest append of ``K`` and its offset, before any
  compaction (from the journal's pending keys), after it (from the key index object), and
  after new appends and tombstones (index plus what it does not cover); never a superseded
  or deleted one.
* A model-based property test: random keyed appends, tombstones, flushes, compactions and
  restarts (clean and crash); after every step reads of the whole stream and of every key
  equal the model.
* A crash at each step of an index write (intent, upload, commit) loses nothing and leaks
  no object once reconciliation ran; a deleted stream's index object goes after the grace.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gc_support import T0, HttpHarness, make_config
from tests.support.metrics_helpers import samples
from tiered.cold.parquet.chunk_index import ColdDataDamaged
from tiered.core.errors import TieredError
from tiered.engine.streams import header_keys, key_index_file
from tiered.engine.streams.keyed import merge
from tiered.engine.streams.model import KeyedAppend, KeyIndexRef, Stream

pytestmark = pytest.mark.timeout(300)

TEXT = "text/plain"
DELAY_S = 100.0
DELAY_MS = int(DELAY_S * 1000)
URL = "/v1/stream/hk"


def _harness(tmp_path: Path) -> HttpHarness:
    return HttpHarness(make_config(tmp_path / "data", compaction_tombstone_delay_s=DELAY_S))


async def _create(h: HttpHarness, path: str = URL, content_type: str = TEXT, **extra: str) -> int:
    headers = {"Content-Type": content_type, "Stream-Compaction-Key": "header", **extra}
    status, _, _ = await h.http("PUT", path, headers=headers)
    return status


async def _append(
    h: HttpHarness, key: str | None, body: bytes, path: str = URL, **extra: str
) -> tuple[int, Any, bytes]:
    headers = {"Content-Type": TEXT, **extra}
    if key is not None:
        headers["Stream-Key"] = key
    return await h.http("POST", path, body=body, headers=headers)


async def _tombstone(h: HttpHarness, key: str, path: str = URL) -> int:
    status, _, body = await _append(h, key, b"", path, **{"Stream-Key-Tombstone": "true"})
    assert status == 204, body
    return status


async def _read_all(h: HttpHarness, path: str = URL) -> bytes:
    out = b""
    offset = "-1"
    for _ in range(10_000):
        status, headers, body = await h.http("GET", f"{path}?offset={offset}")
        assert status == 200, (status, body)
        out += body
        offset = headers["Stream-Next-Offset"]
        if headers.get("Stream-Up-To-Date") == "true":
            return out
    raise AssertionError("the read never caught up")


async def _key(h: HttpHarness, key: str, path: str = URL) -> tuple[int, Any, bytes]:
    return await h.http("GET", f"{path}?key={key}")


async def _tail(h: HttpHarness, path: str = URL) -> str:
    status, headers, _ = await h.http("HEAD", path)
    assert status == 200
    return str(headers["Stream-Next-Offset"])


def _code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


# --------------------------------------------------------------------------- pure parts


def _entry(key: str, start: int, end: int, tombstone: bool = False, ts: int = 0) -> KeyedAppend:
    return KeyedAppend(start, end, key, tombstone, ts)


def test_index_file_round_trip_lookup_and_damage() -> None:
    entries = [_entry(f"k{i:05d}", i * 10, i * 10 + 10, i % 7 == 0, i) for i in range(3000)]
    data, footer_length = key_index_file.encode(entries, block_entries=100)
    import google_crc32c

    ref = KeyIndexRef("data/x.keys", len(data), google_crc32c.value(data), footer_length, 0, len(entries), 0)
    assert list(key_index_file.decode_all(ref, data)) == entries
    fetches: list[tuple[int, int]] = []

    async def fetch(a: int, b: int) -> bytes:
        fetches.append((a, b))
        return data[a:b]

    async def lookups() -> None:
        cache = key_index_file.FooterCache()
        for e in (entries[0], entries[1234], entries[-1]):
            assert await key_index_file.lookup(ref, fetch, e.key, cache) == e
        for missing in ("", "k", "k01234x", "z"):
            assert await key_index_file.lookup(ref, fetch, missing, cache) is None
        assert len(fetches) <= 1 + 7  # the footer once, then one block a lookup at most

    asyncio.run(lookups())
    flipped = bytearray(data)
    flipped[5] ^= 1
    with pytest.raises(ColdDataDamaged):
        list(key_index_file.decode_all(ref, bytes(flipped)))
    with pytest.raises(ColdDataDamaged):
        key_index_file.decode_block(
            "x", key_index_file.decode_footer("x", data).blocks[0], bytes(flipped[:100])
        )
    empty, n = key_index_file.encode([])
    assert key_index_file.decode_footer("e", empty[-n:]).blocks == ()


def _plan(s: Stream, old: list[KeyedAppend], now_ms: int) -> tuple[header_keys.IndexPlan, list[KeyedAppend]]:
    plan, entries = header_keys.plan_index(s, old, now_ms=now_ms, tombstone_delay_ms=100)
    return plan, list(entries)  # the plan is final once every entry is taken


def test_plan_index_keeps_newest_per_key_and_drops_due_tombstones() -> None:
    s = Stream(1, "b", "p", TEXT, None, None, None, 0, None, 0, None, 100, compaction_key="header")
    s.cold_end = 60
    s.pending_keys = [
        _entry("a", 0, 10),
        _entry("b", 10, 20),
        _entry("a", 20, 30),
        _entry("b", 30, 30, True, ts=5),  # a tombstone of b
        _entry("c", 30, 60),
        _entry("a", 60, 70),  # hot: not folded, supersedes nothing yet
    ]
    plan, entries = _plan(s, [], 10)
    assert plan.removed == [(0, 20)] and plan.superseded == 2
    assert [e.key for e in entries] == ["a", "b", "c"] and entries[0].start == 20 and plan.keys == 3
    assert plan.folded == 5 and plan.covers_to == 60 and plan.tombstone_due_ms == 105
    later, later_entries = _plan(s, [], 105)
    assert [e.key for e in later_entries] == ["a", "c"] and later.tombstone_due_ms is None
    # Folding into an existing index: its older entry of a key becomes a hole; the merge keeps key order.
    s.pending_keys = [_entry("c", 60, 70), _entry("0", 70, 71), _entry("bb", 71, 72), _entry("z", 72, 73)]
    s.cold_end = 73
    again, again_entries = _plan(s, entries, 10)
    assert again.removed == [(30, 60)] and again.folded == 4 and again.covers_to == 73
    assert [(e.key, e.start) for e in again_entries] == [
        ("0", 70),
        ("a", 20),
        ("b", 30),
        ("bb", 71),
        ("c", 60),
        ("z", 72),
    ]
    # Nothing to fold, nothing due: no change.
    s.pending_keys = []
    assert not _plan(s, again_entries, 10)[0].changed
    # Retention past an indexed append drops it.
    s.retained_from = 25
    dropped, kept = _plan(s, again_entries, 10)
    assert dropped.changed and [e.key for e in kept] == ["0", "b", "bb", "c", "z"]


@settings(max_examples=200, deadline=None)
@given(
    old_keys=st.lists(st.sampled_from("abcdefgh"), unique=True),
    pending=st.lists(st.tuples(st.sampled_from("abcdefghij"), st.booleans()), max_size=12),
    now=st.integers(0, 300),
)
def test_plan_index_merge_equals_a_dictionary(old_keys: list[str], pending: list[Any], now: int) -> None:
    """The streaming merge gives what folding into a dictionary of every key gives: the newest per key,
    due tombstones gone, each superseded append with bytes a hole."""
    old = [_entry(k, i * 10, i * 10 + 5, False, 0) for i, k in enumerate(sorted(old_keys))]
    base = len(old) * 10
    s = Stream(1, "b", "p", TEXT, None, None, None, 0, None, 0, None, base, compaction_key="header")
    s.pending_keys = []
    for key, tomb in pending:
        size = 0 if tomb else 3
        s.pending_keys.append(_entry(key, s.tail, s.tail + size, tomb, ts=s.tail))
        s.tail += size
    s.cold_end = s.tail
    newest = {e.key: e for e in old}
    holes = []
    for e in s.pending_keys:
        prev = newest.get(e.key)
        if prev is not None and prev.end > prev.start:
            holes.append((prev.start, prev.end))
        newest[e.key] = e
    want = [newest[k] for k in sorted(newest) if not (newest[k].tombstone and newest[k].ts_ms + 100 <= now)]
    plan, got = _plan(s, old, now)
    assert got == want and plan.keys == len(want)
    assert plan.removed == merge(holes) and plan.superseded == len(holes)


def test_key_headers_parse() -> None:
    assert header_keys.parse_key_headers({}) == (None, False)
    assert header_keys.parse_key_headers({"Stream-Key": "a b/~!"}) == ("a b/~!", False)
    assert header_keys.parse_key_headers({"Stream-Key": "k", "Stream-Key-Tombstone": "TRUE"}) == ("k", True)
    assert header_keys.parse_key_headers({"Stream-Key": "k", "Stream-Key-Tombstone": "false"}) == ("k", False)
    for bad in (
        {"Stream-Key": ""},
        {"Stream-Key": "x" * 257},
        {"Stream-Key": "ü"},  # not ASCII: a header's bytes and a query's text could name different keys
        {"Stream-Key": "a\tb"},
        {"Stream-Key-Tombstone": "true"},
        {"Stream-Key": "k", "Stream-Key-Tombstone": "yes"},
    ):
        with pytest.raises(TieredError) as err:
            header_keys.parse_key_headers(bad)
        assert err.value.code.value == "STREAM_KEY_INVALID"
    assert header_keys.parse_key_headers({"Stream-Key": "x" * 256})[0] == "x" * 256


# --------------------------------------------------------------------------- HTTP


def test_bad_input_is_refused_with_its_code_and_stores_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            assert await _create(h) == 200  # the same create again
            assert await _create(h, content_type="text/plain", **{"Stream-TTL": "100"}) == 409
            status, _, _ = await h.http("PUT", URL, headers={"Content-Type": TEXT})
            assert status == 409  # not keyed: another stream
            status, _, body = await h.http(
                "PUT",
                "/v1/stream/body",
                body=b"x",
                headers={"Content-Type": TEXT, "Stream-Compaction-Key": "header"},
            )
            assert (status, _code(body)) == (400, "STREAM_KEY_INVALID")  # created empty, appended with keys
            assert (await h.http("HEAD", "/v1/stream/body"))[0] == 404
            status, headers, _ = await h.http("HEAD", URL)
            assert headers["Stream-Compaction-Key"] == "header"
            tail = await _tail(h)
            refusals = [
                ((None, b"x"), {}, "STREAM_KEY_REQUIRED"),
                (("", b"x"), {}, "STREAM_KEY_INVALID"),
                (("k" * 257, b"x"), {}, "STREAM_KEY_INVALID"),
                (("k", b"x"), {"Stream-Key-Tombstone": "true"}, "STREAM_KEY_INVALID"),  # a tombstone is empty
                (("k", b""), {"Stream-Key-Tombstone": "maybe"}, "STREAM_KEY_INVALID"),
                ((None, b""), {"Stream-Key-Tombstone": "true"}, "STREAM_KEY_INVALID"),
                (("k", b""), {"Stream-Closed": "true"}, "STREAM_KEY_INVALID"),  # a key on an empty append
            ]
            for (key, body_), extra, code in refusals:
                status, _, body = await _append(h, key, body_, **extra)
                assert (status, _code(body)) == (400, code), (key, extra, body)
            assert await _tail(h) == tail
            assert h.s.streams.lookup("default", "hk").pending_keys == []
            # Another stream refuses the header: not keyed, or keyed by a JSON pointer.
            await h.http("PUT", "/v1/stream/plain", headers={"Content-Type": TEXT})
            status, _, body = await _append(h, "k", b"x", "/v1/stream/plain")
            assert (status, _code(body)) == (400, "STREAM_KEY_NOT_ALLOWED")
            await h.http(
                "PUT",
                "/v1/stream/ptr",
                headers={"Content-Type": "application/json", "Stream-Compaction-Key": "/id"},
            )
            status, _, body = await h.http(
                "POST",
                "/v1/stream/ptr",
                body=b'[{"id":1}]',
                headers={"Content-Type": "application/json", "Stream-Key": "1"},
            )
            assert (status, _code(body)) == (400, "STREAM_KEY_NOT_ALLOWED")
            assert (await _read_all(h, "/v1/stream/plain")) == b""
            # A fork cannot be keyed by header.
            status, _, body = await h.http(
                "PUT",
                "/v1/stream/fork",
                headers={"Content-Type": TEXT, "Stream-Compaction-Key": "header", "Stream-Forked-From": URL},
            )
            assert (status, _code(body)) == (400, "STREAM_KEY_INVALID")
            # A close-only append needs no key; the stream is then closed as any.
            status, _, _ = await _append(h, "a", b"1")
            assert status == 204
            status, headers, _ = await _append(h, None, b"", **{"Stream-Closed": "true"})
            assert status == 204 and headers["Stream-Closed"] == "true"
        finally:
            await h.stop()

    asyncio.run(main())


def test_key_reads_before_and_after_compaction_new_appends_and_restarts(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            offsets: dict[bytes, str] = {}
            for key, body in (("a", b"a1;"), ("b", b"b1;"), ("a", b"a2;"), ("c", b"c1;")):
                offsets[body] = await _tail(h)
                assert (await _append(h, key, body))[0] == 204
            await _tombstone(h, "c")
            tomb_c = await _tail(h)

            async def expect(key: str, body: bytes | None, deleted_at: str | None = None) -> None:
                status, headers, got = await _key(h, key)
                if body is None:
                    assert (status, _code(got)) == (404, "KEY_NOT_FOUND"), got
                    assert headers.get("Stream-Key-Offset") == deleted_at
                    return
                assert status == 200, got
                assert got == body and headers["Stream-Key"] == key
                assert headers["Stream-Key-Offset"] == offsets[body]
                assert headers["Stream-Next-Offset"] == await _tail(h)

            async def all_reads(stream: bytes) -> None:
                assert await _read_all(h) == stream
                await expect("a", b"a2;")
                await expect("b", b"b1;")
                await expect("c", None, tomb_c)
                await expect("zz", None)

            await all_reads(b"a1;b1;a2;c1;")
            assert await h.flush() == 1
            dry = await h.gc(T0, dry_run=True)  # announces, changes nothing
            assert dry.errors == [] and dry.key_indexes_written == 0 and dry.messages_compacted == 2
            assert [(w["path"], w["keys"]) for w in dry.would_compact] == [("hk", 3)]
            assert h.s.streams.lookup("default", "hk").key_index is None
            await all_reads(b"a1;b1;a2;c1;")
            report = await h.gc(T0)
            assert report.errors == [] and report.key_indexes_written == 1
            assert report.streams_compacted == 1 and report.messages_compacted == 2  # a1 and c1
            s = h.s.streams.lookup("default", "hk")
            assert s.key_index is not None and s.pending_keys == [] and s.key_index.keys == 3
            await all_reads(b"b1;a2;")
            # New appends after the index: the pending suffix wins over the index.
            for key, body in (("b", b"b2;"), ("c", b"c2;")):
                offsets[body] = await _tail(h)
                assert (await _append(h, key, body))[0] == 204
            await _tombstone(h, "a")
            tomb_a = await _tail(h)
            assert await _read_all(h) == b"b1;a2;b2;c2;"
            await expect("b", b"b2;")
            await expect("c", b"c2;")
            await expect("a", None, tomb_a)
            for crash in (True, False):
                await h.restart(crash=crash)
                await expect("b", b"b2;")
                await expect("a", None, tomb_a)
            await h.flush()
            report = await h.gc(T0 + 1)
            assert report.errors == [] and report.messages_compacted == 2  # b1 and a2
            assert await _read_all(h) == b"b2;c2;"
            await expect("b", b"b2;")
            await expect("c", b"c2;")
            await expect("a", None, tomb_a)
            # Past the delay the tombstones leave the index: the keys are simply unknown.
            report = await h.gc(T0 + 10 * DELAY_MS)
            assert report.errors == [] and report.key_indexes_written == 1
            await expect("a", None)
            await expect("c", b"c2;")
            await h.restart(crash=True)
            await expect("a", None)
            await expect("c", b"c2;")
            assert await _read_all(h) == b"b2;c2;"
            # A key read takes no offset; the key is the raw text sent in Stream-Key.
            assert (await h.http("GET", f"{URL}?key=b&offset=-1"))[0] == 400
            status, _, body = await _key(h, "")
            assert (status, _code(body)) == (400, "STREAM_KEY_INVALID")
            # The old index objects went through GC: after the grace nothing is left over.
            for at in (T0 + 10 * DELAY_MS + 1, T0 + 20 * DELAY_MS, T0 + 30 * DELAY_MS):
                assert (await h.gc(at, reconcile=True)).errors == []
            stored = {i.key async for i in h.s.store.list("data/")}
            assert stored == set(h.s.state.cold_objects)
            assert all(o.refs > 0 for o in h.s.state.cold_objects.values())
            assert sum(1 for k in stored if k.endswith(".keys")) == 1
        finally:
            await h.stop()

    asyncio.run(main())


def test_idempotent_producers_and_conditional_appends_with_keys(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            producer = {"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
            status, _, _ = await _append(h, "a", b"one;", **producer)
            assert status == 200
            status, _, _ = await _append(h, "a", b"one;", **producer)  # a retry: a duplicate, stored once
            assert status == 204
            assert len(h.s.streams.lookup("default", "hk").pending_keys) == 1
            tail = await _tail(h)
            status, _, _ = await _append(h, "b", b"two;", **{"Stream-Expected-Offset": tail})
            assert status == 204
            status, _, _ = await _append(h, "b", b"three;", **{"Stream-Expected-Offset": tail})
            assert status == 412  # the tail moved: nothing stored, no key kept
            assert len(h.s.streams.lookup("default", "hk").pending_keys) == 2
            status, _, body = await _key(h, "b")
            assert (status, body) == (200, b"two;")
        finally:
            await h.stop()

    asyncio.run(main())


def test_json_stream_keyed_by_header(tmp_path: Path) -> None:
    """A JSON stream keyed by header: the key names the append (all its messages); ``?key`` answers them as an array."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h, content_type="application/json") == 201
            for key, msgs in (("x", [{"v": 1}, {"v": 2}]), ("y", [{"v": 3}]), ("x", [{"v": 4}])):
                status, _, body = await h.http(
                    "POST",
                    URL,
                    body=json.dumps(msgs),
                    headers={"Content-Type": "application/json", "Stream-Key": key},
                )
                assert status == 204, body
            status, _, body = await _key(h, "x")
            assert status == 200 and json.loads(body) == [{"v": 4}]
            await h.flush()
            assert (await h.gc(T0)).messages_compacted == 1
            status, _, body = await h.http("GET", f"{URL}?offset=-1")
            assert json.loads(body) == [{"v": 3}, {"v": 4}]
        finally:
            await h.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- model-based property test


class Model:
    """The appends of a header-keyed byte stream and what compaction removed.

    An append is (key, body, tombstone, offset, ts); ``cold_end`` is the tail at the last flush.
    A compaction at ``now`` folds the appends wholly below ``cold_end`` in order: an older
    append of a folded key is removed; a folded newest tombstone ``DELAY_MS`` old is forgotten.
    """

    def __init__(self) -> None:
        self.appends: list[tuple[str, bytes, bool, int, int]] = []
        self.tail = 0
        self.cold_end = 0
        self.folded = 0
        self.newest: dict[str, int] = {}  # key -> index of its newest folded append
        self.gone: set[int] = set()

    def append(self, key: str, body: bytes, tombstone: bool, ts: int) -> None:
        self.appends.append((key, body, tombstone, self.tail, ts))
        self.tail += len(body)

    def compact(self, now: int) -> None:
        while self.folded < len(self.appends):
            key, body, _, offset, _ = self.appends[self.folded]
            if offset + len(body) > self.cold_end:
                break
            prev = self.newest.get(key)
            if prev is not None:
                self.gone.add(prev)
            self.newest[key] = self.folded
            self.folded += 1
        for key, i in list(self.newest.items()):
            if self.appends[i][2] and self.appends[i][4] + DELAY_MS <= now:
                del self.newest[key]
                self.gone.add(i)

    def stream(self) -> bytes:
        return b"".join(a[1] for i, a in enumerate(self.appends) if i not in self.gone)

    def key(self, key: str) -> tuple[int, bytes | None, int | None]:
        """(status, body, tombstone offset) of ``?key=``."""
        for i in range(len(self.appends) - 1, -1, -1):
            k, body, tombstone, offset, _ = self.appends[i]
            if k != key:
                continue
            if i in self.gone:
                return 404, None, None  # a forgotten tombstone (a superseded one has a newer append)
            return (404, None, offset) if tombstone else (200, body, offset)
        return 404, None, None


KEYS = ["a", "b", "c"]
op = st.tuples(st.sampled_from(KEYS), st.booleans())  # (key, tombstone)
round_ = st.tuples(
    st.lists(op, min_size=1, max_size=5),
    st.booleans(),  # flush
    st.one_of(st.none(), st.integers(0, 2)),  # compaction after 0, 1 or 2 tombstone delays
    st.one_of(st.none(), st.booleans()),  # restart (crash or clean)
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(round_, min_size=1, max_size=6))
def test_reads_equal_the_model(tmp_path_factory: pytest.TempPathFactory, rounds: list[Any]) -> None:
    tmp_path = tmp_path_factory.mktemp("hk")

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        model = Model()
        try:
            assert await _create(h) == 201
            for ops, flush, delays, restart in rounds:
                for key, tombstone in ops:
                    body = b"" if tombstone else f"{key}{len(model.appends)};".encode()
                    if tombstone:
                        await _tombstone(h, key)
                    else:
                        assert (await _append(h, key, body))[0] == 204
                    model.append(key, body, tombstone, h.clock.now_ms())
                if flush:
                    await h.flush()
                    model.cold_end = model.tail
                if delays is not None:
                    now = h.clock.advance(delays * DELAY_MS)
                    report = await h.gc(now)
                    assert report.errors == [], report.errors
                    model.compact(now)
                if restart is not None:
                    await h.restart(crash=restart)
                await _check(h, model)
        finally:
            await h.stop()

    asyncio.run(main())


async def _check(h: HttpHarness, model: Model) -> None:
    assert await _read_all(h) == model.stream()
    for key in KEYS:
        status, headers, body = await _key(h, key)
        want_status, want_body, want_offset = model.key(key)
        assert status == want_status, (key, body)
        if want_body is not None:
            assert body == want_body
        got_offset = headers.get("Stream-Key-Offset")
        assert (None if got_offset is None else _offset(got_offset)) == want_offset, key


def _offset(raw: str) -> int:
    from tiered.core.ids import parse_offset

    value = parse_offset(raw)
    assert value is not None
    return value


# --------------------------------------------------------------------------- crashes


class Crash(BaseException):
    """A simulated SIGKILL at a step of an index write (BaseException: nothing catches it)."""


@pytest.mark.parametrize("step", ["intent", "upload", "commit"])
def test_crash_at_every_step_of_an_index_write(tmp_path: Path, step: str) -> None:
    """Killed after the intent, after the upload, or after the commit: the stream reads all of it
    or exactly the compacted view; the next pass finishes; after reconciliation no object is left
    that the metadata does not own, and every owned one exists."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            for i, key in enumerate("abab"):
                assert (await _append(h, key, f"{key}{i};".encode()))[0] == 204
            await h.flush()
            [compaction] = [t for t in h.s.gc.tasks if t.name == "compaction"]
            indexer = compaction.indexer  # type: ignore[attr-defined]

            async def crash(at: str) -> None:
                if at == step:
                    raise Crash()

            indexer.steps = crash
            with pytest.raises(Crash):
                await h.gc(T0)
            await h.restart(crash=True)
            everything, compacted = b"a0;b1;a2;b3;", b"a2;b3;"
            assert await _read_all(h) == (compacted if step == "commit" else everything)
            for key, want in (("a", b"a2;"), ("b", b"b3;")):
                status, _, body = await _key(h, key)
                assert (status, body) == (200, want)
            report = await h.gc(T0)
            assert report.errors == [] and report.key_indexes_written == (0 if step == "commit" else 1)
            assert await _read_all(h) == compacted
            await h.restart(crash=True)
            assert await _read_all(h) == compacted
            for at in (T0 + 1, T0 + 20_000, T0 + 40_000):
                assert (await h.gc(at, reconcile=True)).errors == []
            stored = {i.key async for i in h.s.store.list("data/")}
            assert stored == set(h.s.state.cold_objects)
            assert all(o.refs > 0 for o in h.s.state.cold_objects.values())
            assert sum(1 for k in stored if k.endswith(".keys")) == 1
        finally:
            await h.stop()

    asyncio.run(main())


def test_a_deleted_streams_index_is_released(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            assert (await _append(h, "a", b"1;"))[0] == 204
            await h.flush()
            assert (await h.gc(T0)).key_indexes_written == 1
            assert (await h.http("DELETE", URL))[0] == 204
            for at in (T0 + 1, T0 + 20_000, T0 + 40_000):
                assert (await h.gc(at, reconcile=True)).errors == []
            await h.restart(crash=True)
            stored = {i.key async for i in h.s.store.list("data/")}
            assert stored == set(h.s.state.cold_objects) and not any(k.endswith(".keys") for k in stored)
        finally:
            await h.stop()

    asyncio.run(main())


def test_a_damaged_index_is_an_integrity_error(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            assert (await _append(h, "a", b"1;"))[0] == 204
            await h.flush()
            assert (await h.gc(T0)).key_indexes_written == 1
            s = h.s.streams.lookup("default", "hk")
            assert s.key_index is not None
            data = bytearray(await h.s.store.get(s.key_index.key))
            data[2] ^= 0xFF
            await h.s.store.delete(s.key_index.key)
            await h.s.store.put(s.key_index.key, bytes(data))
            h.s.streams.key_footers = key_index_file.FooterCache()
            status, _, body = await _key(h, "a")
            assert (status, _code(body)) == (502, "DATA_DAMAGED")
            assert (await _append(h, "b", b"2;"))[0] == 204
            await h.flush()
            report = await h.gc(T0 + 1)
            assert report.key_indexes_written == 0 and report.errors  # skipped, reported
        finally:
            await h.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- streams keyed by a JSON pointer

JSON = "application/json"
PTR = "/v1/stream/ptr"


async def _ptr_append(h: HttpHarness, messages: list[Any]) -> None:
    status, _, body = await h.http("POST", PTR, body=json.dumps(messages), headers={"Content-Type": JSON})
    assert status == 204, body


class PointerModel:
    """Per key (as its JSON text), the newest message and its position in the appended order."""

    def __init__(self) -> None:
        self.newest: dict[str, dict[str, Any]] = {}

    def append(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            self.newest[json.dumps(m["id"])] = m

    def answer(self, key: str) -> tuple[int, Any]:
        m = self.newest.get(key)
        if m is None or m["v"] is None:
            return 404, None
        return 200, m


pointer_round = st.tuples(
    st.lists(st.tuples(st.sampled_from([0, 1, 2, "a"]), st.booleans()), min_size=1, max_size=4),
    st.booleans(),  # flush
    st.booleans(),  # compaction
    st.one_of(st.none(), st.booleans()),  # restart (crash or clean)
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(pointer_round, min_size=1, max_size=6))
def test_pointer_key_reads_from_the_index_equal_the_model(
    tmp_path_factory: pytest.TempPathFactory, rounds: list[Any]
) -> None:
    """A stream keyed by ``/id``: the compactor writes its key index after each pass that changed its cold
    range; ``?key=`` answers from it plus the scan of what follows, equal to the model's newest per key
    (a tombstone inside the delay: 404) through appends, flushes, compactions and restarts."""
    tmp_path = tmp_path_factory.mktemp("ptr")

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        model = PointerModel()
        n = 0
        try:
            status, _, _ = await h.http(
                "PUT", PTR, headers={"Content-Type": JSON, "Stream-Compaction-Key": "/id"}
            )
            assert status == 201
            for ops, flush, compact, restart in rounds:
                messages = []
                for key, dead in ops:
                    messages.append({"id": key, "v": None if dead else n})
                    n += 1
                await _ptr_append(h, messages)
                model.append(messages)
                if flush:
                    await h.flush()
                if compact:
                    report = await h.gc(h.clock.now_ms())
                    assert report.errors == [], report.errors
                if restart is not None:
                    await h.restart(crash=restart)
                for key in ("0", "1", "2", '"a"', "7"):
                    status, headers, body = await h.http("GET", f"{PTR}?key={key}")
                    want_status, want = model.answer(key)
                    assert status == want_status, (key, body)
                    if want is not None:
                        assert json.loads(body) == want
                        offset = headers["Stream-Key-Offset"]
                        status, _, at = await h.http("GET", f"{PTR}?offset={offset}")
                        assert json.loads(at)[0] == want
        finally:
            await h.stop()

    asyncio.run(main())


def test_pointer_streams_index_is_written_and_used(tmp_path: Path) -> None:
    """After a pass the stream has a key index covering its cold range; a key read of a compacted key
    reads the index object (not a scan from the low-water mark); the index goes with the stream."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            status, _, _ = await h.http(
                "PUT", PTR, headers={"Content-Type": JSON, "Stream-Compaction-Key": "/id"}
            )
            assert status == 201
            await _ptr_append(h, [{"id": k % 3, "v": k} for k in range(9)])
            await h.flush()
            report = await h.gc(T0)
            assert report.errors == [] and report.key_indexes_written == 1 and report.messages_compacted == 6
            s = h.s.streams.lookup("default", "ptr")
            assert s.key_index is not None and s.key_index.keys == 3 and s.key_index.covers_to == s.cold_end
            assert (await h.gc(T0 + 1)).key_indexes_written == 0  # nothing changed: not written again
            gets: list[str] = []
            store = h.s.streams.reader.cold.store  # type: ignore[union-attr]
            inner = store.get

            async def get(key: str, **kw: Any) -> bytes:
                gets.append(key)
                return await inner(key, **kw)

            store.get = get  # type: ignore[method-assign]
            status, _, body = await h.http("GET", f"{PTR}?key=1")
            assert (status, json.loads(body)) == (200, {"id": 1, "v": 7})
            assert s.key_index.key in gets
            store.get = inner  # type: ignore[method-assign]
            # A newer message after the index wins; a tombstone after it deletes.
            await _ptr_append(h, [{"id": 1, "v": "new"}, {"id": 2, "v": None}])
            assert json.loads((await h.http("GET", f"{PTR}?key=1"))[2]) == {"id": 1, "v": "new"}
            status, headers, _ = await h.http("GET", f"{PTR}?key=2")
            assert status == 404 and "Stream-Key-Offset" in headers
            assert (await h.http("DELETE", PTR))[0] == 204
            for at in (T0 + 2, T0 + 20_000, T0 + 40_000):
                assert (await h.gc(at, reconcile=True)).errors == []
            stored = {i.key async for i in h.s.store.list("data/")}
            assert stored == set(h.s.state.cold_objects) and not any(k.endswith(".keys") for k in stored)
        finally:
            await h.stop()

    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(
    starts=st.lists(st.integers(0, 500), unique=True, max_size=120),
    ranges=st.lists(st.tuples(st.integers(0, 520), st.integers(0, 40)), max_size=40),
)
def test_record_index_removes_many_ranges_as_one_at_a_time(starts: list[int], ranges: list[Any]) -> None:
    """``RecordIndex.remove_ranges`` (one pass, for a compaction pass's many holes) equals ``remove_range``
    applied to each range in turn."""
    from tiered.engine.streams.ordinals import RecordIndex

    holes = merge((a, a + n) for a, n in ranges)
    one, many = RecordIndex(), RecordIndex()
    one.add(sorted(starts))
    many.add(sorted(starts))
    removed_one = sum(one.remove_range(a, b) for a, b in holes)
    assert many.remove_ranges(holes) == removed_one
    assert (list(many.ords), list(many.offs)) == (list(one.ords), list(one.offs))


@pytest.mark.parametrize("when", ["before", "during"])
def test_retention_passing_keyed_appends(tmp_path: Path, when: str) -> None:
    """Retention past a key's newest append makes the key unknown (404), whether it lands before a
    pass or while the pass uploads its index (the commit goes through; the entry is never served);
    the next pass drops the entry; nothing leaks."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            for key, body in (("b", b"b1;"), ("a", b"a1;"), ("c", b"c1;"), ("a", b"a2;")):
                assert (await _append(h, key, body))[0] == 204
            await h.flush()
            cut = 6  # past b1 and a1: c1 and a2 are still retained

            async def retain() -> None:
                await h.s.streams.retain_from("default", "hk", cut)

            if when == "before":
                await retain()
            else:
                [compaction] = [t for t in h.s.gc.tasks if t.name == "compaction"]

                async def step(at: str) -> None:
                    if at == "upload":
                        await retain()

                compaction.indexer.steps = step  # type: ignore[attr-defined]
            report = await h.gc(T0)
            assert report.errors == [] and report.key_indexes_written == 1
            for key, want in (("a", b"a2;"), ("c", b"c1;")):
                status, _, body = await _key(h, key)
                assert (status, body) == (200, want)
            status, _, body = await _key(h, "b")
            assert (status, _code(body)) == (404, "KEY_NOT_FOUND")
            assert await _read_all(h) == b"c1;a2;"
            s = h.s.streams.lookup("default", "hk")
            assert s.key_index is not None
            assert s.key_index.keys == (2 if when == "before" else 3)  # b's entry: in, but never served
            await h.restart(crash=True)
            assert (await _key(h, "b"))[0] == 404
            report = await h.gc(T0 + 1)  # after a restart every indexed stream is checked once
            assert report.errors == []
            s = h.s.streams.lookup("default", "hk")
            assert s.key_index is not None and s.key_index.keys == 2
            for at in (T0 + 2, T0 + 20_000, T0 + 40_000):
                assert (await h.gc(at, reconcile=True)).errors == []
            stored = {i.key async for i in h.s.store.list("data/")}
            assert stored == set(h.s.state.cold_objects)
            assert all(o.refs > 0 for o in h.s.state.cold_objects.values())
        finally:
            await h.stop()

    asyncio.run(main())


def test_the_index_counts_towards_its_buckets_retained_bytes(tmp_path: Path) -> None:
    """A key index object is the bucket's: the usage API, /metrics, the quota totals and a full walk all
    count it, a new index replaces the old one's count, and a deleted stream's index stops counting."""
    from tiered.engine.tenants.footprint import footprints

    async def usage(h: HttpHarness) -> dict[str, int]:
        status, _, body = await h.http("GET", "/v1/admin/usage?bucket=default")
        assert status == 200, body
        [row] = json.loads(body)["buckets"]
        return dict(row["retained_bytes"])

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            for i in range(40):
                assert (await _append(h, f"key-{i % 25}", f"value-{i};".encode()))[0] == 204
            await h.flush()
            h.s.footprint.totals("default")  # kept incrementally from here on, as on a busy server
            assert (await h.gc(T0)).key_indexes_written == 1
            s = h.s.state.streams[h.s.state.paths["default", "hk"]]
            index = s.key_index
            assert index is not None
            stored = {i.key: i.size async for i in h.s.store.list("data/")}
            assert stored[index.key] == index.size > 0
            cached = h.s.footprint.totals("default")
            walked = footprints(h.s.state)["default"]
            assert walked.key_index_bytes == index.size
            assert cached == (walked.streams, walked.retained_bytes)
            assert (await usage(h))["key_index"] == index.size

            # More keys: the next pass writes a bigger index, which replaces the old one's count.
            for i in range(25, 200):
                assert (await _append(h, f"key-{i}", f"value-{i};".encode()))[0] == 204
            await h.flush()
            assert (await h.gc(T0 + 1)).key_indexes_written == 1
            bigger = s.key_index
            assert bigger is not None and bigger.key != index.key and bigger.size > index.size
            walked = footprints(h.s.state)["default"]
            assert walked.key_index_bytes == bigger.size
            assert h.s.footprint.totals("default") == (walked.streams, walked.retained_bytes)
            assert (await usage(h))["key_index"] == bigger.size

            # The quota holds it too: 10 bytes more fit beside the data alone, not beside data and index.
            limit = walked.retained_bytes + 5
            assert walked.retained_bytes - bigger.size + 10 <= limit < walked.retained_bytes + 10
            status, _, body = await h.http(
                "PUT", "/v1/admin/quotas/default", json_body={"max_retained_bytes": limit}
            )
            assert status in (200, 201), body
            status, _, body = await _append(h, "key-0", b"0123456789")
            assert status == 507 and _code(body) == "QUOTA_EXCEEDED", (status, body)

            status, _, metrics = await h.http("GET", "/metrics")
            assert status == 200
            assert samples(metrics.decode())[
                'tiered_bucket_retained_bytes{bucket="default",tier="key_index"}'
            ] == (bigger.size)

            # Restarted (from the journal, then from a snapshot), the walk counts the same.
            await h.restart(crash=True)
            assert (await usage(h))["key_index"] == bigger.size
            await h.restart()
            assert (await usage(h))["key_index"] == bigger.size
            # Deleted while a fork reads through it, the stream stays (soft-deleted) but its index is
            # released: it stops counting, in the walk and in the totals the quota checks.
            h.s.footprint.totals("default")
            fork = {"Content-Type": TEXT, "Stream-Forked-From": URL}
            assert (await h.http("PUT", "/v1/stream/fork", headers=fork))[0] == 201
            assert (await h.http("DELETE", URL))[0] == 204
            assert h.s.state.streams[s.uid].soft_deleted
            walked = footprints(h.s.state)["default"]
            assert walked.key_index_bytes == 0 == (await usage(h))["key_index"]
            assert h.s.footprint.totals("default") == (walked.streams, walked.retained_bytes)
        finally:
            await h.stop()

    asyncio.run(main())
