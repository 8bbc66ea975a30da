"""Subscriptions across restarts: SIGKILL (journal replay) and SIGTERM (snapshot restore).

What must hold afterwards: subscriptions, links and acked offsets as they
were; every wake outstanding before the crash fenced (its tokens get
``FENCED``; generations only move forward); the webhook signing keys
unchanged (same JWKS, and new deliveries verify against the old one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.http_helpers import append, create, read, stream_url
from tests.support.server_process import ServerProcess
from tests.support.subscription_helpers import WebhookReceiver, call, verify_signature, wait_until
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(120)

FENCED = {"error": {"code": "FENCED", "message": "Wake generation is stale"}}


def restart(old: ServerProcess, *, kill: bool) -> ServerProcess:
    if kill:
        old.kill()
    else:
        assert old.stop() == 0, old.log()
    new = ServerProcess(old.data_dir, "--long-poll-timeout-s", "2", "--webhook-allow-loopback", "true")
    new.port = old.port  # same address: stored callback URLs stay valid
    return new.start()


def sub_url(srv: ServerProcess, sub_id: str, *rest: str) -> str:
    return "/".join([f"{srv.url}/v1/stream/__ds/subscriptions/{sub_id}", *rest])


def get(srv: ServerProcess, url: str) -> Any:
    status, body, _ = call("GET", url)
    assert status == 200, (url, status, body)
    return body


def wake_events(srv: ServerProcess, path: str) -> list[dict[str, Any]]:
    import json

    status, _, raw = read(stream_url(srv.url, path), "-1")
    assert status == 200
    return json.loads(raw)


def put_json(srv: ServerProcess, path: str, data: str = "") -> None:
    assert create(stream_url(srv.url, path), "application/json", data)[0] == 201


def test_subscriptions_survive_sigkill_and_pre_crash_tokens_are_fenced(tmp_path: Path) -> None:
    srv = ServerProcess(
        tmp_path / "data", "--long-poll-timeout-s", "2", "--webhook-allow-loopback", "true"
    ).start()
    with WebhookReceiver() as rx:
        try:
            put_json(srv, "wake/pool", "[]")
            put_json(srv, "ns/b")
            put_json(srv, "manual/x", '{"m":1}')
            assert (
                call(
                    "PUT",
                    sub_url(srv, "hook"),
                    {
                        "type": "webhook",
                        "pattern": "ns/*",
                        "streams": ["manual/x"],
                        "webhook": {"url": rx.url},
                        "lease_ttl_ms": 60000,
                        "description": "h",
                    },
                )[0]
                == 201
            )
            assert (
                call(
                    "PUT",
                    sub_url(srv, "pull"),
                    {
                        "type": "pull-wake",
                        "pattern": "ns/*",
                        "wake_stream": "wake/pool",
                        "lease_ttl_ms": 60000,
                    },
                )[0]
                == 201
            )
            jwks_before = get(srv, f"{srv.url}/v1/stream/__ds/jwks.json")
            put_json(srv, "ns/a", '{"n":1}')  # 8 bytes stored: '{"n":1}\n'
            first = rx.wait_for(1)
            assert verify_signature(first, jwks_before)
            hook_token, hook_wake = first.body["callback_token"], first.body["wake_id"]
            assert (
                call(
                    "POST",
                    first.body["callback_url"],
                    {
                        "wake_id": hook_wake,
                        "generation": 1,
                        "acks": [{"stream": "ns/a", "offset": format_offset(8)}],
                    },
                    token=hook_token,
                )[0]
                == 200
            )
            append(
                stream_url(srv.url, "ns/a"), '{"n":2}', "application/json"
            )  # tail 16; both wakes still out
            wait_until(lambda: wake_events(srv, "wake/pool"))
            status, claimed, _ = call("POST", sub_url(srv, "pull", "claim"), {"worker": "w1"})
            assert status == 200 and claimed["generation"] == 1
            assert (
                call(
                    "POST",
                    sub_url(srv, "pull", "ack"),
                    {
                        "wake_id": claimed["wake_id"],
                        "generation": 1,
                        "acks": [{"stream": "ns/a", "offset": format_offset(16)}],
                    },
                    token=claimed["token"],
                )[0]
                == 200
            )
            hook_before, pull_before = get(srv, sub_url(srv, "hook")), get(srv, sub_url(srv, "pull"))
            assert hook_before["streams"] == [
                {"path": "manual/x", "link_type": "explicit", "acked_offset": format_offset(8)},
                {"path": "ns/a", "link_type": "glob", "acked_offset": format_offset(8)},
                {"path": "ns/b", "link_type": "glob", "acked_offset": format_offset(0)},
            ]
            assert pull_before["streams"][0] == {
                "path": "ns/a",
                "link_type": "glob",
                "acked_offset": format_offset(16),
            }

            srv = restart(srv, kill=True)

            assert get(srv, sub_url(srv, "hook")) == hook_before
            assert get(srv, sub_url(srv, "pull")) == pull_before
            assert get(srv, f"{srv.url}/v1/stream/__ds/jwks.json") == jwks_before
            # The webhook had pending work (acked 8 of 16): a fresh wake, newer generation, signed with the same key.
            again = rx.wait_for(2)
            assert verify_signature(again, jwks_before)
            assert again.body["generation"] == 2 and again.body["wake_id"] != hook_wake
            assert again.body["streams"][0]["acked_offset"] == format_offset(8)
            assert call(
                "POST",
                first.body["callback_url"],
                {"wake_id": hook_wake, "generation": 1, "done": True},
                token=hook_token,
            )[:2] == (409, FENCED)
            assert call(
                "POST",
                first.body["callback_url"],
                {"wake_id": again.body["wake_id"], "generation": 2, "done": True},
                token=hook_token,
            )[:2] == (409, FENCED)
            # The pull worker's claim did not survive: its token is fenced, and its lease is gone.
            base = {"wake_id": claimed["wake_id"], "generation": 1}
            assert call("POST", sub_url(srv, "pull", "ack"), {**base, "done": True}, token=claimed["token"])[
                :2
            ] == (409, FENCED)
            assert call("POST", sub_url(srv, "pull", "release"), base, token=claimed["token"])[:2] == (
                409,
                FENCED,
            )
            assert call("POST", sub_url(srv, "pull", "claim"), {"worker": "w2"})[0] == 409  # nothing pending
            append(stream_url(srv.url, "ns/b"), '{"b":1}', "application/json")
            events = wait_until(
                lambda: (e := wake_events(srv, "wake/pool")) and e[-1]["generation"] > 1 and e
            )
            assert (
                events[-1]["generation"] == 3 and events[-1]["stream"] == "ns/b"
            )  # 2 went to the restart fence
            status, claimed2, _ = call("POST", sub_url(srv, "pull", "claim"), {"worker": "w2"})
            assert status == 200 and claimed2["generation"] == 3
            assert claimed2["streams"][0]["acked_offset"] == format_offset(16)
        finally:
            srv.stop()


def test_clean_restart_then_crash_keeps_keys_links_and_retry_state(tmp_path: Path) -> None:
    srv = ServerProcess(
        tmp_path / "data", "--long-poll-timeout-s", "2", "--webhook-allow-loopback", "true"
    ).start()
    with WebhookReceiver(lambda i, body: (503, {})) as rx:
        try:
            put_json(srv, "jobs/a", '{"j":1}')
            assert (
                call(
                    "PUT",
                    sub_url(srv, "failing"),
                    {"type": "webhook", "pattern": "jobs/**", "webhook": {"url": rx.url}},
                )[0]
                == 201
            )
            assert call("POST", sub_url(srv, "failing", "streams"), {"streams": ["extra/one"]})[0] == 204
            append(stream_url(srv.url, "jobs/a"), '{"j":2}', "application/json")
            rx.wait_for(1)
            wait_until(lambda: get(srv, sub_url(srv, "failing"))["status"] == "failed")
            jwks_before = get(srv, f"{srv.url}/v1/stream/__ds/jwks.json")
            before = get(srv, sub_url(srv, "failing"))

            srv = restart(srv, kill=False)  # SIGTERM: state comes back from the snapshot
            after = get(srv, sub_url(srv, "failing"))
            assert after == before and after["status"] == "failed"
            assert get(srv, f"{srv.url}/v1/stream/__ds/jwks.json") == jwks_before

            srv = restart(srv, kill=True)  # snapshot plus the journal after it
            assert get(srv, sub_url(srv, "failing"))["streams"] == before["streams"]
            assert get(srv, f"{srv.url}/v1/stream/__ds/jwks.json") == jwks_before
            # Deliveries carry on with newer generations, still signed by the same key.
            later = rx.wait_for(len(rx.received) + 1, timeout=70)
            assert later.body["generation"] >= 2 and verify_signature(later, jwks_before)
        finally:
            srv.stop()
