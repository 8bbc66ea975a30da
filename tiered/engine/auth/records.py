"""Journal records of access control: tiered-issued tokens and public-read buckets.

Only a token's SHA-256 hash is journaled, never the token. A rotation is one
record (the new token, and until when the old one it replaces stays valid), so
a crash cannot leave half a rotation.
"""

from __future__ import annotations

import msgspec


class _AuthRecord(msgspec.Struct, array_like=True, frozen=True, tag_field="t"):
    pass


class TokenIssued(_AuthRecord, frozen=True, tag="auth.token.issue.v1"):
    id: str  # public: listed, revoked by it; part of the token text
    bucket: str
    scope: str  # "read" | "write" | "admin"
    prefix: str | None  # stream-path prefix the token is limited to
    name: str | None  # the operator's label
    created_ms: int
    expires_ms: int | None
    secret_sha256: bytes
    replaces: str | None = None  # rotation: the token this one replaces...
    replaced_until_ms: int | None = None  # ...which stays valid until then


class TokenRevoked(_AuthRecord, frozen=True, tag="auth.token.revoke.v1"):
    id: str
    ts_ms: int


class BucketAccessSet(_AuthRecord, frozen=True, tag="auth.bucket-access.v1"):
    """A bucket's streams readable without a credential (or no longer)."""

    bucket: str
    public_read: bool
    ts_ms: int


AuthRecord = TokenIssued | TokenRevoked | BucketAccessSet
AUTH_RECORD_TYPES: tuple[type, ...] = (TokenIssued, TokenRevoked, BucketAccessSet)
