"""Access-control state: the tokens tiered issued (by id, hashes only) and the public-read buckets.

A ``StateExtension`` of ``StreamState``: journaled, replayed and snapshotted
with everything else. ``decide_*`` return records or raise ``TieredError``
having changed nothing; ``apply`` moves the state. Minting the secret is the
shell's job (``tokens.mint``): records carry only its hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import validate_bucket, validate_stream_path
from tiered.engine.auth.credentials import (
    MAX_TIME_MS,
    SCOPES,
    Grant,
    Principal,
    normalize_prefix,
    parse_scope,
)
from tiered.engine.auth.records import AUTH_RECORD_TYPES, BucketAccessSet, TokenIssued, TokenRevoked

MAX_NAME = 200


@dataclass(slots=True)
class Token:
    id: str
    bucket: str
    scope: str
    prefix: str | None
    name: str | None
    created_ms: int
    expires_ms: int | None
    secret_sha256: bytes
    principal: Principal = field(init=False)

    # Derived from the fields above when applied or restored.
    SOFT_STATE: ClassVar[tuple[str, ...]] = ("principal",)

    def __post_init__(self) -> None:
        self.principal = Principal(
            id=self.id,
            kind="token",
            grants=(Grant(self.bucket, SCOPES[self.scope], self.prefix),),
            expires_ms=self.expires_ms,
        )

    def view(self, now_ms: int) -> dict[str, Any]:
        """What the admin API shows: never the secret, never its hash."""
        return {
            "id": self.id,
            "bucket": self.bucket,
            "scope": self.scope,
            "prefix": self.prefix,
            "name": self.name,
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
            "expired": self.expires_ms is not None and now_ms >= self.expires_ms,
        }


class _TokenSnap(msgspec.Struct, array_like=True):
    id: str
    bucket: str
    scope: str
    prefix: str | None
    name: str | None
    created_ms: int
    expires_ms: int | None
    secret_sha256: bytes


class _AuthSnap(msgspec.Struct, array_like=True):
    version: int
    tokens: list[_TokenSnap]
    public_read: dict[str, int]


class AuthState:
    """Tokens and public-read buckets; a ``StateExtension``."""

    name = "auth"
    record_types: tuple[type, ...] = AUTH_RECORD_TYPES

    def __init__(self) -> None:
        self.tokens: dict[str, Token] = {}
        self.public_read: dict[str, int] = {}  # bucket -> since (ms)

    # ------------------------------------------------------------- decide

    def decide_issue(
        self,
        *,
        token_id: str,
        secret_sha256: bytes,
        bucket: str,
        scope: str,
        prefix: str | None,
        name: str | None,
        expires_ms: int | None,
        buckets: dict[str, int],
        now_ms: int,
    ) -> TokenIssued:
        validate_bucket(bucket)
        if bucket not in buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
        parse_scope(scope)
        prefix = normalize_prefix(prefix)
        if prefix is not None:
            validate_stream_path(prefix)
        if name is not None and (len(name) > MAX_NAME or not name.isprintable()):
            raise bad_request(f"name must be at most {MAX_NAME} printable characters")
        if expires_ms is not None and expires_ms <= now_ms:
            raise bad_request("the token would already have expired")
        if expires_ms is not None and expires_ms > MAX_TIME_MS:
            raise bad_request(f"expires_ms must be at most {MAX_TIME_MS} (the end of year 9999)")
        if token_id in self.tokens:
            raise bad_request("token id collision; try again")
        return TokenIssued(
            id=token_id,
            bucket=bucket,
            scope=scope,
            prefix=prefix,
            name=name,
            created_ms=now_ms,
            expires_ms=expires_ms,
            secret_sha256=secret_sha256,
        )

    def decide_rotate(
        self, old_id: str, *, token_id: str, secret_sha256: bytes, grace_ms: int, now_ms: int
    ) -> TokenIssued:
        """A new token like ``old_id``; the old one stays valid ``grace_ms`` more (0: ends now)."""
        old = self.get(old_id)
        if grace_ms < 0:
            raise bad_request("grace_s must not be negative")
        if now_ms + grace_ms > MAX_TIME_MS:
            raise bad_request("grace_s is too large: the grace would end after year 9999")
        if old.expires_ms is not None and old.expires_ms <= now_ms:
            raise bad_request("an expired token cannot be rotated; issue a new one")
        return TokenIssued(
            id=token_id,
            bucket=old.bucket,
            scope=old.scope,
            prefix=old.prefix,
            name=old.name,
            created_ms=now_ms,
            expires_ms=old.expires_ms,
            secret_sha256=secret_sha256,
            replaces=old.id,
            replaced_until_ms=now_ms + grace_ms,
        )

    def decide_install(self, record: TokenIssued, buckets: dict[str, int]) -> list[TokenIssued]:
        """A token another node minted, installed here as it is (cluster mode): idempotent by id.

        The record is the one every shard gets (id, hash, bucket, scope,
        prefix, expiry, rotation grace, and the minting node's time), so each
        shard judges a token the same. The same record again changes nothing;
        another record under a known id is refused.
        """
        validate_bucket(record.bucket)
        if record.bucket not in buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {record.bucket!r} does not exist")
        parse_scope(record.scope)
        if normalize_prefix(record.prefix) != record.prefix:
            raise bad_request("the prefix is not normalized")
        if record.prefix is not None:
            validate_stream_path(record.prefix)
        if record.name is not None and (len(record.name) > MAX_NAME or not record.name.isprintable()):
            raise bad_request(f"name must be at most {MAX_NAME} printable characters")
        if len(record.secret_sha256) != 32:
            raise bad_request("secret_sha256 must be a SHA-256 digest")
        if (record.replaces is None) != (record.replaced_until_ms is None):
            raise bad_request("a rotation names the token it replaces and until when")
        known = self.tokens.get(record.id)
        if known is None:
            return [record]
        same = (
            known.bucket,
            known.scope,
            known.prefix,
            known.name,
            known.created_ms,
            known.expires_ms,
            known.secret_sha256,
        ) == (
            record.bucket,
            record.scope,
            record.prefix,
            record.name,
            record.created_ms,
            record.expires_ms,
            record.secret_sha256,
        )
        if not same:
            raise bad_request("token id collision: another token has this id")
        return []

    def decide_revoke(self, token_id: str, now_ms: int) -> TokenRevoked:
        self.get(token_id)
        return TokenRevoked(id=token_id, ts_ms=now_ms)

    def decide_public(
        self, bucket: str, public_read: bool, buckets: dict[str, int], now_ms: int
    ) -> list[Any]:
        if bucket not in buckets:
            raise TieredError(ErrorCode.BUCKET_NOT_FOUND, f"bucket {bucket!r} does not exist")
        if public_read == (bucket in self.public_read):
            return []
        return [BucketAccessSet(bucket=bucket, public_read=public_read, ts_ms=now_ms)]

    def get(self, token_id: str) -> Token:
        token = self.tokens.get(token_id)
        if token is None:
            raise TieredError(ErrorCode.TOKEN_NOT_FOUND, "no such token")
        return token

    # ------------------------------------------------------------- apply

    def apply(self, record: Any) -> None:
        if isinstance(record, TokenIssued):
            self.tokens[record.id] = Token(
                record.id,
                record.bucket,
                record.scope,
                record.prefix,
                record.name,
                record.created_ms,
                record.expires_ms,
                record.secret_sha256,
            )
            old = self.tokens.get(record.replaces) if record.replaces is not None else None
            if old is not None and record.replaced_until_ms is not None:
                if record.replaced_until_ms <= record.created_ms:
                    del self.tokens[old.id]
                elif old.expires_ms is None or record.replaced_until_ms < old.expires_ms:
                    self.tokens[old.id] = Token(
                        old.id,
                        old.bucket,
                        old.scope,
                        old.prefix,
                        old.name,
                        old.created_ms,
                        record.replaced_until_ms,
                        old.secret_sha256,
                    )
        elif isinstance(record, TokenRevoked):
            self.tokens.pop(record.id, None)
        elif isinstance(record, BucketAccessSet):
            if record.public_read:
                self.public_read[record.bucket] = record.ts_ms
            else:
                self.public_read.pop(record.bucket, None)
        else:
            raise TypeError(f"auth state does not apply {type(record).__name__}")

    # ------------------------------------------------------------- snapshot

    def snapshot(self) -> bytes:
        tokens = [
            _TokenSnap(t.id, t.bucket, t.scope, t.prefix, t.name, t.created_ms, t.expires_ms, t.secret_sha256)
            for _, t in sorted(self.tokens.items())
        ]
        return msgspec.msgpack.encode(_AuthSnap(1, tokens, dict(sorted(self.public_read.items()))))

    def restore(self, data: bytes) -> None:
        snap = msgspec.msgpack.decode(data, type=_AuthSnap)
        self.tokens = {
            t.id: Token(
                t.id, t.bucket, t.scope, t.prefix, t.name, t.created_ms, t.expires_ms, t.secret_sha256
            )
            for t in snap.tokens
        }
        self.public_read = dict(snap.public_read)
