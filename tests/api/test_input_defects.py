"""Defects found by trying the service as a new user would: each is a clear 4xx (or exit code) that changes nothing.

1. Non-ASCII digits (superscripts, circled, Arabic-Indic, fullwidth) are never numbers.
2. JSON nested 100,000 levels deep is a 400, not a RecursionError.
3. Integers beyond 2^53 - 1 in bodies are a 400, not an OverflowError in the journal.
5. ``tiered gc --url notaurl`` explains itself; ``dry_run=on`` is refused, not a real pass;
   a non-ASCII byte in the request line is one log line, not a traceback per request.
6. Loose input: ``Stream-Expires-At`` in the past, subscription id ``..``, control characters
   in a worker, an invalid JSON body for a bucket.
7. Each command's ``--help`` shows only its options, each with its default.

(4, the missing data dir, is in ``test_gc_cli``; the glob rule and empty ``Stream-Seq`` of 6 are
in ``test_groups_http`` and ``test_http_append``.)
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_helpers import error_code, error_message, request, stream_url, unique
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(120)
JSON_CT = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path_factory.mktemp("defects") / "data", "--long-poll-timeout-s", "2").start()
    try:
        yield s
    finally:
        s.stop()


def tiered(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    return subprocess.run(
        [sys.executable, "-m", "tiered.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


# ------------------------------------------------------------------ 1. digits


@pytest.mark.parametrize("digit", ["%C2%B2", "%E2%91%A0", "%D9%A3", "%EF%BC%93", "%E2%82%83"])
def test_non_ascii_digits_are_not_numbers(srv: ServerProcess, digit: str) -> None:
    g = unique("g")
    assert request("PUT", f"{srv.url}/v1/groups/{g}", JSON_CT, json.dumps({"streams": ["a"]}))[0] == 201
    for path in (
        f"/v1/groups/{g}?incarnation={digit}",
        f"/v1/groups/{g}?revision={digit}",
        f"/v1/groups/{g}/streams/a?incarnation={digit}",
        f"/v1/groups/{g}/streams/a?revision={digit}",
    ):
        status, _, body = request("DELETE", srv.url + path)
        assert (status, error_code(body)) == (400, "BAD_REQUEST"), (path, status, body)
        assert "non-negative decimal integer" in error_message(body)
    assert request("GET", f"{srv.url}/v1/groups/{g}")[0] == 200  # still there, unchanged
    utf8 = "\u0663".encode().decode("latin-1")  # the header carries the UTF-8 bytes of ARABIC-INDIC THREE
    u = stream_url(srv.url, unique("ttl"))
    assert request("PUT", u, {"Content-Type": "text/plain", "Stream-TTL": utf8})[0] == 400
    assert request("HEAD", u)[0] == 404
    assert request("PUT", u, {"Content-Type": "text/plain"})[0] == 201
    producer = {"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Seq": "0"}
    for header in ("Producer-Epoch", "Producer-Seq"):
        status, _, _ = request("POST", u, {**producer, header: utf8}, b"x")
        assert status == 400, header
    assert request("GET", u + "?offset=-1")[2] == b""


# ------------------------------------------------------------------ 2. deep JSON


def test_deeply_nested_json_is_a_400(srv: ServerProcess) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    sub = f"{srv.url}/v1/stream/__ds/subscriptions/{unique('deep')}"
    status, _, body = request("PUT", sub, JSON_CT, deep)
    assert (status, error_code(body)) == (400, "INVALID_REQUEST"), body[:200]
    assert (
        request("PUT", sub, JSON_CT, json.dumps({"type": "pull-wake", "pattern": "x/*", "wake_stream": "w"}))[
            0
        ]
        == 201
    )
    status, _, body = request("POST", sub + "/streams", JSON_CT, deep)
    assert (status, error_code(body)) == (400, "INVALID_REQUEST")
    status, _, body = request("PUT", f"{srv.url}/v1/groups/{unique('g')}", JSON_CT, deep)
    assert status == 400
    status, _, body = request("PUT", stream_url(srv.url, unique("json")), JSON_CT, deep)
    assert status == 400


# ------------------------------------------------------------------ 3. big integers


def test_integers_beyond_their_range_are_a_400(srv: ServerProcess) -> None:
    for body in ({"retention_ms": 10**20}, {"retention_bytes": 2**53}, {"retention_ms": -1}):
        status, _, raw = request("PUT", f"{srv.url}/v1/admin/retention/default", JSON_CT, json.dumps(body))
        assert (status, error_code(raw)) == (400, "BAD_REQUEST"), (body, raw)
    g = unique("g")
    status, _, raw = request(
        "PUT", f"{srv.url}/v1/groups/{g}", JSON_CT, json.dumps({"streams": ["a"], "max_members": 10**20})
    )
    assert status == 400
    status, _, raw = request(
        "PUT",
        f"{srv.url}/v1/stream/__ds/subscriptions/{unique('s')}",
        JSON_CT,
        json.dumps({"type": "pull-wake", "pattern": "x/*", "wake_stream": "w", "lease_ttl_ms": 10**30}),
    )
    assert (status, error_code(raw)) == (400, "INVALID_REQUEST")


# ------------------------------------------------------------------ 5. commands and logs


def test_gc_url_that_is_not_a_url_is_explained() -> None:
    done = tiered("gc", "--url", "notaurl")
    assert done.returncode == 2
    assert "--url must be a server's base URL" in done.stderr and "Traceback" not in done.stderr


def test_unrecognised_dry_run_value_runs_nothing(srv: ServerProcess) -> None:
    before = json.loads(request("GET", srv.url + "/v1/admin/gc")[2])["totals"]["passes"]
    for value in ("on", "yes", "maybe", ""):
        status, _, body = request("POST", f"{srv.url}/v1/admin/gc?dry_run={value}")
        assert (status, error_code(body)) == (400, "BAD_REQUEST"), value
    assert json.loads(request("GET", srv.url + "/v1/admin/gc")[2])["totals"]["passes"] == before
    status, _, body = request("POST", f"{srv.url}/v1/admin/gc?dry_run=true")
    assert status == 200 and json.loads(body)["dry_run"] is True


def test_a_malformed_request_line_is_one_log_line(srv: ServerProcess) -> None:
    mark = srv.log_path.stat().st_size
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(b"GET /v1/stream/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = sock.recv(4096)
        assert answer.split(b" ", 2)[1] == b"400", answer[:100]
    time.sleep(0.2)
    with open(srv.log_path, "rb") as f:
        f.seek(mark)
        log = f.read().decode(errors="replace")
    assert "Traceback" not in log, log


# ------------------------------------------------------------------ 6. loose input


def test_expires_at_in_the_past_is_refused(srv: ServerProcess) -> None:
    u = stream_url(srv.url, unique("past"))
    status, _, body = request(
        "PUT", u, {"Content-Type": "text/plain", "Stream-Expires-At": "2001-01-01T00:00:00Z"}
    )
    assert (status, error_message(body)) == (400, "Stream-Expires-At is in the past")
    assert request("HEAD", u)[0] == 404


def test_subscription_ids_and_workers_are_validated(srv: ServerProcess) -> None:
    body = json.dumps({"type": "pull-wake", "pattern": "x/*", "wake_stream": "w"})
    for sub_id in ("..", "%2E%2E", "."):
        status, _, raw = request("PUT", f"{srv.url}/v1/stream/__ds/subscriptions/{sub_id}", JSON_CT, body)
        assert (status, error_code(raw)) == (400, "INVALID_REQUEST"), (sub_id, raw)
    sub = f"{srv.url}/v1/stream/__ds/subscriptions/{unique('w')}"
    assert request("PUT", sub, JSON_CT, body)[0] == 201
    for worker in ("a\nb", "\x00", "tab\there", "\u0085"):
        status, _, raw = request("POST", sub + "/claim", JSON_CT, json.dumps({"worker": worker}))
        assert (status, error_code(raw)) == (400, "INVALID_REQUEST"), repr(worker)


def test_a_bucket_body_that_is_not_json_is_refused(srv: ServerProcess) -> None:
    name = unique("b").lower()[:40]
    status, _, body = request("PUT", f"{srv.url}/v1/buckets/{name}", JSON_CT, b"{not json")
    assert (status, error_code(body)) == (400, "BAD_REQUEST")
    assert request("GET", f"{srv.url}/v1/buckets/{name}")[0] == 404
    assert request("PUT", f"{srv.url}/v1/buckets/{name}", JSON_CT, b"{}")[0] == 201


# ------------------------------------------------------------------ 7. help


def test_each_command_shows_its_own_options_with_defaults() -> None:
    serve = tiered("serve", "--help").stdout
    for flag, default in (
        ("--max-hot-bytes", "8589934592"),
        ("--max-waiters", "10000"),
        ("--read-chunk-bytes", "4194304"),
        ("--snapshot-every-bytes", "268435456"),
        ("--log-level", "info"),
        ("--port", "4437"),
    ):
        section = serve[serve.index("\n  " + flag) + 1 :].split("\n  --", 1)[0]
        assert f"default: {default}" in " ".join(section.split()), (flag, section)
    verify = tiered("verify", "--help").stdout
    gc = tiered("gc", "--help").stdout
    for server_only in ("--port", "--max-waiters", "--long-poll-timeout-s", "--webhooks", "--fsync"):
        assert server_only in serve
        assert server_only not in verify and server_only not in gc, server_only
    assert "--data-dir" in verify and "--s3-bucket" in verify and "--gc-grace-s" not in verify
    assert "--url" in gc and "--dry-run" in gc and "--gc-grace-s" in gc


def test_the_bench_takes_the_reference_server_from_an_option_or_the_environment() -> None:
    root = Path(__file__).resolve().parent.parent.parent
    out = subprocess.run(
        [sys.executable, str(root / "bench" / "compare.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "--reference-script" in out and "DS_REFERENCE_SCRIPT" in out
    assert "../shared/conformance/reference.sh" in out
    assert "/work/" not in out
