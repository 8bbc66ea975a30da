"""What readers may see, and who is waiting to see more.

The state machine applies a record the moment it is decided, but readers must
only see data that is durable: otherwise a crash could take back bytes that a
reader already handed on. ``Visibility`` remembers, per stream with records in
flight, the tail and closed flag as of its last durable record; ``Waiters``
parks long-poll and SSE readers until that visible view moves.
``VisibilityObserver`` keeps both in step with every commit (see
``tiered.engine.journal.committer``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.streams.model import Stream
from tiered.engine.streams.records import Appended, BucketErased, StreamCreated, StreamDeleted, StreamExpired
from tiered.engine.streams.state import StreamState


@dataclass(slots=True)
class VisibleView:
    tail: int
    closed: bool


class Visibility:
    def __init__(self) -> None:
        self._pending: dict[int, VisibleView] = {}

    def view(self, s: Stream) -> VisibleView:
        v = self._pending.get(s.uid)
        return v if v is not None else VisibleView(s.tail, s.closed)

    def hold(self, s: Stream, tail: int, closed: bool) -> None:
        """Freeze what readers see before applying a record that is not yet durable."""
        if s.uid not in self._pending:
            self._pending[s.uid] = VisibleView(tail, closed)

    def release(self, s: Stream, tail: int, closed: bool) -> bool:
        """A record is durable: readers may now see up to ``tail``. True if the view moved."""
        v = self._pending.get(s.uid)
        if v is None:
            return False
        if tail >= s.tail and closed == s.closed:
            del self._pending[s.uid]
        else:
            v.tail = max(v.tail, tail)
            v.closed = v.closed or closed
        return True

    def forget(self, uid: int) -> None:
        self._pending.pop(uid, None)


class Waiters:
    """Futures of readers parked on a stream, woken on any visible change."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._by_uid: dict[int, list[asyncio.Future[None]]] = {}

    async def wait(self, uid: int, timeout: float) -> bool:
        """Wait for a change on ``uid``; False on timeout."""
        if self.count >= self.limit:
            raise TieredError(
                ErrorCode.TOO_MANY_READERS, "too many live readers; retry shortly", retry_after_s=1
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._by_uid.setdefault(uid, []).append(fut)
        self.count += 1
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
                await fut
            return True
        except TimeoutError:
            return False
        finally:
            self.count -= 1
            futs = self._by_uid.get(uid)
            if futs is not None:
                try:
                    futs.remove(fut)
                except ValueError:
                    pass
                if not futs:
                    del self._by_uid[uid]

    def notify(self, uid: int) -> None:
        futs = self._by_uid.pop(uid, None)
        if futs:
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)

    def notify_all(self) -> None:
        for uid in list(self._by_uid):
            self.notify(uid)


class VisibilityObserver:
    """Holds back what readers see until a record is durable; wakes readers when it is."""

    def __init__(self, state: StreamState, visibility: Visibility, waiters: Waiters) -> None:
        self.state = state
        self.visibility = visibility
        self.waiters = waiters

    def before_apply(self, record: Any) -> object:
        if isinstance(record, Appended):
            s = self.state.streams.get(record.uid)
            return self.visibility.view(s) if s is not None else None
        return None

    def after_apply(self, record: Any, token: object) -> Sequence[Any]:
        if isinstance(record, Appended):
            s = self.state.streams[record.uid]
            assert isinstance(token, VisibleView)
            self.visibility.hold(s, token.tail, token.closed)
        elif isinstance(record, StreamCreated):
            self.visibility.hold(self.state.streams[record.uid], record.fork_offset, False)
        elif isinstance(record, (StreamDeleted, StreamExpired)):
            self.visibility.forget(record.uid)
            self.waiters.notify(record.uid)
        elif isinstance(record, BucketErased):
            self.waiters.notify_all()  # its streams' live readers get their 404 now
        return ()

    def on_durable(self, record: Any) -> Callable[[], None] | None:
        if isinstance(record, Appended):
            end, uid, close = record.offset + record.length, record.uid, record.close
        elif isinstance(record, StreamCreated):
            end, uid, close = record.fork_offset + len(record.data), record.uid, record.closed
        else:
            return None

        def release() -> None:
            s = self.state.streams.get(uid)
            if s is not None and self.visibility.release(s, end, close):
                self.waiters.notify(uid)

        return release
