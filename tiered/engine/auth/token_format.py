"""Bearer tokens tiered issues: ``tdt_<id>_<secret>``, shown once, kept only as a hash.

The id (20 base32 characters, 100 random bits) is public: listings show it and
revocation names it. The secret (32 random bytes, base64url) is shown once, in
the answer that creates the token; the journal and snapshots keep its SHA-256
digest, and a presented secret is compared with ``hmac.compare_digest`` on the
digests, in constant time. A random 256-bit secret needs no slow hash: there
is nothing to guess.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tiered.engine.auth.credentials import Principal, invalid_credential

PREFIX = "tdt_"
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz234567")
ID_LENGTH = 20


@dataclass(frozen=True, slots=True)
class Minted:
    id: str
    token: str  # shown once, never stored
    secret_sha256: bytes


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def mint() -> Minted:
    token_id = base64.b32encode(secrets.token_bytes(15)).decode().lower()[:ID_LENGTH]
    secret = secrets.token_urlsafe(32)
    return Minted(token_id, f"{PREFIX}{token_id}_{secret}", digest(secret))


def looks_like_token(presented: str) -> bool:
    return presented.startswith(PREFIX)


def split(presented: str) -> tuple[str, str] | None:
    """(id, secret) of a token's text, or None if it is not one."""
    if not presented.startswith(PREFIX):
        return None
    token_id, sep, secret = presented[len(PREFIX) :].partition("_")
    if not sep or len(token_id) != ID_LENGTH or not secret or not _ID_CHARS.issuperset(token_id):
        return None
    return token_id, secret


class _Stored(Protocol):
    """What verification needs of a stored token (``tiered.engine.auth.state.Token``)."""

    @property
    def principal(self) -> Principal: ...

    @property
    def secret_sha256(self) -> bytes: ...


def verify(presented: str, tokens: Mapping[str, _Stored], now_ms: int) -> Principal:
    """The principal of a valid token; 401 otherwise (unknown, revoked and forged alike; expired says so)."""
    parts = split(presented)
    if parts is None:
        raise invalid_credential()
    stored = tokens.get(parts[0])
    # Hash even for an unknown id, so timing tells nothing about which ids exist.
    presented_digest = digest(parts[1])
    if stored is None or not hmac.compare_digest(presented_digest, stored.secret_sha256):
        raise invalid_credential()
    principal = stored.principal
    if principal.expires_ms is not None and now_ms >= principal.expires_ms:
        raise invalid_credential("the credential has expired")
    return principal
