"""Two ``tiered serve`` processes under one node id (issue 23): never both waiting.

The process holding the id's current incarnation keeps it; the other exits
with code 3 (``EXIT_NODE_ID_IN_USE``, docs/cluster.md "Settling under churn"):

* a second process started while the first runs sees the id's heartbeat
  beating and refuses to start; the first serves on, untouched;
* a first process paused (SIGSTOP) past its TTL is replaced by a second one
  (incarnation 2, every shard); resumed, the first learns it was replaced
  and exits, writing nothing over its replacement.

Two nodes on one machine need two data dirs (the data-dir lock refuses a
second process on one), as two machines given the same id would have.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.cluster_support import cluster_args, cluster_env, readiness, start_node, unique_prefix
from tests.support.deadlines import wait_for
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.identity import EXIT_NODE_ID_IN_USE

pytestmark = pytest.mark.timeout(180)

SHARDS = 4
TTL = 1.5


def _twin(base: Path, s3: S3Endpoint, prefix: str) -> ServerProcess:
    """Node n1 again, from another data dir (another machine)."""
    base.mkdir(parents=True, exist_ok=True)
    return ServerProcess(
        base / "n1", *cluster_args(s3, prefix, "n1", shards=SHARDS, ttl_s=TTL), env=cluster_env()
    )


def _checks(srv: ServerProcess) -> dict[str, object]:
    return readiness(srv.url)["checks"]  # type: ignore[return-value]


def test_a_second_process_on_a_running_node_id_exits_with_code_3(moto_s3: S3Endpoint, tmp_path: Path) -> None:
    prefix = unique_prefix("twin")
    (tmp_path / "a").mkdir()
    first = start_node(tmp_path / "a", moto_s3, prefix, "n1", shards=SHARDS, ttl_s=TTL)
    twin = _twin(tmp_path / "b", moto_s3, prefix)
    try:
        with pytest.raises(RuntimeError, match=f"server exited with {EXIT_NODE_ID_IN_USE}"):
            twin.start(timeout=40)
        assert "node id n1 is in use" in twin.log(), twin.log()
        checks = _checks(first)
        assert checks["incarnation"] == 1 and checks["serving"] == list(range(SHARDS))
    finally:
        twin.kill()
        first.stop()


def test_an_older_process_resumed_after_its_replacement_joined_exits_with_code_3(
    moto_s3: S3Endpoint, tmp_path: Path
) -> None:
    prefix = unique_prefix("replaced")
    (tmp_path / "a").mkdir()
    older = start_node(tmp_path / "a", moto_s3, prefix, "n1", shards=SHARDS, ttl_s=TTL)
    assert older.proc is not None
    newer = _twin(tmp_path / "b", moto_s3, prefix)
    try:
        os.killpg(older.proc.pid, signal.SIGSTOP)
        newer.start(timeout=40)  # waits out the paused one's heartbeat, joins as incarnation 2
        wait_for(lambda: _checks(newer)["serving"] == list(range(SHARDS)), 20, "the newer process serving")
        assert _checks(newer)["incarnation"] == 2
        os.killpg(older.proc.pid, signal.SIGCONT)
        wait_for(
            lambda: older.proc is not None and older.proc.poll() is not None, 30, "the older one exiting"
        )
        assert older.proc.returncode == EXIT_NODE_ID_IN_USE, older.log()
        assert "incarnation 1 was replaced by incarnation 2" in older.log(), older.log()
        checks = _checks(newer)  # untouched: nothing was written over its heartbeat or its leases
        assert checks["incarnation"] == 2 and checks["serving"] == list(range(SHARDS))
        assert readiness(newer.url)["ready"] is True
    finally:
        if older.proc is not None and older.proc.poll() is None:
            os.killpg(older.proc.pid, signal.SIGCONT)
        older.stop()
        newer.stop()
