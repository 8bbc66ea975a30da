"""The index of one cold object: where each stream's bytes sit, and digests to check them.

Kept apart from the Parquet codec (``parquet_chunk``) and free of pyarrow, so the
state machine, journal records and snapshots can carry an index without
importing the codec. The service persists one ``ChunkIndex`` per object in its
metadata journal; with it a read plans exact ranged GETs (footer plus only the
overlapping row groups) without listing or opening the object first.

Digests: every row group span and the footer carry the CRC32C of their bytes as
written, so every byte a read fetches is checked before it is decoded (Parquet's
page checksums do not cover page headers or the footer). Indexes journaled
before digests existed decode with ``None`` there and rely on page checksums.
"""

from __future__ import annotations

from bisect import bisect_left

import msgspec

__all__ = ["ChunkIndex", "ChunkRange", "ColdDataDamaged", "RowGroupSpan", "StreamIndex"]


class ColdDataDamaged(Exception):
    """A cold object's bytes do not match what was written: an integrity error, never served."""

    def __init__(self, key: object, detail: str) -> None:
        super().__init__(f"cold object {key}: {detail}")
        self.key = key
        self.detail = detail


class RowGroupSpan(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Byte range ``[offset, offset + length)`` of one row group's column chunks."""

    offset: int
    length: int
    num_rows: int
    crc32c: int | None = None  # of the span's bytes as written

    @property
    def end(self) -> int:
        return self.offset + self.length


class ChunkRange(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Offsets ``[start_offset, end_offset)`` of one stream stored in one row group.

    The stream's rows are ``row_start .. row_start + num_rows`` of that row group,
    so a reader can slice them out without comparing bucket/stream strings.
    """

    start_offset: int
    end_offset: int
    row_group: int
    row_start: int
    num_rows: int


class StreamIndex(msgspec.Struct, frozen=True, array_like=True):
    """Where one stream's data lives in the object: ranges in offset order.

    ``incarnation``: which of the streams the path held (0: its first); None for
    an object of format 1, written before incarnations were recorded.
    """

    bucket: str
    stream: str
    ranges: tuple[ChunkRange, ...]
    incarnation: int | None = None

    @property
    def start_offset(self) -> int:
        return self.ranges[0].start_offset

    @property
    def end_offset(self) -> int:
        return self.ranges[-1].end_offset


class ChunkIndex(msgspec.Struct, frozen=True, array_like=True):
    """Everything needed to plan ranged GETs against one cold object.

    ``footer_length`` counts the Thrift metadata plus the 8-byte trailer, so the
    footer is the last ``footer_length`` bytes of the ``file_size``-byte object.
    ``streams`` is sorted by ``(bucket, stream)``.
    """

    file_size: int
    footer_length: int
    row_groups: tuple[RowGroupSpan, ...]
    streams: tuple[StreamIndex, ...]
    footer_crc32c: int | None = None  # of the footer bytes (Thrift metadata + trailer) as written

    @property
    def footer_offset(self) -> int:
        return self.file_size - self.footer_length

    def find(self, bucket: str, stream: str) -> StreamIndex | None:
        """Binary-search the entry for ``bucket/stream``; None if absent."""
        key = (bucket, stream)
        i = bisect_left(self.streams, key, key=_stream_key)
        if i < len(self.streams) and _stream_key(self.streams[i]) == key:
            return self.streams[i]
        return None

    def for_stream(self, bucket: str, stream: str) -> ChunkIndex:
        """A self-contained index restricted to one stream (row group numbering kept).

        Lets the service persist per-stream entries instead of the whole index.
        """
        entry = self.find(bucket, stream)
        if entry is None:
            raise KeyError(f"{bucket}/{stream} is not in this chunk")
        return ChunkIndex(self.file_size, self.footer_length, self.row_groups, (entry,))


def _stream_key(entry: StreamIndex) -> tuple[str, str]:
    return (entry.bucket, entry.stream)
