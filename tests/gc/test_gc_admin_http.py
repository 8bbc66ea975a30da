"""The admin HTTP API: every route with exact statuses and bodies, and its authentication.

* Routes (in-process server on 127.0.0.1, virtual clock): ``DELETE /v1/buckets/{b}``,
  ``PUT /v1/admin/retention/{b}[/{path}]``, ``POST /v1/admin/retain/{b}/{path}``,
  ``POST``/``GET /v1/admin/gc`` and ``GET /metrics``; erased names are fenced forever.
* Authentication, on a real ``tiered serve`` with ``TIERED_ADMIN_TOKEN`` set: no token,
  a wrong token or another scheme is 401 with ``WWW-Authenticate: Bearer``; the right one
  works for every route, ``/metrics`` included. Every refusal changes nothing.
* No token and a non-loopback listener, or auth on (``tokens``, ``jwt``) wherever it
  listens: admin calls are 403. Tested without binding a non-loopback address:
  ``AdminGuard.check`` directly, and an in-process server whose configuration says
  ``host = "0.0.0.0"`` while the test server itself listens on loopback.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gc_support import HttpHarness, VirtualClock, make_config, object_files
from tests.support.http_helpers import request
from tests.support.metrics_helpers import families, samples
from tests.support.server_process import ServerProcess
from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.types import Request
from tiered.core.config import Config
from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import format_offset

pytestmark = pytest.mark.timeout(120)

GRACE_MS = 10_000
TOKEN = "s3cret-admin-token"
REPORT_KEYS = {
    "dry_run",
    "started_ms",
    "finished_ms",
    "streams_expired",
    "producer_states_expired",
    "retention_advanced",
    "bytes_released",
    "objects_released",
    "objects_deleted",
    "bytes_deleted",
    "orphans_found",
    "orphans_deleted",
    "segments_deleted",
    "would_delete",
    "errors",
    "integrity_errors",
    "objects_rewritten",  # issue 21: erasure rewrites
    "would_rewrite",
    "streams_compacted",  # issue 21: keyed compaction
    "messages_compacted",
    "would_compact",
    "objects_compacted",  # issue 21: physical keyed compaction (``compaction-reclaim``)
    "compaction_bytes_reclaimed",
    "key_indexes_written",  # issue 21: key indexes (gc/key_index.py)
    "compaction_skipped",  # issue 21: keyed compaction left a stream that changed meanwhile
}
TOTALS_KEYS = {
    "passes",
    "bytes_reclaimed",
    "objects_deleted",
    "orphans_found",
    "producer_states_expired",
    "integrity_errors",
    "errors",
    "last_pass_ms",
}
OCTET = {"Content-Type": "application/octet-stream"}


def err(body: bytes) -> str:
    return json.loads(body)["error"]["message"]


def run(
    config: Config, body: Any, clock: VirtualClock | None = None, env: dict[str, str] | None = None
) -> None:
    clock = clock or VirtualClock()

    async def main() -> None:
        h = HttpHarness(config, clock=clock)
        await h.start()
        try:
            await body(h, clock)
        finally:
            await h.stop()

    asyncio.run(main())


@pytest.fixture
def no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)


# --------------------------------------------------------------------------- DELETE /v1/buckets/{b}


def test_erase_bucket_statuses_bodies_and_fencing(tmp_path: Path, no_token_env: None) -> None:
    config = make_config(tmp_path / "data", gc_grace_s=GRACE_MS / 1000)

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        assert (await h.http("PUT", "/v1/buckets/logs"))[0] == 201
        assert (await h.http("PUT", "/v1/buckets/logs/stream/a/b", headers=OCTET, body=b"payload"))[0] == 201
        assert (await h.http("PUT", "/v1/stream/keep", headers=OCTET, body=b"default data"))[0] == 201

        status, headers, raw = await h.http("DELETE", "/v1/buckets/logs")
        assert (status, raw) == (204, b"")
        # Gone: the bucket, its streams, and it is not listed.
        assert (await h.http("GET", "/v1/buckets/logs"))[0] == 404
        assert (await h.http("GET", "/v1/buckets/logs/stream/a/b?offset=-1"))[0] == 404
        status, _, raw = await h.http("GET", "/v1/buckets")
        assert status == 200 and [b["name"] for b in json.loads(raw)["buckets"]] == ["default"]
        # Fenced forever: erasing again, re-creating it, creating a stream in it.
        status, _, raw = await h.http("DELETE", "/v1/buckets/logs")
        assert (status, err(raw)) == (410, "bucket 'logs' was already erased")
        status, _, raw = await h.http("PUT", "/v1/buckets/logs")
        assert (status, err(raw)) == (409, "bucket 'logs' was erased; its name can never be used again")
        status, _, raw = await h.http("PUT", "/v1/buckets/logs/stream/a/b", headers=OCTET)
        assert (status, err(raw)) == (409, "bucket 'logs' was erased")
        # Refusals: the default bucket, a bucket that never existed, a bad name.
        status, _, raw = await h.http("DELETE", "/v1/buckets/default")
        assert (status, err(raw)) == (409, "the default bucket cannot be erased; delete its streams instead")
        status, _, raw = await h.http("DELETE", "/v1/buckets/never-was")
        assert (status, err(raw)) == (404, "bucket 'never-was' does not exist")
        status, _, raw = await h.http("DELETE", "/v1/buckets/Bad_Name")
        assert status == 400 and "bucket names are 3-63 characters" in err(raw)
        assert (await h.http("GET", "/v1/stream/keep?offset=-1"))[2] == b"default data"
        assert h.s.state.buckets.keys() == {"default"}

        # The fence survives restarts (crash: journal replay; clean: snapshot).
        for crash in (True, False):
            await h.restart(crash=crash)
            status, _, raw = await h.http("PUT", "/v1/buckets/logs")
            assert (status, err(raw)) == (409, "bucket 'logs' was erased; its name can never be used again")
            assert (await h.http("PUT", "/v1/buckets/logs/stream/x", headers=OCTET))[0] == 409
            assert (await h.http("DELETE", "/v1/buckets/logs"))[0] == 410

    run(config, body)


def test_erasing_a_bucket_releases_its_long_poll_readers_at_once(tmp_path: Path, no_token_env: None) -> None:
    config = make_config(tmp_path / "data", long_poll_timeout_s=5)

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.bucket("live")
        await h.create("live", "s", b"abc")
        tail = format_offset(3)
        started = time.monotonic()
        poll = asyncio.create_task(h.http("GET", f"/v1/buckets/live/stream/s?offset={tail}&live=long-poll"))
        await asyncio.sleep(0.2)
        assert (await h.http("DELETE", "/v1/buckets/live"))[0] == 204
        status, _, _ = await poll
        assert status == 404
        assert time.monotonic() - started < 1.5, "the reader waited for its long-poll timeout"

    run(config, body)


# --------------------------------------------------------------------------- retention routes


def test_retention_policy_route(tmp_path: Path, no_token_env: None) -> None:
    config = make_config(tmp_path / "data")

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.bucket("metrics")
        await h.create("metrics", "cpu/host-1", b"x" * 10)
        state = h.s.state
        status, headers, raw = await h.http(
            "PUT", "/v1/admin/retention/metrics", json_body={"retention_ms": 60_000, "retention_bytes": None}
        )
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        assert json.loads(raw) == {"retention_ms": 60_000, "retention_bytes": None}
        assert state.bucket_retention["metrics"] == (60_000, None)
        status, _, raw = await h.http(
            "PUT", "/v1/admin/retention/metrics/cpu/host-1", json_body={"retention_bytes": 5}
        )
        assert (status, json.loads(raw)) == (200, {"retention_ms": None, "retention_bytes": 5})
        s = h.s.streams.lookup("metrics", "cpu/host-1")
        assert (s.retention_ms, s.retention_bytes) == (None, 5)
        # An empty body clears the stream's own policy (it follows the bucket's again).
        status, _, raw = await h.http("PUT", "/v1/admin/retention/metrics/cpu/host-1", body=b"{}")
        assert (status, json.loads(raw)) == (200, {"retention_ms": None, "retention_bytes": None})
        assert (s.retention_ms, s.retention_bytes) == (None, None)

        # Refusals, each changing nothing.
        cases = [
            (
                "/v1/admin/retention/nope-bucket",
                {"retention_ms": 1},
                404,
                "bucket 'nope-bucket' does not exist",
            ),
            ("/v1/admin/retention/metrics/no/such/stream", {"retention_ms": 1}, 404, "stream not found"),
            (
                "/v1/admin/retention/metrics",
                {"retention_ms": -1},
                400,
                "invalid request body: Expected `int` >= 0 - at `$.retention_ms`",
            ),
            (
                "/v1/admin/retention/metrics",
                {"retention_bytes": -5},
                400,
                "invalid request body: Expected `int` >= 0 - at `$.retention_bytes`",
            ),
            # Beyond 2^53 - 1 (and far beyond the journal's 64 bits): a 400, not an OverflowError.
            (
                "/v1/admin/retention/metrics",
                {"retention_ms": 100000000000000000000},
                400,
                "invalid request body: Expected `int` <= 9007199254740991 - at `$.retention_ms`",
            ),
            (
                "/v1/admin/retention/Bad_Bucket",
                {"retention_ms": 1},
                400,
                "bucket names are 3-63 characters of lowercase letters, digits and '-', starting and ending with a "
                "letter or digit",
            ),
        ]
        for path, payload, want_status, want_error in cases:
            status, _, raw = await h.http("PUT", path, json_body=payload)
            assert status == want_status, (path, status, raw)
            assert err(raw) == want_error
        for raw_body in (b"not json", b'{"retention_ms": "soon"}', b'{"retention_days": 1}', b"[1, 2]"):
            status, _, raw = await h.http("PUT", "/v1/admin/retention/metrics", body=raw_body)
            assert status == 400 and err(raw).startswith("invalid request body"), (raw_body, raw)
        assert state.bucket_retention["metrics"] == (60_000, None)
        assert (s.retention_ms, s.retention_bytes) == (None, None)

    run(config, body)


def test_retain_route_and_what_readers_see(tmp_path: Path, no_token_env: None) -> None:
    config = make_config(tmp_path / "data")
    records = [b"first-record|", b"second|", b"third-and-last|"]

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        url = "/v1/stream/orders"
        assert (await h.http("PUT", url, headers=OCTET, body=records[0]))[0] == 201
        for r in records[1:]:
            assert (await h.http("POST", url, headers=OCTET, body=r))[0] == 204
        await h.flush()  # the first records are cold, retention works the same on both tiers
        await h.append("default", "orders", b"hot-tail")
        data = b"".join(records) + b"hot-tail"
        cut = len(records[0])
        status, headers, raw = await h.http(
            "POST", "/v1/admin/retain/default/orders", json_body={"offset": format_offset(cut)}
        )
        assert (status, raw, headers["Stream-Retained-Offset"]) == (204, b"", format_offset(cut))

        status, headers, _ = await h.http("HEAD", url)
        assert status == 200 and headers["Stream-Retained-Offset"] == format_offset(cut)
        status, headers, raw = await h.http("GET", url + "?offset=-1")
        assert status == 200 and raw == data[cut:]
        status, headers, raw = await h.http("GET", url)  # no offset: from the earliest retained byte too
        assert status == 200 and raw == data[cut:]
        status, headers, raw = await h.http("GET", f"{url}?offset={format_offset(cut)}")
        assert status == 200 and raw == data[cut:]
        for below in (0, cut - 1):
            status, headers, raw = await h.http("GET", f"{url}?offset={format_offset(below)}")
            assert status == 410, (below, status)
            assert headers["Stream-Next-Offset"] == format_offset(cut)
            assert "no longer retained" in err(raw)
        status, headers, raw = await h.http("GET", f"{url}?offset={format_offset(0)}&live=long-poll")
        assert status == 410 and headers["Stream-Next-Offset"] == format_offset(cut)

        # Never backwards: 204, and the header shows the offset that still holds.
        status, headers, _ = await h.http(
            "POST", "/v1/admin/retain/default/orders", json_body={"offset": format_offset(1)}
        )
        assert (status, headers["Stream-Retained-Offset"]) == (204, format_offset(cut))
        # To the tail: everything is released, reads from -1 are empty and up to date.
        status, headers, _ = await h.http(
            "POST", "/v1/admin/retain/default/orders", json_body={"offset": format_offset(len(data))}
        )
        assert (status, headers["Stream-Retained-Offset"]) == (204, format_offset(len(data)))
        status, headers, raw = await h.http("GET", url + "?offset=-1")
        assert (status, raw, headers["Stream-Up-To-Date"]) == (200, b"", "true")
        assert headers["Stream-Next-Offset"] == format_offset(len(data))

        # Refusals change nothing.
        cases = [
            (
                "/v1/admin/retain/default/orders",
                {"offset": format_offset(len(data) + 1)},
                400,
                "the retained offset is beyond the stream's tail",
            ),
            ("/v1/admin/retain/default/orders", {"offset": "12"}, 400, "malformed offset '12'"),
            ("/v1/admin/retain/default/missing", {"offset": format_offset(0)}, 404, "stream not found"),
            ("/v1/admin/retain/nope-bucket/orders", {"offset": format_offset(0)}, 404, "stream not found"),
        ]
        for path, payload, want_status, want_error in cases:
            status, _, raw = await h.http("POST", path, json_body=payload)
            assert (status, err(raw)) == (want_status, want_error), path
        for raw_body in (b"{}", b"nope", b'{"offset": 5}'):
            status, _, raw = await h.http("POST", "/v1/admin/retain/default/orders", body=raw_body)
            assert status == 400 and err(raw).startswith("invalid request body"), raw_body
        assert h.s.streams.lookup("default", "orders").retained_from == len(data)

    run(config, body)


# --------------------------------------------------------------------------- GC routes and metrics

GAUGES = (
    "tiered_streams",
    "tiered_hot_bytes",
    "tiered_cold_objects",
    "tiered_cold_bytes",
    "tiered_store_reachable",
    "tiered_live_readers",
    "tiered_hot_damaged_frames",
    "tiered_cold_flush_damaged_streams",
    "tiered_gc_pending_deletions",
    "tiered_gc_integrity_errors",
    "tiered_gc_last_pass_timestamp_seconds",
    "tiered_producer_states",
    "tiered_job_last_crash_timestamp_seconds",
    "tiered_job_up",
)
COUNTERS = (  # family names: the samples end in _total
    "tiered_integrity_errors",
    "tiered_store_stalls",
    "tiered_cold_puts",
    "tiered_cold_bytes_uploaded",
    "tiered_cold_flush_failures",
    "tiered_gc_bytes_reclaimed",
    "tiered_gc_objects_deleted",
    "tiered_gc_orphans_found",
    "tiered_gc_errors",
    "tiered_http_requests",
    "tiered_producer_states_dropped",
    "tiered_http_client_disconnects",
    "tiered_group_skipped_bytes",
    "tiered_group_skipped_ranges",
    "tiered_subscription_skipped_bytes",
    "tiered_subscription_skipped_ranges",
    "tiered_job_restarts",
)
BUCKET_FAMILIES = {  # per-bucket (tiered.engine.tenants.bucket_metrics): no series before a bucket has usage
    "tiered_bucket_appended_bytes": "counter",
    "tiered_bucket_appended_records": "counter",
    "tiered_bucket_egress_bytes": "counter",
    "tiered_bucket_requests": "counter",
    "tiered_bucket_retained_bytes": "gauge",
    "tiered_bucket_streams": "gauge",
    "tiered_bucket_live_readers": "gauge",
    "tiered_bucket_quota_refusals": "counter",
}
HISTOGRAMS = (
    "tiered_append_seconds",
    "tiered_fsync_seconds",
    "tiered_store_request_seconds",
    "tiered_cold_flush_seconds",
    "tiered_gc_pass_seconds",
)


def test_gc_routes_and_metrics(tmp_path: Path, no_token_env: None) -> None:
    config = make_config(tmp_path / "data", gc_grace_s=GRACE_MS / 1000)
    clock = VirtualClock()

    metrics = samples

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        status, _, raw = await h.http("GET", "/v1/admin/gc")
        assert status == 200
        assert json.loads(raw) == {
            "pending_deletions": 0,
            "totals": {
                "passes": 0,
                "bytes_reclaimed": 0,
                "objects_deleted": 0,
                "orphans_found": 0,
                "producer_states_expired": 0,
                "integrity_errors": 0,
                "errors": 0,
                "last_pass_ms": 0,
            },
            "last_pass": None,
        }
        status, headers, raw = await h.http("GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        m = metrics(raw.decode())
        assert {f.name: f.type for f in families(raw.decode()).values()} == {
            **{name: "gauge" for name in GAUGES},
            **{name: "counter" for name in COUNTERS},
            **{name: "histogram" for name in HISTOGRAMS},
            **BUCKET_FAMILIES,
        }
        # Per-bucket usage series are the tenant tests' subject (tests/engine/tenants/test_tenant_usage.py).
        state = {
            k: v for k, v in m.items() if not k.startswith(HISTOGRAMS + ("tiered_http_", "tiered_bucket_"))
        }
        assert set(state) == {
            "tiered_streams",
            "tiered_hot_bytes",
            "tiered_cold_objects",
            "tiered_cold_bytes",
            "tiered_cold_puts_total",
            "tiered_cold_bytes_uploaded_total",
            "tiered_cold_flush_failures_total",
            "tiered_gc_pending_deletions",
            "tiered_gc_bytes_reclaimed_total",
            "tiered_gc_objects_deleted_total",
            "tiered_gc_orphans_found_total",
            "tiered_gc_integrity_errors",
            "tiered_gc_last_pass_timestamp_seconds",
            'tiered_integrity_errors_total{tier="hot"}',
            'tiered_integrity_errors_total{tier="cold"}',
            "tiered_hot_damaged_frames",
            "tiered_cold_flush_damaged_streams",
            "tiered_live_readers",
            "tiered_store_stalls_total",
            "tiered_store_reachable",
            "tiered_gc_errors_total",
            "tiered_producer_states",
            'tiered_producer_states_dropped_total{reason="expired"}',
            'tiered_producer_states_dropped_total{reason="cap"}',
            "tiered_group_skipped_bytes_total",
            "tiered_group_skipped_ranges_total",
            "tiered_subscription_skipped_bytes_total",
            "tiered_subscription_skipped_ranges_total",
        }
        assert all(v == 0 for k, v in state.items() if k != "tiered_store_reachable"), m

        await h.bucket("temp")
        await h.create("temp", "t", b"t" * 1000)
        await h.create("default", "d", b"d" * 500)
        await h.flush()
        [key] = h.s.state.cold_objects
        size = h.s.state.cold_objects[key].size
        m = metrics((await h.http("GET", "/metrics"))[2].decode())
        assert (m["tiered_streams"], m["tiered_cold_objects"], m["tiered_cold_bytes"]) == (2, 1, size)
        assert (m["tiered_cold_puts_total"], m["tiered_hot_bytes"]) == (1, 0)
        await h.http("DELETE", "/v1/buckets/temp")
        await h.http("DELETE", "/v1/stream/d")
        released = clock.ms

        # A dry run within the grace delay: nothing due; it changes nothing and is not recorded.
        status, _, raw = await h.http("POST", "/v1/admin/gc?dry_run=true")
        report = json.loads(raw)
        assert status == 200 and set(report) == REPORT_KEYS
        assert report["dry_run"] is True and report["objects_released"] == 1 and report["would_delete"] == []
        clock.ms = released + GRACE_MS
        status, _, raw = await h.http("POST", "/v1/admin/gc?dry_run=1")
        report = json.loads(raw)
        assert report["would_delete"] == [
            {"key": key, "bytes": size, "reason": "no owner left; grace delay passed"}
        ]
        assert report["objects_deleted"] == 0 and object_files(config.data_path) == {key}
        status, _, raw = await h.http("GET", "/v1/admin/gc")
        assert json.loads(raw)["last_pass"] is None and json.loads(raw)["pending_deletions"] == 1
        assert json.loads(raw)["totals"]["passes"] == 0

        status, _, raw = await h.http("POST", "/v1/admin/gc")
        report = json.loads(raw)
        assert status == 200 and set(report) == REPORT_KEYS
        assert report["dry_run"] is False and report["started_ms"] == clock.ms
        assert (report["objects_deleted"], report["bytes_deleted"], report["would_delete"]) == (1, size, [])
        assert (report["errors"], report["integrity_errors"], report["orphans_found"]) == ([], [], 0)
        assert object_files(config.data_path) == set()
        status, _, raw = await h.http("GET", "/v1/admin/gc")
        status_body = json.loads(raw)
        assert status == 200 and status_body["last_pass"] == report and status_body["pending_deletions"] == 0
        totals = status_body["totals"]
        assert set(totals) == TOTALS_KEYS
        assert (totals["passes"], totals["objects_deleted"], totals["integrity_errors"]) == (1, 1, 0)
        assert totals["bytes_reclaimed"] >= size and totals["last_pass_ms"] == report["finished_ms"]
        m = metrics((await h.http("GET", "/metrics"))[2].decode())
        assert (m["tiered_streams"], m["tiered_cold_objects"], m["tiered_cold_bytes"]) == (0, 0, 0)
        assert (m["tiered_gc_objects_deleted_total"], m["tiered_gc_pending_deletions"]) == (1, 0)
        assert m["tiered_gc_bytes_reclaimed_total"] == totals["bytes_reclaimed"]
        assert m["tiered_gc_last_pass_timestamp_seconds"] == pytest.approx(totals["last_pass_ms"] / 1000)

        # An integrity error shows in the report, the status and the gauge.
        await h.create("default", "e", b"e" * 100)
        await h.flush()
        clock.advance(
            1
        )  # (an object committed in the very ms of a listing may legitimately be missing from it)
        [key2] = h.s.state.cold_objects
        (config.data_path / "cold" / key2).unlink()
        report = json.loads((await h.http("POST", "/v1/admin/gc"))[2])
        assert report["integrity_errors"] == [
            f"{key2}: referenced by metadata but missing from the object store"
        ]
        m = metrics((await h.http("GET", "/metrics"))[2].decode())
        assert m["tiered_gc_integrity_errors"] == 1
        assert json.loads((await h.http("GET", "/v1/admin/gc"))[2])["totals"]["integrity_errors"] == 1

    run(config, body, clock)


# --------------------------------------------------------------------------- authentication


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("admin-auth") / "data",
        "--gc-grace-s",
        "0",
        "--long-poll-timeout-s",
        "2",
        env={"TIERED_ADMIN_TOKEN": TOKEN},
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


def _admin_calls(base: str) -> list[tuple[str, str, bytes]]:
    return [
        ("DELETE", base + "/v1/buckets/guarded", b""),
        ("PUT", base + "/v1/admin/retention/guarded", b'{"retention_bytes": 0}'),
        ("PUT", base + "/v1/admin/retention/guarded/s", b'{"retention_bytes": 0}'),
        ("POST", base + "/v1/admin/retain/guarded/s", json.dumps({"offset": format_offset(3)}).encode()),
        ("POST", base + "/v1/admin/gc", b""),
        ("POST", base + "/v1/admin/gc?dry_run=true", b""),
        ("GET", base + "/v1/admin/gc", b""),
    ]


def test_admin_token_is_required_and_refusals_change_nothing(token_server: ServerProcess) -> None:
    base = token_server.url
    assert request("PUT", base + "/v1/buckets/guarded")[0] == 201
    s_url = base + "/v1/buckets/guarded/stream/s"
    assert request("PUT", s_url, OCTET, b"abc")[0] == 201
    assert request("POST", s_url, OCTET, b"de")[0] == 204
    assert request("POST", s_url, OCTET, b"f")[0] == 204
    wrong = [
        ({}, "admin operations need Authorization: Bearer <token>"),
        ({"Authorization": "Bearer"}, "admin operations need Authorization: Bearer <token>"),
        ({"Authorization": f"Basic {TOKEN}"}, "admin operations need Authorization: Bearer <token>"),
        ({"Authorization": "Bearer not-the-token"}, "the admin token is not valid"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "the admin token is not valid"),
        ({"Authorization": f"Bearer {TOKEN[:-1]}"}, "the admin token is not valid"),
    ]
    for method, url, payload in _admin_calls(base):
        for headers, message in wrong:
            status, h, raw = request(method, url, headers, payload)
            assert status == 401, (method, url, headers, status)
            assert h["WWW-Authenticate"] == "Bearer"
            assert err(raw) == message
    # Nothing changed: the bucket, the stream, its retention; no GC pass ran.
    assert request("GET", base + "/v1/buckets/guarded")[0] == 200
    status, h, _ = request("HEAD", s_url)
    assert status == 200 and h["Stream-Retained-Offset"] == format_offset(0)
    assert request("GET", s_url + "?offset=-1")[2] == b"abcdef"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    status, _, raw = request("GET", base + "/v1/admin/gc", auth)
    assert status == 200 and json.loads(raw)["last_pass"] is None and json.loads(raw)["totals"]["passes"] == 0
    # /metrics is an admin route too.
    assert request("GET", base + "/metrics")[0] == 401
    assert request("GET", base + "/metrics", auth)[0] == 200

    # The right token (scheme is case-insensitive) works for every route.
    status, h, _ = request(
        "POST",
        base + "/v1/admin/retain/guarded/s",
        {"authorization": f"bearer {TOKEN}"},
        json.dumps({"offset": format_offset(3)}).encode(),
    )
    assert (status, h["Stream-Retained-Offset"]) == (204, format_offset(3))
    assert request("GET", s_url + "?offset=-1")[2] == b"def"
    status, _, raw = request("PUT", base + "/v1/admin/retention/guarded/s", auth, b'{"retention_bytes": 1}')
    assert (status, json.loads(raw)) == (200, {"retention_ms": None, "retention_bytes": 1})
    status, _, raw = request("PUT", base + "/v1/admin/retention/guarded", auth, b'{"retention_ms": 3600000}')
    assert (status, json.loads(raw)) == (200, {"retention_ms": 3600000, "retention_bytes": None})
    status, _, raw = request("POST", base + "/v1/admin/gc", auth)
    assert status == 200 and json.loads(raw)["retention_advanced"] == 1
    assert request("GET", s_url + "?offset=-1")[2] == b"f"  # the stream's 1-byte policy beat the bucket's
    assert request("HEAD", s_url)[1]["Stream-Retained-Offset"] == format_offset(5)
    status, _, raw = request("GET", base + "/v1/admin/gc", auth)
    assert status == 200 and json.loads(raw)["totals"]["passes"] == 1
    assert request("DELETE", base + "/v1/buckets/guarded", auth)[0] == 204
    assert request("GET", base + "/v1/buckets/guarded")[0] == 404


def test_refusal_decision_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AdminGuard.check``: no token -> 403, except with auth off on loopback; a token -> the token decides."""
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)

    def guard(host: str, token: str | None = None, auth: str = "") -> AdminGuard:
        return AdminGuard(token, open_without_token=Config(host=host, auth=auth).admin_open_without_token)

    def req(headers: dict[str, str] | None = None) -> Request:
        async def read() -> bytes:
            return b""

        return Request("DELETE", "/v1/buckets/b", "", headers or {}, read)

    def refusal(g: AdminGuard, r: Request) -> TieredError | None:
        try:
            g.check(r)
        except TieredError as exc:
            return exc
        return None

    for host in ("0.0.0.0", "::", "10.1.2.3", "example.com"):
        refused = refusal(guard(host), req({"Authorization": "Bearer anything"}))
        assert refused is not None and refused.code is ErrorCode.ADMIN_DISABLED
        assert refused.message == (
            "admin operations are disabled: configure an admin token (--admin-token-file or TIERED_ADMIN_TOKEN)"
        )
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert refusal(guard(host), req()) is None
        assert refusal(guard(host, auth="none"), req()) is None
        # Auth on: loopback is no exception (a local proxy would hand the admin API to anyone).
        for auth in ("tokens", "jwt"):
            refused = refusal(guard(host, auth=auth), req({"Authorization": "Bearer anything"}))
            assert refused is not None and refused.code is ErrorCode.ADMIN_DISABLED
    # With a token the host does not matter: the token does.
    for host in ("0.0.0.0", "127.0.0.1"):
        g = guard(host, TOKEN)
        missing = refusal(g, req())
        assert missing is not None and missing.code is ErrorCode.UNAUTHORIZED
        wrong = refusal(g, req({"Authorization": "Bearer nope"}))
        assert wrong is not None and wrong.code is ErrorCode.UNAUTHORIZED
        assert refusal(g, req({"Authorization": f"Bearer {TOKEN}"})) is None


def test_non_loopback_without_token_refuses_every_admin_route(tmp_path: Path, no_token_env: None) -> None:
    """The configuration says 0.0.0.0 (the test server still listens on loopback only)."""
    config = make_config(tmp_path / "data", host="0.0.0.0")

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.bucket("guarded")
        await h.create("guarded", "s", b"abcdef")
        for method, url, payload in _admin_calls(""):
            status, headers, raw = await h.http(method, url, body=payload)
            assert status == 403, (method, url)
            assert err(raw).startswith("admin operations are disabled")
        assert "guarded" in h.s.state.buckets and h.s.state.bucket_retention == {}
        s = h.s.streams.lookup("guarded", "s")
        assert (s.retained_from, s.retention_bytes) == (0, None)
        assert h.s.gc is not None and h.s.gc.totals.passes == 0
        assert (await h.http("GET", "/metrics"))[0] == 403
        assert (await h.http("GET", "/v1/buckets/guarded/stream/s?offset=-1"))[2] == b"abcdef"

    run(config, body)


def test_integrity_error_gauge_holds_until_a_reconciliation_clears_it(
    tmp_path: Path, no_token_env: None
) -> None:
    config = make_config(tmp_path / "data")

    async def body(h: HttpHarness, clock: VirtualClock) -> None:
        await h.create("default", "s", b"s" * 100)
        await h.flush()
        clock.advance(1)
        [key] = h.s.state.cold_objects
        (config.data_path / "cold" / key).unlink()
        report = json.loads((await h.http("POST", "/v1/admin/gc"))[2])  # reconciles
        assert len(report["integrity_errors"]) == 1
        assert h.s.gc is not None
        await h.s.gc.run_pass(reconcile=False)  # what the schedule runs between reconciliations
        raw = (await h.http("GET", "/metrics"))[2].decode()
        assert samples(raw)["tiered_gc_integrity_errors"] == 1

    run(config, body)
