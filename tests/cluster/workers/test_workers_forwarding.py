"""Forwarding between the workers of a node, black box: what a forwarded request carries arrives intact.

A two-worker node with auth on (tiered tokens), real processes on the
loopback. Every request below opens a connection of its own, so the kernel
hands about half of them to the worker that does not serve their stream's
shard, which forwards them in a frame (``tiered/cluster/gateway/forward_frames.py``).
Whichever worker a request reached, the answer must be the same: the
credential the client sent is the one the owner authorizes, large bodies
arrive byte-exact, and event streams flow through the forwarding worker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.deadlines import scaled, wait_for
from tests.support.http_helpers import SseReader, read_all, request, stream_url, unique
from tests.support.server_process import ServerProcess

STREAMS = 8  # as many as the node's shards: most land on the worker the client did not reach


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    srv = AuthServer(
        tmp_path_factory.mktemp("fwd") / "data",
        "--workers",
        "2",
        "--worker-shards",
        "8",
        "--long-poll-timeout-s",
        "3",
        mode="tokens",
    ).start(timeout=60)
    try:
        yield srv
    finally:
        assert srv.stop() == 0, srv.log()


def _forwarded(srv: AuthServer) -> float:
    status, _, body = request("GET", srv.url + "/metrics", OPERATOR)
    assert status == 200, body
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^tiered_cluster_forwarded_total\{[^}]*\} (\S+)$", body.decode(), re.M)
    )


def _streams(srv: AuthServer, bucket: str) -> list[str]:
    srv.bucket(bucket)
    urls = [stream_url(srv.url, unique("f"), bucket) for _ in range(STREAMS)]
    for url in urls:
        status, _, body = request("PUT", url, {**OPERATOR, "Content-Type": "application/octet-stream"}, b"")
        assert status == 201, body
    return urls


def test_the_owner_authorizes_the_credential_the_client_sent(node: AuthServer) -> None:
    before = _forwarded(node)
    urls = _streams(node, unique("b"))
    bucket = urls[0].split("/v1/buckets/")[1].split("/")[0]
    other = unique("other")
    node.bucket(other)
    writer = bearer(node.token(bucket, "write")["token"])
    reader = bearer(node.token(bucket, "read")["token"])
    elsewhere = bearer(node.token(other, "write")["token"])
    octets = {"Content-Type": "application/octet-stream"}
    refusals: set[int] = set()
    for url in urls:
        for _ in range(2):
            status, _, body = request("POST", url, {**writer, **octets}, b"ok")
            assert status in (200, 204), body
        assert request("POST", url, {**reader, **octets}, b"no")[0] == 403  # read scope: no append
        refusals.add(request("POST", url, {**elsewhere, **octets}, b"no")[0])  # a grant on another bucket
        assert request("POST", url, octets, b"no")[0] == 401  # no credential
        assert request("GET", url + "?offset=-1", bearer("not-a-token"))[0] == 401
        status, _, body = request("GET", url + "?offset=-1", reader)
        assert (status, body) == (200, b"okok")  # only the writer's appends, whichever worker took them
    assert len(refusals) == 1 and refusals <= {403, 404}, refusals  # one answer, whichever worker took it
    assert _forwarded(node) > before  # some of these were forwarded (about half, by the kernel's choice)


def test_large_bodies_arrive_byte_exact_through_either_worker(node: AuthServer) -> None:
    urls = _streams(node, unique("big"))
    sent = {}
    for i, url in enumerate(urls):
        body = os.urandom(3 * 1024 * 1024 + i)
        status, _, answer = request(
            "POST", url, {**OPERATOR, "Content-Type": "application/octet-stream"}, body, timeout=60
        )
        assert status in (200, 204), answer
        sent[url] = body
    for url, body in sent.items():
        got = b""
        offset = "-1"
        while True:
            status, headers, chunk = request("GET", f"{url}?offset={offset}", OPERATOR, timeout=60)
            assert status == 200, chunk
            got += chunk
            offset = headers["Stream-Next-Offset"]
            if headers.get("Stream-Up-To-Date") == "true":
                break
        assert got == body


def test_event_streams_flow_through_the_forwarding_worker(node: AuthServer) -> None:
    urls = _streams(node, unique("sse"))
    readers = [SseReader(url, "-1", timeout=20, headers=OPERATOR) for url in urls]
    try:
        assert all(r.status == 200 for r in readers)
        for k, url in enumerate(urls):
            status, _, body = request(
                "POST", url, {**OPERATOR, "Content-Type": "application/octet-stream"}, f"event-{k}".encode()
            )
            assert status in (200, 204), body
        for k, reader in enumerate(readers):
            reader.read_until(
                lambda events, k=k: any(e.b64() == f"event-{k}".encode() for e in events if e.event == "data")
            )
    finally:
        for reader in readers:
            reader.close()


# ---------------------------------------------------------------- the owner dies mid-forward


def _unix_post(path: str, target: str, body: bytes) -> tuple[int, dict[str, str]]:
    """One plain HTTP/1.1 POST over a worker's own socket (the worker the client reached, chosen)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(scaled(30))
        s.connect(path)
        head = (
            f"POST {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        s.sendall(head.encode() + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    lines = raw.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers


def _worker_sockets(srv: ServerProcess) -> Path:
    pid = next(iter(_worker_pids(srv).values()))
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    spec = next(e for e in env if e.startswith(b"TIERED_WORKER_SPEC="))
    return Path(json.loads(spec.split(b"=", 1)[1])["sockets"])


def _worker_pids(srv: ServerProcess) -> dict[str, int]:
    return {
        w: int(p) for w, p in re.findall(r"worker (w\d+) started \(pid (\d+)\)", srv.log_path.read_text())
    }


def test_an_owner_killed_mid_forward_answers_503_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", "--workers", "2", "--worker-shards", "1").start(timeout=60)
    try:
        name = unique("k")
        assert (
            request("PUT", stream_url(srv.url, name), {"Content-Type": "application/octet-stream"}, b"")[0]
            == 201
        )
        status, _, body = request("GET", srv.url + "/metrics")
        served = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^tiered_cluster_shards_served\{[^}]*worker="(w\d+)"[^}]*\} (\S+)$', body.decode(), re.M
            )
        }
        owner = max(served, key=lambda w: served[w])
        other = next(w for w in _worker_pids(srv) if w != owner)
        receiver = str(_worker_sockets(srv) / f"{other}.sock")
        owner_pid = _worker_pids(srv)[owner]
        acked: list[bytes] = []
        refused: list[bytes] = []
        statuses: list[int] = []

        def append(k: int) -> None:
            # plain appends (no producer): a request the owner may have seen is never resent for the client
            data = f"<{k:05d}:{'x' * 4000}>".encode()
            if k == 60:  # the other threads' appends are in flight through the receiver right now
                os.kill(owner_pid, signal.SIGKILL)
            status, headers = _unix_post(receiver, f"/v1/stream/{name}", data)
            statuses.append(status)
            if status in (200, 204):
                acked.append(data)
            else:
                assert status == 503 and headers.get("retry-after"), (status, headers)
                refused.append(data)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(append, range(120)))
        assert all(s in (200, 204, 503) for s in statuses), statuses
        wait_for(lambda: _settled_again(srv, name), 60, "the shard served again after the owner's death")
        data, _ = read_all(stream_url(srv.url, name))
        records = re.findall(rb"<\d{5}:x{4000}>", data)
        assert b"".join(records) == data  # only whole appends: nothing half-written
        assert set(acked) <= set(records)  # every acknowledged append is there
        assert len(set(records)) == len(records)
        assert set(records) <= set(acked) | set(refused)
    finally:
        srv.stop()


def _settled_again(srv: ServerProcess, name: str) -> bool:
    try:
        return request("GET", stream_url(srv.url, name) + "?offset=-1", timeout=5)[0] == 200
    except OSError:
        return False
