"""The pure subscription state machine (``tiered.engine.subscriptions``): decide -> records -> apply.

No clock, no network: time is passed in, streams live in a real ``StreamState``
driven the way ``StreamService._commit`` drives it (apply a stream record,
then commit whatever ``on_stream_event`` answers right after it).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tiered.api.kit.errors import error_response
from tiered.core.errors import TieredError as SubscriptionError
from tiered.core.globs import glob_match
from tiered.core.ids import DEFAULT_BUCKET, format_offset
from tiered.engine.codec import decode_record, encode_record
from tiered.engine.streams.model import AppendRequest, CreateRequest
from tiered.engine.streams.records import BucketCreated
from tiered.engine.streams.state import StreamState
from tiered.engine.subscriptions import views
from tiered.engine.subscriptions.config import (
    DEFAULT_LEASE_TTL_MS,
    SubscriptionConfig,
    WakeRequest,
    parse_config,
    parse_streams_body,
    parse_wake_request,
    parse_worker,
    validate_subscription_id,
)
from tiered.engine.subscriptions.records import (
    Acked,
    ExplicitLinkRemoved,
    GenerationFenced,
    LinkSpec,
    SigningKeyAdded,
    StreamGone,
    StreamsLinked,
    SubscriptionCreated,
    SubscriptionDeleted,
    WakeClaimed,
    WakeEnded,
    WakeIssued,
    WebhookFailed,
)
from tiered.engine.subscriptions.state import StateStreams, SubscriptionState, backoff_ms, wake_live
from tiered.engine.subscriptions.views import iso_ms
from tiered.engine.subscriptions.wake_tokens import TokenClaims, key_id, mint_token, read_token

T0 = 1_700_000_000_000
ZERO = format_offset(0)
KEY = SigningKeyAdded("ds_test", b"p" * 32, b"s" * 32, b"t" * 32, T0)


class World:
    """A StreamState with the subscription extension, committed like the service commits."""

    def __init__(self) -> None:
        self.subs = SubscriptionState()
        self.state = StreamState([self.subs])
        self.log: list[Any] = []
        self._pos = 8

    def commit(self, records: list[Any]) -> list[Any]:
        for r in records:
            before = self.state.streams.get(getattr(r, "uid", -1))
            location = None
            if getattr(r, "data", b""):
                location = (1, self._pos)
                self._pos += len(r.data) + 16
            self.state.apply(r, location)
            self.log.append(r)
            follow = self.subs.on_stream_event(r, before, self.state)
            if follow:
                self.commit(follow)
        return records

    def streams(self, now: int = T0) -> StateStreams:
        return StateStreams(self.state, now)

    def create_stream(
        self, path: str, data: bytes = b"", now: int = T0, bucket: str = DEFAULT_BUCKET
    ) -> list[Any]:
        records, _ = self.state.decide_create(
            bucket, path, CreateRequest("text/plain", None, None, None, False, data), now
        )
        start = len(self.log)
        self.commit(records)
        return self.log[start:]

    def append(self, path: str, data: bytes, now: int = T0) -> list[Any]:
        r = self.state.decide_append(DEFAULT_BUCKET, path, AppendRequest("text/plain", data, False), now)
        start = len(self.log)
        self.commit([r])
        return self.log[start:]

    def delete_stream(self, path: str, now: int = T0) -> list[Any]:
        start = len(self.log)
        self.commit([self.state.decide_delete(DEFAULT_BUCKET, path, now)])
        return self.log[start:]

    def subscribe(self, sub_id: str, body: dict[str, Any], now: int = T0) -> Any:
        if not self.subs.keys:
            self.commit(self.subs.decide_add_key(KEY))
        records, existing = self.subs.decide_create(
            sub_id, parse_config(body), "http://srv", self.streams(now), now
        )
        assert existing is None
        self.commit(records)
        return self.subs.get(sub_id)

    def token(self, sub_id: str, now: int = T0) -> str:
        return self.subs.token_for(self.subs.get(sub_id), now)


def webhook(pattern: str | None = "events/*", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "webhook", "webhook": {"url": "https://hooks.example.com/x"}, **extra}
    if pattern is not None:
        body["pattern"] = pattern
    return body


def pull(pattern: str | None = "events/*", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "pull-wake", "wake_stream": "wake/pool", **extra}
    if pattern is not None:
        body["pattern"] = pattern
    return body


def err(exc_info: pytest.ExceptionInfo[SubscriptionError]) -> tuple[int, dict[str, Any]]:
    """(status, body) as a client sees the error (through the one error mapper)."""
    response = error_response(exc_info.value)
    assert isinstance(response.body, bytes)
    return response.status, json.loads(response.body)


def kinds(records: list[Any]) -> list[str]:
    return [type(r).__name__ for r in records]


# --------------------------------------------------------------------------- configuration


def test_parse_config_normalizes_and_defaults() -> None:
    cfg = parse_config(
        {
            "type": "webhook",
            "pattern": "/events/*/",
            "streams": ["b/", "/a", "a"],
            "webhook": {"url": "https://h.example.com/"},
            "description": "d",
        }
    )
    assert cfg == SubscriptionConfig(
        "webhook", "events/*", ("a", "b"), "https://h.example.com/", None, DEFAULT_LEASE_TTL_MS, "d"
    )
    cfg2 = parse_config({"type": "pull-wake", "streams": ["x"], "wake_stream": "/w/", "lease_ttl_ms": 1000.0})
    assert (cfg2.wake_stream, cfg2.lease_ttl_ms, cfg2.pattern, cfg2.webhook_url) == ("w", 1000, None, None)


def test_config_hash_covers_every_field_but_not_order() -> None:
    a = parse_config(webhook(streams=["x", "y"], description="d", lease_ttl_ms=5000))
    b = parse_config(webhook(streams=["y", "x", "x/"], description="d", lease_ttl_ms=5000))
    assert a.hash() == b.hash()
    for change in (
        {"description": "e"},
        {"lease_ttl_ms": 5001},
        {"streams": ["x"]},
        {"pattern": "events/**"},
        {"webhook": {"url": "https://hooks.example.com/y"}},
    ):
        assert (
            parse_config({**webhook(streams=["x", "y"], description="d", lease_ttl_ms=5000), **change}).hash()
            != a.hash()
        )
    assert (
        parse_config(pull(streams=["x"])).hash() != parse_config(pull(streams=["x"], wake_stream="w2")).hash()
    )


@pytest.mark.parametrize(
    "body, message",
    [
        ([], "Request body must be a JSON object"),
        ({"type": "poll"}, 'type must be "webhook" or "pull-wake"'),
        (
            {"type": "webhook", "webhook": {"url": "https://a.example.com"}},
            "At least one of pattern or streams is required",
        ),
        (webhook(lease_ttl_ms=999), "lease_ttl_ms must be an integer from 1000 to 600000"),
        (webhook(lease_ttl_ms=600_001), "lease_ttl_ms must be an integer from 1000 to 600000"),
        (webhook(lease_ttl_ms=True), "lease_ttl_ms must be an integer from 1000 to 600000"),
        (webhook(lease_ttl_ms="1000"), "lease_ttl_ms must be an integer from 1000 to 600000"),
        (webhook(lease_ttl_ms=1500.5), "lease_ttl_ms must be an integer from 1000 to 600000"),
        ({"type": "webhook", "pattern": "a/*"}, "webhook subscriptions require webhook.url"),
        ({"type": "webhook", "pattern": "a/*", "webhook": {}}, "webhook subscriptions require webhook.url"),
        ({"type": "pull-wake", "pattern": "a/*"}, "pull-wake subscriptions require wake_stream"),
        (pull(streams=["wake/pool"]), "a subscription's wake_stream cannot also be one of its streams"),
        (webhook(wake_stream="w"), "wake_stream is only for pull-wake subscriptions"),
        (pull(webhook={"url": "https://a.example.com"}), "webhook is only for webhook subscriptions"),
        (webhook(streams="a"), "streams must be an array of stream paths"),
        (webhook(description=5), "description must be a string of at most 4096 characters"),
        (
            webhook(pattern="events/foo*"),
            "pattern wildcards must be whole path segments: * (one segment) or ** (any number)",
        ),
        (webhook(pattern="__ds/*"), "pattern '__ds/*' is under the reserved __ds/ prefix"),
        (webhook(pattern=None, streams=[3]), "streams entry must be a string"),
        (
            webhook(pattern=None, streams=["__ds/x"]),
            "streams entry '__ds/x' is under the reserved __ds/ prefix",
        ),
    ],
)
def test_parse_config_rejects(body: Any, message: str) -> None:
    with pytest.raises(SubscriptionError) as e:
        parse_config(body)
    assert err(e) == (400, {"error": {"code": "INVALID_REQUEST", "message": message}})


def test_parse_config_rejects_bad_paths_and_disabled_webhooks() -> None:
    with pytest.raises(SubscriptionError) as e:
        parse_config(webhook(pattern=None, streams=["a//b"]))
    assert e.value.code == "INVALID_REQUEST" and "non-empty" in (e.value.message or "")
    with pytest.raises(SubscriptionError) as e:
        parse_config(webhook(), webhooks_enabled=False)
    assert err(e) == (
        400,
        {
            "error": {
                "code": "INVALID_REQUEST",
                "message": "webhook subscriptions are not enabled on this server",
            }
        },
    )
    assert parse_config(pull(), webhooks_enabled=False).type == "pull-wake"


def test_small_body_parsers() -> None:
    assert parse_streams_body({"streams": ["/a/", "b", "a"]}) == ("a", "b")
    assert parse_worker({"worker": "w"}) == "w"
    assert parse_wake_request(
        {"wake_id": "w_1", "generation": 2, "acks": [{"stream": "/a", "offset": ZERO}], "done": True}
    ) == WakeRequest("w_1", 2, (("a", 0),), True)
    assert parse_wake_request(
        {"wake_id": "w", "generation": 1, "acks": [{"path": "p", "offset": ZERO}]}
    ).acks == (("p", 0),)
    assert parse_wake_request({"wake_id": "w", "generation": 1}, with_acks=False) == WakeRequest("w", 1)
    for body, message in [
        ({"streams": []}, "streams must be a non-empty array of stream paths"),
        ({}, "streams must be a non-empty array of stream paths"),
    ]:
        with pytest.raises(SubscriptionError) as e:
            parse_streams_body(body)
        assert e.value.message == message
    with pytest.raises(SubscriptionError, match="worker"):
        parse_worker({"worker": ""})
    for body, code, message in [
        ({"generation": 1}, "INVALID_REQUEST", "wake_id must be a non-empty string"),
        ({"wake_id": "w"}, "INVALID_REQUEST", "generation must be an integer from 0 to 9007199254740991"),
        ({"wake_id": "w", "generation": 1, "done": "yes"}, "INVALID_REQUEST", "done must be true or false"),
        (
            {"wake_id": "w", "generation": 1, "acks": {}},
            "INVALID_REQUEST",
            "acks must be an array of {stream, offset}",
        ),
        (
            {"wake_id": "w", "generation": 1, "acks": [{"stream": "a"}]},
            "INVALID_REQUEST",
            "each ack needs a stream path and an offset string",
        ),
        (
            {"wake_id": "w", "generation": 1, "acks": [{"stream": "a", "offset": "12"}]},
            "INVALID_REQUEST",
            "malformed ack offset '12'",
        ),
        (
            {"wake_id": "w", "generation": 1, "acks": [{"stream": "a", "offset": "-1"}]},
            "INVALID_OFFSET",
            "Ack offset must not be -1",
        ),
    ]:
        with pytest.raises(SubscriptionError) as e:
            parse_wake_request(body)
        assert (e.value.code, e.value.message) == (code, message)


def test_subscription_ids() -> None:
    assert validate_subscription_id("sub-1.a_b:c") == "sub-1.a_b:c"
    for bad in ("", "a b", "a/b", "x" * 257, "a\x00"):
        with pytest.raises(SubscriptionError):
            validate_subscription_id(bad)


@pytest.mark.parametrize(
    "pattern, path, matches",
    [
        ("events/*", "events/a", True),
        ("events/*", "events/a/b", False),
        ("events/*", "events", False),
        ("events/**", "events", True),
        ("events/**", "events/a/b/c", True),
        ("**", "anything/at/all", True),
        ("a/**/z", "a/z", True),
        ("a/**/z", "a/b/c/z", True),
        ("a/**/z", "a/b/c/y", False),
        ("*/x", "q/x", True),
        ("a.b/*", "axb/c", False),
        ("a.b/*", "a.b/c", True),
        ("a+(b)/*", "a+(b)/c", True),
    ],
)
def test_glob(pattern: str, path: str, matches: bool) -> None:
    assert glob_match(pattern, path) is matches


# --------------------------------------------------------------------------- tokens & keys


def test_tokens_are_hmac_signed_and_carry_the_wake() -> None:
    claims = TokenClaims("sub", 3, 7, "w_1", 123)
    token = mint_token(b"k" * 32, claims)
    assert read_token([b"other", b"k" * 32], token) == claims
    assert read_token([b"other"], token) is None
    payload, mac = token.split(".")
    forged = (
        base64.urlsafe_b64encode(b'{"sub":"sub","inc":3,"gen":8,"wake":"w_1","exp":123}')
        .rstrip(b"=")
        .decode()
    )
    assert read_token([b"k" * 32], f"{forged}.{mac}") is None
    for junk in ("", "abc", "a.b.c", ".", f"{payload}.", f"{payload}.!!"):
        assert read_token([b"k" * 32], junk) is None


def test_key_id_is_the_rfc7638_thumbprint() -> None:
    # RFC 8037 appendix A.3: the thumbprint of its example Ed25519 key.
    x = base64.urlsafe_b64decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo=")
    assert key_id(x) == "ds_kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_signing_key_is_journaled_once_and_published() -> None:
    w = World()
    assert w.subs.decide_add_key(KEY) == [KEY]
    w.commit([KEY])
    assert w.subs.decide_add_key(KEY) == []
    assert w.subs.jwks() == {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "kid": "ds_test",
                "use": "sig",
                "alg": "EdDSA",
                "x": base64.urlsafe_b64encode(b"p" * 32).rstrip(b"=").decode(),
            }
        ]
    }


def test_backoff_doubles_from_one_second_to_sixty_with_twenty_percent_jitter() -> None:
    assert [backoff_ms(n, 0.0) for n in range(1, 9)] == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]
    assert backoff_ms(1, 1.0) == 1200 and backoff_ms(1, -1.0) == 800 and backoff_ms(100, 1.0) == 72000
    assert backoff_ms(3, 5.0) == 4800  # jitter is clamped to +-20%


# --------------------------------------------------------------------------- create, links


def test_create_backfills_matching_streams_at_their_tails() -> None:
    w = World()
    w.create_stream("events/a", b"12345")
    w.create_stream("events/b")
    w.create_stream("events/deep/c", b"x")
    w.create_stream("other/a", b"x")
    w.create_stream("events/x", b"1", bucket="default")
    sub = w.subscribe("s", webhook(streams=["manual/a", "events/a"]))
    created = w.log[-1]
    assert isinstance(created, SubscriptionCreated)
    assert created.links == (
        LinkSpec("events/a", "explicit", 5),
        LinkSpec("manual/a", "explicit", -1),
        LinkSpec("events/a", "glob", 5),
        LinkSpec("events/b", "glob", 0),
        LinkSpec("events/x", "glob", 1),
    )
    assert {p: (ln.explicit, ln.glob, ln.acked) for p, ln in sub.links.items()} == {
        "events/a": (True, True, 5),
        "manual/a": (True, False, -1),
        "events/b": (False, True, 0),
        "events/x": (False, True, 1),
    }
    assert w.subs.first_pending(sub, w.streams()) is None  # creation replays nothing
    assert sub.wake is None


def test_reconfirm_is_idempotent_and_a_different_config_conflicts() -> None:
    w = World()
    sub = w.subscribe("s", webhook(description="d"))
    assert w.subs.decide_create("s", parse_config(webhook(description="d")), "x", w.streams(), T0 + 5) == (
        [],
        sub,
    )
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_create("s", parse_config(webhook(description="e")), "x", w.streams(), T0)
    assert err(e) == (
        409,
        {
            "error": {
                "code": "SUBSCRIPTION_ALREADY_EXISTS",
                "message": "Subscription already exists with different configuration",
            }
        },
    )


def test_describe_shape() -> None:
    w = World()
    w.create_stream("events/a", b"abc")
    sub = w.subscribe("s", webhook(lease_ttl_ms=1000, description="d"))
    assert views.describe(w.subs, sub, "http://srv/v1/stream/__ds/jwks.json") == {
        "id": "s",
        "subscription_id": "s",
        "type": "webhook",
        "pattern": "events/*",
        "streams": [{"path": "events/a", "link_type": "glob", "acked_offset": format_offset(3)}],
        "webhook": {
            "url": "https://hooks.example.com/x",
            "signing": {
                "alg": "ed25519",
                "kid": "ds_test",
                "jwks_url": "http://srv/v1/stream/__ds/jwks.json",
            },
        },
        "wake_stream": None,
        "lease_ttl_ms": 1000,
        "created_at": iso_ms(T0),
        "status": "active",
        "description": "d",
    }
    assert iso_ms(T0 + 7) == "2023-11-14T22:13:20.007Z"
    p = w.subscribe("p", pull())
    d = views.describe(w.subs, p, "j")
    assert (d["webhook"], d["wake_stream"], d["pattern"]) == (None, "wake/pool", "events/*")


def test_new_matching_stream_is_linked_before_its_first_byte_and_wakes() -> None:
    w = World()
    sub = w.subscribe("s", webhook())
    created = w.create_stream("events/new", b"hello")
    assert kinds(created) == ["StreamCreated", "StreamsLinked", "WakeIssued"]
    assert created[1].links == (LinkSpec("events/new", "glob", -1),)
    wake = created[2]
    assert (wake.generation, wake.stream, wake.snapshot) == (1, "events/new", (("events/new", 5),))
    assert sub.links["events/new"].acked == -1 and sub.wake is not None and sub.generation == 1
    # An empty stream is linked but has nothing pending; other names and buckets are ignored.
    w2 = World()
    w2.state.apply(BucketCreated(name="other", ts_ms=T0))
    w2.subscribe("s", webhook())
    assert kinds(w2.create_stream("events/empty")) == ["StreamCreated", "StreamsLinked"]
    assert kinds(w2.create_stream("elsewhere/x", b"1")) == ["StreamCreated"]
    assert kinds(w2.create_stream("events/q", b"1", bucket="other")) == ["StreamCreated"]


def test_appends_wake_only_idle_subscriptions() -> None:
    w = World()
    w.create_stream("events/a")
    sub = w.subscribe("s", webhook())
    assert kinds(w.append("events/a", b"abc", T0 + 1)) == ["Appended", "WakeIssued"]
    assert kinds(w.append("events/a", b"d", T0 + 2)) == ["Appended"]  # a wake is in flight
    assert sub.wake is not None and sub.wake.snapshot == {"events/a": 3}
    # The receiver accepts: the lease runs; while it runs no new wake.
    w.commit(w.subs.decide_delivered("s", sub.wake.wake_id, False, w.streams(T0 + 3), T0 + 3))
    assert sub.wake.lease_expires_ms == T0 + 3 + DEFAULT_LEASE_TTL_MS
    assert kinds(w.append("events/a", b"e", T0 + 4)) == ["Appended"]
    # Once the lease ran out, an append wakes again (the old wake is superseded).
    late = T0 + 3 + DEFAULT_LEASE_TTL_MS
    assert not wake_live(sub, late)
    out = w.append("events/a", b"f", late)
    assert kinds(out) == ["Appended", "WakeIssued"] and out[1].generation == 2


def test_explicit_links_add_remove_and_glob_precedence() -> None:
    w = World()
    w.create_stream("events/a", b"xy")
    w.create_stream("manual/b", b"xyz")
    sub = w.subscribe("s", webhook())
    assert w.subs.decide_add_streams("s", ["manual/b", "events/a", "manual/none"], w.streams(), T0) == [
        StreamsLinked(
            "s",
            T0,
            (
                LinkSpec("manual/b", "explicit", 3),
                LinkSpec("events/a", "explicit", 2),
                LinkSpec("manual/none", "explicit", -1),
            ),
        )
    ]
    w.commit(w.subs.decide_add_streams("s", ["manual/b", "events/a", "manual/none"], w.streams(), T0))
    assert w.subs.decide_add_streams("s", ["manual/b"], w.streams(), T0) == []  # idempotent
    assert sub.links["events/a"].link_type == "explicit"
    assert w.subs.decide_remove_stream("s", "events/a", T0) == [ExplicitLinkRemoved("s", "events/a", T0)]
    w.commit(w.subs.decide_remove_stream("s", "events/a", T0))
    assert sub.links["events/a"].link_type == "glob"  # the glob link stays
    w.commit(w.subs.decide_remove_stream("s", "manual/b", T0))
    assert "manual/b" not in sub.links and "manual/b" not in w.subs.by_path
    assert w.subs.decide_remove_stream("s", "manual/b", T0) == []  # idempotent
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_add_streams("nope", ["a"], w.streams(), T0)
    assert err(e) == (404, {"error": {"code": "SUBSCRIPTION_NOT_FOUND", "message": "Subscription not found"}})
    with pytest.raises(SubscriptionError):
        w.subs.decide_remove_stream("nope", "a", T0)
    p = w.subscribe("p", pull())
    with pytest.raises(SubscriptionError, match="wake_stream"):
        w.subs.decide_add_streams(p.id, ["wake/pool"], w.streams(), T0)


def test_a_pull_subscription_never_links_its_own_wake_stream() -> None:
    w = World()
    w.create_stream("wake/pool")
    sub = w.subscribe("p", pull(pattern="**"))
    assert "wake/pool" not in sub.links
    assert kinds(w.append("wake/pool", b"{}\n")) == ["Appended"]


def test_deleted_streams_unlink_glob_links_and_reset_explicit_ones() -> None:
    w = World()
    w.create_stream("events/a", b"abc")
    sub = w.subscribe("s", webhook(streams=["events/a"]))
    w.create_stream("events/b", b"1")
    out = w.delete_stream("events/b")
    assert kinds(out) == ["StreamDeleted", "StreamGone"] and out[1] == StreamGone("events/b", T0)
    assert "events/b" not in sub.links
    w.delete_stream("events/a")
    link = sub.links["events/a"]
    assert (link.explicit, link.glob, link.acked) == (True, False, -1)
    # Created again: linked by the glob too, and its data is pending from the start.
    w.commit(w.subs.decide_delivered("s", sub.wake.wake_id, True, w.streams(), T0) if sub.wake else [])
    out = w.create_stream("events/a", b"z")
    assert kinds(out)[:2] == ["StreamCreated", "StreamsLinked"]
    assert sub.links["events/a"].glob and w.subs.first_pending(sub, w.streams()) == "events/a"
    # Deleting a stream no subscription links produces nothing.
    w.create_stream("other", b"q")
    assert kinds(w.delete_stream("other")) == ["StreamDeleted"]


def test_delete_subscription() -> None:
    w = World()
    w.create_stream("events/a", b"1")
    w.subscribe("s", webhook())
    assert w.subs.decide_delete("s", T0) == [SubscriptionDeleted("s", T0)]
    w.commit(w.subs.decide_delete("s", T0))
    assert "s" not in w.subs.subs and w.subs.by_path == {}
    assert w.subs.decide_delete("s", T0) == []
    # The same id again is a new incarnation: old tokens never validate against it.
    sub = w.subscribe("s", webhook())
    assert sub.incarnation == 2


# --------------------------------------------------------------------------- pull-wake


def pull_world() -> tuple[World, Any]:
    w = World()
    w.create_stream("wake/pool")
    w.create_stream("events/a", b"abc")
    sub = w.subscribe("p", pull(lease_ttl_ms=1000))
    return w, sub


def test_claim_ack_release_cycle() -> None:
    w, sub = pull_world()
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_claim("p", "w1", w.streams(), T0)
    assert err(e) == (
        409,
        {"error": {"code": "NO_PENDING_WORK", "message": "Subscription has no pending work"}},
    )
    issued = w.append("events/a", b"de", T0 + 1)[1]
    assert isinstance(issued, WakeIssued) and issued.generation == 1
    assert w.subs.due_work("p", T0 + 1) == ("wake-event", None)
    claim = w.subs.decide_claim("p", "w1", w.streams(), T0 + 2)
    assert claim == [WakeClaimed("p", 1, issued.wake_id, "w1", T0 + 2, T0 + 1002)]
    w.commit(claim)
    assert w.subs.due_work("p", T0 + 2) == (None, T0 + 1002)
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_claim("p", "w2", w.streams(), T0 + 3)
    assert err(e) == (
        409,
        {
            "error": {
                "code": "ALREADY_CLAIMED",
                "message": "The wake is already claimed",
                "current_holder": "w1",
                "generation": 1,
            }
        },
    )
    token = w.token("p", T0 + 2)
    # Heartbeat: an ack without done extends the lease.
    records, nxt = w.subs.decide_ack(
        "p", token, WakeRequest(issued.wake_id, 1, (("events/a", 3),)), w.streams(), T0 + 500, pull_only=True
    )
    assert (records, nxt) == (
        [Acked("p", 1, issued.wake_id, T0 + 500, (("events/a", 3),), False, T0 + 1500)],
        False,
    )
    w.commit(records)
    assert sub.links["events/a"].acked == 3 and wake_live(sub, T0 + 1400)
    # More data, then done: acks what it processed and is woken again for the rest.
    w.append("events/a", b"f", T0 + 600)
    records, nxt = w.subs.decide_ack(
        "p",
        token,
        WakeRequest(issued.wake_id, 1, (("events/a", 5),), True),
        w.streams(),
        T0 + 700,
        pull_only=True,
    )
    assert kinds(records) == ["Acked", "WakeIssued"] and nxt is True and records[1].generation == 2
    w.commit(records)
    # Claim the new wake, then release it: the work is still pending, so another wake follows.
    w.commit(w.subs.decide_claim("p", "w2", w.streams(), T0 + 800))
    token2 = w.token("p", T0 + 800)
    wake2 = sub.wake.wake_id
    released = w.subs.decide_release("p", token2, WakeRequest(wake2, 2), w.streams(), T0 + 900)
    assert kinds(released) == ["WakeEnded", "WakeIssued"] and released[0].reason == "released"
    w.commit(released)
    assert sub.generation == 3 and sub.wake.holder is None
    # Releasing a wake that has already moved on is fenced.
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_release("p", token2, WakeRequest(wake2, 2), w.streams(), T0 + 901)
    assert err(e) == (409, {"error": {"code": "FENCED", "message": "Wake generation is stale"}})


def test_ack_validation_errors() -> None:
    w, sub = pull_world()
    w.append("events/a", b"de", T0 + 1)
    w.commit(w.subs.decide_claim("p", "w1", w.streams(), T0 + 2))
    token, wake_id = w.token("p", T0 + 2), sub.wake.wake_id

    def ack(
        req: WakeRequest, token: str | None = token, now: int = T0 + 3, sub_id: str = "p"
    ) -> tuple[int, dict[str, Any]]:
        with pytest.raises(SubscriptionError) as e:
            w.subs.decide_ack(sub_id, token, req, w.streams(now), now, pull_only=True)
        return err(e)

    def inv(msg: str) -> tuple[int, dict[str, Any]]:
        return 409, {"error": {"code": "INVALID_OFFSET", "message": msg}}

    fenced = (409, {"error": {"code": "FENCED", "message": "Wake generation is stale"}})
    assert ack(WakeRequest(wake_id, 1, (("events/zz", 0),))) == inv(
        "Ack references an unknown subscription stream"
    )
    assert ack(WakeRequest(wake_id, 1, (("events/a", 2),))) == inv(
        "Ack offset regresses the committed cursor"
    )
    assert ack(WakeRequest(wake_id, 1, (("events/a", 6),))) == inv("Ack offset is beyond stream tail")
    assert ack(WakeRequest(wake_id, 2)) == fenced
    assert ack(WakeRequest("w_other", 1)) == fenced
    assert ack(WakeRequest(wake_id, 1), now=T0 + 2 + 1000) == fenced  # the lease ran out
    assert ack(WakeRequest(wake_id, 1), token="garbage") == (
        401,
        {"error": {"code": "TOKEN_INVALID", "message": "Token invalid"}},
    )
    assert ack(WakeRequest(wake_id, 1), token=None)[1]["error"]["code"] == "TOKEN_INVALID"
    expired_at = T0 + 2 + 24 * 3600 * 1000 + 1000
    assert ack(WakeRequest(wake_id, 1), now=expired_at) == (
        401,
        {"error": {"code": "TOKEN_EXPIRED", "message": "Token expired"}},
    )
    assert ack(WakeRequest(wake_id, 1), sub_id="nope")[0] == 404
    # A token of another subscription (or another incarnation of this one) is invalid here.
    w.subscribe("q", pull(pattern="events/**"))
    assert ack(WakeRequest(wake_id, 1), sub_id="q") == (
        401,
        {"error": {"code": "TOKEN_INVALID", "message": "Token invalid"}},
    )
    # ack and release are for pull-wake subscriptions; a webhook's callback path is decide_ack(pull_only=False).
    w.subscribe("h", webhook(pattern="events/*"))
    assert ack(WakeRequest(wake_id, 1), sub_id="h") == (
        400,
        {"error": {"code": "INVALID_REQUEST", "message": "Subscription is not pull-wake"}},
    )
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_claim("h", "w", w.streams(), T0)
    assert e.value.code == "INVALID_REQUEST"
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_release("h", token, WakeRequest(wake_id, 1), w.streams(), T0)
    assert e.value.code == "INVALID_REQUEST"


def test_expired_lease_lets_another_worker_claim_a_new_generation() -> None:
    w, sub = pull_world()
    w.append("events/a", b"de", T0 + 1)
    w.commit(w.subs.decide_claim("p", "w1", w.streams(), T0 + 2))
    old_token, old_wake = w.token("p", T0 + 2), sub.wake.wake_id
    later = T0 + 2 + 1000
    records = w.subs.decide_claim("p", "w2", w.streams(later), later)
    assert kinds(records) == ["WakeIssued", "WakeClaimed"] and records[1].generation == 2
    w.commit(records)
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_ack("p", old_token, WakeRequest(old_wake, 1), w.streams(later), later, pull_only=True)
    assert e.value.code == "FENCED"


def test_decide_expire_ends_or_renews_run_out_leases() -> None:
    w, sub = pull_world()
    w.append("events/a", b"de", T0 + 1)
    w.commit(w.subs.decide_claim("p", "w1", w.streams(), T0 + 2))
    assert w.subs.decide_expire(["p", "missing"], w.streams(), T0 + 500) == []
    renewed = w.subs.decide_expire(["p"], w.streams(), T0 + 1002)
    assert kinds(renewed) == ["WakeIssued"] and renewed[0].generation == 2
    # With nothing pending, the wake just ends.
    w2, sub2 = pull_world()
    w2.append("events/a", b"de", T0 + 1)
    w2.commit(w2.subs.decide_claim("p", "w1", w2.streams(), T0 + 2))
    tok = w2.token("p", T0 + 2)
    w2.commit(
        w2.subs.decide_ack(
            "p",
            tok,
            WakeRequest(sub2.wake.wake_id, 1, (("events/a", 5),)),
            w2.streams(),
            T0 + 3,
            pull_only=True,
        )[0]
    )
    ended = w2.subs.decide_expire(["p"], w2.streams(), T0 + 3 + 1000)
    assert ended == [WakeEnded("p", 1, sub2.wake.wake_id, T0 + 1003, "lease-expired")]
    w2.commit(ended)
    assert sub2.wake is None


def test_recover_fences_every_outstanding_wake() -> None:
    w, sub = pull_world()
    w.create_stream("events/b", b"1")
    w.subscribe("idle", pull(pattern="nothing/*"))
    w.commit(w.subs.decide_claim("p", "w1", w.streams(), T0 + 2))
    tok = w.token("p", T0 + 2)
    # Everything processed but not done: no pending work, yet a wake (and its token) is out.
    w.commit(
        w.subs.decide_ack(
            "p",
            tok,
            WakeRequest(sub.wake.wake_id, 1, (("events/b", 1),)),
            w.streams(),
            T0 + 3,
            pull_only=True,
        )[0]
    )
    assert w.subs.decide_recover(w.streams(), T0 + 10) == [GenerationFenced("p", 2, T0 + 10, "restart")]
    w.commit(w.subs.decide_recover(w.streams(), T0 + 10))
    assert (sub.generation, sub.wake) == (2, None)
    w.append("events/a", b"x", T0 + 11)  # pending work again: a wake, and after a restart a newer one
    assert sub.generation == 3
    again = w.subs.decide_recover(w.streams(), T0 + 12)
    assert kinds(again) == ["WakeIssued"] and again[0].generation == 4


# --------------------------------------------------------------------------- webhooks


def webhook_world() -> tuple[World, Any, WakeIssued]:
    w = World()
    sub = w.subscribe("h", webhook(lease_ttl_ms=2000))
    issued = w.create_stream("events/a", b"abc")[-1]
    assert isinstance(issued, WakeIssued)
    return w, sub, issued


def test_webhook_body_lists_the_wake_snapshot() -> None:
    w, sub, issued = webhook_world()
    w.append("events/a", b"more")  # after the snapshot: not in this wake
    body = views.webhook_body(w.subs, sub, "http://srv/cb", "tok")
    assert body == {
        "subscription_id": "h",
        "wake_id": issued.wake_id,
        "generation": 1,
        "streams": [
            {
                "path": "events/a",
                "link_type": "glob",
                "acked_offset": "-1",
                "tail_offset": format_offset(3),
                "has_pending": True,
            }
        ],
        "callback_url": "http://srv/cb",
        "callback_token": "tok",
    }
    assert views.stream_infos(w.subs, sub, w.streams())[0]["tail_offset"] == format_offset(7)


def test_webhook_done_auto_acks_the_snapshot_and_wakes_for_newer_data() -> None:
    w, sub, issued = webhook_world()
    assert w.subs.due_work("h", T0) == ("deliver", None)
    w.append("events/a", b"more")
    records = w.subs.decide_delivered("h", issued.wake_id, True, w.streams(T0 + 5), T0 + 5)
    assert kinds(records) == ["WebhookDelivered", "Acked", "WakeIssued"]
    assert records[1] == Acked("h", 1, issued.wake_id, T0 + 5, (("events/a", 3),), True, T0 + 2005)
    w.commit(records)
    assert sub.links["events/a"].acked == 3 and sub.generation == 2
    assert (
        w.subs.decide_delivered("h", issued.wake_id, True, w.streams(), T0 + 6) == []
    )  # stale, healthy: nothing


def test_webhook_callback_acks_extends_and_finishes() -> None:
    w, sub, issued = webhook_world()
    w.commit(w.subs.decide_delivered("h", issued.wake_id, False, w.streams(T0 + 1), T0 + 1))
    assert w.subs.due_work("h", T0 + 1) == (None, T0 + 2001)
    token = w.token("h", T0 + 1)
    records, nxt = w.subs.decide_ack(
        "h",
        token,
        WakeRequest(issued.wake_id, 1, (("events/a", 2),)),
        w.streams(),
        T0 + 1500,
        pull_only=False,
    )
    assert nxt is False and records[0].lease_expires_ms == T0 + 3500
    w.commit(records)
    records, nxt = w.subs.decide_ack(
        "h",
        token,
        WakeRequest(issued.wake_id, 1, (("events/a", 3),), True),
        w.streams(),
        T0 + 1600,
        pull_only=False,
    )
    assert (kinds(records), nxt) == (["Acked"], False)
    w.commit(records)
    assert sub.wake is None
    with pytest.raises(SubscriptionError) as e:
        w.subs.decide_ack(
            "h",
            token,
            WakeRequest(issued.wake_id, 1, (("events/a", 3),), True),
            w.streams(),
            T0 + 1700,
            pull_only=False,
        )
    assert e.value.code == "FENCED"


def test_failed_deliveries_retry_on_a_journaled_schedule() -> None:
    w, sub, issued = webhook_world()
    f1 = w.subs.decide_delivery_failed("h", issued.wake_id, "HTTP 500", 0.0, T0 + 10)
    assert f1 == [WebhookFailed("h", 1, issued.wake_id, T0 + 10, 1, T0 + 1010, "HTTP 500")]
    w.commit(f1)
    assert (sub.status, sub.attempts) == ("failed", 1)
    assert w.subs.due_work("h", T0 + 500) == (None, T0 + 1010)
    assert w.subs.due_work("h", T0 + 1010) == ("deliver", None)
    assert wake_live(sub, T0 + 10**9)  # an undelivered wake does not expire: it is retried
    f2 = w.subs.decide_delivery_failed("h", issued.wake_id, "timeout", 1.0, T0 + 1100)
    assert f2[0].attempts == 2 and f2[0].next_attempt_ms == T0 + 1100 + 2400
    w.commit(f2)
    w.commit(w.subs.decide_delivered("h", issued.wake_id, False, w.streams(), T0 + 4000))
    assert (sub.status, sub.attempts, sub.next_attempt_ms) == ("active", 0, None)
    assert w.subs.decide_delivery_failed("h", issued.wake_id, "x", 0.0, T0) == []  # already delivered
    assert w.subs.decide_delivery_failed("nope", "w", "x", 0.0, T0) == []


# --------------------------------------------------------------------------- persistence


def test_records_round_trip_through_the_journal_codec() -> None:
    w, sub, issued = webhook_world()
    w.commit(w.subs.decide_delivery_failed("h", issued.wake_id, "HTTP 500", 0.5, T0 + 1))
    for r in w.log:
        assert decode_record(encode_record(r)) == r
    assert encode_record(issued)[:20].find(b"sub.wake.v1") >= 0


def test_replay_and_snapshot_restore_rebuild_the_same_state() -> None:
    w, sub, issued = webhook_world()
    w.create_stream("wake/pool")
    w.subscribe("p", pull(streams=["manual/x"], lease_ttl_ms=1000))
    w.append("events/a", b"zz", T0 + 1)
    w.commit(w.subs.decide_claim("p", "w1", w.streams(), T0 + 2))
    w.commit(w.subs.decide_delivery_failed("h", issued.wake_id, "HTTP 500", 0.0, T0 + 3))
    data = w.subs.snapshot()
    replayed = World()
    for r in w.log:
        replayed.state.apply(r, (1, 8) if getattr(r, "data", b"") else None)
    assert replayed.subs.snapshot() == data
    restored = SubscriptionState()
    restored.restore(data)
    assert restored.snapshot() == data
    assert restored.by_path == w.subs.by_path
    assert restored.jwks() == w.subs.jwks()
    assert restored.subs["h"].matcher is not None and restored.subs["p"].wake.holder == "w1"
    # A token minted before the snapshot still validates (then fences) against the restored state.
    token = w.token("p", T0 + 2)
    restored.check_token(restored.subs["p"], token, T0 + 3)


def test_listener_and_dirty_set_tell_the_shell_what_changed() -> None:
    w = World()
    calls: list[int] = []
    w.subs.listener = lambda: calls.append(1)
    w.subscribe("s", webhook())
    w.subs.dirty.clear()
    w.create_stream("events/a", b"1")
    assert w.subs.dirty == {"s"} and calls
