from __future__ import annotations

import json
import time
from pathlib import Path

from tiered.cluster.routing import SUBSCRIPTIONS_KEY
from tiered.cluster.shards import shard_of

from .cluster_support import start_node, unique_prefix, wait_served
from .http_helpers import request
from .s3_server import S3Endpoint


def test_dbg(moto_s3: S3Endpoint, tmp_path: Path) -> None:
    prefix = unique_prefix("dbg")
    nodes = [start_node(tmp_path, moto_s3, prefix, n, shards=8, ttl_s=4.0, durability="object-store", wal_interval_ms=5) for n in ("n1", "n2", "n3")]
    try:
        wait_served(nodes, 8, 30, every_node=True)
        u = nodes[1].url
        subs_shard = shard_of(*SUBSCRIPTIONS_KEY, 8)
        names = [n for n in (f"events/s{i}" for i in range(100)) if shard_of("default", n, 8) != subs_shard][:2]

        def run(label: str) -> None:
            lat = []
            for name in names:
                request("PUT", f"{u}/v1/stream/{name}", {"Content-Type": "text/plain"}, b"")
                for _ in range(150):
                    t = time.perf_counter()
                    st, _, _ = request("POST", f"{u}/v1/stream/{name}", {"Content-Type": "text/plain"}, b"x" * 64)
                    lat.append(time.perf_counter() - t)
                    assert st == 204
            lat.sort()
            print(label, "p50 %.1f ms p99 %.1f ms" % (lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000))

        run("no subscription  ")
        body = json.dumps({"type": "pull-wake", "pattern": "other/*", "wake_stream": "w"}).encode()
        assert request("PUT", f"{u}/v1/stream/__ds/subscriptions/x", {"Content-Type": "application/json"}, body)[0] == 201
        run("with subscription")
    finally:
        for n in nodes:
            n.stop()
