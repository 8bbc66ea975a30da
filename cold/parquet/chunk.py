"""Cold-object format: one Parquet file packing records of many streams from many buckets.

Schema (exact; every column is REQUIRED / ``not null``)::

    column          arrow type   parquet physical / logical   notes
    bucket          string       BYTE_ARRAY / STRING          dictionary encoded
    stream          string       BYTE_ARRAY / STRING          dictionary encoded
    incarnation     int64        INT64                        which stream at that path (0: its first)
    start_offset    int64        INT64                        first byte offset of the record
    end_offset      int64        INT64                        start_offset + len(payload)
    append_time_ms  int64        INT64                        unix epoch milliseconds
    payload         binary       BYTE_ARRAY                   raw record bytes, < 2 GiB each

``append_time_ms`` is a plain int64 rather than ``timestamp[ms]`` so that every
reader sees the same integer the hot tier stored, with no timezone/unit coercion.

``incarnation`` tells apart the streams a path held one after another (deleted
or expired, then created again); their offsets never overlap either (see
``tiered.core.ids``). Objects of format version 1 have no such column: their rows
read as incarnation 0, and their index records none (``StreamIndex.incarnation``
is None), since a path re-created before incarnations were counted may hold a
later stream's rows there.

Layout rules:

* Rows are sorted by ``(bucket, stream, incarnation, start_offset)`` (ties, which only
  zero-length records can produce, by ``end_offset``); the footer declares this via
  ``sorting_columns``. An object holds one incarnation of a path at most, and its
  records are contiguous in offset, except in an object a keyed compaction rewrote
  (``encode_chunk(gaps=True)``): there a stream's rows may skip the records compaction
  removed. Each ``ChunkRange`` of the index is contiguous; a gap starts a new one (in the
  same row group too), and a read that crosses a gap is refused, never served short.
  Objects without gaps index exactly as before, so the change is additive.
* zstd compression by default; min/max statistics are written for every column
  except ``payload`` (payload statistics are useless and would bloat the footer
  that every read fetches). ``bucket``/``stream`` are dictionary encoded.
* Row groups hold about ``row_group_bytes`` of payload. A stream whose data is at
  least ``row_group_bytes / 4`` is "big": it starts a new row group and no other
  stream shares its row groups, so reading it never decodes foreign rows. Small
  streams are packed together and never split, so reading one costs exactly one
  row group. A record larger than ``row_group_bytes`` gets a row group of its own.
* The footer carries the key/value pair ``tiered.cold_chunk.version = 2`` (``1``: the
  schema without ``incarnation``, still read).
* It also carries ``tiered.integrity.v1``: each row's integrity digest contribution
  (``tiered.core.record_digest``: 32 bytes, big-endian), per row group: the row groups'
  base64 strings (of their rows' contributions, in row order) joined by ``,``. Optional:
  objects written before digests existed have none (``row_digests`` returns None).

``encode_chunk`` returns the file bytes plus a ``ChunkIndex`` (msgspec, array-like)
that the service persists in its metadata journal. With it a read plans exact
ranged GETs (footer + only the overlapping row groups) without listing or opening
the object first; ``read_stream_range`` / ``read_stream_bytes`` do exactly that.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Protocol

import google_crc32c
import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from tiered.cold.parquet.chunk_index import ChunkIndex, ChunkRange, ColdDataDamaged, RowGroupSpan, StreamIndex
from tiered.core.record_digest import RecordHasher, digest_bytes

__all__ = [
    "CHUNK_SCHEMA",
    "INTEGRITY_KEY",
    "ByteCache",
    "ChunkIndex",
    "ChunkRange",
    "ColdDataDamaged",
    "ColdRecord",
    "Fetch",
    "RowGroupSpan",
    "StreamIndex",
    "encode_chunk",
    "iter_records",
    "read_stream_bytes",
    "read_stream_range",
    "rebuild_index",
    "row_digests",
    "row_groups",
]

CHUNK_SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.string(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("incarnation", pa.int64(), nullable=False),
        pa.field("start_offset", pa.int64(), nullable=False),
        pa.field("end_offset", pa.int64(), nullable=False),
        pa.field("append_time_ms", pa.int64(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
    ]
)

#: Objects written before incarnations were recorded (format version 1): the same without that column.
LEGACY_SCHEMA = pa.schema([f for f in CHUNK_SCHEMA if f.name != "incarnation"])

INTEGRITY_KEY = b"tiered.integrity.v1"
FORMAT_KEY = b"tiered.cold_chunk.version"
FORMAT_VERSION = b"2"
_SCHEMAS = {FORMAT_VERSION: CHUNK_SCHEMA, b"1": LEGACY_SCHEMA}

_STAT_COLUMNS = ["bucket", "stream", "incarnation", "start_offset", "end_offset", "append_time_ms"]
_DICT_COLUMNS = ["bucket", "stream"]
_READ_COLUMNS = ["start_offset", "end_offset", "payload"]
_KEY_COLUMNS = ["bucket", "stream", "incarnation", "start_offset", "end_offset"]
_MAGIC = b"PAR1"
_TRAILER = 8  # 4-byte little-endian footer length + magic

# Sort key for rows; end_offset breaks ties between zero-length records.
_SORT_KEY = attrgetter("bucket", "stream", "incarnation", "start_offset", "end_offset")


# --------------------------------------------------------------------------- model


class ColdRecord(msgspec.Struct, frozen=True, gc=False):
    """One appended record: bytes ``[start_offset, end_offset)`` of ``bucket/stream``'s incarnation."""

    bucket: str
    stream: str
    start_offset: int
    end_offset: int
    append_time_ms: int
    payload: bytes
    incarnation: int = 0
    # Its integrity digest contribution when the writer knows it already (the journal's, for the
    # bytes it acknowledged): the footer records it instead of hashing the row again.
    digest: int | None = None


# -------------------------------------------------------------------------- writer


def encode_chunk(
    records: Iterable[ColdRecord],
    *,
    row_group_bytes: int = 1 << 20,
    compression: str = "zstd",
    gaps: bool = False,
) -> tuple[bytes, ChunkIndex]:
    """Encode records into one Parquet object and return ``(file_bytes, index)``.

    Records may arrive in any order; they are sorted here. Raises ValueError for
    empty input, a payload whose length disagrees with its offsets, a stream
    whose records are not contiguous (the index relies on contiguity; with
    ``gaps`` a stream may skip offsets, as a compaction rewrite does, and each
    contiguous run is indexed apart), overlapping records, or two incarnations
    of one stream (the index names a stream by bucket and path).
    """
    if row_group_bytes <= 0:
        raise ValueError(f"row_group_bytes must be positive, got {row_group_bytes}")
    rows = sorted(records, key=_SORT_KEY)
    if not rows:
        raise ValueError("cannot encode an empty chunk")
    runs = _stream_runs(rows, gaps)
    groups = _plan_row_groups(rows, runs, row_group_bytes)
    data = _write_parquet(rows, groups, compression)
    keys = (
        [(r.bucket, r.stream, r.incarnation, r.start_offset, r.end_offset) for r in rows[a:b]]
        for a, b in groups
    )
    return data, _build_index(data, pq.read_metadata(pa.BufferReader(data)), keys)


def _stream_runs(rows: Sequence[ColdRecord], gaps: bool = False) -> list[tuple[int, int, int]]:
    """Split sorted rows into per-stream runs ``(first_row, end_row, payload_bytes)``.

    Validates offsets on the way, since a gap would make the index lie.
    """
    runs: list[tuple[int, int, int]] = []
    run_start, run_bytes = 0, 0
    prev: ColdRecord | None = None
    for i, rec in enumerate(rows):
        size = len(rec.payload)
        if rec.start_offset < 0 or rec.end_offset - rec.start_offset != size:
            raise ValueError(
                f"{rec.bucket}/{rec.stream}: offsets [{rec.start_offset}, {rec.end_offset}) "
                f"do not match a {size}-byte payload"
            )
        if prev is not None and prev.stream == rec.stream and prev.bucket == rec.bucket:
            if rec.incarnation != prev.incarnation:
                raise ValueError(
                    f"{rec.bucket}/{rec.stream}: incarnations {prev.incarnation} and {rec.incarnation} "
                    "in one object"
                )
            if rec.start_offset != prev.end_offset and not (gaps and rec.start_offset > prev.end_offset):
                raise ValueError(
                    f"{rec.bucket}/{rec.stream}: records not contiguous "
                    f"(offset {prev.end_offset} followed by {rec.start_offset})"
                )
        elif prev is not None:
            runs.append((run_start, i, run_bytes))
            run_start, run_bytes = i, 0
        run_bytes += size
        prev = rec
    runs.append((run_start, len(rows), run_bytes))
    return runs


def _plan_row_groups(
    rows: Sequence[ColdRecord], runs: Iterable[tuple[int, int, int]], target: int
) -> list[tuple[int, int]]:
    """Choose row group boundaries as ``[(first_row, end_row), ...]``.

    Big streams (>= target/4) are isolated and cut every ~target bytes; small
    streams are packed whole until the next one would overflow the target.
    """
    groups: list[tuple[int, int]] = []
    group_start, group_bytes = 0, 0

    def close(at: int) -> None:
        nonlocal group_start, group_bytes
        if at > group_start:
            groups.append((group_start, at))
            group_start, group_bytes = at, 0

    for first, end, run_bytes in runs:
        if run_bytes * 4 >= target:
            close(first)
            for i in range(first, end):
                size = len(rows[i].payload)
                if group_bytes + size > target:
                    close(i)
                group_bytes += size
                if size > target:
                    close(i + 1)  # oversized record: alone in its row group
            close(end)
        else:
            if group_bytes + run_bytes > target:
                close(first)
            group_bytes += run_bytes
    close(len(rows))
    return groups


def _write_parquet(rows: Sequence[ColdRecord], groups: Iterable[tuple[int, int]], compression: str) -> bytes:
    """Write each planned group as exactly one Parquet row group."""
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        CHUNK_SCHEMA,
        compression=compression,
        use_dictionary=_DICT_COLUMNS,
        write_statistics=_STAT_COLUMNS,
        store_schema=False,  # plain Parquet types already round-trip; keeps the footer small
        sorting_columns=[pq.SortingColumn(i) for i in range(4)],
        write_page_checksum=True,  # CRC32 per page: `tiered verify` detects bit rot
    )
    try:
        for a, b in groups:
            # One write_table call with row_group_size >= rows => one row group.
            writer.write_table(_group_table(rows[a:b]), row_group_size=b - a)
        writer.add_key_value_metadata(
            {FORMAT_KEY: FORMAT_VERSION, INTEGRITY_KEY: _row_digests_value(rows, groups)}
        )
    finally:
        writer.close()
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _row_digests_value(rows: Sequence[ColdRecord], groups: Iterable[tuple[int, int]]) -> bytes:
    """The footer's ``tiered.integrity.v1`` value: each row's digest contribution, per row group."""
    hashers: dict[tuple[str, str, int], RecordHasher] = {}
    parts = []
    for a, b in groups:
        raw = bytearray()
        for r in rows[a:b]:
            h = r.digest
            if h is None:
                ident = (r.bucket, r.stream, r.incarnation)
                hasher = hashers.get(ident)
                if hasher is None:
                    hasher = hashers[ident] = RecordHasher(*ident)
                h = hasher(r.start_offset, r.payload)
            raw += digest_bytes(h)
        parts.append(base64.b64encode(bytes(raw)))
    return b",".join(parts)


def row_digests(metadata: pq.FileMetaData) -> list[list[int]] | None:
    """Each row's digest contribution as the footer records it, per row group (None: not recorded).

    ValueError if the value does not fit the object's row groups (a footer that lies).
    """
    value = (metadata.metadata or {}).get(INTEGRITY_KEY)
    if value is None:
        return None
    parts = value.split(b",")
    if len(parts) != metadata.num_row_groups:
        raise ValueError(f"{len(parts)} row groups of digests for {metadata.num_row_groups} row groups")
    out = []
    for g, part in enumerate(parts):
        raw = base64.b64decode(part, validate=True)
        if len(raw) != 32 * metadata.row_group(g).num_rows:
            raise ValueError(
                f"row group {g}: {len(raw) // 32} digests for {metadata.row_group(g).num_rows} rows"
            )
        out.append([int.from_bytes(raw[i : i + 32], "big") for i in range(0, len(raw), 32)])
    return out


def _group_table(rows: Sequence[ColdRecord]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array([r.bucket for r in rows], pa.string()),
            pa.array([r.stream for r in rows], pa.string()),
            pa.array([r.incarnation for r in rows], pa.int64()),
            pa.array([r.start_offset for r in rows], pa.int64()),
            pa.array([r.end_offset for r in rows], pa.int64()),
            pa.array([r.append_time_ms for r in rows], pa.int64()),
            pa.array([r.payload for r in rows], pa.binary()),
        ],
        schema=CHUNK_SCHEMA,
    )


# --------------------------------------------------------------------------- index


Key = tuple[str, str, int | None, int, int]  # bucket, stream, incarnation (None: format 1), start, end


def _build_index(data: bytes, metadata: pq.FileMetaData, group_keys: Iterable[Iterable[Key]]) -> ChunkIndex:
    """Combine footer byte ranges with per-row-group ``(bucket, stream, incarnation, start, end)`` rows."""
    file_size = len(data)
    footer_length = _footer_length(data)
    spans = tuple(_row_group_span(metadata.row_group(g), data) for g in range(metadata.num_row_groups))
    streams: dict[tuple[str, str], list[ChunkRange]] = {}
    incarnations: dict[tuple[str, str], int | None] = {}
    seen = 0
    for g, keys in enumerate(group_keys):
        for (bucket, stream, incarnation), rng in _group_segments(g, keys):
            if incarnations.setdefault((bucket, stream), incarnation) != incarnation:
                raise ValueError(f"{bucket}/{stream}: more than one incarnation in one object")
            streams.setdefault((bucket, stream), []).append(rng)
        seen = g + 1
    if seen != len(spans) or not streams:
        raise ValueError(f"{seen} row groups of rows but the footer lists {len(spans)}")
    entries = tuple(StreamIndex(b, s, tuple(r), incarnations[(b, s)]) for (b, s), r in streams.items())
    footer_crc = google_crc32c.value(data[file_size - footer_length :])
    return ChunkIndex(file_size, footer_length, spans, entries, footer_crc)


def _group_segments(
    group: int, keys: Iterable[Key]
) -> Iterator[tuple[tuple[str, str, int | None], ChunkRange]]:
    """Yield ``((bucket, stream, incarnation), ChunkRange)`` per stream in a row group, in row order."""
    cur: tuple[str, str, int | None] | None = None
    first_row = seg_start = seg_end = 0
    row = -1
    for row, (bucket, stream, incarnation, start, end) in enumerate(keys):
        if (bucket, stream, incarnation) != cur or start != seg_end:  # a new stream, or a gap compaction left
            if cur is not None:
                yield cur, ChunkRange(seg_start, seg_end, group, first_row, row - first_row)
            cur, first_row, seg_start = (bucket, stream, incarnation), row, start
        seg_end = end
    if cur is not None:
        yield cur, ChunkRange(seg_start, seg_end, group, first_row, row + 1 - first_row)


def _footer_length(data: bytes) -> int:
    """Length of the Thrift footer plus its 8-byte trailer, read from the file tail."""
    if len(data) < 2 * len(_MAGIC) + _TRAILER or data[-4:] != _MAGIC:
        raise ValueError("not a Parquet file")
    (meta_len,) = struct.unpack("<I", data[-_TRAILER:-4])
    return int(meta_len) + _TRAILER


def _row_group_span(rg: pq.RowGroupMetaData, data: bytes) -> RowGroupSpan:
    """Byte range covering all column chunks (dictionary page included) of a row group, with its digest."""
    starts, ends = [], []
    for c in range(rg.num_columns):
        col = rg.column(c)
        first = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        starts.append(first)
        ends.append(first + col.total_compressed_size)
    lo, hi = min(starts), max(ends)
    return RowGroupSpan(lo, hi - lo, rg.num_rows, google_crc32c.value(data[lo:hi]))


def rebuild_index(data: bytes) -> ChunkIndex:
    """Recompute the index of an existing object (for verify/repair tools)."""
    pf, legacy = _open_whole(data)
    columns = [c for c in _KEY_COLUMNS if not (legacy and c == "incarnation")]

    def keys(t: pa.Table) -> Iterator[Key]:
        values = [t.column(c).to_pylist() for c in columns]
        if legacy:
            values.insert(2, [None] * t.num_rows)
        return zip(*values, strict=True)

    group_keys = (keys(pf.read_row_group(g, columns=columns)) for g in range(pf.num_row_groups))
    return _build_index(data, pf.metadata, group_keys)


def iter_records(data: bytes) -> Iterator[ColdRecord]:
    """Decode a whole object row group by row group, in stored (sorted) order (format 1: incarnation 0)."""
    pf, _ = _open_whole(data)
    for g in range(pf.num_row_groups):
        for row in pf.read_row_group(g).to_pylist():
            yield ColdRecord(**row)


def row_groups(data: bytes) -> tuple[list[list[int]] | None, Iterator[tuple[int, list[ColdRecord]]]]:
    """A whole object's footer digests (``row_digests``) and its rows, row group by row group."""
    pf, _ = _open_whole(data)
    digests = row_digests(pf.metadata)

    def groups() -> Iterator[tuple[int, list[ColdRecord]]]:
        for g in range(pf.num_row_groups):
            yield g, [ColdRecord(**row) for row in pf.read_row_group(g).to_pylist()]

    return digests, groups()


def _open_whole(data: bytes) -> tuple[pq.ParquetFile, bool]:
    """The object opened for whole reads, and whether it is of format 1 (no incarnation column)."""
    pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
    version: bytes | None = (pf.metadata.metadata or {}).get(FORMAT_KEY)
    schema = _SCHEMAS.get(version) if version is not None else None
    if version is None or schema is None:
        raise ValueError("not a tiered cold chunk (format marker missing or unsupported)")
    if not pf.schema_arrow.equals(schema):
        raise ValueError(f"unexpected cold chunk schema for format {version.decode()}: {pf.schema_arrow}")
    return pf, schema is LEGACY_SCHEMA


# -------------------------------------------------------------------------- reader

Fetch = Callable[[int, int], Awaitable[bytes]]
"""Ranged GET: ``fetch(start, end)`` returns bytes ``[start, end)`` of the object."""


class ByteCache(Protocol):
    """What the reader needs from a cache (``read_cache.ByteLRU`` fits)."""

    def get(self, key: Hashable) -> bytes | None: ...

    def put(self, key: Hashable, value: bytes) -> None: ...


async def read_stream_range(
    fetch: Fetch,
    index: ChunkIndex,
    bucket: str,
    stream: str,
    start: int,
    end: int,
    *,
    cache: ByteCache | None = None,
    object_key: Hashable | None = None,
) -> list[tuple[int, bytes]]:
    """Read stream bytes ``[start, end)`` as ``[(offset, piece), ...]``, one piece per record.

    Pieces are record payloads trimmed to the range (a range may begin or end inside
    a record); records with no bytes in the range are omitted. The range is clamped
    to what this object holds for the stream. Fetches only the footer and the row
    groups overlapping the range, concurrently; ``cache`` (keyed under
    ``object_key``) can absorb either.
    """
    pieces: list[tuple[int, bytes]] = []
    for rng, table in await _read_segments(fetch, index, bucket, stream, start, end, cache, object_key):
        for pos, offsets, data in _payload_chunks(rng, table):
            pieces.extend(_chunk_pieces(pos, offsets, data, start, end))
    return pieces


async def read_stream_bytes(
    fetch: Fetch,
    index: ChunkIndex,
    bucket: str,
    stream: str,
    start: int,
    end: int,
    *,
    cache: ByteCache | None = None,
    object_key: Hashable | None = None,
) -> bytes:
    """Like ``read_stream_range`` but returns the contiguous bytes, skipping per-record work."""
    parts: list[memoryview] = []
    for rng, table in await _read_segments(fetch, index, bucket, stream, start, end, cache, object_key):
        for pos, offsets, data in _payload_chunks(rng, table):
            lo, hi = _chunk_window(pos, offsets, start, end)
            if hi > lo:
                parts.append(data[lo:hi])
    return b"".join(parts)


async def _read_segments(
    fetch: Fetch,
    index: ChunkIndex,
    bucket: str,
    stream: str,
    start: int,
    end: int,
    cache: ByteCache | None,
    object_key: Hashable | None,
) -> list[tuple[ChunkRange, pa.Table]]:
    """Fetch and decode the stream's rows of every row group overlapping ``[start, end)``."""
    if start > end:
        raise ValueError(f"start {start} > end {end}")
    if cache is not None and object_key is None:
        raise ValueError("object_key is required when a cache is given")
    entry = index.find(bucket, stream)
    if entry is None:
        raise KeyError(f"{bucket}/{stream} is not in this chunk")
    ranges = [r for r in entry.ranges if r.start_offset < end and r.end_offset > start]
    gap = _gap_in(ranges, max(start, entry.start_offset), min(end, entry.end_offset))
    if gap is not None:
        # Bytes a keyed compaction removed from this object (a rewrite with ``gaps``): a read never asks
        # for them (it skips the stream's holes), so one that does is refused rather than served short.
        raise ColdDataDamaged(object_key, f"{bucket}/{stream}: offset {gap} is not in this object")
    if not ranges or start == end:
        return []
    footer, regions = await _load(fetch, index, [r.row_group for r in ranges], cache, object_key)
    try:
        pf = pq.ParquetFile(
            pa.PythonFile(_SparseFile(index.file_size, regions), mode="r"),
            metadata=pq.read_metadata(pa.BufferReader(footer)),
            pre_buffer=False,
            page_checksum_verification=True,
        )
        return [(r, _segment_table(pf, r)) for r in ranges]
    except (OSError, ValueError, pa.ArrowException) as exc:
        # Whatever fails to decode is damage (or an index that lies): never served, never a 500.
        raise ColdDataDamaged(object_key, f"does not decode: {type(exc).__name__}: {exc}") from None


def _gap_in(ranges: Sequence[ChunkRange], start: int, end: int) -> int | None:
    """The first offset of ``[start, end)`` that ``ranges`` (in offset order) do not hold; None: all held."""
    pos = start
    for r in ranges:
        if r.start_offset > pos:
            return pos
        pos = max(pos, r.end_offset)
    return pos if pos < end else None


def _segment_table(pf: pq.ParquetFile, rng: ChunkRange) -> pa.Table:
    """Decode the stream's rows of one row group and check them against the index."""
    table = pf.read_row_group(rng.row_group, columns=_READ_COLUMNS, use_threads=False)
    table = table.slice(rng.row_start, rng.num_rows)
    if (
        table.num_rows != rng.num_rows
        or table.column("start_offset")[0].as_py() != rng.start_offset
        or table.column("end_offset")[-1].as_py() != rng.end_offset
    ):
        raise ValueError(f"chunk index does not match object at row group {rng.row_group}")
    # Served bytes are sliced by position, so the payloads must add up to the offsets exactly.
    payload_bytes = sum(int(offsets[-1] - offsets[0]) for _, offsets, _ in _payload_chunks(rng, table))
    if payload_bytes != rng.end_offset - rng.start_offset:
        raise ValueError(
            f"payloads of row group {rng.row_group} hold {payload_bytes} bytes for their offsets' "
            f"{rng.end_offset - rng.start_offset}"
        )
    return table


async def _load(
    fetch: Fetch,
    index: ChunkIndex,
    row_groups: list[int],
    cache: ByteCache | None,
    object_key: Hashable | None,
) -> tuple[bytes | memoryview, list[tuple[int, memoryview]]]:
    """Return the footer and ``(file_offset, bytes)`` regions covering ``row_groups``.

    Cache misses are fetched concurrently; adjacent row groups share one GET.
    """
    cached_footer = cache.get((object_key, "footer")) if cache is not None else None
    regions: list[tuple[int, memoryview]] = []
    missing: list[int] = []
    for g in row_groups:
        hit = cache.get((object_key, "rg", g)) if cache is not None else None
        if hit is None:
            missing.append(g)
        else:
            regions.append((index.row_groups[g].offset, memoryview(hit)))

    runs = _adjacent_runs(index.row_groups, missing)
    requests = [(index.row_groups[a].offset, index.row_groups[b].end) for a, b in runs]
    if cached_footer is None:
        requests.append((index.footer_offset, index.file_size))
    results = await asyncio.gather(*(_fetch_exact(fetch, lo, hi, object_key) for lo, hi in requests))

    footer: bytes | memoryview
    if cached_footer is None:
        footer = results.pop()
        if index.footer_crc32c is not None and google_crc32c.value(bytes(footer)) != index.footer_crc32c:
            raise ColdDataDamaged(object_key, "footer checksum mismatch")
        if bytes(footer[-4:]) != _MAGIC:
            raise ColdDataDamaged(object_key, "fetched footer does not end with the Parquet magic")
        if cache is not None:
            cache.put((object_key, "footer"), bytes(footer))
    else:
        footer = cached_footer
    for (a, b), buf in zip(runs, results, strict=True):
        base = index.row_groups[a].offset
        regions.append((base, buf))
        for g in range(a, b + 1):
            span = index.row_groups[g]
            piece = bytes(buf[span.offset - base : span.end - base])
            if span.crc32c is not None and google_crc32c.value(piece) != span.crc32c:
                raise ColdDataDamaged(object_key, f"row group {g} checksum mismatch")
            if cache is not None:  # only checked bytes are cached
                cache.put((object_key, "rg", g), piece)
    regions.append((index.footer_offset, memoryview(footer)))
    return footer, regions


def _adjacent_runs(spans: Sequence[RowGroupSpan], groups: list[int]) -> list[tuple[int, int]]:
    """Group row group numbers into ``(first, last)`` runs that are contiguous on disk."""
    runs: list[tuple[int, int]] = []
    for g in sorted(set(groups)):
        if runs and runs[-1][1] == g - 1 and spans[g - 1].end == spans[g].offset:
            runs[-1] = (runs[-1][0], g)
        else:
            runs.append((g, g))
    return runs


async def _fetch_exact(fetch: Fetch, start: int, end: int, object_key: Hashable | None) -> memoryview:
    data = memoryview(await fetch(start, end))
    if len(data) != end - start:
        # The object is shorter than it was written (transport truncation is the store's to retry).
        raise ColdDataDamaged(
            object_key, f"ranged GET [{start}, {end}) returned {len(data)} bytes, expected {end - start}"
        )
    return data


class _SparseFile:
    """Read-only file-like view of an object of which only some regions were fetched.

    pyarrow reads through it as if it had the whole object. Touching any byte
    outside the fetched regions raises, so a successful read proves no other row
    group was needed. Reads return memoryview slices, which pyarrow wraps
    without copying.
    """

    closed = False

    def __init__(self, size: int, regions: list[tuple[int, memoryview]]) -> None:
        self._size = size
        self._regions = sorted(regions, key=lambda r: r[0])
        self._starts = [offset for offset, _ in self._regions]
        self._pos = 0

    def read(self, n: int = -1) -> memoryview:
        end = self._size if n < 0 else min(self._pos + n, self._size)
        if end <= self._pos:
            return memoryview(b"")
        i = bisect_right(self._starts, self._pos) - 1
        if i >= 0:
            offset, buf = self._regions[i]
            if end - offset <= len(buf):
                view = buf[self._pos - offset : end - offset]
                self._pos = end
                return view
        raise OSError(f"read of [{self._pos}, {end}) is outside the fetched byte ranges")

    read_buffer = read

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = base + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _payload_chunks(rng: ChunkRange, table: pa.Table) -> Iterator[tuple[int, memoryview, memoryview]]:
    """Yield ``(stream offset of first byte, value offsets, data)`` per Arrow chunk.

    Because a stream's payloads are contiguous in offset, byte ``k`` of the
    chunk's data sits at stream offset ``pos + k - offsets[0]``; no per-row
    offset columns are needed to trim.
    """
    pos = rng.start_offset
    for chunk in table.column("payload").chunks:
        if len(chunk) == 0:
            continue
        _, off_buf, data_buf = chunk.buffers()
        offsets = memoryview(off_buf).cast("i")[chunk.offset : chunk.offset + len(chunk) + 1]
        data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
        yield pos, offsets, data
        pos += offsets[-1] - offsets[0]


def _chunk_window(pos: int, offsets: memoryview, start: int, end: int) -> tuple[int, int]:
    """Data-buffer byte window of a chunk that falls inside stream range ``[start, end)``."""
    base, top = offsets[0], offsets[-1]
    lo = base + min(max(start - pos, 0), top - base)
    hi = base + max(min(end - pos, top - base), 0)
    return lo, hi


def _chunk_pieces(
    pos: int, offsets: memoryview, data: memoryview, start: int, end: int
) -> Iterator[tuple[int, bytes]]:
    """Per-record pieces of one chunk, trimmed to ``[start, end)``."""
    lo, hi = _chunk_window(pos, offsets, start, end)
    if hi <= lo:
        return
    base = offsets[0]
    # Last record beginning at or before lo; zero-length records there are skipped.
    i = bisect_right(offsets, lo) - 1
    last = len(offsets) - 1
    while i < last and offsets[i] < hi:
        a, b = max(offsets[i], lo), min(offsets[i + 1], hi)
        if b > a:
            yield pos + a - base, bytes(data[a:b])
        i += 1
