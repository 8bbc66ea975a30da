"""The cold format's optional footer key ``tiered.integrity.v1``: each row's digest contribution, per
row group, as ``tiered.core.record_digest`` computes it (or as the writer knew it); absent in objects
written before digests; a value that does not fit the row groups is refused."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tiered.cold.parquet.chunk import (
    CHUNK_SCHEMA,
    FORMAT_KEY,
    FORMAT_VERSION,
    INTEGRITY_KEY,
    ColdRecord,
    encode_chunk,
    row_digests,
    row_groups,
)
from tiered.core.record_digest import record_hash


def _rows() -> list[ColdRecord]:
    rows = []
    for stream, n in (("a", 5), ("b/c", 3)):
        pos = 0
        for i in range(n):
            payload = f"{stream}-{i}-".encode() * (i + 1)
            rows.append(ColdRecord("acme", stream, pos, pos + len(payload), 1000 + i, payload, 2))
            pos += len(payload)
    return rows


def test_every_row_carries_its_contribution_per_row_group() -> None:
    rows = _rows()
    data, _ = encode_chunk(rows, row_group_bytes=40)  # small groups: several row groups
    meta = pq.read_metadata(pa.BufferReader(data))
    assert meta.num_row_groups > 1
    footer, groups = row_groups(data)
    assert footer == row_digests(meta)
    assert footer is not None
    seen = 0
    for g, group_rows in groups:
        assert len(footer[g]) == len(group_rows)
        for h, r in zip(footer[g], group_rows, strict=True):
            assert h == record_hash(r.bucket, r.stream, r.incarnation, r.start_offset, r.payload)
            seen += 1
    assert seen == len(rows)


def test_a_digest_the_writer_knows_is_written_as_given() -> None:
    rows = _rows()
    given = [ColdRecord(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "digest": 7}) for r in rows]
    data, _ = encode_chunk(given)
    footer = row_digests(pq.read_metadata(pa.BufferReader(data)))
    assert footer is not None and {h for g in footer for h in g} == {7}


def _table(n: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "bucket": "acme",
                "stream": "a",
                "incarnation": 0,
                "start_offset": i,
                "end_offset": i + 1,
                "append_time_ms": 0,
                "payload": b"x",
            }
            for i in range(n)
        ],
        schema=CHUNK_SCHEMA,
    )


def _object(metadata: dict[bytes, bytes]) -> bytes:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, CHUNK_SCHEMA, store_schema=False) as writer:
        writer.write_table(_table(3), row_group_size=3)
        writer.add_key_value_metadata(metadata)
    return bytes(sink.getvalue().to_pybytes())


def test_an_object_from_before_digests_has_none() -> None:
    data = _object({FORMAT_KEY: FORMAT_VERSION})
    assert row_digests(pq.read_metadata(pa.BufferReader(data))) is None
    footer, groups = row_groups(data)
    assert footer is None and [len(rows) for _, rows in groups] == [3]


@pytest.mark.parametrize(
    "value",
    [
        b"",  # one group of no digests for three rows
        b"AAAA,AAAA",  # two row groups of digests for one
        b"not base64!",
    ],
)
def test_a_footer_value_that_does_not_fit_is_refused(value: bytes) -> None:
    data = _object({FORMAT_KEY: FORMAT_VERSION, INTEGRITY_KEY: value})
    with pytest.raises(ValueError):
        row_digests(pq.read_metadata(pa.BufferReader(data)))
