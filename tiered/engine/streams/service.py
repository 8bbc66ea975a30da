"""The streams shell: the state machine wired to the committer, the read path and waiters.

Each write is decide (pure) -> commit (journal + apply, no ``await`` between,
so the event loop makes it atomic) -> wait for durability -> respond. A
refusal that rests on state still in flight is answered only once that state
is durable. Reads stay within what is durable (``Visibility``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import msgspec
from msgspec import structs

from tiered.core.clock import Clock
from tiered.core.content import encode_json_messages, is_json
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.core.ports import NOT_RECORDED, LatencyRecorder
from tiered.engine.journal.committer import Committer
from tiered.engine.streams import (
    appends,
    conditions,
    header_keys,
    key_index_file,
    key_reads,
    keyed,
    lifecycle,
    listing,
    ordinals,
)
from tiered.engine.streams.model import (
    AppendRequest,
    CreateRequest,
    Duplicate,
    ForkRequest,
    KeyedAppend,
    Stream,
)
from tiered.engine.streams.producers import ProducerChange
from tiered.engine.streams.reader import StreamReader
from tiered.engine.streams.records import StreamCreated, StreamKeyed
from tiered.engine.streams.state import StreamState
from tiered.engine.streams.visibility import Visibility, VisibleView, Waiters

log = logging.getLogger(__name__)


class WriteGate(Protocol):
    """Checks a decided write against its bucket's quotas, right before it is committed."""

    def admit(
        self,
        bucket: str,
        *,
        body_bytes: int,
        stored_bytes: int,
        new_streams: int,
        rated: bool,
        state_bytes: int = 0,
    ) -> None: ...


class RemoteForks(Protocol):
    """Forks of streams another engine holds (cluster mode: ``tiered.cluster.features.xfork``)."""

    async def resolve(
        self, target: tuple[str, str], source: tuple[str, str], spec: str, headers: Mapping[str, str]
    ) -> ForkRequest:
        """Pin the source for the fork ``target`` where it lives and fetch what the fork inherits."""
        ...

    async def release(
        self, bucket: str, path: str, spec: str, headers: Mapping[str, str] | None = None
    ) -> None:
        """Drop the pin the fork ``(bucket, path)`` (created as ``spec``) holds on its source (best effort)."""
        ...


class AppendResult(msgspec.Struct, frozen=True):
    """What an append did (a frozen Struct: built for every append)."""

    stream: Stream
    tail: int
    closed: bool
    duplicate: bool
    stored: bool  # new bytes were stored (a 200 for producers; duplicates and close-only are 204)
    epoch: int | None
    seq: int | None


class StreamService:
    def __init__(
        self,
        state: StreamState,
        committer: Committer,
        reader: StreamReader,
        visibility: Visibility,
        waiters: Waiters,
        clock: Clock,
        *,
        max_hot_bytes: int,
        flush_bytes: int,
        append_seconds: LatencyRecorder = NOT_RECORDED,
        kick_flush: Callable[[], None] | None = None,
        gate: WriteGate | None = None,
        remote_forks: RemoteForks | None = None,
    ) -> None:
        self.state = state
        self.committer = committer
        self.reader = reader
        self.visibility = visibility
        self.waiters = waiters
        self.clock = clock
        self.max_hot_bytes = max_hot_bytes
        self.flush_bytes = flush_bytes
        self.append_seconds = append_seconds
        self.kick_flush = kick_flush  # the flusher's, when one runs: enough hot bytes start a pass at once
        self.gate = gate  # bucket quotas (``tiered.engine.tenants.gate``)
        self.closing = False  # set at shutdown: live readers finish at once
        # Forks of streams held elsewhere (cluster mode: ``tiered.cluster.features.xfork``).
        self.remote_forks = remote_forks
        # Producer states appends dropped, by reason ("expired", "cap"): tiered_producer_states_dropped_total.
        self.producer_states_dropped = {"expired": 0, "cap": 0}
        self.key_footers = key_index_file.FooterCache()  # issue 21: key index footers (immutable objects)
        self._cap_logged_ms: int | None = None  # the last eviction log line (one a minute at most)

    def begin_shutdown(self) -> None:
        """Release live readers so the HTTP server can drain quickly."""
        self.closing = True
        self.waiters.notify_all()

    async def _refuse_when_durable(self, exc: TieredError) -> TieredError:
        """A refusal may rest on state still on its way to disk: answer it only once that is durable."""
        await self.committer.settled()
        return exc

    # ------------------------------------------------------------- buckets

    async def create_bucket(self, name: str) -> bool:
        await self.committer.admit()
        records = self.state.decide_bucket(name, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait(records))
        return bool(records)

    async def erase_bucket(self, name: str) -> None:
        await self.committer.admit()
        record = self.state.decide_erase_bucket(name, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait([record]))

    def describe_bucket(self, name: str) -> dict[str, Any]:
        if name not in self.state.buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {name!r} does not exist")
        streams = self.state.live_streams(name, self.clock.now_ms())
        return {"name": name, "created_ms": self.state.buckets[name], "streams": streams}

    def list_buckets(self) -> list[dict[str, Any]]:
        return [{"name": name, "created_ms": ts} for name, ts in sorted(self.state.buckets.items())]

    def list_streams(
        self, bucket: str, query: listing.ListQuery, prefixes: Sequence[str] | None
    ) -> dict[str, Any]:
        """One page of a bucket's live streams (``tiered.engine.streams.listing``); ``prefixes``: the caller's."""
        if bucket not in self.state.buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
        now_ms = self.clock.now_ms()
        streams, held = self.state.streams, self.state.paths

        def live(path: str) -> bool:
            uid = held.get((bucket, path))
            return uid is not None and not (s := streams[uid]).soft_deleted and not s.expired(now_ms)

        directory = self.state.extensions.get(listing.StreamDirectory.name)
        if isinstance(directory, listing.StreamDirectory):
            paths = directory.paths_of(bucket, self.state)
            return listing.page_sorted(paths, query, prefixes, live, lambda path: self._entry(bucket, path))
        every = (path for (b, path) in held if b == bucket and live(path))  # a state without the directory
        return listing.page(every, query, prefixes, lambda path: self._entry(bucket, path))

    def _entry(self, bucket: str, path: str) -> listing.Entry:
        s = self.state.streams[self.state.paths[(bucket, path)]]
        v = self.view(s)
        records = self.records(s, v.tail)
        return listing.Entry(
            path,
            s.content_type,
            v.tail,
            s.retained_from,
            s.created_ms,
            v.closed,
            s.ttl_s,
            s.expires_at,
            None if records is None else (records.first, records.next, records.count),
            keyed.low_water_mark(s, v.tail),
        )

    # ------------------------------------------------------------- retention

    async def set_retention(
        self, bucket: str, path: str | None, retention_ms: int | None, retention_bytes: int | None
    ) -> None:
        await self.committer.admit()
        record = self.state.decide_retention_policy(
            bucket, path, retention_ms, retention_bytes, self.clock.now_ms()
        )
        await self.committer.durable(self.committer.commit_nowait([record]))

    async def retain_from(self, bucket: str, path: str, offset: int) -> Stream:
        await self.committer.admit()
        records = self.state.decide_retain(bucket, path, offset, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait(records))
        return self.lookup(bucket, path)

    # ------------------------------------------------------------- writes

    def check_hot_capacity(self, incoming: int) -> None:
        if incoming and self.state.hot_bytes + incoming > self.max_hot_bytes:
            raise TieredError(ErrorCode.HOT_TIER_FULL, "hot tier is full until data moves to the cold tier")

    async def fork_request(
        self,
        bucket: str,
        path: str,
        offset: int | None,
        sub: int,
        spec: str,
        *,
        target: tuple[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ForkRequest:
        """Resolve fork headers to a source uid and an absolute fork point (reads for a JSON sub-offset).

        A source this engine does not hold may be another shard's (cluster mode):
        ``remote_forks`` then resolves it there and fetches what the fork
        ``target`` inherits (``headers``: the request's, for the source's engine).
        """
        found = self.state.find(bucket, path)
        if found is None and self.remote_forks is not None and target is not None and headers is not None:
            existing = self.state.find(*target)
            if existing is not None and (existing.soft_deleted or not existing.expired(self.clock.now_ms())):
                # The path is taken: the create only compares configurations (or refuses), nothing to fetch.
                return ForkRequest(source_uid=None, offset=0, spec=spec)
            lifecycle.check_bucket(self.state, target[0])
            return await self.remote_forks.resolve(target, (bucket, path), spec, headers)
        source = lifecycle.fork_source(self.state, found, self.clock.now_ms())
        tail = self.view(source).tail
        if offset is None:
            offset = tail
        elif offset > tail:
            raise TieredError(
                ErrorCode.OFFSET_BEYOND_TAIL, "Stream-Fork-Offset is beyond the source stream's tail"
            )
        else:
            lifecycle.check_fork_offset(self.state, source, offset)  # an earlier stream's offset: 400
        if sub:
            if source.json:
                # Messages as a reader of the source sees them: those compaction removed are not counted.
                after = await keyed.after_messages(
                    lambda a, b: self.read(source, a, b), source.holes, offset, tail, sub
                )
                if after is None:
                    raise TieredError(
                        ErrorCode.BAD_REQUEST,
                        "Stream-Fork-Sub-Offset is past the end of the source stream",
                    )
                offset = after
            elif offset + sub > tail:
                raise TieredError(
                    ErrorCode.BAD_REQUEST, "Stream-Fork-Sub-Offset is past the end of the source stream"
                )
            else:
                offset += sub
        return ForkRequest(source_uid=source.uid, offset=offset, spec=spec)

    async def create(self, bucket: str, path: str, req: CreateRequest) -> tuple[bool, Stream]:
        """Create a stream (or match an existing one). Returns (created, stream).

        ``req.data`` is the body as sent; a JSON stream stores it as messages.
        """
        body_bytes = len(req.data)
        content_type = req.content_type
        if content_type is None and req.fork is not None:
            if req.fork.copy is not None:
                content_type = req.fork.copy.content_type
            elif req.fork.source_uid is not None:
                source = self.state.streams.get(req.fork.source_uid)
                content_type = source.content_type if source is not None else None
        try:
            return await self._create(bucket, path, req, content_type, body_bytes)
        except BaseException:
            if req.fork is not None and req.fork.copy is not None and self.remote_forks is not None:
                # The source's engine holds a reference for this fork: let it go (best effort).
                await self.remote_forks.release(bucket, path, req.fork.spec)
            raise

    async def _create(
        self, bucket: str, path: str, req: CreateRequest, content_type: str | None, body_bytes: int
    ) -> tuple[bool, Stream]:
        if req.data and content_type is not None and is_json(content_type):
            req = replace(req, data=encode_json_messages(req.data, allow_empty_array=True))
        if req.compaction_key == header_keys.HEADER_MODE:  # keys from each append's Stream-Key (issue 21)
            header_keys.check_create(req.compaction_key, bool(req.data), req.fork is not None)
        else:
            keyed.check_key_config(req.compaction_key, content_type is not None and is_json(content_type))
            if req.compaction_key is not None and req.data:
                keyed.check_messages(req.compaction_key, req.data)
        base = req.fork.copy.base if req.fork is not None and req.fork.copy is not None else b""
        self.check_hot_capacity(len(req.data) + len(base))
        await self.committer.admit()
        try:
            records, existing = self.state.decide_create(bucket, path, req, self.clock.now_ms())
            created = records[-1] if records else None
            if self.gate is not None and isinstance(created, StreamCreated):
                self.gate.admit(
                    bucket,
                    body_bytes=body_bytes,
                    stored_bytes=len(created.data),
                    new_streams=1 - (len(records) - 1),  # a create may replace an expired stream
                    rated=bool(created.data),
                )
        except TieredError as exc:
            raise await self._refuse_when_durable(exc) from None
        if existing is not None:
            keyed.check_recreate(existing, req.compaction_key)
            await self.committer.settled()  # the matching create may still be in flight
            return False, existing
        if req.compaction_key is not None and isinstance(created, StreamCreated):  # one batch with the create
            records = [*records, StreamKeyed(uid=created.uid, compaction_key=req.compaction_key)]
        future = self.committer.commit_nowait(records)
        assert isinstance(created, StreamCreated)
        await self.committer.durable(future)
        return True, self.state.streams[created.uid]

    async def append(self, bucket: str, path: str, req: AppendRequest) -> AppendResult:
        """Append ``req.data`` (the body as sent; a JSON stream stores it as messages).

        Timed (``append_seconds``) from admission to the answer, refusals included.
        """
        started = self.clock.monotonic()  # timed inline: a wrapper coroutine would cost every append
        body_bytes = len(req.data)
        committer = self.committer
        try:
            if not committer.admitted():  # the batch is full: wait for it (``admit``)
                await committer.admit()
            try:
                s = self.lookup(bucket, path)  # the one lookup of this append
                if (
                    req.data
                    and s.json
                    and not s.closed
                    and req.content_type is not None
                    and is_json(req.content_type)
                ):
                    req = structs.replace(req, data=encode_json_messages(req.data, allow_empty_array=False))
                if req.key is not None or s.compaction_key is not None:  # keyed streams (issue 21)
                    header_keys.check_append(s, req)
                    if req.data and not header_keys.is_header_keyed(s):  # a pointer's: every message
                        keyed.check_messages(s.compaction_key or "", req.data)  # has its key (``keyed``)
                self.check_hot_capacity(len(req.data))
                decided = appends.check_append(s, req, self.clock.now_ms(), self.state.producer_limits)
                change = None
                if not isinstance(decided, Duplicate):
                    if req.expected_record is not None:  # after the append rules (``conditions``)
                        conditions.check_record_match(self.next_record(s), s.tail, req.expected_record)
                    change = appends.producer_change(self.state, s, decided)
                    if self.gate is not None:
                        self.gate.admit(
                            s.bucket,
                            body_bytes=body_bytes,
                            stored_bytes=len(decided.data),
                            new_streams=0,
                            rated=True,
                            state_bytes=change.bytes_delta,  # a new producer's state counts too
                        )
            except TieredError as exc:
                raise await self._refuse_when_durable(exc) from None
            if isinstance(decided, Duplicate):
                # The original may still be on its way to disk: answer once it is.
                await self.committer.settled()
                return AppendResult(s, s.tail, s.closed, True, False, decided.epoch, decided.seq)
            assert change is not None
            if change.expired or change.evicted:
                self._count_dropped(s, change)
            if req.key is None:
                future = committer.commit_nowait([decided])
            else:  # issue 21: the append's key journaled right after it (``header_keys``)
                future = committer.commit_nowait([decided, header_keys.keyed_record(req, decided)])
            tail, closed = s.tail, s.closed
            await committer.durable_wait(future)
            # After durability: a flush pass only takes durable data.
            if self.kick_flush is not None and self.state.hot_bytes >= self.flush_bytes:
                self.kick_flush()
            return AppendResult(s, tail, closed, False, bool(decided.data), decided.epoch, decided.seq)
        finally:
            self.append_seconds.observe(self.clock.monotonic() - started)

    def _count_dropped(self, s: Stream, change: ProducerChange) -> None:
        """Count producer states an append drops; evictions at the cap are logged (once a minute at most)."""
        self.producer_states_dropped["expired"] += len(change.expired)
        if not change.evicted:
            return
        self.producer_states_dropped["cap"] += len(change.evicted)
        now = self.clock.now_ms()
        if self._cap_logged_ms is None or now - self._cap_logged_ms >= 60_000:
            self._cap_logged_ms = now
            idle_s = (now - s.producers[change.evicted[0]].last_ms) // 1000
            log.warning(
                "stream %s/%s holds %d producer states (--max-producers-per-stream): a new producer evicted "
                "the longest idle one's (idle %d s), which is now treated as new "
                '(tiered_producer_states_dropped_total{reason="cap"} counts every eviction)',
                s.bucket,
                s.path[:200],
                self.state.producer_limits.max_per_stream,
                idle_s,
            )

    async def delete(self, bucket: str, path: str, headers: Mapping[str, str] | None = None) -> None:
        """Delete (or soft-delete) a stream; ``headers``: the request's, should a pin elsewhere be released."""
        await self.committer.admit()
        try:
            record = self.state.decide_delete(bucket, path, self.clock.now_ms())
        except TieredError as exc:
            raise await self._refuse_when_durable(exc) from None
        copied = self._copied_root(record.uid)
        await self.committer.durable(self.committer.commit_nowait([record]))
        if copied is not None and copied.uid not in self.state.streams and self.remote_forks is not None:
            # The last stream reading the copy went: the source's engine may let go of the source.
            assert copied.fork_spec is not None
            await self.remote_forks.release(copied.bucket, copied.path, copied.fork_spec, headers)

    def _copied_root(self, uid: int) -> Stream | None:
        """The root of ``uid``'s fork ancestry if it is a fork copied from another shard."""
        s = self.state.streams.get(uid)
        while s is not None and s.fork_source is not None:
            s = self.state.streams.get(s.fork_source)
        return s if s is not None and s.fork_spec is not None else None

    def touch(self, s: Stream) -> None:
        record = self.state.touch(s, self.clock.now_ms())
        if record is not None and self.committer.journal.failed is None:
            self.committer.commit_nowait([record])

    # ------------------------------------------------------------- reads

    async def read_key(self, s: Stream, key: str) -> tuple[KeyedAppend, bytes]:
        """``?key=K`` of a stream keyed by header: the newest append of ``key`` and its bytes (``key_reads``)."""
        return await key_reads.newest_by_header(
            lambda a, b: self.read(s, a, b), self.reader, self.key_footers, s, key
        )

    async def read_pointer_key(self, s: Stream, tail: int, key: str) -> tuple[int, bytes]:
        """``?key=K`` of a stream keyed by a JSON pointer (``key``: canonical, ``keyed.parse_key_query``)."""
        return await key_reads.newest_by_pointer(
            lambda a, b: self.read(s, a, b), self.reader, self.key_footers, s, tail, key
        )

    def lookup(self, bucket: str, path: str) -> Stream:
        return self.state.lookup(bucket, path, self.clock.now_ms())

    def offset_gone(self, s: Stream, offset: int) -> TieredError:
        """The 410 for a read below ``s``'s retained offset, saying whether retention or a re-creation took it."""
        if lifecycle.earlier_offset(self.state, s, offset):
            message = (
                "this offset is from an earlier stream at this path (deleted or expired, then created "
                "again); Stream-Next-Offset is this stream's earliest offset"
            )
        else:
            message = "data at this offset is no longer retained; Stream-Next-Offset is the earliest"
        if s.snapshot is not None:  # a reader recovers by bootstrap from the newest snapshot
            message += "; the stream's snapshot (Stream-Snapshot-Offset) covers it: read ?bootstrap"
            return TieredError(
                ErrorCode.OFFSET_GONE,
                message,
                next_offset=format_offset(s.retained_from),
                snapshot_offset=format_offset(s.snapshot.offset),
            )
        return TieredError(ErrorCode.OFFSET_GONE, message, next_offset=format_offset(s.retained_from))

    def view(self, s: Stream) -> VisibleView:
        return self.visibility.view(s)

    async def read(self, s: Stream, start: int, end: int) -> bytes:
        return await self.reader.read(s, start, end)

    async def wait_for_change(self, s: Stream, offset: int, timeout: float) -> bool:
        """Park until the stream's visible tail passes ``offset`` or it closes."""
        v = self.view(s)
        if v.tail > offset or v.closed or self.closing:
            return True
        return await self.waiters.wait(s.uid, timeout)

    def still_live(self, s: Stream) -> bool:
        """The stream a live reader holds was not deleted (or erased) meanwhile."""
        return self.state.streams.get(s.uid) is s and not s.soft_deleted

    # ------------------------------------------------------------- record ordinals (``ordinals``)

    def _index_of(self, uid: int) -> tuple[ordinals.RecordIndex, int | None, int] | None:
        records = self.state.extensions.get(ordinals.NAME)
        if not isinstance(records, ordinals.RecordsState):
            return None
        index = records.indexes.get(uid)
        if index is None:
            return None
        s = self.state.streams[uid]
        return index, (s.fork_source if uid in records.parents else None), s.fork_offset

    def record_indexes(self) -> ordinals.IndexOf:
        """uid -> its record index (with its fork source and offset): what a cold locator's ordinals need."""
        return self._index_of

    def records(self, s: Stream, tail: int) -> ordinals.RecordView | None:
        """First retained, next and count of ``s``'s record ordinals as of ``tail``; None: it keeps none."""
        return ordinals.view(self._index_of, s.uid, s.retained_from, tail)

    def record_at(self, s: Stream, offset: int, tail: int) -> int | None:
        """The ordinal of the message the byte at ``offset`` belongs to (the next one at ``tail``)."""
        found = self._index_of(s.uid)
        if found is None:
            return None
        if offset >= tail:  # every append's Stream-Record-Next: one lookup
            return found[0].first_at_or_after(tail)
        return ordinals.ordinal_containing(self._index_of, s.uid, offset, tail)

    def next_record(self, s: Stream) -> int | None:
        """The ordinal the next message appended to ``s`` gets (appends in flight counted)."""
        found = self._index_of(s.uid)
        return None if found is None else found[0].next

    def record_offset(self, s: Stream, ordinal: int, tail: int) -> int:
        """Where a read of ``?record=ordinal`` starts: its message, or the next one that survives compaction.

        400 on a stream without ordinals or beyond the next ordinal; 410 below the first retained one.
        """
        view = self.records(s, tail)
        if view is None:
            raise TieredError(
                ErrorCode.BAD_REQUEST,
                "this stream keeps no record ordinals (it was created before they were kept)",
            )
        if ordinal < view.first:
            raise TieredError(
                ErrorCode.OFFSET_GONE,
                f"record {ordinal} is no longer retained; the first retained record is {view.first}, "
                "at Stream-Next-Offset",
                next_offset=format_offset(s.retained_from),
                first_record=view.first,
            )
        offset = ordinals.offset_of(self._index_of, s.uid, ordinal, tail)
        if offset is None:
            raise TieredError(
                ErrorCode.OFFSET_BEYOND_TAIL,
                f"record {ordinal} is beyond the stream's next record {view.next}",
            )
        return max(offset, s.retained_from)
