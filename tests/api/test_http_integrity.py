"""Integrity digests over HTTP, on a real ``tiered serve``: what the official Python client appended,
digested client-side with the documented hash, equals the server's ``Stream-Integrity`` (HEAD); the
admin route lists a bucket's digests (the sum of its streams'); both survive a SIGKILL (journal
replay) and a clean restart (snapshot); retention moves records from live to released; the
digests are not in ``/metrics``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess
from tiered.core.ids import format_offset, parse_offset
from tiered.core.record_digest import MASK, format_digest, record_hash

pytestmark = pytest.mark.timeout(300)
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path / "data").start()
    try:
        yield s
    finally:
        s.stop()


def integrity_of(url: str) -> dict[str, str]:
    status, headers, _ = request("HEAD", url)
    assert status == 200
    return dict(part.split("=", 1) for part in headers["Stream-Integrity"].split(";"))


def test_the_python_clients_appends_digest_as_the_server_says(srv: ServerProcess) -> None:
    from durable_streams import DurableStream

    url = f"{srv.url}/v1/stream/orders/eu"
    appended: list[tuple[int, bytes]] = []
    with DurableStream.create(url, content_type="application/octet-stream", batching=False) as handle:
        position = 0
        for i in range(12):
            data = f"order-{i}:".encode() * (i + 1)
            result = handle.append(data)
            appended.append((position, data))
            position = parse_offset(str(result.next_offset)) or 0
            assert position == appended[-1][0] + len(data)
    # The client's own digest of what it appended: the documented hash, summed modulo 2**256.
    mine = sum(record_hash("default", "orders/eu", 0, start, data) for start, data in appended) & MASK
    server = integrity_of(url)
    assert server["total"] == server["live"] == format_digest(mine)
    assert (server["records"], server["bytes"]) == (str(len(appended)), str(position))
    assert (server["released"], server["released-records"]) == ("0" * 64, "0")

    # Retention releases the first three records: live and released move, the total does not.
    cut = appended[3][0]
    status, _, _ = request(
        "POST", f"{srv.url}/v1/admin/retain/default/orders/eu", {}, json.dumps({"offset": format_offset(cut)})
    )
    assert status == 204
    after = integrity_of(url)
    released = sum(record_hash("default", "orders/eu", 0, s, d) for s, d in appended[:3]) & MASK
    assert after["released"] == format_digest(released)
    assert after["live"] == format_digest(mine - released)
    assert after["total"] == format_digest(mine)
    assert (after["live-records"], after["released-records"], after["live-bytes"]) == (
        "9",
        "3",
        str(position - cut),
    )


def test_the_admin_route_sums_a_bucket_and_digests_survive_restarts(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        assert request("PUT", f"{srv.url}/v1/buckets/acme")[0] == 201
        for path, body in (("a", b"alpha"), ("b/c", b"beta-gamma")):
            url = f"{srv.url}/v1/buckets/acme/stream/{path}"
            assert request("PUT", url, OCTET, body)[0] == 201
            assert request("POST", url, OCTET, body[::-1])[0] == 204
        status, headers, raw = request("GET", f"{srv.url}/v1/admin/integrity/acme")
        assert status == 200
        listing = json.loads(raw)
        assert [s["path"] for s in listing["streams"]] == ["a", "b/c"]
        want = sum(
            record_hash("acme", p, 0, 0, b) + record_hash("acme", p, 0, len(b), b[::-1])
            for p, b in (("a", b"alpha"), ("b/c", b"beta-gamma"))
        )
        assert listing["integrity"]["live"] == format_digest(want)
        assert listing["integrity"]["records"] == 4
        assert (
            listing["streams"][0]["integrity"]["live"]
            == integrity_of(f"{srv.url}/v1/buckets/acme/stream/a")["live"]
        )
        assert request("GET", f"{srv.url}/v1/admin/integrity/nope")[0] == 404
        assert request("DELETE", f"{srv.url}/v1/admin/integrity/acme")[0] == 405
        _, _, metrics = request("GET", f"{srv.url}/metrics")
        # Not in /metrics (a series per stream is unbounded cardinality): no digest, no stream's series.
        assert listing["integrity"]["live"].encode() not in metrics
        assert listing["streams"][1]["integrity"]["live"].encode() not in metrics and b'"b/c"' not in metrics
        before = listing
        srv.kill()  # SIGKILL: the journal's replay rebuilds them
        srv = ServerProcess(tmp_path / "data").start()
        assert json.loads(request("GET", f"{srv.url}/v1/admin/integrity/acme")[2]) == before
        assert srv.stop() == 0  # clean: a snapshot carries them
        srv = ServerProcess(tmp_path / "data").start()
        assert json.loads(request("GET", f"{srv.url}/v1/admin/integrity/acme")[2]) == before
    finally:
        srv.stop()
