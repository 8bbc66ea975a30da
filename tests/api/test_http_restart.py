"""Restarts: data and metadata survive SIGTERM (and acknowledged writes survive SIGKILL)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from typing import Any

import pytest

from tests.support.http_helpers import (
    Background,
    SseReader,
    append,
    close,
    create,
    head,
    read,
    request,
    state_of,
    stream_url,
)
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(60)


def restart(old: ServerProcess, *, kill: bool = False) -> ServerProcess:
    if kill:
        old.kill()
    else:
        assert old.stop() == 0, old.log()
    new = ServerProcess(old.data_dir, "--long-poll-timeout-s", "2")
    new.port = old.port  # same address, so clients' URLs stay valid
    return new.start()


def produce(u: str, body: str, epoch: int, seq: int, **extra: str) -> tuple[int, Any, bytes]:
    headers = {
        "Content-Type": "text/plain",
        "Producer-Id": "writer",
        "Producer-Epoch": str(epoch),
        "Producer-Seq": str(seq),
        **{k.replace("_", "-"): v for k, v in extra.items()},
    }
    return request("POST", u, headers, body)


def populate(base: str) -> dict[str, str]:
    u = {
        "binary": stream_url(base, "binary"),
        "closed": stream_url(base, "closed/stream"),
        "ttl": stream_url(base, "ttl"),
        "expires": stream_url(base, "expires"),
        "json": stream_url(base, "json"),
        "producer": stream_url(base, "producer"),
        "producer_closed": stream_url(base, "producer-closed"),
        "bucketed": stream_url(base, "in-bucket", bucket="restart-bucket"),
        "source": stream_url(base, "source"),
        "fork": stream_url(base, "fork"),
        "deleted": stream_url(base, "deleted"),
    }
    create(u["binary"], "application/octet-stream", bytes(range(256)))
    append(u["binary"], bytes(range(255, -1, -1)))

    create(u["closed"], "text/plain", "the end")
    close(u["closed"])

    create(u["ttl"], "text/plain", "lives an hour", Stream_TTL="3600")
    create(u["expires"], "text/plain", "until 2999", Stream_Expires_At="2999-01-01T00:00:00+01:00")

    create(u["json"], "application/json", '[{"a":"line\\nbreak"},2]')
    append(u["json"], '{"b":[3]}', "application/json")

    create(u["producer"], "text/plain")
    assert produce(u["producer"], "p0,", 2, 0, Stream_Seq="s1")[0] == 200
    assert produce(u["producer"], "p1,", 2, 1, Stream_Seq="s5")[0] == 200

    create(u["producer_closed"], "text/plain")
    produce(u["producer_closed"], "first,", 0, 0)
    assert produce(u["producer_closed"], "last", 0, 1, Stream_Closed="true")[0] == 200

    assert request("PUT", f"{base}/v1/buckets/restart-bucket")[0] == 201
    create(u["bucketed"], "text/plain", "bucket data")

    create(u["source"], "text/plain", "inherited,")
    assert request("PUT", u["fork"], {"Stream-Forked-From": "/v1/stream/source"}, b"")[0] == 201
    append(u["fork"], "own", "text/plain")
    assert request("DELETE", u["source"])[0] == 204  # soft delete: the fork still needs it

    create(u["deleted"], "text/plain", "gone")
    assert request("DELETE", u["deleted"])[0] == 204
    return u


def observe(u: dict[str, str], base: str) -> dict[str, Any]:
    return {
        **{name: state_of(url) for name, url in u.items() if name not in ("source", "deleted")},
        "source_head": head(u["source"])[0],
        "deleted_head": head(u["deleted"])[0],
        "buckets": [b["name"] for b in json.loads(request("GET", base + "/v1/buckets")[2])["buckets"]],
    }


def check_after_restart(u: dict[str, str], srv: ServerProcess) -> None:
    assert read(u["binary"])[2] == bytes(range(256)) + bytes(range(255, -1, -1))
    h = head(u["closed"])[1]
    assert h["Stream-Closed"] == "true"
    assert append(u["closed"], "more", "text/plain")[0] == 409
    assert head(u["ttl"])[1]["Stream-TTL"] == "3600"
    assert head(u["expires"])[1]["Stream-Expires-At"] == "2999-01-01T00:00:00+01:00"
    assert json.loads(read(u["json"])[2]) == [{"a": "line\nbreak"}, 2, {"b": [3]}]
    assert read(u["bucketed"])[2] == b"bucket data"
    assert "restart-bucket" in [
        b["name"] for b in json.loads(request("GET", srv.url + "/v1/buckets")[2])["buckets"]
    ]
    assert read(u["fork"])[2] == b"inherited,own"
    assert head(u["source"])[0] == 410
    assert create(u["source"], "text/plain")[0] == 409
    assert head(u["deleted"])[0] == 404


def test_clean_restart_keeps_data_and_metadata(server: ServerProcess) -> None:
    u = populate(server.url)
    etag = read(u["binary"])[1]["ETag"]
    before = observe(u, server.url)

    srv = restart(server)
    try:
        assert observe(u, srv.url) == before
        check_after_restart(u, srv)
        # A cached chunk is still valid: same stream, same range, same ETag.
        assert read(u["binary"], "-1", {"If-None-Match": etag})[0] == 304

        # Producer dedupe state survived: retries are duplicates, fencing still applies.
        status, headers, _ = produce(u["producer"], "p1,", 2, 1, Stream_Seq="s5")
        assert status == 204
        assert headers["Producer-Seq"] == "1"
        status, headers, _ = produce(u["producer"], "zombie", 1, 0)
        assert status == 403
        assert headers["Producer-Epoch"] == "2"
        status, headers, _ = produce(u["producer"], "gap", 2, 5)
        assert (status, headers["Producer-Expected-Seq"]) == (409, "2")
        # So did the Stream-Seq high-water mark.
        assert produce(u["producer"], "p2,", 2, 2, Stream_Seq="s4")[0] == 409
        assert produce(u["producer"], "p2,", 2, 2, Stream_Seq="s6")[0] == 200
        assert read(u["producer"])[2] == b"p0,p1,p2,"
        # The closing producer request is still recognised as a duplicate.
        status, headers, _ = produce(u["producer_closed"], "last", 0, 1, Stream_Closed="true")
        assert status == 204
        assert headers["Stream-Closed"] == "true"
        assert produce(u["producer_closed"], "later", 0, 2)[0] == 409
        assert read(u["producer_closed"])[2] == b"first,last"

        # Writes after a restart survive the next one too.
        append(u["binary"], b"\x00after")
        close(u["json"])
        request("DELETE", u["fork"])  # cascades to the soft-deleted source
        before2 = observe(u, srv.url)
        assert before2["source_head"] == 404
        srv2 = restart(srv)
        try:
            assert observe(u, srv2.url) == before2
            assert read(u["binary"])[2].endswith(b"\x00after")
            assert head(u["json"])[1]["Stream-Closed"] == "true"
            assert create(u["source"], "text/plain")[0] == 201
        finally:
            srv2.stop()
    finally:
        srv.stop()


def test_acknowledged_writes_survive_sigkill(server: ServerProcess) -> None:
    u = populate(server.url)
    before = observe(u, server.url)
    srv = restart(server, kill=True)
    try:
        assert observe(u, srv.url) == before
        check_after_restart(u, srv)
        assert produce(u["producer"], "p1,", 2, 1)[0] == 204
    finally:
        srv.stop()


def test_sigterm_with_live_readers_exits_promptly_and_cleanly(server: ServerProcess) -> None:
    u = stream_url(server.url, "watched")
    create(u, "text/plain", "x")
    # One SSE reader that went away (its handler is still parked), one still connected,
    # and a long-poll in flight.
    gone = SseReader(u, "-1")
    gone.read_until(lambda ev: len(ev) >= 2)
    gone.close()
    sse = SseReader(u, "-1")
    tail = head(u)[1]["Stream-Next-Offset"]
    poll = Background(lambda: read(u, tail, live="long-poll"))
    try:
        sse.read_until(lambda ev: len(ev) >= 2)
        time.sleep(0.2)
        assert server.proc is not None
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = server.proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, f"still running {time.monotonic() - started:.1f}s after SIGTERM"
        # The connected reader saw its response end (it may reconnect elsewhere): no EOF signal.
        sse.read_to_eof(timeout=2)
        assert not any(c.get("streamClosed") for c in sse.controls())
        poll.result(timeout=5)
    finally:
        sse.close()
        server.kill()
    # The clean shutdown left a state that a new process opens with everything intact.
    srv = restart(server)
    try:
        assert read(u)[2] == b"x"
    finally:
        srv.stop()
