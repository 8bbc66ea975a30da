"""The stream snapshots shell: publish (intent, upload, commit), fetch a body, the bootstrap read's bytes.

Publishing follows the cold tier's rule, upload before commit:

1. decide (``snapshots.check_publish``): a refusal stores nothing; the same
   snapshot again answers at once (idempotent);
2. journal the intent, a ``ColdCopyStarted`` with no ranges, durable before
   the upload: a crash after it leaves a key the metadata knows (the flusher
   aborts interrupted copies at start, reconciliation deletes the object once
   the grace delay has passed);
3. upload the body (create-only) under ``data/<ULID>.snapshot``;
4. decide again (the stream may have moved meanwhile) and journal
   ``SnapshotPublished``; only once it is durable is the publish answered.
   A refusal at this point journals ``ColdCopyAborted`` (the object is an orphan
   for reconciliation).

``steps`` is a test seam: called after each journaled step (``intent``,
``upload``, ``commit``), so crash tests stop the process between any two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tiered.cold.objects.keys import new_snapshot_key
from tiered.cold.objects.store import ObjectNotFound, ObjectStore, ObjectStoreError
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset
from tiered.core.ports import PrefixOwner
from tiered.engine.streams import keyed, snapshots
from tiered.engine.streams.model import PublishedSnapshot, Stream
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted
from tiered.engine.streams.service import StreamService
from tiered.hot.segment import crc32c

Step = Callable[[str], Awaitable[None]]


async def _no_step(name: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Published:
    snapshot: PublishedSnapshot
    stream: Stream
    created: bool  # False: the same snapshot was already published (idempotent repeat)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """What a bootstrap read answers: the snapshot (if any), its body, and the updates after it."""

    stream: Stream
    snapshot: PublishedSnapshot | None
    body: bytes
    start: int  # where the updates begin: the snapshot's offset, or the retained offset without one
    updates: bytes  # the stored bytes of [start, end)
    end: int  # Stream-Next-Offset
    up_to_date: bool
    closed: bool


class SnapshotService:
    def __init__(
        self,
        streams: StreamService,
        store: ObjectStore,
        clock: Clock,
        *,
        max_bytes: int,
        bootstrap_max_bytes: int,
        claim: PrefixOwner | None = None,
        steps: Step = _no_step,
    ) -> None:
        self.streams = streams
        self.state = streams.state
        self.committer = streams.committer
        self.store = store
        self.clock = clock
        self.max_bytes = max_bytes
        self.bootstrap_max_bytes = bootstrap_max_bytes
        self.claim = claim
        self.steps = steps

    # ------------------------------------------------------------- publish

    async def publish(
        self,
        bucket: str,
        path: str,
        offset: int,
        body: bytes,
        content_type: str,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        retain: bool = False,
    ) -> Published:
        streams = self.streams
        req = snapshots.PublishRequest(
            offset=offset,
            size=len(body),
            crc32c=crc32c(body),
            digest=hashlib.sha256(body).hexdigest(),
            content_type=content_type,
            if_match=if_match,
            if_none_match=if_none_match,
            retain=retain,
        )
        await self.committer.admit()
        s = streams.lookup(bucket, path)
        try:
            existing = snapshots.check_publish(s, req, streams.view(s).tail, self.max_bytes)
            if existing is None:
                await self._check_boundary(s, offset)
                if streams.gate is not None:  # a snapshot's body is retained bytes of its bucket
                    streams.gate.admit(
                        s.bucket, body_bytes=len(body), stored_bytes=len(body), new_streams=0, rated=True
                    )
        except TieredError as exc:
            raise await streams._refuse_when_durable(exc) from None
        if existing is not None:
            await self.committer.settled()  # the original may still be on its way to disk
            if retain:  # a repeat that asks for retention gets it: the request is the same either way
                s = await self.retain_to_snapshot(bucket, path)
            return Published(existing, s, False)
        if self.claim is not None and not await self.claim.still_held():
            raise TieredError(
                ErrorCode.STORE_UNAVAILABLE,
                "the object-store prefix is not held by this server: nothing stored",
            )
        key = new_snapshot_key(self.clock.now_ms())
        await self.committer.commit([ColdCopyStarted(key=key, ts_ms=self.clock.now_ms(), ranges=())])
        await self.steps("intent")
        try:
            await self.store.put(key, body)
        except ObjectStoreError as exc:
            await self._abort(key, f"upload failed: {exc}")
            raise TieredError(
                ErrorCode.STORE_UNAVAILABLE, f"the snapshot could not be stored: {exc}"
            ) from None
        await self.steps("upload")
        return await self._commit(s, req, key)

    async def _commit(self, s: Stream, req: snapshots.PublishRequest, key: str) -> Published:
        streams = self.streams
        try:
            if not streams.still_live(s):
                raise TieredError(ErrorCode.STREAM_NOT_FOUND, "stream was deleted")
            decided = snapshots.published_records(
                self.state, s, req, key, streams.view(s).tail, self.max_bytes, self.clock.now_ms()
            )
        except TieredError as exc:
            await self._abort(key, exc.message)
            raise
        if isinstance(decided, PublishedSnapshot):  # a concurrent identical publish won
            await self._abort(key, "the same snapshot was published meanwhile")
            if req.retain:
                s = await self.retain_to_snapshot(s.bucket, s.path)
            return Published(decided, s, False)
        await self.committer.durable(self.committer.commit_nowait(decided))
        await self.steps("commit")
        snap = s.snapshot
        assert snap is not None and snap.key == key
        return Published(snap, s, True)

    async def _abort(self, key: str, reason: str) -> None:
        """The upload will not be committed: its key (if written) is an orphan for reconciliation."""
        await self.committer.commit(
            [ColdCopyAborted(key=key, ts_ms=self.clock.now_ms(), reason=reason[:200])]
        )

    async def _check_boundary(self, s: Stream, offset: int) -> None:
        """A JSON stream's snapshot sits between two messages (the byte before it ends one).

        Other streams are bytes to the protocol (a read may end at any byte), so any offset is a boundary.
        """
        if not s.json or offset in (s.retained_from, s.fork_offset, self.streams.view(s).tail) or offset == 0:
            return
        for a, b in s.holes:  # the byte before it was removed by keyed compaction (its record may be gone)
            if a < offset <= b:
                if offset == b:
                    return  # a hole ends where a message ends
                raise TieredError(
                    ErrorCode.SNAPSHOT_NOT_AT_BOUNDARY,
                    "the snapshot offset is inside messages compaction removed",
                )
        if await self.streams.read(s, offset - 1, offset) != b"\n":
            raise TieredError(
                ErrorCode.SNAPSHOT_NOT_AT_BOUNDARY, "the snapshot offset is inside a JSON message"
            )

    # ------------------------------------------------------------- reads

    async def body(self, snap: PublishedSnapshot) -> bytes:
        """The snapshot's bytes, checked against the size and checksum recorded at publish."""
        try:
            data = await self.store.get(snap.key)
        except ObjectNotFound:
            raise TieredError(
                ErrorCode.DATA_DAMAGED, "the snapshot's object is missing from the object store"
            ) from None
        except ObjectStoreError as exc:
            raise TieredError(ErrorCode.STORE_UNAVAILABLE, f"the snapshot could not be read: {exc}") from None
        if len(data) != snap.size or crc32c(data) != snap.crc32c:
            raise TieredError(ErrorCode.DATA_DAMAGED, "the snapshot's object does not match its checksum")
        return data

    async def bootstrap(self, bucket: str, path: str) -> Bootstrap:
        """The newest snapshot and every byte after it, up to ``bootstrap_max_bytes`` (then a partial answer).

        A partial answer stops at a message boundary (JSON: a whole message, at
        least one) and says where to continue (``end``), as Ursula's does.
        """
        streams = self.streams
        s = streams.lookup(bucket, path)
        streams.touch(s)
        snap = s.snapshot
        body = await self.body(snap) if snap is not None else b""
        s = streams.lookup(bucket, path)  # the stream may have moved during the fetch
        snap_now = s.snapshot
        if snap_now is not None and (snap is None or snap_now.key != snap.key):
            snap, body = snap_now, await self.body(snap_now)
        v = streams.view(s)
        start = snap.offset if snap is not None else s.retained_from
        if start < s.retained_from:
            # Age or size retention passed the newest snapshot: the messages between them are gone, and a
            # bootstrap without them would be wrong in silence. Refused until a newer snapshot is published.
            raise TieredError(
                ErrorCode.OFFSET_GONE,
                "retention passed the stream's newest snapshot: the messages after it are no longer retained "
                "(a newer snapshot, or retain: snapshot, makes it bootstrap again)",
                next_offset=format_offset(s.retained_from),
                snapshot_offset=format_offset(start),
            )
        if s.holes and s.holes[-1][1] > start:  # keyed compaction: the removed messages skipped (``keyed``)
            updates, end, up_to_date = await keyed.read_live_chunk(
                lambda a, b: streams.read(s, a, b), s.holes, start, v.tail, self.bootstrap_max_bytes
            )
            return Bootstrap(s, snap, body, start, updates, end, up_to_date, up_to_date and v.closed)
        end = min(v.tail, start + self.bootstrap_max_bytes)
        updates = await streams.read(s, start, end) if end > start else b""
        if s.json and end < v.tail:
            cut = updates.rfind(b"\n") + 1
            if cut == 0:  # one message larger than the limit: send it whole
                rest = await streams.read(s, end, v.tail)
                cut = len(updates) + rest.find(b"\n") + 1
                updates = updates + rest[: cut - len(updates)]
            updates = updates[:cut]
            end = start + cut
        up_to_date = end >= v.tail
        return Bootstrap(s, snap, body, start, updates, end, up_to_date, up_to_date and v.closed)

    async def set_retention(self, bucket: str, path: str | None, on: bool) -> None:
        """``retain: snapshot`` on a bucket or one stream (or off)."""
        await self.committer.admit()
        records = snapshots.decide_retention(self.state, bucket, path, on, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait(records))

    async def retain_to_snapshot(self, bucket: str, path: str) -> Stream:
        """Advance the stream's retained offset to its newest snapshot (``retain: snapshot``)."""
        await self.committer.admit()
        s = self.streams.lookup(bucket, path)
        records = snapshots.decide_retain_to_snapshot(s, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait(records))
        return s
