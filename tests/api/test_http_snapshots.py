"""Stream snapshots and bootstrap reads over plain HTTP: publish, discovery, snapshot reads, bootstrap, HEAD,
410s that point at the snapshot, and the exact status of every refusal.

Each test runs on one node and on a single-node cluster (every shard's engine behind shard routing).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from email.message import Message

import pytest

from tests.support import deployments
from tests.support.http_helpers import (
    Headers,
    append,
    error_code,
    head,
    new_stream,
    read,
    read_all,
    request,
)
from tests.support.server_process import ServerProcess
from tiered.core.ids import DEFAULT_BUCKET, format_offset, parse_offset

pytestmark = pytest.mark.timeout(90)

MAX_SNAPSHOT = 4096
OCTET = "application/octet-stream"
JSON = "application/json"


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(
        request, "snapshots", "--stream-snapshot-max-bytes", str(MAX_SNAPSHOT), "--bootstrap-max-bytes", "64"
    )


# ------------------------------------------------------------- helpers


def shift(offset: str, delta: int) -> str:
    """The offset ``delta`` bytes from ``offset`` (tiered's offsets are byte positions)."""
    pos = parse_offset(offset)
    assert pos is not None
    return format_offset(pos + delta)


def publish(
    url: str, offset: str, body: bytes, content_type: str | None = "application/x-state", **extra: str
) -> tuple[int, Headers, bytes]:
    headers = {k.replace("_", "-"): v for k, v in extra.items()}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return request("PUT", f"{url}?snapshot={urllib.parse.quote(offset)}", headers, body)


def parse_multipart(headers: Headers, body: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The parts of a ``multipart/mixed`` body: (headers, bytes) each, parsed by its Content-Length."""
    msg = Message()
    msg["Content-Type"] = headers["Content-Type"]
    assert msg.get_content_type() == "multipart/mixed"
    boundary = msg.get_param("boundary")
    assert isinstance(boundary, str)
    delimiter = b"--" + boundary.encode()
    parts = []
    pos = 0
    while True:
        assert body[pos : pos + len(delimiter)] == delimiter, body[pos : pos + 80]
        pos += len(delimiter)
        if body[pos : pos + 4] == b"--\r\n":
            assert pos + 4 == len(body)
            return parts
        assert body[pos : pos + 2] == b"\r\n"
        end_headers = body.index(b"\r\n\r\n", pos)
        part_headers = dict(
            line.split(": ", 1) for line in body[pos + 2 : end_headers].decode().split("\r\n")
        )
        start = end_headers + 4
        length = int(part_headers["Content-Length"])
        parts.append((part_headers, body[start : start + length]))
        assert body[start + length : start + length + 2] == b"\r\n"
        pos = start + length + 2


def bootstrap(url: str) -> tuple[Headers, list[tuple[dict[str, str], bytes]]]:
    status, headers, body = request("GET", url + "?bootstrap")
    assert status == 200, (status, body)
    assert headers["Cache-Control"] == "no-store"
    return headers, parse_multipart(headers, body)


def bootstrap_all(url: str) -> tuple[bytes, bytes, str]:
    """(snapshot body, every update after it, offset to tail from): a partial bootstrap continued by reads."""
    headers, parts = bootstrap(url)
    (_, snap), (_, updates) = parts
    rest = b""
    next_offset = headers["Stream-Next-Offset"]
    if headers.get("Stream-Up-To-Date") != "true":
        rest, responses = read_all(url, next_offset)
        next_offset = responses[-1][1]["Stream-Next-Offset"]
    return snap, updates + rest, next_offset


# ------------------------------------------------------------- publish, discover, read, bootstrap


def test_publish_discover_read_and_bootstrap(srv: ServerProcess) -> None:
    u = new_stream(srv)
    append(u, b"one|")
    mid = append(u, b"two|")[1]["Stream-Next-Offset"]
    append(u, b"three|")
    end = append(u, b"four")[1]["Stream-Next-Offset"]

    status, headers, body = publish(u, mid, b"STATE(one,two)")
    assert (status, body) == (204, b"")
    assert headers["Stream-Snapshot-Offset"] == mid
    assert headers["Stream-Next-Offset"] == end
    etag = headers["ETag"]

    # Discovery (YJS-PROTOCOL.md 5.2): a redirect to the snapshot's own URL.
    status, headers, _ = read(u, "snapshot")
    assert status == 307
    assert headers["Cache-Control"] == "private, max-age=5"
    location = headers["Location"]
    assert location.endswith(f"?offset={mid}_snapshot")
    # The snapshot (5.3): its body, its content type, where the updates continue.
    status, headers, body = read(u, f"{mid}_snapshot")
    assert status == 200
    assert body == b"STATE(one,two)"
    assert headers["Content-Type"] == "application/x-state"
    assert headers["Stream-Next-Offset"] == mid
    assert headers["ETag"] == etag
    # Reading on from there gives exactly the messages after the snapshot.
    assert read_all(u, mid)[0] == b"three|four"

    status, headers, _ = head(u)
    assert status == 200
    assert headers["Stream-Snapshot-Offset"] == mid
    assert headers["Stream-Snapshot-ETag"] == etag
    # Browsers may read them (CORS), and send the publish's own headers.
    exposed = {h.strip() for h in headers["Access-Control-Expose-Headers"].split(",")}
    assert {"Stream-Snapshot-Offset", "Stream-Snapshot-ETag"} <= exposed
    status, headers, _ = request(
        "OPTIONS", u, {"Origin": "https://app.example", "Access-Control-Request-Method": "PUT"}
    )
    allowed = {h.strip() for h in headers["Access-Control-Allow-Headers"].split(",")}
    assert {"If-Match", "Stream-Snapshot-Retain", "If-None-Match"} <= allowed

    headers, parts = bootstrap(u)
    assert headers["Stream-Snapshot-Offset"] == mid
    assert headers["Stream-Next-Offset"] == end
    assert headers["Stream-Up-To-Date"] == "true"
    (snap_headers, snap), (upd_headers, updates) = parts
    assert snap == b"STATE(one,two)" and snap_headers["Content-Type"] == "application/x-state"
    assert snap_headers["Stream-Snapshot-Offset"] == mid
    assert updates == b"three|four"
    assert upd_headers["Content-Type"] == OCTET
    assert upd_headers["Stream-Offset"] == mid and upd_headers["Stream-Next-Offset"] == end


def test_no_snapshot_yet(srv: ServerProcess) -> None:
    u = new_stream(srv, body=b"abc")
    status, headers, _ = read(u, "snapshot")
    assert status == 307 and headers["Location"].endswith("?offset=-1")
    assert "Stream-Snapshot-Offset" not in head(u)[1]
    headers, ((snap_headers, snap), (_, updates)) = bootstrap(u)
    assert headers["Stream-Snapshot-Offset"] == "-1" and snap_headers["Stream-Snapshot-Offset"] == "-1"
    assert snap == b"" and updates == b"abc"
    assert headers["Stream-Up-To-Date"] == "true"
    status, _, body = read(u, f"{head(u)[1]['Stream-Next-Offset']}_snapshot")
    assert status == 404 and error_code(body) == "SNAPSHOT_NOT_FOUND"


def test_json_bootstrap_and_message_boundaries(srv: ServerProcess) -> None:
    u = new_stream(srv, JSON)
    first = append(u, json.dumps([{"n": 1}, {"n": 2}]), JSON)[1]["Stream-Next-Offset"]
    append(u, json.dumps({"n": 3}), JSON)
    status, _, _ = publish(u, first, b'{"sum":3}', JSON)
    assert status == 204
    headers, ((_, snap), (upd_headers, updates)) = bootstrap(u)
    assert json.loads(snap) == {"sum": 3}
    assert upd_headers["Content-Type"] == JSON
    assert json.loads(updates) == [{"n": 3}]  # as a catch-up read answers: one array
    # Inside a message: refused (a newer offset, so only the boundary rule refuses it), nothing stored.
    later = shift(first, 3)
    status, _, body = publish(u, later, b"x", JSON)
    assert (status, error_code(body)) == (400, "SNAPSHOT_NOT_AT_BOUNDARY")
    assert head(u)[1]["Stream-Snapshot-Offset"] == first


def test_partial_bootstrap_continues_with_reads(srv: ServerProcess) -> None:
    u = new_stream(srv)
    start = append(u, b"s" * 10)[1]["Stream-Next-Offset"]
    publish(u, start, b"S")
    payload = bytes(range(200))
    for i in range(0, 200, 50):
        append(u, payload[i : i + 50])
    headers, ((_, snap), (_, updates)) = bootstrap(u)
    assert snap == b"S"
    assert "Stream-Up-To-Date" not in headers and len(updates) == 64  # --bootstrap-max-bytes
    snap, everything, _ = bootstrap_all(u)
    assert everything == payload


# ------------------------------------------------------------- idempotence, conditions, refusals


def test_idempotent_and_conflicting_publishes(srv: ServerProcess) -> None:
    u = new_stream(srv)
    a = append(u, b"aaaa")[1]["Stream-Next-Offset"]
    b = append(u, b"bbbb")[1]["Stream-Next-Offset"]
    status, headers, _ = publish(u, b, b"state-b")
    assert status == 204
    etag_b = headers["ETag"]
    # The same body at the same offset: a success, the same snapshot.
    status, headers, _ = publish(u, b, b"state-b")
    assert status == 204 and headers["ETag"] == etag_b
    # Another body at that offset: 409, the snapshot unchanged.
    status, headers, body = publish(u, b, b"state-B!")
    assert status == 409 and error_code(body) == "SNAPSHOT_CONFLICT"
    assert headers["Stream-Snapshot-Offset"] == b
    # Another content type is another snapshot too.
    status, _, body = publish(u, b, b"state-b", "text/plain")
    assert status == 409 and error_code(body) == "SNAPSHOT_CONFLICT"
    # Older than the newest: stale.
    status, _, body = publish(u, a, b"state-a")
    assert status == 409 and error_code(body) == "SNAPSHOT_STALE"
    assert read(u, f"{b}_snapshot")[2] == b"state-b"


def test_conditional_publish(srv: ServerProcess) -> None:
    u = new_stream(srv)
    a = append(u, b"1")[1]["Stream-Next-Offset"]
    b = append(u, b"2")[1]["Stream-Next-Offset"]
    c = append(u, b"3")[1]["Stream-Next-Offset"]
    status, _, body = publish(u, a, b"A", If_Match="*")
    assert status == 412 and error_code(body) == "SNAPSHOT_PRECONDITION_FAILED"
    status, headers, _ = publish(u, a, b"A", If_None_Match="*")
    assert status == 204
    etag_a = headers["ETag"]
    status, _, body = publish(u, b, b"B", If_None_Match="*")
    assert status == 412 and error_code(body) == "SNAPSHOT_PRECONDITION_FAILED"
    # Two writers replace A: the first wins, the second (still naming A) is refused.
    status, headers, _ = publish(u, b, b"B", If_Match=etag_a)
    assert status == 204
    status, headers2, body = publish(u, c, b"C", If_Match=etag_a)
    assert status == 412 and error_code(body) == "SNAPSHOT_PRECONDITION_FAILED"
    assert headers2["Stream-Snapshot-Offset"] == b
    # A retry of the winner's publish is still a success.
    assert publish(u, b, b"B", If_Match=etag_a)[0] == 204
    assert publish(u, c, b"C", If_Match=headers["ETag"])[0] == 204


@pytest.mark.parametrize(
    ("query", "headers", "body", "status", "code"),
    [
        ("snapshot=zz", {}, b"x", 400, "BAD_REQUEST"),
        ("snapshot=", {}, b"x", 400, "BAD_REQUEST"),
        ("snapshot=TAIL+", {}, b"x", 400, "OFFSET_BEYOND_TAIL"),
        ("snapshot=TAIL", {"Content-Type": "not a type"}, b"x", 400, "BAD_REQUEST"),
        ("snapshot=TAIL", {"If-None-Match": '"abc"'}, b"x", 400, "BAD_REQUEST"),
        ("snapshot=TAIL", {"Stream-Snapshot-Retain": "yes"}, b"x", 400, "BAD_REQUEST"),
        ("snapshot=TAIL", {"If-Match": '"nope"'}, b"x", 412, "SNAPSHOT_PRECONDITION_FAILED"),
        ("snapshot=TAIL", {}, b"x" * (MAX_SNAPSHOT + 1), 413, "PAYLOAD_TOO_LARGE"),
    ],
)
def test_publish_refusals(
    srv: ServerProcess, query: str, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    u = new_stream(srv, body=b"data")
    tail = head(u)[1]["Stream-Next-Offset"]
    query = query.replace("TAIL+", shift(tail, 1)).replace("TAIL", tail)
    got, resp_headers, resp = request("PUT", f"{u}?{query}", headers, body)
    assert (got, error_code(resp)) == (status, code), resp
    assert "Stream-Snapshot-Offset" not in head(u)[1]  # nothing published


def test_publish_on_missing_stream_is_404(srv: ServerProcess) -> None:
    status, _, body = publish(f"{srv.url}/v1/stream/no-such-stream-snap", format_offset(0), b"x")
    assert status == 404 and error_code(body) == "STREAM_NOT_FOUND"


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("bootstrap&live=sse&offset=-1", "BAD_REQUEST"),
        ("bootstrap&offset=-1", "BAD_REQUEST"),
        ("offset=snapshot&live=long-poll", "BAD_REQUEST"),
        ("offset=xyz_snapshot", "BAD_REQUEST"),
    ],
)
def test_read_refusals(srv: ServerProcess, query: str, code: str) -> None:
    u = new_stream(srv, body=b"data")
    status, _, body = request("GET", f"{u}?{query}")
    assert (status, error_code(body)) == (400, code)


# ------------------------------------------------------------- retention


def test_retention_to_snapshot_and_410_points_at_it(srv: ServerProcess) -> None:
    u = new_stream(srv)
    start = head(u)[1]["Stream-Next-Offset"]
    mid = append(u, b"old-history|")[1]["Stream-Next-Offset"]
    end = append(u, b"new")[1]["Stream-Next-Offset"]
    status, headers, _ = publish(u, mid, b"S", Stream_Snapshot_Retain="true")
    assert status == 204 and headers["Stream-Retained-Offset"] == mid
    assert head(u)[1]["Stream-Retained-Offset"] == mid
    status, headers, body = read(u, start)
    assert status == 410
    assert headers["Stream-Next-Offset"] == mid
    assert headers["Stream-Snapshot-Offset"] == mid
    assert json.loads(body)["error"]["snapshot_offset"] == mid
    snap, updates, next_offset = bootstrap_all(u)
    assert (snap, updates, next_offset) == (b"S", b"new", end)
    # A snapshot below the retained offset has no suffix: 410.
    status, _, body = publish(u, start, b"older")
    assert status == 410 and error_code(body) == "OFFSET_GONE"


def test_retain_snapshot_policy_and_admin_retain(srv: ServerProcess) -> None:
    u = new_stream(srv)
    name = u.rsplit("/", 1)[1]
    a = append(u, b"aaaa")[1]["Stream-Next-Offset"]
    b = append(u, b"bbbb")[1]["Stream-Next-Offset"]
    start = shift(a, -4)
    assert publish(u, a, b"A")[0] == 204
    assert head(u)[1]["Stream-Retained-Offset"] == start  # publishing alone keeps history
    # The operator retains from the snapshot, on request.
    status, headers, _ = request(
        "POST", f"{srv.url}/v1/admin/retain/{DEFAULT_BUCKET}/{name}", {}, b'{"offset": "snapshot"}'
    )
    assert status == 204 and headers["Stream-Retained-Offset"] == a
    # ``retain: snapshot`` on the stream: every newer snapshot moves retention with it.
    status, _, body = request(
        "PUT", f"{srv.url}/v1/admin/retention/{DEFAULT_BUCKET}/{name}", {}, b'{"retain": "snapshot"}'
    )
    assert status == 200 and json.loads(body)["retain"] == "snapshot"
    assert publish(u, b, b"B")[0] == 204
    assert head(u)[1]["Stream-Retained-Offset"] == b
    assert read(u, a)[0] == 410
    status, _, body = request(
        "PUT", f"{srv.url}/v1/admin/retention/{DEFAULT_BUCKET}/{name}", {}, b'{"retain": "everything"}'
    )
    assert status == 400
    # Off again: a newer snapshot leaves retention where it is.
    assert request("PUT", f"{srv.url}/v1/admin/retention/{DEFAULT_BUCKET}/{name}", {}, b"{}")[0] == 200
    c = append(u, b"cccc")[1]["Stream-Next-Offset"]
    assert publish(u, c, b"C")[0] == 204
    assert head(u)[1]["Stream-Retained-Offset"] == b
    # No snapshot to retain from: 404.
    v = new_stream(srv, body=b"x")
    status, _, body = request(
        "POST",
        f"{srv.url}/v1/admin/retain/{DEFAULT_BUCKET}/{v.rsplit('/', 1)[1]}",
        {},
        b'{"offset": "snapshot"}',
    )
    assert (status, error_code(body)) == (404, "SNAPSHOT_NOT_FOUND")


def test_retain_snapshot_on_a_bucket(srv: ServerProcess) -> None:
    bucket = "snapbucket-" + format_offset(0)[-4:]
    assert request("PUT", f"{srv.url}/v1/buckets/{bucket}")[0] in (200, 201)
    u = new_stream(srv, bucket=bucket, body=b"0123")
    a = head(u)[1]["Stream-Next-Offset"]
    assert publish(u, a, b"S0")[0] == 204
    status, _, _ = request("PUT", f"{srv.url}/v1/admin/retention/{bucket}", {}, b'{"retain": "snapshot"}')
    assert status == 200
    assert head(u)[1]["Stream-Retained-Offset"] == a  # turned on: retained from the snapshot at once
    b = append(u, b"4567")[1]["Stream-Next-Offset"]
    assert publish(u, b, b"S1")[0] == 204
    assert head(u)[1]["Stream-Retained-Offset"] == b
