"""Large bodies stored by reference: the shell (decide, upload, decide again, commit, answer).

An append whose declared length is above the threshold never goes through the
journal. Its body is streamed to an object of its own (``tiered.cold.objects.
payload``), and only then is a ``PayloadAppended`` reference journaled at the
stream's next offset range. In order:

1. the append rules and the bucket's quotas judge it first, with the body's
   declared size (a refusal reads none of a body it cannot store; a retry of
   an append already applied is answered as a duplicate once its body is read);
2. ``ColdCopyStarted(key)`` is journaled and durable before the upload, so the
   key is known while the upload runs (reconciliation never takes an upload
   under way for an orphan, however long it takes);
3. the body is streamed to ``key`` (multipart on S3), checksummed as it goes;
4. the rules and quotas judge it again (the stream may have moved meanwhile),
   and the reference is committed at the tail as it is then; the answer waits
   for it to be durable.

The body's integrity digest contribution (``tiered.core.record_digest``) is
hashed as it streams, for the offset step 1 expected, and journaled in the
reference (``PayloadAppended.record_hash``): the stream's digest counts the
body like any record. The hash covers the record's range before its bytes, so
if another append moved the tail meanwhile, the object is read back once to
hash it for the new offset (bounded memory, a few blocks at a time), and the
rules judge again.

A failure at 3 or a refusal at 4 journals ``ColdCopyAborted`` and deletes
the object (best effort). A crash anywhere before 4 leaves an intent the
flusher aborts at the next start, and the object, if any, is an orphan
reconciliation deletes after the grace delay: nothing acknowledged is ever
lost, nothing unacknowledged lingers.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
from msgspec import structs

from tiered.cold.objects.keys import new_payload_key
from tiered.cold.objects.payload import BodyLengthMismatch, PayloadDigest, read_payload, upload_payload
from tiered.cold.objects.store import ObjectStore, ObjectStoreError
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ports import PrefixOwner
from tiered.core.record_digest import HashState, RecordHasher, digest_bytes, hash_value
from tiered.engine.journal.committer import Committer
from tiered.engine.streams import appends, conditions, header_keys, ordinals
from tiered.engine.streams.model import AppendRequest, Duplicate, Stream
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted, PayloadAppended
from tiered.engine.streams.service import AppendResult, WriteGate
from tiered.engine.streams.state import StreamState

log = logging.getLogger(__name__)

#: Stands in for the body while the append rules judge a large append (they only ask whether it has one).
_SOME_BODY = b"\x00"

#: How many times a body is hashed again for a tail that moved during the upload before the append is
#: refused (429: retry); each time costs a read of the object.
_REHASH_ATTEMPTS = 8

#: How many bytes a read-back for hashing fetches at a time.
_REHASH_SPAN = 8 * 1024 * 1024


class LargeBodies:
    """Appends of bodies above ``threshold`` bytes (up to ``max_bytes``), stored by reference."""

    def __init__(
        self,
        state: StreamState,
        committer: Committer,
        store: ObjectStore,
        clock: Clock,
        *,
        threshold: int,
        max_bytes: int,
        gate: WriteGate | None = None,
        claim: PrefixOwner | None = None,
    ) -> None:
        self.state = state
        self.committer = committer
        self.store = store
        self.clock = clock
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.gate = gate
        self.claim = claim
        # Counters (``/metrics``-ready): bodies stored, their bytes, uploads abandoned.
        self.stored = 0
        self.stored_bytes = 0
        self.abandoned = 0

    def takes(self, declared: int | None) -> bool:
        """Whether a body of this declared length is stored by reference."""
        return self.threshold > 0 and declared is not None and declared > self.threshold

    async def append(
        self, bucket: str, path: str, req: AppendRequest, size: int, body: AsyncIterator[bytes]
    ) -> AppendResult:
        """Append ``body`` (``size`` bytes, as declared) to the stream by reference."""
        if size > self.max_bytes:
            raise TieredError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"the body is larger than the server's limit for large bodies ({self.max_bytes} bytes)",
            )
        await self.committer.admit()
        try:
            s = self.state.lookup(bucket, path, self.clock.now_ms())
            decided = self._decide(s, req, size)
        except TieredError as exc:
            await self.committer.settled()  # a refusal may rest on state still on its way to disk
            raise exc from None
        if isinstance(decided, Duplicate):
            await _drain(body)
            await self.committer.settled()
            return AppendResult(s, s.tail, s.closed, True, False, decided.epoch, decided.seq)
        if self.claim is not None and not await self.claim.still_held():
            raise TieredError(
                ErrorCode.STORE_UNAVAILABLE,
                "this server no longer owns its object-store prefix",
                retry_after_s=5,
            )
        key = new_payload_key(self.clock.now_ms())
        hashing: _Hashing | None = None
        if s.integrity is not None:
            hashing = _Hashing(s, decided.offset, size)
            body = hashing.feed(body)
        try:
            # Inside: a request cancelled while the intent becomes durable still abandons it.
            await self.committer.commit([ColdCopyStarted(key=key, ts_ms=self.clock.now_ms(), ranges=())])
            digest, _ = await upload_payload(self.store, key, body, size)
        except BaseException as exc:
            await self._abandon(key, f"upload failed: {exc!r}"[:500])
            if isinstance(exc, BodyLengthMismatch):
                raise bad_request(f"{exc}: nothing was written") from None
            if isinstance(exc, ObjectStoreError):
                log.warning("large body upload to %s failed: %s", key, exc)
                raise TieredError(
                    ErrorCode.STORE_UNAVAILABLE, "the object store is unavailable; retry shortly"
                ) from None
            raise
        return await self._commit(bucket, path, req, key, digest, hashing)

    def _decide(self, s: Stream, req: AppendRequest, size: int) -> PayloadAppended | Duplicate:
        """The append rules and quotas for ``s`` now (no ``await``: what they judge is what is committed)."""
        judged = structs.replace(req, data=_SOME_BODY)
        if header_keys.is_header_keyed(s):  # issue 21: a keyed append goes through the journal whole
            header_keys.check_append(s, judged)
        decided = appends.check_append(s, judged, self.clock.now_ms(), self.state.producer_limits)
        if isinstance(decided, Duplicate):
            return decided
        if req.expected_record is not None:  # ``Stream-Record-Match``: after the append rules, as ``service``
            conditions.check_record_match(self._next_record(s), s.tail, req.expected_record)
        if s.json:
            raise TieredError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                "a JSON stream takes bodies up to the server's max_body_bytes (its messages are parsed "
                "whole); large bodies are stored by reference only on streams of other content types",
            )
        change = appends.producer_change(self.state, s, decided)
        if self.gate is not None:
            self.gate.admit(
                s.bucket,
                body_bytes=size,
                stored_bytes=size,
                new_streams=0,
                rated=True,
                state_bytes=change.bytes_delta,
            )
        return PayloadAppended(
            uid=decided.uid,
            offset=decided.offset,
            ts_ms=decided.ts_ms,
            producer=decided.producer,
            epoch=decided.epoch,
            seq=decided.seq,
            stream_seq=decided.stream_seq,
            close=decided.close,
            data=b"",
            key="",
            digest=PayloadDigest(size, 0, 0, ()),
        )

    def _next_record(self, s: Stream) -> int | None:
        """The ordinal the next message of ``s`` gets (None: a stream from before ordinals)."""
        records = self.state.extensions.get(ordinals.NAME)
        if not isinstance(records, ordinals.RecordsState):
            return None
        index = records.indexes.get(s.uid)
        return None if index is None else index.next

    async def _commit(
        self,
        bucket: str,
        path: str,
        req: AppendRequest,
        key: str,
        digest: PayloadDigest,
        hashing: _Hashing | None,
    ) -> AppendResult:
        """Judge the append again against the stream as it is now, and journal the reference."""
        for _ in range(_REHASH_ATTEMPTS):
            await self.committer.admit()
            try:
                s = self.state.lookup(bucket, path, self.clock.now_ms())
                decided = self._decide(s, req, digest.size)
            except TieredError as exc:
                await self._abandon(key, f"refused after the upload: {exc.code.value}")
                await self.committer.settled()
                raise exc from None
            if isinstance(decided, Duplicate):  # a retry of the same append won the race meanwhile
                await self._abandon(key, "a duplicate of an append applied meanwhile")
                await self.committer.settled()
                return AppendResult(s, s.tail, s.closed, True, False, decided.epoch, decided.seq)
            assert isinstance(decided, PayloadAppended)
            if s.integrity is None or (hashing is not None and hashing.hashed_for(s, decided.offset)):
                break
            try:  # another append moved the tail during the upload: hash the body for the new offset
                hashing = _Hashing(s, decided.offset, digest.size)
                await hashing.rehash(self.store, key, digest)
            except BaseException as exc:
                await self._abandon(key, f"could not read the body back to hash it: {exc!r}"[:500])
                if isinstance(exc, Exception):
                    log.warning("large body %s could not be read back to hash it: %s", key, exc)
                    raise TieredError(
                        ErrorCode.STORE_UNAVAILABLE, "the object store is unavailable; retry shortly"
                    ) from None
                raise
        else:
            await self._abandon(key, "the stream's tail kept moving while the body was hashed")
            raise TieredError(
                ErrorCode.RATE_LIMITED,
                "the stream's tail kept moving while the large body was stored; retry",
                retry_after_s=1,
            )
        record_hash = b"" if hashing is None or s.integrity is None else digest_bytes(hashing.value)
        record = msgspec.structs.replace(decided, key=key, digest=digest, record_hash=record_hash)
        future = self.committer.commit_nowait([record])
        tail, closed = s.tail, s.closed
        await self.committer.durable(future)
        self.stored += 1
        self.stored_bytes += digest.size
        return AppendResult(s, tail, closed, False, True, record.epoch, record.seq)

    async def _abandon(self, key: str, reason: str) -> None:
        """The upload will not be committed: journal that, then delete what it wrote (best effort)."""
        self.abandoned += 1
        log.info("large body upload %s abandoned: %s", key, reason)
        try:
            await self.committer.commit([ColdCopyAborted(key=key, ts_ms=self.clock.now_ms(), reason=reason)])
        except Exception:
            log.exception("could not journal the abort of %s (reconciliation will find it)", key)
            return
        try:
            await self.store.delete(key)
        except Exception as exc:  # an orphan now: reconciliation deletes it after the grace delay
            log.warning("could not delete abandoned large body %s (reconciliation will): %s", key, exc)


class _Hashing:
    """A large body's integrity digest contribution, hashed as it streams for the record at ``start``."""

    def __init__(self, s: Stream, start: int, size: int) -> None:
        self.uid = s.uid
        self.start = start
        self.size = size
        self.state: HashState = RecordHasher(s.bucket, s.path, s.incarnation).begin(start, size)

    def hashed_for(self, s: Stream, start: int) -> bool:
        """Whether this is the hash of the record at ``start`` of ``s`` (not of a stream since re-created)."""
        return self.uid == s.uid and self.start == start

    async def feed(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``body``, unchanged, hashing every chunk on its way to the store."""
        async for chunk in body:
            self.state.update(chunk)
            yield chunk

    async def rehash(self, store: ObjectStore, key: str, digest: PayloadDigest) -> None:
        """Hash the stored body (its blocks checked as they are read), a few blocks at a time."""
        for a in range(0, self.size, _REHASH_SPAN):
            self.state.update(await read_payload(store, key, digest, a, min(self.size, a + _REHASH_SPAN)))

    @property
    def value(self) -> int:
        return hash_value(self.state)


async def _drain(body: AsyncIterator[bytes]) -> None:
    """Read a body to its end and drop it (a duplicate's: the client is answered once it has sent it)."""
    async for _ in body:
        pass
