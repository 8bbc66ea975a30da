"""The hot segment format and log: framing, batch markers, recovery, rolling and reads.

All of this runs in-process on ``tmp_path``: records are appended, batches
written through ``write_batch`` exactly as the journal's worker thread does,
and crashes are simulated by editing the segment files directly.

Every write batch starts, in each segment it touches, with a batch marker
frame (``MARKER_FRAME_SIZE`` bytes) that declares the batch's length, so
expected positions below are computed from ``HEADER_SIZE``,
``MARKER_FRAME_SIZE`` and ``FRAME_SIZE`` rather than written out.
"""

from __future__ import annotations

import os
import random
import struct
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered.hot.log import LogPosition, SegmentLog, SegmentUnchecked, WriteBatch
from tiered.hot.segment import (
    FRAME,
    FRAME_SIZE,
    HEADER_SIZE,
    MAGIC,
    MARKER_FRAME_SIZE,
    MAX_BODY,
    CorruptSegmentError,
    DamagedRecordError,
    crc32c,
    frame,
    is_marker,
    marker_frame,
    parse_segment_name,
    scan_segment,
    segment_name,
)

# --------------------------------------------------------------------------- helpers


def open_log(
    directory: Path, replay_from: LogPosition | None = None, **kw: int
) -> tuple[SegmentLog, list[tuple[LogPosition, bytes]]]:
    log = SegmentLog(directory, **kw)
    replayed = list(log.open(replay_from))
    return log, replayed


def flush(log: SegmentLog, *, sync: bool = True) -> WriteBatch | None:
    batch = log.take_batch()
    if batch is not None:
        log.write_batch(batch, sync=sync)
    return batch


def append_all(log: SegmentLog, bodies: list[bytes]) -> list[LogPosition]:
    positions = [log.append(b) for b in bodies]
    flush(log)
    return positions


def seg_path(directory: Path, seg: int) -> Path:
    return directory / segment_name(seg)


def flip_byte(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


def bodies_of(n: int, size: int = 20, tag: bytes = b"r") -> list[bytes]:
    return [tag + str(i).encode().rjust(size - len(tag), b".") for i in range(n)]


def framed_size(bodies: list[bytes]) -> int:
    return sum(FRAME_SIZE + len(b) for b in bodies)


def batch_bytes(bodies: list[bytes]) -> bytes:
    """The on-disk bytes of one write batch (in one segment): its marker, then its records."""
    records = b"".join(frame(b) for b in bodies)
    return marker_frame(MARKER_FRAME_SIZE + len(records)) + records


def expected_batch(start: int, bodies: list[bytes]) -> tuple[list[int], int]:
    """Body offsets of ``bodies`` written as one batch at ``start`` in one segment, and the batch's end."""
    pos = start + MARKER_FRAME_SIZE
    offsets = []
    for b in bodies:
        offsets.append(pos + FRAME_SIZE)
        pos += FRAME_SIZE + len(b)
    return offsets, pos


def raw_frames(path: Path) -> list[tuple[int, bytes]]:
    """Every frame of a whole, verified segment file, markers included: (frame position, body).

    Parsed here rather than with ``scan_segment``, so the tests see what is really on disk.
    """
    data = path.read_bytes()
    assert data[:HEADER_SIZE] == MAGIC
    out = []
    pos = HEADER_SIZE
    while pos < len(data):
        length, crc = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME_SIZE : pos + FRAME_SIZE + length]
        assert len(body) == length > 0 and crc32c(body) == crc, f"bad frame at {pos}"
        out.append((pos, body))
        pos += FRAME_SIZE + length
    return out


def batches_on_disk(path: Path, *, contiguous: bool = True) -> list[tuple[int, int, list[bytes]]]:
    """A segment's batches: (marker position, declared batch bytes, the batch's data bodies).

    ``contiguous``: check every batch is exactly as long as its marker says (a
    recovered torn write may leave a marker that declares more than is there).
    """
    batches: list[tuple[int, int, list[bytes]]] = []
    for pos, body in raw_frames(path):
        if len(body) == 9 and body[0] == 0xC1:
            (declared,) = struct.unpack_from("<Q", body, 1)
            batches.append((pos, declared, []))
        else:
            assert batches, f"data record at {pos} before any batch marker"
            batches[-1][2].append(body)
    if not contiguous:
        return batches
    size = path.stat().st_size
    for (pos, declared, _), nxt in zip(batches, [b[0] for b in batches[1:]] + [size], strict=True):
        assert pos + declared == nxt, f"batch at {pos} declares {declared} bytes but the next starts at {nxt}"
    return batches


# Two 30-byte records (38 bytes framed) fit in a segment after its magic and one
# marker, a third never does: the slack is more than a marker, less than a record.
SEG_2x30 = HEADER_SIZE + MARKER_FRAME_SIZE + 2 * (FRAME_SIZE + 30) + 20

# --------------------------------------------------------------------------- format


def test_crc32c_known_vector() -> None:
    # The standard CRC-32C check value.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(memoryview(b"123456789")) == 0xE3069283
    assert crc32c(b"") == 0


def test_frame_layout() -> None:
    body = b"hello"
    framed = frame(body)
    assert len(framed) == FRAME_SIZE + len(body)
    length, crc = FRAME.unpack_from(framed)
    assert length == 5 and crc == crc32c(body)
    assert framed[FRAME_SIZE:] == body
    # Little-endian u32s.
    assert framed[:4] == struct.pack("<I", 5)
    # An empty body would frame to all zeros -- which is why empty records count as torn.
    assert frame(b"") == FRAME.pack(0, 0) == bytes(FRAME_SIZE)


def test_batch_marker_layout() -> None:
    marker = marker_frame(1234)
    assert MARKER_FRAME_SIZE == FRAME_SIZE + 9 == len(marker)
    assert marker == frame(b"\xc1" + struct.pack("<Q", 1234))
    assert is_marker(marker[FRAME_SIZE:])
    assert not is_marker(b"\xc1" * 8) and not is_marker(b"\xc1" * 10)
    assert not is_marker(b"\x00" + bytes(8)) and not is_marker(b"hello")


def test_segment_names() -> None:
    assert segment_name(1) == "00000000000000000001.seg"
    for sid in (0, 1, 42, 10**19):
        assert parse_segment_name(segment_name(sid)) == sid
    for bad in (
        "1.seg",
        "00000000000000000001.seg.tmp",
        "0000000000000000000a.seg",
        "00000000000000000001.log",
        "x.seg",
        "",
    ):
        assert parse_segment_name(bad) is None


# Data bodies are never empty and never look like a batch marker.
data_bodies = st.binary(min_size=1, max_size=300).filter(lambda b: not is_marker(b))


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(data_bodies, min_size=1, max_size=8), max_size=6))
def test_frame_scan_round_trip(tmp_path: Path, batches: list[list[bytes]]) -> None:
    path = tmp_path / "roundtrip.seg"
    data = bytearray(MAGIC)
    expected: list[tuple[int, bytes]] = []
    last: tuple[int | None, int | None] = (None, None)
    for bodies in batches:
        start = len(data)
        offsets, end = expected_batch(start, bodies)
        data += batch_bytes(bodies)
        assert len(data) == end
        expected += zip(offsets, bodies, strict=True)
        last = (start, end)
    path.write_bytes(bytes(data))
    result = scan_segment(str(path))
    # Markers are not records: only the data bodies come back, at their body positions.
    assert [(r.body_pos, r.body) for r in result.records] == expected
    for rec in result.records:
        assert data[rec.body_pos : rec.body_pos + len(rec.body)] == rec.body
    assert result.torn_reason is None
    assert result.valid_end == result.file_size == len(data)
    assert (result.batch_start, result.batch_end) == last


def test_scan_from_a_later_position(tmp_path: Path) -> None:
    path = tmp_path / "s.seg"
    bodies = [b"one", b"two", b"three"]
    path.write_bytes(MAGIC + batch_bytes(bodies))
    offsets, _ = expected_batch(HEADER_SIZE, bodies)
    second = offsets[1] - FRAME_SIZE
    assert [r.body for r in scan_segment(str(path), second).records] == [b"two", b"three"]
    # A start inside the header is clamped to the first frame (the marker).
    assert [r.body for r in scan_segment(str(path), 0).records] == bodies


def test_scan_reports_torn_reasons(tmp_path: Path) -> None:
    good = MAGIC + batch_bytes([b"abc"])
    cases = [
        ("incomplete frame header", good + b"\x05\x00"),
        ("runs past end of file", good + frame(b"abcdef")[:-2]),
        ("checksum mismatch", good + FRAME.pack(3, crc32c(b"abc") ^ 1) + b"abc"),
        ("implausible record length", good + FRAME.pack(MAX_BODY + 1, 0) + b"zz"),
        ("empty record", good + FRAME.pack(0, 0) + frame(b"more")),
        ("empty record", good + bytes(40)),  # a zero-filled tail
    ]
    for i, (reason, data) in enumerate(cases):
        path = tmp_path / f"case{i}.seg"
        path.write_bytes(data)
        result = scan_segment(str(path))
        assert [r.body for r in result.records] == [b"abc"]
        assert result.valid_end == len(good)
        assert result.file_size == len(data)
        assert result.torn_reason is not None and reason in result.torn_reason
        assert (result.batch_start, result.batch_end) == (HEADER_SIZE, len(good))


def test_scan_bad_magic_and_incomplete_header(tmp_path: Path) -> None:
    bad = tmp_path / "bad.seg"
    bad.write_bytes(b"NOTASEGMENT" + frame(b"x"))
    with pytest.raises(CorruptSegmentError, match="bad magic"):
        scan_segment(str(bad))
    short_garbage = tmp_path / "short.seg"
    short_garbage.write_bytes(b"XY")
    with pytest.raises(CorruptSegmentError):
        scan_segment(str(short_garbage))
    for n in range(HEADER_SIZE):
        partial = tmp_path / f"partial{n}.seg"
        partial.write_bytes(MAGIC[:n])
        result = scan_segment(str(partial))
        assert result.records == [] and result.valid_end == 0
        assert result.torn_reason == "incomplete segment header"
        assert result.batch_start is None and not result.torn_within_last_batch()


def test_scan_locates_the_last_batch(tmp_path: Path) -> None:
    first, last = [b"one", b"two"], [b"three", b"four", b"five"]
    data = MAGIC + batch_bytes(first) + batch_bytes(last)
    second = HEADER_SIZE + len(batch_bytes(first))
    path = tmp_path / "s.seg"
    path.write_bytes(data)
    result = scan_segment(str(path))
    assert (result.batch_start, result.batch_end) == (second, len(data))
    _, ends = zip(*(expected_batch(second, last[: i + 1]) for i in range(len(last))), strict=True)
    whole = {second + MARKER_FRAME_SIZE, *ends}
    for cut in range(second + 1, len(data)):
        path.write_bytes(data[:cut])
        result = scan_segment(str(path))
        if cut < second + MARKER_FRAME_SIZE:
            # The last batch's own marker is incomplete: the last verified batch is the first one.
            assert (result.batch_start, result.batch_end) == (HEADER_SIZE, second)
            assert result.valid_end == second and not result.torn_within_last_batch()
        elif cut in whole:
            assert result.torn_reason is None and result.valid_end == cut
        else:
            assert result.torn_reason is not None
            assert (result.batch_start, result.batch_end) == (second, len(data))
            assert result.torn_within_last_batch()
    # Bytes past the last batch's declared end: not within the last batch.
    path.write_bytes(data[:-1] + b"\xff" + b"junk")
    assert not scan_segment(str(path)).torn_within_last_batch()
    # Damage in the first batch, with the second after it: not within the last batch either.
    damaged = bytearray(data)
    damaged[HEADER_SIZE + MARKER_FRAME_SIZE + FRAME_SIZE] ^= 1
    path.write_bytes(bytes(damaged))
    result = scan_segment(str(path))
    assert result.torn_reason is not None and "checksum" in result.torn_reason
    assert (result.batch_start, result.batch_end) == (HEADER_SIZE, second)
    assert not result.torn_within_last_batch()


# --------------------------------------------------------------------------- log basics


def test_open_empty_dir_then_append_and_read(tmp_path: Path) -> None:
    d = tmp_path / "hot"
    log, replayed = open_log(d)
    assert replayed == []
    assert log.end == LogPosition(1, HEADER_SIZE)
    assert log.pending_bytes == HEADER_SIZE  # the new segment's magic
    bodies = [b"alpha", b"b", b"gamma" * 100]
    positions = [log.append(b) for b in bodies]
    offsets, end = expected_batch(HEADER_SIZE, bodies)
    assert positions == [LogPosition(1, o) for o in offsets]
    assert positions[0] == LogPosition(1, HEADER_SIZE + MARKER_FRAME_SIZE + FRAME_SIZE)
    assert log.end == LogPosition(1, end)
    assert log.pending_bytes == end  # magic, marker and records
    batch = flush(log)
    assert batch is not None and batch.end == log.end
    assert log.pending_bytes == 0 and log.take_batch() is None
    assert log.written_size(1) == log.end.offset
    assert seg_path(d, 1).read_bytes() == MAGIC + batch_bytes(bodies)
    for pos, body in zip(positions, bodies, strict=True):
        assert log.read(pos.segment, pos.offset, len(body)) == body
    # Partial reads inside a record.
    assert log.read(positions[2].segment, positions[2].offset + 5, 10) == (b"gamma" * 100)[5:15]
    log.close()

    log2, replayed2 = open_log(d)
    assert replayed2 == list(zip(positions, bodies, strict=True))
    assert log2.end == log.end
    log2.close()


def test_empty_body_is_refused_or_survives_recovery(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    try:
        append_all(log, [b"before", b"", b"after"])
    except ValueError:
        return  # refusing the empty body up front is fine too
    log.close()
    _, replayed = open_log(tmp_path)
    assert [b for _, b in replayed] == [b"before", b"", b"after"]


def test_reads_past_written_data_are_short_read_errors(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    pos = log.append(b"visible")
    flush(log)
    pending = log.append(b"not yet written")
    with pytest.raises(CorruptSegmentError, match="short read"):
        log.read(pending.segment, pending.offset, 15)
    flush(log)
    assert log.read(pending.segment, pending.offset, 15) == b"not yet written"
    assert log.read(pos.segment, pos.offset, 7) == b"visible"
    log.close()


def test_many_batches_and_unsynced_writes(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    expected: list[tuple[LogPosition, bytes]] = []
    for i in range(10):
        bodies = bodies_of(i + 1, tag=f"b{i}-".encode())
        expected += [(log.append(b), b) for b in bodies]
        flush(log, sync=i % 2 == 0)
    log.sync()
    log.close()
    _, replayed = open_log(tmp_path)
    assert replayed == expected


def test_every_batch_starts_with_its_marker(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    written: list[tuple[int, int, list[bytes]]] = []
    for i in range(6):
        bodies = bodies_of(i + 1, size=10 + 7 * i, tag=f"b{i}-".encode())
        start = log.end.offset
        positions = [log.append(b) for b in bodies]
        offsets, end = expected_batch(start, bodies)
        assert positions == [LogPosition(1, o) for o in offsets]
        assert log.end == LogPosition(1, end)
        flush(log, sync=i % 2 == 0)
        assert flush(log) is None  # nothing appended: no batch, no marker
        written.append((start, end - start, bodies))
    log.close()
    path = seg_path(tmp_path, 1)
    assert batches_on_disk(path) == written
    assert path.stat().st_size == written[-1][0] + written[-1][1]
    result = scan_segment(str(path))
    assert result.torn_reason is None
    assert (result.batch_start, result.batch_end) == (written[-1][0], path.stat().st_size)
    all_bodies = [b for _, _, bodies in written for b in bodies]
    assert [r.body for r in result.records] == all_bodies  # no markers among the records

    # Recovery replays no markers either, and the next write after a reopen opens its own batch.
    log2, replayed = open_log(tmp_path)
    assert [b for _, b in replayed] == all_bodies
    start = log2.end.offset
    more = append_all(log2, [b"after-reopen"])
    assert more == [LogPosition(1, start + MARKER_FRAME_SIZE + FRAME_SIZE)]
    log2.close()
    assert batches_on_disk(path)[-1] == (start, MARKER_FRAME_SIZE + FRAME_SIZE + 12, [b"after-reopen"])


def test_log_position_ordering() -> None:
    assert LogPosition(1, 100) < LogPosition(2, 8)
    assert LogPosition(2, 8) < LogPosition(2, 9)
    assert max(LogPosition(3, 1), LogPosition(2, 999)) == LogPosition(3, 1)


# --------------------------------------------------------------------------- torn tails

TORN_BODY = b"the-unacknowledged-record"
# The interrupted next write, whole: its marker, then its one record.
NEXT_WRITE = batch_bytes([TORN_BODY])


def _torn_next_write(kind: str) -> bytes:
    """What a crash left of the write after the last complete batch."""
    record_at = MARKER_FRAME_SIZE
    if kind == "incomplete marker":
        return NEXT_WRITE[:5]
    if kind == "marker frame header only":
        return NEXT_WRITE[:FRAME_SIZE]
    if kind == "zero-length file tail":
        return b"\x00\x00\x00"
    if kind == "incomplete record header":
        return NEXT_WRITE[: record_at + 5]
    if kind == "record header only":
        return NEXT_WRITE[: record_at + FRAME_SIZE]
    if kind == "body cut short":
        return NEXT_WRITE[:-7]
    if kind == "checksum mismatch":
        bad = bytearray(NEXT_WRITE)
        bad[-1] ^= 0x01
        return bytes(bad)
    if kind == "marker checksum mismatch":
        bad = bytearray(NEXT_WRITE)
        bad[FRAME_SIZE + 3] ^= 0x01
        return bytes(bad)
    if kind == "zeroed record":
        return NEXT_WRITE[:record_at] + bytes(len(NEXT_WRITE) - record_at)
    if kind == "zeroed write":
        return bytes(len(NEXT_WRITE))
    if kind == "garbage record length":
        return NEXT_WRITE[:record_at] + FRAME.pack(MAX_BODY + 1, 0) + b"\xee" * 10
    raise AssertionError(kind)


# Torn after its marker reached the disk: the bare marker is a whole frame and stays.
MARKER_SURVIVES = {
    "incomplete record header",
    "record header only",
    "body cut short",
    "checksum mismatch",
    "zeroed record",
    "garbage record length",
}


TORN_KINDS = [
    "incomplete marker",
    "marker frame header only",
    "zero-length file tail",
    "incomplete record header",
    "record header only",
    "body cut short",
    "checksum mismatch",
    "marker checksum mismatch",
    "zeroed record",
    "zeroed write",
    "garbage record length",
]


@pytest.mark.parametrize("kind", TORN_KINDS)
def test_torn_tail_is_truncated_and_appends_continue(tmp_path: Path, kind: str) -> None:
    log, _ = open_log(tmp_path)
    bodies = bodies_of(5)
    positions = append_all(log, bodies)
    good_end = log.end
    log.close()

    path = seg_path(tmp_path, 1)
    with open(path, "ab") as f:
        f.write(_torn_next_write(kind))
    torn_size = path.stat().st_size
    assert torn_size > good_end.offset

    # Inspection leaves the torn bytes alone.
    inspect = SegmentLog(tmp_path)
    assert list(inspect.open(read_only=True)) == list(zip(positions, bodies, strict=True))
    inspect.close()
    assert path.stat().st_size == torn_size

    log2, replayed = open_log(tmp_path)
    assert replayed == list(zip(positions, bodies, strict=True))
    kept = good_end.offset + (MARKER_FRAME_SIZE if kind in MARKER_SURVIVES else 0)
    assert path.stat().st_size == kept  # torn bytes are gone
    assert log2.end == LogPosition(1, kept)
    more = bodies_of(3, tag=b"after")
    new_positions = append_all(log2, more)
    offsets, end = expected_batch(kept, more)
    assert new_positions == [LogPosition(1, o) for o in offsets]
    for pos, body in zip(new_positions, more, strict=True):
        assert log2.read(pos.segment, pos.offset, len(body)) == body
    log2.close()
    on_disk = batches_on_disk(path, contiguous=False)
    assert [b[2] for b in on_disk] == ([bodies, [], more] if kind in MARKER_SURVIVES else [bodies, more])
    assert on_disk[-1][0] == kept and path.stat().st_size == end

    _, replayed3 = open_log(tmp_path)
    assert replayed3 == list(zip(positions + new_positions, bodies + more, strict=True))


def _last_batch_cut_points(start: int, bodies: list[bytes]) -> list[int]:
    """Cut points all over a batch written at ``start``: in its marker, around and inside every record."""
    points = set(range(start + 1, start + MARKER_FRAME_SIZE + 2))
    pos = start + MARKER_FRAME_SIZE
    for body in bodies:
        points.update(pos + d for d in (-1, 0, 1, 4, FRAME_SIZE - 1, FRAME_SIZE, FRAME_SIZE + 1))
        points.add(pos + FRAME_SIZE + len(body) // 2)
        pos += FRAME_SIZE + len(body)
        points.add(pos - 1)
    return sorted(p for p in points if start < p < pos)


@pytest.mark.parametrize("damage", ["cut", "zero-filled", "garbage-filled"])
def test_torn_write_inside_a_large_last_batch_is_cut_to_the_last_whole_record(
    tmp_path: Path, damage: str
) -> None:
    log, _ = open_log(tmp_path)
    first = bodies_of(4, tag=b"acked")
    first_positions = append_all(log, first)
    start = log.end.offset
    rng = random.Random(7)
    big = [bytes([65 + i % 26]) * rng.randint(1, 90) for i in range(40)]
    big_positions = append_all(log, big)
    log.close()
    path = seg_path(tmp_path, 1)
    data = path.read_bytes()
    offsets, end = expected_batch(start, big)
    assert [p.offset for p in big_positions] == offsets and len(data) == end
    # Where the log may be cut back to: the previous batch's end, the bare marker, each whole record.
    whole = [start, start + MARKER_FRAME_SIZE] + [o + len(b) for o, b in zip(offsets, big, strict=True)]
    assert whole[-1] == end
    everything = list(zip(first_positions + big_positions, first + big, strict=True))

    cuts = _last_batch_cut_points(start, big)
    assert len(cuts) > 300
    for i, cut in enumerate(cuts):
        if damage == "cut":
            torn = data[:cut]
        elif damage == "zero-filled":  # the file kept its size, the unwritten extent reads back as zeros
            torn = data[:cut] + bytes(len(data) - cut)
        else:
            torn = data[:cut] + random.Random(cut).randbytes(len(data) - cut)
        path.write_bytes(torn)
        # Back to the last whole frame that is still intact (zeros can leave a marker's
        # zero high bytes intact, so that is not always the last one before the cut).
        kept = max(w for w in whole if torn[:w] == data[:w])
        assert kept <= cut or damage != "cut"
        log2, replayed = open_log(tmp_path)
        assert replayed == [(p, b) for p, b in everything if p.offset + len(b) <= kept], f"cut at {cut}"
        assert path.stat().st_size == kept, f"cut at {cut}"
        assert log2.end == LogPosition(1, kept)
        if i % 4:
            log2.close()
            continue
        # The log goes on from the cut.
        after = append_all(log2, [b"after"])
        assert after == [LogPosition(1, kept + MARKER_FRAME_SIZE + FRAME_SIZE)]
        assert log2.read(1, after[0].offset, 5) == b"after"
        log2.close()
        _, again = open_log(tmp_path)
        assert again[-1] == (after[0], b"after") and again[:-1] == replayed


def test_torn_tail_in_rolled_newest_segment(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=120)
    bodies = bodies_of(8)
    positions = append_all(log, bodies)
    newest = log.end.segment
    assert newest > 1
    log.close()
    with open(seg_path(tmp_path, newest), "ab") as f:
        f.write(batch_bytes([b"torn"])[:-1])
    log2, replayed = open_log(tmp_path, segment_bytes=120)
    assert replayed == list(zip(positions, bodies, strict=True))
    extra = append_all(log2, [b"next"])
    assert extra[0].segment >= newest
    assert log2.read(extra[0].segment, extra[0].offset, 4) == b"next"
    log2.close()
    _, replayed2 = open_log(tmp_path, segment_bytes=120)
    assert replayed2 == list(zip(positions + extra, bodies + [b"next"], strict=True))


def test_torn_batch_spanning_a_roll_keeps_its_sealed_part(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=SEG_2x30)
    bodies = bodies_of(3, size=30)
    positions = append_all(log, bodies)
    assert [p.segment for p in positions] == [1, 1, 2]
    log.close()
    # The second segment's part of the batch: its magic, marker and record. Tear it inside the record.
    seg2 = seg_path(tmp_path, 2)
    os.truncate(seg2, positions[2].offset + 3)
    log2, replayed = open_log(tmp_path, segment_bytes=SEG_2x30)
    assert replayed == list(zip(positions[:2], bodies[:2], strict=True))
    assert log2.end == LogPosition(2, HEADER_SIZE + MARKER_FRAME_SIZE)
    assert seg2.stat().st_size == HEADER_SIZE + MARKER_FRAME_SIZE
    log2.close()
    # Torn inside that part's marker: the segment is cut back to its magic.
    os.truncate(seg2, HEADER_SIZE + 4)
    log3, replayed = open_log(tmp_path, segment_bytes=SEG_2x30)
    assert replayed == list(zip(positions[:2], bodies[:2], strict=True))
    assert log3.end == LogPosition(2, HEADER_SIZE) and seg2.stat().st_size == HEADER_SIZE
    again = append_all(log3, [bodies[2]])
    assert again == [positions[2]]
    log3.close()


def test_damage_anywhere_in_the_last_batch_is_treated_as_torn(tmp_path: Path) -> None:
    # The window is the last batch as its marker declares it, however large, not max_batch_bytes.
    log, _ = open_log(tmp_path, max_batch_bytes=64)
    append_all(log, [b"earlier"])
    bodies = bodies_of(10)
    positions = append_all(log, bodies)
    log.close()
    assert framed_size(bodies) > 64
    flip_byte(seg_path(tmp_path, 1), positions[1].offset)
    log2, replayed = open_log(tmp_path, max_batch_bytes=64)
    assert [b for _, b in replayed] == [b"earlier", bodies[0]]
    assert log2.end == LogPosition(1, positions[1].offset - FRAME_SIZE)
    log2.close()


def _damage(path: Path, how: str, record_at: int) -> None:
    """Damage the record whose frame starts at ``record_at``."""
    data = bytearray(path.read_bytes())
    if how == "checksum mismatch":
        data[record_at + FRAME_SIZE + 2] ^= 0x01
    elif how == "zeroed record":
        length = FRAME.unpack_from(data, record_at)[0]
        data[record_at : record_at + FRAME_SIZE + length] = bytes(FRAME_SIZE + length)
    elif how == "zeroed length":
        data[record_at : record_at + 4] = bytes(4)
    elif how == "implausible length":
        data[record_at + 3] = 0xFF
    elif how == "length past end of file":
        struct.pack_into("<I", data, record_at, len(data))
    else:
        raise AssertionError(how)
    path.write_bytes(bytes(data))


DAMAGE = [
    "checksum mismatch",
    "zeroed record",
    "zeroed length",
    "implausible length",
    "length past end of file",
]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize(
    "where",
    [
        "first record of the first batch",
        "middle of a middle batch",
        "last record of the batch before the last",
    ],
)
def test_corruption_followed_by_a_later_batch_raises(tmp_path: Path, where: str, how: str) -> None:
    # Whatever fails to verify with a later batch after it is acknowledged history, not a torn
    # write -- even with far less than max_batch_bytes (64 MiB by default) after it.
    log, _ = open_log(tmp_path)
    batches = [append_all(log, bodies_of(5, tag=f"b{i}-".encode())) for i in range(4)]
    log.close()
    victim = {
        "first record of the first batch": batches[0][0],
        "middle of a middle batch": batches[1][2],
        "last record of the batch before the last": batches[2][-1],
    }[where]
    path = seg_path(tmp_path, 1)
    _damage(path, how, victim.offset - FRAME_SIZE)
    before = path.read_bytes()
    with pytest.raises(CorruptSegmentError, match="corruption inside acknowledged history"):
        open_log(tmp_path)
    # Nothing was cut off by the refused recovery.
    assert path.read_bytes() == before


def test_checksum_mismatch_mid_batch_followed_by_another_batch_raises(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    bodies = bodies_of(9)
    positions = append_all(log, bodies)
    append_all(log, [b"the next batch"])
    log.close()
    flip_byte(seg_path(tmp_path, 1), positions[4].offset + 5)
    with pytest.raises(
        CorruptSegmentError, match=r"checksum mismatch.*corruption inside acknowledged history"
    ):
        open_log(tmp_path)


@pytest.mark.parametrize("how", ["marker body", "marker checksum", "marker length field"])
def test_damaged_marker_of_an_earlier_batch_raises(tmp_path: Path, how: str) -> None:
    log, _ = open_log(tmp_path)
    batches = [append_all(log, bodies_of(5, tag=f"b{i}-".encode())) for i in range(4)]
    log.close()
    marker_at = batches[1][0].offset - FRAME_SIZE - MARKER_FRAME_SIZE
    path = seg_path(tmp_path, 1)
    flip_byte(
        path, marker_at + {"marker body": FRAME_SIZE + 2, "marker checksum": 5, "marker length field": 0}[how]
    )
    before = path.read_bytes()
    try:
        with pytest.raises(CorruptSegmentError):
            open_log(tmp_path)
    finally:
        assert path.read_bytes() == before, "recovery cut off three acknowledged batches"


@pytest.mark.parametrize("extra", [0, 1])
def test_broken_next_marker_is_torn_only_within_max_batch_bytes(tmp_path: Path, extra: int) -> None:
    log, _ = open_log(tmp_path, max_batch_bytes=64)
    positions = append_all(log, bodies_of(3))
    end = log.end
    log.close()
    path = seg_path(tmp_path, 1)
    with open(path, "ab") as f:
        f.write(b"\xee" * (64 + MARKER_FRAME_SIZE + extra))  # an unverifiable "next write"
    if extra:
        with pytest.raises(CorruptSegmentError, match="corruption inside acknowledged history"):
            open_log(tmp_path, max_batch_bytes=64)
        assert path.stat().st_size == end.offset + 64 + MARKER_FRAME_SIZE + extra
    else:
        log2, replayed = open_log(tmp_path, max_batch_bytes=64)
        assert [p for p, _ in replayed] == positions
        assert log2.end == end and path.stat().st_size == end.offset
        log2.close()


def test_corrupt_sealed_segment_raises(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=120)
    positions = append_all(log, bodies_of(12))
    assert log.end.segment >= 3
    log.close()
    first_in_seg1 = next(p for p in positions if p.segment == 1)
    flip_byte(seg_path(tmp_path, 1), first_in_seg1.offset)
    with pytest.raises(CorruptSegmentError, match="sealed segment"):
        open_log(tmp_path, segment_bytes=120)


def test_torn_sealed_segment_raises(tmp_path: Path) -> None:
    # Even inside its last batch: a sealed segment was whole before the next one was begun.
    log, _ = open_log(tmp_path, segment_bytes=120)
    append_all(log, bodies_of(12))
    log.close()
    p = seg_path(tmp_path, 2)
    size = p.stat().st_size
    os.truncate(p, size - 3)
    with pytest.raises(CorruptSegmentError, match="sealed segment"):
        open_log(tmp_path, segment_bytes=120)


def test_bad_magic_in_a_segment_raises(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    append_all(log, [b"x"])
    log.close()
    flip_byte(seg_path(tmp_path, 1), 0)
    with pytest.raises(CorruptSegmentError, match="bad magic"):
        open_log(tmp_path)


# --------------------------------------------------------------------------- rolling


def test_rolling_at_segment_bytes(tmp_path: Path) -> None:
    # 30-byte bodies frame to 38 bytes: magic + marker + 2 records fit in SEG_2x30, a third does not.
    log, _ = open_log(tmp_path, segment_bytes=SEG_2x30)
    bodies = bodies_of(7, size=30)
    positions = append_all(log, bodies)
    assert [p.segment for p in positions] == [1, 1, 2, 2, 3, 3, 4]
    assert positions[2] == LogPosition(2, HEADER_SIZE + MARKER_FRAME_SIZE + FRAME_SIZE)
    assert log.segment_ids() == [1, 2, 3, 4]
    for sid in (1, 2, 3):
        size = seg_path(tmp_path, sid).stat().st_size
        assert size == HEADER_SIZE + MARKER_FRAME_SIZE + 2 * 38 <= SEG_2x30
        assert seg_path(tmp_path, sid).read_bytes()[:HEADER_SIZE] == MAGIC
    for pos, body in zip(positions, bodies, strict=True):
        assert log.read(pos.segment, pos.offset, len(body)) == body
    log.close()
    log2, replayed = open_log(tmp_path, segment_bytes=SEG_2x30)
    assert replayed == list(zip(positions, bodies, strict=True))
    # Appends continue in the newest segment (a second batch, with its own marker), then roll again.
    more_bodies = bodies_of(2, size=30, tag=b"m")
    more = append_all(log2, more_bodies)
    assert [p.segment for p in more] == [4, 5]
    assert more[0] == LogPosition(4, HEADER_SIZE + MARKER_FRAME_SIZE + 38 + MARKER_FRAME_SIZE + FRAME_SIZE)
    log2.close()
    assert [b[2] for b in batches_on_disk(seg_path(tmp_path, 4))] == [bodies[6:], more_bodies[:1]]
    assert seg_path(tmp_path, 4).stat().st_size <= SEG_2x30


def test_oversized_record_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=64)
    big = b"B" * 200
    positions = append_all(log, [big, b"small", big])
    assert [p.segment for p in positions] == [1, 2, 3]
    assert log.read(positions[2].segment, positions[2].offset, 200) == big
    log.close()
    for sid, body in ((1, big), (2, b"small"), (3, big)):
        assert batches_on_disk(seg_path(tmp_path, sid)) == [
            (HEADER_SIZE, MARKER_FRAME_SIZE + FRAME_SIZE + len(body), [body])
        ]


def test_batch_spanning_a_roll_gets_a_marker_in_each_segment(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=SEG_2x30)
    bodies = bodies_of(9, size=30)
    positions = [log.append(b) for b in bodies]
    batch = log.take_batch()
    assert batch is not None
    assert [p.segment for p in batch.parts] == [1, 2, 3, 4, 5]
    assert batch.nbytes == 5 * (HEADER_SIZE + MARKER_FRAME_SIZE) + 9 * 38
    for part in batch.parts:
        assert part.data[:HEADER_SIZE] == MAGIC
        assert part.data[HEADER_SIZE : HEADER_SIZE + MARKER_FRAME_SIZE] == marker_frame(
            len(part.data) - HEADER_SIZE
        )
    log.write_batch(batch, sync=True)
    for pos, body in zip(positions, bodies, strict=True):
        assert log.read(pos.segment, pos.offset, len(body)) == body
    for sid in range(1, 6):
        path = seg_path(tmp_path, sid)
        chunk = bodies[2 * (sid - 1) : 2 * sid]
        assert batches_on_disk(path) == [(HEADER_SIZE, path.stat().st_size - HEADER_SIZE, chunk)]

    # A batch that starts part-way into a segment: its first part has no magic, but still a marker.
    log2_dir = tmp_path / "second"
    log2, _ = open_log(log2_dir, segment_bytes=SEG_2x30)
    first = append_all(log2, bodies[:1])
    start = log2.end.offset
    rest = [log2.append(b) for b in bodies[1:4]]
    batch2 = log2.take_batch()
    assert batch2 is not None and [p.segment for p in batch2.parts] == [1, 2]
    assert batch2.parts[0].data[:MARKER_FRAME_SIZE] == marker_frame(len(batch2.parts[0].data))
    log2.write_batch(batch2, sync=True)
    log2.close()
    assert [p.segment for p in first + rest] == [1, 1, 2, 2]
    assert batches_on_disk(seg_path(log2_dir, 1)) == [
        (HEADER_SIZE, MARKER_FRAME_SIZE + 38, bodies[:1]),
        (start, MARKER_FRAME_SIZE + 38, bodies[1:2]),
    ]
    assert batches_on_disk(seg_path(log2_dir, 2)) == [(HEADER_SIZE, MARKER_FRAME_SIZE + 2 * 38, bodies[2:4])]


# --------------------------------------------------------------------------- replay from a position


def test_replay_from_a_log_position(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=150)
    first = bodies_of(5, tag=b"a")
    append_all(log, first)
    cut = log.end
    second = bodies_of(6, tag=b"b")
    positions = append_all(log, second)
    log.close()
    assert cut.segment < log.end.segment  # the cut and the tail are in different segments

    _, replayed = open_log(tmp_path, cut, segment_bytes=150)
    assert replayed == list(zip(positions, second, strict=True))
    _, everything = open_log(tmp_path, LogPosition(0, 0), segment_bytes=150)
    assert [b for _, b in everything] == first + second
    _, at_end = open_log(tmp_path, log.end, segment_bytes=150)
    assert at_end == []


def test_replay_position_inside_one_segment(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    append_all(log, [b"one", b"two"])
    cut = log.end
    positions = append_all(log, [b"three"])
    log.close()
    assert positions[0] == LogPosition(1, cut.offset + MARKER_FRAME_SIZE + FRAME_SIZE)
    _, replayed = open_log(tmp_path, cut)
    assert replayed == [(positions[0], b"three")]


def test_replay_from_beyond_newest_segment_raises(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    append_all(log, [b"x"])
    log.close()
    with pytest.raises(CorruptSegmentError, match="newest segment"):
        open_log(tmp_path, LogPosition(5, HEADER_SIZE))


def test_lost_header_of_the_replay_segment_raises(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    append_all(log, [b"one", b"two"])
    end = log.end
    log.close()
    # The snapshot covers records in segment 1, whose header is now gone.
    seg_path(tmp_path, 1).write_bytes(MAGIC[:3])
    with pytest.raises(CorruptSegmentError, match="before the snapshot position"):
        open_log(tmp_path, end)


@pytest.mark.parametrize(
    "scenario",
    [
        "segment torn below the position",
        "segment cut at a record boundary below the position",
        "position far past EOF",
        "sealed segment shorter than the position",
    ],
)
def test_segment_shorter_than_replay_position_is_refused(tmp_path: Path, scenario: str) -> None:
    seg_bytes = SEG_2x30 if scenario.startswith("sealed") else 1 << 20
    log, _ = open_log(tmp_path, segment_bytes=seg_bytes)
    positions = append_all(log, bodies_of(3, size=30))
    end = log.end
    log.close()
    path = seg_path(tmp_path, 1)
    if scenario == "segment torn below the position":
        start = LogPosition(1, positions[1].offset + 30)
        os.truncate(path, positions[1].offset + 1)
    elif scenario == "segment cut at a record boundary below the position":
        start = LogPosition(1, positions[1].offset + 30)
        os.truncate(path, positions[1].offset - FRAME_SIZE)
    elif scenario == "position far past EOF":
        start = LogPosition(1, end.offset + 5000)
    else:
        assert end.segment == 2
        start = LogPosition(1, positions[1].offset + 30)
        os.truncate(path, positions[1].offset - FRAME_SIZE)
    with pytest.raises(CorruptSegmentError, match="before the snapshot position"):
        open_log(tmp_path, start, segment_bytes=seg_bytes)


def test_damage_a_snapshot_covers_opens_and_fails_only_reads_of_it(tmp_path: Path) -> None:
    """Replay does not need records before the snapshot position: damage there is found,
    remembered and refused on read, while the log opens and the rest stays readable."""
    log, _ = open_log(tmp_path)
    positions = append_all(log, [b"one", b"two", b"three"])
    snapshot_at = log.end
    later = append_all(log, [b"four"])
    log.close()
    path = seg_path(tmp_path, 1)
    flip_byte(path, positions[1].offset + 1)  # damage a record the snapshot covers
    before = path.read_bytes()
    log2, replayed = open_log(tmp_path, snapshot_at)
    try:
        assert replayed == [(later[0], b"four")]
        assert log2.read(1, positions[0].offset, 3) == b"one"
        assert log2.read(1, positions[2].offset, 5) == b"three"
        with pytest.raises(DamagedRecordError) as info:
            log2.read(1, positions[1].offset, 3)
        assert info.value.segment == 1 and "checksum" in info.value.reason
        starts = array("q", [0, 3, 6])
        lens = array("q", [3, 3, 5])
        segs = array("q", [1, 1, 1])
        poss = array("q", [p.offset for p in positions])
        with pytest.raises(DamagedRecordError):
            log2.read_run(starts, lens, segs, poss, 0, 0, 11)
        assert log2.read_run(starts, lens, segs, poss, 2, 6, 11) == b"three"
        assert [(d.start, d.reason) for d in log2.damage()[1]] == [
            (positions[1].offset - FRAME_SIZE, "checksum mismatch")
        ]
    finally:
        log2.close()
        assert path.read_bytes() == before


def test_sealed_segments_before_the_snapshot_are_checked_on_first_read(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=SEG_2x30)
    positions = append_all(log, bodies_of(5, size=30))
    snapshot_at = log.end
    log.close()
    assert positions[0].segment == 1 and snapshot_at.segment == 3
    flip_byte(seg_path(tmp_path, 1), positions[0].offset + 7)
    log2, replayed = open_log(tmp_path, snapshot_at, segment_bytes=SEG_2x30)
    try:
        assert replayed == []
        # Not checked at start-up: a loop caller is told to check it elsewhere first.
        with pytest.raises(SegmentUnchecked):
            log2.read(1, positions[0].offset, 30, inline_check=False)
        assert [d.reason for d in log2.check_segment(1)] == ["checksum mismatch"]
        with pytest.raises(DamagedRecordError):
            log2.read(1, positions[0].offset, 30, inline_check=False)
        assert log2.read(positions[2].segment, positions[2].offset, 30) == bodies_of(5, size=30)[2]
    finally:
        log2.close()


def test_a_damaged_length_field_resyncs_at_the_next_batch(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    first = append_all(log, [b"a" * 40, b"b" * 40])  # one batch
    second = append_all(log, [b"c" * 40])  # the next batch, with its own marker
    snapshot_at = log.end
    log.close()
    path = seg_path(tmp_path, 1)
    flip_byte(path, first[0].offset - FRAME_SIZE + 2)  # the first record's length field
    log2, _ = open_log(tmp_path, snapshot_at)
    try:
        for pos in first:
            with pytest.raises(DamagedRecordError):
                log2.read(1, pos.offset, 40)
        assert log2.read(1, second[0].offset, 40) == b"c" * 40
    finally:
        log2.close()


# --------------------------------------------------------------------------- incomplete headers


@pytest.mark.parametrize("kept", [0, 3, HEADER_SIZE - 1])
def test_incomplete_header_in_newest_segment_is_rewritten(tmp_path: Path, kept: int) -> None:
    log, _ = open_log(tmp_path)
    bodies = bodies_of(3)
    positions = append_all(log, bodies)
    log.close()
    # A crash while creating segment 2: only part of its magic reached the disk.
    seg_path(tmp_path, 2).write_bytes(MAGIC[:kept])

    log2, replayed = open_log(tmp_path)
    assert replayed == list(zip(positions, bodies, strict=True))
    assert log2.end == LogPosition(2, HEADER_SIZE)
    assert log2.pending_bytes == HEADER_SIZE  # the magic, queued for rewrite
    new = append_all(log2, [b"after-crash"])
    assert new[0] == LogPosition(2, HEADER_SIZE + MARKER_FRAME_SIZE + FRAME_SIZE)
    assert seg_path(tmp_path, 2).read_bytes() == MAGIC + batch_bytes([b"after-crash"])
    assert log2.read(2, new[0].offset, 11) == b"after-crash"
    log2.close()

    _, replayed3 = open_log(tmp_path)
    assert replayed3 == list(zip(positions + new, bodies + [b"after-crash"], strict=True))


def test_incomplete_header_in_only_segment(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    seg_path(tmp_path, 1).write_bytes(MAGIC[:2])
    log, replayed = open_log(tmp_path)
    assert replayed == []
    pos = append_all(log, [b"first"])
    assert pos == [LogPosition(1, HEADER_SIZE + MARKER_FRAME_SIZE + FRAME_SIZE)]
    log.close()
    assert seg_path(tmp_path, 1).read_bytes() == MAGIC + batch_bytes([b"first"])
    _, replayed2 = open_log(tmp_path)
    assert replayed2 == [(pos[0], b"first")]


def test_incomplete_header_in_sealed_segment_raises(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=SEG_2x30)
    append_all(log, bodies_of(5, size=30))
    log.close()
    seg_path(tmp_path, 1).write_bytes(MAGIC[:4])
    with pytest.raises(CorruptSegmentError, match="sealed segment"):
        open_log(tmp_path, segment_bytes=SEG_2x30)


def test_non_segment_files_are_ignored(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path)
    positions = append_all(log, [b"x"])
    log.close()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / (segment_name(9) + ".tmp")).write_bytes(b"junk")
    log2, replayed = open_log(tmp_path)
    assert replayed == [(positions[0], b"x")]
    assert log2.segment_ids() == [1]
    log2.close()


# --------------------------------------------------------------------------- management


def test_delete_segment_refuses_the_active_one(tmp_path: Path) -> None:
    log, _ = open_log(tmp_path, segment_bytes=SEG_2x30)
    positions = append_all(log, bodies_of(5, size=30))
    active = log.end.segment
    assert active == 3
    with pytest.raises(ValueError, match="active"):
        log.delete_segment(active)
    with pytest.raises(ValueError):
        log.delete_segment(active + 1)
    # Read segment 1 first so its cached descriptor has to be dropped too.
    assert log.read(positions[0].segment, positions[0].offset, 30) == bodies_of(5, size=30)[0]
    log.delete_segment(1)
    log.delete_segment(1)  # idempotent
    assert log.segment_ids() == [2, 3]
    assert not seg_path(tmp_path, 1).exists()
    # The rest is still readable, and recovery from the remaining segments works.
    assert log.read(positions[2].segment, positions[2].offset, 30) == bodies_of(5, size=30)[2]
    log.close()
    _, replayed = open_log(tmp_path, LogPosition(2, HEADER_SIZE), segment_bytes=SEG_2x30)
    assert [p for p, _ in replayed] == positions[2:]
