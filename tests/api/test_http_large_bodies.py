"""Large bodies stored by reference over HTTP (issue 22): streamed by both adapters, byte-exact, and SIGKILL.

A real ``tiered serve`` with a low threshold (64 KiB) and a low journal limit
(256 KiB), so a body of a few hundred KiB exercises the whole path: above
``max_body_bytes`` it can only have been streamed, never buffered.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deadlines import Deadline
from tests.support.gc_support import journal_records
from tests.support.http_helpers import (
    append,
    create,
    error_code,
    head,
    read,
    read_all,
    request,
    stream_url,
    unique,
)
from tests.support.server_process import ServerProcess
from tiered.engine.streams.records import ColdCopyAborted, ColdCopyStarted, PayloadAppended

pytestmark = pytest.mark.timeout(120)

THRESHOLD = 64 * 1024
MAX_BODY = 256 * 1024
OCTET = "application/octet-stream"
ARGS = (
    "--large-body-threshold-bytes",
    str(THRESHOLD),
    "--max-body-bytes",
    str(MAX_BODY),
    "--segment-bytes",
    str(1 << 20),
    "--read-chunk-bytes",
    str(100_000),
)


def start(data_dir: Path, http_server: str = "granian", port: int | None = None) -> ServerProcess:
    srv = ServerProcess(data_dir, *ARGS, "--http-server", http_server)
    if port is not None:
        srv.port = port
    return srv.start()


@pytest.fixture(params=["granian", "aiohttp"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    srv = start(tmp_path / "data", request.param)
    yield srv
    srv.stop()


def payload_files(data_dir: Path) -> set[str]:
    root = data_dir / "cold" / "data"
    return {p.name for p in root.glob("*.payload")} if root.exists() else set()


def test_bodies_above_the_threshold_round_trip_byte_exact(server: ServerProcess) -> None:
    url = stream_url(server.url, unique())
    assert create(url, OCTET, b"head;")[0] == 201
    big = os.urandom(3 * MAX_BODY + 17)  # above the journal's limit: only a streamed body gets in
    middle = os.urandom(THRESHOLD + 1)  # above the threshold, below the limit: by reference too
    parts = [b"head;", big, b"between;", middle, b"tail;"]
    for part in parts[1:]:
        status, headers, body = append(url, part)
        assert status == 204, body
    expected = b"".join(parts)
    assert read(url, "-1")[1]["Stream-Next-Offset"] != head(url)[1]["Stream-Next-Offset"]  # read in chunks
    data, responses = read_all(url, "-1")
    assert data == expected
    assert max(len(r[2]) for r in responses) <= 100_000  # reads stay within read_chunk_bytes
    assert len(payload_files(server.data_dir)) == 2
    # Producers: a retry of a large append is a duplicate (204), stored once.
    headers = {"Content-Type": OCTET, "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert request("POST", url, headers, big)[0] == 200
    assert request("POST", url, headers, big)[0] == 204
    data, _ = read_all(url, "-1")
    assert data == expected + big
    assert len(payload_files(server.data_dir)) == 3


def test_json_streams_take_bodies_through_the_journal_only(server: ServerProcess) -> None:
    url = stream_url(server.url, unique())
    assert create(url, "application/json", b"[]")[0] == 201
    medium = b"[" + b",".join(b"%d" % i for i in range(20_000)) + b"]"  # above the threshold, below the limit
    assert THRESHOLD < len(medium) < MAX_BODY
    assert append(url, medium, "application/json")[0] == 204
    huge = b"[" + b"1," * MAX_BODY + b"1]"
    status, _, body = append(url, huge, "application/json")
    assert status == 413 and error_code(body) == "PAYLOAD_TOO_LARGE"
    status, headers, body = read(url, "-1")
    assert status == 200 and len(body) > THRESHOLD
    assert payload_files(server.data_dir) == set()


def test_a_body_cut_short_stores_nothing(server: ServerProcess) -> None:
    url = stream_url(server.url, unique())
    assert create(url, OCTET, b"kept")[0] == 201
    send_partial(url, 2 * MAX_BODY, MAX_BODY // 2)

    def settled() -> bool:
        # The intent, if the upload got that far, is abandoned at once.
        records = journal_records(server.data_dir)
        started = [r.key for r in records if isinstance(r, ColdCopyStarted) and r.key.endswith(".payload")]
        return started == [r.key for r in records if isinstance(r, ColdCopyAborted)]

    deadline = Deadline(20)
    while not deadline.expired() and not ("client disconnected" in server.log() and settled()):
        time.sleep(0.05)
    assert "client disconnected" in server.log() and settled()
    assert read(url, "-1")[2] == b"kept"
    assert payload_files(server.data_dir) == set()


def aborted(data_dir: Path) -> bool:
    return any(isinstance(r, ColdCopyAborted) for r in journal_records(data_dir))


def send_partial(url: str, declared: int, sent: int) -> socket.socket:
    """Start a POST of ``declared`` bytes, send ``sent`` of them, and close the connection."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))
    head_lines = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {OCTET}\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    sock.sendall(head_lines.encode() + os.urandom(sent))
    sock.close()
    return sock


def staged_files(data_dir: Path) -> int:
    """Uploads under way on the local store (a staged file each)."""
    staging = data_dir / "cold" / ".staging"
    return len(list(staging.glob("*.tmp"))) if staging.exists() else 0


def test_sigkill_during_the_upload_and_after_the_reference(tmp_path: Path) -> None:
    srv = start(tmp_path / "data")
    try:
        url = stream_url(srv.url, unique())
        assert create(url, OCTET, b"first;")[0] == 201
        acknowledged = os.urandom(2 * MAX_BODY)
        assert append(url, acknowledged, OCTET)[0] == 204
        expected = b"first;" + acknowledged
        # SIGKILL right after the reference was acknowledged: it survives.
        srv.kill()
        srv = start(tmp_path / "data", port=srv.port)
        assert read_all(url, "-1")[0] == expected
        [kept] = payload_files(srv.data_dir)

        # SIGKILL while a body streams in: the intent is journaled, part of the body staged, nothing more.
        parts = urllib.parse.urlsplit(url)
        sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))
        declared = 4 * MAX_BODY
        sock.sendall(
            (
                f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {OCTET}\r\n"
                f"Content-Length: {declared}\r\n\r\n"
            ).encode()
            + os.urandom(declared // 2)
        )
        deadline = Deadline(20)
        while not deadline.expired() and not (
            staged_files(srv.data_dir) > 0
            and any(isinstance(r, ColdCopyStarted) for r in journal_records(srv.data_dir))
        ):
            time.sleep(0.02)
        assert staged_files(srv.data_dir) > 0
        srv.kill()
        sock.close()
        srv = start(tmp_path / "data", port=srv.port)
        assert read_all(url, "-1")[0] == expected  # nothing acknowledged lost, nothing unacknowledged shown
        assert head(url)[0] == 200
        # The interrupted intent is abandoned at start-up (the flusher's first step); no object was published.
        deadline = Deadline(20)
        while not deadline.expired() and not aborted(srv.data_dir):
            time.sleep(0.05)
        records = journal_records(srv.data_dir)
        started = [r.key for r in records if isinstance(r, ColdCopyStarted) and r.key.endswith(".payload")]
        assert len(started) == 2 and [r.key for r in records if isinstance(r, ColdCopyAborted)] == started[1:]
        assert len([r for r in records if isinstance(r, PayloadAppended)]) == 1
        assert payload_files(srv.data_dir) == {kept}
    finally:
        srv.stop()
