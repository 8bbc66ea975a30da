"""Issued tokens in cluster mode: minted once by the node the client reached, installed on every shard.

Every shard's engine authenticates the requests to its streams against its
own token table, so every shard must hold every token. The token routes
(``/v1/admin/tokens...``) are served here, by the node the client reached
(``tiered/cluster/gateway/shard_router.py`` sends them here):

* **issue** (``POST``): the operator's credential is checked here as on a
  single server; the secret is minted here, once; the record (id, SHA-256 of
  the secret, bucket, scope, prefix, name, expiry, this node's time) is
  installed on the bucket's well-known shard first (its refusals are a single
  server's: unknown bucket, bad scope; nothing installed anywhere), then on
  every other shard at once, through the internal route ``PUT
  /v1/admin/tokens/{id}`` (node-signed: ``tiered/cluster/membership/secret.py``; idempotent by id). The
  secret is shown only when every shard has the token. If any shard failed,
  the id is revoked on every shard (best effort, idempotent) and the answer is
  503 with a retry hint: the secret was never shown, so whatever a shard kept
  cannot be used (an install still in flight to an unreachable owner may
  land after the revocation: a 256-bit secret nobody saw).
* **rotate** (``POST .../{id}/rotate``): the old token is read from the
  token shard (``(default, "")``'s), the new record (``replaces``, until
  ``now + grace``) installed on every *other* shard first and on the token
  shard last, so a failed rotation (503, the new id revoked everywhere) leaves
  the old token on the token shard and the retry finds it; the shards that did
  apply it already started the old token's grace, as the operator asked.
* **revoke** (``DELETE .../{id}``): sent to every shard at once; 204 when any
  shard knew it and every other did not (already revoked there), 404 when
  none did, 503 with a retry hint when a shard could not be asked (the token
  may still work there: retry, revoking is idempotent).
* **list** and **describe** (``GET``): one shard's table, not merged: the
  bucket's well-known shard for ``?bucket=B`` (where an issue installs first),
  else the token shard. Every shard holds the same table once an issue or
  revoke answered, and one table is a consistent answer, where a merge would
  also show tokens whose issue is being rolled back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.types import Request, Response, json_response
from tiered.api.routes.auth import InstallBody, IssueBody, RotateBody
from tiered.core.clock import Clock
from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import DEFAULT_BUCKET, validate_bucket, validate_stream_path
from tiered.core.parsing import decode_body
from tiered.engine.auth import token_format as tokens
from tiered.engine.auth.credentials import grace_until, normalize_prefix, parse_scope, token_expiry
from tiered.engine.auth.records import TokenIssued

log = logging.getLogger(__name__)

__all__ = ["TOKENS_PATH", "ClusterTokens", "is_token_path"]

TOKENS_PATH = "/v1/admin/tokens"

#: (request, shard, method, path, body, signed) -> a sub-request aimed at that shard.
SubRequest = Callable[[Request, int, str, str, bytes, bool], Request]
Send = Callable[[Request, int], Awaitable[Response]]


class _Shards(Protocol):
    clock: Clock

    def shard_of(self, bucket: str, name: str) -> int: ...

    def shard_count(self) -> int: ...


def is_token_path(path: str) -> bool:
    return path == TOKENS_PATH or path.startswith(TOKENS_PATH + "/")


class ClusterTokens:
    def __init__(
        self, cluster: _Shards, guard: Callable[[], AdminGuard], sub: SubRequest, send: Send
    ) -> None:
        self.cluster = cluster
        self._make_guard = guard
        self._guard: AdminGuard | None = None
        self.sub = sub
        self.send = send

    def owns(self, path: str) -> bool:
        """A token route: served by this node, not by one shard's engine."""
        return is_token_path(path)

    def label(self, path: str) -> str:
        """The metrics label of a token route this node serves itself (no engine's router names it)."""
        if path == TOKENS_PATH:
            return TOKENS_PATH
        return TOKENS_PATH + ("/{id}/rotate" if path.endswith("/rotate") else "/{id}")

    @property
    def guard(self) -> AdminGuard:
        """The operator's guard, as a single server's (built on first use)."""
        if self._guard is None:
            self._guard = self._make_guard()
        return self._guard

    async def serve(self, request: Request, path: str) -> Response:
        parts = path[len(TOKENS_PATH) :].strip("/").split("/") if path != TOKENS_PATH else []
        method = request.method
        if not parts and method == "POST":
            return await self.issue(request)
        if len(parts) == 2 and parts[1] == "rotate" and method == "POST":
            return await self.rotate(request, parts[0])
        if len(parts) == 1 and method == "DELETE":
            return await self.revoke(request, parts[0])
        # Reads (and anything else: the engine's router answers it as a single server) go to one shard.
        bucket = request.query.get("bucket") if not parts else None
        shard = self.cluster.shard_of(bucket or DEFAULT_BUCKET, "")
        body = await request.body()
        return await self.send(self.sub(request, shard, method, request.path, body, False), shard)

    # ------------------------------------------------------------------ issue and rotate

    async def issue(self, request: Request) -> Response:
        self.guard.check(request)
        b = decode_body(await request.body(), IssueBody)
        now = self.cluster.clock.now_ms()
        expires_ms = token_expiry(now, b.ttl_s, b.expires_ms)
        bucket = validate_bucket(b.bucket)
        parse_scope(b.scope)
        prefix = normalize_prefix(b.prefix)
        if prefix is not None:
            validate_stream_path(prefix)
        if expires_ms is not None and expires_ms <= now:
            raise bad_request("the token would already have expired")
        minted = tokens.mint()
        record = TokenIssued(
            id=minted.id,
            bucket=bucket,
            scope=b.scope,
            prefix=prefix,
            name=b.name,
            created_ms=now,
            expires_ms=expires_ms,
            secret_sha256=minted.secret_sha256,
        )
        home = self.cluster.shard_of(bucket, "")
        try:
            first = await self._install_one(request, record, home)
        except TieredError:
            await self._roll_back(request, record.id)  # it may have landed before the answer was lost
            raise _not_everywhere() from None
        if first.status >= 300:
            return first  # the well-known shard refused: nothing was installed anywhere
        others = [s for s in range(self.cluster.shard_count()) if s != home]
        await self._install_all(request, record, others)
        view = _json(first)
        return json_response({**view, "token": minted.token}, 201, {"Cache-Control": "no-store"})

    async def rotate(self, request: Request, old_id: str) -> Response:
        self.guard.check(request)
        raw = await request.body()
        grace_s = (decode_body(raw, RotateBody) if raw.strip() else RotateBody()).grace_s
        grace_until(self.cluster.clock.now_ms(), grace_s)  # refused here, before anything is read
        token_shard = self.cluster.shard_of(DEFAULT_BUCKET, "")
        described = await self.send(
            self.sub(request, token_shard, "GET", f"{TOKENS_PATH}/{old_id}", b"", False), token_shard
        )
        if described.status != 200:
            return described  # the single server's answer: 404 unknown token, 401 ...
        old = _json(described)
        now = self.cluster.clock.now_ms()
        if old.get("expired"):
            raise bad_request("an expired token cannot be rotated; issue a new one")
        minted = tokens.mint()
        record = TokenIssued(
            id=minted.id,
            bucket=old["bucket"],
            scope=old["scope"],
            prefix=old["prefix"],
            name=old["name"],
            created_ms=now,
            expires_ms=old["expires_ms"],
            secret_sha256=minted.secret_sha256,
            replaces=old_id,
            replaced_until_ms=grace_until(now, grace_s),
        )
        others = [s for s in range(self.cluster.shard_count()) if s != token_shard]
        await self._install_all(request, record, others)
        last = await self._install_one(request, record, token_shard)
        if last.status >= 300:
            await self._roll_back(request, record.id)
            raise _not_everywhere()
        view = _json(last)
        return json_response(
            {**view, "token": minted.token, "replaces": old_id}, 201, {"Cache-Control": "no-store"}
        )

    async def _install_one(self, request: Request, record: TokenIssued, shard: int) -> Response:
        body = msgspec.json.encode(InstallBody.of(record))
        sub = self.sub(request, shard, "PUT", f"{TOKENS_PATH}/{record.id}", body, True)
        return await self.send(sub, shard)

    async def _install_all(self, request: Request, record: TokenIssued, shards: list[int]) -> None:
        """Install on every shard of ``shards`` at once; if any failed, revoke it everywhere and refuse (503)."""
        got = await asyncio.gather(
            *(self._install_one(request, record, s) for s in shards), return_exceptions=True
        )
        if all(isinstance(r, Response) and r.status < 300 for r in got):
            return
        failed = {
            s: (r.status if isinstance(r, Response) else repr(r))
            for s, r in zip(shards, got, strict=True)
            if not (isinstance(r, Response) and r.status < 300)
        }
        log.warning("token %s not installed on shards %s; rolling it back", record.id, failed)
        await self._roll_back(request, record.id)
        raise _not_everywhere()

    async def _roll_back(self, request: Request, token_id: str) -> None:
        """Revoke ``token_id`` on every shard that may have it (best effort: its secret was never shown)."""
        await self._revoke_everywhere(request, token_id)

    # ------------------------------------------------------------------ revoke

    async def revoke(self, request: Request, token_id: str) -> Response:
        self.guard.check(request)
        got = await self._revoke_everywhere(request, token_id)
        if any(not isinstance(r, Response) or r.status not in (204, 404) for r in got):
            raise TieredError(
                ErrorCode.UNAVAILABLE,
                "the token could not be revoked on every shard (it may still work on some); retry",
                retry_after_s=1,
            )
        answers = [r for r in got if isinstance(r, Response)]
        if all(r.status == 404 for r in answers):
            return answers[0]  # no shard knows it: the single server's 404
        return Response(204)

    async def _revoke_everywhere(self, request: Request, token_id: str) -> list[Response | BaseException]:
        path = f"{TOKENS_PATH}/{token_id}"
        shards = range(self.cluster.shard_count())
        return list(
            await asyncio.gather(
                *(self.send(self.sub(request, s, "DELETE", path, b"", False), s) for s in shards),
                return_exceptions=True,
            )
        )


def _not_everywhere() -> TieredError:
    return TieredError(
        ErrorCode.UNAVAILABLE,
        "the token could not be installed on every shard; nothing was issued; retry",
        retry_after_s=1,
    )


def _json(response: Response) -> dict[str, Any]:
    if not isinstance(response.body, bytes):
        raise TieredError(ErrorCode.UNAVAILABLE, "a shard answered without a body; retry", retry_after_s=1)
    decoded = msgspec.json.decode(response.body)
    if not isinstance(decoded, dict):
        raise TieredError(
            ErrorCode.UNAVAILABLE, "a shard answered an unexpected body; retry", retry_after_s=1
        )
    return decoded
