"""Admin API of access control (operator routes: the admin token is required).

| request | does |
| --- | --- |
| ``POST /v1/admin/tokens`` ``{"bucket", "scope", "prefix"?, "name"?, "ttl_s"? or "expires_ms"?}`` | issue a token: 201 with ``token`` (shown this once) |
| ``GET /v1/admin/tokens[?bucket=B]`` | list tokens (ids, scopes, expiry; never secrets) |
| ``GET /v1/admin/tokens/{id}`` | one token |
| ``DELETE /v1/admin/tokens/{id}`` | revoke: 204; its live reads end at once |
| ``POST /v1/admin/tokens/{id}/rotate`` ``{"grace_s"?}`` | a new token like it (201); the old one stays valid ``grace_s`` (default 0) |
| ``GET`` / ``PUT /v1/admin/access/{bucket}`` ``{"public_read": bool}`` | whether anyone may read the bucket's streams |
| ``PUT /v1/admin/tokens/{id}`` (``InstallBody``) | internal (cluster mode, signed by a node): install a token another node minted; idempotent |

In cluster mode the node the client reached serves the token routes
(``tiered/cluster/features/token_install.py``): it mints, and installs the same record on
every shard's engine through the internal route.
"""

from __future__ import annotations

import msgspec

from tiered.api.kit.types import Request, Response, json_response
from tiered.core.errors import bad_request
from tiered.core.ids import validate_bucket
from tiered.core.parsing import UInt, decode_body
from tiered.engine.auth import node_call
from tiered.engine.auth import token_format as tokens
from tiered.engine.auth.credentials import token_expiry
from tiered.engine.auth.records import TokenIssued
from tiered.engine.auth.service import AuthService


class IssueBody(msgspec.Struct, forbid_unknown_fields=True):
    bucket: str
    scope: str
    prefix: str | None = None
    name: str | None = None
    ttl_s: UInt | None = None
    expires_ms: UInt | None = None


class RotateBody(msgspec.Struct, forbid_unknown_fields=True):
    grace_s: UInt = 0


class InstallBody(msgspec.Struct, forbid_unknown_fields=True):
    """A token record another node minted, as every shard installs it (the hash in hex, never the secret)."""

    bucket: str
    scope: str
    prefix: str | None
    name: str | None
    created_ms: UInt
    expires_ms: UInt | None
    secret_sha256: str
    replaces: str | None = None
    replaced_until_ms: UInt | None = None

    def record(self, token_id: str) -> TokenIssued:
        try:
            digest = bytes.fromhex(self.secret_sha256)
        except ValueError:
            raise bad_request("secret_sha256 must be hex") from None
        return TokenIssued(
            id=token_id,
            bucket=self.bucket,
            scope=self.scope,
            prefix=self.prefix,
            name=self.name,
            created_ms=self.created_ms,
            expires_ms=self.expires_ms,
            secret_sha256=digest,
            replaces=self.replaces,
            replaced_until_ms=self.replaced_until_ms,
        )

    @classmethod
    def of(cls, record: TokenIssued) -> InstallBody:
        return cls(
            record.bucket,
            record.scope,
            record.prefix,
            record.name,
            record.created_ms,
            record.expires_ms,
            record.secret_sha256.hex(),
            record.replaces,
            record.replaced_until_ms,
        )


class AccessBody(msgspec.Struct, forbid_unknown_fields=True):
    public_read: bool


class AuthRoutes:
    def __init__(self, service: AuthService) -> None:
        self.service = service

    async def issue(self, request: Request) -> Response:
        b = decode_body(await request.body(), IssueBody)
        expires_ms = token_expiry(self.service.clock.now_ms(), b.ttl_s, b.expires_ms)
        view = await self.service.issue(validate_bucket(b.bucket), b.scope, b.prefix, b.name, expires_ms)
        return json_response(view, 201, {"Cache-Control": "no-store"})

    async def list(self, request: Request) -> Response:
        bucket = request.query.get("bucket")
        return json_response({"tokens": self.service.list_tokens(bucket)})

    async def describe(self, request: Request) -> Response:
        return json_response(self.service.describe_token(request.params["id"]))

    async def install_token(self, request: Request) -> Response:
        node_call.require()  # a client cannot choose a token's hash
        token_id = request.params["id"]
        if tokens.split(f"{tokens.PREFIX}{token_id}_x") is None:
            raise bad_request("not a token id")
        record = decode_body(await request.body(), InstallBody).record(token_id)
        created = await self.service.install(record)
        return json_response(self.service.describe_token(token_id), 201 if created else 200)

    async def revoke(self, request: Request) -> Response:
        await self.service.revoke(request.params["id"])
        return Response(204)

    async def rotate(self, request: Request) -> Response:
        raw = await request.body()
        b = decode_body(raw, RotateBody) if raw.strip() else RotateBody()
        view = await self.service.rotate(request.params["id"], b.grace_s * 1000)
        return json_response(view, 201, {"Cache-Control": "no-store"})

    async def get_access(self, request: Request) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        return json_response({"bucket": bucket, "public_read": self.service.public_read(bucket)})

    async def set_access(self, request: Request) -> Response:
        bucket = validate_bucket(request.params["bucket"])
        b = decode_body(await request.body(), AccessBody)
        await self.service.set_public_read(bucket, b.public_read)
        return json_response({"bucket": bucket, "public_read": b.public_read})
