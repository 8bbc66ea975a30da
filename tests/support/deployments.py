"""The deployments an HTTP suite runs against: the parameters of its module-scoped server fixture.

A suite that must behave the same on one node and in a cluster defines its
tests once and parametrizes its server fixture by deployment, so each test runs
once per deployment, named in its id (``test_x[cluster-node]``)::

    @pytest.fixture(scope="module", params=SINGLE_AND_CLUSTER)
    def srv(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
        yield from deployments.module_server(request, "append")

- ``single-node``: one ``tiered serve`` (``http_helpers.module_server``);
- ``cluster-node``: a single-node cluster of ``CLUSTER_SHARDS`` (4) shards on moto, every shard's
  engine behind shard routing (``cluster_support.cluster_module_server``);
- ``cluster-node-wal``: the same in object-store durability (every
  acknowledgement after a WAL commit).

Each deployment's server starts once per module (pytest runs a module's tests
grouped by parameter); under xdist the module stays one unit of work, like any
module whose tests share a module-scoped fixture (``_unit`` in ``tests/conftest.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster_support import cluster_module_server
from tests.support.http_helpers import module_server as single_node_server
from tests.support.server_process import ServerProcess

SINGLE_NODE = "single-node"
CLUSTER_NODE = "cluster-node"
CLUSTER_NODE_WAL = "cluster-node-wal"

SINGLE_AND_CLUSTER = (SINGLE_NODE, CLUSTER_NODE)
CLUSTER_SHARDS = 4  # the shard count of the cluster deployments
# The durability of each cluster deployment (``--durability``).
_DURABILITY = {CLUSTER_NODE: "local", CLUSTER_NODE_WAL: "object-store"}


def module_server(request: pytest.FixtureRequest, name: str, *args: str) -> Iterator[ServerProcess]:
    """Body of a module-scoped fixture parametrized by deployment: the server ``request.param`` names,
    started with ``args`` (extra ``tiered serve`` options); ``name`` names its temporary directory."""
    deployment = request.param
    tmp_path_factory = request.getfixturevalue("tmp_path_factory")
    if deployment == SINGLE_NODE:
        yield from single_node_server(tmp_path_factory, name, *args)
        return
    if deployment not in _DURABILITY:
        raise ValueError(f"unknown deployment {deployment!r}")
    yield from cluster_module_server(
        request.getfixturevalue("moto_s3"),
        tmp_path_factory,
        f"{name}-{deployment}",
        *args,
        shards=CLUSTER_SHARDS,
        durability=_DURABILITY[deployment],
    )
