"""Snapshot files: the newest one that verifies wins, so restarts replay only the journal's tail.

A snapshot file holds a whole state plus the log position it covers: every
record before that position is reflected in it. Its body is the state codec's
(``SnapshotCodec``: ``tiered.engine.snapshot`` for the engine), framed here
with a magic, the body's format version and a CRC. Files are written to a
temporary name, fsynced, renamed and read back, so a crash mid-write leaves
the previous snapshot in charge.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import msgspec

from tiered.hot.log import LogPosition
from tiered.hot.segment import crc32c, fsync_dir

log = logging.getLogger(__name__)

MAGIC = b"TSNP"
HEADER = struct.Struct("<4sII")  # magic, version, crc32c(body)

S = TypeVar("S")


class SnapshotCodec(Protocol[S]):
    """A state's snapshot form: whole snapshot files (``frame``d) and the empty state recovery starts from."""

    def new_state(self) -> S: ...

    def encode(self, state: S, position: LogPosition) -> bytes: ...

    def decode(self, data: bytes, new_state: Callable[[], S] | None = None) -> tuple[S, LogPosition]:
        """The state and position of a snapshot file (``ValueError`` for one it cannot trust or read)."""
        ...


def frame(version: int, body: bytes) -> bytes:
    return HEADER.pack(MAGIC, version, crc32c(body)) + body


def unframe(data: bytes, readable: Iterable[int]) -> tuple[int, bytes]:
    """(version, body) of a snapshot file whose magic, version and checksum check out."""
    readable = tuple(readable)
    magic, version, crc = HEADER.unpack_from(data)
    body = data[HEADER.size :]
    if magic != MAGIC or version not in readable:
        raise ValueError(f"not a snapshot of a version this server reads ({readable})")
    if crc32c(body) != crc:
        raise ValueError("snapshot checksum mismatch")
    return version, body


class SnapshotError(Exception):
    """Snapshots exist but none can be trusted: recovery must stop."""


class SnapshotStore(Generic[S]):
    """The snapshot files in a directory: newest valid one wins."""

    def __init__(self, directory: str | Path, codec: SnapshotCodec[S], keep: int = 2) -> None:
        self.directory = Path(directory)
        self.codec = codec
        self.keep = keep

    def _files(self) -> list[Path]:
        if not self.directory.exists():
            return []
        return sorted(
            p for p in self.directory.iterdir() if p.name.startswith("snapshot-") and p.suffix == ".bin"
        )

    def load_latest(self, new_state: Callable[[], S] | None = None) -> tuple[S, LogPosition] | None:
        """The newest snapshot that verifies; an older one is the fallback.

        Segments are only deleted behind the oldest kept snapshot, so falling
        back never skips records. No snapshot verifying at all is fatal.
        """
        files = self._files()
        errors = []
        for path in reversed(files):
            try:
                return self.codec.decode(path.read_bytes(), new_state)
            except (ValueError, msgspec.DecodeError, struct.error) as exc:
                log.warning("snapshot %s is unusable: %s", path.name, exc)
                errors.append(f"{path.name}: {exc}")
        if files:
            raise SnapshotError("no snapshot verifies: " + "; ".join(errors))
        return None

    def floor_position(self) -> LogPosition | None:
        """Where replay starts: the newest snapshot's position (segments before it are free).

        Every snapshot is read back and verified right after it is written, so
        the newest is trusted; the older one kept beside it is a fallback only
        while the segments it needs still exist.
        """
        files = self._files()
        if not files:
            return None
        _, seg, off = files[-1].stem.split("-")
        return LogPosition(int(seg), int(off))

    def write(self, data: bytes, position: LogPosition) -> Path:
        """Durably write a snapshot (blocking; run in a worker thread)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"snapshot-{position.segment:020d}-{position.offset:012d}.bin"
        final = self.directory / name
        tmp = self.directory / (name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(str(self.directory))
        self.codec.decode(final.read_bytes())  # verify what landed before anyone relies on it
        for old in self._files()[: -self.keep]:
            old.unlink(missing_ok=True)
        return final
