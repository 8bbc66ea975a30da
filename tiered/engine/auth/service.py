"""The access-control shell: authenticate a presented credential; issue, rotate and revoke tokens.

Authentication order for ``Authorization: Bearer <x>``: a tiered token
(``tdt_...``) is checked against the token table; otherwise the operator's
admin token (constant-time compare) makes the caller the operator; otherwise,
with ``--auth jwt``, ``x`` is verified as a JWT. Anything else is a 401.
Writes go decide -> commit -> durable like every other feature; revoking or
rotating a token then wakes its live readers (``LiveLeases``).
"""

from __future__ import annotations

import hmac
from typing import Any

from tiered.core.clock import Clock
from tiered.engine.auth import token_format as tokens
from tiered.engine.auth.credentials import OPERATOR, Principal, invalid_credential
from tiered.engine.auth.jwt import JwtVerifier
from tiered.engine.auth.live import CredentialStatus, Lease, LiveLeases
from tiered.engine.auth.records import TokenIssued
from tiered.engine.auth.state import AuthState, Token
from tiered.engine.journal.committer import Committer
from tiered.engine.streams.state import StreamState

MODES = ("none", "tokens", "jwt")
VERIFIED_CACHE_SIZE = 4096  # distinct tokens remembered as verified (cleared when full)


class AuthService:
    def __init__(
        self,
        streams: StreamState,
        state: AuthState,
        committer: Committer,
        clock: Clock,
        leases: LiveLeases,
        *,
        mode: str,
        admin_token: str | None,
        jwt: JwtVerifier | None = None,
    ) -> None:
        self.streams = streams
        self.state = state
        self.committer = committer
        self.clock = clock
        self.leases = leases
        self.mode = mode
        self._admin = admin_token.encode() if admin_token is not None else None
        self.jwt = jwt
        # Presented token text -> the stored token it was verified against. A hit is good while the
        # table still holds that very Token object (a revoke removes it, a rotation or a snapshot load
        # replaces it), so revocation takes effect on the next request; expiry is checked every time.
        # Spares a SHA-256 and a parse per request. Memory only, bounded.
        self._verified: dict[str, Token] = {}

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    # ------------------------------------------------------------- authentication

    def authenticate(self, header: str | None) -> Principal | None:
        """The caller behind an Authorization header (None: no header); 401 for anything not valid."""
        if header is None:
            return None
        scheme, _, presented = header.partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            raise invalid_credential("credentials go in 'Authorization: Bearer <token>'")
        if tokens.looks_like_token(presented):
            table = self.state.tokens
            now_ms = self.clock.now_ms()
            stored = self._verified.get(presented)
            if stored is not None and table.get(stored.principal.id) is stored:
                principal: Principal = stored.principal
                if principal.expires_ms is not None and now_ms >= principal.expires_ms:
                    raise invalid_credential("the credential has expired")
                return principal
            principal = tokens.verify(presented, table, now_ms)
            if len(self._verified) >= VERIFIED_CACHE_SIZE:
                self._verified.clear()
            self._verified[presented] = table[principal.id]
            return principal
        if self._admin is not None and hmac.compare_digest(
            presented.encode("utf-8", "surrogateescape"), self._admin
        ):
            return OPERATOR
        if self.jwt is not None:
            return self.jwt.verify(presented)
        raise invalid_credential()

    def public_read(self, bucket: str) -> bool:
        return bucket in self.state.public_read

    def lease(self, principal: Principal) -> Lease:
        """A live read's hold on its credential (see ``LiveLeases``)."""
        status: CredentialStatus
        if principal.kind == "token":
            table, token_id = self.state.tokens, principal.id

            def status() -> tuple[bool, int | None]:
                token = table.get(token_id)
                return (False, None) if token is None else (True, token.expires_ms)

        else:
            expires = principal.expires_ms

            def status() -> tuple[bool, int | None]:
                return True, expires

        return self.leases.open(principal, status)

    # ------------------------------------------------------------- tokens (admin API)

    async def issue(
        self, bucket: str, scope: str, prefix: str | None, name: str | None, expires_ms: int | None
    ) -> dict[str, Any]:
        minted = tokens.mint()
        await self.committer.admit()
        now = self.clock.now_ms()
        record = self.state.decide_issue(
            token_id=minted.id,
            secret_sha256=minted.secret_sha256,
            bucket=bucket,
            scope=scope,
            prefix=prefix,
            name=name,
            expires_ms=expires_ms,
            buckets=self.streams.buckets,
            now_ms=now,
        )
        await self.committer.durable(self.committer.commit_nowait([record]))
        return {**self.state.tokens[minted.id].view(now), "token": minted.token}

    async def rotate(self, token_id: str, grace_ms: int) -> dict[str, Any]:
        minted = tokens.mint()
        await self.committer.admit()
        now = self.clock.now_ms()
        record = self.state.decide_rotate(
            token_id, token_id=minted.id, secret_sha256=minted.secret_sha256, grace_ms=grace_ms, now_ms=now
        )
        await self.committer.durable(self.committer.commit_nowait([record]))
        self.leases.end(token_id)  # its readers re-check: gone now, or a new deadline
        return {**self.state.tokens[minted.id].view(now), "token": minted.token, "replaces": token_id}

    async def revoke(self, token_id: str) -> None:
        await self.committer.admit()
        record = self.state.decide_revoke(token_id, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait([record]))
        self.leases.end(token_id)

    async def install(self, record: TokenIssued) -> bool:
        """Install a token another node minted (cluster mode; idempotent by id); True if it was new."""
        await self.committer.admit()
        records = self.state.decide_install(record, self.streams.buckets)
        if records:
            await self.committer.durable(self.committer.commit_nowait(records))
            if record.replaces is not None:
                self.leases.end(record.replaces)  # its readers re-check: gone now, or a new deadline
        return bool(records)

    async def revoke_if_known(self, token_id: str) -> bool:
        """Revoke, or nothing if the id is unknown here (cluster fan-out: idempotent); True if it was known."""
        if token_id not in self.state.tokens:
            return False
        await self.revoke(token_id)
        return True

    def list_tokens(self, bucket: str | None) -> list[dict[str, Any]]:
        now = self.clock.now_ms()
        return [
            t.view(now) for _, t in sorted(self.state.tokens.items()) if bucket is None or t.bucket == bucket
        ]

    def describe_token(self, token_id: str) -> dict[str, Any]:
        return self.state.get(token_id).view(self.clock.now_ms())

    # ------------------------------------------------------------- public-read buckets

    async def set_public_read(self, bucket: str, public_read: bool) -> None:
        await self.committer.admit()
        records = self.state.decide_public(bucket, public_read, self.streams.buckets, self.clock.now_ms())
        await self.committer.durable(self.committer.commit_nowait(records))
