"""Every refusal and failure a client can see: one exception, one table of codes.

The core (state machines, services) speaks no HTTP: it raises ``TieredError``
with an ``ErrorCode`` and structured context (the stream's tail, the expected
and received sequence numbers, the current epoch or holder...). One module in
the HTTP layer, ``tiered.api.kit.errors``, turns a code into a status, headers and
the body every error has::

    {"error": {"code": "STREAM_CLOSED", "message": "...", ...context}}

Lower layers have their own exceptions, which the shells translate into codes
at the boundary where they are caught:

==============================  ============================  ========================
raised by                       exception                     becomes
==============================  ============================  ========================
``tiered.hot`` (segment log)    ``DamagedRecordError``        ``DATA_DAMAGED``
``tiered.hot`` (recovery)       ``CorruptSegmentError``       refuses to start
``tiered.cold`` (Parquet read)  ``ColdDataDamaged``           ``DATA_DAMAGED``
``tiered.cold`` (object store)  ``ObjectNotFound``            ``DATA_DAMAGED`` (reads)
``tiered.cold`` (object store)  ``ObjectStoreError``          ``STORE_UNAVAILABLE``
``tiered.engine.journal``              ``JournalFailed``             ``JOURNAL_FAILED``
``tiered.engine.jobs.claim``           ``PrefixClaimed``             refuses to start
==============================  ============================  ========================
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    # Requests the server will not accept as sent (400, 405, 413).
    BAD_REQUEST = "BAD_REQUEST"  # malformed input; the message says what
    INVALID_REQUEST = "INVALID_REQUEST"  # the subscription APIs' name for BAD_REQUEST
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    NOT_FOUND = "NOT_FOUND"  # no such route
    # Streams and buckets.
    STREAM_NOT_FOUND = "STREAM_NOT_FOUND"
    STREAM_DELETED = "STREAM_DELETED"  # 410: soft-deleted, living on for its forks
    OFFSET_GONE = "OFFSET_GONE"  # 410: below the retained offset (context: next_offset)
    OFFSET_BEYOND_TAIL = "OFFSET_BEYOND_TAIL"
    STREAM_EXISTS = "STREAM_EXISTS"  # 409: a different configuration holds the path
    PATH_OFFSETS_USED = "PATH_OFFSETS_USED"  # 409: a fork would serve old offsets of its path (fence)
    STREAM_CLOSED = "STREAM_CLOSED"  # 409 (context: next_offset)
    CONTENT_TYPE_MISMATCH = "CONTENT_TYPE_MISMATCH"
    STALE_PRODUCER_EPOCH = "STALE_PRODUCER_EPOCH"  # 403 (context: epoch)
    PRODUCER_SEQ_GAP = "PRODUCER_SEQ_GAP"  # 409 (context: expected_seq, received_seq)
    STREAM_SEQ_REGRESSION = "STREAM_SEQ_REGRESSION"
    FORK_SOURCE_NOT_FOUND = "FORK_SOURCE_NOT_FOUND"
    FORK_SOURCE_DELETED = "FORK_SOURCE_DELETED"
    BUCKET_NOT_FOUND = "BUCKET_NOT_FOUND"
    BUCKET_ERASED = "BUCKET_ERASED"  # 409: the name is fenced forever
    BUCKET_ALREADY_ERASED = "BUCKET_ALREADY_ERASED"  # 410
    DEFAULT_BUCKET_PROTECTED = "DEFAULT_BUCKET_PROTECTED"
    # Capacity and availability (503 + Retry-After; context: retry_after_s).
    HOT_TIER_FULL = "HOT_TIER_FULL"
    TOO_MANY_READERS = "TOO_MANY_READERS"
    JOURNAL_FAILED = "JOURNAL_FAILED"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    COLD_NOT_READY = "COLD_NOT_READY"
    UNAVAILABLE = "UNAVAILABLE"  # the subscription and group APIs' name for it
    # Scale-out (context: shard, retry_after_s; the owner's URL when known).
    SHARD_NOT_OWNED = "SHARD_NOT_OWNED"  # this node holds no valid lease on the shard (yet)
    SHARD_FENCED = "SHARD_FENCED"  # a higher epoch took the shard over; this node stopped serving it
    # Stored bytes that fail their checksum: 502, never retried blindly.
    DATA_DAMAGED = "DATA_DAMAGED"
    # Credentials.
    UNAUTHORIZED = "UNAUTHORIZED"  # 401 + WWW-Authenticate
    FORBIDDEN = "FORBIDDEN"  # 403
    ADMIN_DISABLED = "ADMIN_DISABLED"  # 403: no admin token configured (open only with auth off, on loopback)
    TOKEN_NOT_FOUND = "TOKEN_NOT_FOUND"  # 404: no tiered-issued token with that id (admin API)
    # Bucket quotas (context: quota, limit; rates also retry_after_s).
    RATE_LIMITED = "RATE_LIMITED"  # 429 + Retry-After: a rate or concurrency quota
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"  # 507: a size quota (streams, retained bytes); waiting does not help
    # Subscriptions (the protocol's codes).
    WEBHOOK_URL_REJECTED = "WEBHOOK_URL_REJECTED"
    TOKEN_INVALID = "TOKEN_INVALID"
    TOKEN_EXPIRED = "TOKEN_EXPIRED"
    SUBSCRIPTION_NOT_FOUND = "SUBSCRIPTION_NOT_FOUND"
    SUBSCRIPTION_ALREADY_EXISTS = "SUBSCRIPTION_ALREADY_EXISTS"
    FENCED = "FENCED"  # subscriptions and groups (context: generation, reason, incarnation)
    ALREADY_CLAIMED = "ALREADY_CLAIMED"  # context: current_holder, generation
    NO_PENDING_WORK = "NO_PENDING_WORK"
    INVALID_OFFSET = "INVALID_OFFSET"
    # Consumer groups.
    GROUP_NOT_FOUND = "GROUP_NOT_FOUND"
    GROUP_EXISTS = "GROUP_EXISTS"
    NOT_MEMBER = "NOT_MEMBER"
    TOO_MANY_MEMBERS = "TOO_MANY_MEMBERS"  # context: limit
    TOO_MANY_STREAMS = "TOO_MANY_STREAMS"  # context: limit
    STALE_REVISION = "STALE_REVISION"  # context: revision
    # Stream snapshots (tiered/engine/streams/snapshots.py).
    SNAPSHOT_NOT_FOUND = "SNAPSHOT_NOT_FOUND"  # 404: no snapshot at that offset (any more)
    SNAPSHOT_CONFLICT = "SNAPSHOT_CONFLICT"  # 409: another body at that offset (context: snapshot_offset)
    SNAPSHOT_STALE = "SNAPSHOT_STALE"  # 409: a newer snapshot exists (context: snapshot_offset)
    SNAPSHOT_PRECONDITION_FAILED = "SNAPSHOT_PRECONDITION_FAILED"  # 412: If-Match names another snapshot
    SNAPSHOT_NOT_AT_BOUNDARY = "SNAPSHOT_NOT_AT_BOUNDARY"  # 400: the offset splits a message
    # A bug: anything else that escapes a handler (logged with its traceback).
    INTERNAL_ERROR = "INTERNAL_ERROR"
    # Issue 22: a conditional append whose expected tail is not the stream's (412; context: next_offset).
    TAIL_MISMATCH = "TAIL_MISMATCH"
    # Issue 21: ``GET {stream}?key=K`` of a keyed stream that holds no live message of that key (404).
    KEY_NOT_FOUND = "KEY_NOT_FOUND"
    # Issue 21, per-append keys (400, nothing stored): a malformed ``Stream-Key`` or
    # ``Stream-Key-Tombstone`` (empty, too long, control characters, a tombstone with a body)...
    STREAM_KEY_INVALID = "STREAM_KEY_INVALID"
    # ... an append with a body and no ``Stream-Key`` to a stream keyed by header ...
    STREAM_KEY_REQUIRED = "STREAM_KEY_REQUIRED"
    # ... a ``Stream-Key`` on a stream that is not keyed by header (a JSON pointer's, or not keyed).
    STREAM_KEY_NOT_ALLOWED = "STREAM_KEY_NOT_ALLOWED"


class TieredError(Exception):
    """A request refused (nothing changed) or a failure the client should see.

    ``context`` carries structured details; the HTTP mapper puts them in the
    error body and, for the protocol's headers, in headers.
    """

    def __init__(self, code: ErrorCode, message: str, **context: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.context = context

    def __repr__(self) -> str:
        return f"TieredError({self.code.value}, {self.message!r}, {self.context!r})"


def bad_request(message: str) -> TieredError:
    return TieredError(ErrorCode.BAD_REQUEST, message)
