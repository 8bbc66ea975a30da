"""``tests/api/test_http_producers.py`` against a single-node cluster in object-store durability (every ack after a WAL commit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.test_http_producers import *  # noqa: F403  (the same tests, with the fixture below)
from tests.support.cluster_support import cluster_module_server
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import ServerProcess


@pytest.fixture(scope="module")
def srv(moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from cluster_module_server(moto_s3, tmp_path_factory, "producers-wal", durability="object-store")
