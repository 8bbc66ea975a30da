"""Deleting hot segments nobody needs: no stream reads from them and replay starts after them.

Replay starts at the newest snapshot, so a segment before it that no stream
references can go. When unreferenced segments are still pinned by the
snapshot position, a fresh snapshot moves the floor on (at most every
``snapshot_every_s``; never in an offline command, which writes nothing but
its own records).
"""

from __future__ import annotations

import logging
from typing import Generic, Protocol, TypeVar

from tiered.core.clock import Clock
from tiered.engine.journal.journal import Applier, Journal

log = logging.getLogger(__name__)


class SegmentUser(Applier, Protocol):
    """A state whose data lives in hot segments (the engine's ``StreamState``)."""

    def referenced_segments(self) -> set[int]:
        """The hot segments some live data still reads from."""
        ...


U = TypeVar("U", bound=SegmentUser)


class SegmentReaper(Generic[U]):
    def __init__(
        self,
        journal: Journal[U],
        state: U,
        clock: Clock,
        *,
        offline: bool = False,
        snapshot_every_s: float = 10.0,
    ) -> None:
        self.journal = journal
        self.state = state
        self.clock = clock
        self.offline = offline
        self.snapshot_every_s = snapshot_every_s
        self.deleted_last = 0
        self._last_snapshot = float("-inf")

    async def delete_unreferenced(self) -> int:
        log_ = self.journal.log
        active = log_.end.segment
        referenced = self.state.referenced_segments()
        unreferenced = [sid for sid in log_.segment_ids() if sid < active and sid not in referenced]
        floor = self.journal.snapshots.floor_position()
        deleted = 0
        for sid in unreferenced:
            if floor is not None and sid < floor.segment:
                log_.delete_segment(sid)
                deleted += 1
        self.deleted_last = deleted
        now = self.clock.monotonic()
        if (
            deleted < len(unreferenced)
            and not self.offline
            and now - self._last_snapshot > self.snapshot_every_s
        ):
            # Replay still starts before them: a fresh snapshot moves the floor on.
            self._last_snapshot = now
            await self.journal.snapshot(self.state)
        return deleted
