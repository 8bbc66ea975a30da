from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from .cluster_support import start_node, unique_prefix, wait_served
from .s3_server import S3Endpoint


def req(method, url, body=None, headers=None):
    r = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(r) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_dbg(moto_s3: S3Endpoint, tmp_path: Path) -> None:
    prefix = unique_prefix("dbg")
    nodes = [start_node(tmp_path, moto_s3, prefix, n, shards=8, ttl_s=4.0, durability="object-store", wal_interval_ms=5) for n in ("n1", "n2", "n3")]
    try:
        wait_served(nodes, 8, 30, every_node=True)
        u = nodes[1].url
        for name in ("a", "b", "c", "d"):
            req("PUT", u + f"/v1/stream/{name}", b"", {"Content-Type": "text/plain"})
            t = time.monotonic()
            for i in range(20):
                st, _, _ = req("POST", u + f"/v1/stream/{name}", b"x", {"Content-Type": "text/plain"})
                assert st == 204
            print(name, (time.monotonic() - t) / 20 * 1000, "ms/append")
    finally:
        for n in nodes:
            n.stop()
