"""Subscription request bodies and names: what a client may send, normalized, or ``INVALID_REQUEST``.

Pure parsing and validation (no state): ids, stream paths, glob patterns (the
one glob rule, ``tiered.core.globs``), the configuration of a PUT (with the webhook
URL policy of ``webhook_policy``), explicit stream lists, workers and the
wake bodies of callback, ack and release.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import msgspec

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.globs import validate_glob
from tiered.core.ids import parse_offset, validate_stream_path
from tiered.core.parsing import MAX_SAFE_INTEGER, int_field
from tiered.engine.subscriptions.webhook_policy import WebhookUrlRejected, check_webhook_url

WEBHOOK = "webhook"
PULL_WAKE = "pull-wake"
DEFAULT_LEASE_TTL_MS = 30_000
MIN_LEASE_TTL_MS = 1_000
MAX_LEASE_TTL_MS = 600_000
RESERVED_SEGMENT = "__ds"
MAX_ID_BYTES = 256
MAX_DESCRIPTION = 4096
MAX_WORKER = 256

# No spaces, control characters (C0, DEL, C1) or slashes; "." and ".." are not ids either.
_ID_RE = re.compile(r"[^\x00-\x20\x7f-\x9f/\\]+")
_WORKER_RE = re.compile(r"[^\x00-\x1f\x7f-\x9f]+")


def invalid(message: str) -> TieredError:
    return TieredError(ErrorCode.INVALID_REQUEST, message)


def not_found() -> TieredError:
    return TieredError(ErrorCode.SUBSCRIPTION_NOT_FOUND, "Subscription not found")


def fenced() -> TieredError:
    return TieredError(ErrorCode.FENCED, "Wake generation is stale")


def invalid_offset(message: str) -> TieredError:
    return TieredError(ErrorCode.INVALID_OFFSET, message)


def validate_subscription_id(raw: str) -> str:
    if (
        not raw
        or len(raw.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES
        or not _ID_RE.fullmatch(raw)
        or raw in (".", "..")
    ):
        raise invalid(
            f"subscription ids are 1-{MAX_ID_BYTES} bytes without spaces, control characters or slashes, "
            "and not '.' or '..'"
        )
    return raw


def normalize_stream_path(raw: object, what: str = "stream path") -> str:
    """A stream-root-relative path (surrounding slashes dropped), validated, not reserved."""
    if not isinstance(raw, str):
        raise invalid(f"{what} must be a string")
    path = raw.strip("/")
    try:
        validate_stream_path(path, code=ErrorCode.INVALID_REQUEST)
    except TieredError as exc:
        raise invalid(f"{what} {raw!r}: {exc.message}") from None
    if path.split("/", 1)[0] == RESERVED_SEGMENT:
        raise invalid(f"{what} {raw!r} is under the reserved {RESERVED_SEGMENT}/ prefix")
    return path


def normalize_pattern(raw: object) -> str:
    """A glob over stream paths, by the one glob rule (``tiered.core.globs``)."""
    return validate_glob(raw, code=ErrorCode.INVALID_REQUEST)


# ---------------------------------------------------------------- webhook URLs


def validate_webhook_url(raw: object, *, allow_loopback: bool = False) -> str:
    """The webhook URL if the policy (``tiered.webhook_policy``) allows it; ``WEBHOOK_URL_REJECTED`` if not."""
    if not isinstance(raw, str) or not raw:
        raise invalid("webhook subscriptions require webhook.url")
    try:
        return check_webhook_url(raw, allow_loopback=allow_loopback)
    except WebhookUrlRejected as exc:
        raise TieredError(ErrorCode.WEBHOOK_URL_REJECTED, str(exc)) from None


# ---------------------------------------------------------------- request bodies


@dataclass(frozen=True, slots=True)
class SubscriptionConfig:
    type: str
    pattern: str | None
    streams: tuple[str, ...]  # sorted, unique
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None

    def hash(self) -> str:
        """The normalized-configuration hash that decides 200 (same) or 409 (different)."""
        canonical = {
            "type": self.type,
            "pattern": self.pattern,
            "streams": list(self.streams),
            "webhook": {"url": self.webhook_url} if self.webhook_url is not None else None,
            "wake_stream": self.wake_stream,
            "lease_ttl_ms": self.lease_ttl_ms,
            "description": self.description,
        }
        return hashlib.sha256(msgspec.json.encode(canonical, order="sorted")).hexdigest()


def parse_config(
    body: object, *, webhooks_enabled: bool = True, allow_loopback: bool = False
) -> SubscriptionConfig:
    """The subscription configuration in a PUT body, normalized; ``INVALID_REQUEST`` if invalid."""
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object")
    kind = body.get("type")
    if kind not in (WEBHOOK, PULL_WAKE):
        raise invalid('type must be "webhook" or "pull-wake"')
    raw_pattern = body.get("pattern")
    pattern = normalize_pattern(raw_pattern) if raw_pattern not in (None, "") else None
    raw_streams = body.get("streams")
    if raw_streams is None:
        raw_streams = []
    if not isinstance(raw_streams, list):
        raise invalid("streams must be an array of stream paths")
    streams = tuple(sorted({normalize_stream_path(s, "streams entry") for s in raw_streams}))
    if pattern is None and not streams:
        raise invalid("At least one of pattern or streams is required")
    raw_ttl = body.get("lease_ttl_ms")
    lease = (
        DEFAULT_LEASE_TTL_MS
        if raw_ttl is None
        else int_field(
            raw_ttl,
            "lease_ttl_ms",
            minimum=MIN_LEASE_TTL_MS,
            maximum=MAX_LEASE_TTL_MS,
            code=ErrorCode.INVALID_REQUEST,
        )
    )
    description = body.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > MAX_DESCRIPTION):
        raise invalid(f"description must be a string of at most {MAX_DESCRIPTION} characters")
    webhook_url = wake_stream = None
    if kind == WEBHOOK:
        if body.get("wake_stream") is not None:
            raise invalid("wake_stream is only for pull-wake subscriptions")
        if not webhooks_enabled:
            raise invalid("webhook subscriptions are not enabled on this server")
        hook = body.get("webhook")
        if not isinstance(hook, dict) or not hook.get("url"):
            raise invalid("webhook subscriptions require webhook.url")
        webhook_url = validate_webhook_url(hook["url"], allow_loopback=allow_loopback)
    else:
        if body.get("webhook") is not None:
            raise invalid("webhook is only for webhook subscriptions")
        raw_wake = body.get("wake_stream")
        if raw_wake in (None, ""):
            raise invalid("pull-wake subscriptions require wake_stream")
        wake_stream = normalize_stream_path(raw_wake, "wake_stream")
        if wake_stream in streams:
            raise invalid("a subscription's wake_stream cannot also be one of its streams")
    return SubscriptionConfig(kind, pattern, streams, webhook_url, wake_stream, lease, description)


def parse_streams_body(body: object) -> tuple[str, ...]:
    """``{"streams": [...]}`` of POST .../streams: a non-empty array of stream paths."""
    streams = body.get("streams") if isinstance(body, dict) else None
    if not isinstance(streams, list) or not streams:
        raise invalid("streams must be a non-empty array of stream paths")
    return tuple(dict.fromkeys(normalize_stream_path(s, "streams entry") for s in streams))


def parse_worker(body: object) -> str:
    worker = body.get("worker") if isinstance(body, dict) else None
    if (
        not isinstance(worker, str)
        or not worker
        or len(worker) > MAX_WORKER
        or not _WORKER_RE.fullmatch(worker)
    ):
        raise invalid(f"worker must be 1-{MAX_WORKER} characters without control characters")
    return worker


@dataclass(frozen=True, slots=True)
class WakeRequest:
    """The body of callback, ack and release: which wake, and (callback/ack) what was processed."""

    wake_id: str
    generation: int
    acks: tuple[tuple[str, int], ...] = ()
    done: bool = False


def parse_wake_request(body: object, *, with_acks: bool = True) -> WakeRequest:
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object")
    wake_id = body.get("wake_id")
    if not isinstance(wake_id, str) or not wake_id:
        raise invalid("wake_id must be a non-empty string")
    generation = int_field(
        body.get("generation"), "generation", maximum=MAX_SAFE_INTEGER, code=ErrorCode.INVALID_REQUEST
    )
    if not with_acks:
        return WakeRequest(wake_id, generation)
    done = body.get("done", False)
    if not isinstance(done, bool):
        raise invalid("done must be true or false")
    raw_acks = body.get("acks")
    if raw_acks is None:
        raw_acks = []
    if not isinstance(raw_acks, list):
        raise invalid("acks must be an array of {stream, offset}")
    acks = []
    for ack in raw_acks:
        if not isinstance(ack, dict):
            raise invalid("acks must be an array of {stream, offset}")
        stream = ack.get("stream", ack.get("path"))
        offset = ack.get("offset")
        if not isinstance(stream, str) or not isinstance(offset, str):
            raise invalid("each ack needs a stream path and an offset string")
        if offset == "-1":
            raise invalid_offset("Ack offset must not be -1")
        position = parse_offset(offset)
        if position is None:
            raise invalid(f"malformed ack offset {offset!r}")
        acks.append((stream.strip("/"), position))
    return WakeRequest(wake_id, generation, tuple(acks), done)
