"""The official conformance suite against one node of a three-node cluster (object-store durability).

Streams hash over 8 shards that rendezvous placement spreads over all three
nodes, so most of the suite's requests are forwarded by the node it talks to.
The whole suite runs, subscriptions included (``CONFORMANCE_SUBSCRIPTIONS=1``):
forks whose source is in another shard are pinned there and copied
(``tiered/cluster/features/xfork.py``), and every shard reports its streams to the
subscriptions' shard (``tiered/cluster/features/sub_feed.py``). Long-polls time out
after 3 s (the suite's waits stay under 4 s).

Tests without a budget of their own get 15 s on an idle machine instead of
vitest's default 5 s, stretched by the load like every budget of the suite
(``run_suite``): the suite's property tests make hundreds of sequential writes,
and here each is forwarded and committed to the object store before it is
acknowledged (one of them took 5.005 s on a loaded machine, and more than 15 s
at a load average of 6 on 2 cores). Budgets the suite sets itself (the
offset=now long-polls) are unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.test_conformance import EXPECTED_PASSED_WITH_SUBSCRIPTIONS, run_suite
from tests.support.cluster_support import start_nodes, unique_prefix, wait_served
from tests.support.s3_server import S3Endpoint


@pytest.mark.conformance
def test_conformance_suite_against_one_node_of_three(
    conformance_suite: Path, moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    with start_nodes(
        tmp_path,
        moto_s3,
        unique_prefix("conformance"),
        shards=8,
        ttl_s=4.0,
        durability="object-store",
        wal_interval_ms=5,
        # The suite's webhook receivers listen on 127.0.0.1: loopback webhooks are for development only.
        extra=("--long-poll-timeout-s", "3", "--webhook-allow-loopback", "true"),
    ) as started:
        nodes = list(started.values())
        served = wait_served(nodes, 8, 30, every_node=True)
        assert all(served) and set().union(*served) == set(range(8)), served
        passed, failed, out = run_suite(
            conformance_suite, nodes[1].url, env={"CONFORMANCE_SUBSCRIPTIONS": "1"}, test_timeout_s=15
        )
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED_WITH_SUBSCRIPTIONS, out[-3000:]
