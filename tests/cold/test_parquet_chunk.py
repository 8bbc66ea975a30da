"""Tests for the cold-object Parquet format (tiered.cold.parquet.chunk) and its read cache."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered.cold.parquet.chunk import (
    CHUNK_SCHEMA,
    FORMAT_KEY,
    FORMAT_VERSION,
    LEGACY_SCHEMA,
    ChunkIndex,
    ChunkRange,
    ColdDataDamaged,
    ColdRecord,
    _SparseFile,
    encode_chunk,
    iter_records,
    read_stream_bytes,
    read_stream_range,
    rebuild_index,
)
from tiered.cold.parquet.read_cache import ByteLRU

KiB = 1024


# ------------------------------------------------------------------------- helpers


def make_stream(
    bucket: str, stream: str, sizes: Sequence[int], *, base: int = 0, seed: int = 0
) -> list[ColdRecord]:
    """Contiguous records of the given payload sizes, starting at offset ``base``."""
    rnd = random.Random(f"{bucket}/{stream}/{seed}")
    out, off = [], base
    for i, n in enumerate(sizes):
        out.append(ColdRecord(bucket, stream, off, off + n, 1_700_000_000_000 + i, rnd.randbytes(n)))
        off += n
    return out


def stream_bytes(records: Sequence[ColdRecord], bucket: str, stream: str) -> tuple[int, bytes]:
    """(first offset, concatenated payload) of one stream."""
    mine = sorted(
        (r for r in records if (r.bucket, r.stream) == (bucket, stream)), key=lambda r: r.start_offset
    )
    return mine[0].start_offset, b"".join(r.payload for r in mine)


def sort_key(r: ColdRecord) -> tuple[str, str, int, int, int]:
    return (r.bucket, r.stream, r.incarnation, r.start_offset, r.end_offset)


def encode_format_1(records: Sequence[ColdRecord]) -> bytes:
    """An object as written before incarnations were recorded (format 1: no ``incarnation`` column)."""
    rows = sorted(records, key=sort_key)
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        LEGACY_SCHEMA,
        compression="zstd",
        use_dictionary=["bucket", "stream"],
        write_statistics=["bucket", "stream", "start_offset", "end_offset", "append_time_ms"],
        store_schema=False,
        sorting_columns=[pq.SortingColumn(i) for i in range(3)],
        write_page_checksum=True,
    )
    columns = {name: [getattr(r, name) for r in rows] for name in LEGACY_SCHEMA.names}
    writer.write_table(pa.table(columns, schema=LEGACY_SCHEMA), row_group_size=len(rows))
    writer.add_key_value_metadata({FORMAT_KEY: b"1"})
    writer.close()
    return bytes(sink.getvalue().to_pybytes())


class RecordingFetch:
    """Ranged-GET fake over in-memory object bytes that records every call."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    async def __call__(self, start: int, end: int) -> bytes:
        assert 0 <= start <= end <= len(self.data)
        self.calls.append((start, end))
        return self.data[start:end]

    @property
    def bytes_fetched(self) -> int:
        return sum(e - s for s, e in self.calls)


def read(data: bytes, index: ChunkIndex, bucket: str, stream: str, start: int, end: int, **kw):
    fetch = RecordingFetch(data)
    pieces = asyncio.run(read_stream_range(fetch, index, bucket, stream, start, end, **kw))
    return pieces, fetch


def row_group_payload(index: ChunkIndex) -> list[int]:
    sizes = [0] * len(index.row_groups)
    for entry in index.streams:
        for r in entry.ranges:
            sizes[r.row_group] += r.end_offset - r.start_offset
    return sizes


def assert_layout(index: ChunkIndex, row_group_bytes: int) -> None:
    """The row group rules from the module docstring, checked against an index."""
    owners: dict[int, set[tuple[str, str]]] = {}
    for entry in index.streams:
        for r in entry.ranges:
            owners.setdefault(r.row_group, set()).add((entry.bucket, entry.stream))
    assert sorted(owners) == list(range(len(index.row_groups)))
    for entry in index.streams:
        total = entry.end_offset - entry.start_offset
        groups = [r.row_group for r in entry.ranges]
        assert groups == sorted(set(groups)) and groups == list(range(groups[0], groups[-1] + 1))
        if total * 4 >= row_group_bytes:
            assert all(owners[g] == {(entry.bucket, entry.stream)} for g in groups)
        else:
            assert len(groups) == 1, "small streams are never split"
    for size, span in zip(row_group_payload(index), index.row_groups, strict=True):
        assert size <= row_group_bytes or span.num_rows == 1


def assert_pieces(pieces: list[tuple[int, bytes]], expected: bytes, first: int) -> None:
    assert b"".join(p for _, p in pieces) == expected
    pos = first
    for off, piece in pieces:
        assert off == pos and piece
        pos += len(piece)


# ---------------------------------------------------------------- property test

names = st.sampled_from(["b0", "b1", "bücket", "a/b"])
streams_st = st.sampled_from(["s0", "s1", "s2", "log/ü", "z" * 40])
stream_specs = st.lists(
    st.tuples(
        names, streams_st, st.integers(0, 10**9), st.lists(st.integers(0, 5000), min_size=1, max_size=10)
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda t: (t[0], t[1]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=stream_specs,
    row_group_bytes=st.integers(1, 40_000),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_round_trip_random_streams_and_ranges(specs, row_group_bytes, seed, data) -> None:
    records = [r for b, s, base, sizes in specs for r in make_stream(b, s, sizes, base=base, seed=seed)]
    random.Random(seed).shuffle(records)
    blob, index = encode_chunk(records, row_group_bytes=row_group_bytes)

    assert list(iter_records(blob)) == sorted(records, key=sort_key)
    assert rebuild_index(blob) == index
    assert_layout(index, row_group_bytes)

    reads = []
    for bucket, stream, _, _ in specs:
        first, payload = stream_bytes(records, bucket, stream)
        last = first + len(payload)
        entry = index.find(bucket, stream)
        assert entry is not None and (entry.start_offset, entry.end_offset) == (first, last)
        cuts = [r.start_offset for r in records if (r.bucket, r.stream) == (bucket, stream)] + [last]
        point = st.one_of(
            st.integers(max(first - 20, 0), last + 20),
            st.sampled_from(cuts).flatmap(lambda c: st.sampled_from([max(c - 1, 0), c, c + 1])),
        )
        for _ in range(3):
            a, b = sorted((data.draw(point), data.draw(point)))
            reads.append(
                (bucket, stream, a, b, payload[max(a - first, 0) : max(b - first, 0)], max(a, first))
            )

    async def run_reads() -> None:
        fetch = RecordingFetch(blob)
        for bucket, stream, a, b, expected, first in reads:
            pieces = await read_stream_range(fetch, index, bucket, stream, a, b)
            assert_pieces(pieces, expected, first)
            assert await read_stream_bytes(fetch, index, bucket, stream, a, b) == expected

    asyncio.run(run_reads())


# ------------------------------------------------------------------ file layout


def test_read_table_has_documented_schema_and_sort_order() -> None:
    records = (
        make_stream("zeta", "s1", [10, 0, 30])
        + make_stream("alpha", "s2", [5] * 20, base=777)
        + make_stream("alpha", "s10", [3000, 1])
        + make_stream("ålpha", "s", [7])
    )
    random.Random(7).shuffle(records)
    blob, _ = encode_chunk(records, row_group_bytes=64)
    table = pq.read_table(pa.BufferReader(blob))

    assert table.schema.equals(CHUNK_SCHEMA)
    assert table.schema.names == [
        "bucket",
        "stream",
        "incarnation",
        "start_offset",
        "end_offset",
        "append_time_ms",
        "payload",
    ]
    assert [f.nullable for f in table.schema] == [False] * 7
    assert table.num_rows == len(records)
    order = pc.sort_indices(
        table,
        sort_keys=[
            (c, "ascending") for c in ("bucket", "stream", "incarnation", "start_offset", "end_offset")
        ],
    )
    assert order.to_pylist() == list(range(table.num_rows))
    assert [ColdRecord(**row) for row in table.to_pylist()] == sorted(records, key=sort_key)


def test_big_stream_gets_its_own_row_groups_small_streams_share() -> None:
    rgb = 64 * KiB
    records = (
        make_stream("b", "a", [KiB])
        + make_stream("b", "m", [4 * KiB] * 75)  # 300 KiB: big
        + make_stream("b", "z", [2 * KiB])
        + make_stream("b", "zz", [KiB])
    )
    blob, index = encode_chunk(records, row_group_bytes=rgb)

    m = index.find("b", "m")
    assert m is not None
    assert [r.row_group for r in m.ranges] == [1, 2, 3, 4, 5]
    assert [r.end_offset - r.start_offset for r in m.ranges] == [64 * KiB] * 4 + [44 * KiB]
    assert index.find("b", "a").ranges[0].row_group == 0
    assert index.find("b", "z").ranges[0].row_group == index.find("b", "zz").ranges[0].row_group == 6
    assert len(index.row_groups) == 7
    assert_layout(index, rgb)

    # The footer statistics agree: m's row groups hold nothing but m.
    md = pq.read_metadata(pa.BufferReader(blob))
    for g in (1, 2, 3, 4, 5):
        stats = md.row_group(g).column(1).statistics
        assert (stats.min, stats.max) == ("m", "m")


def test_row_group_spans_and_footer_match_the_file() -> None:
    records = [r for i in range(30) for r in make_stream("b", f"s{i:02d}", [900] * 5)]
    blob, index = encode_chunk(records, row_group_bytes=16 * KiB)
    md = pq.read_metadata(pa.BufferReader(blob))

    assert index.file_size == len(blob)
    footer_md = pq.read_metadata(pa.BufferReader(blob[index.footer_offset :]))  # footer alone parses
    assert footer_md.num_rows == len(records)
    assert int.from_bytes(blob[-8:-4], "little") + 8 == index.footer_length
    assert len(index.row_groups) == md.num_row_groups > 1
    assert index.row_groups[0].offset == 4  # right after the leading magic
    for prev, nxt in zip(index.row_groups, index.row_groups[1:], strict=False):
        assert prev.end == nxt.offset  # row groups tile the data section
    assert index.row_groups[-1].end <= index.footer_offset
    assert [s.num_rows for s in index.row_groups] == [
        md.row_group(g).num_rows for g in range(md.num_row_groups)
    ]


def test_statistics_compression_dictionary_and_marker() -> None:
    records = [r for i in range(10) for r in make_stream("bk", f"s{i}", [300] * 10)]
    blob, _ = encode_chunk(records, row_group_bytes=8 * KiB)
    md = pq.read_metadata(pa.BufferReader(blob))

    assert md.metadata[FORMAT_KEY] == FORMAT_VERSION
    assert [c.column_index for c in md.row_group(0).sorting_columns] == [0, 1, 2, 3]
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        cols = {rg.column(c).path_in_schema: rg.column(c) for c in range(rg.num_columns)}
        for name, col in cols.items():
            assert col.compression == "ZSTD"
            if name == "payload":
                assert col.statistics is None or not col.statistics.has_min_max
            else:
                assert col.is_stats_set and col.statistics.has_min_max
        assert cols["bucket"].has_dictionary_page and cols["stream"].has_dictionary_page
        assert not cols["payload"].has_dictionary_page
        table = pq.ParquetFile(pa.BufferReader(blob)).read_row_group(g)
        for name in ("bucket", "stream", "incarnation", "start_offset", "end_offset", "append_time_ms"):
            bounds = pc.min_max(table.column(name)).as_py()
            assert (cols[name].statistics.min, cols[name].statistics.max) == (bounds["min"], bounds["max"])


def test_record_larger_than_row_group_target_gets_its_own_row_group() -> None:
    rgb = 4 * KiB
    records = make_stream("b", "s", [100, 10_000, 0, 100, 5000]) + make_stream("b", "t", [50, 50])
    blob, index = encode_chunk(records, row_group_bytes=rgb)

    ranges = index.find("b", "s").ranges
    assert [(r.end_offset - r.start_offset, index.row_groups[r.row_group].num_rows) for r in ranges] == [
        (100, 1),
        (10_000, 1),
        (100, 2),  # the zero-length record joins the next group, not the oversized one
        (5000, 1),
    ]
    assert_layout(index, rgb)
    first, payload = stream_bytes(records, "b", "s")
    pieces, fetch = read(blob, index, "b", "s", 50, 10_150)  # mid-record to mid-record
    assert_pieces(pieces, payload[50:10_150], 50)
    assert [len(p) for _, p in pieces] == [50, 10_000, 50]
    assert len(fetch.calls) == 2  # footer + one coalesced GET for the three adjacent row groups


# ------------------------------------------------------------------- ranged reads


def small_streams_object() -> tuple[list[ColdRecord], bytes, ChunkIndex]:
    records = [r for i in range(40) for r in make_stream("b", f"s{i:02d}", [1000] * 8, base=i * 10)]
    blob, index = encode_chunk(records, row_group_bytes=64 * KiB)
    return records, blob, index


def test_small_stream_read_fetches_footer_and_one_row_group_only() -> None:
    records, blob, index = small_streams_object()
    assert len(index.row_groups) >= 4

    entry = index.find("b", "s17")
    assert len(entry.ranges) == 1
    span = index.row_groups[entry.ranges[0].row_group]
    pieces, fetch = read(blob, index, "b", "s17", entry.start_offset + 1500, entry.start_offset + 4200)

    first, payload = stream_bytes(records, "b", "s17")
    assert_pieces(pieces, payload[1500:4200], first + 1500)
    assert sorted(fetch.calls) == sorted([(span.offset, span.end), (index.footer_offset, index.file_size)])
    assert fetch.bytes_fetched == span.length + index.footer_length
    assert fetch.bytes_fetched < len(blob) // 3


def test_big_stream_partial_read_fetches_only_overlapping_row_groups() -> None:
    rgb = 128 * KiB
    records = make_stream("b", "small", [100]) + make_stream("b", "big", [1000] * 1024)
    blob, index = encode_chunk(records, row_group_bytes=rgb)
    first, payload = stream_bytes(records, "b", "big")

    start, end = first + 300 * KiB + 17, first + 420 * KiB + 3
    pieces, fetch = read(blob, index, "b", "big", start, end)
    assert_pieces(pieces, payload[300 * KiB + 17 : 420 * KiB + 3], start)

    wanted = [r for r in index.find("b", "big").ranges if r.start_offset < end and r.end_offset > start]
    assert 1 < len(wanted) < len(index.row_groups) - 1
    spans = [index.row_groups[r.row_group] for r in wanted]
    expected_calls = [(spans[0].offset, spans[-1].end), (index.footer_offset, index.file_size)]
    assert sorted(fetch.calls) == sorted(expected_calls)
    assert fetch.bytes_fetched == sum(s.length for s in spans) + index.footer_length


def test_cache_absorbs_footer_and_row_group_fetches() -> None:
    records, blob, index = small_streams_object()
    cache = ByteLRU(4 << 20)
    fetch = RecordingFetch(blob)
    e1, e2 = index.find("b", "s00"), index.find("b", "s01")
    assert e1.ranges[0].row_group == e2.ranges[0].row_group

    async def go(stream: str, key: str) -> bytes:
        return await read_stream_bytes(fetch, index, "b", stream, 0, 10**9, cache=cache, object_key=key)

    assert asyncio.run(go("s00", "obj")) == stream_bytes(records, "b", "s00")[1]
    assert len(fetch.calls) == 2 and cache.misses == 2 and cache.hits == 0
    assert asyncio.run(go("s01", "obj")) == stream_bytes(records, "b", "s01")[1]
    assert len(fetch.calls) == 2 and cache.hits == 2  # same row group, nothing fetched
    asyncio.run(go("s00", "other-object"))
    assert len(fetch.calls) == 4  # keys are namespaced by object
    assert cache.nbytes == 2 * (index.footer_length + index.row_groups[0].length)


def test_for_stream_index_is_self_contained_and_compact() -> None:
    records, blob, index = small_streams_object()
    sub = index.for_stream("b", "s33")
    assert len(sub.streams) == 1 and sub.find("b", "s32") is None
    sub = msgspec.msgpack.decode(msgspec.msgpack.encode(sub), type=ChunkIndex)
    pieces, _ = read(blob, sub, "b", "s33", 0, 10**9)
    assert_pieces(pieces, stream_bytes(records, "b", "s33")[1], sub.streams[0].start_offset)
    with pytest.raises(KeyError):
        index.for_stream("b", "nope")


def test_index_round_trips_through_msgspec_as_arrays() -> None:
    _, _, index = small_streams_object()
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(index), type=ChunkIndex) == index
    assert msgspec.json.decode(msgspec.json.encode(index), type=ChunkIndex) == index
    assert msgspec.json.encode(ChunkRange(1, 2, 3, 4, 5)) == b"[1,2,3,4,5]"


def test_zero_length_records_are_omitted_from_pieces() -> None:
    records = make_stream("b", "s", [0, 5, 0, 0, 3, 0])
    blob, index = encode_chunk(records)
    pieces, _ = read(blob, index, "b", "s", 0, 8)
    assert [(o, len(p)) for o, p in pieces] == [(0, 5), (5, 3)]
    assert list(iter_records(blob)) == sorted(records, key=sort_key)


def test_read_argument_errors_and_empty_ranges() -> None:
    records, blob, index = small_streams_object()
    entry = index.find("b", "s05")
    with pytest.raises(KeyError):
        read(blob, index, "b", "missing", 0, 10)
    with pytest.raises(ValueError, match="start"):
        read(blob, index, "b", "s05", 10, 5)
    with pytest.raises(ValueError, match="object_key"):
        read(blob, index, "b", "s05", 0, 10, cache=ByteLRU(1 << 20))
    for start, end in [
        (entry.start_offset + 5, entry.start_offset + 5),
        (0, entry.start_offset),
        (10**9, 10**9 + 5),
    ]:
        pieces, fetch = read(blob, index, "b", "s05", start, end)
        assert pieces == [] and fetch.calls == []


def test_short_ranged_get_is_an_error() -> None:
    _, blob, index = small_streams_object()

    async def truncating_fetch(start: int, end: int) -> bytes:
        return blob[start : end - 1]

    with pytest.raises(ColdDataDamaged, match="ranged GET"):
        asyncio.run(read_stream_range(truncating_fetch, index, "b", "s00", 0, 100))


def test_index_that_does_not_match_the_object_is_detected() -> None:
    _, blob, index = small_streams_object()
    entry = index.find("b", "s03")
    shifted = tuple(msgspec.structs.replace(r, start_offset=r.start_offset + 1) for r in entry.ranges)
    bad_entry = msgspec.structs.replace(entry, ranges=shifted)
    bad = msgspec.structs.replace(index, streams=tuple(bad_entry if e is entry else e for e in index.streams))
    with pytest.raises(ColdDataDamaged, match="does not match"):
        read(blob, bad, "b", "s03", 0, 10**9)


def test_sparse_file_refuses_bytes_that_were_not_fetched() -> None:
    f = _SparseFile(100, [(10, memoryview(b"x" * 20)), (90, memoryview(b"y" * 10))])
    f.seek(12)
    assert bytes(f.read(5)) == b"xxxxx"
    f.seek(-4, 2)
    assert bytes(f.read()) == b"yyyy"
    f.seek(25)
    with pytest.raises(OSError):
        f.read(10)  # runs past the fetched region into unfetched bytes
    f.seek(50)
    with pytest.raises(OSError):
        f.read(1)


# --------------------------------------------------------------- encode errors


def test_empty_input_raises() -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_chunk([])
    with pytest.raises(ValueError, match="empty"):
        encode_chunk(iter(()))


@pytest.mark.parametrize(
    "records",
    [
        [ColdRecord("b", "s", 0, 4, 1, b"abc")],  # length disagrees with offsets
        make_stream("b", "s", [3]) + make_stream("b", "s", [3], base=4),  # gap
        make_stream("b", "s", [3, 3]) + make_stream("b", "s", [2], base=4),  # overlap
        [ColdRecord("b", "s", -3, 0, 1, b"abc")],  # negative offset
        # Two streams that held one path: an object holds one of them (its index names b/s once).
        make_stream("b", "s", [3]) + [ColdRecord("b", "s", 10**16, 10**16 + 1, 1, b"x", incarnation=1)],
    ],
)
def test_invalid_records_raise(records: list[ColdRecord]) -> None:
    with pytest.raises(ValueError):
        encode_chunk(records)


def test_non_positive_row_group_bytes_raises() -> None:
    with pytest.raises(ValueError, match="row_group_bytes"):
        encode_chunk(make_stream("b", "s", [1]), row_group_bytes=0)


def test_foreign_parquet_file_is_rejected_by_whole_object_decoders() -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"x": [1, 2]}), sink)
    with pytest.raises(ValueError, match="cold chunk"):
        list(iter_records(sink.getvalue().to_pybytes()))
    with pytest.raises(ValueError, match="cold chunk"):
        rebuild_index(sink.getvalue().to_pybytes())


def test_cold_record_is_frozen() -> None:
    rec = make_stream("b", "s", [1])[0]
    with pytest.raises(AttributeError):
        rec.payload = b"z"  # type: ignore[misc]


def test_encode_accepts_other_codecs() -> None:
    records = make_stream("b", "s", [100] * 10)
    blob, index = encode_chunk(records, compression="none")
    assert pq.read_metadata(pa.BufferReader(blob)).row_group(0).column(6).compression == "UNCOMPRESSED"
    assert list(iter_records(blob)) == records
    assert index.row_groups[0].num_rows == 10


# ------------------------------------------------------------------ incarnations


def test_rows_and_index_carry_each_streams_incarnation() -> None:
    records = make_stream("b", "old", [4, 4]) + [
        ColdRecord("b", "new", 2 * 10**16 + i, 2 * 10**16 + i + 1, 5, b"n", incarnation=2) for i in range(3)
    ]
    blob, index = encode_chunk(records)
    assert [(e.stream, e.incarnation) for e in index.streams] == [("new", 2), ("old", 0)]
    assert rebuild_index(blob) == index
    assert {(r.stream, r.incarnation) for r in iter_records(blob)} == {("new", 2), ("old", 0)}
    table = pq.read_table(pa.BufferReader(blob), filters=[("incarnation", "=", 2)])
    assert table.column("start_offset").to_pylist() == [2 * 10**16 + i for i in range(3)]
    pieces, _ = read(blob, index, "b", "new", 2 * 10**16 + 1, 2 * 10**16 + 3)
    assert pieces == [(2 * 10**16 + 1, b"n"), (2 * 10**16 + 2, b"n")]


def test_objects_of_format_1_still_read_as_first_incarnations() -> None:
    records = make_stream("b", "s", [5, 7]) + make_stream("c", "t", [3], base=40)
    blob = encode_format_1(records)
    index = rebuild_index(blob)  # what verify does; the journaled index of such an object decodes alike
    assert [(e.bucket, e.stream, e.incarnation) for e in index.streams] == [
        ("b", "s", None),
        ("c", "t", None),
    ]
    assert list(iter_records(blob)) == sorted(records, key=sort_key)  # no column: incarnation 0
    assert all(r.incarnation == 0 for r in iter_records(blob))
    pieces, _ = read(blob, index, "b", "s", 3, 12)
    assert b"".join(p for _, p in pieces) == stream_bytes(records, "b", "s")[1][3:]
    # A journaled index of that time: StreamIndex arrays of three fields.
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(index))
    raw[3] = [e[:3] for e in raw[3]]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(raw), type=ChunkIndex) == index
    # New objects say format 2, and have the column.
    new_blob, _ = encode_chunk(records)
    assert pq.read_metadata(pa.BufferReader(new_blob)).metadata[FORMAT_KEY] == FORMAT_VERSION == b"2"
    assert pq.read_schema(pa.BufferReader(new_blob)).names == CHUNK_SCHEMA.names


# ------------------------------------------------------------------------ ByteLRU


def test_byte_lru_evicts_least_recently_used_by_bytes() -> None:
    cache = ByteLRU(10)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    assert cache.get("a") == b"1234"  # a is now most recent
    cache.put("c", b"1234")  # 12 bytes > 10: evict b
    assert "b" not in cache and "a" in cache and "c" in cache
    assert cache.nbytes == 8 and len(cache) == 2 and cache.evictions == 1
    assert cache.get("b") is None
    assert (cache.hits, cache.misses) == (1, 1)


def test_byte_lru_replaces_and_skips_oversized_values() -> None:
    cache = ByteLRU(10)
    cache.put("a", b"12345")
    cache.put("a", b"12")
    assert cache.nbytes == 2 and cache.get("a") == b"12"
    cache.put("big", b"x" * 11)
    assert "big" not in cache and "a" in cache  # nothing flushed for a value that cannot fit
    cache.put("b", b"")
    assert cache.get("b") == b""  # empty values are cacheable
    cache.discard("a")
    cache.discard("missing")
    assert cache.nbytes == 0
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError):
        ByteLRU(-1)


# --------------------------------------------------------------- integrity on read


def test_every_flipped_byte_is_caught_or_harmless() -> None:
    """Flip each byte of an object in turn: a read returns the exact bytes or raises
    ``ColdDataDamaged``; a flip inside what the read fetched (footer, row groups) always raises."""
    records = [r for i in range(6) for r in make_stream("b", f"s{i:02d}", [150] * 4, base=i * 10)]
    blob, index = encode_chunk(records, row_group_bytes=1200)
    assert len(index.row_groups) >= 3
    assert index.footer_crc32c is not None and all(g.crc32c is not None for g in index.row_groups)
    entry = index.find("b", "s03")
    want = b"".join(r.payload for r in records if (r.bucket, r.stream) == ("b", "s03"))
    groups = {r.row_group for r in entry.ranges}
    fetched = [(index.footer_offset, index.file_size)] + [
        (index.row_groups[g].offset, index.row_groups[g].end) for g in groups
    ]
    caught = served = 0
    for pos in range(len(blob)):
        bad = bytearray(blob)
        bad[pos] ^= 0x01
        try:
            pieces, _ = read(bytes(bad), index, "b", "s03", 0, 10**9)
        except ColdDataDamaged:
            caught += 1
            continue
        assert not any(lo <= pos < hi for lo, hi in fetched), f"byte {pos} was fetched, flipped, and served"
        assert b"".join(p for _, p in pieces) == want, f"byte {pos}: wrong bytes served"
        served += 1
    assert caught and served  # both kinds of position exist in this object


def test_indexes_written_before_digests_still_read() -> None:
    records, blob, index = small_streams_object()
    legacy = msgspec.structs.replace(
        index,
        footer_crc32c=None,
        row_groups=tuple(msgspec.structs.replace(g, crc32c=None) for g in index.row_groups),
    )
    # The journal's array form without the trailing digest fields decodes to the same thing.
    raw = msgspec.msgpack.encode(index)
    as_list = msgspec.msgpack.decode(raw)
    as_list[2] = [g[:3] for g in as_list[2]]
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(as_list[:4]), type=ChunkIndex)
    assert old == legacy
    pieces, _ = read(blob, old, "b", "s03", 0, 10**9)
    assert b"".join(p for _, p in pieces) == b"".join(
        r.payload for r in records if (r.bucket, r.stream) == ("b", "s03")
    )
