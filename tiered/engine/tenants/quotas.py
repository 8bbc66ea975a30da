"""Per-bucket quotas: what they are, which apply to a bucket, and the size checks (pure).

| quota | refused with |
| --- | --- |
| ``max_streams`` | 507 ``QUOTA_EXCEEDED`` (a create that would exceed it) |
| ``max_retained_bytes`` | 507 ``QUOTA_EXCEEDED`` (an append or create whose bytes, with a new producer's state, would exceed it) |
| ``max_body_bytes`` | 413 ``PAYLOAD_TOO_LARGE`` |
| ``append_bytes_per_s``, ``append_requests_per_s`` | 429 ``RATE_LIMITED`` with ``retry_after_s`` (``ratelimit``) |
| ``max_live_readers`` | 429 ``RATE_LIMITED`` with ``retry_after_s`` |

Every refusal names the quota and its limit in the error body. Boundaries are
exact: the request that reaches a limit succeeds, the next one is refused.
A bucket's quotas are the config's defaults (``--quota-*``, 0 = unlimited)
with the bucket's overrides (admin API; ``null`` = unlimited) on top.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from tiered.core.errors import ErrorCode, TieredError, bad_request


@dataclass(frozen=True, slots=True)
class Quotas:
    """Limits of one bucket; None is unlimited."""

    max_streams: int | None = None
    max_retained_bytes: int | None = None
    append_bytes_per_s: int | None = None
    append_requests_per_s: int | None = None
    max_live_readers: int | None = None
    max_body_bytes: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))


QUOTA_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Quotas))
UNLIMITED = Quotas()
MAX_LIMIT = 2**53 - 1


def from_config(values: Mapping[str, int]) -> Quotas:
    """Config defaults: 0 means unlimited."""
    return Quotas(**{name: (values[name] or None) for name in QUOTA_NAMES if name in values})


def validate_overrides(overrides: Mapping[str, int | None]) -> tuple[tuple[str, int | None], ...]:
    for name, value in overrides.items():
        if name not in QUOTA_NAMES:
            raise bad_request(f"unknown quota {name!r}")
        if value is not None and not (type(value) is int and 0 <= value <= MAX_LIMIT):
            raise bad_request(f"{name} must be an integer from 0 to 2^53 - 1, or null for unlimited")
    return tuple(sorted(overrides.items()))


def effective(defaults: Quotas, overrides: Mapping[str, int | None]) -> Quotas:
    return replace(defaults, **overrides) if overrides else defaults


def check_body(q: Quotas, body_bytes: int) -> None:
    limit = q.max_body_bytes
    if limit is not None and body_bytes > limit:
        raise TieredError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"the body is larger than this bucket's limit of {limit} bytes",
            quota="max_body_bytes",
            limit=limit,
        )


def check_streams(q: Quotas, streams: int, adding: int) -> None:
    limit = q.max_streams
    if limit is not None and adding > 0 and streams + adding > limit:
        raise TieredError(
            ErrorCode.QUOTA_EXCEEDED,
            f"this bucket may hold at most {limit} streams",
            quota="max_streams",
            limit=limit,
        )


def check_retained(q: Quotas, retained: int, adding: int) -> None:
    """``retained``: hot, cold and producer-state bytes (``footprint``); ``adding``: the write's net change."""
    limit = q.max_retained_bytes
    if limit is not None and adding > 0 and retained + adding > limit:
        raise TieredError(
            ErrorCode.QUOTA_EXCEEDED,
            f"this bucket may retain at most {limit} bytes; release data (retention, deletes) or raise the quota",
            quota="max_retained_bytes",
            limit=limit,
        )


def check_sizes(
    q: Quotas, own: tuple[int, int], others: tuple[int, int], new_streams: int, stored_bytes: int
) -> None:
    """The bucket-wide size checks: (streams, retained bytes) held here plus elsewhere, and what a write adds.

    ``others`` is what the bucket holds outside this engine: nothing on a
    single server; in cluster mode the other shards' usage
    (``tiered/cluster/features/bucket_totals.py``), so a quota of N holds for the whole bucket.
    """
    check_streams(q, own[0] + others[0], new_streams)
    check_retained(q, own[1] + others[1], stored_bytes)


def rate_limited(quota: str, limit: int, retry_after_s: int) -> TieredError:
    return TieredError(
        ErrorCode.RATE_LIMITED,
        f"this bucket's {quota} quota ({limit}) is used up; retry after {retry_after_s} s",
        quota=quota,
        limit=limit,
        retry_after_s=retry_after_s,
    )
