"""``tiered verify`` recomputes every stream's integrity digests from the bytes it reads, and names
the stream and range of each of: a byte flipped in a hot segment, a byte flipped in a cold row
group, a cold row removed (the object rewritten as valid Parquet, its footer consistent), a row
duplicated into another object the stream reads from. A clean data dir passes.

The data dir is a real engine's (``tests/support/gc_support.Harness``): stream ``a`` in two cold
objects and in the hot tier, stream ``b`` sharing ``a``'s first object.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.gc_support import Harness, make_config
from tiered.cli.verify import load_state_read_only, run_verify
from tiered.cold.parquet.chunk import _write_parquet, encode_chunk, iter_records
from tiered.core.config import Config
from tiered.engine.streams.model import Stream
from tiered.hot.segment import segment_name

pytestmark = pytest.mark.timeout(120)


def _build(tmp_path: Path) -> Config:
    config = make_config(tmp_path / "data")

    async def main() -> None:
        h = Harness(config)
        await h.start()
        try:
            await h.create("default", "a", b"first-record")
            await h.create("default", "b", b"bee")
            for i in range(4):
                await h.append("default", "a", f"a-{i}-".encode() * (i + 1))
                await h.append("default", "b", f"b{i}".encode())
            assert await h.flush() > 0
            for i in range(3):
                await h.append("default", "a", f"second-{i}".encode())
            assert await h.flush() > 0
            await h.append("default", "a", b"hot-one")
            await h.append("default", "a", b"hot-two")
        finally:
            await h.stop()

    asyncio.run(main())
    return config


def _verify(config: Config, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = asyncio.run(run_verify(config))
    return rc, capsys.readouterr().out


def _stream(config: Config, path: str) -> Stream:
    s = load_state_read_only(config).find("default", path)
    assert s is not None
    return s


def _object(config: Config, key: str) -> Path:
    return config.data_path / "cold" / key


def test_a_clean_data_dir_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _build(tmp_path)
    a = _stream(config, "a")
    assert len(a.cold_refs) == 2 and len({r.key for r in a.cold_refs}) == 2 and a.tail > a.cold_end
    rc, out = _verify(config, capsys)
    assert rc == 0, out
    assert "digests checked:  2 streams (0 from before digests)" in out


def test_a_byte_flipped_in_a_hot_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _build(tmp_path)
    a = _stream(config, "a")
    c = a.chunks
    i = next(i for i, start in enumerate(c.starts) if start >= a.cold_end)
    start, length, seg, pos = c.starts[i], c.lens[i], c.segs[i], c.poss[i]
    path = config.data_path / "hot" / segment_name(seg)
    raw = bytearray(path.read_bytes())
    raw[pos + 2] ^= 0x01
    path.write_bytes(bytes(raw))
    rc, out = _verify(config, capsys)
    assert rc == 1
    assert (
        f"default/a [{start}, {start + length}) (hot): its bytes do not hash to the digest the journal kept"
        in out
    )
    assert "default/a: live digest recomputed from the bytes read is" in out
    assert "default/b" not in out


def test_a_byte_flipped_in_a_cold_row_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _build(tmp_path)
    ref = _stream(config, "a").cold_refs[1]
    path = _object(config, ref.key)
    raw = bytearray(path.read_bytes())
    payload = pq.read_metadata(pa.BufferReader(bytes(raw))).row_group(0).column(6)  # the payload column
    raw[payload.data_page_offset + payload.total_compressed_size - 3] ^= 0x10  # in its (compressed) bytes
    path.write_bytes(bytes(raw))
    rc, out = _verify(config, capsys)
    assert rc == 1
    assert f"default/a [{ref.start}, {ref.end}) in {ref.key}: its rows add up to" in out


def test_a_cold_row_removed_with_the_footer_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _build(tmp_path)
    ref = _stream(config, "a").cold_refs[0]
    path = _object(config, ref.key)
    rows = list(iter_records(path.read_bytes()))
    last_of_a = max((r for r in rows if r.stream == "a"), key=lambda r: r.start_offset)
    data, _ = encode_chunk([r for r in rows if r is not last_of_a])  # valid Parquet, a consistent footer
    path.write_bytes(data)
    rc, out = _verify(config, capsys)
    assert rc == 1
    assert f"default/a [{ref.start}, {ref.end}) in {ref.key}: its rows add up to" in out
    assert "(4 records," in out  # what is left of the five
    assert "default/b" not in out


def test_a_row_duplicated_into_another_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _build(tmp_path)
    first, second = _stream(config, "a").cold_refs
    donor = next(r for r in iter_records(_object(config, first.key).read_bytes()) if r.stream == "a")
    path = _object(config, second.key)
    rows = sorted(
        [*iter_records(path.read_bytes()), donor], key=lambda r: (r.bucket, r.stream, r.start_offset)
    )
    path.write_bytes(_write_parquet(rows, [(0, len(rows))], "zstd"))  # valid Parquet, footer digests included
    rc, out = _verify(config, capsys)
    assert rc == 1
    doubled = f"default/a [{donor.start_offset}, {donor.end_offset})"
    assert f"{second.key}: {doubled}: the row lies outside the range [{second.start}, {second.end})" in out
    assert f"default/a [{second.start}, {second.end}) in {second.key}: its rows add up to" in out
