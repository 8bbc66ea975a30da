"""Bootstrap through plain HTTP, then the official clients tail from its ``Stream-Next-Offset``, unchanged;
snapshots under auth scopes and quotas.

* A bootstrap read (any HTTP client: ``http.client`` here) returns the snapshot and the
  messages after it; the official Python (``durable-streams``) and TypeScript
  (``@durable-streams/client``, ``tests/clients/ts_tail.mjs``) clients then read from the
  returned offset, catch-up and long-poll, and see exactly what was appended after it.
* Scopes: publishing needs write (a read token: 403, none: 401), reading a snapshot or
  bootstrapping needs read.
* Quotas: a snapshot's bytes are retained bytes of its bucket (507 over
  ``max_retained_bytes``, nothing stored) and show in the usage API.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import node_packages
from tests.support.auth_support import AuthServer, bearer
from tests.support.http_helpers import error_code, request

pytestmark = pytest.mark.timeout(600)
CLIENTS = Path(__file__).parent.parent / "clients"
TEXT = "text/plain"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    s = AuthServer(
        tmp_path_factory.mktemp("snapshot-clients") / "data", "--long-poll-timeout-s", "2", mode="tokens"
    ).start()
    try:
        s.bucket("acme")
        yield s
    finally:
        s.stop()


def bootstrap_over_http(url: str, token: str) -> tuple[bytes, bytes, str]:
    """(snapshot, updates, Stream-Next-Offset) of a bootstrap read, with only the standard library."""
    from email import message_from_bytes

    status, headers, body = request("GET", url + "?bootstrap", bearer(token))
    assert status == 200, body
    msg = message_from_bytes(b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body)
    snap_part, updates_part = msg.get_payload()  # type: ignore[misc]
    snap = snap_part.get_payload(decode=True)
    updates = updates_part.get_payload(decode=True)
    assert isinstance(snap, bytes) and isinstance(updates, bytes)
    return snap, updates, headers["Stream-Next-Offset"]


def make_stream(srv: AuthServer, name: str) -> tuple[str, str, str]:
    """A text stream with history and a snapshot at its tail; (url, write token, read token)."""
    write = srv.token("acme", "write")["token"]
    read = srv.token("acme", "read")["token"]
    url = f"{srv.url}/v1/buckets/acme/stream/{name}"
    assert request("PUT", url, {**bearer(write), "Content-Type": TEXT}, b"a,b,")[0] == 201
    tail = request("HEAD", url, bearer(write))[1]["Stream-Next-Offset"]
    status, _, body = request(
        "PUT", f"{url}?snapshot={tail}", {**bearer(write), "Content-Type": TEXT}, b"[a b]"
    )
    assert status == 204, body
    assert request("POST", url, {**bearer(write), "Content-Type": TEXT}, b"c,")[0] == 204
    return url, write, read


def test_python_client_tails_from_the_bootstrap_offset(srv: AuthServer) -> None:
    from durable_streams import stream

    url, write, read = make_stream(srv, "py/doc")
    snap, updates, offset = bootstrap_over_http(url, read)
    assert (snap, updates) == (b"[a b]", b"c,")
    with stream(url, headers=bearer(read), live=False, offset=offset) as res:
        assert res.read_bytes() == b""  # nothing after the bootstrap yet
    with stream(url, headers=bearer(read), live="long-poll", offset=offset) as res:
        later = threading.Timer(
            0.3, lambda: request("POST", url, {**bearer(write), "Content-Type": TEXT}, b"d,e")
        )
        later.start()
        seen = b""
        for chunk in res:
            seen += chunk
            if seen.endswith(b"d,e"):
                break
        later.join()
    assert seen == b"d,e"  # exactly what follows the bootstrap: nothing twice, nothing missed


@pytest.fixture(scope="module")
def typescript_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node_packages.require_node("the TypeScript client")
    return node_packages.install(
        tmp_path_factory,
        CLIENTS,
        ("package.json", "ts_tail.mjs"),
        "@durable-streams/client",
        "TIERED_CLIENTS_HOME",
    )


def test_typescript_client_tails_from_the_bootstrap_offset(srv: AuthServer, typescript_client: Path) -> None:
    url, write, read = make_stream(srv, "ts/doc")
    snap, updates, offset = bootstrap_over_http(url, read)
    assert (snap, updates) == (b"[a b]", b"c,")
    later = threading.Timer(
        1.5, lambda: request("POST", url, {**bearer(write), "Content-Type": TEXT}, b"x,END")
    )
    later.start()
    try:
        proc = subprocess.run(
            ["node", "ts_tail.mjs", url, read, offset, "END"],
            cwd=typescript_client,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        later.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["live"] == "x,END"
    assert out["catchUp"] in ("", "x,END")  # before or after the append landed


# ------------------------------------------------------------- scopes


def test_publishing_needs_write_and_reading_needs_read(srv: AuthServer) -> None:
    url, write, read = make_stream(srv, "scopes/doc")
    tail = request("HEAD", url, bearer(write))[1]["Stream-Next-Offset"]
    target = f"{url}?snapshot={tail}"
    status, _, _ = request("PUT", target, {"Content-Type": TEXT}, b"S")
    assert status == 401
    status, _, _ = request("PUT", target, {**bearer(read), "Content-Type": TEXT}, b"S")
    assert status == 403
    other = srv.token("acme", "write", prefix="elsewhere/")["token"]
    status, _, _ = request("PUT", target, {**bearer(other), "Content-Type": TEXT}, b"S")
    assert status in (403, 404)  # a grant that does not cover the stream
    status, headers, _ = request("PUT", target, {**bearer(write), "Content-Type": TEXT}, b"S")
    assert status == 204
    for query in ("?bootstrap", "?offset=snapshot", f"?offset={tail}_snapshot"):
        assert request("GET", url + query, {})[0] == 401
        status, _, _ = request("GET", url + query, bearer(read))
        assert status in (200, 307)
    assert request("HEAD", url, bearer(read))[1]["Stream-Snapshot-Offset"] == tail


# ------------------------------------------------------------- quotas and usage


def test_snapshot_bytes_are_retained_bytes(srv: AuthServer) -> None:
    srv.bucket("quota")
    assert srv.admin("PUT", "/v1/admin/quotas/quota", {"max_retained_bytes": 100})[0] == 200
    write = srv.token("quota", "write")["token"]
    url = f"{srv.url}/v1/buckets/quota/stream/doc"
    assert request("PUT", url, {**bearer(write), "Content-Type": TEXT}, b"x" * 60)[0] == 201
    tail = request("HEAD", url, bearer(write))[1]["Stream-Next-Offset"]
    status, _, body = request(
        "PUT", f"{url}?snapshot={tail}", {**bearer(write), "Content-Type": TEXT}, b"s" * 50
    )
    assert (status, error_code(body)) == (507, "QUOTA_EXCEEDED")
    assert "Stream-Snapshot-Offset" not in request("HEAD", url, bearer(write))[1]
    status, _, _ = request(
        "PUT", f"{url}?snapshot={tail}", {**bearer(write), "Content-Type": TEXT}, b"s" * 30
    )
    assert status == 204
    status, usage = srv.admin("GET", "/v1/admin/usage?bucket=quota")
    assert status == 200
    [row] = usage["buckets"]
    assert row["retained_bytes"]["snapshots"] == 30
    assert row["retained_bytes"]["hot"] + row["retained_bytes"]["cold"] == 60
    # The 100 bytes are held: one more byte of data is over the quota.
    status, _, body = request("POST", url, {**bearer(write), "Content-Type": TEXT}, b"y" * 11)
    assert (status, error_code(body)) == (507, "QUOTA_EXCEEDED")
