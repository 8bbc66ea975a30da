"""Callback and claim tokens (HMAC-SHA256) and the webhook signing keys' public forms.

Pure: keys and secrets come in as bytes (the shell makes them, ``delivery``),
nothing here draws randomness or reads a clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

TOKEN_TTL_S = 24 * 3600  # defence in depth only: generation fencing is what retires tokens


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class TokenClaims:
    sub: str
    incarnation: int
    generation: int
    wake_id: str
    exp_s: int


class _TokenPayload(msgspec.Struct):
    sub: str
    inc: int
    gen: int
    wake: str
    exp: int


def mint_token(secret: bytes, claims: TokenClaims) -> str:
    """An HMAC-SHA256-signed callback/claim token: ``base64url(json).base64url(mac)``."""
    payload = _b64(
        msgspec.json.encode(
            _TokenPayload(claims.sub, claims.incarnation, claims.generation, claims.wake_id, claims.exp_s)
        )
    )
    mac = hmac.new(secret, payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}"


def read_token(secrets: Iterable[bytes], token: str) -> TokenClaims | None:
    """The claims of a token signed with one of ``secrets``; None if forged or malformed."""
    if not token.isascii():  # includes undecodable header bytes (lone surrogates)
        return None
    payload, sep, mac = token.partition(".")
    if not sep or not payload or not mac:
        return None
    try:
        given = _unb64(mac)
    except ValueError:
        return None
    if not any(
        hmac.compare_digest(hmac.new(s, payload.encode(), hashlib.sha256).digest(), given) for s in secrets
    ):
        return None
    try:
        p = msgspec.json.decode(_unb64(payload), type=_TokenPayload)
    except (ValueError, msgspec.DecodeError):
        return None
    return TokenClaims(p.sub, p.inc, p.gen, p.wake, p.exp)


# ---------------------------------------------------------------- keys


def key_id(public_key: bytes) -> str:
    """``ds_`` + the RFC 7638 JWK thumbprint of an Ed25519 public key (base64url SHA-256)."""
    canonical = msgspec.json.encode(
        {"crv": "Ed25519", "kty": "OKP", "x": _b64(public_key)}
    )  # members sorted, no spaces
    return "ds_" + _b64(hashlib.sha256(canonical).digest())


def public_jwk(kid: str, public_key: bytes) -> dict[str, str]:
    return {"kty": "OKP", "crv": "Ed25519", "kid": kid, "use": "sig", "alg": "EdDSA", "x": _b64(public_key)}


class SigningKey(msgspec.Struct, frozen=True, array_like=True):
    """A webhook signing key and the token secret (its own snapshot form too)."""

    kid: str
    public_key: bytes
    private_key: bytes
    token_secret: bytes
    created_ms: int
