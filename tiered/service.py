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
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiered.cold.backends import open_object_store
from tiered.cold.chunk_index import ColdDataDamaged
from tiered.cold.claim import PrefixClaim, load_identity
from tiered.cold.flusher import ColdFlusher
from tiered.cold.health import StoreHealth
from tiered.cold.reader import ColdReader
from tiered.cold.store import ObjectNotFound, ObjectStore, ObjectStoreError
from tiered.gc.runner import GcRunner
from tiered.hot.log import SegmentLog, SegmentUnchecked
from tiered.hot.segment import DamagedRecordError

from .config import Config
from .journal import Journal, JournalFailed
from .live import Visibility, VisibleView, Waiters
from .records import Appended, BucketErased, Record, StreamCreated, StreamDeleted, StreamExpired
from .snapshot import SnapshotStore
from .state import (
    AppendRequest,
    ColdSlice,
    CreateRequest,
    Duplicate,
    StateExtension,
    Stream,
    StreamError,
    StreamState,
)
from .subscriptions import SubscriptionState
from .webhooks import SubscriptionDelivery

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


DATA_DAMAGED = "DATA_DAMAGED"


def integrity_error(message: str) -> StreamError:
    """Stored bytes failed their checksum: a 502 that says so (an outage is a 503 with Retry-After)."""
    return StreamError(502, message, code=DATA_DAMAGED)


def extension_factories() -> list[Callable[[], StateExtension]]:
    """Factories of the state machines that share the journal with streams."""
    from .groups import GroupsState

    return [GroupsState, SubscriptionState]


async def open_store(config: Config, *, read_only: bool = False) -> ObjectStore:
    """The object store the configuration names (the cold tier's home)."""
    return await open_object_store(
        config.cold_store,
        read_only=read_only,
        local_root=config.data_path / "cold",
        s3_bucket=config.s3_bucket,
        s3_prefix=config.s3_prefix,
        s3_endpoint=config.s3_endpoint,
        s3_region=config.s3_region,
        s3_path_style=config.s3_path_style,
    )


def new_state() -> StreamState:
    """An empty state with every extension state machine registered."""
    return StreamState([factory() for factory in extension_factories()])


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
        self.state = new_state()
        self.visibility = Visibility()
        self.waiters = Waiters(config.max_waiters)
        self._tasks: list[asyncio.Task[None]] = []
        self._snapshotting = False
        self.store: ObjectStore | None = None
        self.cold_reader: ColdReader | None = None
        self.flusher: ColdFlusher | None = None
        self._flusher_task: asyncio.Task[None] | None = None
        self._last_segment_snapshot = 0.0
        self.closing = False  # set at shutdown: live readers finish at once
        self.segments_deleted_last = 0
        self.gc: GcRunner | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self.deliveries: SubscriptionDelivery | None = None  # subscription wakes (tiered.webhooks)
        self.integrity_errors = {"hot": 0, "cold": 0}  # reads and copies refused for damage
        self.store_health = StoreHealth()
        self.claim: PrefixClaim | None = None  # this data dir's claim on the object-store prefix
        self._probe_task: asyncio.Task[None] | None = None
        self.recovered = False
        self.offline = False  # an offline command: nothing but its own records is written

    # ------------------------------------------------------------- lifecycle

    async def start(self, *, run_flusher: bool = True) -> None:
        """Everything ``tiered serve`` runs: recovery, the prefix claim, background jobs, deliveries."""
        await self._recover(read_only=False)
        self.journal.start()
        c = self.config
        self.store = await open_store(c)
        identity = load_identity(c.data_path, create=True)
        assert identity is not None
        self.claim = PrefixClaim(self.store, identity, str(c.data_path.resolve()))
        await self.claim.acquire(take_over=c.take_over_prefix)
        self._compose_cold()
        self.recovered = True
        if run_flusher:
            assert self.flusher is not None and self.gc is not None
            self._flusher_task = asyncio.create_task(self.flusher.run(), name="cold-flusher")
            self._gc_task = asyncio.create_task(self.gc.run_forever(), name="gc")
            probe_timeout = min(c.store_probe_interval_s, c.cold_read_timeout_s)
            self._probe_task = asyncio.create_task(
                self.store_health.probe_forever(self.store, c.store_probe_interval_s, probe_timeout), name="store-probe"
            )
        # Subscriptions: fence wakes outstanding before a restart, then deliver in the background.
        self.deliveries = SubscriptionDelivery(self)
        await self.deliveries.start()

    async def open_offline(self, *, dry_run: bool) -> None:
        """What an offline GC pass needs, and nothing else.

        A dry run opens the data dir and the store read-only (no journal writer,
        no claim written, no deliveries, no snapshot at close). A real pass starts
        the journal for GC records only; it checks the prefix claim but never
        writes it, so an orphan is deleted only under a prefix this data dir owns.
        """
        self.offline = True
        await self._recover(read_only=dry_run)
        if not dry_run:
            self.journal.start()
        c = self.config
        self.store = await open_store(c, read_only=dry_run)
        identity = load_identity(c.data_path, create=False)
        if identity is not None:
            self.claim = PrefixClaim(self.store, identity, str(c.data_path.resolve()))
            owner = await self.claim.current()
            self.claim.held = owner is not None and owner.identity == identity
        self._compose_cold()
        self.recovered = True

    async def close_offline(self, *, dry_run: bool) -> None:
        if dry_run:
            self.journal.log.close()
        else:
            await self.journal.close(None)  # no snapshot: an offline pass writes GC records only
        if self.store is not None:
            await self.store.close()

    async def _recover(self, *, read_only: bool) -> None:
        loop = asyncio.get_running_loop()
        self.state = await loop.run_in_executor(
            None, lambda: self.journal.recover(read_only=read_only, new_state=new_state)
        )

    def _compose_cold(self) -> None:
        c = self.config
        assert self.store is not None
        self.cold_reader = ColdReader(self.store, c.read_cache_bytes)
        self.flusher = ColdFlusher(
            self,
            self.store,
            interval_s=c.flush_interval_s,
            flush_bytes=c.flush_bytes,
            target_object_bytes=c.cold_object_bytes,
            hot_retention_s=c.hot_retention_s,
        )
        self.gc = GcRunner(
            self,
            grace_s=c.gc_grace_s,
            max_objects=c.gc_max_objects_per_pass,
            interval_s=c.gc_interval_s,
            reconcile_interval_s=c.reconcile_interval_s,
        )

    @property
    def subscriptions(self) -> SubscriptionState:
        return self.state.extensions["subscriptions"]  # type: ignore[return-value]

    def begin_shutdown(self) -> None:
        """Release live readers so the HTTP server can drain quickly."""
        self.closing = True
        self.waiters.notify_all()

    async def stop(self) -> None:
        self.begin_shutdown()
        if self.deliveries is not None:
            await self.deliveries.stop()
        for task in (self._flusher_task, self._gc_task, self._probe_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        for task in list(self._tasks):
            task.cancel()
        self.waiters.notify_all()
        await self.journal.close(self.state)
        if self.store is not None:
            await self.store.close()

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
                elif isinstance(record, BucketErased):
                    self.waiters.notify_all()  # its streams' live readers get their 404 now
            # Subscriptions follow stream events (glob links, wakes): their records join this
            # batch right after the record that caused them (SubscriptionState.on_stream_event).
            follow_ups = self.subscriptions.on_stream_event(record, s, self.state)
            if follow_ups:
                future = self._commit(follow_ups)
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

    async def _decide(self, decide: Callable[..., Any], *args: Any) -> Any:
        """Run a decide function; a refusal is answered only once what it saw is durable.

        A refusal can rest on state still on its way to disk ("stream is
        closed" while the close is in flight): answering before it is durable
        could tell a client something a crash then takes back.
        """
        try:
            return decide(*args)
        except StreamError:
            await self.journal.flushed()
            raise

    async def _durable(self, future: asyncio.Future[None] | None) -> None:
        if future is None:
            return
        try:
            await asyncio.shield(future)
        except JournalFailed as exc:
            raise StreamError(503, f"write not durable: {exc}", {"Retry-After": "5"}) from None

    async def commit_records(self, records: list[Record]) -> None:
        """Journal, apply and wait for durability (background jobs' entry point)."""
        self._check_writable()
        await self._durable(self._commit(records))

    async def delete_unreferenced_segments(self) -> int:
        """Delete sealed hot segments no stream reads and no replay needs."""
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
        self.segments_deleted_last = deleted
        if deleted < len(unreferenced) and not self.offline and time.monotonic() - self._last_segment_snapshot > 10:
            # Replay still starts before them: a fresh snapshot moves the floor on.
            self._last_segment_snapshot = time.monotonic()
            await self.journal.snapshot(self.state)
        return deleted

    async def erase_bucket(self, name: str) -> None:
        await self._admit()
        await self._durable(self._commit([self.state.decide_erase_bucket(name, now_ms())]))

    async def set_retention(
        self, bucket: str, path: str | None, retention_ms: int | None, retention_bytes: int | None
    ) -> None:
        await self._admit()
        record = self.state.decide_retention_policy(bucket, path, retention_ms, retention_bytes, now_ms())
        await self._durable(self._commit([record]))

    async def retain_from(self, bucket: str, path: str, offset: int) -> Stream:
        await self._admit()
        records = self.state.decide_retain(bucket, path, offset, now_ms())
        await self._durable(self._commit(records))
        return self.lookup(bucket, path)

    async def create_bucket(self, name: str) -> bool:
        await self._admit()
        records = self.state.decide_bucket(name, now_ms())
        await self._durable(self._commit(records))
        return bool(records)

    async def create(self, bucket: str, path: str, req: CreateRequest) -> tuple[bool, Stream]:
        """Create a stream (or match an existing one). Returns (created, stream)."""
        await self._admit()
        records, existing = await self._decide(self.state.decide_create, bucket, path, req, now_ms())
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
        decided = await self._decide(self.state.decide_append, bucket, path, req, now_ms())
        if isinstance(decided, Duplicate):
            # The original may still be on its way to disk: answer once it is.
            await self.journal.flushed()
            s = decided.stream
            return AppendResult(s, s.tail, s.closed, True, decided.epoch, decided.seq)
        future = self._commit([decided])
        s = self.state.streams[decided.uid]
        tail, closed = s.tail, s.closed
        await self._durable(future)
        # After durability: a flush pass only takes durable data.
        if self.flusher is not None and self.state.hot_bytes >= self.config.flush_bytes:
            self.flusher.kick()
        return AppendResult(s, tail, closed, False, decided.epoch, decided.seq)

    async def delete(self, bucket: str, path: str) -> None:
        await self._admit()
        record = await self._decide(self.state.decide_delete, bucket, path, now_ms())
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

    async def read(self, s: Stream, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a stream, stitched from cold objects and hot segments.

        Callers stay within the visible tail. A cold read that the object
        store cannot serve raises a 503 ``StreamError`` rather than hanging;
        bytes that fail their checksum (either tier) raise a 502 integrity error.
        """
        while True:
            try:
                return await self._read(s, start, end)
            except SegmentUnchecked as exc:
                # First read of a segment recovery did not check: verify it off the loop, then re-plan.
                await asyncio.to_thread(self.journal.log.check_segment, exc.segment)
            except DamagedRecordError as exc:
                self.integrity_errors["hot"] += 1
                log.error("integrity: hot read of %s/%s [%d, %d) hit damaged %s", s.bucket, s.path, start, end, exc)
                raise integrity_error(
                    f"stored data of this stream is damaged (hot segment {exc.segment}, byte {exc.position}); "
                    "it will not be served"
                ) from None

    async def _read(self, s: Stream, start: int, end: int) -> bytes:
        c = s.chunks
        log_ = self.journal.log
        if c.starts and start >= c.starts[0] and (s.fork_source is None or start >= s.fork_offset):
            # All hot, all the stream's own: the common catch-up case, no slice objects.
            i = bisect_right(c.starts, start) - 1
            return log_.read_run(c.starts, c.lens, c.segs, c.poss, i, start, end)
        slices = self.state.plan_read(s, start, end)
        # Hot slices first, with no await in between: a segment the plan names
        # cannot be trimmed and deleted while cold reads are in flight.
        parts: list[bytes | None] = [
            None if isinstance(sl, ColdSlice) else log_.read(sl.segment, sl.position, sl.length, inline_check=False)
            for sl in slices
        ]
        cold = [(i, sl) for i, sl in enumerate(slices) if isinstance(sl, ColdSlice)]
        if cold:
            # Ranged GETs of different objects overlap rather than queue.
            fetched = await asyncio.gather(*(self._read_cold(sl) for _, sl in cold))
            for (i, _), data in zip(cold, fetched, strict=True):
                parts[i] = data
        if len(parts) == 1:
            return parts[0] or b""
        return b"".join(p or b"" for p in parts)

    async def _read_cold(self, sl: ColdSlice) -> bytes:
        obj = self.state.cold_objects.get(sl.key)
        if obj is None or self.cold_reader is None:
            raise StreamError(503, "cold data is not available right now", {"Retry-After": "1"})
        timeout = self.config.cold_read_timeout_s
        try:
            async with asyncio.timeout(timeout):
                data = await self.cold_reader.read(sl.key, obj.index, sl.bucket, sl.path, sl.start, sl.end)
            self.store_health.ok()
            return data
        except TimeoutError:
            self.store_health.failed(f"a cold read of {sl.key} got no answer within {timeout:g}s", stalled=True)
            raise StreamError(
                503, f"the object store did not answer within {timeout:g}s; retry shortly", {"Retry-After": "2"}
            ) from None
        except ColdDataDamaged as exc:
            self.integrity_errors["cold"] += 1
            log.error("integrity: cold read of %s/%s [%d, %d): %s", sl.bucket, sl.path, sl.start, sl.end, exc)
            raise integrity_error(f"stored data of this stream is damaged (cold object {sl.key}); it will not be served") from None
        except ObjectNotFound:
            self.integrity_errors["cold"] += 1
            log.error("integrity: cold object %s is missing from the store (read of %s/%s)", sl.key, sl.bucket, sl.path)
            raise integrity_error(f"cold object {sl.key} is missing from the object store") from None
        except ObjectStoreError as exc:
            log.warning("cold read of %s failed: %s", sl.key, exc)
            self.store_health.failed(str(exc))
            raise StreamError(503, "the object store is unavailable; retry shortly", {"Retry-After": "2"}) from None

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready to serve everything: recovery finished, the journal writes, the store answered."""
        checks: dict[str, object] = {
            "recovered": self.recovered,
            "journal": "ok" if self.journal.failed is None else f"failed: {self.journal.failed}",
            "store": self.store_health.as_json(),
        }
        claim = self.claim
        if claim is not None and not claim.held:
            checks["prefix"] = f"claimed by another data dir ({claim.lost_to.identity if claim.lost_to else 'nobody'})"
        ready = (
            self.recovered
            and self.journal.failed is None
            and self.store_health.reachable is True
            and (claim is None or claim.held)
        )
        return ready, checks

    async def wait_for_change(self, s: Stream, offset: int, timeout: float) -> bool:
        """Park until the stream's visible tail passes ``offset`` or it closes."""
        v = self.view(s)
        if v.tail > offset or v.closed or self.closing:
            return True
        return await self.waiters.wait(s.uid, timeout)
