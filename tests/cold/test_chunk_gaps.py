"""Cold objects a keyed compaction rewrote: a stream's rows may skip offsets (``encode_chunk(gaps=True)``).

Each contiguous run is one index range (a new one at every gap, in one row group too); reads
inside a run slice bytes exactly as before; a read that crosses a gap is refused as damage,
never served short; the index rebuilt from the object equals the written one; and without
``gaps`` a stream that skips offsets is still refused, so other writers keep the old contract.
"""

from __future__ import annotations

import asyncio

import pytest

from tiered.cold.parquet.chunk import (
    ColdDataDamaged,
    ColdRecord,
    encode_chunk,
    read_stream_bytes,
    read_stream_range,
    rebuild_index,
)


def rec(stream: str, start: int, payload: bytes) -> ColdRecord:
    return ColdRecord("b", stream, start, start + len(payload), 1, payload)


# Stream "k" holds [0, 10) and [30, 45) (the records between were removed); "o" is contiguous.
ROWS = [
    rec("k", 0, b"0123456789"),
    rec("k", 30, b"abcdefghij"),
    rec("k", 40, b"KLMNO"),
    rec("o", 0, b"other"),
]


def fetcher(data: bytes):  # type: ignore[no-untyped-def]
    async def fetch(start: int, end: int) -> bytes:
        return data[start:end]

    return fetch


def test_each_run_is_one_range_and_reads_inside_runs_are_exact() -> None:
    data, index = encode_chunk(ROWS, gaps=True)
    entry = index.find("b", "k")
    assert entry is not None
    assert [(r.start_offset, r.end_offset, r.row_start, r.num_rows) for r in entry.ranges] == [
        (0, 10, 0, 1),
        (30, 45, 1, 2),
    ]
    assert rebuild_index(data) == index

    async def reads() -> None:
        fetch = fetcher(data)
        assert await read_stream_bytes(fetch, index, "b", "k", 2, 8) == b"234567"
        assert await read_stream_bytes(fetch, index, "b", "k", 30, 45) == b"abcdefghijKLMNO"
        assert await read_stream_range(fetch, index, "b", "k", 35, 42) == [(35, b"fghij"), (40, b"KL")]
        assert await read_stream_bytes(fetch, index, "b", "o", 0, 5) == b"other"
        for start, end in ((5, 35), (10, 31), (12, 20)):
            with pytest.raises(ColdDataDamaged, match="not in this object"):
                await read_stream_bytes(fetch, index, "b", "k", start, end)

    asyncio.run(reads())


def test_without_gaps_a_stream_must_be_contiguous() -> None:
    with pytest.raises(ValueError, match="not contiguous"):
        encode_chunk(ROWS)
    with pytest.raises(ValueError, match="not contiguous"):
        encode_chunk([rec("k", 0, b"0123456789"), rec("k", 5, b"xyz")], gaps=True)  # an overlap


def test_a_contiguous_object_indexes_as_before() -> None:
    rows = [rec("k", 0, b"0123456789"), rec("k", 10, b"abc")]
    assert encode_chunk(rows, gaps=True)[1] == encode_chunk(rows)[1]
