"""The metadata journal: records in the hot segment log, with group commit.

The journal knows no feature: it frames whatever a ``RecordCodec`` encodes
and replays it into whatever ``Applier`` recovery builds (the engine composes
both: ``tiered.engine.codec`` for its features' records,
``tiered.engine.snapshot`` for the state and its snapshots).

``append`` frames a record into the pending batch and returns at once with a
future for the batch's durability; one background task writes and syncs
batches on a worker thread. Every request that arrives while a sync is in
flight joins the next batch, so N concurrent appends cost one fdatasync.

Durability modes:

* ``always`` (default): a batch's future resolves after fdatasync. A 2xx
  therefore means the bytes survive power loss.
* ``interval``: the future resolves after write() to the OS; fdatasync runs
  every ``fsync_interval_ms``. Survives a process crash, but a power loss can
  lose the last interval of acknowledged appends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from tiered.core.ports import NOT_RECORDED, LatencyRecorder
from tiered.engine.journal.snapshot import SnapshotStore
from tiered.engine.journal.worker import JournalWorker
from tiered.hot.log import LogPosition, SegmentLog, WriteBatch
from tiered.hot.segment import FRAME, FRAME_SIZE, is_marker

log = logging.getLogger(__name__)


#: In ``interval`` mode a batch up to this size is written on the loop; bigger ones
#: (and every batch that must be synced) go to the journal's thread.
INLINE_WRITE_BYTES = 256 * 1024


#: Where a record's payload bytes sit in the log: (segment, position).
Location = tuple[int, int]


class RecordCodec(Protocol):
    """How records become frame bodies and back."""

    def encode(self, record: Any) -> bytes: ...

    def decode(self, body: bytes) -> Any:
        """The record of a body (``msgspec.DecodeError`` / ``ValidationError`` when it is none)."""
        ...

    def payload(self, record: Any) -> bytes | None:
        """The data bytes a record's body ends with, which readers then read in place (None: none)."""
        ...


class Applier(Protocol):
    """The state machine the journal's records move forward."""

    def apply(self, record: Any, location: Location | None = None) -> None: ...


S = TypeVar("S", bound=Applier)


class JournalFailed(Exception):
    """The disk refused a write or sync; the journal accepts nothing more."""


def payload_location(payload: bytes | None, body_pos: LogPosition, body_len: int) -> Location | None:
    """Where a record's payload bytes sit in the log (they end the body)."""
    if payload:
        return body_pos.segment, body_pos.offset + body_len - len(payload)
    return None


def describe_cut(data: bytes, records: RecordCodec) -> str:
    """What a cut tail held, as far as its frames can be read (for the operator's log).

    A torn write usually leaves an incomplete frame; a whole frame whose
    checksum fails may be an acknowledged record with a flipped byte, so its
    stream, offset and length are named when the body still decodes.
    """
    described = []
    pos = 0
    while pos + FRAME_SIZE <= len(data):
        length, _crc = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME_SIZE : pos + FRAME_SIZE + length]
        if length == 0 or len(body) < length:
            described.append(f"an incomplete frame of {len(data) - pos} bytes")
            break
        if not is_marker(body):
            try:
                record = records.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError):
                described.append(f"an undecodable {length}-byte record")
            else:
                fields = [type(record).__name__]
                for name in ("uid", "offset"):
                    if hasattr(record, name):
                        fields.append(f"{name}={getattr(record, name)}")
                payload = records.payload(record)
                if payload:
                    fields.append(f"{len(payload)} data bytes")
                described.append("a whole record with a bad checksum: " + " ".join(fields))
        pos += FRAME_SIZE + length
    return ("; held " + ", ".join(described)) if described else ""


class Journal(Generic[S]):
    def __init__(
        self,
        log_: SegmentLog,
        snapshots: SnapshotStore[S],
        records: RecordCodec,
        *,
        fsync: str = "always",
        fsync_interval_ms: int = 100,
        max_pending_bytes: int = 32 * 1024 * 1024,
        sync_seconds: LatencyRecorder = NOT_RECORDED,
    ) -> None:
        """``sync_seconds`` times each batch's write + fdatasync (``always``), or each periodic sync."""
        if fsync not in ("always", "interval"):
            raise ValueError("fsync must be 'always' or 'interval'")
        self.log = log_
        self.snapshots = snapshots
        self.records = records
        self.fsync_always = fsync == "always"
        self.fsync_interval_ms = fsync_interval_ms
        self.max_pending_bytes = max_pending_bytes
        self.sync_seconds = sync_seconds
        self.failed: BaseException | None = None
        self.read_only = False  # opened for inspection (a dry run): every append is refused
        self.bytes_since_snapshot = 0
        self._worker = JournalWorker("journal")  # writes, syncs, snapshot files, the close: in order
        self._batch_future: asyncio.Future[None] | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._dirty_since_sync = False
        self._closing = False

    # ---------------------------------------------------------------- start

    def recover(self, *, read_only: bool = False, new_state: Callable[[], S] | None = None) -> S:
        """Load the newest snapshot and replay the log after it.

        ``new_state`` builds an empty state with its extensions registered
        (by default, the snapshot codec's). ``read_only`` (a dry run,
        ``verify``): damage is left in place and the journal stays read-only,
        refusing every append.
        """
        if read_only:
            self.read_only = True
        new_state = new_state or self.snapshots.codec.new_state
        loaded = self.snapshots.load_latest(new_state)
        state, start = loaded if loaded is not None else (new_state(), None)
        count = 0
        records = self.records
        for body_pos, body in self.log.open(start, read_only=read_only):
            record = records.decode(body)
            state.apply(record, payload_location(records.payload(record), body_pos, len(body)))
            count += 1
            self.bytes_since_snapshot += len(body)
        for cut in self.log.cut_tails:
            log.warning(
                "recovery %s the tail of segment %d at byte %d: %d bytes (%s)%s",
                "found (read-only, left in place)" if read_only else "cut",
                cut.segment,
                cut.position,
                len(cut.data),
                cut.reason,
                describe_cut(cut.data, records),
            )
        for seg, damage in self.log.damage().items():
            for d in damage:
                log.error(
                    "integrity: segment %d bytes [%d, %d) are damaged (%s); reads of them will fail",
                    seg,
                    d.start,
                    d.end,
                    d.reason,
                )
        log.info("journal recovered: snapshot at %s, %d records replayed", start, count)
        return state

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._batch_future = loop.create_future()
        self._task = asyncio.create_task(self._commit_loop(), name="journal-commit")
        if not self.fsync_always:
            self._sync_task = asyncio.create_task(self._interval_sync_loop(), name="journal-fsync")
        # Anything recovery rewrote (a lost segment header) goes out first.
        if self.log.pending_bytes:
            self._wakeup.set()

    # --------------------------------------------------------------- append

    def append(
        self, record: Any, on_durable: Callable[[], None] | None = None
    ) -> tuple[asyncio.Future[None], Location | None]:
        """Queue a record; returns (durability future, payload location).

        ``on_durable`` runs on the loop, in log order, once the record is
        durable: the place to make data visible to readers.
        """
        if self.failed is not None:
            raise JournalFailed(str(self.failed))
        if self.read_only:
            raise JournalFailed("the journal was opened read-only")
        body = self.records.encode(record)
        pos = self.log.append(body)
        self.bytes_since_snapshot += len(body)
        if on_durable is not None:
            self._callbacks.append(on_durable)
        self._wakeup.set()
        assert self._batch_future is not None
        return self._batch_future, payload_location(self.records.payload(record), pos, len(body))

    @property
    def backlogged(self) -> bool:
        """Too much queued for one batch: new work should wait for a flush."""
        return self.log.pending_bytes >= self.max_pending_bytes

    async def flushed(self) -> None:
        """Wait until everything appended so far is durable."""
        if self.log.pending_bytes and self._batch_future is not None:
            self._wakeup.set()
            await asyncio.shield(self._batch_future)
        elif self._inflight is not None and not self._inflight.done():
            await asyncio.shield(self._inflight)

    async def _commit_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch = self.log.take_batch()
            if batch is None:
                if self._closing:
                    return
                continue
            future, callbacks = self._batch_future, self._callbacks
            assert future is not None
            self._batch_future = loop.create_future()
            self._callbacks = []
            self._inflight = future
            try:
                if not self.fsync_always and batch.nbytes <= INLINE_WRITE_BYTES:
                    self._write(batch)  # write() only, no sync: cheaper here than a thread round trip
                else:
                    await self._worker.run(self._write, batch)
            except Exception as exc:  # disk full, EIO: the state on disk is now unknown
                log.critical("journal write failed, refusing further writes until restart: %s", exc)
                self.failed = exc
                future.set_exception(JournalFailed(str(exc)))
                future.exception()  # mark retrieved; requests see JournalFailed
                self._batch_future.set_exception(JournalFailed(str(exc)))
                self._batch_future.exception()
                return
            for cb in callbacks:
                cb()
            future.set_result(None)

    def _write(self, batch: WriteBatch) -> None:
        if self.fsync_always:
            with self.sync_seconds.time():
                self.log.write_batch(batch, sync=True)
        else:
            self.log.write_batch(batch, sync=False)
            self._dirty_since_sync = True

    def _timed_sync(self) -> None:
        with self.sync_seconds.time():
            self.log.sync()

    async def _interval_sync_loop(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.fsync_interval_ms / 1000)
            if self._dirty_since_sync:
                self._dirty_since_sync = False
                try:
                    await self._worker.run(self._timed_sync)
                except Exception as exc:
                    log.critical("journal fsync failed: %s", exc)
                    self.failed = exc
                    return

    # ------------------------------------------------------------ snapshots

    async def snapshot(self, state: S) -> None:
        """Write a snapshot of ``state`` once the log under it is durable."""
        position = self.log.end
        data = self.snapshots.codec.encode(state, position)  # on the loop: a consistent cut
        self.bytes_since_snapshot = 0
        await self.flushed()
        await self._worker.run(self._sync_and_write_snapshot, data, position)

    def _sync_and_write_snapshot(self, data: bytes, position: LogPosition) -> None:
        self.log.sync()
        self.snapshots.write(data, position)

    # ---------------------------------------------------------------- close

    async def close(self, state: S | None = None) -> None:
        if self.failed is None:
            await self.flushed()
            if state is not None:
                await self.snapshot(state)
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._sync_task is not None:
            self._sync_task.cancel()
        await self._worker.run(self.log.close)
        self._worker.shutdown()
