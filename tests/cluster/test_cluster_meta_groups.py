"""``tests/engine/groups/test_groups_http.py`` against a single-node cluster of 4 shards: each group over streams of every shard."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.groups import test_groups_http as groups_http
from tests.engine.groups.test_groups_http import *  # noqa: F403  (the same tests, with the fixture below)
from tests.support.cluster_support import cluster_module_server
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET

SHARDS = 4


@pytest.fixture(scope="module")
def server(moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from cluster_module_server(moto_s3, tmp_path_factory, "groups", shards=SHARDS)


def _same_shard_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream prefixes whose ``a`` and ``b`` streams share a shard.

    Which stream moves to a new member follows stream uid order; a cluster gives
    other shards' streams uids above the group shard's own, so two streams of one
    shard keep their creation order, as on one server, and the tests' exact plans hold.
    """
    plain = groups_http.names

    def names(prefix: str = "t") -> tuple[str, str]:
        for _ in range(1000):
            g, p = plain(prefix)
            if shard_of(DEFAULT_BUCKET, f"{p}/a", SHARDS) == shard_of(DEFAULT_BUCKET, f"{p}/b", SHARDS):
                return g, p
        raise AssertionError("no prefix with a and b in one shard")

    monkeypatch.setattr(groups_http, "names", names)


def test_join_heartbeat_rebalance_and_drain(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    _same_shard_names(monkeypatch)
    groups_http.test_join_heartbeat_rebalance_and_drain(server)


def test_long_poll_wakes_on_plan_change_and_times_out(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_shard_names(monkeypatch)
    groups_http.test_long_poll_wakes_on_plan_change_and_times_out(server)
