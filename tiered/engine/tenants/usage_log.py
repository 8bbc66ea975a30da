"""The usage log for billing export: JSON Lines, rotated by size or by age.

One line per bucket per usage interval, written only after the counters it
shows are durable in the journal::

    {"ts_ms": 1800000010000, "from_ms": 1800000000000, "bucket": "acme",
     "appended_bytes": 123, "appended_records": 4,
     "egress_bytes": {"hot": 100, "cold": 0},
     "requests": {"append": 4, "read": 2, "live": 0, "admin": 1},
     "retained_bytes": {"hot": 123, "cold": 0, "producers": 0, "snapshots": 0, "key_index": 0}, "streams": 1}

Counters are totals since the bucket was created (monotonic, and the same
after a restart): a bill for a period is the difference between two lines.
When the file reaches ``max_bytes`` or is ``rotate_s`` old it is renamed to
``<name>.<UTC time>`` and a new one begins; rotated files are never deleted
here (they are billing records: ship them, then remove them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec


class UsageLog:
    def __init__(self, path: Path, *, max_bytes: int, rotate_s: float) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.rotate_s = rotate_s
        self._opened_ms: int | None = None
        self.rotations = 0

    def _rotate_if_due(self, now_ms: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self._opened_ms = now_ms
            return
        if self._opened_ms is None:
            self._opened_ms = now_ms  # a file from before a restart: its age counts from now
        if size < self.max_bytes and now_ms - self._opened_ms < self.rotate_s * 1000:
            return
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ms / 1000))
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.{stamp}-{n}")
            n += 1
        os.replace(self.path, target)
        self._opened_ms = now_ms
        self.rotations += 1

    def write(self, lines: Iterable[dict[str, Any]], now_ms: int) -> None:
        """Append lines durably (blocking: run it in a worker thread)."""
        body = b"".join(msgspec.json.encode(line) + b"\n" for line in lines)
        if not body:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rotate_if_due(now_ms)
        with open(self.path, "ab") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
