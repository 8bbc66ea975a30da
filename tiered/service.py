"""The stream service: the state machine wired to the journal, reads and waiters.

This is the imperative shell around ``StreamState``. Each write is: decide
(pure) -> journal append -> apply -> wait for durability -> respond. Decide,
append and apply run without an ``await`` in between, so the event loop makes
them atomic; only the wait for the disk yields.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tiered.hot.log import SegmentLog

from .config import Config
from .journal import Journal, JournalFailed
from .live import Visibility, VisibleView, Waiters
from .records import Appended, Record, StreamCreated, StreamDeleted, StreamExpired
from .snapshot import SnapshotStore
from .state import AppendRequest, CreateRequest, Duplicate, Stream, StreamError, StreamState

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class AppendResult:
    stream: Stream
    tail: int
    closed: bool
    duplicate: bool
    epoch: int | None
    seq: int | None


class StreamService:
    def __init__(self, config: Config) -> None:
        self.config = config
        data = config.data_path
        self.journal = Journal(
            SegmentLog(data / "hot", segment_bytes=config.segment_bytes),
            SnapshotStore(data / "snapshots"),
            fsync=config.fsync,
            fsync_interval_ms=config.fsync_interval_ms,
        )
        self.state = StreamState()
        self.visibility = Visibility()
        self.waiters = Waiters(config.max_waiters)
        self._tasks: list[asyncio.Task[None]] = []
        self._snapshotting = False

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.state = await loop.run_in_executor(None, self.journal.recover)
        self.journal.start()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.waiters.notify_all()
        await self.journal.close(self.state)

    # ---------------------------------------------------------------- writes

    def _check_writable(self) -> None:
        if self.journal.failed is not None:
            raise StreamError(503, "the journal cannot write to disk; restart the server", {"Retry-After": "5"})

    async def _admit(self) -> None:
        self._check_writable()
        while self.journal.backlogged:
            await self.journal.flushed()
            self._check_writable()

    def _commit(self, records: list[Record]) -> asyncio.Future[None] | None:
        """Journal and apply records; returns the durability future of the last."""
        future = None
        for record in records:
            s = self.state.streams.get(getattr(record, "uid", -1))
            before = self.visibility.view(s) if s is not None else None
            try:
                future, location = self.journal.append(record, self._on_durable(record))
            except JournalFailed as exc:
                raise StreamError(503, str(exc), {"Retry-After": "5"}) from None
            if isinstance(record, StreamCreated):
                self.state.apply(record, location)
                created = self.state.streams[record.uid]
                self.visibility.hold(created, record.fork_offset, False)
            elif isinstance(record, Appended):
                assert s is not None and before is not None
                self.visibility.hold(s, before.tail, before.closed)
                self.state.apply(record, location)
            else:
                self.state.apply(record, location)
                if isinstance(record, (StreamDeleted, StreamExpired)):
                    self.visibility.forget(record.uid)
                    self.waiters.notify(record.uid)
        self._maybe_snapshot()
        return future

    def _on_durable(self, record: Record):  # type: ignore[no-untyped-def]
        if isinstance(record, Appended):
            end = record.offset + len(record.data)
            uid, close = record.uid, record.close
        elif isinstance(record, StreamCreated):
            end = record.fork_offset + len(record.data)
            uid, close = record.uid, record.closed
        else:
            return None

        def release() -> None:
            s = self.state.streams.get(uid)
            if s is not None and self.visibility.release(s, end, close):
                self.waiters.notify(uid)

        return release

    def _maybe_snapshot(self) -> None:
        if self.journal.bytes_since_snapshot >= self.config.snapshot_every_bytes and not self._snapshotting:
            self._snapshotting = True
            task = asyncio.create_task(self._snapshot())
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)

    async def _snapshot(self) -> None:
        try:
            await self.journal.snapshot(self.state)
        except Exception:
            log.exception("snapshot failed; will retry after more writes")
        finally:
            self._snapshotting = False

    async def _durable(self, future: asyncio.Future[None] | None) -> None:
        if future is None:
            return
        try:
            await asyncio.shield(future)
        except JournalFailed as exc:
            raise StreamError(503, f"write not durable: {exc}", {"Retry-After": "5"}) from None

    async def create_bucket(self, name: str) -> bool:
        await self._admit()
        records = self.state.decide_bucket(name, now_ms())
        await self._durable(self._commit(records))
        return bool(records)

    async def create(self, bucket: str, path: str, req: CreateRequest) -> tuple[bool, Stream]:
        """Create a stream (or match an existing one). Returns (created, stream)."""
        await self._admit()
        records, existing = self.state.decide_create(bucket, path, req, now_ms())
        if existing is not None:
            await self.journal.flushed()  # the matching create may still be in flight
            return False, existing
        future = self._commit(records)
        created = records[-1]
        assert isinstance(created, StreamCreated)
        await self._durable(future)
        return True, self.state.streams[created.uid]

    async def append(self, bucket: str, path: str, req: AppendRequest) -> AppendResult:
        await self._admit()
        decided = self.state.decide_append(bucket, path, req, now_ms())
        if isinstance(decided, Duplicate):
            # The original may still be on its way to disk: answer once it is.
            await self.journal.flushed()
            s = decided.stream
            return AppendResult(s, s.tail, s.closed, True, decided.epoch, decided.seq)
        future = self._commit([decided])
        s = self.state.streams[decided.uid]
        tail, closed = s.tail, s.closed
        await self._durable(future)
        return AppendResult(s, tail, closed, False, decided.epoch, decided.seq)

    async def delete(self, bucket: str, path: str) -> None:
        await self._admit()
        record = self.state.decide_delete(bucket, path, now_ms())
        await self._durable(self._commit([record]))

    def touch(self, s: Stream) -> None:
        record = self.state.touch(s, now_ms())
        if record is not None and self.journal.failed is None:
            self._commit([record])

    # ----------------------------------------------------------------- reads

    def lookup(self, bucket: str, path: str) -> Stream:
        return self.state.lookup(bucket, path, now_ms())

    def view(self, s: Stream) -> VisibleView:
        return self.visibility.view(s)

    def read(self, s: Stream, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stream; callers stay within the visible tail."""
        slices = self.state.plan_read(s, start, end)
        read = self.journal.log.read
        if len(slices) == 1:
            sl = slices[0]
            return read(sl.segment, sl.position, sl.length)
        return b"".join([read(sl.segment, sl.position, sl.length) for sl in slices])

    async def wait_for_change(self, s: Stream, offset: int, timeout: float) -> bool:
        """Park until the stream's visible tail passes ``offset`` or it closes."""
        v = self.view(s)
        if v.tail > offset or v.closed:
            return True
        return await self.waiters.wait(s.uid, timeout)
