"""Bounded waiting on a stalled object store: cold reads, readiness, metrics.

A real ``tiered serve`` talks to moto through a TCP proxy the test controls.
When the proxy black-holes (connections accepted, nothing ever answered), a
cold read answers 503 with ``Retry-After`` within ``--cold-read-timeout-s``
(not the client's ~32 s of retries), the stall is counted, ``/readyz`` turns
503 while ``/healthz`` stays 200 (liveness) and shows the store unreachable,
and hot data keeps being served. When the store answers again, so does
everything else.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support import s3_server
from tests.support.deadlines import scaled
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess
from tests.support.tcp_proxy import proxy_to

pytestmark = pytest.mark.timeout(120)
OCTET = {"Content-Type": "application/octet-stream"}


def metric(srv: ServerProcess, name: str) -> float:
    for line in request("GET", srv.url + "/metrics")[2].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(name)


def wait_for(cond, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_stalled_store_bounds_cold_reads_and_turns_readiness_off(
    tmp_path: Path, moto_s3: s3_server.S3Endpoint
) -> None:
    target = urlsplit(moto_s3.url)
    with proxy_to(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        srv = ServerProcess(
            tmp_path / "data",
            "--cold-store",
            "s3",
            "--s3-bucket",
            moto_s3.bucket,
            "--s3-prefix",
            "outage",
            "--s3-endpoint",
            proxy.url,
            "--s3-region",
            moto_s3.region,
            "--s3-addressing-style",
            "path",
            "--flush-interval-s",
            "0.1",
            "--hot-retention-s",
            "0",
            "--read-cache-bytes",
            "0",
            "--cold-read-timeout-s",
            "1",
            "--store-probe-interval-s",
            "0.3",
            "--gc-interval-s",
            "3600",
            env={
                k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
            },
        ).start()
        cold_url, hot_url = srv.url + "/v1/stream/cold", srv.url + "/v1/stream/hot"
        try:
            assert request("PUT", cold_url, OCTET, b"c" * 5000)[0] == 201
            wait_for(lambda: metric(srv, "tiered_hot_bytes") == 0, "the stream to move cold")
            wait_for(lambda: request("GET", srv.url + "/readyz")[0] == 200, "readiness")
            assert request("GET", cold_url + "?offset=-1")[2] == b"c" * 5000

            proxy.set("blackhole")
            started = time.monotonic()
            status, headers, body = request("GET", cold_url + "?offset=-1", timeout=30)
            elapsed = time.monotonic() - started
            assert status == 503 and headers["Retry-After"], (status, body)
            assert "did not answer within 1s" in json.loads(body)["error"]["message"]
            assert elapsed < 5, f"a cold read waited {elapsed:.1f}s on a stalled store"
            assert metric(srv, "tiered_store_stalls_total") >= 1
            wait_for(
                lambda: request("GET", srv.url + "/readyz")[0] == 503, "/readyz to report the outage", 10
            )
            status, _, raw = request("GET", srv.url + "/readyz")
            assert json.loads(raw)["store"]["reachable"] is False
            status, _, raw = request("GET", srv.url + "/healthz")
            assert status == 200 and json.loads(raw) == {"ok": True, "store": json.loads(raw)["store"]}
            assert json.loads(raw)["store"]["reachable"] is False
            assert metric(srv, "tiered_store_reachable") == 0
            # Hot data is still written and served through the outage.
            assert request("PUT", hot_url, OCTET, b"h" * 100)[0] == 201
            assert request("GET", hot_url + "?offset=-1")[2] == b"h" * 100

            proxy.set("forward")
            wait_for(lambda: request("GET", srv.url + "/readyz")[0] == 200, "readiness after the outage", 30)
            wait_for(
                lambda: request("GET", cold_url + "?offset=-1", timeout=30)[0] == 200, "cold reads again", 30
            )
            assert request("GET", cold_url + "?offset=-1")[2] == b"c" * 5000
            assert metric(srv, "tiered_store_reachable") == 1
        except BaseException:
            print(srv.log())
            raise
        finally:
            srv.kill()
