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

import os
import re
from collections.abc import Iterator

import pytest

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.http_helpers import SseReader, request, stream_url, unique

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
