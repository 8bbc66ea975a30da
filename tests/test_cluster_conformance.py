"""The official conformance suite against one node of a three-node cluster (object-store durability).

Streams hash over 8 shards that rendezvous placement spreads over all three
nodes, so most of the suite's requests are forwarded by the node it talks to.

Forks are left out (``-t`` excludes every test named "Fork"): a fork and its
source hash to different shards, and forks across shards are not built (see
docs/cluster.md). Everything else must pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .cluster_support import start_node, unique_prefix, wait_served
from .s3_server import S3Endpoint
from .server_process import ServerProcess
from .test_conformance import EXPECTED_PASSED, _require_node, run_suite

FORK_TESTS = 82  # tests of suite 0.3.6 whose name contains "Fork" (250 of its 332 remain)


def run_suite_without_forks(url: str) -> tuple[int, int, str]:
    return run_suite(url, vitest_args=("-t", "^(?!.*Fork).*$"))


@pytest.mark.conformance
def test_conformance_suite_against_one_node_of_three(moto_s3: S3Endpoint, tmp_path: Path) -> None:
    _require_node()
    prefix = unique_prefix("conformance")
    nodes: list[ServerProcess] = []
    try:
        for name in ("n1", "n2", "n3"):
            nodes.append(
                start_node(
                    tmp_path,
                    moto_s3,
                    prefix,
                    name,
                    shards=8,
                    ttl_s=4.0,
                    durability="object-store",
                    wal_interval_ms=5,
                    extra=("--long-poll-timeout-s", "3"),
                )  # fmt: skip
            )
        served = wait_served(nodes, 8, 30, every_node=True)
        assert all(served) and set().union(*served) == set(range(8)), served
        passed, failed, out = run_suite_without_forks(nodes[1].url)
    finally:
        for n in nodes:
            n.stop()
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED - FORK_TESTS, out[-3000:]
