"""The authorization model: a ``Principal`` holds per-bucket grants; one rule judges every request.

Scopes are levels, each including the ones below: ``read`` (read streams,
describe the bucket, consume with groups and subscriptions) < ``write``
(create, append to, close and delete streams) < ``admin`` (manage the
bucket's groups and subscriptions, create the bucket). A grant may be limited
to a stream-path prefix, matched on whole segments: prefix ``app1`` covers
``app1`` and ``app1/x``, not ``app10``. Whatever is bucket-wide (groups,
subscriptions, creating the bucket) needs a grant without a prefix.

``authorize`` answers one of four verdicts, in this order:

* ``ALLOW`` - a public-read bucket's reads, the operator, or a grant that covers it;
* ``UNAUTHENTICATED`` (401) - no credential, and the request needs one;
* ``HIDDEN`` (404, exactly as if the bucket or stream did not exist) - no
  grant on the bucket, or none covering the stream's path, so names do not leak;
* ``FORBIDDEN`` (403) - a grant covers it, but with too low a scope (or
  only under a prefix, for a bucket-wide request).

Pure: no clock (expiry is checked when a credential is authenticated), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from tiered.core.errors import ErrorCode, TieredError


class Level(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


#: The latest time a credential may name, 9999-12-31T23:59:59.999Z: a JWT's ``exp``/``nbf``/``iat``
#: (seconds) and a token's expiry or rotation grace (ms) beyond it are refused, so every expiry
#: stays a number the lease arithmetic (``tiered.engine.auth.live``) and JSON clients handle exactly.
MAX_TIME_MS = 253_402_300_799_999
MAX_TIME_S = MAX_TIME_MS // 1000

SCOPES: dict[str, Level] = {"read": Level.READ, "write": Level.WRITE, "admin": Level.ADMIN}
SCOPE_NAMES: dict[Level, str] = {v: k for k, v in SCOPES.items()}


def parse_scope(name: str) -> Level:
    level = SCOPES.get(name)
    if level is None:
        raise TieredError(ErrorCode.BAD_REQUEST, "scope must be 'read', 'write' or 'admin'")
    return level


def token_expiry(now_ms: int, ttl_s: int | None, expires_ms: int | None) -> int | None:
    """A token's expiry from an issue request's ``ttl_s`` or ``expires_ms`` (at most one), within ``MAX_TIME_MS``."""
    if ttl_s is not None and expires_ms is not None:
        raise TieredError(ErrorCode.BAD_REQUEST, "give ttl_s or expires_ms, not both")
    if ttl_s is not None:
        if ttl_s > (MAX_TIME_MS - now_ms) // 1000:
            raise TieredError(
                ErrorCode.BAD_REQUEST, "ttl_s is too large: the token would expire after year 9999"
            )
        return now_ms + ttl_s * 1000
    if expires_ms is not None and expires_ms > MAX_TIME_MS:
        raise TieredError(
            ErrorCode.BAD_REQUEST, f"expires_ms must be at most {MAX_TIME_MS} (the end of year 9999)"
        )
    return expires_ms


def grace_until(now_ms: int, grace_s: int) -> int:
    """When a rotated token's grace ends, within ``MAX_TIME_MS``."""
    if grace_s < 0:
        raise TieredError(ErrorCode.BAD_REQUEST, "grace_s must not be negative")
    if grace_s > (MAX_TIME_MS - now_ms) // 1000:
        raise TieredError(ErrorCode.BAD_REQUEST, "grace_s is too large: the grace would end after year 9999")
    return now_ms + grace_s * 1000


def normalize_prefix(prefix: str | None) -> str | None:
    """A prefix as matched: no leading or trailing '/', empty means none."""
    if prefix is None:
        return None
    prefix = prefix.strip("/")
    return prefix or None


@dataclass(frozen=True, slots=True)
class Grant:
    bucket: str
    level: Level
    prefix: str | None = None  # normalized (``normalize_prefix``)

    def covers(self, path: str) -> bool:
        p = self.prefix
        return p is None or path == p or (path.startswith(p) and path[len(p) : len(p) + 1] == "/")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``id`` names the credential (a token id, ``jwt:<sub>``), never its secret."""

    id: str
    kind: str  # "token" | "jwt" | "operator" | "node" (a node's system call)
    grants: tuple[Grant, ...] = ()
    expires_ms: int | None = None
    operator: bool = False

    def on(self, bucket: str) -> tuple[Grant, ...]:
        return tuple(g for g in self.grants if g.bucket == bucket)


OPERATOR = Principal(id="operator", kind="operator", operator=True)


class Verdict(Enum):
    ALLOW = "allow"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    HIDDEN = "hidden"


def authorize(
    principal: Principal | None,
    bucket: str,
    level: Level,
    *,
    path: str | None = None,
    whole_bucket: bool = False,
    public_read: bool = False,
) -> Verdict:
    """The one scope check (see the module docstring).

    ``path``: the stream the request touches (grants must cover it);
    ``whole_bucket``: the request reaches every stream of the bucket (only
    grants without a prefix count); neither: bucket-level information, which
    any grant on the bucket may see.
    """
    if public_read and level is Level.READ:
        return Verdict.ALLOW
    if principal is None:
        return Verdict.UNAUTHENTICATED
    if principal.operator:
        return Verdict.ALLOW
    best: Level | None = None
    seen = False
    for g in principal.grants:
        if g.bucket != bucket:
            continue
        seen = True
        if whole_bucket and g.prefix is not None:
            continue
        if path is not None and not g.covers(path):
            continue
        if best is None or g.level > best:
            best = g.level
    if not seen:
        return Verdict.HIDDEN
    if best is None:
        # Grants on the bucket, none covering this: a stream outside the prefix
        # is as good as missing; a bucket-wide request is refused openly.
        return Verdict.FORBIDDEN if whole_bucket else Verdict.HIDDEN
    return Verdict.ALLOW if best >= level else Verdict.FORBIDDEN


def visible(principal: Principal | None, bucket: str, *, public_read: bool = False) -> bool:
    """Whether listings show a bucket to this caller."""
    if public_read or (principal is not None and principal.operator):
        return True
    return principal is not None and any(g.bucket == bucket for g in principal.grants)


def listing_prefixes(
    principal: Principal | None, bucket: str, *, public_read: bool = False
) -> tuple[str, ...] | None:
    """The stream-path prefixes a listing of ``bucket`` shows this caller; None: every path.

    Every level includes read, so any grant on the bucket counts; one without
    a prefix (or the operator, or a public-read bucket) shows every stream.
    A caller with no grant on the bucket sees nothing (the access check hid the
    bucket from it already).
    """
    if public_read or (principal is not None and principal.operator):
        return None
    prefixes: list[str] = []
    for g in principal.grants if principal is not None else ():
        if g.bucket == bucket:
            if g.prefix is None:
                return None
            prefixes.append(g.prefix)
    return tuple(prefixes)


# Refusals (``challenge`` becomes the HTTP challenge header, in tiered.api.kit.errors).
CHALLENGE = 'Bearer realm="tiered"'
INVALID_CHALLENGE = 'Bearer realm="tiered", error="invalid_token"'


def unauthenticated() -> TieredError:
    return TieredError(ErrorCode.UNAUTHORIZED, "authentication required", challenge=CHALLENGE)


def invalid_credential(message: str = "the credential is not valid") -> TieredError:
    return TieredError(ErrorCode.UNAUTHORIZED, message, challenge=INVALID_CHALLENGE)


def forbidden() -> TieredError:
    return TieredError(ErrorCode.FORBIDDEN, "the credential does not grant this on this bucket")
