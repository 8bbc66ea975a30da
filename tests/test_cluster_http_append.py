"""``test_http_append.py`` against a single-node cluster: every shard's engine behind shard routing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster_support import cluster_module_server
from .s3_server import S3Endpoint
from .server_process import ServerProcess
from .test_http_append import *  # noqa: F403  (the same tests, with the fixtures below)


@pytest.fixture(scope="module")
def srv(moto_s3: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from cluster_module_server(moto_s3, tmp_path_factory, "append")
