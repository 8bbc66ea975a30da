"""Segment file format: framed, checksummed records in an append-only file.

A segment starts with an 8-byte magic. Each record is framed as::

    u32 body_length | u32 crc32c(body) | body

little-endian; bodies are never empty. Every write batch (one group commit)
starts with a *batch marker* record, body ``0xC1 | u64 batch_bytes`` (0xC1 is
never the first byte of a msgpack record), so recovery knows where the last
write began and how long it was meant to be.

A record whose frame is incomplete or whose checksum does not match is *torn*.
Torn bytes inside the last batch, with nothing written after that batch, are
the unacknowledged remains of a write a crash interrupted: they may be cut
off. Anything else that fails to verify is corruption of acknowledged history
and must stop recovery rather than silently shorten the log.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import google_crc32c

MAGIC = b"TSEG\x00\x00\x00\x01"
FRAME = struct.Struct("<II")
FRAME_SIZE = FRAME.size
HEADER_SIZE = len(MAGIC)
# Bodies are bounded so a garbage length field cannot make recovery allocate
# gigabytes; the service's request limits are well below this.
MAX_BODY = 256 * 1024 * 1024


class CorruptSegmentError(Exception):
    """Acknowledged history failed to verify; the operator must intervene."""


class DamagedRecordError(Exception):
    """Acknowledged bytes failed their checksum when read: they are never served or copied.

    Raised by reads of records inside a damaged frame; the rest of the log stays
    readable. Damage inside history that replay needs is a ``CorruptSegmentError``
    instead (the state cannot be rebuilt without it).
    """

    def __init__(self, segment: int, position: int, reason: str) -> None:
        super().__init__(f"segment {segment_name(segment)} at byte {position}: {reason}")
        self.segment = segment
        self.position = position
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes ``[start, end)`` of a segment that hold no verifiable frame."""

    start: int
    end: int
    reason: str


def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data))


def frame(body: bytes) -> bytes:
    """Return the on-disk bytes of one record."""
    return FRAME.pack(len(body), crc32c(body)) + body


MARKER_TAG = 0xC1
MARKER = struct.Struct("<BQ")
MARKER_FRAME_SIZE = FRAME_SIZE + MARKER.size


def marker_frame(batch_bytes: int) -> bytes:
    """The batch marker that opens a write of ``batch_bytes`` (marker included)."""
    return frame(MARKER.pack(MARKER_TAG, batch_bytes))


def is_marker(body: bytes) -> bool:
    return len(body) == MARKER.size and body[0] == MARKER_TAG


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A verified record: where its body starts in the file, and the body."""

    body_pos: int
    body: bytes


@dataclass(slots=True)
class ScanResult:
    records: list[ScannedRecord]  # data records (batch markers are not included)
    valid_end: int  # file position just past the last verified record
    file_size: int
    torn_reason: str | None  # why scanning stopped early, if it did
    batch_start: int | None = None  # where the last verified batch marker begins
    batch_end: int | None = None  # where that batch was meant to end
    damage: list[Damage] = field(default_factory=list)  # damaged frames before ``start`` (tolerated)

    def torn_within_last_batch(self) -> bool:
        """Is everything after ``valid_end`` part of the last write, with nothing after it?"""
        if self.batch_start is None or self.batch_end is None:
            return False
        return self.batch_start <= self.valid_end <= self.batch_end and self.file_size <= self.batch_end


def segment_name(segment_id: int) -> str:
    return f"{segment_id:020d}.seg"


def parse_segment_name(name: str) -> int | None:
    if not name.endswith(".seg"):
        return None
    stem = name[: -len(".seg")]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def scan_segment(path: str, start: int = HEADER_SIZE) -> ScanResult:
    """Read and verify every record from ``start`` to the end of the file.

    Stops at the first record that does not verify and reports why; the
    caller decides whether that is a torn tail or corruption. Frames before
    ``start`` (history a snapshot already covers) are checked too, but damage
    there is only reported in ``damage``: reads of those records fail, the
    log still opens. If the file ends before ``start``, ``valid_end`` says
    where it stopped.
    """
    with open(path, "rb") as f:
        data = f.read()
    size = len(data)
    if size < HEADER_SIZE or data[:HEADER_SIZE] != MAGIC:
        if size < HEADER_SIZE and MAGIC.startswith(data):
            # A segment whose header write itself was interrupted.
            return ScanResult([], 0, size, "incomplete segment header")
        raise CorruptSegmentError(f"{path}: not a tiered segment (bad magic)")
    start = max(start, HEADER_SIZE)
    damage: list[Damage] = []
    if start > HEADER_SIZE:
        if size < start:
            reached, _ = check_frames(data, HEADER_SIZE, size)
            return ScanResult(
                [], min(reached, size), size, f"the segment ends at {size}, before byte {start}"
            )
        _, damage = check_frames(data, HEADER_SIZE, start)
    records: list[ScannedRecord] = []
    batch_start: int | None = None
    batch_end: int | None = None
    pos = start
    view = memoryview(data)
    torn: str | None = None
    while pos < size:
        if size - pos < FRAME_SIZE:
            torn = f"incomplete frame header at {pos}"
            break
        length, crc = FRAME.unpack_from(data, pos)
        body_pos = pos + FRAME_SIZE
        if length == 0:
            torn = f"empty record at {pos}"
            break
        if length > MAX_BODY:
            torn = f"implausible record length {length} at {pos}"
            break
        if body_pos + length > size:
            torn = f"record at {pos} runs past end of file"
            break
        body = bytes(view[body_pos : body_pos + length])
        if google_crc32c.value(body) != crc:
            torn = f"checksum mismatch in record at {pos}"
            break
        if is_marker(body):
            batch_start = pos
            batch_end = pos + MARKER.unpack(body)[1]
        else:
            records.append(ScannedRecord(body_pos, body))
        pos = body_pos + length
    return ScanResult(records, pos, size, torn, batch_start, batch_end, damage)


def _frame_ok(data: bytes | mmap.mmap, pos: int, stop: int) -> bool:
    """Does a whole frame that verifies start at ``pos`` (and end by ``stop``)?"""
    if stop - pos < FRAME_SIZE:
        return False
    length, crc = FRAME.unpack_from(data, pos)
    end = pos + FRAME_SIZE + length
    return bool(0 < length <= MAX_BODY and end <= stop and crc32c(data[pos + FRAME_SIZE : end]) == crc)


def _next_marker(data: bytes | mmap.mmap, after: int, stop: int) -> int | None:
    """Position of the next verifiable batch marker in ``[after, stop)``: a frame boundary to resync at."""
    needle = FRAME.pack(MARKER.size, 0)[:4]  # the length field of a marker frame
    pos = data.find(needle, after, stop)
    while pos >= 0:
        if (
            pos + MARKER_FRAME_SIZE <= stop
            and data[pos + FRAME_SIZE] == MARKER_TAG
            and _frame_ok(data, pos, stop)
        ):
            return pos
        pos = data.find(needle, pos + 1, stop)
    return None


def check_frames(data: bytes | mmap.mmap, start: int, stop: int) -> tuple[int, list[Damage]]:
    """Verify every frame in ``data[start:stop)`` (``start`` is a frame boundary).

    Returns where checking ended (``stop``) and the damaged stretches. A frame
    whose checksum fails is damage; when its length field cannot be trusted
    (implausible, or no verifiable frame follows it), checking resumes at the
    next verifiable batch marker, since every write batch starts with one.
    """
    damage: list[Damage] = []
    pos = start
    while pos < stop:
        if stop - pos < FRAME_SIZE:
            damage.append(Damage(pos, stop, "incomplete frame"))
            break
        length, crc = FRAME.unpack_from(data, pos)
        end = pos + FRAME_SIZE + length
        if 0 < length <= MAX_BODY and end <= stop:
            if google_crc32c.value(data[pos + FRAME_SIZE : end]) == crc:
                pos = end
                continue
            if end == stop or _frame_ok(data, end, stop):
                damage.append(Damage(pos, end, "checksum mismatch"))
                pos = end
                continue
        resume = _next_marker(data, pos + 1, stop)
        damage.append(Damage(pos, stop if resume is None else resume, "unreadable frame"))
        if resume is None:
            break
        pos = resume
    return stop, damage


def later_batch_marker(path: str, after: int) -> int | None:
    """Position of a verifiable batch marker past ``after``, if any.

    A torn tail is the end of the log: finding a whole later batch means the
    unverifiable bytes sit in acknowledged history instead.
    """
    with open(path, "rb") as f:
        data = f.read()
    return _next_marker(data, after, len(data))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
