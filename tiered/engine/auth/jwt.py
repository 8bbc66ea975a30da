"""JWTs from the deployment's identity provider (OIDC / RFC 9068 access tokens), verified with joserfc.

Keys come from a JWKS file (``--jwks-file``), read again when its mtime
changes (looked at most once a second) or on SIGHUP; a file that fails to
load leaves the previous keys in force (and says so in the log). Only
asymmetric algorithms are accepted (RS*, PS*, ES*, EdDSA): ``alg: none`` and
HS* (which would make a public key a shared secret) are refused, and so are
symmetric keys in the file.

Claims checked: the signature, ``iss`` equal to ``--jwt-issuer``, ``aud``
(a string or a list) containing ``--jwt-audience``, ``exp`` required and in
the future, ``nbf`` (if present) not in the future; ``--jwt-leeway-s``
(default 0) allows for clock skew. ``exp``, ``nbf`` and ``iat`` must be
times between 1970 and the end of year 9999 (``MAX_TIME_S``): a token naming
another (``exp`` = 10^400 is a valid JSON number) is invalid, not a number
that breaks the arithmetic of the live reads it would hold open.

Claim mapping to bucket scopes: the ``scope`` claim (``--jwt-scope-claim``;
a space-separated string as RFC 9068 has it, or a list of strings) holds
items ``tiered:<bucket>:<read|write|admin>[:<stream-path prefix>]``. Other
items are ignored (they belong to other APIs); a malformed ``tiered:`` item
makes the token invalid. A token with no ``tiered:`` item authenticates but
grants nothing (every bucket answers 404 except public-read reads).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from tiered.core.ids import validate_bucket, validate_stream_path
from tiered.engine.auth.credentials import (
    MAX_TIME_S,
    SCOPES,
    Grant,
    Principal,
    invalid_credential,
    normalize_prefix,
)

log = logging.getLogger(__name__)

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
SCOPE_ITEM_PREFIX = "tiered:"
CACHE_ENTRIES = 4096
TIME_CLAIMS = ("exp", "nbf", "iat")


class JwksError(ValueError):
    pass


def load_jwks(path: Path) -> KeySet:
    """The key set in a JWKS file: asymmetric keys only."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise JwksError(f"cannot read JWKS file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list) or not data["keys"]:
        raise JwksError(f"JWKS file {path} holds no keys ({{'keys': [...]}} expected)")
    for key in data["keys"]:
        if not isinstance(key, dict) or key.get("kty") not in ("RSA", "EC", "OKP"):
            raise JwksError(f"JWKS file {path}: only RSA, EC and OKP (asymmetric) keys are accepted")
    try:
        return KeySet.import_key_set(data)  # type: ignore[arg-type]
    except (JoseError, ValueError, TypeError) as exc:
        raise JwksError(f"JWKS file {path}: {exc}") from None


class JwksFile:
    """The keys of a JWKS file, reloaded when the file changes (at most once a second) or when asked."""

    def __init__(self, path: Path, monotonic: Callable[[], float]) -> None:
        self.path = path
        self._monotonic = monotonic
        self._mtime = self._stat()
        self.keys = load_jwks(path)  # a bad file at start-up is fatal
        self.generation = 0  # moves when the keys change (caches drop what they verified)
        self._checked = monotonic()

    def _stat(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def current(self) -> KeySet:
        now = self._monotonic()
        if now - self._checked >= 1.0:
            self._checked = now
            if self._stat() != self._mtime:
                self.reload()
        return self.keys

    def reload(self) -> None:
        """Read the file again (SIGHUP, or it changed); a bad file keeps the keys in force."""
        self._mtime = self._stat()
        try:
            keys = load_jwks(self.path)
        except JwksError as exc:
            log.error("JWKS reload failed, keeping the previous keys: %s", exc)
            return
        self.keys = keys
        self.generation += 1
        log.info("JWKS keys reloaded from %s", self.path)


def grants_from_claims(claims: dict[str, Any], claim: str) -> tuple[Grant, ...]:
    """The documented mapping (module docstring) from a scope claim to bucket grants."""
    raw = claims.get(claim)
    if raw is None:
        return ()
    if isinstance(raw, str):
        items = raw.split()
    elif isinstance(raw, list) and all(isinstance(i, str) for i in raw):
        items = raw
    else:
        raise invalid_credential()
    grants = []
    for item in items:
        if not item.startswith(SCOPE_ITEM_PREFIX):
            continue
        parts = item[len(SCOPE_ITEM_PREFIX) :].split(":", 2)
        if len(parts) < 2 or parts[1] not in SCOPES:
            raise invalid_credential()
        try:
            bucket = validate_bucket(parts[0])
            prefix = normalize_prefix(parts[2]) if len(parts) == 3 else None
            if prefix is not None:
                validate_stream_path(prefix)
        except Exception:
            raise invalid_credential() from None
        grants.append(Grant(bucket, SCOPES[parts[1]], prefix))
    return tuple(grants)


def _sane_time(value: object) -> bool:
    """A NumericDate between 1970 and the end of year 9999 (bool, NaN and infinities are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0 <= value <= MAX_TIME_S  # False for NaN as well


class JwtVerifier:
    def __init__(
        self,
        keys: JwksFile,
        *,
        issuer: str,
        audience: str,
        now_ms: Callable[[], int],
        leeway_s: int = 0,
        scope_claim: str = "scope",
    ) -> None:
        self.keys = keys
        self.issuer = issuer
        self.audience = audience
        self._now_ms = now_ms
        self.leeway_s = leeway_s
        self.scope_claim = scope_claim
        self._cache: dict[str, Principal] = {}
        self._cache_generation = keys.generation

    def verify(self, token: str) -> Principal:
        now_ms = self._now_ms()
        keys = self.keys.current()
        if self._cache_generation != self.keys.generation:
            self._cache.clear()
            self._cache_generation = self.keys.generation
        principal = self._cache.get(token)
        if principal is None:
            principal = self._verify(token, keys, now_ms)
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[token] = principal
        if principal.expires_ms is not None and now_ms >= principal.expires_ms + self.leeway_s * 1000:
            self._cache.pop(token, None)
            raise invalid_credential("the credential has expired")
        return principal

    def _verify(self, token: str, keys: KeySet, now_ms: int) -> Principal:
        try:
            decoded = jwt.decode(token, keys, algorithms=ALGORITHMS)
            for name in TIME_CLAIMS:
                if name in decoded.claims and not _sane_time(decoded.claims[name]):
                    raise invalid_credential()
            registry = jwt.JWTClaimsRegistry(
                now=now_ms // 1000,
                leeway=self.leeway_s,
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "value": self.audience},
                exp={"essential": True},
            )
            registry.validate(decoded.claims)
        except JoseError as exc:
            if exc.error == "expired_token":
                raise invalid_credential("the credential has expired") from None
            raise invalid_credential() from None
        except (ValueError, TypeError):
            raise invalid_credential() from None
        claims = decoded.claims
        exp = claims["exp"]
        subject = claims.get("sub")
        return Principal(
            id=f"jwt:{subject if isinstance(subject, str) else ''}",
            kind="jwt",
            grants=grants_from_claims(claims, self.scope_claim),
            expires_ms=int(exp * 1000),
        )
