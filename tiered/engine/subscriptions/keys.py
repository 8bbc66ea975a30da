"""The webhook signing keys and the wake tokens minted with them (pure: the shell makes the key material).

Keys live in the journal (``SigningKeyAdded``) so they survive restarts with
the same durability and snapshots as everything else; the newest is the
active one. A token names one wake of one subscription incarnation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.subscriptions.model import Subscription
from tiered.engine.subscriptions.records import SigningKeyAdded, SubscriptionRecord
from tiered.engine.subscriptions.wake_tokens import (
    TOKEN_TTL_S,
    SigningKey,
    TokenClaims,
    mint_token,
    public_jwk,
    read_token,
)

if TYPE_CHECKING:
    from tiered.engine.subscriptions.state import SubscriptionState


def active_key(state: SubscriptionState) -> SigningKey | None:
    return state.keys[-1] if state.keys else None


def jwks(state: SubscriptionState) -> dict[str, Any]:
    return {"keys": [public_jwk(k.kid, k.public_key) for k in state.keys]}


def token_for(state: SubscriptionState, sub: Subscription, now_ms: int) -> str:
    """A token for the current wake (the shell hands it to the webhook or claiming worker)."""
    key = active_key(state)
    assert key is not None and sub.wake is not None, "a token needs a signing key and a wake"
    claims = TokenClaims(
        sub.id, sub.incarnation, sub.generation, sub.wake.wake_id, now_ms // 1000 + TOKEN_TTL_S
    )
    return mint_token(key.token_secret, claims)


def check_token(state: SubscriptionState, sub: Subscription, token: str | None, now_ms: int) -> TokenClaims:
    claims = read_token((k.token_secret for k in state.keys), token) if token else None
    if claims is None or claims.sub != sub.id or claims.incarnation != sub.incarnation:
        raise TieredError(ErrorCode.TOKEN_INVALID, "Token invalid")
    if now_ms // 1000 > claims.exp_s:
        raise TieredError(ErrorCode.TOKEN_EXPIRED, "Token expired")
    return claims


def decide_add_key(state: SubscriptionState, key: SigningKeyAdded) -> list[SubscriptionRecord]:
    """Journal a signing key unless one exists (the shell made ``key``: randomness stays out)."""
    return [] if state.keys else [key]


def apply_key_added(state: SubscriptionState, record: SigningKeyAdded) -> None:
    state.keys.append(
        SigningKey(record.kid, record.public_key, record.private_key, record.token_secret, record.ts_ms)
    )
