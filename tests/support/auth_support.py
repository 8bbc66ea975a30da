"""Helpers for the auth and tenant tests (this module holds no tests): keys, JWTs, tokens, a server.

``AuthServer`` starts ``tiered serve --auth jwt`` (which takes tiered tokens
and JWTs) with an admin token, an RSA key pair whose public half is the
JWKS file, and helpers to issue tokens and sign JWTs.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess

ADMIN = "admin-secret-for-tests"
ISSUER = "https://idp.test"
AUDIENCE = "tiered-test"
JSON = {"Content-Type": "application/json"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


OPERATOR = bearer(ADMIN)


class AuthServer(ServerProcess):
    def __init__(self, data_dir: Path, *args: str, mode: str = "jwt", key: RSAKey | None = None) -> None:
        self.key = key or RSAKey.generate_key(2048, parameters={"kid": "test-1"})
        jwks = data_dir.parent / f"{data_dir.name}-jwks.json"
        jwks.parent.mkdir(parents=True, exist_ok=True)
        jwks.write_text(json.dumps({"keys": [self.key.as_dict(private=False)]}))
        flags = ["--auth", mode]
        if mode == "jwt":
            flags += ["--jwks-file", str(jwks), "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE]
        super().__init__(data_dir, *flags, *args, env={"TIERED_ADMIN_TOKEN": ADMIN})
        self.jwks_path = jwks

    # ---- as the operator

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = b"" if body is None else json.dumps(body).encode()
        status, _, raw = request(method, self.url + path, {**OPERATOR, **JSON}, data)
        return status, (json.loads(raw) if raw else None)

    def bucket(self, name: str) -> None:
        status, body = self.admin("PUT", f"/v1/buckets/{name}")
        assert status in (200, 201), body

    def token(self, bucket: str, scope: str, **extra: Any) -> dict[str, Any]:
        status, body = self.admin("POST", "/v1/admin/tokens", {"bucket": bucket, "scope": scope, **extra})
        assert status == 201, body
        return body

    # ---- JWTs

    def jwt(
        self, scope: str, *, key: RSAKey | None = None, header: dict[str, Any] | None = None, **claims: Any
    ) -> str:
        now = int(time.time())
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "user-1",
            "exp": now + 600,
            "scope": scope,
            **claims,
        }
        return jwt.encode(header or {"alg": "RS256", "kid": "test-1"}, payload, key or self.key)

    def unsigned_jwt(self, scope: str) -> str:
        def b64(d: Any) -> str:
            return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

        now = int(time.time())
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "exp": now + 600, "scope": scope}
        return b64({"alg": "none", "typ": "JWT"}) + "." + b64(payload) + "."
