"""The authorization model, tokens and JWTs, without a server.

* ``authorize``: every verdict (allow, 401, 403, 404-as-missing) for scopes,
  prefixes, whole-bucket requests, public-read buckets and the operator;
* tokens: minted secrets are never in a record, only their SHA-256; unknown,
  forged, revoked and expired tokens are refused; rotation keeps the old one
  exactly until its grace ends; snapshots round-trip;
* JWTs: signature, ``iss``, ``aud``, ``exp``, ``nbf``, ``alg: none``, HS256
  signed with the public key, symmetric keys in the JWKS file, the scope
  claim mapping, and reloading the JWKS file when it changes; ``exp``,
  ``nbf`` and ``iat`` beyond year 9999 (``exp`` = 10^400) or before 1970 are
  invalid, and no expiry can overflow a live read's lease arithmetic;
* token expiry inputs (``ttl_s``, ``expires_ms``, rotation ``grace_s``) that
  would end after year 9999 are refused (400).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

import msgspec
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, RSAKey

from tiered.api.kit.errors import error_response
from tiered.core.clock import VirtualClock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.auth import token_format as tokens
from tiered.engine.auth.credentials import (
    MAX_TIME_MS,
    MAX_TIME_S,
    OPERATOR,
    Grant,
    Level,
    Principal,
    Verdict,
    authorize,
    grace_until,
    token_expiry,
    visible,
)
from tiered.engine.auth.jwt import JwksError, JwksFile, JwtVerifier, grants_from_claims, load_jwks
from tiered.engine.auth.live import LiveLeases
from tiered.engine.auth.records import TokenIssued
from tiered.engine.auth.state import AuthState
from tiered.engine.codec import encode_record

R, W, A = Level.READ, Level.WRITE, Level.ADMIN


def who(*grants: Grant) -> Principal:
    return Principal(id="t", kind="token", grants=grants)


# --------------------------------------------------------------------------- authorize


@pytest.mark.parametrize(
    ("principal", "bucket", "level", "path", "whole", "public", "verdict"),
    [
        (None, "acme", R, "x", False, False, Verdict.UNAUTHENTICATED),
        (None, "acme", R, "x", False, True, Verdict.ALLOW),  # public-read: reads only
        (None, "acme", W, "x", False, True, Verdict.UNAUTHENTICATED),
        (OPERATOR, "acme", A, None, True, False, Verdict.ALLOW),
        (who(Grant("acme", R)), "acme", R, "x", False, False, Verdict.ALLOW),
        (who(Grant("acme", R)), "acme", W, "x", False, False, Verdict.FORBIDDEN),
        (who(Grant("acme", W)), "acme", R, "x", False, False, Verdict.ALLOW),  # scopes include the lower
        (who(Grant("acme", W)), "acme", A, None, True, False, Verdict.FORBIDDEN),
        (who(Grant("acme", A)), "acme", W, "x", False, False, Verdict.ALLOW),
        (who(Grant("other", A)), "acme", R, "x", False, False, Verdict.HIDDEN),  # as if missing
        (who(Grant("other", A)), "acme", R, "x", False, True, Verdict.ALLOW),
        (who(Grant("acme", W, "app")), "acme", W, "app/x", False, False, Verdict.ALLOW),
        (who(Grant("acme", W, "app")), "acme", W, "app", False, False, Verdict.ALLOW),
        (who(Grant("acme", W, "app")), "acme", W, "apple", False, False, Verdict.HIDDEN),  # whole segments
        (who(Grant("acme", W, "app")), "acme", R, "other/x", False, False, Verdict.HIDDEN),
        (who(Grant("acme", A, "app")), "acme", R, None, True, False, Verdict.FORBIDDEN),  # bucket-wide
        (who(Grant("acme", R, "app")), "acme", R, None, False, False, Verdict.ALLOW),  # bucket info
        (who(Grant("acme", A, "app"), Grant("acme", R)), "acme", A, None, True, False, Verdict.FORBIDDEN),
        (who(Grant("acme", A, "app"), Grant("acme", R)), "acme", W, "app/q", False, False, Verdict.ALLOW),
    ],
)
def test_authorize(
    principal: Principal | None,
    bucket: str,
    level: Level,
    path: str | None,
    whole: bool,
    public: bool,
    verdict: Verdict,
) -> None:
    assert authorize(principal, bucket, level, path=path, whole_bucket=whole, public_read=public) is verdict


def test_visible() -> None:
    assert visible(who(Grant("acme", R, "p")), "acme")
    assert not visible(who(Grant("acme", R)), "other")
    assert visible(None, "other", public_read=True)
    assert not visible(None, "other")
    assert visible(OPERATOR, "anything")


# --------------------------------------------------------------------------- tokens


def issue(state: AuthState, clock: VirtualClock, **kw: object) -> tuple[str, TokenIssued]:
    minted = tokens.mint()
    args: dict[str, object] = {
        "bucket": "acme",
        "scope": "write",
        "prefix": None,
        "name": None,
        "expires_ms": None,
        **kw,
    }
    record = state.decide_issue(
        token_id=minted.id,
        secret_sha256=minted.secret_sha256,
        buckets={"acme": 0, "default": 0},
        now_ms=clock.ms,
        **args,  # type: ignore[arg-type]
    )
    state.apply(record)
    return minted.token, record


def test_a_token_is_journaled_as_a_hash_and_verified_by_it() -> None:
    clock, state = VirtualClock(), AuthState()
    token, record = issue(state, clock)
    secret = tokens.split(token)[1]  # type: ignore[index]
    raw = encode_record(record)
    assert token.encode() not in raw and secret.encode() not in raw
    assert record.secret_sha256 == tokens.digest(secret) and len(record.secret_sha256) == 32
    assert tokens.verify(token, state.tokens, clock.ms).grants == (Grant("acme", Level.WRITE),)
    snap = state.snapshot()
    assert secret.encode() not in snap
    restored = AuthState()
    restored.restore(snap)
    assert tokens.verify(token, restored.tokens, clock.ms).id == record.id


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # forged secret
        lambda t: "tdt_" + "a" * 20 + t[24:],  # unknown id
        lambda t: t.replace("tdt_", "tdx_"),
        lambda t: t + "_",
        lambda t: "tdt_" + t[4:24].upper() + t[24:],
        lambda t: "tdt_",
    ],
)
def test_tokens_that_are_not_valid_are_refused(mutate: object) -> None:
    clock, state = VirtualClock(), AuthState()
    token, _ = issue(state, clock)
    with pytest.raises(TieredError) as err:
        tokens.verify(mutate(token), state.tokens, clock.ms)  # type: ignore[operator]
    assert err.value.code is ErrorCode.UNAUTHORIZED
    assert token not in repr(err.value) and tokens.split(token)[1] not in err.value.message  # type: ignore[index]


def test_expiry_and_revocation() -> None:
    clock, state = VirtualClock(), AuthState()
    token, record = issue(state, clock, expires_ms=clock.ms + 1_000)
    clock.advance(999)
    tokens.verify(token, state.tokens, clock.ms)
    clock.advance(1)
    with pytest.raises(TieredError, match="expired"):
        tokens.verify(token, state.tokens, clock.ms)
    other, rec2 = issue(state, clock)
    state.apply(state.decide_revoke(rec2.id, clock.ms))
    with pytest.raises(TieredError, match="not valid"):
        tokens.verify(other, state.tokens, clock.ms)
    with pytest.raises(TieredError) as err:
        state.decide_revoke(rec2.id, clock.ms)
    assert err.value.code is ErrorCode.TOKEN_NOT_FOUND


def test_rotation_keeps_the_old_token_exactly_until_the_grace_ends() -> None:
    clock, state = VirtualClock(), AuthState()
    old, rec = issue(state, clock, scope="read", prefix="/app/", name="ci")
    new = tokens.mint()
    rotated = state.decide_rotate(
        rec.id, token_id=new.id, secret_sha256=new.secret_sha256, grace_ms=5_000, now_ms=clock.ms
    )
    state.apply(rotated)
    assert (rotated.bucket, rotated.scope, rotated.prefix, rotated.name) == ("acme", "read", "app", "ci")
    clock.advance(4_999)
    tokens.verify(old, state.tokens, clock.ms)
    tokens.verify(new.token, state.tokens, clock.ms)
    clock.advance(1)
    with pytest.raises(TieredError):
        tokens.verify(old, state.tokens, clock.ms)
    tokens.verify(new.token, state.tokens, clock.ms)
    # Without grace the old one ends at once.
    newer = tokens.mint()
    state.apply(
        state.decide_rotate(
            new.id, token_id=newer.id, secret_sha256=newer.secret_sha256, grace_ms=0, now_ms=clock.ms
        )
    )
    assert new.id not in state.tokens
    with pytest.raises(TieredError):
        tokens.verify(new.token, state.tokens, clock.ms)


def test_verified_tokens_are_remembered_only_while_the_stored_token_is_unchanged() -> None:
    """AuthService skips re-hashing a token it verified, but never past an expiry, revocation or rotation."""
    from tiered.engine.auth.live import LiveLeases
    from tiered.engine.auth.service import AuthService
    from tiered.engine.streams.state import StreamState

    clock, state = VirtualClock(), AuthState()
    service = AuthService(
        StreamState(),
        state,
        None,
        clock,
        LiveLeases(clock, lambda _: None),
        mode="tokens",
        admin_token=None,  # type: ignore[arg-type]
    )
    token, rec = issue(state, clock, expires_ms=clock.ms + 1_000)
    assert service.authenticate(f"Bearer {token}") is state.tokens[rec.id].principal
    assert service.authenticate(f"Bearer {token}") is state.tokens[rec.id].principal  # remembered
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    with pytest.raises(TieredError, match="not valid"):
        service.authenticate(f"Bearer {forged}")  # same id, other secret: not a hit
    clock.advance(1_000)
    with pytest.raises(TieredError, match="expired"):
        service.authenticate(f"Bearer {token}")
    other, rec2 = issue(state, clock)
    service.authenticate(f"Bearer {other}")
    state.apply(state.decide_revoke(rec2.id, clock.ms))
    with pytest.raises(TieredError, match="not valid"):
        service.authenticate(f"Bearer {other}")
    third, rec3 = issue(state, clock)
    service.authenticate(f"Bearer {third}")
    new = tokens.mint()
    state.apply(
        state.decide_rotate(
            rec3.id, token_id=new.id, secret_sha256=new.secret_sha256, grace_ms=0, now_ms=clock.ms
        )
    )
    with pytest.raises(TieredError, match="not valid"):
        service.authenticate(f"Bearer {third}")
    assert service.authenticate(f"Bearer {new.token}").id == new.id


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"bucket": "nope"}, ErrorCode.BUCKET_NOT_FOUND),
        ({"bucket": "NO"}, ErrorCode.BAD_REQUEST),
        ({"scope": "owner"}, ErrorCode.BAD_REQUEST),
        ({"prefix": "a/../b"}, ErrorCode.BAD_REQUEST),
        ({"name": "x\n"}, ErrorCode.BAD_REQUEST),
        ({"expires_ms": 1}, ErrorCode.BAD_REQUEST),
    ],
)
def test_bad_token_requests_change_nothing(kw: dict[str, object], code: ErrorCode) -> None:
    clock, state = VirtualClock(), AuthState()
    with pytest.raises(TieredError) as err:
        issue(state, clock, **kw)
    assert err.value.code is code
    assert state.tokens == {}


def test_public_read_flags() -> None:
    state = AuthState()
    buckets = {"acme": 0}
    records = state.decide_public("acme", True, buckets, 5)
    for r in records:
        state.apply(r)
    assert state.public_read == {"acme": 5}
    assert state.decide_public("acme", True, buckets, 6) == []
    with pytest.raises(TieredError):
        state.decide_public("nope", True, buckets, 6)


# --------------------------------------------------------------------------- JWT


ISS, AUD = "https://idp.example", "tiered"


@pytest.fixture(scope="module")
def rsa() -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": "k1"})


def write_jwks(path: Path, *keys: object) -> None:
    path.write_text(json.dumps({"keys": [k.as_dict(private=False) for k in keys]}))  # type: ignore[attr-defined]


def verifier(path: Path, clock: VirtualClock) -> JwtVerifier:
    return JwtVerifier(JwksFile(path, clock.monotonic), issuer=ISS, audience=AUD, now_ms=clock.now_ms)


def claims(clock: VirtualClock, **kw: object) -> dict[str, object]:
    now = clock.ms // 1000
    return {"iss": ISS, "aud": AUD, "sub": "u1", "exp": now + 60, "scope": "openid tiered:acme:write", **kw}


def b64(data: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def hs256_signed(payload: dict[str, object], *, secret: bytes, kid: str) -> str:
    """An HS256 JWT signed by hand: the attack, built without asking the JOSE library (which may
    rightly refuse to make a public key an HMAC secret: joserfc 1.8 raises, earlier versions warn)."""
    signing_input = b64({"alg": "HS256", "kid": kid}) + "." + b64(payload)
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def test_jwt_accepted_and_mapped(tmp_path: Path, rsa: RSAKey) -> None:
    clock = VirtualClock()
    write_jwks(tmp_path / "jwks.json", rsa)
    v = verifier(tmp_path / "jwks.json", clock)
    token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims(clock, aud=["x", AUD]), rsa)
    p = v.verify(token)
    assert p.kind == "jwt" and p.id == "jwt:u1" and p.grants == (Grant("acme", Level.WRITE),)
    assert p.expires_ms == (clock.ms // 1000 + 60) * 1000
    ec = ECKey.generate_key("P-256", parameters={"kid": "e1"})
    write_jwks(tmp_path / "ec.json", ec)
    assert verifier(tmp_path / "ec.json", clock).verify(jwt.encode({"alg": "ES256"}, claims(clock), ec)).id


@pytest.mark.parametrize(
    "case",
    [
        "wrong-aud",
        "wrong-iss",
        "expired",
        "exp-now",
        "not-yet-valid",
        "no-exp",
        "bad-signature",
        "alg-none",
        "hs256-public-key",
        "exp-10^400",
        "exp-after-9999",
        "nbf-after-9999",
        "iat-after-9999",
        "iat-before-1970",
        "exp-true",
    ],
)
def test_jwt_refusals(tmp_path: Path, rsa: RSAKey, case: str) -> None:
    clock = VirtualClock()
    write_jwks(tmp_path / "jwks.json", rsa)
    v = verifier(tmp_path / "jwks.json", clock)
    now = clock.ms // 1000
    header = {"alg": "RS256", "kid": "k1"}
    if case == "wrong-aud":
        token = jwt.encode(header, claims(clock, aud="other"), rsa)
    elif case == "wrong-iss":
        token = jwt.encode(header, claims(clock, iss="https://evil.example"), rsa)
    elif case == "expired":
        token = jwt.encode(header, claims(clock, exp=now - 1), rsa)
    elif case == "exp-now":
        token = jwt.encode(header, claims(clock, exp=now), rsa)
    elif case == "not-yet-valid":
        token = jwt.encode(header, claims(clock, nbf=now + 30), rsa)
    elif case == "no-exp":
        c = claims(clock)
        del c["exp"]
        token = jwt.encode(header, c, rsa)
    elif case == "bad-signature":
        other = RSAKey.generate_key(2048, parameters={"kid": "k1"})
        token = jwt.encode(header, claims(clock), other)
    elif case == "alg-none":
        token = b64({"alg": "none"}) + "." + b64(claims(clock)) + "."
    elif case == "exp-10^400":
        token = jwt.encode(header, claims(clock, exp=10**400), rsa)
    elif case == "exp-after-9999":
        token = jwt.encode(header, claims(clock, exp=MAX_TIME_S + 1), rsa)
    elif case == "nbf-after-9999":  # with a leeway that would let it pass: the range check comes first
        token = jwt.encode(header, claims(clock, nbf=10**400), rsa)
    elif case == "iat-after-9999":
        token = jwt.encode(header, claims(clock, iat=10**400), rsa)
    elif case == "iat-before-1970":
        token = jwt.encode(header, claims(clock, iat=-1), rsa)
    elif case == "exp-true":
        token = jwt.encode(header, claims(clock, exp=True), rsa)
    else:  # the public key's PEM used as an HMAC secret
        token = hs256_signed(claims(clock), secret=rsa.as_pem(private=False), kid="k1")
    with pytest.raises(TieredError) as err:
        v.verify(token)
    # Refused as an invalid token: 401 with the invalid_token challenge, whatever the library raised.
    answer = error_response(err.value)
    assert answer.status == 401, answer
    assert answer.headers["WWW-Authenticate"] == 'Bearer realm="tiered", error="invalid_token"'


def test_jwt_times_up_to_the_end_of_9999_are_valid_and_leases_never_overflow(
    tmp_path: Path, rsa: RSAKey
) -> None:
    clock = VirtualClock()
    write_jwks(tmp_path / "jwks.json", rsa)
    v = verifier(tmp_path / "jwks.json", clock)
    now = clock.ms // 1000
    token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims(clock, exp=MAX_TIME_S, iat=now, nbf=now), rsa)
    principal = v.verify(token)
    assert principal.expires_ms == MAX_TIME_S * 1000
    lease = LiveLeases(clock, lambda uid: None).open(principal, lambda: (True, principal.expires_ms))
    assert lease.seconds_left() == (MAX_TIME_S * 1000 - clock.ms) / 1000
    # Whatever expiry a credential claims, the lease's arithmetic stays a float.
    huge = Principal(id="t", kind="token", expires_ms=10**403)
    assert LiveLeases(clock, lambda uid: None).open(huge, lambda: (True, 10**403)).seconds_left() == (
        MAX_TIME_MS / 1000
    )


def test_token_expiry_inputs_are_bounded_by_the_end_of_9999() -> None:
    now = 1_800_000_000_000
    assert token_expiry(now, None, None) is None
    assert token_expiry(now, 60, None) == now + 60_000
    assert token_expiry(now, None, MAX_TIME_MS) == MAX_TIME_MS
    assert token_expiry(now, (MAX_TIME_MS - now) // 1000, None) <= MAX_TIME_MS  # type: ignore[operator]
    for ttl_s, expires_ms in (
        ((MAX_TIME_MS - now) // 1000 + 1, None),
        (2**53 - 1, None),
        (None, MAX_TIME_MS + 1),
    ):
        with pytest.raises(TieredError) as err:
            token_expiry(now, ttl_s, expires_ms)
        assert err.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(TieredError, match="not both"):
        token_expiry(now, 1, now + 1)
    assert grace_until(now, 0) == now
    for grace_s in (-1, (MAX_TIME_MS - now) // 1000 + 1, 2**53 - 1):
        with pytest.raises(TieredError):
            grace_until(now, grace_s)
    # The state machine refuses the same, so no shell can journal an expiry past the bound.
    state = AuthState()
    with pytest.raises(TieredError, match="9999"):
        state.decide_issue(
            token_id="t1",
            secret_sha256=b"x" * 32,
            bucket="acme",
            scope="read",
            prefix=None,
            name=None,
            expires_ms=MAX_TIME_MS + 1,
            buckets={"acme": 1},
            now_ms=now,
        )


def test_scope_claim_mapping() -> None:
    g = grants_from_claims(
        {"scope": "openid tiered:acme:read tiered:acme:admin:app/x/ profile tiered:b-2:write"}, "scope"
    )
    assert g == (Grant("acme", R), Grant("acme", A, "app/x"), Grant("b-2", W))
    assert grants_from_claims({"scp": ["tiered:acme:read"]}, "scp") == (Grant("acme", R),)
    assert grants_from_claims({}, "scope") == ()
    for bad in ("tiered:acme", "tiered:acme:owner", "tiered:AC:read", "tiered:acme:read:a/../b"):
        with pytest.raises(TieredError):
            grants_from_claims({"scope": bad}, "scope")
    with pytest.raises(TieredError):
        grants_from_claims({"scope": 5}, "scope")


def test_jwks_file_reloads_on_change_and_keeps_keys_when_broken(tmp_path: Path, rsa: RSAKey) -> None:
    clock = VirtualClock()
    path = tmp_path / "jwks.json"
    write_jwks(path, rsa)
    v = verifier(path, clock)
    k2 = RSAKey.generate_key(2048, parameters={"kid": "k2"})
    t2 = jwt.encode({"alg": "RS256", "kid": "k2"}, claims(clock), k2)
    with pytest.raises(TieredError):
        v.verify(t2)
    write_jwks(path, rsa, k2)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    clock.advance(1_000)  # the file is looked at most once a second
    assert v.verify(t2).id == "jwt:u1"
    path.write_text("{not json")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 3 * 10**9))
    clock.advance(1_000)
    assert v.verify(t2).id == "jwt:u1"  # a broken file keeps the keys in force
    write_jwks(path, rsa)
    v.keys.reload()  # SIGHUP
    with pytest.raises(TieredError):
        v.verify(t2)  # k2 is gone, and so is what the cache verified with it


def test_symmetric_or_empty_jwks_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [OctKey.generate_key(256).as_dict()]}))
    with pytest.raises(JwksError, match="asymmetric"):
        load_jwks(path)
    path.write_text(json.dumps({"keys": []}))
    with pytest.raises(JwksError):
        load_jwks(path)
    assert msgspec  # used by the codec import above
