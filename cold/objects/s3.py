"""S3Store: the ObjectStore on Amazon S3 (or an S3-compatible service).

Design points, each of which exists because of a failure mode:

* One long-lived aioboto3 client, opened in `open()` and closed in `close()`,
  so connections are pooled instead of re-negotiated per request.
* Credentials come only from the standard AWS chain (env, shared profile,
  container/instance role). There is deliberately no way to pass secret keys,
  so they never end up in flags, configs or process listings.
* Our `RetryPolicy` is the single retry policy: botocore's own retries are
  disabled, and connect/read timeouts are explicit, so an outage surfaces as
  `ObjectStoreUnavailable` after a bounded time instead of hanging. Uploads
  drop "Expect: 100-continue" (aiohttp waits for it without any timeout), and
  a per-attempt deadline backs up the socket timeouts.
* Writes are conditional creates (`If-None-Match: *`, on PutObject or on
  CompleteMultipartUpload). When an attempt fails ambiguously (the request
  may have been applied) and a retry then gets 412, we HEAD the key and
  compare size and MD5 to tell "our earlier attempt landed" from "someone
  else's object is there".
* Compare-and-set replaces (`put(..., if_match=etag)`, `If-Match`) are single
  PutObjects carrying a random write id in their metadata; after an ambiguous
  attempt a 412 is settled by HEAD: our write id there means our attempt
  landed (success), anything else is a `PreconditionFailed` that says the
  outcome is unknown.
* S3-compatible stores differ from AWS in ways that matter for safety, so
  `probe_conditional_writes()` checks them against the real store instead of
  trusting it: a store that ignores `If-None-Match`/`If-Match` is refused
  loudly (`ConditionalWritesUnsupported`) rather than used silently unsafe.
  Measured on Ceph RGW 16 (pacific): `If-Match` matches only the unquoted
  ETag (the probe finds the form that works and remembers it); conditions on
  CompleteMultipartUpload are ignored (the probe notices, and conditional
  creates then go out as one PutObject, which honours them);
  CompleteMultipartUpload answers with an empty ETag (we HEAD for it); over
  HTTPS, aws-chunked uploads with trailing checksums fail with 411 (see
  `checksum_mode`).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar, get_args

import aioboto3
import aiohttp
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from tiered.cold.objects.retry import RetryPolicy
from tiered.cold.objects.store import (
    ConditionalWritesUnsupported,
    DeleteFailure,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    PreconditionFailed,
    StoredObject,
    check_range,
    validate_key,
    validate_prefix,
)

__all__ = [
    "AddressingStyle",
    "ChecksumMode",
    "ConditionalWriteSupport",
    "S3Store",
    "MAX_SINGLE_PUT",
    "MIN_PART_SIZE",
    "PROBE_KEY_PREFIX",
    "is_retryable",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3 rejects smaller non-final parts
MAX_PARTS = 10_000
MAX_SINGLE_PUT = 5 * 1024 * MiB  # S3's limit for one PutObject
DELETE_BATCH = 1000  # DeleteObjects limit
# User metadata holding the MD5 of the whole body: lets a HEAD prove an object
# is ours even when the ETag is not an MD5 (multipart, SSE-KMS).
MD5_METADATA = "tiered-md5"
# User metadata holding a random id per compare-and-set put: after an ambiguous
# attempt, a HEAD that shows it proves that *this* call's write landed (equal
# bytes written by someone else would not).
WRITE_ID_METADATA = "tiered-write-id"
# Where probe_conditional_writes() writes its throwaway object (under the prefix).
PROBE_KEY_PREFIX = "_tiered/probe-conditional-"

ChecksumMode = Literal["when_required", "when_supported"]
AddressingStyle = Literal["path", "virtual", "auto"]
IfMatchForm = Literal["quoted", "unquoted"]


@dataclass(frozen=True, slots=True)
class ConditionalWriteSupport:
    """What `S3Store.probe_conditional_writes()` found out about a store.

    if_none_match: PutObject with `If-None-Match: *` refuses an existing key
    (always True in a returned result: otherwise the probe raises).
    if_match_form: how `If-Match` must carry an ETag for the store to match it:
    "quoted" as S3 returns ETags (AWS, moto), or "unquoted" (Ceph RGW).
    multipart_if_none_match: CompleteMultipartUpload honours `If-None-Match: *`;
    when False, conditional creates are sent as one PutObject (up to 5 GiB).
    """

    if_none_match: bool
    if_match_form: IfMatchForm
    multipart_if_none_match: bool


# Error codes worth retrying even when the HTTP status alone would not say so.
_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
        "OperationAborted",  # 409: a conflicting operation is in progress
        "ConditionalRequestConflict",  # 409: concurrent conditional write, retry
    }
)
# Transport-level failures: connection refused/reset, timeouts, short bodies.
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    HTTPClientError,  # includes ReadTimeoutError, ConnectionClosedError
    BotoConnectionError,  # includes EndpointConnectionError, ConnectTimeoutError
    IncompleteReadError,
    FlexibleChecksumError,  # response body corrupted in transit
    aiohttp.ClientError,
    TimeoutError,
)
# Everything the SDK/transport can raise; anything else is a bug and propagates.
_BACKEND_ERRORS: tuple[type[Exception], ...] = (ClientError, BotoCoreError, *_TRANSPORT_ERRORS)


def is_retryable(exc: Exception) -> bool:
    """True for failures that may succeed if the same request is repeated."""
    if isinstance(exc, ClientError):
        status = _status(exc)
        # 501 means "not supported here"; retrying cannot help.
        return _code(exc) in _RETRYABLE_CODES or status == 429 or (status >= 500 and status != 501)
    return isinstance(exc, _TRANSPORT_ERRORS)


class S3Store:
    """ObjectStore on an S3 bucket, with every key stored under `prefix`.

    Use `await S3Store(...).open()` or `async with S3Store(...) as store`.
    connect_timeout/read_timeout bound each connect and each socket read;
    attempt_timeout bounds one whole HTTP attempt (including body transfer) as
    a backstop for any wait the transport leaves unbounded; None disables it.
    Objects larger than `multipart_threshold` are uploaded in parts of
    `part_size` bytes (at least 5 MiB; grown if needed to stay within 10,000
    parts), `multipart_concurrency` at a time.

    Options for S3-compatible stores (Ceph RGW, MinIO, ...):

    * `endpoint_url`: the store's URL.
    * `addressing_style`: "path" (`https://host/bucket/key`), "virtual"
      (`https://bucket.host/key`) or "auto" (botocore decides: virtual on AWS
      when the bucket name allows it). Default: "path" if `path_style`, else
      "auto"; `path_style=True` is the older spelling of "path".
    * `ca_bundle`: a PEM file of CA certificates to verify the store's TLS
      certificate against (a private CA); default: the system's trust store.
    * `checksum_mode`: botocore's `request_checksum_calculation` and
      `response_checksum_validation`. "when_supported" sends flexible
      checksums (CRC32) with every upload and validates them on downloads
      when present; "when_required" sends them only where the API requires
      one. Default: "when_supported" on AWS (no `endpoint_url`), where S3
      verifies them end to end; "when_required" with an `endpoint_url`,
      because other stores often cannot take them: over HTTPS botocore
      (>= 1.36) sends them as aws-chunked trailers, which Ceph RGW 16 refuses
      with 411 MissingContentLength, and stores that accept them often do not
      verify them (RGW 16 does not). In "when_required" mode every upload
      and part carries `Content-MD5` instead, the integrity check every S3
      dialect has (RGW verifies it: BadDigest), so a body damaged in transit
      is still refused where the store checks it. Downloads are checked by
      the cold tier's own CRC32C either way.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool = False,
        addressing_style: AddressingStyle | None = None,
        checksum_mode: ChecksumMode | None = None,
        ca_bundle: str | None = None,
        profile: str | None = None,
        retry: RetryPolicy | None = None,
        connect_timeout: float = 3.0,
        read_timeout: float = 15.0,
        attempt_timeout: float | None = 300.0,
        multipart_threshold: int = 8 * MiB,
        part_size: int = 8 * MiB,
        multipart_concurrency: int = 4,
        list_page_size: int = 1000,
        max_pool_connections: int = 32,
    ) -> None:
        if not bucket:
            raise ValueError("bucket is required")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be >= {MIN_PART_SIZE} bytes (S3 minimum), got {part_size}")
        if multipart_threshold < 1:
            raise ValueError("multipart_threshold must be positive")
        if not 1 <= list_page_size <= 1000:
            raise ValueError("list_page_size must be in 1..1000")
        if multipart_concurrency < 1:
            raise ValueError("multipart_concurrency must be >= 1")
        if (
            connect_timeout <= 0
            or read_timeout <= 0
            or (attempt_timeout is not None and attempt_timeout <= 0)
        ):
            raise ValueError("timeouts must be positive")
        if addressing_style is None:
            addressing_style = "path" if path_style else "auto"
        elif addressing_style not in get_args(AddressingStyle):
            raise ValueError(
                f"addressing_style must be 'path', 'virtual' or 'auto', got {addressing_style!r}"
            )
        elif path_style and addressing_style != "path":
            raise ValueError(f"path_style=True contradicts addressing_style={addressing_style!r}")
        if checksum_mode is None:
            checksum_mode = "when_supported" if endpoint_url is None else "when_required"
        elif checksum_mode not in get_args(ChecksumMode):
            raise ValueError(
                f"checksum_mode must be 'when_required' or 'when_supported', got {checksum_mode!r}"
            )
        prefix = prefix.strip("/")
        validate_prefix(prefix)
        self._bucket = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self._addressing_style: AddressingStyle = addressing_style
        self._checksum_mode: ChecksumMode = checksum_mode
        self._ca_bundle = ca_bundle
        self._profile = profile
        self._retry = retry or RetryPolicy()
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._attempt_timeout = attempt_timeout
        self._multipart_threshold = multipart_threshold
        self._part_size = part_size
        self._multipart_concurrency = multipart_concurrency
        self._list_page_size = list_page_size
        self._max_pool_connections = max_pool_connections
        self._stack: AsyncExitStack | None = None
        self._s3: Any = None
        # Learned from the store (by the probe, or by put(if_match=...) itself).
        self._if_match_form: IfMatchForm | None = None
        # None: not probed; multipart conditional creates are trusted, as on AWS.
        self._multipart_if_none_match: bool | None = None
        self._conditional_writes: ConditionalWriteSupport | None = None

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The key prefix in the bucket ('' or ending with '/')."""
        return self._prefix

    @property
    def checksum_mode(self) -> ChecksumMode:
        return self._checksum_mode

    @property
    def addressing_style(self) -> AddressingStyle:
        return self._addressing_style

    @property
    def conditional_writes(self) -> ConditionalWriteSupport | None:
        """The last `probe_conditional_writes()` result (None before the first probe)."""
        return self._conditional_writes

    # -- lifecycle ----------------------------------------------------------

    async def open(self) -> S3Store:
        """Create the long-lived client. Makes no request, so it works offline."""
        if self._s3 is not None:
            return self
        config = AioConfig(
            connect_timeout=self._connect_timeout,
            read_timeout=self._read_timeout,
            # One attempt: RetryPolicy is the only retry layer.
            retries={"mode": "standard", "total_max_attempts": 1},
            s3={"addressing_style": self._addressing_style},
            max_pool_connections=self._max_pool_connections,
            request_checksum_calculation=self._checksum_mode,
            response_checksum_validation=self._checksum_mode,
        )
        # No key arguments: credentials resolve through the standard AWS chain.
        session = aioboto3.Session(profile_name=self._profile, region_name=self._region)
        stack = AsyncExitStack()
        self._s3 = await stack.enter_async_context(
            session.client("s3", endpoint_url=self._endpoint_url, config=config, verify=self._ca_bundle)
        )
        # Registered after botocore's own before-call handlers, so this runs last.
        self._s3.meta.events.register("before-call.s3", _drop_expect_continue)
        self._stack = stack
        return self

    async def close(self) -> None:
        stack, self._stack, self._s3 = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> S3Store:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- reads ----------------------------------------------------------------

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> bytes:
        validate_key(key)
        lo, hi = check_range(start, end)
        if hi == lo:  # an empty range has no HTTP Range form; just check existence
            if await self.head(key) is None:
                raise ObjectNotFound(key)
            return b""
        s3 = self._client()
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Key": self._full(key)}
        if lo > 0 or hi is not None:
            kwargs["Range"] = f"bytes={lo}-{'' if hi is None else hi - 1}"

        async def op() -> bytes:
            resp = await s3.get_object(**kwargs)
            body = resp["Body"]
            async with body:
                data: bytes = await body.read()
            if "Range" in kwargs and not resp.get("ContentRange"):
                data = data[lo:hi]  # server ignored Range and sent the whole object
            return data

        try:
            return await self._run(f"get {key!r}", op)
        except ClientError as exc:
            if _code(exc) == "InvalidRange" or _status(exc) == 416:
                return b""  # range starts at/after the end: same as data[lo:hi]
            raise _translate(exc, f"get {key!r}", key) from exc
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, f"get {key!r}", key) from exc

    async def get_with_info(self, key: str) -> StoredObject:
        """The whole object and its metadata, from one GetObject (so the ETag is that version's)."""
        validate_key(key)
        s3 = self._client()

        async def op() -> StoredObject:
            resp = await s3.get_object(Bucket=self._bucket, Key=self._full(key))
            body = resp["Body"]
            async with body:
                data: bytes = await body.read()
            info = ObjectInfo(key, len(data), _etag(resp.get("ETag") or ""), _utc(resp["LastModified"]))
            return StoredObject(info, data)

        what = f"get {key!r}"
        try:
            found = await self._run(what, op)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, what, key) from exc
        if not found.info.etag:
            raise ObjectStoreError(f"S3 {what}: the store answered without an ETag")
        return found

    async def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        found = await self._head(key)
        return None if found is None else found[0]

    # -- writes ---------------------------------------------------------------

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = True, if_match: str | None = None
    ) -> ObjectInfo:
        """Store `data` at `key` (see `ObjectStore.put`); the result's etag is the new ETag.

        `if_match` (an ETag from `head`, `list` or an earlier `put`, quoted or
        not) makes the put a compare-and-set: replace the object only if its
        current ETag is that one, else raise `PreconditionFailed` (also when
        there is no object). It takes precedence over `if_none_match` and is
        always one PutObject, so the body is limited to 5 GiB.
        """
        validate_key(key)
        data = bytes(data)
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if if_match is not None:
            return await self._put_if_match(key, data, md5, if_match)
        if len(data) > self._multipart_threshold:
            if not (if_none_match and self._multipart_if_none_match is False):
                return await self._put_multipart(key, data, md5, if_none_match)
            # The probe found that this store completes multipart uploads over
            # existing objects despite If-None-Match: one PutObject honours it.
            if len(data) > MAX_SINGLE_PUT:
                raise ConditionalWritesUnsupported(
                    f"put {key!r}: this store ignores If-None-Match on multipart uploads and "
                    f"{len(data)} bytes exceed the {MAX_SINGLE_PUT} bytes of a single PutObject"
                )
        return await self._put_single(key, data, md5, if_none_match)

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes], size: int) -> ObjectInfo:
        """Create ``key`` from ``chunks`` (``size`` bytes: a large body, ``payload``) by a multipart upload.

        Parts of ``part_size`` (grown to stay within 10,000 parts) are cut as
        the body arrives and sent ``multipart_concurrency`` at a time, each
        with its checksum (see ``checksum_mode``), so memory holds at most that
        many parts plus the one being filled. Any failure, the body's included,
        or a cancellation aborts the upload: no object and no billable parts
        (a process killed meanwhile leaves an incomplete upload: a bucket
        lifecycle rule, AbortIncompleteMultipartUpload, is the backstop).
        """
        validate_key(key)
        s3 = self._client()
        full = self._full(key)
        part_size = max(self._part_size, -(-size // MAX_PARTS))
        count = max(1, -(-size // part_size))
        created = await self._call(
            f"start upload {key!r}",
            lambda: s3.create_multipart_upload(Bucket=self._bucket, Key=full, **self._upload_checksum()),
            key,
        )
        upload_id: str = created["UploadId"]
        done = False
        try:
            parts, md5s = await self._stream_parts(key, full, upload_id, chunks, part_size, count)
            expected_etag = f"{hashlib.md5(b''.join(md5s), usedforsecurity=False).hexdigest()}-{len(parts)}"
            info = await self._complete(key, full, upload_id, parts, size, "", expected_etag, True)
            done = True
            return info
        finally:
            if not done:
                await self._abort(key, full, upload_id)

    async def _stream_parts(
        self, key: str, full: str, upload_id: str, chunks: AsyncIterator[bytes], part_size: int, count: int
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        uploaded: dict[int, tuple[dict[str, Any], bytes]] = {}
        gate = asyncio.Semaphore(self._multipart_concurrency)
        tasks: set[asyncio.Task[None]] = set()

        async def upload(number: int, body: bytes) -> None:
            try:
                digest = hashlib.md5(body, usedforsecurity=False).digest()
                part = await self._upload_part(key, full, upload_id, number, body, digest, count)
                uploaded[number] = (part, digest)
            finally:
                gate.release()

        async def send(number: int, body: bytes) -> None:
            await gate.acquire()  # at most N parts in flight
            for task in [t for t in tasks if t.done()]:
                tasks.discard(task)
                task.result()  # a failed part ends the upload now
            tasks.add(asyncio.get_running_loop().create_task(upload(number, body)))

        buffer = bytearray()
        number = 0
        try:
            async for chunk in chunks:
                buffer += chunk
                while len(buffer) >= part_size:
                    number += 1
                    await send(number, bytes(buffer[:part_size]))
                    del buffer[:part_size]
            if buffer or number == 0:
                number += 1
                await send(number, bytes(buffer))
            buffer = bytearray()
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        ordered = [uploaded[n] for n in range(1, number + 1)]
        return [part for part, _ in ordered], [digest for _, digest in ordered]

    async def probe_conditional_writes(self) -> ConditionalWriteSupport:
        """Check that the store enforces the conditional writes we rely on, and how.

        Writes a small object at `_tiered/probe-conditional-<random>` under the
        prefix and, in order: creates it with `If-None-Match: *`; creates it
        again, which must be refused; replaces it with `If-Match` and its
        current ETag, quoted and if that is refused unquoted (remembering the
        form that works); replaces it with the now stale ETag, which must be
        refused; checks the object is the one the `If-Match` put wrote; and
        completes a one-part multipart upload over it with `If-None-Match: *`.
        The probe object is deleted at the end.

        Raises `ConditionalWritesUnsupported` if the store silently overwrote
        where it had to refuse, or never honours `If-Match`. A store that
        ignores the condition only on multipart completion is usable: the
        result says so, a warning is logged and conditional creates of this
        store are sent as single PutObjects from then on.
        """
        key = f"{PROBE_KEY_PREFIX}{uuid.uuid4().hex}"
        # Different sizes, so a HEAD tells which write is in place.
        first, second, third = (f"tiered conditional-write probe {n}".encode() * n for n in (1, 2, 3))
        try:
            created = await self._probe_step("create", self.put(key, first))
            try:
                await self._probe_step("create again", self._put_single(key, second, _md5(second), True))
            except ObjectExists:
                pass
            else:
                raise ConditionalWritesUnsupported(
                    "the store ignored If-None-Match: * and overwrote an existing object: "
                    "conditional creates are not safe on it"
                )
            form: IfMatchForm | None = None
            write_id = uuid.uuid4().hex
            for candidate in ("quoted", "unquoted"):
                try:
                    replaced = await self._probe_step(
                        f"If-Match ({candidate})",
                        self._put_replace(
                            key, second, _md5(second), _if_match_value(created.etag, candidate), write_id
                        ),
                    )
                except PreconditionFailed as refused:
                    if refused.outcome_unknown:
                        raise ObjectStoreError(
                            f"conditional-write probe inconclusive: {refused}"
                        ) from refused
                    continue
                form = candidate
                break
            if form is None:
                raise ConditionalWritesUnsupported(
                    "the store refused If-Match with the object's current ETag, quoted and unquoted: "
                    "compare-and-set is not possible on it"
                )
            try:
                await self._probe_step(
                    "stale If-Match",
                    self._put_replace(
                        key, third, _md5(third), _if_match_value(created.etag, form), uuid.uuid4().hex
                    ),
                )
            except PreconditionFailed:
                pass
            else:
                raise ConditionalWritesUnsupported(
                    "the store ignored If-Match with a stale ETag and replaced the object: "
                    "compare-and-set is not safe on it"
                )
            found = await self._head(key)
            if found is None or (found[0].size, found[0].etag) != (len(second), replaced.etag):
                raise ConditionalWritesUnsupported(
                    f"after refusing conditional writes the store holds an unexpected object "
                    f"({found[0] if found else 'none'}; expected {len(second)} bytes, ETag {replaced.etag})"
                )
            multipart = await self._probe_multipart_create(key)
        finally:
            try:
                await self.delete(key)
            except ObjectStoreError as exc:
                log.warning("could not delete the conditional-write probe object %r: %s", key, exc)
        if not multipart:
            log.warning(
                "this S3 store ignores If-None-Match on CompleteMultipartUpload; conditional creates "
                "will be sent as single PutObjects (at most %d bytes)",
                MAX_SINGLE_PUT,
            )
        support = ConditionalWriteSupport(
            if_none_match=True, if_match_form=form, multipart_if_none_match=multipart
        )
        self._if_match_form = form
        self._multipart_if_none_match = multipart
        self._conditional_writes = support
        log.info("S3 conditional writes: %s", support)
        return support

    async def delete(self, key: str) -> None:
        validate_key(key)
        s3 = self._client()
        await self._call(
            f"delete {key!r}", lambda: s3.delete_object(Bucket=self._bucket, Key=self._full(key)), key
        )

    async def delete_many(self, keys: Iterable[str]) -> list[DeleteFailure]:
        # Validate (and de-duplicate) everything first so a bad key deletes nothing.
        unique = list(dict.fromkeys(validate_key(k) for k in keys))
        s3 = self._client()
        failures: list[DeleteFailure] = []
        for i in range(0, len(unique), DELETE_BATCH):
            objects = [{"Key": self._full(k)} for k in unique[i : i + DELETE_BATCH]]
            resp = await self._call(
                f"delete {len(objects)} objects",
                functools.partial(
                    s3.delete_objects, Bucket=self._bucket, Delete={"Objects": objects, "Quiet": True}
                ),
            )
            for err in resp.get("Errors", []):
                failures.append(
                    DeleteFailure(
                        key=self._strip(err.get("Key", "")),
                        code=err.get("Code", ""),
                        message=err.get("Message", ""),
                    )
                )
        return failures

    # -- internals: single and multipart uploads ------------------------------

    def _put_kwargs(self, key: str, data: bytes, md5: str, metadata: dict[str, str]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": self._full(key),
            "Body": data,
            "Metadata": {MD5_METADATA: md5, **metadata},
        }
        if self._checksum_mode == "when_required":
            kwargs["ContentMD5"] = _content_md5(bytes.fromhex(md5))
        return kwargs

    async def _put_single(self, key: str, data: bytes, md5: str, if_none_match: bool) -> ObjectInfo:
        s3 = self._client()
        kwargs = self._put_kwargs(key, data, md5, {})
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        failed_before = _Flag()
        what = f"put {key!r}"
        try:
            resp = await self._run(what, lambda: s3.put_object(**kwargs), on_retry=failed_before.set)
        except ClientError as exc:
            if if_none_match and _is_precondition_failed(exc):
                return await self._settle_conflict(key, len(data), md5, md5, failed_before.value)
            raise _translate(exc, what, key) from exc
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, what, key) from exc
        return await self._put_info(key, len(data), resp)

    async def _put_if_match(self, key: str, data: bytes, md5: str, if_match: str) -> ObjectInfo:
        etag = _etag(if_match)
        if not etag:
            raise ValueError("if_match must be a non-empty ETag")
        if len(data) > MAX_SINGLE_PUT:
            # Stores that honour If-Match on CompleteMultipartUpload are rare (not Ceph RGW, not moto).
            raise ConditionalWritesUnsupported(
                f"put {key!r}: a compare-and-set put is one PutObject, at most {MAX_SINGLE_PUT} bytes"
            )
        write_id = uuid.uuid4().hex
        form = self._if_match_form
        try:
            info = await self._put_replace(key, data, md5, _if_match_value(etag, form or "quoted"), write_id)
        except PreconditionFailed:
            if form is not None:
                raise
            # Not probed yet. Some stores (Ceph RGW) compare If-Match without the
            # quotes S3 puts around ETags, so the quoted form never matches there.
            # If the object's ETag is still the one we sent, the refusal was about
            # the form (and no attempt of ours landed: it would have changed the
            # ETag or, with equal bytes, been recognised by its write id): try the
            # bare ETag, still a conditional write, so still safe.
            current = await self.head(key)
            if current is None or current.etag != etag:
                raise
            info = await self._put_replace(key, data, md5, etag, write_id)
            log.info("S3 store matches If-Match only without quotes; sending bare ETags from now on")
            self._if_match_form = "unquoted"
            return info
        if form is None:
            self._if_match_form = "quoted"
        return info

    async def _put_replace(self, key: str, data: bytes, md5: str, sent: str, write_id: str) -> ObjectInfo:
        """One PutObject with `If-Match: sent`; `write_id` identifies this call across retries."""
        s3 = self._client()
        kwargs = self._put_kwargs(key, data, md5, {WRITE_ID_METADATA: write_id})
        kwargs["IfMatch"] = sent
        failed_before = _Flag()
        what = f"put {key!r} if-match {sent}"
        try:
            resp = await self._run(what, lambda: s3.put_object(**kwargs), on_retry=failed_before.set)
        except ClientError as exc:
            # AWS and moto answer 404 NoSuchKey when there is no object; Ceph RGW 412.
            missing = _code(exc) == "NoSuchKey" or _status(exc) == 404
            if not (missing or _is_precondition_failed(exc)):
                raise _translate(exc, what, key) from exc
            if failed_before.value:
                return await self._settle_replace(key, len(data), write_id)
            detail = "no object at the key" if missing else f"the current ETag is not {_etag(sent)}"
            raise PreconditionFailed(key, detail) from None
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, what, key) from exc
        return await self._put_info(key, len(data), resp)

    async def _settle_replace(self, key: str, size: int, write_id: str) -> ObjectInfo:
        """A compare-and-set was refused after an ambiguous attempt: did that attempt land?

        Our earlier attempt, if applied, changed the ETag, so its own retry is
        refused. The write id in the object's metadata tells our write from any
        other, even one of identical bytes.
        """
        found = await self._head(key)
        if found is not None:
            info, metadata = found
            if metadata.get(WRITE_ID_METADATA) == write_id and info.size == size:
                log.info("put %r: an earlier ambiguous compare-and-set attempt succeeded", key)
                return info
        raise PreconditionFailed(
            key,
            "an earlier attempt failed ambiguously and the object there now is not ours: "
            "that attempt may have been applied and replaced since, or never applied",
            outcome_unknown=True,
        )

    async def _put_info(self, key: str, size: int, resp: dict[str, Any]) -> ObjectInfo:
        """The ObjectInfo of a completed write; HEADs for the ETag if the response had none."""
        etag = _etag(resp.get("ETag") or "")
        if etag:
            return ObjectInfo(key, size, etag, _server_time(resp))
        # Ceph RGW answers CompleteMultipartUpload with an empty ETag.
        found = await self._head(key)
        if found is None:
            raise ObjectStoreError(f"put {key!r}: the store gave no ETag and the object is not there")
        return found[0]

    async def _put_multipart(self, key: str, data: bytes, md5: str, if_none_match: bool) -> ObjectInfo:
        s3 = self._client()
        full = self._full(key)
        part_size = max(self._part_size, -(-len(data) // MAX_PARTS))
        created = await self._call(
            f"start upload {key!r}",
            lambda: s3.create_multipart_upload(
                Bucket=self._bucket, Key=full, Metadata={MD5_METADATA: md5}, **self._upload_checksum()
            ),
            key,
        )
        upload_id: str = created["UploadId"]
        done = False
        try:
            parts, part_md5s = await self._upload_parts(key, full, upload_id, data, part_size)
            # S3's multipart ETag: MD5 of the concatenated part MD5s, then "-<count>".
            expected_etag = (
                f"{hashlib.md5(b''.join(part_md5s), usedforsecurity=False).hexdigest()}-{len(parts)}"
            )
            info = await self._complete(
                key, full, upload_id, parts, len(data), md5, expected_etag, if_none_match
            )
            done = True
            return info
        finally:
            if not done:  # includes cancellation: never leave billable orphan parts
                await self._abort(key, full, upload_id)

    async def _upload_parts(
        self, key: str, full: str, upload_id: str, data: bytes, part_size: int
    ) -> tuple[list[dict[str, Any]], list[bytes]]:
        count = -(-len(data) // part_size)
        parts: list[dict[str, Any]] = [{} for _ in range(count)]
        md5s = [b""] * count
        gate = asyncio.Semaphore(self._multipart_concurrency)

        async def upload(index: int) -> None:
            async with gate:  # slice inside the gate: at most N parts copied at once
                body = data[index * part_size : (index + 1) * part_size]
                number = index + 1
                digest = hashlib.md5(body, usedforsecurity=False).digest()
                parts[index] = await self._upload_part(key, full, upload_id, number, body, digest, count)
                md5s[index] = digest

        try:
            async with asyncio.TaskGroup() as group:
                for index in range(count):
                    group.create_task(upload(index))
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None  # report the first failed part
        return parts, md5s

    def _upload_checksum(self, digest: bytes | None = None) -> dict[str, str]:
        """Integrity arguments of a multipart upload request (see `checksum_mode`)."""
        if self._checksum_mode == "when_supported":
            return {"ChecksumAlgorithm": "CRC32"}
        return {} if digest is None else {"ContentMD5": _content_md5(digest)}

    async def _upload_part(
        self, key: str, full: str, upload_id: str, number: int, body: bytes, digest: bytes, count: int
    ) -> dict[str, Any]:
        s3 = self._client()
        resp = await self._call(
            f"upload part {number}/{count} of {key!r}",
            lambda: s3.upload_part(
                Bucket=self._bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                **self._upload_checksum(digest),
            ),
            key,
        )
        part = {"PartNumber": number, "ETag": resp["ETag"]}
        if resp.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = resp["ChecksumCRC32"]
        return part

    async def _complete(
        self,
        key: str,
        full: str,
        upload_id: str,
        parts: list[dict[str, Any]],
        size: int,
        md5: str,
        expected_etag: str,
        if_none_match: bool,
    ) -> ObjectInfo:
        s3 = self._client()
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": full,
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": parts},
        }
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        failed_before = _Flag()
        what = f"complete upload {key!r}"
        try:
            resp = await self._run(
                what, lambda: s3.complete_multipart_upload(**kwargs), on_retry=failed_before.set
            )
        except ClientError as exc:
            # After an ambiguous attempt, NoSuchUpload can mean "already completed".
            lost = failed_before.value and _code(exc) == "NoSuchUpload"
            if (if_none_match and _is_precondition_failed(exc)) or lost:
                return await self._settle_conflict(key, size, md5, expected_etag, failed_before.value)
            raise _translate(exc, what, key) from exc
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, what, key) from exc
        return await self._put_info(key, size, resp)

    async def _probe_multipart_create(self, key: str) -> bool:
        """Whether CompleteMultipartUpload with If-None-Match: * refuses the existing `key`."""
        s3 = self._client()
        full = self._full(key)
        body = b"tiered multipart probe"
        created = await self._call(
            f"probe: start upload {key!r}",
            lambda: s3.create_multipart_upload(Bucket=self._bucket, Key=full, **self._upload_checksum()),
            key,
        )
        upload_id: str = created["UploadId"]
        completed = False
        try:
            part = await self._upload_part(
                key, full, upload_id, 1, body, hashlib.md5(body, usedforsecurity=False).digest(), 1
            )
            failed_before = _Flag()
            what = f"probe: complete upload {key!r} if-none-match *"
            try:
                await self._run(
                    what,
                    lambda: s3.complete_multipart_upload(
                        Bucket=self._bucket,
                        Key=full,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": [part]},
                        IfNoneMatch="*",
                    ),
                    on_retry=failed_before.set,
                )
            except ClientError as exc:
                if _is_precondition_failed(exc):
                    return True
                if failed_before.value and _code(exc) == "NoSuchUpload":
                    completed = True  # an earlier attempt completed it: over the object
                    return False
                if _status(exc) == 501:
                    return False  # the header is not implemented there
                raise _translate(exc, what, key) from exc
            except _BACKEND_ERRORS as exc:
                raise _translate(exc, what, key) from exc
            completed = True
            return False
        finally:
            if not completed:
                await self._abort(key, full, upload_id)

    async def _probe_step(self, what: str, write: Awaitable[T]) -> T:
        """A probe write; a store that does not implement the header (501) is refused loudly."""
        try:
            return await write
        except ObjectStoreError as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and _status(cause) == 501:
                raise ConditionalWritesUnsupported(
                    f"conditional-write probe, {what}: the store does not implement it ({_describe(cause)})"
                ) from exc
            raise

    async def _abort(self, key: str, full: str, upload_id: str) -> None:
        s3 = self._client()
        try:
            await self._run(
                f"abort upload {key!r}",
                lambda: s3.abort_multipart_upload(Bucket=self._bucket, Key=full, UploadId=upload_id),
            )
        except ClientError as exc:
            if _code(exc) != "NoSuchUpload":  # already completed or aborted is fine
                log.warning("could not abort multipart upload %s of %r: %s", upload_id, key, exc)
        except _BACKEND_ERRORS as exc:
            # A bucket lifecycle rule (AbortIncompleteMultipartUpload) is the backstop.
            log.warning("could not abort multipart upload %s of %r: %s", upload_id, key, exc)

    async def _settle_conflict(
        self, key: str, size: int, md5: str, expected_etag: str, ambiguous: bool
    ) -> ObjectInfo:
        """Decide what a 412 means: our own earlier attempt, or a different object."""
        if not ambiguous:
            raise ObjectExists(key)
        found = await self._head(key)
        if found is None:
            raise ObjectStoreError(f"put {key!r}: precondition failed but the object is gone; retry")
        info, metadata = found
        ours = metadata.get(MD5_METADATA) == md5 or info.etag == expected_etag
        if info.size == size and ours:
            log.info("put %r: an earlier ambiguous attempt succeeded", key)
            return info
        raise ObjectExists(key)

    # -- internals: plumbing ----------------------------------------------------

    async def _head(self, key: str) -> tuple[ObjectInfo, dict[str, str]] | None:
        s3 = self._client()
        what = f"head {key!r}"
        try:
            resp = await self._run(what, lambda: s3.head_object(Bucket=self._bucket, Key=self._full(key)))
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise _translate(exc, what, key) from exc
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, what, key) from exc
        info = ObjectInfo(key, resp["ContentLength"], _etag(resp["ETag"]), _utc(resp["LastModified"]))
        return info, resp.get("Metadata") or {}

    def _client(self) -> Any:
        if self._s3 is None:
            raise ObjectStoreError("S3Store is not open: use `await store.open()` or `async with`")
        return self._s3

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _strip(self, full: str) -> str:
        return full[len(self._prefix) :] if full.startswith(self._prefix) else full

    async def _run(
        self,
        what: str,
        op: Callable[[], Awaitable[T]],
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run op under the retry policy; the final error propagates raw."""

        async def attempt() -> T:
            async with asyncio.timeout(self._attempt_timeout):  # TimeoutError is retryable
                return await op()

        def note(exc: Exception, retry: int, delay: float) -> None:
            log.warning("S3 %s failed (%s); retry %d in %.2fs", what, _describe(exc), retry, delay)
            if on_retry is not None:
                on_retry()

        return await self._retry.run(attempt, retryable=is_retryable, on_retry=note)

    async def _call(self, what: str, op: Callable[[], Awaitable[T]], key: str | None = None) -> T:
        """Run op under the retry policy and translate failures to store errors."""
        try:
            return await self._run(what, op)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, what, key) from exc

    # Last in the class so the method name does not shadow the builtin in annotations.
    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Yield objects under `prefix` in key order, one ListObjectsV2 page at a time."""
        validate_prefix(prefix)
        s3 = self._client()
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Prefix": self._full(prefix),
            "MaxKeys": self._list_page_size,
        }
        while True:
            page = await self._call(f"list {prefix!r}", lambda: s3.list_objects_v2(**kwargs))
            for item in page.get("Contents", []):
                yield ObjectInfo(
                    key=self._strip(item["Key"]),
                    size=item["Size"],
                    etag=_etag(item.get("ETag", "")),
                    last_modified=_utc(item["LastModified"]),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token


class _Flag:
    """Remembers whether any earlier attempt failed (so its outcome is unknown)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True


def _drop_expect_continue(params: dict[str, Any], **_: Any) -> None:
    """Send uploads without "Expect: 100-continue".

    aiohttp waits for the interim "100 Continue" with no timeout at all, so a
    server that accepts the connection but never answers (a wedged proxy or
    load balancer) would hang every upload forever. Our bodies are bounded by
    the part size, so the bandwidth 100-continue saves on a rejected PUT is
    not worth an unbounded wait.
    """
    params.get("headers", {}).pop("Expect", None)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_precondition_failed(exc: ClientError) -> bool:
    return _status(exc) == 412 or _code(exc) == "PreconditionFailed"


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _translate(exc: Exception, what: str, key: str | None) -> ObjectStoreError:
    """Map an SDK/transport error that survived the retry policy to a store error."""
    if is_retryable(exc):
        return ObjectStoreUnavailable(f"S3 {what}: {_describe(exc)}")
    if isinstance(exc, ClientError) and key is not None:
        if _code(exc) == "NoSuchKey" or (_status(exc) == 404 and _code(exc) in ("404", "NotFound")):
            return ObjectNotFound(key)
    if isinstance(exc, ClientError) and _code(exc) == "MissingContentLength":
        return ObjectStoreError(
            f"S3 {what}: {_describe(exc)} (the store does not take aws-chunked uploads with trailing "
            "checksums; use checksum_mode='when_required')"
        )
    return ObjectStoreError(f"S3 {what}: {_describe(exc)}")


def _etag(raw: str) -> str:
    return raw.strip('"')


def _if_match_value(etag: str, form: IfMatchForm) -> str:
    """The If-Match header value for an (unquoted) ETag in the form the store matches."""
    return f'"{etag}"' if form == "quoted" else etag


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _content_md5(digest: bytes) -> str:
    return base64.b64encode(digest).decode("ascii")


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def _server_time(resp: dict[str, Any]) -> datetime:
    """The response's Date header: the server's clock, close to LastModified."""
    raw = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if raw:
        try:
            return _utc(parsedate_to_datetime(raw))
        except (TypeError, ValueError):
            pass
    return datetime.now(UTC)
