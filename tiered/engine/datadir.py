"""The data dir's lock: one process owns a data dir at a time (a shared lock for read-only commands)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DataDirLocked(Exception):
    pass


class DataDirLock:
    """An exclusive lock on the data dir: one process owns it at a time."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "LOCK"
        self._fd: int | None = None

    def acquire(self, *, shared: bool = False) -> None:
        """Take the lock; ``shared`` (read-only commands) writes nothing and only keeps writers out."""
        if shared:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return  # no server ever ran here (it creates the file): nothing to exclude
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(f"{self.path.parent} is in use by another tiered process") from None
        if not shared:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
