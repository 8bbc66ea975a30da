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
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

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

from .retry import RetryPolicy
from .store import (
    DeleteFailure,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreUnavailable,
    check_range,
    validate_key,
    validate_prefix,
)

__all__ = ["S3Store", "MIN_PART_SIZE", "is_retryable"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB  # S3 rejects smaller non-final parts
MAX_PARTS = 10_000
DELETE_BATCH = 1000  # DeleteObjects limit
# User metadata holding the MD5 of the whole body: lets a HEAD prove an object
# is ours even when the ETag is not an MD5 (multipart, SSE-KMS).
MD5_METADATA = "tiered-md5"

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
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool = False,
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
        prefix = prefix.strip("/")
        validate_prefix(prefix)
        self._bucket = bucket
        self._prefix = f"{prefix}/" if prefix else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self._path_style = path_style
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

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The key prefix in the bucket ('' or ending with '/')."""
        return self._prefix

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
            s3={"addressing_style": "path" if self._path_style else "auto"},
            max_pool_connections=self._max_pool_connections,
        )
        # No key arguments: credentials resolve through the standard AWS chain.
        session = aioboto3.Session(profile_name=self._profile, region_name=self._region)
        stack = AsyncExitStack()
        self._s3 = await stack.enter_async_context(
            session.client("s3", endpoint_url=self._endpoint_url, config=config)
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

    async def head(self, key: str) -> ObjectInfo | None:
        validate_key(key)
        found = await self._head(key)
        return None if found is None else found[0]

    # -- writes ---------------------------------------------------------------

    async def put(self, key: str, data: bytes, *, if_none_match: bool = True) -> ObjectInfo:
        validate_key(key)
        data = bytes(data)
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if len(data) > self._multipart_threshold:
            return await self._put_multipart(key, data, md5, if_none_match)
        return await self._put_single(key, data, md5, if_none_match)

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

    async def _put_single(self, key: str, data: bytes, md5: str, if_none_match: bool) -> ObjectInfo:
        s3 = self._client()
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Key": self._full(key),
            "Body": data,
            "Metadata": {MD5_METADATA: md5},
        }
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
        return ObjectInfo(key, len(data), _etag(resp["ETag"]), _server_time(resp))

    async def _put_multipart(self, key: str, data: bytes, md5: str, if_none_match: bool) -> ObjectInfo:
        s3 = self._client()
        full = self._full(key)
        part_size = max(self._part_size, -(-len(data) // MAX_PARTS))
        created = await self._call(
            f"start upload {key!r}",
            lambda: s3.create_multipart_upload(
                Bucket=self._bucket, Key=full, Metadata={MD5_METADATA: md5}, ChecksumAlgorithm="CRC32"
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
        s3 = self._client()
        count = -(-len(data) // part_size)
        parts: list[dict[str, Any]] = [{} for _ in range(count)]
        md5s = [b""] * count
        gate = asyncio.Semaphore(self._multipart_concurrency)

        async def upload(index: int) -> None:
            async with gate:  # slice inside the gate: at most N parts copied at once
                body = data[index * part_size : (index + 1) * part_size]
                number = index + 1
                resp = await self._call(
                    f"upload part {number}/{count} of {key!r}",
                    lambda: s3.upload_part(
                        Bucket=self._bucket,
                        Key=full,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=body,
                        ChecksumAlgorithm="CRC32",
                    ),
                    key,
                )
                part = {"PartNumber": number, "ETag": resp["ETag"]}
                if resp.get("ChecksumCRC32"):
                    part["ChecksumCRC32"] = resp["ChecksumCRC32"]
                parts[index] = part
                md5s[index] = hashlib.md5(body, usedforsecurity=False).digest()

        try:
            async with asyncio.TaskGroup() as group:
                for index in range(count):
                    group.create_task(upload(index))
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None  # report the first failed part
        return parts, md5s

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
        return ObjectInfo(key, size, _etag(resp["ETag"]), _server_time(resp))

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
    return ObjectStoreError(f"S3 {what}: {_describe(exc)}")


def _etag(raw: str) -> str:
    return raw.strip('"')


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
