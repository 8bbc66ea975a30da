from __future__ import annotations

import os
from pathlib import Path

from .cluster_support import start_node, unique_prefix, wait_served
from .s3_server import S3Endpoint
from .test_conformance import run_suite


def test_iter(moto_s3: S3Endpoint, tmp_path: Path) -> None:
    prefix = unique_prefix("iter")
    nodes = []
    try:
        for name in ("n1", "n2", "n3"):
            nodes.append(start_node(tmp_path, moto_s3, prefix, name, shards=8, ttl_s=4.0, durability="object-store",
                                    wal_interval_ms=5, extra=("--long-poll-timeout-s", "3", "--webhook-allow-loopback", "true")))
        served = wait_served(nodes, 8, 30, every_node=True)
        assert all(served), served
        args = tuple(a for a in os.environ.get("ITER_ARGS", "").split("|") if a)
        passed, failed, out = run_suite(nodes[1].url, env={"CONFORMANCE_SUBSCRIPTIONS": "1"}, vitest_args=args)
    finally:
        for n in nodes:
            n.stop()
    Path("/tmp/forksubs-iter.log").write_text(out)
    for i, n in enumerate(nodes):
        Path(f"/tmp/forksubs-n{i}.log").write_text(n.log_path.read_text(errors="replace")[-200000:])
    print(passed, failed)
    assert failed == 0
